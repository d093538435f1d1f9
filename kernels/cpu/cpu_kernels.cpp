#include "memplan/kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/cpu/vector_math.h"
#include "memplan/kernels/half.h"
#include "memplan/kernels/shared/optimizers.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;


template <typename F>
void for_each_index(std::int64_t n, F f) {
  parallel_each(n, 1, f);
}

void k_matmul(const KernelCall& c) {
  const graph::Shape& a = *c.inputs[0].shape;
  const graph::Shape& out = *c.outputs[0].shape;
  const std::int64_t k = c.attrs->trans_a ? a[0] : a[1];
  gemm(c.attrs->trans_a, c.attrs->trans_b, out[0], out[1], k, c.inputs[0].f32(), c.inputs[1].f32(),
       c.outputs[0].f32());
}

void k_bias_add(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  const float* b = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t cols = c.outputs[0].shape->cols();
  const std::int64_t rows = c.outputs[0].shape->rows();
  parallel_each(rows, cols, [=](std::int64_t r) {
    for (std::int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] + b[j];
  });
}

void k_add(const KernelCall& c) {
  const float* a = c.inputs[0].f32();
  const float* b = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = a[i] + b[i]; });
}

void k_mul(const KernelCall& c) {
  const float* a = c.inputs[0].f32();
  const float* b = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = a[i] * b[i]; });
}

void k_scale(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const float alpha = c.attrs->alpha;
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = alpha * x[i]; });
}

void k_relu(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; });
}

void k_relu_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* y = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  // dy is read whether or not it is kept: a select the compiler vectorises, not a branch that
  // mispredicts on every other element.
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  });
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// GELU and its gradient through the vectorisable erf and exp of vector_math.h (within 2.5 ulp
// of float64): an element's value does not depend on its position, so thread counts and
// vector widths leave the results alone.
void k_gelu(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_ranges(n, 1, [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      const float xi = x[i];
      y[i] = 0.5f * xi * (1.0f + erf_approx(xi * kInvSqrt2));
    }
  });
}

void k_gelu_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_ranges(n, 1, [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      const float xi = x[i];
      const float cdf = 0.5f * (1.0f + erf_approx(xi * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * exp_approx(-0.5f * xi * xi);
      dx[i] = dy[i] * madd(xi, pdf, cdf);
    }
  });
}

// Sigmoid through 1 / (1 + exp(-x)); its gradient and tanh's from the output y.
void k_sigmoid(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = 1.0f / (1.0f + std::exp(-x[i])); });
}

void k_sigmoid_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* y = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { dx[i] = dy[i] * (y[i] * (1.0f - y[i])); });
}

void k_tanh(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = std::tanh(x[i]); });
}

void k_tanh_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* y = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { dx[i] = dy[i] * (1.0f - y[i] * y[i]); });
}

void k_clip(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const float lo = c.attrs->clip_min, hi = c.attrs->clip_max;
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = std::min(std::max(x[i], lo), hi); });
}

void k_clip_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  const float lo = c.attrs->clip_min, hi = c.attrs->clip_max;
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) {
    const float g = dy[i];
    dx[i] = x[i] > lo && x[i] < hi ? g : 0.0f;
  });
}

void k_reshape(const KernelCall&) {}  // a view: the executor points it at its base's storage

// Sequential reductions in double: deterministic and accurate; these are never hot.
double sum_of(const float* x, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

void k_sum(const KernelCall& c) {
  c.outputs[0].f32()[0] = static_cast<float>(sum_of(c.inputs[0].f32(), c.inputs[0].numel()));
}

void k_mean(const KernelCall& c) {
  const std::int64_t n = c.inputs[0].numel();
  c.outputs[0].f32()[0] = static_cast<float>(sum_of(c.inputs[0].f32(), n) / double(n));
}

void k_broadcast_scalar(const KernelCall& c) {
  const float v = c.attrs->alpha * c.inputs[0].f32()[0];
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = v; });
}

void k_fill(const KernelCall& c) {
  const float v = c.attrs->loss_scaled ? static_cast<float>(double(c.attrs->alpha) * c.loss_scale) : c.attrs->alpha;
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), [=](std::int64_t i) { y[i] = v; });
}

