// CUDA kernels of fused attention, the same algorithm as kernels/cpu/attention_kernels.cpp: no
// [T, T] tensor exists; each thread owns one row (a query row forward and for dq, a key row for
// dk and dv), walks the keys (queries) in index order and recomputes each probability from the
// saved log-sum-exp, so results are deterministic and need no atomics. Also `slice`, which hands
// the packed backward result to dq, dk and dv.
#include <cmath>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/dropout.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

struct Dims {
  std::int64_t batch, heads, kv_heads, t, d, group;
};

Dims dims_of(const graph::Shape& q, const graph::Shape& k) { return {q[0], q[1], k[1], q[2], q[3], q[1] / k[1]}; }

__device__ inline float dot_row(const float* a, const float* b, std::int64_t n) {
  float s = 0.0f;
  for (std::int64_t x = 0; x < n; ++x) s += a[x] * b[x];
  return s;
}

// Query row `row` = (b*H + h)*T + i: its K/V head's base offset.
__device__ inline std::int64_t kv_base(const Dims& d, std::int64_t bh) {
  const std::int64_t b = bh / d.heads, kvh = (bh % d.heads) / d.group;
  return (b * d.kv_heads + kvh) * d.t * d.d;
}

void k_attention_lse(const KernelCall& c) {
  const Dims d = dims_of(*c.inputs[0].shape, *c.inputs[1].shape);
  const float* q = c.inputs[0].f32();
  const float* k = c.inputs[1].f32();
  float* lse = c.outputs[0].f32();
  const float alpha = c.attrs->alpha;
  const bool causal = c.attrs->causal;
  for_each_index(c.outputs[0].numel(), "attention_lse", [=] __device__(std::int64_t row) {
    const std::int64_t i = row % d.t, bh = row / d.t;
    const float* qi = q + row * d.d;
    const float* kh = k + kv_base(d, bh);
    const std::int64_t end = causal ? i + 1 : d.t;
    float m = -INFINITY, l = 0.0f;  // online softmax: running max and sum of exp(s - max)
    for (std::int64_t j = 0; j < end; ++j) {
      const float s = alpha * dot_row(qi, kh + j * d.d, d.d);
      const float new_m = fmaxf(m, s);
      l = l * expf(m - new_m) + expf(s - new_m);
      m = new_m;
    }
    lse[row] = m + logf(l);
  });
}

void k_attention(const KernelCall& c) {
  const Dims d = dims_of(*c.inputs[0].shape, *c.inputs[1].shape);
  const float* q = c.inputs[0].f32();
  const float* k = c.inputs[1].f32();
  const float* v = c.inputs[2].f32();
  const float* lse = c.inputs[3].f32();
  float* y = c.outputs[0].f32();
  const float alpha = c.attrs->alpha, drop = c.attrs->dropout;
  const bool causal = c.attrs->causal;
  const std::uint64_t stream_id = dropout_stream(c.attrs->seed, c.step);
  for_each_index(c.inputs[3].numel(), "attention", [=] __device__(std::int64_t row) {
    const std::int64_t i = row % d.t, bh = row / d.t;
    const float* qi = q + row * d.d;
    const float* kh = k + kv_base(d, bh);
    const float* vh = v + kv_base(d, bh);
    float* yi = y + row * d.d;
    for (std::int64_t x = 0; x < d.d; ++x) yi[x] = 0.0f;
    const std::int64_t end = causal ? i + 1 : d.t;
    const float keep = drop > 0.0f ? dropout_keep_scale(drop) : 1.0f;
    for (std::int64_t j = 0; j < end; ++j) {
      float p = expf(alpha * dot_row(qi, kh + j * d.d, d.d) - lse[row]);
      if (drop > 0.0f) p *= dropout_mask_element(stream_id, row * d.t + j, drop, keep);
      if (p == 0.0f) continue;
      for (std::int64_t x = 0; x < d.d; ++x) yi[x] += p * vh[j * d.d + x];
    }
  });
}

void k_attention_backward_dot(const KernelCall& c) {
  const std::int64_t cols = c.inputs[0].shape->cols();
  const float* dy = c.inputs[0].f32();
  const float* y = c.inputs[1].f32();
  float* delta = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "attention_backward_dot", [=] __device__(std::int64_t r) {
    double s = 0.0;
    for (std::int64_t x = 0; x < cols; ++x) s += double(dy[r * cols + x]) * double(y[r * cols + x]);
    delta[r] = float(s);
  });
}

