// 8-bit AdamW on the CPU (kernels/shared/optimizers.h: bitsandbytes' block-wise update): one
// block of 256 elements per work item, so each block's absmax is found by the item that uses it.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "memplan/graph/optimizer.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/shared/optimizers.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

const float* maps() {
  static const std::array<float, kAdam8bitMapValues> table = [] {
    std::array<float, kAdam8bitMapValues> t{};
    for (int i = 0; i < kAdam8bitMapValues; ++i) t[static_cast<std::size_t>(i)] = adam8bit_map_value(i);
    return t;
  }();
  return table.data();
}

// The update of `count` elements: p (and, mixed, the working copy `working` it rounds into, which
// is the widened parameter), the codes and absmax from updates[first..first+3], the gradient
// times `grad_scale`.
void update_blocks(const KernelCall& c, float* p, float* working, std::size_t first, float grad_scale) {
  std::uint8_t* m_codes = c.updates[first].u8();
  std::uint8_t* v_codes = c.updates[first + 1].u8();
  float* m_absmax = c.updates[first + 2].f32();
  float* v_absmax = c.updates[first + 3].f32();
  const float* g = c.inputs[0].f32();
  const std::int64_t n = updated_count(c);
  const Adam8bitScalars s = adam8bit_scalars(*c.attrs, c.step, c.lr());
  const float* table = maps();
  const std::int64_t blocks = (n + graph::kAdam8bitBlock - 1) / graph::kAdam8bitBlock;
  parallel_each(blocks, graph::kAdam8bitBlock, [=](std::int64_t b) {
    const std::int64_t begin = b * graph::kAdam8bitBlock;
    const std::int64_t end = std::min(n, begin + graph::kAdam8bitBlock);
    std::array<float, graph::kAdam8bitBlock> m{}, v{};
    float m_max = 0.0f, v_max = 0.0f;
    for (std::int64_t i = begin; i < end; ++i) {
      const std::size_t j = static_cast<std::size_t>(i - begin);
      adam8bit_moments(table, m_codes[i], v_codes[i], m_absmax[b], v_absmax[b], g[i] * grad_scale, s, m[j], v[j]);
      m_max = std::max(m_max, std::fabs(m[j]));
      v_max = std::max(v_max, std::fabs(v[j]));
    }
    m_absmax[b] = m_max;
    v_absmax[b] = v_max;
    for (std::int64_t i = begin; i < end; ++i) {
      const std::size_t j = static_cast<std::size_t>(i - begin);
      adam8bit_param(p[i], m[j], v[j], s);
      if (working != nullptr) working[i] = p[i];
      adam8bit_codes(table, m[j], v[j], m_max, v_max, m_codes[i], v_codes[i]);
    }
  });
}

void k_adamw8bit_update(const KernelCall& c) { update_blocks(c, updated_params(c), nullptr, 1, 1.0f); }

}  // namespace

void adamw8bit_update_mixed_f32(const KernelCall& c) {
  // updates[0] is the widened working copy, updates[1] the f32 master the update applies to.
  const std::int64_t offset = c.attrs->shard_count >= 0 ? c.attrs->shard_offset : 0;
  update_blocks(c, c.updates[1].f32(), c.updates[0].f32() + offset, 2, static_cast<float>(1.0 / c.loss_scale));
}

KernelEntries optimizer_8bit_kernel_entries() { return {{OpKind::adamw8bit_update, k_adamw8bit_update}}; }

}  // namespace memplan::kernels::cpu
