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

// Where position `pos` of slot `b` lives in a cache [blocks, block_size, width]: its row.
inline const std::int32_t* table_row(const KernelCall& c, int table_input, std::int64_t b) {
  return c.inputs[static_cast<std::size_t>(table_input)].i32() + b * (*c.inputs[static_cast<std::size_t>(table_input)].shape)[1];
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
    const std::int64_t row = std::int64_t{blocks[pos / block_size]} * block_size + pos % block_size;
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

// softmax(q K^T / sqrt(HD)) V over positions 0..pos of the slot: positions < pos from the cache,
// position pos from the slot's own k and v. Scores and sums accumulate in double.
void k_decode_attention(const KernelCall& c) {
  const std::int64_t slots = (*c.inputs[0].shape)[0], q_width = (*c.inputs[0].shape)[1];
  const std::int64_t nh = c.attrs->shape[0], nkv = c.attrs->shape[1];
  const std::int64_t hd = q_width / nh, kv_width = nkv * hd, group = nh / nkv;
  const std::int64_t block_size = (*c.inputs[3].shape)[1];
  const std::int64_t max_positions = (*c.inputs[5].shape)[1] * block_size;
  const float* q = c.inputs[0].f32();
  const float* k = c.inputs[1].f32();
  const float* v = c.inputs[2].f32();
  const float* k_cache = c.inputs[3].f32();
  const float* v_cache = c.inputs[4].f32();
  const std::int32_t* positions = c.inputs[6].i32();
  float* y = c.outputs[0].f32();
  const double scale = c.attrs->alpha > 0.0f ? double(c.attrs->alpha) : 1.0 / std::sqrt(double(hd));
  const double softcap = c.attrs->softcap;
  // A few chunks a thread (each chunk's scratch is its own); heads are independent, so the split
  // changes no value.
  const std::int64_t heads = slots * nh;
  const std::int64_t chunk = std::max<std::int64_t>(1, heads / (4 * std::int64_t{parallel_threads()}));
  parallel_for(heads, chunk, [&](std::int64_t begin, std::int64_t end, int) {
    std::vector<double> weights(static_cast<std::size_t>(max_positions));
    std::vector<double> acc(static_cast<std::size_t>(hd));
    std::vector<float> q_rot(static_cast<std::size_t>(hd)), k_rot(static_cast<std::size_t>(hd));
    const bool rotary = c.attrs->shape.size() == 3;
    for (std::int64_t bh = begin; bh < end; ++bh) {
      const std::int64_t b = bh / nh, h = bh % nh, g = h / group;
      float* out = y + b * q_width + h * hd;
      const std::int32_t* blocks = table_row(c, 5, b);
      if (blocks[0] < 0) {  // an empty slot
        for (std::int64_t d = 0; d < hd; ++d) out[d] = 0.0f;
        continue;
      }
      const std::int64_t pos = positions[b];
      const float* qh = q + b * q_width + h * hd;
      const float* own_key = k + b * kv_width + g * hd;
      if (rotary) {  // the cache holds rotated keys; the query and this position's key rotate here
        rotate_head(qh, q_rot.data(), hd, pos, c.attrs->rope_base, c.attrs->rotary_dims);
        rotate_head(own_key, k_rot.data(), hd, pos, c.attrs->rope_base, c.attrs->rotary_dims);
        qh = q_rot.data();
        own_key = k_rot.data();
      }
      auto key_of = [&](std::int64_t j) {
        if (j == pos) return own_key;
        return k_cache + (std::int64_t{blocks[j / block_size]} * block_size + j % block_size) * kv_width + g * hd;
      };
      auto value_of = [&](std::int64_t j) {
        if (j == pos) return v + b * kv_width + g * hd;
        return v_cache + (std::int64_t{blocks[j / block_size]} * block_size + j % block_size) * kv_width + g * hd;
      };
      double top = -INFINITY;
      for (std::int64_t j = 0; j <= pos; ++j) {
        const float* kj = key_of(j);
        double dot = 0.0;
        for (std::int64_t d = 0; d < hd; ++d) dot += double(qh[d]) * double(kj[d]);
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
      for (std::int64_t d = 0; d < hd; ++d) acc[static_cast<std::size_t>(d)] = 0.0;
      for (std::int64_t j = 0; j <= pos; ++j) {
        const float* vj = value_of(j);
        const double w = weights[static_cast<std::size_t>(j)];
        for (std::int64_t d = 0; d < hd; ++d) acc[static_cast<std::size_t>(d)] += w * double(vj[d]);
      }
      for (std::int64_t d = 0; d < hd; ++d) out[d] = float(acc[static_cast<std::size_t>(d)] / total);
    }
  });
}

}  // namespace

KernelEntries decode_kernel_entries() {
  return {
      {OpKind::kv_cache_write, k_kv_cache_write},
      {OpKind::decode_attention, k_decode_attention},
  };
}

}  // namespace memplan::kernels::cpu
