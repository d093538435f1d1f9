// CPU kernels for generation with a KV cache: storing each slot's new key and value through its
// block table, and one query per slot attending over its cached positions. Every (slot, head) is
// computed on its own in a fixed order, so a sequence's result depends neither on the other slots
// nor on where its blocks lie in the pool (contiguous and paged caches give the same bits).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

// Slot `b`'s block table: the pool block of each run of block_size positions.
inline const std::int32_t* table_row(const KernelCall& c, int table_input, std::int64_t b) {
  return c.inputs[static_cast<std::size_t>(table_input)].i32() + b * (*c.inputs[static_cast<std::size_t>(table_input)].shape)[1];
}

// Where position `pos` lives in a cache [blocks, block_size, width], through a slot's table: its row.
inline std::int64_t cache_row(const std::int32_t* blocks, std::int64_t pos, std::int64_t block_size) {
  return std::int64_t{blocks[pos / block_size]} * block_size + pos % block_size;
}

void k_kv_cache_write(const KernelCall& c) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], width = (*c.inputs[0].shape)[1];
  const std::int64_t block_size = (*c.updates[0].shape)[1];
  const float* k = c.inputs[0].f32();
  const float* v = c.inputs[1].f32();
  const std::int32_t* positions = c.inputs[3].i32();
  float* k_cache = c.updates[0].f32();
  float* v_cache = c.updates[1].f32();
  for (std::int64_t b = 0; b < slots; ++b) {
    const std::int32_t* blocks = table_row(c, 2, b);
    if (blocks[0] < 0) continue;  // an empty slot
    const std::int64_t pos = positions[b];
    const std::int64_t row = cache_row(blocks, pos, block_size);
    if (c.attrs->shape.empty()) {
      std::memcpy(k_cache + row * width, k + b * width, static_cast<std::size_t>(width) * sizeof(float));
    } else {
      const std::int64_t hd = c.attrs->shape[0];
      for (std::int64_t head = 0; head < width / hd; ++head) {
        rotate_head(k + b * width + head * hd, k_cache + row * width + head * hd, hd, pos, c.attrs->rope_base, c.attrs->rotary_dims);
      }
    }
    std::memcpy(v_cache + row * width, v + b * width, static_cast<std::size_t>(width) * sizeof(float));
  }
}

void k_latent_cache_write(const KernelCall& c) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], width = (*c.inputs[0].shape)[1];
  const std::int64_t block_size = (*c.updates[0].shape)[1];
  const float* key = c.inputs[0].f32();
  const std::int32_t* positions = c.inputs[2].i32();
  float* cache = c.updates[0].f32();
  for (std::int64_t b = 0; b < slots; ++b) {
    const std::int32_t* blocks = table_row(c, 1, b);
    if (blocks[0] < 0) continue;  // an empty slot
    const std::int64_t pos = positions[b];
    const std::int64_t row = cache_row(blocks, pos, block_size);
    if (c.attrs->shape.empty()) {
      std::memcpy(cache + row * width, key + b * width, static_cast<std::size_t>(width) * sizeof(float));
    } else {
      rotate_head(key + b * width, cache + row * width, width, pos, c.attrs->rope_base, c.attrs->rotary_dims);
    }
  }
}

// Where one step's attention reads: query heads of hd channels; key head g at channel g * hd of
// rows key_row wide; value head g at channel g * vd + v_offset of rows v_row wide (decode_attention:
// separate K and V; latent_decode_attention: the key rows again, from the latent on).
struct CacheAttention {
  const float* q;
  const float* k;
  const float* v;
  const float* k_cache;
  const float* v_cache;
  const std::int32_t* positions;
  int table_input;
  std::int64_t nh, group, hd, vd, key_row, v_row, v_offset;
  bool rotary;
};

