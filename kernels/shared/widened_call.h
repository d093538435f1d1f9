// Computing a 16-bit op in f32 on a device, whichever: f32 copies of the op's 16-bit operands are
// made in the plan's workspace (graph::widening_of sizes them, in the order below), the f32
// kernel runs on them, and the outputs and updated tensors are rounded back once. Outputs are
// written, never read, so only inputs and updates are widened before the kernel. An op whose row
// splits by rows runs a slice of rows at a time (graph::widening_of), so the copies take a slice
// of its largest operands. The CPU (kernels/cpu/widened_kernels.cpp) and CUDA
// (kernels/cuda/mixed_precision.cu) differ only in how they convert.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/kernels/kernel.h"

namespace memplan::kernels {
namespace widened_detail {

// Carves f32 copies out of the workspace, in the order graph::widening_of counts them.
class Scratch {
 public:
  Scratch(std::span<std::byte> workspace, graph::OpKind kind)
      : next_(workspace.data()), end_(workspace.data() + workspace.size()), kind_(kind) {}
  float* take(std::int64_t elements) {
    const Bytes bytes = elements * static_cast<Bytes>(sizeof(float));
    const Bytes rounded = (bytes + graph::kWidenAlignment - 1) / graph::kWidenAlignment * graph::kWidenAlignment;
    MEMPLAN_CHECK(end_ - next_ >= rounded, "the kernel workspace is too small for the f32 copies of 16-bit op "
                                               << graph::op_name(kind_) << " (" << rounded << " bytes more, " << (end_ - next_)
                                               << " left): plan the step with this device's profile (runtime::device_profile)");
    float* out = reinterpret_cast<float*>(next_);
    next_ += rounded;
    return out;
  }
  std::span<std::byte> rest() const { return {next_, static_cast<std::size_t>(end_ - next_)}; }

