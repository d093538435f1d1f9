// Elementwise CUDA kernels: arithmetic, activations, fills, dropout masks and the optimizer
// updates. One thread per element (grid-stride), or eight 16-bit elements per thread
// (map_elements), so every element is written exactly once and the arithmetic order per element
// is the CPU kernel's.
#include <cmath>
#include <initializer_list>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/dropout.h"
#include "memplan/kernels/shared/optimizers.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

void k_bias_add(const KernelCall& c) {
  const In x = in(c.inputs[0]);
  const In b = in(c.inputs[1]);
  const Out y = out(c.outputs[0]);
  const std::int64_t cols = c.outputs[0].shape->cols();
  for_each_index(c.outputs[0].numel(), "bias_add", [=] __device__(std::int64_t i) { y.set(i, x[i] + b[i % cols]); });
}

void k_add(const KernelCall& c) {
  map_elements<2>(c, "add", [] __device__(float a, float b) { return a + b; });
}

void k_mul(const KernelCall& c) {
  map_elements<2>(c, "mul", [] __device__(float a, float b) { return a * b; });
}

void k_scale(const KernelCall& c) {
  const float alpha = c.attrs->alpha;
  map_elements<1>(c, "scale", [=] __device__(float x) { return alpha * x; });
}

void k_relu(const KernelCall& c) {
  map_elements<1>(c, "relu", [] __device__(float x) { return x > 0.0f ? x : 0.0f; });
}

// SiLU and its gradient as the CPU computes them (kernels/cpu/llm_kernels.cpp): swiglu's gradient
// is built from them.
void k_silu(const KernelCall& c) {
  map_elements<1>(c, "silu", [] __device__(float x) { return x * (1.0f / (1.0f + expf(-x))); });
}

// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
void k_silu_backward(const KernelCall& c) {
  map_elements<2>(c, "silu_backward", [] __device__(float dy, float x) {
    const float s = 1.0f / (1.0f + expf(-x));
    return dy * s * (1.0f + x * (1.0f - s));
  });
}

// silu(gate) rounded to f32 (or to the 16-bit attrs->dtype, as a 16-bit silu op stores it), then
// times up, as the CPU kernel computes it.
void k_swiglu(const KernelCall& c) {
  const graph::DType rounded = c.attrs->dtype;
  map_elements<2>(c, "swiglu", [=] __device__(float gate, float up) {
    float act = gate * (1.0f / (1.0f + expf(-gate)));
    if (rounded == graph::DType::bf16) act = to_f32(from_f32<__nv_bfloat16>(act));
    if (rounded == graph::DType::f16) act = to_f32(from_f32<__half>(act));
    return act * up;
  });
}

void k_sigmoid(const KernelCall& c) {
  map_elements<1>(c, "sigmoid", [] __device__(float x) { return 1.0f / (1.0f + expf(-x)); });
}

void k_sigmoid_backward(const KernelCall& c) {
  map_elements<2>(c, "sigmoid_backward", [] __device__(float dy, float y) { return dy * (y * (1.0f - y)); });
}

void k_tanh(const KernelCall& c) {
  map_elements<1>(c, "tanh", [] __device__(float x) { return tanhf(x); });
}

void k_tanh_backward(const KernelCall& c) {
  map_elements<2>(c, "tanh_backward", [] __device__(float dy, float y) { return dy * (1.0f - y * y); });
}

void k_clip(const KernelCall& c) {
  const float lo = c.attrs->clip_min, hi = c.attrs->clip_max;
  map_elements<1>(c, "clip", [=] __device__(float x) { return fminf(fmaxf(x, lo), hi); });
}

void k_clip_backward(const KernelCall& c) {
  const float lo = c.attrs->clip_min, hi = c.attrs->clip_max;
  map_elements<2>(c, "clip_backward", [=] __device__(float dy, float x) { return x > lo && x < hi ? dy : 0.0f; });
}

void k_relu_backward(const KernelCall& c) {
  map_elements<2>(c, "relu_backward", [] __device__(float dy, float y) { return y > 0.0f ? dy : 0.0f; });
}

void k_gelu(const KernelCall& c) {
  map_elements<1>(c, "gelu", [] __device__(float x) { return 0.5f * x * (1.0f + erff(x * kInvSqrt2)); });
}

void k_gelu_backward(const KernelCall& c) {
  map_elements<2>(c, "gelu_backward", [] __device__(float dy, float x) {
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  });
}

void k_reshape(const KernelCall&) {}  // a view: the executor points it at its base's storage

void k_broadcast_scalar(const KernelCall& c) {
  const In g = in(c.inputs[0]);
  const Out y = out(c.outputs[0]);
  const float alpha = c.attrs->alpha;
  for_each_index(c.outputs[0].numel(), "broadcast_scalar", [=] __device__(std::int64_t i) { y.set(i, alpha * g[0]); });
}