// softmax(q K^T / sqrt(HD)) V over positions 0..pos of the slot: positions < pos from the cache,
// position pos from the slot's own k and v. Scores and sums accumulate in double.
void attend_over_cache(const KernelCall& c, const CacheAttention& a, std::int64_t block_size, std::int64_t max_positions) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], q_width = a.nh * a.hd, out_width = a.nh * a.vd;
  float* y = c.outputs[0].f32();
  const double scale = c.attrs->alpha > 0.0f ? double(c.attrs->alpha) : 1.0 / std::sqrt(double(a.hd));
  const double softcap = c.attrs->softcap;
  // A few chunks a thread (each chunk's scratch is its own); heads are independent, so the split
  // changes no value.
  const std::int64_t heads = slots * a.nh;
  const std::int64_t chunk = std::max<std::int64_t>(1, heads / (4 * std::int64_t{parallel_threads()}));
  parallel_for(heads, chunk, [&](std::int64_t begin, std::int64_t end, int) {
    std::vector<double> weights(static_cast<std::size_t>(max_positions));
    std::vector<double> acc(static_cast<std::size_t>(a.vd));
    std::vector<float> q_rot(static_cast<std::size_t>(a.hd)), k_rot(static_cast<std::size_t>(a.hd));
    for (std::int64_t bh = begin; bh < end; ++bh) {
      const std::int64_t b = bh / a.nh, h = bh % a.nh, g = h / a.group;
      float* out = y + b * out_width + h * a.vd;
      const std::int32_t* blocks = table_row(c, a.table_input, b);
      if (blocks[0] < 0) {  // an empty slot
        for (std::int64_t d = 0; d < a.vd; ++d) out[d] = 0.0f;
        continue;
      }
      const std::int64_t pos = a.positions[b];
      const float* qh = a.q + b * q_width + h * a.hd;
      const float* own_key = a.k + b * a.key_row + g * a.hd;
      if (a.rotary) {  // the cache holds rotated keys; the query and this position's key rotate here
        rotate_head(qh, q_rot.data(), a.hd, pos, c.attrs->rope_base, c.attrs->rotary_dims);
        rotate_head(own_key, k_rot.data(), a.hd, pos, c.attrs->rope_base, c.attrs->rotary_dims);
        qh = q_rot.data();
        own_key = k_rot.data();
      }
      auto key_of = [&](std::int64_t j) { return j == pos ? own_key : a.k_cache + cache_row(blocks, j, block_size) * a.key_row + g * a.hd; };
      auto value_of = [&](std::int64_t j) {
        return (j == pos ? a.v + b * a.v_row : a.v_cache + cache_row(blocks, j, block_size) * a.v_row) + g * a.vd + a.v_offset;
      };
      double top = -INFINITY;
      for (std::int64_t j = 0; j <= pos; ++j) {
        const float* kj = key_of(j);
        double dot = 0.0;
        for (std::int64_t d = 0; d < a.hd; ++d) dot += double(qh[d]) * double(kj[d]);
        const double score = softcap > 0.0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
        weights[static_cast<std::size_t>(j)] = score;
        top = std::max(top, score);
      }
      double total = 0.0;
      for (std::int64_t j = 0; j <= pos; ++j) {
        double& w = weights[static_cast<std::size_t>(j)];
        w = std::exp(w - top);
        total += w;
      }
      for (std::int64_t d = 0; d < a.vd; ++d) acc[static_cast<std::size_t>(d)] = 0.0;
      for (std::int64_t j = 0; j <= pos; ++j) {
        const float* vj = value_of(j);
        const double w = weights[static_cast<std::size_t>(j)];
        for (std::int64_t d = 0; d < a.vd; ++d) acc[static_cast<std::size_t>(d)] += w * double(vj[d]);
      }
      for (std::int64_t d = 0; d < a.vd; ++d) out[d] = float(acc[static_cast<std::size_t>(d)] / total);
    }
  });
}

void k_decode_attention(const KernelCall& c) {
  const std::int64_t q_width = (*c.inputs[0].shape)[1];
  const std::int64_t nh = c.attrs->shape[0], nkv = c.attrs->shape[1];
  const std::int64_t hd = q_width / nh, kv_width = nkv * hd;
  const std::int64_t block_size = (*c.inputs[3].shape)[1];
  const CacheAttention a{c.inputs[0].f32(), c.inputs[1].f32(), c.inputs[2].f32(), c.inputs[3].f32(), c.inputs[4].f32(),
                         c.inputs[6].i32(), 5, nh, nh / nkv, hd, hd, kv_width, kv_width, 0, c.attrs->shape.size() == 3};
  attend_over_cache(c, a, block_size, (*c.inputs[5].shape)[1] * block_size);
}

// The value is the shared key row's latent: the same rows, read from channel `start` on.
void k_latent_decode_attention(const KernelCall& c) {
  const std::int64_t nh = c.attrs->shape[0], hd = (*c.inputs[1].shape)[1];
  const std::int64_t block_size = (*c.inputs[2].shape)[1];
  const float* key = c.inputs[1].f32();
  const float* cache = c.inputs[2].f32();
  const CacheAttention a{c.inputs[0].f32(), key, key, cache, cache, c.inputs[4].i32(), 3, nh, nh, hd,
                         hd - c.attrs->start, hd, hd, c.attrs->start, c.attrs->shape.size() == 2};
  attend_over_cache(c, a, block_size, (*c.inputs[3].shape)[1] * block_size);
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

}  // namespace memplan::kernels::cpu
