// The fused projection and cross-entropy (graph/fusions.h) on the CPU: logits computed a chunk
// of rows at a time in the op's scratch, never whole. Every GEMM call covers one block of
// graph::kLossRowBlock rows (aligned to row 0) and a fixed range of vocabulary or width columns,
// and the weight gradient adds the blocks in row order, so no bit depends on the chunk size or on
// the thread count.
#include <algorithm>
#include <cmath>

#include "memplan/common/check.h"
#include "memplan/graph/fusions.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/cpu/vector_math.h"
#include "memplan/kernels/shared/loss_chunks.h"

namespace memplan::kernels::cpu {
namespace {

using graph::kLossRowBlock;
using graph::OpKind;

constexpr std::int64_t kVocabRange = 2048;  // logits columns per GEMM call
constexpr std::int64_t kWidthRange = 256;   // dh columns per GEMM call

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }


// Rows [first, first + count) of h w^T into logits [count, V] (first a block start).
void chunk_logits(const float* h, const float* w, const LossChunks& s, std::int64_t first, std::int64_t count,
                  float* logits) {
  const std::int64_t blocks = ceil_div(count, kLossRowBlock), ranges = ceil_div(s.vocab, kVocabRange);
  parallel_for(blocks * ranges, 1, [&](std::int64_t begin, std::int64_t end, int) {
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t row = t / ranges * kLossRowBlock, v0 = t % ranges * kVocabRange;
      const std::int64_t q = std::min(kLossRowBlock, count - row), nv = std::min(kVocabRange, s.vocab - v0);
      float* out = logits + row * s.vocab + v0;
      for (std::int64_t r = 0; r < q; ++r) std::fill(out + r * s.vocab, out + r * s.vocab + nv, 0.0f);
      gemm_accumulate_strided(false, true, q, nv, s.width, h + (first + row) * s.width, s.width, w + v0 * s.width, s.width,
                              out, s.vocab);
    }
  });
}

// lse[n] = log sum_v exp(logit) in double, as softmax_cross_entropy sums it.
void k_linear_cross_entropy_lse(const KernelCall& c) {
  const LossChunks s = loss_chunks(c.inputs[0], c.inputs[1], *c.attrs);
  const float* h = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* lse = c.outputs[0].f32();
  float* logits = chunk_logits_scratch(c, s);
  for (std::int64_t first = 0; first < s.rows; first += s.chunk) {
    const std::int64_t count = std::min(s.chunk, s.rows - first);
    chunk_logits(h, w, s, first, count, logits);
    parallel_each(count, s.vocab, [=](std::int64_t i) {
      const float* row = logits + i * s.vocab;
      const float max = *std::max_element(row, row + s.vocab);
      double z = 0.0;
      for (std::int64_t v = 0; v < s.vocab; ++v) z += std::exp(double(row[v] - max));
      lse[first + i] = static_cast<float>(std::log(z) + double(max));
    });
  }
}

// The mean over rows of lse - the label's logit (a dot product of the row and the label's weight).
void k_linear_cross_entropy(const KernelCall& c) {
  const float* h = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  const std::int32_t* labels = c.inputs[2].i32();
  const float* lse = c.inputs[3].f32();
  const std::int64_t rows = (*c.inputs[0].shape)[0], width = (*c.inputs[0].shape)[1];
  double total = 0.0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* x = h + i * width;
    const float* wl = w + std::int64_t{labels[i]} * width;
    double dot = 0.0;
    for (std::int64_t k = 0; k < width; ++k) dot += double(x[k]) * double(wl[k]);
    total += double(lse[i]) - dot;
  }
  c.outputs[0].f32()[0] = static_cast<float>(total / double(rows));
}

// [dh; dw] with dlogits = (exp(logit - lse) - onehot) * dloss / N, chunk by chunk: dh's rows of a
// chunk are final once it is done, dw adds each block of rows in order.
void k_linear_cross_entropy_backward(const KernelCall& c) {
  const LossChunks s = loss_chunks(c.inputs[1], c.inputs[2], *c.attrs);
  const float scale = c.inputs[0].f32()[0] / static_cast<float>(s.rows);
  const float* h = c.inputs[1].f32();
  const float* w = c.inputs[2].f32();
  const std::int32_t* labels = c.inputs[3].i32();
  const float* lse = c.inputs[4].f32();
  float* dh = c.outputs[0].f32();
  float* dw = dh + s.rows * s.width;
  float* p = chunk_logits_scratch(c, s);
  std::fill(dw, dw + s.vocab * s.width, 0.0f);
  const std::int64_t vocab_ranges = ceil_div(s.vocab, kVocabRange), width_ranges = ceil_div(s.width, kWidthRange);
  for (std::int64_t first = 0; first < s.rows; first += s.chunk) {
    const std::int64_t count = std::min(s.chunk, s.rows - first), blocks = ceil_div(count, kLossRowBlock);
    chunk_logits(h, w, s, first, count, p);
    parallel_each(count, s.vocab, [=](std::int64_t i) {
      float* row = p + i * s.vocab;
      const float m = lse[first + i];
#pragma omp simd
      for (std::int64_t v = 0; v < s.vocab; ++v) row[v] = exp_approx(row[v] - m) * scale;
      row[labels[first + i]] -= scale;
    });
    // dh rows of this chunk: each block against a range of the width.
    parallel_for(blocks * width_ranges, 1, [&](std::int64_t begin, std::int64_t end, int) {
      for (std::int64_t t = begin; t < end; ++t) {
        const std::int64_t row = t / width_ranges * kLossRowBlock, c0 = t % width_ranges * kWidthRange;
        const std::int64_t q = std::min(kLossRowBlock, count - row), nc = std::min(kWidthRange, s.width - c0);
        float* out = dh + (first + row) * s.width + c0;
        for (std::int64_t r = 0; r < q; ++r) std::fill(out + r * s.width, out + r * s.width + nc, 0.0f);
        gemm_accumulate_strided(false, false, q, nc, s.vocab, p + row * s.vocab, s.vocab, w + c0, s.width, out, s.width);
      }
    });
    // dw: each range of the vocabulary adds this chunk's blocks in order.
    parallel_for(vocab_ranges, 1, [&](std::int64_t begin, std::int64_t end, int) {
      for (std::int64_t r = begin; r < end; ++r) {
        const std::int64_t v0 = r * kVocabRange, nv = std::min(kVocabRange, s.vocab - v0);
        for (std::int64_t row = 0; row < count; row += kLossRowBlock) {
          const std::int64_t q = std::min(kLossRowBlock, count - row);
          gemm_accumulate_strided(true, false, nv, s.width, q, p + row * s.vocab + v0, s.vocab, h + (first + row) * s.width,
                                  s.width, dw + v0 * s.width, s.width);
        }
      }
    });
  }
}

}  // namespace

KernelEntries fused_loss_kernel_entries() {
  return {{OpKind::linear_cross_entropy_lse, k_linear_cross_entropy_lse},
          {OpKind::linear_cross_entropy, k_linear_cross_entropy},
          {OpKind::linear_cross_entropy_backward, k_linear_cross_entropy_backward}};
}

}  // namespace memplan::kernels::cpu
