// CPU kernels of fused attention (FlashAttention's algorithm): scores and probabilities exist only
// as one [query tile, key tile] block on the stack of the thread that owns a (batch, head), never
// as a [T, T] tensor. The forward keeps each row's log-sum-exp; the backward recomputes the
// probabilities from it tile by tile. Every output element is written by one thread in a fixed
// order, so results do not depend on the thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/shared/attention_mask.h"
#include "memplan/kernels/shared/dropout.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

// Rows and columns of one score tile: 128 x 128 floats (64 KiB; three on a thread's stack) keeps the
// scores of one thread in L2, and GEMMs of this size run near Eigen's peak on the CPU.
constexpr std::int64_t kTile = 128;

struct AttentionDims {
  std::int64_t batch, heads, kv_heads, t, d, group;  // group = heads / kv_heads query heads per K/V head
};

AttentionDims dims_of(const graph::Shape& q, const graph::Shape& k) {
  return {q[0], q[1], k[1], q[2], q[3], q[1] / k[1]};
}

// exp(x) for a row of x <= 0 (scores minus their row's max or log-sum-exp), branch-free so the
// compiler vectorises it: 2^(x log2 e) as 2^n (the exponent bits) times a degree-6 polynomial for
// 2^f, |f| <= 1/2 (relative error below 2e-7); n is rounded with the 1.5 * 2^23 trick. Inputs
// below -86.6 give 2^-125 (no denormals); NaN stays NaN.
// (kernels/CMakeLists.txt compiles this file with -fno-trapping-math: otherwise GCC keeps the
// selects as branches and the loop scalar.)
void exp_row(float* x, std::int64_t n) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = v * 1.44269504088896341f;
    const float y = t > -125.0f ? (t < 0.0f ? t : 0.0f) : -125.0f;  // value selects: no branch
    const float r = (y + kRound) - kRound;
    const float f = y - r;
    float p = 1.5403530393381606e-4f;
    p = p * f + 1.3333558146428443e-3f;
    p = p * f + 9.6181291076284772e-3f;
    p = p * f + 5.5504108664821580e-2f;
    p = p * f + 2.4022650695910071e-1f;
    p = p * f + 6.9314718055994531e-1f;
    p = p * f + 1.0f;
    const float scale = std::bit_cast<float>((static_cast<std::int32_t>(r) + 127) << 23);
    x[i] = p * scale + (v - v);  // v - v: 0, or NaN for NaN
  }
}

