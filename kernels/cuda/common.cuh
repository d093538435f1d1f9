// Helpers shared by the CUDA kernel files: launch geometry, the stream, fixed-order block
// reductions. Every reduction here combines values in an order fixed by the launch shape alone
// (warp shuffles, then warps in index order), so results are the same on every run.
#pragma once

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

// x [N, C, ...] as (N, C, S).
struct Nc {
  std::int64_t n, c, s;
};
inline Nc nc_of(const graph::Shape& x) { return {x[0], x[1], x.numel() / (x[0] * x[1])}; }

}  // namespace memplan::kernels::cuda
