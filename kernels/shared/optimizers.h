// The optimizer updates' per-element arithmetic, shared by the CPU kernels (kernels/cpu/) and the
// CUDA kernels (kernels/cuda/): PyTorch's single-tensor implementations, written once so the two
// devices apply the same operations in the same order. Each function updates one element.
#pragma once

#include <cmath>
#include <cstdint>

#include "memplan/common/host_device.h"
#include "memplan/graph/op.h"

namespace memplan::kernels {

// SGD (no state): g += wd * p; p -= lr * g.
MEMPLAN_HD inline void sgd_element(float& p, float g, float lr, float weight_decay) {
  p -= lr * (g + weight_decay * p);
}

// SGD with momentum (dampening 0): buf = m * buf + g; p -= lr * buf. The zero-initialised buffer
// makes the first step buf = g, as PyTorch's clone does.
MEMPLAN_HD inline void sgd_momentum_element(float& p, float& buf, float g, float lr, float weight_decay,
                                            float momentum) {
  const float gi = g + weight_decay * p;
  buf = momentum * buf + gi;
  p -= lr * buf;
}

// AdamW's per-step scalars, computed once per update on the host: the bias corrections in
// double (as PyTorch computes them in Python floats), then rounded to f32.
struct AdamWScalars {
  float beta1, beta2, eps;
  float decay;      // 1 - lr * weight_decay (decoupled weight decay)
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
};

// `lr`: the step's learning rate (the op's, times the schedule's factor).
inline AdamWScalars adamw_scalars(const graph::OpAttrs& a, std::int64_t step, float lr) {
  const double t = static_cast<double>(step);
  const float bc1 = static_cast<float>(1.0 - std::pow(double(a.beta1), t));
  AdamWScalars s{};
  s.beta1 = a.beta1;
  s.beta2 = a.beta2;
  s.eps = a.eps;
  s.decay = 1.0f - lr * a.weight_decay;
  s.step_size = lr / bc1;
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double(a.beta2), t)));
  return s;
}

// AdamW (decoupled weight decay) in the order of PyTorch's single-tensor implementation:
// p *= 1 - lr*wd; m, v updated; p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps).
MEMPLAN_HD inline void adamw_element(float& p, float& m, float& v, float g, const AdamWScalars& s) {
  p *= s.decay;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  p -= s.step_size * (m / denom);
}

}  // namespace memplan::kernels