 private:
  std::byte* next_;
  std::byte* end_;
  graph::OpKind kind_;
};

// One operand of the call: where it is, and how the kernel sees it for the current slice.
struct Operand {
  const TensorRef* given = nullptr;
  bool by_rows = false;
  float* copy = nullptr;   // its f32 copy (16-bit operands): the whole, or one slice
  graph::Shape slice_shape;  // by_rows: the slice's shape
};

}  // namespace widened_detail

// Runs `compute` (an f32 kernel) on f32 copies of the call's 16-bit operands, carved out of
// `workspace` and converted by `convert` (convert.widen(dtype, src, f32 dst, count) and
// convert.narrow(dtype, f32 src, dst, count)); the compute kernel gets what is left of the
// workspace as its own.
template <typename Convert>
void run_widened(const KernelCall& c, KernelFn compute, std::span<std::byte> workspace, const Convert& convert) {
  using widened_detail::Operand;
  using widened_detail::Scratch;
  const auto is_16bit = [](const TensorRef& r) { return graph::is_16bit_float(r.dtype); };
  const graph::OpInfo& info = graph::op_info(c.kind);
  if (info.pure_view) return;  // the output is the input's storage: nothing to compute or copy
  const bool split = graph::splits_by_rows(info, *c.attrs);
  const bool view = info.output_is_view;
  const std::size_t ni = c.inputs.size(), nu = c.updates.size(), no = c.outputs.size();
  // Lists reused by every call on this thread (no allocation once grown); `operands` is sized
  // before any reference into it is taken.
  thread_local std::vector<Operand> operands;
  thread_local std::vector<graph::WidenedOperand> sizes;
  thread_local std::vector<TensorRef> refs;
  operands.resize(ni + nu + no);  // kept across calls: each slice shape keeps its capacity
  sizes.clear();
  auto describe = [&](std::size_t k, const TensorRef& r, bool by_rows) {
    operands[k].given = &r;
    operands[k].by_rows = by_rows;
    operands[k].copy = nullptr;
    sizes.push_back({r.numel(), r.shape->rank() == 0 ? 1 : (*r.shape)[0], is_16bit(r), by_rows});
  };
  for (std::size_t i = 0; i < ni; ++i) describe(i, c.inputs[i], split && i < 8 && ((info.row_inputs >> i) & 1u) != 0);
  for (std::size_t i = 0; i < nu; ++i) describe(ni + i, c.updates[i], false);
  for (std::size_t i = 0; i < no; ++i) describe(ni + nu + i, c.outputs[i], split && !info.sums_rows);
  const graph::Widening w = graph::widening_of(std::span<const graph::WidenedOperand>(sizes.data(), view ? ni + nu : sizes.size()));
  const std::int64_t rows = w.rows > 0 ? w.rows : 1, per_slice = w.rows > 0 ? w.rows_per_slice : 1;
  if (w.rows == 0) {
    for (Operand& o : operands) o.by_rows = false;
  }

  // Copies: the whole operands once (inputs and updates widened now), then one slice's worth
  // for the split ones, in graph::widening_of's order.
  Scratch scratch(workspace, c.kind);
  for (std::size_t k = 0; k < operands.size(); ++k) {
    Operand& o = operands[k];
    const bool output = k >= ni + nu;
    if (!is_16bit(*o.given) || (view && output)) continue;
    o.copy = scratch.take(o.by_rows ? o.given->numel() / rows * per_slice : o.given->numel());
    if (!o.by_rows && !output) convert.widen(o.given->dtype, o.given->data, o.copy, o.given->numel());
  }
  if (view) {
    for (std::size_t k = ni + nu; k < operands.size(); ++k) operands[k].copy = operands[0].copy;  // in place on input 0
  }

  refs.resize(operands.size());
  KernelCall call = c;
  call.inputs = std::span<const TensorRef>(refs.data(), ni);
  call.outputs = std::span<const TensorRef>(refs.data() + ni + nu, no);
  call.updates = std::span<const TensorRef>(refs.data() + ni, nu);
  call.workspace = scratch.rest();
  for (std::int64_t start = 0; start < rows; start += per_slice) {
    const std::int64_t count = std::min(per_slice, rows - start);
    for (std::size_t k = 0; k < operands.size(); ++k) {
      Operand& o = operands[k];
      const TensorRef& r = *o.given;
      const bool output = k >= ni + nu;
      if (!o.by_rows) {
        refs[k] = o.copy != nullptr ? TensorRef{o.copy, r.shape, graph::DType::f32} : r;
        continue;
      }
      const std::int64_t per_row = r.numel() / rows;
      o.slice_shape = *r.shape;
      o.slice_shape.dims[0] = (*r.shape)[0] / rows * count;
      if (o.copy != nullptr) {
        if (!output) convert.widen(r.dtype, static_cast<const std::uint16_t*>(r.data) + start * per_row, o.copy, count * per_row);
        refs[k] = TensorRef{o.copy, &o.slice_shape, graph::DType::f32};
      } else {
        refs[k] = TensorRef{static_cast<std::byte*>(r.data) + start * per_row * graph::dtype_size(r.dtype), &o.slice_shape, r.dtype};
      }
    }
    call.first_row = start;  // in the split extent's rows (embedding_backward's: the table's)
    call.accumulate = info.sums_rows && start > 0;  // later slices add into the whole output
    compute(call);
    // Outputs back to 16 bits, a slice at a time; whole updates and outputs after the last.
    for (std::size_t k = ni + nu; k < operands.size(); ++k) {
      const Operand& o = operands[k];
      if (!o.by_rows || o.copy == nullptr) continue;
      const std::int64_t per_row = o.given->numel() / rows;
      convert.narrow(o.given->dtype, o.copy, static_cast<std::uint16_t*>(o.given->data) + start * per_row, count * per_row);
    }
  }
  for (std::size_t k = ni; k < operands.size(); ++k) {
    const Operand& o = operands[k];
    if (o.by_rows || o.copy == nullptr) continue;
    convert.narrow(o.given->dtype, o.copy, o.given->data, o.given->numel());
  }
}

// The f32 kernel of each op kind among `f32` (a device's f32 entries): what the adapter computes in.
inline std::array<KernelFn, graph::kOpKindCount> f32_compute_table(const KernelEntries& f32) {
  std::array<KernelFn, graph::kOpKindCount> table{};
  for (const KernelEntry& e : f32) {
    if (e.dtype == graph::DType::f32) table[static_cast<std::size_t>(e.kind)] = e.fn;
  }
  return table;
}

// The adapter's registrations on a device: `adapter` at bf16 and f16 for every op kind `compute`
// has an f32 kernel for and no entry of `own` (the device's 16-bit kernels of its own) covers,
// where the op's row takes 16-bit operands (an f32 update's gradient is f32).
inline KernelEntries widened_entries(const std::array<KernelFn, graph::kOpKindCount>& compute, const KernelEntries& own,
                                     KernelFn adapter) {
  std::array<bool, graph::kOpKindCount> covered{};
  for (const KernelEntry& e : own) covered[static_cast<std::size_t>(e.kind)] = true;
  KernelEntries entries;
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    if (compute[static_cast<std::size_t>(k)] == nullptr || covered[static_cast<std::size_t>(k)]) continue;
    for (graph::DType d : {graph::DType::bf16, graph::DType::f16}) {
      if (graph::op_info(static_cast<graph::OpKind>(k)).accepts.contains(d)) entries.push_back({static_cast<graph::OpKind>(k), adapter, d});
    }
  }
  return entries;
}

}  // namespace memplan::kernels
