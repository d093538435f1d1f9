// 8-bit AdamW on CUDA (kernels/shared/optimizers.h: bitsandbytes' block-wise update): one thread
// block per block of 256 elements, one element a thread. The maps sit in shared memory, and the
// block's new absmax is a shared-memory max over its threads (max is exact in any order, so the
// result is the CPU's).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "memplan/graph/optimizer.h"
#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/optimizers.h"

namespace memplan::kernels::cuda {
namespace {

using graph::DType;
using graph::OpKind;

static_assert(graph::kAdam8bitBlock == kThreads, "one thread per element of an 8-bit Adam block");

struct States {
  std::uint8_t* m_codes;
  std::uint8_t* v_codes;
  float* m_absmax;
  float* v_absmax;
};

// `p`: the f32 values updated (the parameter, or a mixed update's master); `working`: the 16-bit
// working copy a mixed update rounds into (nullptr at f32); `g` read at its own width.
template <typename G, typename W>
__global__ void adam8bit_kernel(std::int64_t n, float* p, W* working, const G* g, States s, Adam8bitScalars sc,
                                float grad_scale) {
  __shared__ float maps[kAdam8bitMapValues];
  __shared__ float m_max[kThreads];
  __shared__ float v_max[kThreads];
  for (int i = static_cast<int>(threadIdx.x); i < kAdam8bitMapValues; i += kThreads) maps[i] = adam8bit_map_value(i);
  __syncthreads();
  const std::int64_t b = blockIdx.x;
  const std::int64_t i = b * kThreads + threadIdx.x;
  float m = 0.0f, v = 0.0f;
  if (i < n) {
    adam8bit_moments(maps, s.m_codes[i], s.v_codes[i], s.m_absmax[b], s.v_absmax[b], to_f32(g[i]) * grad_scale, sc, m, v);
  }
  m_max[threadIdx.x] = fabsf(m);
  v_max[threadIdx.x] = fabsf(v);
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) {
      m_max[threadIdx.x] = fmaxf(m_max[threadIdx.x], m_max[threadIdx.x + stride]);
      v_max[threadIdx.x] = fmaxf(v_max[threadIdx.x], v_max[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float m_absmax = m_max[0], v_absmax = v_max[0];
  if (threadIdx.x == 0) {
    s.m_absmax[b] = m_absmax;
    s.v_absmax[b] = v_absmax;
  }
  if (i >= n) return;
  float pi = p[i];
  adam8bit_param(pi, m, v, sc);
  p[i] = pi;
  if constexpr (!std::is_same_v<W, float>) working[i] = from_f32<W>(pi);
  adam8bit_codes(maps, m, v, m_absmax, v_absmax, s.m_codes[i], s.v_codes[i]);
}

std::int64_t updated_count(const KernelCall& c) {
  return c.attrs->shard_count >= 0 ? c.attrs->shard_count : c.updates[0].numel();
}
std::int64_t shard_offset(const KernelCall& c) { return c.attrs->shard_count >= 0 ? c.attrs->shard_offset : 0; }

States states(const KernelCall& c, std::size_t first) {
  return {c.updates[first].u8(), c.updates[first + 1].u8(), c.updates[first + 2].f32(), c.updates[first + 3].f32()};
}

template <typename G, typename W>
void launch(const KernelCall& c, float* p, W* working, std::size_t first, float grad_scale, const char* op) {
  const std::int64_t n = updated_count(c);
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  adam8bit_kernel<G, W><<<blocks, kThreads, 0, stream()>>>(n, p, working, static_cast<const G*>(c.inputs[0].data),
                                                           states(c, first), adam8bit_scalars(*c.attrs, c.step, c.lr()),
                                                           grad_scale);
  check_launch(op);
}

void k_adamw8bit_update(const KernelCall& c) {
  launch<float, float>(c, c.updates[0].f32() + shard_offset(c), nullptr, 1, 1.0f, "adamw8bit_update");
}

// Mixed: the f32 master (indexed from 0, as its shard is) is updated and rounded into the 16-bit
// working copy; the gradient is unscaled (fp16 loss scaling).
template <typename T>
void k_adamw8bit_update_mixed(const KernelCall& c) {
  T* working = static_cast<T*>(c.updates[0].data) + shard_offset(c);
  launch<T, T>(c, c.updates[1].f32(), working, 2, static_cast<float>(1.0 / c.loss_scale), "adamw8bit_update_mixed");
}

}  // namespace

KernelEntries optimizer_8bit_kernel_entries() { return {{OpKind::adamw8bit_update, k_adamw8bit_update}}; }

KernelEntries optimizer_8bit_16bit_kernel_entries() {
  return {{OpKind::adamw8bit_update_mixed, k_adamw8bit_update_mixed<__nv_bfloat16>, DType::bf16},
          {OpKind::adamw8bit_update_mixed, k_adamw8bit_update_mixed<__half>, DType::f16}};
}

}  // namespace memplan::kernels::cuda
