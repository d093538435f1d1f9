// CPU kernels of the mixture-of-experts ops (graph/op.h: moe_*). A token's slot in expert e is
// the number of earlier tokens routed to e (gates != 0), so each kernel walks the tokens in order
// per expert; loops split over experts or over channels, never over the tokens of one expert, and
// every sum runs in a fixed order: the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "memplan/common/check.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

// gates [N, E]
struct Routing {
  std::int64_t tokens, experts;
};
Routing routing_of(const TensorRef& gates) { return {(*gates.shape)[0], (*gates.shape)[1]}; }

// The routing rule every kernel here follows: expert e keeps the tokens routed to it (gate != 0)
// in token order, the first `capacity` of them; f(n, slot, gate) for each kept token. Returns the
// slots filled.
template <typename F>
std::int64_t for_each_kept(const float* gates, const Routing& r, std::int64_t e, std::int64_t capacity, F&& f) {
  std::int64_t used = 0;
  for (std::int64_t n = 0; n < r.tokens && used < capacity; ++n) {
    const float g = gates[n * r.experts + e];
    if (g != 0.0f) f(n, used++, g);
  }
  return used;
}

// The k largest of row[0, E) (ties: the lower index) as a bit per expert in `chosen`.
void choose_top_k(const float* row, std::int64_t experts, std::int64_t k, bool* chosen) {
  std::fill(chosen, chosen + experts, false);
  for (std::int64_t pick = 0; pick < k; ++pick) {
    std::int64_t best = -1;
    for (std::int64_t e = 0; e < experts; ++e) {
      if (!chosen[e] && (best < 0 || row[e] > row[best])) best = e;
    }
    chosen[best] = true;
  }
}

// The selection's flags live on the stack (the shape rule allows no more experts).
constexpr std::int64_t kMaxExperts = graph::kMaxExperts;

// The values a row's experts are chosen by: the probabilities, plus the choice bias when given;
// with groups, experts outside the row's top_groups best groups are set to -inf (never chosen:
// the shape rule keeps top_k within the groups left).
void choice_values(const float* p, const float* bias, std::int64_t experts, const graph::OpAttrs& a, float* out) {
  for (std::int64_t e = 0; e < experts; ++e) out[e] = bias != nullptr ? p[e] + bias[e] : p[e];
  const std::int64_t G = a.expert_groups;
  if (G <= 1) return;
  const std::int64_t per = experts / G;
  float score[kMaxExperts];
  for (std::int64_t g = 0; g < G; ++g) {
    float first = -INFINITY, second = -INFINITY;
    for (std::int64_t e = g * per; e < (g + 1) * per; ++e) {
      if (out[e] > first) {
        second = first;
        first = out[e];
      } else if (out[e] > second) {
        second = out[e];
      }
    }
    score[g] = a.group_top2 && per > 1 ? first + second : first;
  }
  bool kept[kMaxExperts];
  choose_top_k(score, G, a.top_groups, kept);
  for (std::int64_t g = 0; g < G; ++g) {
    if (kept[g]) continue;
    for (std::int64_t e = g * per; e < (g + 1) * per; ++e) out[e] = -INFINITY;
  }
}

void k_moe_top_k(const KernelCall& c) {
  const Routing r = routing_of(c.inputs[0]);
  MEMPLAN_CHECK(r.experts <= kMaxExperts, "moe_top_k: at most 4096 experts");
  const float* probs = c.inputs[0].f32();
  const float* bias = c.inputs.size() > 1 ? c.inputs[1].f32() : nullptr;
  float* gates = c.outputs[0].f32();
  const std::int64_t k = c.attrs->top_k;
  const bool normalize = c.attrs->normalize;
  const bool plain = bias == nullptr && c.attrs->expert_groups <= 1;
  parallel_each(r.tokens, r.experts * k, [&](std::int64_t n) {
    bool chosen[kMaxExperts];
    const float* p = probs + n * r.experts;
    float* g = gates + n * r.experts;
    if (plain) {
      choose_top_k(p, r.experts, k, chosen);
    } else {
      float values[kMaxExperts];
      choice_values(p, bias, r.experts, *c.attrs, values);
      choose_top_k(values, r.experts, k, chosen);
    }
    double sum = 0.0;
    for (std::int64_t e = 0; e < r.experts; ++e) sum += chosen[e] ? double(p[e]) : 0.0;
    for (std::int64_t e = 0; e < r.experts; ++e) {
      g[e] = !chosen[e] ? 0.0f : normalize ? static_cast<float>(double(p[e]) / sum) : p[e];
    }
  });
}

// Without normalisation the gates are the chosen probabilities: dp = dg there. With it,
// g_j = p_j / S (S the chosen probabilities' sum): dp_j = (dg_j - sum_i dg_i g_i) / S.
void k_moe_top_k_backward(const KernelCall& c) {
  const Routing r = routing_of(c.inputs[1]);
  const float* dgates = c.inputs[0].f32();
  const float* gates = c.inputs[1].f32();
  const float* probs = c.inputs[2].f32();
  float* dprobs = c.outputs[0].f32();
  const bool normalize = c.attrs->normalize;
  parallel_each(r.tokens, r.experts, [&](std::int64_t n) {
    const std::int64_t row = n * r.experts;
    double sum = 0.0, dot = 0.0;
    for (std::int64_t e = row; e < row + r.experts; ++e) {
      if (gates[e] == 0.0f) continue;
      sum += double(probs[e]);
      dot += double(dgates[e]) * double(gates[e]);
    }
    for (std::int64_t e = row; e < row + r.experts; ++e) {
      if (gates[e] == 0.0f) {
        dprobs[e] = 0.0f;
      } else {
        dprobs[e] = normalize ? static_cast<float>((double(dgates[e]) - dot) / sum) : dgates[e];
      }
    }
  });
}