// The largest of n floats and the sum of n floats, as vector reductions: lanes in a fixed order
// fixed at compile time, so the result does not depend on the thread count (a scalar loop here
// ran one dependent add or compare per column and cost as much as the tile's GEMM).
float row_max(const float* x, std::int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (std::int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float row_sum(const float* x, std::int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t i = 0; i < n; ++i) sum += x[i];
  return sum;
}

// The causal mask and its window (graph::OpAttrs::causal, window) over t keys.
struct Mask {
  bool causal;
  std::int64_t window;
  std::int64_t t;
};
Mask mask_of(const graph::OpAttrs& a, const AttentionDims& d) { return {a.causal, a.window, d.t}; }

// Columns [first, end) of row r of a tile at (i0, j0) the mask lets through (visible_keys).
KeyRange visible(const Mask& mask, std::int64_t i0, std::int64_t r, std::int64_t j0, std::int64_t cols) {
  const KeyRange keys = visible_keys(i0 + r, mask.t, mask.causal, mask.window);
  return {std::clamp<std::int64_t>(keys.first - j0, 0, cols), std::clamp<std::int64_t>(keys.end - j0, 0, cols)};
}

// How raw dot products become scores: times alpha, then soft-capped to cap * tanh(s / cap) when
// cap > 0 (Gemma-2).
struct Scoring {
  float alpha, cap;
};
Scoring scoring_of(const graph::OpAttrs& a) { return {a.alpha, a.softcap}; }

// s[r][c] (row stride kTile) = the score of q_(i0+r) . k_(j0+c), or -inf where the mask hides it.
void score_tile(const float* q, const float* k, const AttentionDims& d, std::int64_t i0, std::int64_t rows,
                std::int64_t j0, std::int64_t cols, Scoring scoring, const Mask& mask, float* s) {
  const float alpha = scoring.alpha;
  for (std::int64_t r = 0; r < rows; ++r) std::fill(s + r * kTile, s + r * kTile + cols, 0.0f);
  gemm_accumulate_strided(false, true, rows, cols, d.d, q + i0 * d.d, d.d, k + j0 * d.d, d.d, s, kTile);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (std::int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kTile;
    const KeyRange seen = visible(mask, i0, r, j0, cols);
    for (std::int64_t c = seen.first; c < seen.end; ++c) sr[c] *= alpha;
    if (scoring.cap > 0.0f) {
      for (std::int64_t c = seen.first; c < seen.end; ++c) sr[c] = scoring.cap * std::tanh(sr[c] / scoring.cap);
    }
    std::fill(sr, sr + seen.first, kMasked);
    std::fill(sr + seen.end, sr + cols, kMasked);
  }
}

// Key tiles [begin, end) a query tile [i0, i0 + rows) sees: all, or under a causal mask those
// starting at or before its last row and, with a window, ending after its first row's window starts.
std::int64_t key_begin(const Mask& mask, std::int64_t i0) {
  return (visible_keys(i0, mask.t, mask.causal, mask.window).first / kTile) * kTile;
}
std::int64_t key_end(const Mask& mask, std::int64_t i0, std::int64_t rows) {
  return mask.causal ? std::min(mask.t, i0 + rows) : mask.t;
}

// p[r][c] = exp(s[r][c] - lse_r): the probabilities of a tile, masked ones 0.
void probabilities(float* s, const float* lse, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols,
                   const Mask& mask) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kTile;
    const KeyRange seen = visible(mask, i0, r, j0, cols);
    for (std::int64_t c = seen.first; c < seen.end; ++c) sr[c] -= lse[r];
    exp_row(sr + seen.first, seen.end - seen.first);
    std::fill(sr, sr + seen.first, 0.0f);
    std::fill(sr + seen.end, sr + cols, 0.0f);
  }
}

// pd = p * mask, with the mask dropout_mask would draw at [bh, i, j] of the [B, H, T, T] probabilities.
void apply_dropout(const float* p, float* pd, std::uint64_t stream, float drop, std::int64_t bh,
                   const AttentionDims& d, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) {
  const float keep = dropout_keep_scale(drop);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t base = (bh * d.t + i0 + r) * d.t + j0;
    for (std::int64_t c = 0; c < cols; ++c) {
      pd[r * kTile + c] = p[r * kTile + c] * dropout_mask_element(stream, base + c, drop, keep);
    }
  }
}

void k_attention_lse(const KernelCall& c) {
  const AttentionDims d = dims_of(*c.inputs[0].shape, *c.inputs[1].shape);
  const float* q = c.inputs[0].f32();
  const float* k = c.inputs[1].f32();
  float* lse = c.outputs[0].f32();
  const Scoring scoring = scoring_of(*c.attrs);
  const Mask mask = mask_of(*c.attrs, d);
  parallel_each(d.batch * d.heads, kChunkElements, [&](std::int64_t bh) {
    const std::int64_t b = bh / d.heads, kvh = (bh % d.heads) / d.group;
    const float* qh = q + bh * d.t * d.d;
    const float* kh = k + (b * d.kv_heads + kvh) * d.t * d.d;
    alignas(64) float s[kTile * kTile];
    float m[kTile], l[kTile];
    for (std::int64_t i0 = 0; i0 < d.t; i0 += kTile) {
      const std::int64_t rows = std::min(kTile, d.t - i0);
      std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
      std::fill(l, l + rows, 0.0f);
      // Online softmax: a running max and the sum of exp(s - max), rescaled when the max grows.
      for (std::int64_t j0 = key_begin(mask, i0); j0 < key_end(mask, i0, rows); j0 += kTile) {
        const std::int64_t cols = std::min(kTile, d.t - j0);
        score_tile(qh, kh, d, i0, rows, j0, cols, scoring, mask, s);
        for (std::int64_t r = 0; r < rows; ++r) {
          float* sr = s + r * kTile;
          const float tile_max = row_max(sr, cols);
          const float new_max = std::max(m[r], tile_max);
          if (new_max == -std::numeric_limits<float>::infinity()) continue;  // every column masked so far
          const KeyRange seen = visible(mask, i0, r, j0, cols);
          for (std::int64_t col = seen.first; col < seen.end; ++col) sr[col] -= new_max;
          exp_row(sr + seen.first, seen.end - seen.first);
          l[r] = l[r] * std::exp(m[r] - new_max) + row_sum(sr + seen.first, seen.end - seen.first);
          m[r] = new_max;
        }
      }
      for (std::int64_t r = 0; r < rows; ++r) lse[bh * d.t + i0 + r] = m[r] + std::log(l[r]);
    }
  });
}

