// CPU kernels for LLaMA-style blocks (RMSNorm, SiLU, rotary embedding, grouped-query head
// repetition) and token-axis ops (concat, slice). Reductions run per row in a fixed order, so
// results do not depend on the thread count.
#include <cmath>
#include <cstring>
#include <vector>

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/half.h"

namespace memplan::kernels::cpu {

void rotate_head(const float* x, float* y, std::int64_t hd, std::int64_t pos, double base, std::int64_t rotary_dims,
                 bool inverse) {
  const std::int64_t rd = rotary_dims > 0 ? rotary_dims : hd, half = rd / 2;
  const double sign = inverse ? -1.0 : 1.0;
  for (std::int64_t i = 0; i < half; ++i) {
    const double angle = double(pos) * std::pow(base, -2.0 * double(i) / double(rd));
    const float cs = float(std::cos(angle)), sn = float(sign * std::sin(angle));
    const float a = x[i], b = x[i + half];
    y[i] = a * cs - b * sn;
    y[i + half] = b * cs + a * sn;
  }
  for (std::int64_t i = rd; i < hd; ++i) y[i] = x[i];
}

namespace {

using graph::OpKind;
using graph::Shape;


// 1 / sqrt(mean(x^2) + eps) of one row, accumulated in double.
float rms_scale(const float* x, std::int64_t cols, float eps) {
  double ss = 0.0;
  for (std::int64_t j = 0; j < cols; ++j) ss += double(x[j]) * double(x[j]);
  return float(1.0 / std::sqrt(ss / double(cols) + double(eps)));
}

void k_rms_norm(const KernelCall& c) {
  const std::int64_t rows = c.inputs[0].shape->rows(), cols = c.inputs[0].shape->cols();
  const float* x = c.inputs[0].f32();
  const float* gamma = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  const float eps = c.attrs->norm_eps;
  parallel_each(rows, cols, [&](std::int64_t r) {
    const float* xr = x + r * cols;
    const float s = rms_scale(xr, cols, eps);
    for (std::int64_t j = 0; j < cols; ++j) y[r * cols + j] = xr[j] * s * gamma[j];
  });
}

// dx = s * (g - xhat * mean(g * xhat)) with g = gamma * dy, xhat = x * s, per row.
void k_rms_norm_backward(const KernelCall& c) {
  const std::int64_t rows = c.inputs[1].shape->rows(), cols = c.inputs[1].shape->cols();
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  const float* gamma = c.inputs[2].f32();
  float* dx = c.outputs[0].f32();
  const float eps = c.attrs->norm_eps;
  parallel_each(rows, cols, [&](std::int64_t r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const float s = rms_scale(xr, cols, eps);
    double dot = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) dot += double(gamma[j] * dyr[j]) * double(xr[j] * s);
    const float mean_gx = float(dot / double(cols));
    for (std::int64_t j = 0; j < cols; ++j) {
      dx[r * cols + j] = s * (gamma[j] * dyr[j] - xr[j] * s * mean_gx);
    }
  });
}

void k_rms_norm_dgamma(const KernelCall& c) {
  const std::int64_t rows = c.inputs[1].shape->rows(), cols = c.inputs[1].shape->cols();
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dgamma = c.outputs[0].f32();
  std::vector<float> scale(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) scale[static_cast<std::size_t>(r)] = rms_scale(x + r * cols, cols, c.attrs->norm_eps);
  parallel_each(cols, rows, [&](std::int64_t j) {
    double acc = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      acc += double(dy[r * cols + j]) * double(x[r * cols + j] * scale[static_cast<std::size_t>(r)]);
    }
    dgamma[j] = float(acc);
  });
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

void k_silu(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_each(n, 1, [&](std::int64_t i) { y[i] = x[i] * sigmoid(x[i]); });
}

// silu(gate) rounded to f32 (or to the 16-bit attrs->dtype, as a 16-bit silu op stores it), then
// times up: the same bits as silu then mul.
void k_swiglu(const KernelCall& c) {
  const float* gate = c.inputs[0].f32();
  const float* up = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  const graph::DType rounded = c.attrs->dtype;
  parallel_each(n, 1, [&](std::int64_t i) {
    const float act = round_to(rounded, gate[i] * sigmoid(gate[i]));
    y[i] = act * up[i];
  });
}

// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
void k_silu_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_each(n, 1, [&](std::int64_t i) {
    const float s = sigmoid(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  });
}

// Each row [.., t, :] is one head at position t, rotated by rotate_head (the half-split layout
// LLaMA implementations use).
void k_rotary(const KernelCall& c) {
  const Shape& s = *c.inputs[0].shape;
  const std::int64_t hd = s.cols(), t_len = s[s.rank() - 2];
  const std::int64_t rows = s.rows();
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  parallel_each(rows, hd, [&](std::int64_t r) {
    rotate_head(x + r * hd, y + r * hd, hd, r % t_len, c.attrs->rope_base, c.attrs->rotary_dims, c.attrs->inverse);
  });
}

// x [B, H, S...] -> y [B, H*R, S...]: each head's block of S elements copied R times.
void k_repeat_heads(const KernelCall& c) {
  const Shape& s = *c.inputs[0].shape;
  const std::int64_t batch = s[0], heads = s[1], block = s.numel() / (batch * heads), rep = c.attrs->repeats;
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  parallel_each(batch * heads * rep, elements_per(c.outputs[0].numel(), batch * heads * rep), [&](std::int64_t bh) {
    const std::int64_t b = bh / (heads * rep), h = (bh % (heads * rep)) / rep;
    std::memcpy(y + bh * block, x + (b * heads + h) * block, static_cast<std::size_t>(block) * sizeof(float));
  });
}

void k_repeat_heads_backward(const KernelCall& c) {
  const Shape& s = *c.outputs[0].shape;
  const std::int64_t batch = s[0], heads = s[1], block = s.numel() / (batch * heads), rep = c.attrs->repeats;
  const float* dy = c.inputs[0].f32();
  float* dx = c.outputs[0].f32();
  parallel_each(batch * heads, elements_per(c.outputs[0].numel(), batch * heads), [&](std::int64_t bh) {
    float* out = dx + bh * block;
    for (std::int64_t i = 0; i < block; ++i) out[i] = 0.0f;
    for (std::int64_t r = 0; r < rep; ++r) {
      const float* in = dy + (bh * rep + r) * block;
      for (std::int64_t i = 0; i < block; ++i) out[i] += in[i];
    }
  });
}

// A shape as (outer, extent along axis, inner) around `axis`.
struct AxisSplit {
  std::int64_t outer = 1, extent = 1, inner = 1;
};
AxisSplit split_at(const Shape& s, std::int64_t axis) {
  AxisSplit a;
  for (int i = 0; i < s.rank(); ++i) {
    if (i < axis) a.outer *= s[i];
    else if (i == axis) a.extent = s[i];
    else a.inner *= s[i];
  }
  return a;
}

void k_concat(const KernelCall& c) {
  const std::int64_t axis = c.attrs->axis;
  const AxisSplit a = split_at(*c.inputs[0].shape, axis), b = split_at(*c.inputs[1].shape, axis);
  const float* pa = c.inputs[0].f32();
  const float* pb = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t ra = a.extent * a.inner, rb = b.extent * b.inner;
  for (std::int64_t o = 0; o < a.outer; ++o) {
    std::memcpy(y + o * (ra + rb), pa + o * ra, static_cast<std::size_t>(ra) * sizeof(float));
    std::memcpy(y + o * (ra + rb) + ra, pb + o * rb, static_cast<std::size_t>(rb) * sizeof(float));
  }
}

void k_slice(const KernelCall& c) {
  const AxisSplit x = split_at(*c.inputs[0].shape, c.attrs->axis);
  const float* px = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t row = c.attrs->length * x.inner;
  for (std::int64_t o = 0; o < x.outer; ++o) {
    std::memcpy(y + o * row, px + (o * x.extent + c.attrs->start) * x.inner, static_cast<std::size_t>(row) * sizeof(float));
  }
}

}  // namespace

KernelEntries llm_kernel_entries() {
  return {
      {OpKind::rms_norm, k_rms_norm},
      {OpKind::rms_norm_backward, k_rms_norm_backward},
      {OpKind::rms_norm_dgamma, k_rms_norm_dgamma},
      {OpKind::silu, k_silu},
      {OpKind::silu_backward, k_silu_backward},
      {OpKind::swiglu, k_swiglu},
      {OpKind::rotary, k_rotary},
      {OpKind::repeat_heads, k_repeat_heads},
      {OpKind::repeat_heads_backward, k_repeat_heads_backward},
      {OpKind::concat, k_concat},
      {OpKind::slice, k_slice},
  };
}

}  // namespace memplan::kernels::cpu
