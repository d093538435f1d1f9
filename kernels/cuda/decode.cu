// CUDA kernels for generation with a KV cache: each slot's new key and value stored through its
// block table, and decode attention reading the cache through it. One thread block per (slot,
// head) walks the positions in chunks held in shared memory, rescaling its running sums when a
// chunk raises the maximum (online softmax), so any context length fits; the order is fixed by
// the launch shape, so results are the same on every run.
#include <cmath>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

constexpr int kDecodeThreads = 128;
constexpr int kDecodeChunk = 1024;  // positions whose scores one pass holds in shared memory

// Element i of a head of `hd` values, rotated by `pos` (rotary embedding: pairs (i, i + R/2) of
// the first R = rotary_dims channels, or all hd; the rest pass through).
__device__ inline float rotated(const float* head, std::int64_t i, std::int64_t hd, std::int64_t pos, double base,
                                std::int64_t rotary_dims) {
  const std::int64_t rd = rotary_dims > 0 ? rotary_dims : hd;
  if (i >= rd) return head[i];
  const std::int64_t half = rd / 2, p = i < half ? i : i - half;
  const double angle = double(pos) * pow(base, -2.0 * double(p) / double(rd));
  const float cs = float(cos(angle)), sn = float(sin(angle));
  const float a = head[p], b = head[p + half];
  return i < half ? a * cs - b * sn : b * cs + a * sn;
}

// Where position j lives in a cache [blocks, block_size, width], through a slot's block table: its row.
__device__ inline std::int64_t cache_row(const std::int32_t* blocks, std::int64_t j, std::int64_t block_size) {
  return std::int64_t{blocks[j / block_size]} * block_size + j % block_size;
}

void k_kv_cache_write(const KernelCall& c) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], width = (*c.inputs[0].shape)[1];
  const std::int64_t mb = (*c.inputs[2].shape)[1], block_size = (*c.updates[0].shape)[1];
  const float* k = c.inputs[0].f32();
  const float* v = c.inputs[1].f32();
  const std::int32_t* table = c.inputs[2].i32();
  const std::int32_t* positions = c.inputs[3].i32();
  float* k_cache = c.updates[0].f32();
  float* v_cache = c.updates[1].f32();
  const std::int64_t rotary_hd = c.attrs->shape.empty() ? 0 : c.attrs->shape[0];
  const double base = c.attrs->rope_base;
  const std::int64_t rotary_dims = c.attrs->rotary_dims;
  for_each_index(slots * width, "kv_cache_write", [=] __device__(std::int64_t i) {
    const std::int64_t b = i / width, e = i % width;
    const std::int32_t* blocks = table + b * mb;
    if (blocks[0] < 0) return;  // an empty slot
    const std::int64_t pos = positions[b];
    const std::int64_t row = cache_row(blocks, pos, block_size);
    k_cache[row * width + e] =
        rotary_hd > 0 ? rotated(k + b * width + e / rotary_hd * rotary_hd, e % rotary_hd, rotary_hd, pos, base, rotary_dims)
                      : k[i];
    v_cache[row * width + e] = v[i];
  });
}

// Query heads of hd channels; key head g at channel g * hd of rows key_row wide; value head g at
// channel g * vd + v_offset of rows v_row wide (decode_attention: separate K and V;
// latent_decode_attention: the key rows again, from the latent on).
struct DecodeShape {
  std::int64_t nh, group, hd, vd, key_row, v_row, v_offset, mb, block_size;
  bool rotary;
  double rope_base;
  std::int64_t rotary_dims;
  float scale;    // the score scale (the op's alpha, or 1 / sqrt(HD))
  float softcap;  // scores capped to softcap * tanh(s / softcap); 0: none
};

