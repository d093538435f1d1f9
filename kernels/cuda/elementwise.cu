// Elementwise CUDA kernels: arithmetic, activations, fills, dropout masks and the optimizer
// updates. One thread per element (grid-stride), so every element is written exactly once and
// the arithmetic order per element is the CPU kernel's.
#include <cmath>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

void k_bias_add(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  const float* b = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t cols = c.outputs[0].shape->cols();
  for_each_index(c.outputs[0].numel(), "bias_add", [=] __device__(std::int64_t i) { y[i] = x[i] + b[i % cols]; });
}

void k_add(const KernelCall& c) {
  const float* a = c.inputs[0].f32();
  const float* b = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "add", [=] __device__(std::int64_t i) { y[i] = a[i] + b[i]; });
}

void k_mul(const KernelCall& c) {
  const float* a = c.inputs[0].f32();
  const float* b = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "mul", [=] __device__(std::int64_t i) { y[i] = a[i] * b[i]; });
}

void k_scale(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const float alpha = c.attrs->alpha;
  for_each_index(c.outputs[0].numel(), "scale", [=] __device__(std::int64_t i) { y[i] = alpha * x[i]; });
}

void k_relu(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "relu", [=] __device__(std::int64_t i) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; });
}

void k_relu_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* y = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "relu_backward",
                 [=] __device__(std::int64_t i) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; });
}

void k_gelu(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "gelu",
                 [=] __device__(std::int64_t i) { y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * kInvSqrt2)); });
}

void k_gelu_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "gelu_backward", [=] __device__(std::int64_t i) {
    const float cdf = 0.5f * (1.0f + erff(x[i] * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  });
}

void k_reshape(const KernelCall&) {}  // a view: the executor points it at its base's storage

void k_broadcast_scalar(const KernelCall& c) {
  const float* g = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const float alpha = c.attrs->alpha;
  for_each_index(c.outputs[0].numel(), "broadcast_scalar", [=] __device__(std::int64_t i) { y[i] = alpha * g[0]; });
}

void k_fill(const KernelCall& c) {
  float* y = c.outputs[0].f32();
  const float v = c.attrs->alpha;
  for_each_index(c.outputs[0].numel(), "fill", [=] __device__(std::int64_t i) { y[i] = v; });
}

// The CPU's counter-based stream (SplitMix64 finaliser): element i's draw depends only on
// (seed, step, i), so CPU and CUDA masks are identical.
__host__ __device__ inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void k_dropout_mask(const KernelCall& c) {
  const float p = c.attrs->dropout;
  const float keep = 1.0f / (1.0f - p);
  const std::uint64_t stream_id = mix(c.attrs->seed ^ mix(static_cast<std::uint64_t>(c.step)));
  float* mask = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "dropout_mask", [=] __device__(std::int64_t i) {
    const float u = float(mix(stream_id + static_cast<std::uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    mask[i] = u < p ? 0.0f : keep;
  });
}

// PyTorch's running statistics: new = (1 - m) * old + m * batch, with the unbiased variance.
void k_running_stats_update(const KernelCall& c) {
  const std::int64_t channels = (*c.inputs[0].shape)[1];
  const float* stats = c.inputs[0].f32();
  float* mean = c.updates[0].f32();
  float* var = c.updates[1].f32();
  const float m = c.attrs->momentum, unbias = c.attrs->alpha;
  for_each_index(channels, "running_stats_update", [=] __device__(std::int64_t ch) {
    mean[ch] = (1.0f - m) * mean[ch] + m * stats[ch];
    var[ch] = (1.0f - m) * var[ch] + m * (stats[channels + ch] * unbias);
  });
}

// Optimizers: the CPU kernels' formulas and order (PyTorch's single-tensor implementations).
void k_sgd_update(const KernelCall& c) {
  float* p = c.updates[0].f32();
  const float* g = c.inputs[0].f32();
  const float lr = c.attrs->lr, wd = c.attrs->weight_decay;
  for_each_index(c.updates[0].numel(), "sgd_update", [=] __device__(std::int64_t i) { p[i] -= lr * (g[i] + wd * p[i]); });
}

void k_sgd_momentum_update(const KernelCall& c) {
  float* p = c.updates[0].f32();
  float* buf = c.updates[1].f32();
  const float* g = c.inputs[0].f32();
  const float lr = c.attrs->lr, wd = c.attrs->weight_decay, mom = c.attrs->momentum;
  for_each_index(c.updates[0].numel(), "sgd_momentum_update", [=] __device__(std::int64_t i) {
    const float gi = g[i] + wd * p[i];
    buf[i] = mom * buf[i] + gi;
    p[i] -= lr * buf[i];
  });
}

void k_adamw_update(const KernelCall& c) {
  float* p = c.updates[0].f32();
  float* m = c.updates[1].f32();
  float* v = c.updates[2].f32();
  const float* g = c.inputs[0].f32();
  const graph::OpAttrs& a = *c.attrs;
  const float b1 = a.beta1, b2 = a.beta2, eps = a.eps;
  const float decay = 1.0f - a.lr * a.weight_decay;
  // Bias corrections on the host in double, exactly as the CPU kernel computes them.
  const double t = static_cast<double>(c.step);
  const float bc1 = static_cast<float>(1.0 - std::pow(double(b1), t));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double(b2), t)));
  const float step_size = a.lr / bc1;
  for_each_index(c.updates[0].numel(), "adamw_update", [=] __device__(std::int64_t i) {
    const float gi = g[i];
    float pi = p[i] * decay;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi -= step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  });
}

}  // namespace

KernelEntries elementwise_kernel_entries() {
  return {
      {OpKind::bias_add, k_bias_add},
      {OpKind::add, k_add},
      {OpKind::mul, k_mul},
      {OpKind::scale, k_scale},
      {OpKind::relu, k_relu},
      {OpKind::gelu, k_gelu},
      {OpKind::reshape, k_reshape},
      {OpKind::relu_backward, k_relu_backward},
      {OpKind::gelu_backward, k_gelu_backward},
      {OpKind::broadcast_scalar, k_broadcast_scalar},
      {OpKind::fill, k_fill},
      {OpKind::dropout_mask, k_dropout_mask},
      {OpKind::running_stats_update, k_running_stats_update},
      {OpKind::sgd_update, k_sgd_update},
      {OpKind::sgd_momentum_update, k_sgd_momentum_update},
      {OpKind::adamw_update, k_adamw_update},
  };
}

}  // namespace memplan::kernels::cuda