void k_attention(const KernelCall& c) {
  const AttentionDims d = dims_of(*c.inputs[0].shape, *c.inputs[1].shape);
  const float* q = c.inputs[0].f32();
  const float* k = c.inputs[1].f32();
  const float* v = c.inputs[2].f32();
  const float* lse = c.inputs[3].f32();
  float* y = c.outputs[0].f32();
  const Scoring scoring = scoring_of(*c.attrs);
  const float drop = c.attrs->dropout;
  const Mask mask = mask_of(*c.attrs, d);
  const std::uint64_t stream = dropout_stream(c.attrs->seed, c.step);
  parallel_each(d.batch * d.heads, kChunkElements, [&](std::int64_t bh) {
    const std::int64_t b = bh / d.heads, kvh = (bh % d.heads) / d.group;
    const float* qh = q + bh * d.t * d.d;
    const float* kh = k + (b * d.kv_heads + kvh) * d.t * d.d;
    const float* vh = v + (b * d.kv_heads + kvh) * d.t * d.d;
    float* yh = y + bh * d.t * d.d;
    std::fill(yh, yh + d.t * d.d, 0.0f);
    alignas(64) float s[kTile * kTile];
    for (std::int64_t i0 = 0; i0 < d.t; i0 += kTile) {
      const std::int64_t rows = std::min(kTile, d.t - i0);
      for (std::int64_t j0 = key_begin(mask, i0); j0 < key_end(mask, i0, rows); j0 += kTile) {
        const std::int64_t cols = std::min(kTile, d.t - j0);
        score_tile(qh, kh, d, i0, rows, j0, cols, scoring, mask, s);
        probabilities(s, lse + bh * d.t + i0, i0, rows, j0, cols, mask);
        if (drop > 0.0f) apply_dropout(s, s, stream, drop, bh, d, i0, rows, j0, cols);
        gemm_accumulate_strided(false, false, rows, d.d, cols, s, kTile, vh + j0 * d.d, d.d, yh + i0 * d.d, d.d);
      }
    }
  });
}

void k_attention_backward_dot(const KernelCall& c) {
  const std::int64_t rows = c.inputs[0].shape->rows(), cols = c.inputs[0].shape->cols();
  const float* dy = c.inputs[0].f32();
  const float* y = c.inputs[1].f32();
  float* delta = c.outputs[0].f32();
  parallel_each(rows, cols, [&](std::int64_t r) {
    double dot = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) dot += double(dy[r * cols + j]) * double(y[r * cols + j]);
    delta[r] = float(dot);
  });
}