// Block (b, h): scores of a chunk of positions into shared memory, then the chunk's weighted
// values added to acc[HD] (shared), after rescaling by exp(old max - new max).
__global__ void decode_attention_kernel(DecodeShape s, const float* q, const float* k, const float* v,
                                        const float* k_cache, const float* v_cache, const std::int32_t* table,
                                        const std::int32_t* positions, float* y) {
  extern __shared__ float shared[];
  float* scores = shared;                    // [kDecodeChunk]
  float* acc = shared + kDecodeChunk;        // [VD]
  float* q_rot = acc + s.vd;                 // [HD] the query, rotated when s.rotary
  float* k_own = q_rot + s.hd;               // [HD] this position's key, rotated when s.rotary
  const std::int64_t b = blockIdx.x / s.nh, h = blockIdx.x % s.nh, g = h / s.group;
  const std::int32_t* blocks = table + b * s.mb;
  float* out = y + b * s.nh * s.vd + h * s.vd;
  if (blocks[0] < 0) {
    for (std::int64_t d = threadIdx.x; d < s.vd; d += blockDim.x) out[d] = 0.0f;
    return;
  }
  const std::int64_t pos = positions[b];
  for (std::int64_t d = threadIdx.x; d < s.vd; d += blockDim.x) acc[d] = 0.0f;
  for (std::int64_t d = threadIdx.x; d < s.hd; d += blockDim.x) {
    const float* q_head = q + b * s.nh * s.hd + h * s.hd;
    const float* k_head = k + b * s.key_row + g * s.hd;
    q_rot[d] = s.rotary ? rotated(q_head, d, s.hd, pos, s.rope_base, s.rotary_dims) : q_head[d];
    k_own[d] = s.rotary ? rotated(k_head, d, s.hd, pos, s.rope_base, s.rotary_dims) : k_head[d];
  }
  __syncthreads();
  const float* qh = q_rot;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (std::int64_t start = 0; start <= pos; start += kDecodeChunk) {
    const std::int64_t count = pos + 1 - start < kDecodeChunk ? pos + 1 - start : std::int64_t{kDecodeChunk};
    float local_max = -INFINITY;
    for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const std::int64_t j = start + i;
      const float* kj = j == pos ? k_own : k_cache + cache_row(blocks, j, s.block_size) * s.key_row + g * s.hd;
      float dot = 0.0f;
      for (std::int64_t d = 0; d < s.hd; ++d) dot += qh[d] * kj[d];
      const float score = s.softcap > 0.0f ? s.softcap * tanhf(dot * s.scale / s.softcap) : dot * s.scale;
      scores[i] = score;
      local_max = fmaxf(local_max, score);
    }
    const float chunk_max = block_max(local_max);
    const float new_max = fmaxf(running_max, chunk_max);
    float local_sum = 0.0f;
    for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      scores[i] = __expf(scores[i] - new_max);
      local_sum += scores[i];
    }
    const float chunk_sum = block_sum(local_sum);
    const float rescale = __expf(running_max - new_max);  // 0 on the first chunk
    __syncthreads();  // every score of the chunk is written
    for (std::int64_t d = threadIdx.x; d < s.vd; d += blockDim.x) {
      float a = acc[d] * rescale;
      for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t j = start + i;
        const float* vj = (j == pos ? v + b * s.v_row : v_cache + cache_row(blocks, j, s.block_size) * s.v_row) +
                          g * s.vd + s.v_offset;
        a += scores[i] * vj[d];
      }
      acc[d] = a;
    }
    running_sum = running_sum * rescale + chunk_sum;
    running_max = new_max;
    __syncthreads();  // the chunk's scores are read before the next chunk overwrites them
  }
  for (std::int64_t d = threadIdx.x; d < s.vd; d += blockDim.x) out[d] = acc[d] / running_sum;
}

