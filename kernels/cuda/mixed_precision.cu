// Mixed precision on CUDA. Natively at 16 bits: the GEMMs (blas.cu: tensor cores, f32
// accumulation), fused attention, layer norm, softmax, the losses' gradient and the elementwise
// ops (16-bit loads into f32 registers, each output rounded once: the *_16bit_kernel_entries of
// their files), the embedding gather (a copy), the optimizer updates (16-bit gradient and working copy, f32 master copy and
// state: the master is updated in f32 and rounded once, to nearest even, into the working copy)
// and fp16's overflow check. Every other op with an f32 kernel runs at bf16 and f16 through the
// widening adapter (kernels/shared/widened_call.h): f32 copies of its 16-bit operands made on the
// stream in the workspace past the device's own scratch, the f32 kernel, the outputs rounded back.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/optimizers.h"
#include "memplan/kernels/shared/widened_call.h"

namespace memplan::kernels::cuda {
namespace {

using graph::DType;
using graph::OpKind;

template <typename T>
void widen(const void* src, float* dst, std::int64_t n) {
  const T* s = static_cast<const T*>(src);
  for_each_index(n, "widen to f32", [=] __device__(std::int64_t i) { dst[i] = to_f32(s[i]); });
}

template <typename T>
void narrow(const float* src, void* dst, std::int64_t n) {
  T* d = static_cast<T*>(dst);
  for_each_index(n, "round to 16 bits", [=] __device__(std::int64_t i) { d[i] = from_f32<T>(src[i]); });
}

// The conversions the widening adapter makes, on the stream (f32 to f32 copies).
struct StreamConvert {
  void widen(DType d, const void* src, float* dst, std::int64_t n) const {
    if (d == DType::bf16) return cuda::widen<__nv_bfloat16>(src, dst, n);
    if (d == DType::f16) return cuda::widen<__half>(src, dst, n);
    MEMPLAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
  }
  void narrow(DType d, const float* src, void* dst, std::int64_t n) const {
    if (d == DType::bf16) return cuda::narrow<__nv_bfloat16>(src, dst, n);
    if (d == DType::f16) return cuda::narrow<__half>(src, dst, n);
    MEMPLAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
  }
};

// cast: f32 to or from 16 bits on the stream, each element rounded once as the CPU rounds it (a
// copy at the same dtype).
void k_cast(const KernelCall& c) {
  const TensorRef& x = c.inputs[0];
  const TensorRef& y = c.outputs[0];
  if (x.dtype == DType::f32) return StreamConvert{}.narrow(y.dtype, x.f32(), y.data, x.numel());
  if (y.dtype == DType::f32) return StreamConvert{}.widen(x.dtype, x.data, y.f32(), x.numel());
  MEMPLAN_CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, static_cast<std::size_t>(x.numel()) * graph::dtype_size(x.dtype),
                                     cudaMemcpyDeviceToDevice, stream()));
}

// --- the mixed optimizer updates -----------------------------------------------------------------

// 1 / loss scale: exact for the powers of two fp16 loss scaling uses.
float unscale(const KernelCall& c) { return static_cast<float>(1.0 / c.loss_scale); }
// The working copy's elements this rank updates (a ZeRO shard: from its offset), as on the CPU.
template <typename T>
T* updated_working(const KernelCall& c) {
  return static_cast<T*>(c.updates[0].data) + (c.attrs->shard_count >= 0 ? c.attrs->shard_offset : 0);
}
std::int64_t updated_count(const KernelCall& c) {
  return c.attrs->shard_count >= 0 ? c.attrs->shard_count : c.updates[0].numel();
}

template <typename T>
void k_sgd_update_mixed(const KernelCall& c) {
  T* p = updated_working<T>(c);
  float* master = c.updates[1].f32();
  const T* g = static_cast<const T*>(c.inputs[0].data);
  const float lr = c.lr(), wd = c.attrs->weight_decay, inv = unscale(c);
  for_each_index(updated_count(c), "sgd_update_mixed", [=] __device__(std::int64_t i) {
    sgd_element(master[i], to_f32(g[i]) * inv, lr, wd);
    p[i] = from_f32<T>(master[i]);
  });
}

template <typename T>
void k_sgd_momentum_update_mixed(const KernelCall& c) {
  T* p = updated_working<T>(c);
  float* master = c.updates[1].f32();
  float* buf = c.updates[2].f32();
  const T* g = static_cast<const T*>(c.inputs[0].data);
  const float lr = c.lr(), wd = c.attrs->weight_decay, mom = c.attrs->momentum, inv = unscale(c);
  for_each_index(updated_count(c), "sgd_momentum_update_mixed", [=] __device__(std::int64_t i) {
    sgd_momentum_element(master[i], buf[i], to_f32(g[i]) * inv, lr, wd, mom);
    p[i] = from_f32<T>(master[i]);
  });
}

template <typename T>
void k_adamw_update_mixed(const KernelCall& c) {
  T* p = updated_working<T>(c);
  float* master = c.updates[1].f32();
  float* m = c.updates[2].f32();
  float* v = c.updates[3].f32();
  const T* g = static_cast<const T*>(c.inputs[0].data);
  const AdamWScalars s = adamw_scalars(*c.attrs, c.step, c.lr());
  const float inv = unscale(c);
  for_each_index(updated_count(c), "adamw_update_mixed", [=] __device__(std::int64_t i) {
    adamw_element(master[i], m[i], v[i], to_f32(g[i]) * inv, s);
    p[i] = from_f32<T>(master[i]);
  });
}

