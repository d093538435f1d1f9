// 16-bit ops on the CPU, which has no 16-bit arithmetic: every CPU kernel also runs at bf16 and
// f16 by computing in f32 copies of its 16-bit operands, made in the plan's workspace
// (graph::widening_of sizes them, in the order below), then rounding the outputs and
// the updated tensors back once. The mixed-precision optimizer updates have an f32 form here
// that updates the f32 master copy and writes it into the (widened) working copy, which that
// rounding turns into the 16-bit parameter. Outputs are written, never read, so only inputs and
// updates are widened before the kernel. An op whose row splits by rows runs a slice of rows at a
// time (graph::widening_of), so the copies take a slice of its largest operands.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/half.h"
#include "memplan/kernels/shared/optimizers.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

// The factor taking a loss-scaled gradient back: 1 / scale, exact for the powers of two used.
float unscale(const KernelCall& c) { return static_cast<float>(1.0 / c.loss_scale); }

void k_sgd_update_mixed_f32(const KernelCall& c) {
  float* p = updated_params(c);
  float* master = c.updates[1].f32();
  const float* g = c.inputs[0].f32();
  const float lr = c.lr(), wd = c.attrs->weight_decay, inv = unscale(c);
  parallel_each(updated_count(c), 1, [=](std::int64_t i) {
    sgd_element(master[i], g[i] * inv, lr, wd);
    p[i] = master[i];
  });
}

void k_sgd_momentum_update_mixed_f32(const KernelCall& c) {
  float* p = updated_params(c);
  float* master = c.updates[1].f32();
  float* buf = c.updates[2].f32();
  const float* g = c.inputs[0].f32();
  const float lr = c.lr(), wd = c.attrs->weight_decay, mom = c.attrs->momentum, inv = unscale(c);
  parallel_each(updated_count(c), 1, [=](std::int64_t i) {
    sgd_momentum_element(master[i], buf[i], g[i] * inv, lr, wd, mom);
    p[i] = master[i];
  });
}

void k_adamw_update_mixed_f32(const KernelCall& c) {
  float* p = updated_params(c);
  float* master = c.updates[1].f32();
  float* m = c.updates[2].f32();
  float* v = c.updates[3].f32();
  const float* g = c.inputs[0].f32();
  const AdamWScalars s = adamw_scalars(*c.attrs, c.step, c.lr());
  const float inv = unscale(c);
  parallel_each(updated_count(c), 1, [=](std::int64_t i) {
    adamw_element(master[i], m[i], v[i], g[i] * inv, s);
    p[i] = master[i];
  });
}

// Every input finite: 1, else 0 (fp16 loss scaling). Read at the inputs' own width: a 16-bit
// value is finite unless its exponent bits are all ones (f16: 5 bits, bf16: 8).
bool all_finite(const TensorRef& r) {
  const std::int64_t n = r.numel();
  if (r.dtype == graph::DType::f32) {
    const float* x = r.f32();
    for (std::int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(x[i])) return false;
    }
    return true;
  }
  const auto* h = static_cast<const std::uint16_t*>(r.data);
  const std::uint16_t exponent = r.dtype == graph::DType::f16 ? 0x7c00u : 0x7f80u;
  for (std::int64_t i = 0; i < n; ++i) {
    if ((h[i] & exponent) == exponent) return false;
  }
  return true;
}

void k_grads_finite(const KernelCall& c) {
  bool finite = true;
  for (const TensorRef& r : c.inputs) finite = finite && all_finite(r);
  c.outputs[0].f32()[0] = finite ? 1.0f : 0.0f;
}

// The f32 kernel each op computes in: the CPU's f32 kernel, or the mixed updates' f32 forms.
const std::array<KernelFn, graph::kOpKindCount>& compute_kernels() {
  static const std::array<KernelFn, graph::kOpKindCount> table = [] {
    std::array<KernelFn, graph::kOpKindCount> t{};
    for (const KernelEntry& e : f32_kernel_entries()) {
      if (e.dtype == graph::DType::f32) t[static_cast<std::size_t>(e.kind)] = e.fn;
    }
    t[static_cast<std::size_t>(OpKind::sgd_update_mixed)] = k_sgd_update_mixed_f32;
    t[static_cast<std::size_t>(OpKind::sgd_momentum_update_mixed)] = k_sgd_momentum_update_mixed_f32;
    t[static_cast<std::size_t>(OpKind::adamw_update_mixed)] = k_adamw_update_mixed_f32;
    return t;
  }();
  return table;
}