void launch_decode(const KernelCall& c, const DecodeShape& s, std::int64_t slots, const float* q, const float* k,
                   const float* v, const float* k_cache, const float* v_cache, const std::int32_t* table,
                   const std::int32_t* positions, const char* name) {
  const auto blocks = static_cast<unsigned>(slots * s.nh);
  if (blocks == 0) return;
  const std::size_t shared_bytes = static_cast<std::size_t>(kDecodeChunk + s.vd + 2 * s.hd) * sizeof(float);
  decode_attention_kernel<<<blocks, kDecodeThreads, shared_bytes, stream()>>>(s, q, k, v, k_cache, v_cache, table,
                                                                               positions, c.outputs[0].f32());
  check_launch(name);
}

void k_decode_attention(const KernelCall& c) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], q_width = (*c.inputs[0].shape)[1];
  const std::int64_t nh = c.attrs->shape[0], nkv = c.attrs->shape[1], hd = q_width / nh;
  const DecodeShape s{nh, nh / nkv, hd, hd, nkv * hd, nkv * hd, 0, (*c.inputs[5].shape)[1], (*c.inputs[3].shape)[1],
                      c.attrs->shape.size() == 3, c.attrs->rope_base, c.attrs->rotary_dims,
                      c.attrs->alpha > 0.0f ? c.attrs->alpha : 1.0f / std::sqrt(float(hd)), c.attrs->softcap};
  launch_decode(c, s, slots, c.inputs[0].f32(), c.inputs[1].f32(), c.inputs[2].f32(), c.inputs[3].f32(),
                c.inputs[4].f32(), c.inputs[5].i32(), c.inputs[6].i32(), "decode_attention");
}

// The value is the shared key row's latent: the same rows, read from channel `start` on.
void k_latent_decode_attention(const KernelCall& c) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], nh = c.attrs->shape[0], hd = (*c.inputs[1].shape)[1];
  const DecodeShape s{nh, nh, hd, hd - c.attrs->start, hd, hd, c.attrs->start, (*c.inputs[3].shape)[1],
                      (*c.inputs[2].shape)[1], c.attrs->shape.size() == 2, c.attrs->rope_base, c.attrs->rotary_dims,
                      c.attrs->alpha > 0.0f ? c.attrs->alpha : 1.0f / std::sqrt(float(hd)), c.attrs->softcap};
  const float* key = c.inputs[1].f32();
  const float* cache = c.inputs[2].f32();
  launch_decode(c, s, slots, c.inputs[0].f32(), key, key, cache, cache, c.inputs[3].i32(), c.inputs[4].i32(),
                "latent_decode_attention");
}

void k_latent_cache_write(const KernelCall& c) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], width = (*c.inputs[0].shape)[1];
  const std::int64_t mb = (*c.inputs[1].shape)[1], block_size = (*c.updates[0].shape)[1];
  const float* key = c.inputs[0].f32();
  const std::int32_t* table = c.inputs[1].i32();
  const std::int32_t* positions = c.inputs[2].i32();
  float* cache = c.updates[0].f32();
  const bool rotary = !c.attrs->shape.empty();
  const double base = c.attrs->rope_base;
  const std::int64_t rotary_dims = c.attrs->rotary_dims;
  for_each_index(slots * width, "latent_cache_write", [=] __device__(std::int64_t i) {
    const std::int64_t b = i / width, e = i % width;
    const std::int32_t* blocks = table + b * mb;
    if (blocks[0] < 0) return;  // an empty slot
    const std::int64_t pos = positions[b];
    const std::int64_t row = cache_row(blocks, pos, block_size);
    cache[row * width + e] = rotary ? rotated(key + b * width, e, width, pos, base, rotary_dims) : key[i];
  });
}

}  // namespace

KernelEntries decode_kernel_entries() {
  return {
      {OpKind::kv_cache_write, k_kv_cache_write},
      {OpKind::decode_attention, k_decode_attention},
      {OpKind::latent_cache_write, k_latent_cache_write},
      {OpKind::latent_decode_attention, k_latent_decode_attention},
  };
}

}  // namespace memplan::kernels::cuda