// --- the embedding gather: 16-bit rows copied as they are (no f32 copy of the table) --------------

void k_embedding_16bit(const KernelCall& c) {
  const std::int32_t* ids = c.inputs[0].i32();
  const auto* table = static_cast<const std::uint16_t*>(c.inputs[1].data);
  const std::int64_t vocab = (*c.inputs[1].shape)[0], dim = (*c.inputs[1].shape)[1];
  const std::int64_t start = c.attrs->world > 1 ? c.attrs->start : 0;  // a vocabulary-parallel slice
  auto* y = static_cast<std::uint16_t*>(c.outputs[0].data);
  for_each_index(c.outputs[0].numel(), "embedding", [=] __device__(std::int64_t i) {
    const std::int64_t id = ids[i / dim] - start;
    y[i] = (id >= 0 && id < vocab) ? table[id * dim + i % dim] : std::uint16_t{0};
  });
}

// --- fp16's overflow check -----------------------------------------------------------------------

// flag = 1, then 0 written by any thread that finds a value with every exponent bit set (an
// infinity or NaN): every write is the same value, so the result does not depend on the order.
__global__ void clear_flag_kernel(float* flag) { *flag = 1.0f; }

void k_grads_finite(const KernelCall& c) {
  float* flag = c.outputs[0].f32();
  clear_flag_kernel<<<1, 1, 0, stream()>>>(flag);
  check_launch("grads_finite");
  for (const TensorRef& r : c.inputs) {
    if (r.dtype == DType::f32) {
      const auto* x = static_cast<const std::uint32_t*>(r.data);
      for_each_index(r.numel(), "grads_finite", [=] __device__(std::int64_t i) {
        if ((x[i] & 0x7f800000u) == 0x7f800000u) *flag = 0.0f;
      });
    } else {
      const auto* h = static_cast<const std::uint16_t*>(r.data);
      const std::uint16_t exponent = r.dtype == DType::f16 ? 0x7c00u : 0x7f80u;
      for_each_index(r.numel(), "grads_finite", [=] __device__(std::int64_t i) {
        if ((h[i] & exponent) == exponent) *flag = 0.0f;
      });
    }
  }
}

// --- the widening adapter ------------------------------------------------------------------------

const std::array<KernelFn, graph::kOpKindCount>& compute_kernels() {
  static const std::array<KernelFn, graph::kOpKindCount> table = f32_compute_table(f32_kernel_entries());
  return table;
}

void k_widened(const KernelCall& c) {
  const KernelFn compute = compute_kernels()[static_cast<std::size_t>(c.kind)];
  MEMPLAN_CHECK(compute != nullptr, "no f32 CUDA kernel to compute op " << graph::op_name(c.kind) << " in");
  // The call's workspace starts after cuBLAS's workspace and the kernels' scratch (the
  // executor's kernel_workspace).
  run_widened(c, compute, c.workspace, StreamConvert{});
}

}  // namespace

KernelEntries native_16bit_kernel_entries() {
  KernelEntries entries = blas_16bit_kernel_entries();
  for (const KernelEntries& part : {elementwise_16bit_kernel_entries(), reduction_16bit_kernel_entries(),
                                    nn_16bit_kernel_entries(), attention_16bit_kernel_entries()}) {
    entries.insert(entries.end(), part.begin(), part.end());
  }
  entries.push_back({OpKind::embedding, k_embedding_16bit, DType::bf16});
  entries.push_back({OpKind::embedding, k_embedding_16bit, DType::f16});
  for (DType d : {DType::f32, DType::bf16, DType::f16}) entries.push_back({OpKind::cast, k_cast, d});
  entries.push_back({OpKind::grads_finite, k_grads_finite, DType::f32});
  entries.push_back({OpKind::grads_finite, k_grads_finite, DType::bf16});
  entries.push_back({OpKind::grads_finite, k_grads_finite, DType::f16});
  entries.push_back({OpKind::sgd_update_mixed, k_sgd_update_mixed<__nv_bfloat16>, DType::bf16});
  entries.push_back({OpKind::sgd_update_mixed, k_sgd_update_mixed<__half>, DType::f16});
  entries.push_back({OpKind::sgd_momentum_update_mixed, k_sgd_momentum_update_mixed<__nv_bfloat16>, DType::bf16});
  entries.push_back({OpKind::sgd_momentum_update_mixed, k_sgd_momentum_update_mixed<__half>, DType::f16});
  entries.push_back({OpKind::adamw_update_mixed, k_adamw_update_mixed<__nv_bfloat16>, DType::bf16});
  entries.push_back({OpKind::adamw_update_mixed, k_adamw_update_mixed<__half>, DType::f16});
  const KernelEntries eight_bit = optimizer_8bit_16bit_kernel_entries();
  entries.insert(entries.end(), eight_bit.begin(), eight_bit.end());
  return entries;
}

KernelEntries widened_kernel_entries() {
  return widened_entries(compute_kernels(), native_16bit_kernel_entries(), k_widened);
}

}  // namespace memplan::kernels::cuda
