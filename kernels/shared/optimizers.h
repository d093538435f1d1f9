// The optimizer updates' per-element arithmetic, shared by the CPU kernels (kernels/cpu/) and the
// CUDA kernels (kernels/cuda/): PyTorch's single-tensor implementations, written once so the two
// devices apply the same operations in the same order. Each function updates one element.
#pragma once

#include <cmath>
#include <cstdint>

#include "memplan/common/host_device.h"
#include "memplan/graph/op.h"
#include "memplan/kernels/shared/quant.h"

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

// 8-bit AdamW (bitsandbytes' block-wise update, kOptimizerStatic8bit2StateBlockwise; graph/
// optimizer.h): for each block of 256 elements, m and v are dequantized (code's map value times
// the block's absmax) and updated in f32; the block's new absmax is the largest |m| and v; the
// parameter moves by the f32 moments, p += -lr sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) +
// eps sqrt(1-b2^t)), then decays, p *= 1 - lr wd (bnb decays after the step, PyTorch before);
// the moments are stored again as the codes nearest m / absmax and v / absmax.
struct Adam8bitScalars {
  float beta1, beta2;
  float eps_c2;     // eps * sqrt(1 - beta2^t)
  float step_size;  // -lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  float decay;      // 1 - lr * weight_decay
};

inline Adam8bitScalars adam8bit_scalars(const graph::OpAttrs& a, std::int64_t step, float lr) {
  const double t = static_cast<double>(step);
  const double c1 = 1.0 - std::pow(double(a.beta1), t);
  const double c2 = std::sqrt(1.0 - std::pow(double(a.beta2), t));
  Adam8bitScalars s{};
  s.beta1 = a.beta1;
  s.beta2 = a.beta2;
  s.eps_c2 = static_cast<float>(double(a.eps) * c2);
  s.step_size = static_cast<float>(-double(lr) * c2 / c1);
  s.decay = 1.0f - lr * a.weight_decay;
  return s;
}

// The two maps the codes index, as one table: [0, 256) signed (m), [256, 512) unsigned (v).
inline constexpr int kAdam8bitMapValues = 512;
MEMPLAN_HD inline float adam8bit_map_value(int index) {
  return dynamic_map_value(static_cast<unsigned>(index & 255), index < 256);
}

// One element's moments after this step's gradient, from its codes and its block's absmax.
MEMPLAN_HD inline void adam8bit_moments(const float* maps, std::uint8_t m_code, std::uint8_t v_code, float m_absmax,
                                        float v_absmax, float g, const Adam8bitScalars& s, float& m, float& v) {
  m = s.beta1 * (maps[m_code] * m_absmax) + (1.0f - s.beta1) * g;
  v = s.beta2 * (maps[256 + v_code] * v_absmax) + (1.0f - s.beta2) * (g * g);
}

// The parameter's step from the f32 moments, then the decay.
MEMPLAN_HD inline void adam8bit_param(float& p, float m, float v, const Adam8bitScalars& s) {
  p = p + s.step_size * (m / (sqrtf(v) + s.eps_c2));
  p = p * s.decay;
}

// The moments' codes under the block's new absmax (a block of zeros keeps the zero codes).
MEMPLAN_HD inline void adam8bit_codes(const float* maps, float m, float v, float m_absmax, float v_absmax,
                                      std::uint8_t& m_code, std::uint8_t& v_code) {
  m_code = static_cast<std::uint8_t>(m_absmax > 0.0f ? nearest_code(maps, m / m_absmax) : 127u);
  v_code = static_cast<std::uint8_t>(v_absmax > 0.0f ? nearest_code(maps + 256, v / v_absmax) : 0u);
}

}  // namespace memplan::kernels
