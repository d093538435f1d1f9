// Mixed precision as the graph sees it. A step at a 16-bit working dtype (bf16 or f16) keeps its
// inputs, the working copies of its parameters, its activations and gradients in 16 bits; what
// the rows compute in f32 stays f32 (losses, normalisation statistics, attention's log-sum-exp,
// batch norm's running statistics), and the optimizer keeps an f32 master copy of each 16-bit
// parameter with f32 state (graph/optimizer.h: the *_mixed updates round the master once into the
// working copy). Kernels on a device without 16-bit arithmetic compute in f32 copies of their
// 16-bit operands (op_widening says how, and how many bytes of scratch it takes).
#pragma once

#include <cstdint>
#include <span>

#include "memplan/common/types.h"
#include "memplan/graph/graph.h"

namespace memplan::graph {

// fp16 loss scaling on a training step (after its updates are in): a grads_finite op reads every
// gradient a mixed update reads, and every optimizer-phase op moves after it (their order kept),
// so the executor can skip the step's updates when a scaled gradient overflowed. Its output is
// graph.retained (the trainer reads it). Gradients then all live until that check, as with
// PyTorch's GradScaler. Throws GraphError when the updates read shards (ZeRO 1-3 across ranks: no
// rank sees every gradient).
void add_loss_scaling(Graph& step);
// The grads_finite op's output, or kNoTensor in a step without loss scaling.
TensorId grads_finite_flag(const Graph& step);

// `forward` (a model's forward graph, before autograd) at the working dtype `dtype`: its floating
// inputs and parameters take `dtype`, every op's output is re-derived by its row (so f32 stays f32
// where the row computes in f32) and the dtype of fill-like ops follows. f32 returns a copy with
// every floating input and parameter at f32. Throws GraphError where an op refuses the dtype.
Graph with_working_dtype(const Graph& forward, DType dtype);

// How a device without 16-bit arithmetic computes a 16-bit op: in f32 copies of its 16-bit
// operands, made in the plan's workspace, each rounded up to kWidenAlignment bytes. An op whose
// row splits by rows (OpInfo::split_rows) is computed kSliceRows rows at a time, so its copies
// hold one slice of the split operands (and the whole of the others); an op that does not split
// is copied whole. A view output shares its input's copy; a pure view needs none.
inline constexpr Bytes kWidenAlignment = 64;
// The f32 bytes one slice's split copies aim at (at least one row is taken).
inline constexpr Bytes kWidenSliceBytes = Bytes{1} << 20;

struct WidenedOperand {
  std::int64_t elements = 0;
  std::int64_t first_dim = 1;  // shape[0]; 1 for a scalar
  bool is_16bit = false;
  bool by_rows = false;  // split with the outputs' rows (the row's row_inputs, and every output)
};
struct Widening {
  std::int64_t rows = 0;            // the split extent (the first split operand's first_dim); 0: whole
  std::int64_t rows_per_slice = 0;  // rows a slice holds (rows when it is computed at once)
  Bytes bytes = 0;                  // the workspace the copies take
};
// `operands` in the order the copies are made: inputs, updates, outputs. An op whose split
// operands do not divide evenly by `rows` is computed whole.
Widening widening_of(std::span<const WidenedOperand> operands);
// The same for an op of a graph (inputs, updates and outputs as its row and attributes say); for
// a 16-bit sum across ranks (all_reduce, reduce_scatter), the exchange buffers its kernel takes
// instead (kernels/cpu/collective_kernels.cpp: 16 bits on the wire, added in f32).
Widening op_widening(const Graph& graph, const Op& op);
// The most any op of `graph` takes (the scratch such a device plans), leaving out the ops of the
// kinds in `native`: those the device computes at 16 bits itself (kernels::native_16bit_ops).
Bytes widening_scratch_bytes(const Graph& graph, std::span<const OpKind> native = {});
// Bytes of scratch `op`'s kernels take beyond its operands (OpInfo::scratch: the fused loss's
// chunk of logits), on every device.
Bytes op_scratch_bytes(const Graph& graph, const Op& op);
// The kernel workspace `graph` needs: the most any op takes of its own scratch plus, on a device
// that widens 16-bit ops (`widen`), the f32 copies of its operands (op_widening), leaving out the
// kinds in `native`. The widened call hands the kernel the workspace after the copies.
Bytes kernel_scratch_bytes(const Graph& graph, bool widen, std::span<const OpKind> native = {});
// Whether `op`, with these attributes, splits by rows, and which inputs then do (a bitmask).
bool splits_by_rows(const OpInfo& info, const OpAttrs& attrs);

}  // namespace memplan::graph