bool is_16bit(const TensorRef& r) { return graph::is_16bit_float(r.dtype); }

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

void k_widened(const KernelCall& c) {
  const KernelFn compute = compute_kernels()[static_cast<std::size_t>(c.kind)];
  MEMPLAN_CHECK(compute != nullptr, "no f32 CPU kernel to compute op " << graph::op_name(c.kind) << " in");
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
  for (std::size_t i = 0; i < no; ++i) describe(ni + nu + i, c.outputs[i], split);
  const graph::Widening w = graph::widening_of(std::span<const graph::WidenedOperand>(sizes.data(), view ? ni + nu : sizes.size()));
  const std::int64_t rows = w.rows > 0 ? w.rows : 1, per_slice = w.rows > 0 ? w.rows_per_slice : 1;
  if (w.rows == 0) {
    for (Operand& o : operands) o.by_rows = false;
  }

  // Copies: the whole operands once (inputs and updates widened now), then one slice's worth
  // for the split ones, in graph::widening_of's order.
  Scratch scratch(c.workspace, c.kind);
  for (std::size_t k = 0; k < operands.size(); ++k) {
    Operand& o = operands[k];
    const bool output = k >= ni + nu;
    if (!is_16bit(*o.given) || (view && output)) continue;
    o.copy = scratch.take(o.by_rows ? o.given->numel() / rows * per_slice : o.given->numel());
    if (!o.by_rows && !output) widen_to_f32(o.given->dtype, o.given->data, o.copy, o.given->numel());
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
        if (!output) widen_to_f32(r.dtype, static_cast<const std::uint16_t*>(r.data) + start * per_row, o.copy, count * per_row);
        refs[k] = TensorRef{o.copy, &o.slice_shape, graph::DType::f32};
      } else {
        refs[k] = TensorRef{static_cast<std::byte*>(r.data) + start * per_row * graph::dtype_size(r.dtype), &o.slice_shape, r.dtype};
      }
    }
    compute(call);
    // Outputs back to 16 bits, a slice at a time; whole updates and outputs after the last.
    for (std::size_t k = ni + nu; k < operands.size(); ++k) {
      const Operand& o = operands[k];
      if (!o.by_rows || o.copy == nullptr) continue;
      const std::int64_t per_row = o.given->numel() / rows;
      narrow_from_f32(o.given->dtype, o.copy, static_cast<std::uint16_t*>(o.given->data) + start * per_row, count * per_row);
    }
  }
  for (std::size_t k = ni; k < operands.size(); ++k) {
    const Operand& o = operands[k];
    if (o.by_rows || o.copy == nullptr) continue;
    narrow_from_f32(o.given->dtype, o.copy, o.given->data, o.given->numel());
  }
}

}  // namespace

KernelEntries native_16bit_kernel_entries() {
  KernelEntries entries;
  for (graph::DType d : {graph::DType::f32, graph::DType::bf16, graph::DType::f16}) {
    entries.push_back({OpKind::grads_finite, k_grads_finite, d});
  }
  return entries;
}

KernelEntries widened_kernel_entries() {
  KernelEntries entries;
  const auto& compute = compute_kernels();
  std::array<bool, graph::kOpKindCount> native{};
  for (const KernelEntry& e : native_16bit_kernel_entries()) native[static_cast<std::size_t>(e.kind)] = true;
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    if (compute[static_cast<std::size_t>(k)] == nullptr || native[static_cast<std::size_t>(k)]) continue;
    for (graph::DType d : {graph::DType::bf16, graph::DType::f16}) {
      // Only where the row takes 16-bit operands (an f32 update's gradient is f32).
      if (graph::op_info(static_cast<OpKind>(k)).accepts.contains(d)) entries.push_back({static_cast<OpKind>(k), k_widened, d});
    }
  }
  return entries;
}

}  // namespace memplan::kernels::cpu