void k_reduce_rows(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t cols = c.inputs[0].shape->cols();
  const std::int64_t rows = c.inputs[0].shape->rows();
  if (!c.accumulate) std::fill(y, y + cols, 0.0f);
  // Row by row keeps memory access contiguous; each column's sum order is fixed (row order).
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    for (std::int64_t j = 0; j < cols; ++j) y[j] += row[j];
  }
}

// The mean over rows of log(sum exp(x - max)) + max - x[label], in double; `at(v)` reads logit v
// as f32 (a 16-bit logit is widened as it is read: no copy of the logits is made).
template <typename Element, typename At>
void softmax_cross_entropy_mean(const KernelCall& c, At at) {
  const auto* logits = static_cast<const Element*>(c.inputs[0].data);
  const std::int32_t* labels = c.inputs[1].i32();
  const std::int64_t batch = (*c.inputs[0].shape)[0];
  const std::int64_t classes = (*c.inputs[0].shape)[1];
  double total = 0.0;
  for (std::int64_t i = 0; i < batch; ++i) {
    const Element* row = logits + i * classes;
    float max = at(row[0]);
    for (std::int64_t j = 1; j < classes; ++j) max = std::max(max, at(row[j]));
    double z = 0.0;
    for (std::int64_t j = 0; j < classes; ++j) z += std::exp(double(at(row[j]) - max));
    total += std::log(z) + double(max) - double(at(row[labels[i]]));
  }
  c.outputs[0].f32()[0] = static_cast<float>(total / double(batch));
}

void k_softmax_cross_entropy(const KernelCall& c) {
  softmax_cross_entropy_mean<float>(c, [](float v) { return v; });
}

void k_softmax_cross_entropy_16bit(const KernelCall& c) {
  if (c.inputs[0].dtype == graph::DType::bf16) {
    softmax_cross_entropy_mean<std::uint16_t>(c, [](std::uint16_t h) { return bf16_to_f32(h); });
  } else {
    softmax_cross_entropy_mean<std::uint16_t>(c, [](std::uint16_t h) { return f16_to_f32(h); });
  }
}

void k_softmax_cross_entropy_backward(const KernelCall& c) {
  const float dloss = c.inputs[0].f32()[0];
  const float* logits = c.inputs[1].f32();
  const std::int32_t* labels = c.inputs[2].i32();
  float* dlogits = c.outputs[0].f32();
  const std::int64_t batch = (*c.inputs[1].shape)[0];
  const std::int64_t classes = (*c.inputs[1].shape)[1];
  const float scale = dloss / static_cast<float>(batch);
  parallel_each(batch, classes, [=](std::int64_t i) {
    const float* row = logits + i * classes;
    float* out = dlogits + i * classes;
    const float max = *std::max_element(row, row + classes);
#pragma omp simd
    for (std::int64_t j = 0; j < classes; ++j) out[j] = exp_approx(row[j] - max);
    float z = 0.0f;
    for (std::int64_t j = 0; j < classes; ++j) z += out[j];
    const float inv = 1.0f / z;
    for (std::int64_t j = 0; j < classes; ++j) out[j] = out[j] * inv * scale;
    out[labels[i]] -= scale;
  });
}

// The optimizer updates: the per-element arithmetic of kernels/shared/optimizers.h (PyTorch's
// single-tensor implementations), which the CUDA kernels share.

void k_sgd_update(const KernelCall& c) {
  float* p = updated_params(c);
  const float* g = c.inputs[0].f32();
  const float lr = c.lr(), wd = c.attrs->weight_decay;
  for_each_index(updated_count(c), [=](std::int64_t i) { sgd_element(p[i], g[i], lr, wd); });
}

void k_sgd_momentum_update(const KernelCall& c) {
  float* p = updated_params(c);
  float* buf = c.updates[1].f32();
  const float* g = c.inputs[0].f32();
  const float lr = c.lr(), wd = c.attrs->weight_decay, mom = c.attrs->momentum;
  for_each_index(updated_count(c), [=](std::int64_t i) { sgd_momentum_element(p[i], buf[i], g[i], lr, wd, mom); });
}