// Two passes over the packed output [B, H + 2KH, T, D]: dq by query rows, then dk and dv by key rows
// (each summing over the query rows of every head in its group, heads then rows in order).
void k_attention_backward(const KernelCall& c) {
  const Dims d = dims_of(*c.inputs[1].shape, *c.inputs[2].shape);
  const float* dy = c.inputs[0].f32();
  const float* q = c.inputs[1].f32();
  const float* k = c.inputs[2].f32();
  const float* v = c.inputs[3].f32();
  const float* lse = c.inputs[4].f32();
  const float* delta = c.inputs[5].f32();
  float* out = c.outputs[0].f32();
  const float alpha = c.attrs->alpha, drop = c.attrs->dropout;
  const bool causal = c.attrs->causal;
  const std::uint64_t stream_id = dropout_stream(c.attrs->seed, c.step);
  const float keep = drop > 0.0f ? dropout_keep_scale(drop) : 1.0f;
  const std::int64_t out_heads = d.heads + 2 * d.kv_heads, head_size = d.t * d.d;

  for_each_index(c.inputs[4].numel(), "attention_backward (dq)", [=] __device__(std::int64_t row) {
    const std::int64_t i = row % d.t, bh = row / d.t, b = bh / d.heads, h = bh % d.heads;
    const float* qi = q + row * d.d;
    const float* dyi = dy + row * d.d;
    const float* kh = k + kv_base(d, bh);
    const float* vh = v + kv_base(d, bh);
    float* dq = out + (b * out_heads + h) * head_size + i * d.d;
    for (std::int64_t x = 0; x < d.d; ++x) dq[x] = 0.0f;
    const std::int64_t end = causal ? i + 1 : d.t;
    for (std::int64_t j = 0; j < end; ++j) {
      const float p = expf(alpha * dot_row(qi, kh + j * d.d, d.d) - lse[row]);
      const float mask = drop > 0.0f ? dropout_mask_element(stream_id, row * d.t + j, drop, keep) : 1.0f;
      const float ds = alpha * p * (dot_row(dyi, vh + j * d.d, d.d) * mask - delta[row]);
      for (std::int64_t x = 0; x < d.d; ++x) dq[x] += ds * kh[j * d.d + x];
    }
  });

  for_each_index(d.batch * d.kv_heads * d.t, "attention_backward (dk, dv)", [=] __device__(std::int64_t key_row) {
    const std::int64_t j = key_row % d.t, bk = key_row / d.t, b = bk / d.kv_heads, kvh = bk % d.kv_heads;
    const float* kj = k + key_row * d.d;
    const float* vj = v + key_row * d.d;
    float* dk = out + (b * out_heads + d.heads + kvh) * head_size + j * d.d;
    float* dv = out + (b * out_heads + d.heads + d.kv_heads + kvh) * head_size + j * d.d;
    for (std::int64_t x = 0; x < d.d; ++x) dk[x] = dv[x] = 0.0f;
    for (std::int64_t g = 0; g < d.group; ++g) {
      const std::int64_t bh = b * d.heads + kvh * d.group + g;
      for (std::int64_t i = causal ? j : 0; i < d.t; ++i) {
        const std::int64_t row = bh * d.t + i;
        const float* qi = q + row * d.d;
        const float* dyi = dy + row * d.d;
        const float p = expf(alpha * dot_row(qi, kj, d.d) - lse[row]);
        const float mask = drop > 0.0f ? dropout_mask_element(stream_id, row * d.t + j, drop, keep) : 1.0f;
        const float ds = alpha * p * (dot_row(dyi, vj, d.d) * mask - delta[row]);
        const float kept = p * mask;
        for (std::int64_t x = 0; x < d.d; ++x) {
          dv[x] += kept * dyi[x];
          dk[x] += ds * qi[x];
        }
      }
    }
  });
}

// y = x[start, start + length) along `axis`, as [outer, extent, inner].
void k_slice(const KernelCall& c) {
  const graph::Shape& s = *c.inputs[0].shape;
  std::int64_t inner = 1;
  for (int i = static_cast<int>(c.attrs->axis) + 1; i < s.rank(); ++i) inner *= s[i];
  const std::int64_t extent = s[static_cast<int>(c.attrs->axis)], start = c.attrs->start, length = c.attrs->length;
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "slice", [=] __device__(std::int64_t e) {
    const std::int64_t in = e % inner, a = (e / inner) % length, o = e / (inner * length);
    y[e] = x[(o * extent + start + a) * inner + in];
  });
}

}  // namespace

KernelEntries attention_kernel_entries() {
  return {
      {OpKind::attention_lse, k_attention_lse},
      {OpKind::attention, k_attention},
      {OpKind::attention_backward_dot, k_attention_backward_dot},
      {OpKind::attention_backward, k_attention_backward},
      {OpKind::slice, k_slice},
  };
}

}  // namespace memplan::kernels::cuda
