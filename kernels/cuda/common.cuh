// Helpers shared by the CUDA kernel files: launch geometry, the stream, fixed-order block
// reductions. Every reduction here combines values in an order fixed by the launch shape alone
// (warp shuffles, then warps in index order), so results are the same on every run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "memplan/kernels/cuda/context.h"
#include "memplan/kernels/kernel.h"

namespace memplan::kernels::cuda {

inline constexpr int kThreads = 256;
inline constexpr int kReduceThreads = 512;

inline cudaStream_t stream() { return context().stream; }

inline unsigned blocks_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535LL * 32 ? 65535LL * 32 : b));
}

// Launch errors surface at once, with the op that caused them.
inline void check_launch(const char* op) {
  const cudaError_t status = cudaGetLastError();
  MEMPLAN_CHECK(status == cudaSuccess, "CUDA kernel for '" << op << "' failed to launch: " << error_string(status));
}

#define MEMPLAN_GRID_STRIDE(i, n) \
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < (n); i += std::int64_t(gridDim.x) * blockDim.x)

// Runs f(i) for every i in [0, n) on the stream, one thread per index (grid-stride).
template <typename F>
__global__ void map_kernel(std::int64_t n, F f) {
  MEMPLAN_GRID_STRIDE(i, n) f(i);
}

template <typename F>
void for_each_index(std::int64_t n, const char* op, F f) {
  if (n <= 0) return;
  map_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(n, f);
  check_launch(op);
}

template <typename T>
__device__ inline T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block; every thread gets the total. blockDim.x must be a multiple of 32 (<= 1024).
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  total = warp_sum(total);
  return __shfl_sync(0xffffffffu, total, 0);
}

__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = lane < warps ? partial[lane] : -INFINITY;
  m = warp_max(m);
  return __shfl_sync(0xffffffffu, m, 0);
}

// f32 from each storage type, and back, rounding to nearest even.
__device__ inline float to_f32(float v) { return v; }
__device__ inline float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_f32(__half v) { return __half2float(v); }
template <typename T>
__device__ inline T from_f32(float f);
template <>
__device__ inline float from_f32<float>(float f) { return f; }
template <>
__device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
template <>
__device__ inline __half from_f32<__half>(float f) { return __float2half_rn(f); }

// An operand as a kernel computing in f32 sees it, whatever its storage: f32 as it is, bf16 and
// f16 widened as each element is read and rounded to nearest even as it is written. A kernel
// written with these computes every dtype from one body, in registers, without the f32 copies
// of the widening adapter (the dtype branch is the same for every thread). For ops whose outputs
// are written once per element, never read back: a 16-bit accumulation in place would round at
// every step.
struct In {
  const void* p = nullptr;
  graph::DType t = graph::DType::f32;
  __device__ float operator[](std::int64_t i) const {
    if (t == graph::DType::bf16) return to_f32(static_cast<const __nv_bfloat16*>(p)[i]);
    if (t == graph::DType::f16) return to_f32(static_cast<const __half*>(p)[i]);
    return static_cast<const float*>(p)[i];
  }
};
struct Out {
  void* p = nullptr;
  graph::DType t = graph::DType::f32;
  __device__ void set(std::int64_t i, float v) const {
    if (t == graph::DType::bf16) {
      static_cast<__nv_bfloat16*>(p)[i] = from_f32<__nv_bfloat16>(v);
    } else if (t == graph::DType::f16) {
      static_cast<__half*>(p)[i] = from_f32<__half>(v);
    } else {
      static_cast<float*>(p)[i] = v;
    }
  }
};
inline In in(const TensorRef& r) { return {r.data, r.dtype}; }
inline Out out(const TensorRef& r) { return {r.data, r.dtype}; }

// Elementwise maps whose output element i reads element i of each input: y = f(a) or f(a, b),
// computed in f32. When every operand is 16-bit of one dtype and 16-byte aligned, a thread moves
// eight elements with one 16-byte load per input and one store (the tail, and every other case,
// one element per thread through In/Out): the same f on the same values, so the same bits.
template <typename T>
__device__ inline void unpack8(const uint4& raw, float (&v)[8]) {
  const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = to_f32(h[k]);
}
template <typename T>
__device__ inline uint4 pack8(const float (&v)[8]) {
  uint4 raw;
  T* h = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < 8; ++k) h[k] = from_f32<T>(v[k]);
  return raw;
}

template <typename T, int Arity, typename F>
__global__ void map8_kernel(std::int64_t vectors, const uint4* a, const uint4* b, uint4* y, F f) {
  MEMPLAN_GRID_STRIDE(i, vectors) {
    float va[8], vb[8], vy[8];
    unpack8<T>(a[i], va);
    if constexpr (Arity == 2) unpack8<T>(b[i], vb);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if constexpr (Arity == 2) {
        vy[k] = f(va[k], vb[k]);
      } else {
        vy[k] = f(va[k]);
      }
    }
    y[i] = pack8<T>(vy);
  }
}

// Elements [first, n), one per thread.
template <int Arity, typename F>
__global__ void map1_kernel(std::int64_t first, std::int64_t n, In a, In b, Out y, F f) {
  MEMPLAN_GRID_STRIDE(e, n - first) {
    const std::int64_t i = first + e;
    if constexpr (Arity == 2) {
      y.set(i, f(a[i], b[i]));
    } else {
      y.set(i, f(a[i]));
    }
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <int Arity, typename F>
void map_elements(const KernelCall& c, const char* op, F f) {
  const TensorRef& y = c.outputs[0];
  const std::int64_t n = y.numel();
  bool vector = graph::is_16bit_float(y.dtype) && aligned16(y.data);
  for (int k = 0; k < Arity; ++k) vector = vector && c.inputs[k].dtype == y.dtype && aligned16(c.inputs[k].data);
  std::int64_t first = 0;
  if (vector && n >= 8) {
    const std::int64_t vectors = n / 8;
    const auto* a = static_cast<const uint4*>(c.inputs[0].data);
    const auto* b = Arity == 2 ? static_cast<const uint4*>(c.inputs[Arity - 1].data) : nullptr;
    auto* out = static_cast<uint4*>(y.data);
    if (y.dtype == graph::DType::bf16) {
      map8_kernel<__nv_bfloat16, Arity><<<blocks_for(vectors), kThreads, 0, stream()>>>(vectors, a, b, out, f);
    } else {
      map8_kernel<__half, Arity><<<blocks_for(vectors), kThreads, 0, stream()>>>(vectors, a, b, out, f);
    }
    check_launch(op);
    first = vectors * 8;
  }
  if (first == n) return;
  map1_kernel<Arity><<<blocks_for(n - first), kThreads, 0, stream()>>>(first, n, in(c.inputs[0]), in(c.inputs[Arity - 1]),
                                                                       out(y), f);
  check_launch(op);
}

// The entries of kernels that compute every dtype from one body (In/Out, or templated on the
// working dtype), registered again at bf16 and f16: ops CUDA runs at 16 bits natively.
inline KernelEntries at_16_bits(const KernelEntries& any_dtype) {
  KernelEntries entries;
  for (const KernelEntry& e : any_dtype) {
    entries.push_back({e.kind, e.fn, graph::DType::bf16});
    entries.push_back({e.kind, e.fn, graph::DType::f16});
  }
  return entries;
}

// x [N, C, ...] as (N, C, S).
struct Nc {
  std::int64_t n, c, s;
};
inline Nc nc_of(const graph::Shape& x) { return {x[0], x[1], x.numel() / (x[0] * x[1])}; }

}  // namespace memplan::kernels::cuda