void k_adamw_update(const KernelCall& c) {
  float* p = updated_params(c);
  float* m = c.updates[1].f32();
  float* v = c.updates[2].f32();
  const float* g = c.inputs[0].f32();
  const AdamWScalars s = adamw_scalars(*c.attrs, c.step, c.lr());
  for_each_index(updated_count(c), [=](std::int64_t i) { adamw_element(p[i], m[i], v[i], g[i], s); });
}

}  // namespace

KernelEntries loss_16bit_kernel_entries() {
  return {{OpKind::softmax_cross_entropy, k_softmax_cross_entropy_16bit, graph::DType::bf16},
          {OpKind::softmax_cross_entropy, k_softmax_cross_entropy_16bit, graph::DType::f16}};
}

KernelEntries kernel_entries() {
  KernelEntries entries = f32_kernel_entries();
  const auto widened = widened_kernel_entries();
  entries.insert(entries.end(), widened.begin(), widened.end());
  const auto native = native_16bit_kernel_entries();
  entries.insert(entries.end(), native.begin(), native.end());
  const auto exchange = collective_exchange_kernel_entries();
  entries.insert(entries.end(), exchange.begin(), exchange.end());
  return entries;
}

KernelEntries f32_kernel_entries() {
  KernelEntries entries = nn_kernel_entries();
  const auto llm = llm_kernel_entries();
  entries.insert(entries.end(), llm.begin(), llm.end());
  const auto attention = attention_kernel_entries();
  entries.insert(entries.end(), attention.begin(), attention.end());
  const auto decode = decode_kernel_entries();
  entries.insert(entries.end(), decode.begin(), decode.end());
  const auto collective = collective_kernel_entries();
  entries.insert(entries.end(), collective.begin(), collective.end());
  const auto moe = moe_kernel_entries();
  entries.insert(entries.end(), moe.begin(), moe.end());
  const auto tensor_parallel = tensor_parallel_kernel_entries();
  entries.insert(entries.end(), tensor_parallel.begin(), tensor_parallel.end());
  const auto fused_loss = fused_loss_kernel_entries();
  entries.insert(entries.end(), fused_loss.begin(), fused_loss.end());
  const auto quant = quant_kernel_entries();
  entries.insert(entries.end(), quant.begin(), quant.end());
  const auto adam8bit = optimizer_8bit_kernel_entries();
  entries.insert(entries.end(), adam8bit.begin(), adam8bit.end());
  entries.insert(entries.end(), {
      {OpKind::matmul, k_matmul},
      {OpKind::bias_add, k_bias_add},
      {OpKind::add, k_add},
      {OpKind::mul, k_mul},
      {OpKind::scale, k_scale},
      {OpKind::relu, k_relu},
      {OpKind::gelu, k_gelu},
      {OpKind::reshape, k_reshape},
      {OpKind::tp_copy, k_reshape},  // a view too
      {OpKind::sum, k_sum},
      {OpKind::mean, k_mean},
      {OpKind::softmax_cross_entropy, k_softmax_cross_entropy},
      {OpKind::relu_backward, k_relu_backward},
      {OpKind::gelu_backward, k_gelu_backward},
      {OpKind::sigmoid, k_sigmoid},
      {OpKind::sigmoid_backward, k_sigmoid_backward},
      {OpKind::tanh, k_tanh},
      {OpKind::tanh_backward, k_tanh_backward},
      {OpKind::clip, k_clip},
      {OpKind::clip_backward, k_clip_backward},
      {OpKind::broadcast_scalar, k_broadcast_scalar},
      {OpKind::reduce_rows, k_reduce_rows},
      {OpKind::softmax_cross_entropy_backward, k_softmax_cross_entropy_backward},
      {OpKind::fill, k_fill},
      {OpKind::sgd_update, k_sgd_update},
      {OpKind::sgd_momentum_update, k_sgd_momentum_update},
      {OpKind::adamw_update, k_adamw_update},
  });
  return entries;
}

}  // namespace memplan::kernels::cpu