void k_moe_dispatch(const KernelCall& c) {
  const Routing r = routing_of(c.inputs[1]);
  const float* x = c.inputs[0].f32();
  const float* gates = c.inputs[1].f32();
  float* xe = c.outputs[0].f32();
  const std::int64_t capacity = c.attrs->capacity, C = (*c.inputs[0].shape)[1];
  const bool weighted = c.attrs->weighted;
  parallel_each(r.experts, capacity * C, [&](std::int64_t e) {
    float* slots = xe + e * capacity * C;
    const std::int64_t used = for_each_kept(gates, r, e, capacity, [&](std::int64_t n, std::int64_t slot, float g) {
      float* dst = slots + slot * C;
      const float* src = x + n * C;
      if (weighted) {
        for (std::int64_t i = 0; i < C; ++i) dst[i] = g * src[i];
      } else {
        std::memcpy(dst, src, static_cast<std::size_t>(C) * sizeof(float));
      }
    });
    std::memset(slots + used * C, 0, static_cast<std::size_t>((capacity - used) * C) * sizeof(float));
  });
}

// Split over channel blocks: every block walks all experts in ascending order, so each output
// element sums its experts in that order whichever thread runs the block.
void k_moe_combine(const KernelCall& c) {
  const Routing r = routing_of(c.inputs[1]);
  const float* ye = c.inputs[0].f32();
  const float* gates = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t capacity = (*c.inputs[0].shape)[1], C = (*c.inputs[0].shape)[2];
  const bool weighted = c.attrs->weighted;
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (C + kBlock - 1) / kBlock;
  parallel_each(blocks, r.tokens * std::min(C, kBlock), [&](std::int64_t block) {
    const std::int64_t lo = block * kBlock, hi = std::min(C, lo + kBlock);
    for (std::int64_t n = 0; n < r.tokens; ++n) std::fill(y + n * C + lo, y + n * C + hi, 0.0f);
    for (std::int64_t e = 0; e < r.experts; ++e) {
      for_each_kept(gates, r, e, capacity, [&](std::int64_t n, std::int64_t slot, float g) {
        const float w = weighted ? g : 1.0f;
        const float* src = ye + (e * capacity + slot) * C;
        float* dst = y + n * C;
        for (std::int64_t i = lo; i < hi; ++i) dst[i] += w * src[i];
      });
    }
  });
}

void k_moe_combine_backward_gates(const KernelCall& c) {
  const Routing r = routing_of(c.inputs[2]);
  const float* dy = c.inputs[0].f32();
  const float* ye = c.inputs[1].f32();
  const float* gates = c.inputs[2].f32();
  float* dgates = c.outputs[0].f32();
  const std::int64_t capacity = (*c.inputs[1].shape)[1], C = (*c.inputs[1].shape)[2];
  parallel_each(r.experts, r.tokens * C, [&](std::int64_t e) {
    // Not routed, or dropped: the gate weighted nothing.
    for (std::int64_t n = 0; n < r.tokens; ++n) dgates[n * r.experts + e] = 0.0f;
    for_each_kept(gates, r, e, capacity, [&](std::int64_t n, std::int64_t slot, float) {
      const float* row = ye + (e * capacity + slot) * C;
      double dot = 0.0;
      for (std::int64_t i = 0; i < C; ++i) dot += double(dy[n * C + i]) * double(row[i]);
      dgates[n * r.experts + e] = static_cast<float>(dot);
    });
  });
}

void k_moe_router_stats(const KernelCall& c) {
  const Routing r = routing_of(c.inputs[1]);
  const float* probs = c.inputs[0].f32();
  const float* gates = c.inputs[1].f32();
  float* stats = c.outputs[0].f32();
  parallel_each(r.experts, r.tokens, [&](std::int64_t e) {
    std::int64_t routed = 0;
    double sum = 0.0;
    for (std::int64_t n = 0; n < r.tokens; ++n) {
      routed += gates[n * r.experts + e] != 0.0f ? 1 : 0;
      sum += double(probs[n * r.experts + e]);
    }
    stats[e] = static_cast<float>(routed);
    stats[r.experts + e] = static_cast<float>(sum);
  });
}

void k_moe_router_stats_backward(const KernelCall& c) {
  const float* dstats = c.inputs[0].f32();
  float* dprobs = c.outputs[0].f32();
  const std::int64_t N = (*c.outputs[0].shape)[0], E = (*c.outputs[0].shape)[1];
  parallel_each(N, E, [&](std::int64_t n) { std::memcpy(dprobs + n * E, dstats + E, static_cast<std::size_t>(E) * sizeof(float)); });
}

}  // namespace

KernelEntries moe_kernel_entries() {
  return {
      {OpKind::moe_top_k, k_moe_top_k},
      {OpKind::moe_top_k_backward, k_moe_top_k_backward},
      {OpKind::moe_dispatch, k_moe_dispatch},
      {OpKind::moe_combine, k_moe_combine},
      {OpKind::moe_combine_backward_gates, k_moe_combine_backward_gates},
      {OpKind::moe_router_stats, k_moe_router_stats},
      {OpKind::moe_router_stats_backward, k_moe_router_stats_backward},
  };
}

}  // namespace memplan::kernels::cpu