void k_fill(const KernelCall& c) {
  const Out y = out(c.outputs[0]);
  // The loss gradient's seed carries fp16's loss scale (graph/mixed_precision.h), as on the CPU.
  const float v = c.attrs->loss_scaled ? static_cast<float>(double(c.attrs->alpha) * c.loss_scale) : c.attrs->alpha;
  for_each_index(c.outputs[0].numel(), "fill", [=] __device__(std::int64_t i) { y.set(i, v); });
}

// The CPU's counter-based stream (kernels/shared/dropout.h): element i's draw depends only on
// (seed, step, i), so CPU and CUDA masks are identical.
void k_dropout_mask(const KernelCall& c) {
  const float p = c.attrs->dropout;
  const float keep = dropout_keep_scale(p);
  const std::uint64_t stream_id = dropout_stream(c.attrs->seed, c.step);
  const Out mask = out(c.outputs[0]);
  for_each_index(c.outputs[0].numel(), "dropout_mask",
                 [=] __device__(std::int64_t i) { mask.set(i, dropout_mask_element(stream_id, i, p, keep)); });
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

// Optimizers: the per-element arithmetic of kernels/shared/optimizers.h, which the CPU kernels
// share (PyTorch's single-tensor implementations).
void k_sgd_update(const KernelCall& c) {
  float* p = c.updates[0].f32();
  const float* g = c.inputs[0].f32();
  const float lr = c.lr(), wd = c.attrs->weight_decay;
  for_each_index(c.updates[0].numel(), "sgd_update", [=] __device__(std::int64_t i) { sgd_element(p[i], g[i], lr, wd); });
}

void k_sgd_momentum_update(const KernelCall& c) {
  float* p = c.updates[0].f32();
  float* buf = c.updates[1].f32();
  const float* g = c.inputs[0].f32();
  const float lr = c.lr(), wd = c.attrs->weight_decay, mom = c.attrs->momentum;
  for_each_index(c.updates[0].numel(), "sgd_momentum_update", [=] __device__(std::int64_t i) {
    sgd_momentum_element(p[i], buf[i], g[i], lr, wd, mom);
  });
}

void k_adamw_update(const KernelCall& c) {
  float* p = c.updates[0].f32();
  float* m = c.updates[1].f32();
  float* v = c.updates[2].f32();
  const float* g = c.inputs[0].f32();
  // The bias corrections on the host in double, as on the CPU.
  const AdamWScalars s = adamw_scalars(*c.attrs, c.step, c.lr());
  for_each_index(c.updates[0].numel(), "adamw_update", [=] __device__(std::int64_t i) {
    // g is read first: which product of b1 * m + (1 - b1) * g nvcc fuses into an FMA (--fmad)
    // follows the order of the loads, and another order changes the low bits of the update.
    const float gi = g[i];
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(pi, mi, vi, gi, s);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  });
}

// The kernels above the running statistics read In and write Out: every dtype from one body.
KernelEntries any_dtype_entries() {
  return {
      {OpKind::bias_add, k_bias_add},
      {OpKind::add, k_add},
      {OpKind::mul, k_mul},
      {OpKind::scale, k_scale},
      {OpKind::relu, k_relu},
      {OpKind::gelu, k_gelu},
      {OpKind::relu_backward, k_relu_backward},
      {OpKind::gelu_backward, k_gelu_backward},
      {OpKind::sigmoid, k_sigmoid},
      {OpKind::swiglu, k_swiglu},
      {OpKind::silu, k_silu},
      {OpKind::silu_backward, k_silu_backward},
      {OpKind::sigmoid_backward, k_sigmoid_backward},
      {OpKind::tanh, k_tanh},
      {OpKind::tanh_backward, k_tanh_backward},
      {OpKind::clip, k_clip},
      {OpKind::clip_backward, k_clip_backward},
      {OpKind::broadcast_scalar, k_broadcast_scalar},
      {OpKind::fill, k_fill},
      {OpKind::dropout_mask, k_dropout_mask},
  };
}

}  // namespace

KernelEntries elementwise_16bit_kernel_entries() { return at_16_bits(any_dtype_entries()); }

KernelEntries elementwise_kernel_entries() {
  KernelEntries entries = any_dtype_entries();
  for (const KernelEntry& e : std::initializer_list<KernelEntry>{
           {OpKind::reshape, k_reshape},
           {OpKind::tp_copy, k_reshape},  // a view too
           {OpKind::running_stats_update, k_running_stats_update},
           {OpKind::sgd_update, k_sgd_update},
           {OpKind::sgd_momentum_update, k_sgd_momentum_update},
           {OpKind::adamw_update, k_adamw_update},
       }) {
    entries.push_back(e);
  }
  return entries;
}

}  // namespace memplan::kernels::cuda