// One thread owns a (batch, K/V head): dk and dv of that head and dq of its query heads, so
// nothing is shared between threads and the sums run in one fixed order.
void k_attention_backward(const KernelCall& c) {
  const AttentionDims d = dims_of(*c.inputs[1].shape, *c.inputs[2].shape);
  const float* dy = c.inputs[0].f32();
  const float* q = c.inputs[1].f32();
  const float* k = c.inputs[2].f32();
  const float* v = c.inputs[3].f32();
  const float* lse = c.inputs[4].f32();
  const float* delta = c.inputs[5].f32();
  float* out = c.outputs[0].f32();  // [B, H + 2KH, T, D]: dq heads, then dk, then dv
  const Scoring scoring = scoring_of(*c.attrs);
  const float alpha = scoring.alpha, cap = scoring.cap, drop = c.attrs->dropout;
  const Mask mask = mask_of(*c.attrs, d);
  const std::uint64_t stream = dropout_stream(c.attrs->seed, c.step);
  const std::int64_t head_size = d.t * d.d, out_heads = d.heads + 2 * d.kv_heads;
  parallel_each(d.batch * d.kv_heads, kChunkElements, [&](std::int64_t bk) {
    const std::int64_t b = bk / d.kv_heads, kvh = bk % d.kv_heads;
    const float* kh = k + bk * head_size;
    const float* vh = v + bk * head_size;
    float* dk = out + (b * out_heads + d.heads + kvh) * head_size;
    float* dv = out + (b * out_heads + d.heads + d.kv_heads + kvh) * head_size;
    std::fill(dk, dk + head_size, 0.0f);
    std::fill(dv, dv + head_size, 0.0f);
    alignas(64) float p[kTile * kTile];
    alignas(64) float pd[kTile * kTile];
    alignas(64) float ds[kTile * kTile];
    alignas(64) float slope[kTile * kTile];  // d score / d (alpha q.k) under soft-capping: 1 - (s / cap)^2
    for (std::int64_t g = 0; g < d.group; ++g) {
      const std::int64_t h = kvh * d.group + g, bh = b * d.heads + h;
      const float* qh = q + bh * head_size;
      const float* dyh = dy + bh * head_size;
      float* dq = out + (b * out_heads + h) * head_size;
      std::fill(dq, dq + head_size, 0.0f);
      for (std::int64_t i0 = 0; i0 < d.t; i0 += kTile) {
        const std::int64_t rows = std::min(kTile, d.t - i0);
        const float* lse_i = lse + bh * d.t + i0;
        const float* delta_i = delta + bh * d.t + i0;
        for (std::int64_t j0 = key_begin(mask, i0); j0 < key_end(mask, i0, rows); j0 += kTile) {
          const std::int64_t cols = std::min(kTile, d.t - j0);
          score_tile(qh, kh, d, i0, rows, j0, cols, scoring, mask, p);
          if (cap > 0.0f) {
            for (std::int64_t r = 0; r < rows; ++r) {
              for (std::int64_t col = 0; col < cols; ++col) {
                const float t = p[r * kTile + col] / cap;  // tanh of the capped score; -inf where masked
                slope[r * kTile + col] = std::isfinite(t) ? 1.0f - t * t : 0.0f;
              }
            }
          }
          probabilities(p, lse_i, i0, rows, j0, cols, mask);
          const float* kept = p;  // the probabilities after dropout: what multiplied v
          if (drop > 0.0f) {
            apply_dropout(p, pd, stream, drop, bh, d, i0, rows, j0, cols);
            kept = pd;
          }
          // dv_j += kept^T dy_i
          gemm_accumulate_strided(true, false, cols, d.d, rows, kept, kTile, dyh + i0 * d.d, d.d, dv + j0 * d.d, d.d);
          // dkept = dy_i v_j^T. Through the mask m and the softmax, with p * m = kept:
          // ds = alpha * p * (dkept * m - delta_i) = alpha * (kept * dkept - p * delta_i).
          for (std::int64_t r = 0; r < rows; ++r) std::fill(ds + r * kTile, ds + r * kTile + cols, 0.0f);
          gemm_accumulate_strided(false, true, rows, cols, d.d, dyh + i0 * d.d, d.d, vh + j0 * d.d, d.d, ds, kTile);
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t col = 0; col < cols; ++col) {
              const std::int64_t e = r * kTile + col;
              ds[e] = alpha * (kept[e] * ds[e] - p[e] * delta_i[r]);
              if (cap > 0.0f) ds[e] *= slope[e];
            }
          }
          // dq_i += ds k_j;  dk_j += ds^T q_i
          gemm_accumulate_strided(false, false, rows, d.d, cols, ds, kTile, kh + j0 * d.d, d.d, dq + i0 * d.d, d.d);
          gemm_accumulate_strided(true, false, cols, d.d, rows, ds, kTile, qh + i0 * d.d, d.d, dk + j0 * d.d, d.d);
        }
      }
    }
  });
}

}  // namespace

KernelEntries attention_kernel_entries() {
  return {
      {OpKind::attention_lse, k_attention_lse},
      {OpKind::attention, k_attention},
      {OpKind::attention_backward_dot, k_attention_backward_dot},
      {OpKind::attention_backward, k_attention_backward},
  };
}

}  // namespace memplan::kernels::cpu
