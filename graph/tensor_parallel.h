// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): each of `degree` ranks holds a slice of
// every attention and MLP weight and computes its slice of the layer. Column-parallel layers
// (query/key/value, the MLP's up and gate projections, the vocabulary head) split their output
// features: their input is the same on every rank (tp_copy: the identity, whose gradient is
// summed over the ranks). Row-parallel layers (attention's output projection, the MLP's down
// projection) split their input features and sum their partial outputs (an all_reduce over the
// ranks, whose gradient passes through); a bias is added after the sum. The embedding and the
// loss split the vocabulary (padded to a multiple of the ranks). The collectives are graph ops,
// their buffers planned like any other; every rank's graph has the same shapes, so every rank
// plans the same arena. Models build their slice with the helpers below (models/gpt.cpp,
// models/llama.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "memplan/graph/builder.h"
#include "memplan/graph/tensor.h"

namespace memplan::graph {

struct TensorParallel {
  int degree = 1;  // ranks splitting each layer
  int rank = 0;    // this graph's rank among them
  // Sequence parallelism (Korthikanti et al. 2022): the residual stream between the layers'
  // parallel regions (norms, dropouts, residual adds) is split by rows too, each rank holding a
  // contiguous 1/degree of the B*T token rows; column_input all-gathers the rows and row_output
  // reduce-scatters them, in place of tp_copy's and tp_sum's all-reduces.
  bool sequence_parallel = false;

  bool active() const { return degree > 1; }
  // n / degree, or a GraphError naming `what` (heads, kv_heads, ffn, ...) when it does not divide.
  std::int64_t split(std::int64_t n, const std::string& what) const;
  // ceil(n / degree): a slice of a size padded to a multiple of the ranks (the vocabulary).
  std::int64_t padded_slice(std::int64_t n) const { return (n + degree - 1) / degree; }
};

// A GraphError unless 1 <= degree and 0 <= rank < degree.
void check_tensor_parallel(const TensorParallel& tp);

// A parameter of which this rank holds slice tp.rank of `whole` along `axis` (the dimension
// padded to a multiple of the ranks); `whole` itself without tensor parallelism.
TensorId parameter_slice(Builder& b, const TensorParallel& tp, const std::string& name, const Shape& whole, int axis,
                         InitSpec init, DType dtype);
// The input of column-parallel layers (Megatron's f); x itself without tensor parallelism.
TensorId tp_copy(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name);
// The sum of a row-parallel layer's partial outputs over the ranks (Megatron's g); x itself
// without tensor parallelism.
TensorId tp_sum(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name);
// A column-parallel layer's input: tp_copy, or with sequence parallelism the all-gather of every
// rank's row shard [rows / degree, C] into the whole [rows, C] (its gradient: a reduce-scatter).
TensorId column_input(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name);
// A row-parallel layer's partial output summed over the ranks: tp_sum, or with sequence
// parallelism a reduce-scatter leaving this rank's row shard [rows / degree, C] of the sum (its
// gradient: an all-gather).
TensorId row_output(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name);
// This rank's row shard of a tensor every rank holds whole (the embeddings' output), entering the
// sequence-parallel region; x itself without sequence parallelism. A GraphError when the rows do
// not divide by the degree. Its gradient is every rank's shard's (tp_copy's sum of the rows each
// rank back-propagates).
TensorId sequence_shard(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name);
// A parameter every rank holds whole, read on this rank's rows in the sequence-parallel region (a
// norm's weight and bias, a row-parallel layer's bias): each rank's rows give part of its gradient,
// summed over the ranks by tp_copy's backward. The parameter itself without sequence parallelism.
TensorId sequence_parallel_parameter(Builder& b, const TensorParallel& tp, TensorId parameter);
// The rows column_input gathers are read twice: by the forward's column-parallel layers and by
// their weight gradients. Kept until the backward pass they would cost T times the rank's own
// rows; as in Megatron-LM, the backward reads a second gather of the rank's rows, made just
// before its first reader, so only the rows are kept. Changes nothing in a graph without such
// gathers; autograd runs it (graph/autograd.h).
void regather_rows_for_backward(Graph& g);
// ids [..] -> [.., D] from a table slice [ceil(vocab / degree), D] (parameter_slice along 0): each
// rank gathers the ids it holds, zeros for the rest, then the sum over the ranks.
TensorId vocab_parallel_embedding(Builder& b, const TensorParallel& tp, TensorId ids, TensorId table,
                                  std::int64_t vocab, const std::string& name);
// The mean cross-entropy of logits [N, ceil(vocab / degree)] (this rank's vocabulary columns)
// against labels [N]: per-row statistics, gathered over the ranks, combined into the loss every
// rank holds. cross_entropy itself without tensor parallelism.
TensorId vocab_parallel_cross_entropy(Builder& b, const TensorParallel& tp, TensorId logits, TensorId labels,
                                      std::int64_t vocab, const std::string& name);

// The whole tensor's shape of a tensor-parallel slice (its own shape when whole), and the whole
// padded to tp_parts slices.
Shape whole_shape(const TensorDesc& desc);
Shape padded_whole_shape(const TensorDesc& desc);
// The whole tensor (padded_whole_shape, or whole_shape when `crop`) from every rank's slice of
// `desc`'s shape and dtype, laid one after another in rank order in `slices`.
std::vector<std::byte> assemble_slices(const TensorDesc& desc, std::span<const std::byte> slices, bool crop);
// This rank's slice of `desc` (tp_index) from the whole tensor padded to tp_parts slices.
std::vector<std::byte> slice_of(const TensorDesc& desc, std::span<const std::byte> padded_whole);
// What `desc` holds of the whole tensor (padded_whole_shape, at desc's dtype): its share of the
// experts (graph/expert_parallel.h), then its tensor-parallel slice.
std::vector<std::byte> local_part(const TensorDesc& desc, std::span<const std::byte> padded_whole);
// The whole tensor (whole_shape) from every rank's local part: `gather(bytes, parts)` returns
// every rank's bytes of that size one after another in rank order, over the tensor-parallel
// ranks (parts > 0) or the expert-parallel ones (parts < 0: -parts shares).
std::vector<std::byte> gather_whole(const TensorDesc& desc, std::span<const std::byte> local,
                                    const std::function<std::vector<std::byte>(std::span<const std::byte>, int)>& gather);

}  // namespace memplan::graph
