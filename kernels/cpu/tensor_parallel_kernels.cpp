// CPU kernels of the vocabulary-parallel cross-entropy (graph/tensor_parallel.h): each rank's
// statistics over the vocabulary columns it holds, the loss combined from every rank's (gathered
// by an all_gather op of the graph), and the gradient of this rank's logits. Reductions in
// double, as the whole-vocabulary loss's; every rank combines the gathered statistics in rank
// order, so every rank holds the same loss.
#include <algorithm>
#include <cmath>
#include <limits>

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

// The real columns of this rank's slice (the rest pad the vocabulary) and the label's column in
// it, or -1 when another rank holds the label.
std::int64_t label_column(const graph::OpAttrs& a, std::int32_t label) {
  const std::int64_t j = std::int64_t{label} - a.start;
  return j >= 0 && j < a.length ? j : -1;
}

void k_vocab_parallel_stats(const KernelCall& c) {
  const float* logits = c.inputs[0].f32();
  const std::int32_t* labels = c.inputs[1].i32();
  const std::int64_t rows = (*c.inputs[0].shape)[0], cols = (*c.inputs[0].shape)[1], real = c.attrs->length;
  float* stats = c.outputs[0].f32();
  parallel_each(rows, cols, [&](std::int64_t i) {
    const float* row = logits + i * cols;
    if (real == 0) {  // this rank holds only padding: it adds nothing to the sum of exponentials
      stats[2 * i] = -std::numeric_limits<float>::infinity();
      stats[2 * i + 1] = 0.0f;
      return;
    }
    const float max = *std::max_element(row, row + real);
    double z = 0.0;
    for (std::int64_t j = 0; j < real; ++j) z += std::exp(double(row[j] - max));
    stats[2 * i] = static_cast<float>(std::log(z) + double(max));
    const std::int64_t label = label_column(*c.attrs, labels[i]);
    stats[2 * i + 1] = label < 0 ? 0.0f : row[label];
  });
}

// log sum over ranks of exp(lse_r) for row i of the gathered [world, rows, 2] statistics.
double whole_lse(const float* gathered, std::int64_t world, std::int64_t rows, std::int64_t i) {
  double max = -std::numeric_limits<double>::infinity();
  for (std::int64_t r = 0; r < world; ++r) max = std::max(max, double(gathered[(r * rows + i) * 2]));
  double z = 0.0;
  for (std::int64_t r = 0; r < world; ++r) z += std::exp(double(gathered[(r * rows + i) * 2]) - max);
  return std::log(z) + max;
}

void k_vocab_parallel_loss(const KernelCall& c) {
  const float* gathered = c.inputs[0].f32();
  const std::int64_t world = (*c.inputs[0].shape)[0], rows = (*c.inputs[0].shape)[1];
  double total = 0.0;
  for (std::int64_t i = 0; i < rows; ++i) {
    double label_logit = 0.0;
    for (std::int64_t r = 0; r < world; ++r) label_logit += gathered[(r * rows + i) * 2 + 1];
    total += whole_lse(gathered, world, rows, i) - label_logit;
  }
  c.outputs[0].f32()[0] = static_cast<float>(total / double(rows));
}

// (softmax over the whole vocabulary - onehot) * dloss / rows on this rank's real columns, 0 on
// its padding. A call for a slice of rows starts at row KernelCall::first_row of the statistics.
void k_vocab_parallel_cross_entropy_backward(const KernelCall& c) {
  const float dloss = c.inputs[0].f32()[0];
  const float* logits = c.inputs[1].f32();
  const std::int32_t* labels = c.inputs[2].i32();
  const float* gathered = c.inputs[3].f32();
  const std::int64_t world = (*c.inputs[3].shape)[0], all_rows = (*c.inputs[3].shape)[1];
  const std::int64_t rows = (*c.inputs[1].shape)[0], cols = (*c.inputs[1].shape)[1], real = c.attrs->length;
  float* dlogits = c.outputs[0].f32();
  const float scale = dloss / static_cast<float>(all_rows);
  parallel_each(rows, cols, [&](std::int64_t i) {
    const float* row = logits + i * cols;
    float* out = dlogits + i * cols;
    const double lse = whole_lse(gathered, world, all_rows, c.first_row + i);
    for (std::int64_t j = 0; j < real; ++j) out[j] = static_cast<float>(std::exp(double(row[j]) - lse)) * scale;
    std::fill(out + real, out + cols, 0.0f);
    const std::int64_t label = label_column(*c.attrs, labels[i]);
    if (label >= 0) out[label] -= scale;
  });
}

}  // namespace

KernelEntries tensor_parallel_kernel_entries() {
  return {
      {OpKind::vocab_parallel_stats, k_vocab_parallel_stats},
      {OpKind::vocab_parallel_loss, k_vocab_parallel_loss},
      {OpKind::vocab_parallel_cross_entropy_backward, k_vocab_parallel_cross_entropy_backward},
  };
}

}  // namespace memplan::kernels::cpu
