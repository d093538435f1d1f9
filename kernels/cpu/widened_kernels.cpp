// 16-bit ops on the CPU, which has no 16-bit arithmetic: every CPU kernel also runs at bf16 and
// f16 by computing in f32 copies of its 16-bit operands (kernels/shared/widened_call.h). The
// mixed-precision optimizer updates have an f32 form here that updates the f32 master copy and
// writes it into the (widened) working copy, which the rounding back turns into the 16-bit
// parameter.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/half.h"
#include "memplan/kernels/shared/optimizers.h"
#include "memplan/kernels/shared/widened_call.h"

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

// A gradient copied into host memory (optimizer offload): on the CPU device both sides are host
// memory, so a copy of its bytes at any dtype.
void k_to_host(const KernelCall& c) {
  const TensorRef& x = c.inputs[0];
  std::memcpy(c.outputs[0].data, x.data, static_cast<std::size_t>(x.numel() * graph::dtype_size(x.dtype)));
}

// The f32 kernel each op computes in: the CPU's f32 kernel, or the mixed updates' f32 forms.
const std::array<KernelFn, graph::kOpKindCount>& compute_kernels() {
  static const std::array<KernelFn, graph::kOpKindCount> table = [] {
    std::array<KernelFn, graph::kOpKindCount> t = f32_compute_table(f32_kernel_entries());
    t[static_cast<std::size_t>(OpKind::sgd_update_mixed)] = k_sgd_update_mixed_f32;
    t[static_cast<std::size_t>(OpKind::sgd_momentum_update_mixed)] = k_sgd_momentum_update_mixed_f32;
    t[static_cast<std::size_t>(OpKind::adamw_update_mixed)] = k_adamw_update_mixed_f32;
    t[static_cast<std::size_t>(OpKind::adamw8bit_update_mixed)] = adamw8bit_update_mixed_f32;
    return t;
  }();
  return table;
}

void k_widened(const KernelCall& c) {
  const KernelFn compute = compute_kernels()[static_cast<std::size_t>(c.kind)];
  MEMPLAN_CHECK(compute != nullptr, "no f32 CPU kernel to compute op " << graph::op_name(c.kind) << " in");
  struct Convert {
    void widen(graph::DType d, const void* src, float* dst, std::int64_t n) const { widen_to_f32(d, src, dst, n); }
    void narrow(graph::DType d, const float* src, void* dst, std::int64_t n) const { narrow_from_f32(d, src, dst, n); }
  };
  run_widened(c, compute, c.workspace, Convert{});
}

// cast: f32 to or from 16 bits, each element rounded once (a copy at the same dtype).
void k_cast(const KernelCall& c) {
  const TensorRef& x = c.inputs[0];
  const TensorRef& y = c.outputs[0];
  const std::int64_t n = x.numel();
  if (x.dtype == y.dtype) {
    std::memcpy(y.data, x.data, static_cast<std::size_t>(n) * graph::dtype_size(x.dtype));
  } else if (x.dtype == graph::DType::f32) {
    narrow_from_f32(y.dtype, x.f32(), y.data, n);
  } else {
    widen_to_f32(x.dtype, x.data, y.f32(), n);
  }
}

}  // namespace

KernelEntries native_16bit_kernel_entries() {
  KernelEntries entries = nn_16bit_kernel_entries();
  for (const KernelEntries& more : {collective_16bit_kernel_entries(), loss_16bit_kernel_entries()}) {
    entries.insert(entries.end(), more.begin(), more.end());
  }
  for (graph::DType d : {graph::DType::f32, graph::DType::bf16, graph::DType::f16}) {
    entries.push_back({OpKind::cast, k_cast, d});
    entries.push_back({OpKind::grads_finite, k_grads_finite, d});
    entries.push_back({OpKind::to_host, k_to_host, d});
  }
  return entries;
}

KernelEntries widened_kernel_entries() {
  KernelEntries own = native_16bit_kernel_entries();
  const KernelEntries exchange = collective_exchange_kernel_entries();
  own.insert(own.end(), exchange.begin(), exchange.end());
  return widened_entries(compute_kernels(), own, k_widened);
}

}  // namespace memplan::kernels::cpu
