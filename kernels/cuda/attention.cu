// CUDA kernels of fused attention, the same algorithm as kernels/cpu/attention_kernels.cpp: no
// [T, T] tensor exists; each thread owns one row (a query row forward and for dq, a key row for
// dk and dv), walks the keys (queries) in index order and recomputes each probability from the
// saved log-sum-exp, so results are deterministic and need no atomics. For the head sizes of the
// reference models and GPT-2 (16, 32, 64) the row lives in registers and the keys (queries) come
// through shared memory a tile at a time, read by every thread of the block at once; other head
// sizes take a per-row loop over global memory, accumulating kChunk channels at a time in
// registers. At bf16 and f16 the same kernels read and write 16-bit q, k, v, dy and outputs,
// computing in f32 in registers and rounding each output once (the log-sum-exp and delta rows are
// f32 at every dtype), so no f32 copy of a head is made. Also `slice`, which hands the packed
// backward result to dq, dk and dv.
#include <cmath>
#include <type_traits>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/attention_mask.h"
#include "memplan/kernels/shared/dropout.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

struct Dims {
  std::int64_t batch, heads, kv_heads, t, d, group;
};

Dims dims_of(const graph::Shape& q, const graph::Shape& k) { return {q[0], q[1], k[1], q[2], q[3], q[1] / k[1]}; }

template <typename T>
__device__ inline float dot_row(const T* a, const T* b, std::int64_t n) {
  float s = 0.0f;
  for (std::int64_t x = 0; x < n; ++x) s += to_f32(a[x]) * to_f32(b[x]);
  return s;
}

// Query row `row` = (b*H + h)*T + i: its K/V head's base offset.
__device__ inline std::int64_t kv_base(const Dims& d, std::int64_t bh) {
  const std::int64_t b = bh / d.heads, kvh = (bh % d.heads) / d.group;
  return (b * d.kv_heads + kvh) * d.t * d.d;
}

// --- tiled kernels (head size D in {16, 32, 64}) ------------------------------------------------
// A block of kRows threads owns kRows consecutive rows of one head; tiles of kTile rows of the
// other side are staged in shared memory, where every thread reads the same element at once (a
// broadcast). Each thread's dot products and sums run in a fixed order, so runs agree bit for bit.
constexpr int kRows = 128;
constexpr int kTile = 32;

// a . b, a in registers, b 16-byte aligned in shared memory; four partial sums in a fixed order.
template <int D>
__device__ inline float dot_shared(const float (&a)[D], const float* b) {
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
  for (int x = 0; x < D; x += 4) {
    const float4 v = *reinterpret_cast<const float4*>(b + x);
    s0 = fmaf(a[x], v.x, s0);
    s1 = fmaf(a[x + 1], v.y, s1);
    s2 = fmaf(a[x + 2], v.z, s2);
    s3 = fmaf(a[x + 3], v.w, s3);
  }
  return (s0 + s1) + (s2 + s3);
}

// acc += w * b, b in shared memory.
template <int D>
__device__ inline void axpy_shared(float (&acc)[D], float w, const float* b) {
#pragma unroll
  for (int x = 0; x < D; x += 4) {
    const float4 v = *reinterpret_cast<const float4*>(b + x);
    acc[x] = fmaf(w, v.x, acc[x]);
    acc[x + 1] = fmaf(w, v.y, acc[x + 1]);
    acc[x + 2] = fmaf(w, v.z, acc[x + 2]);
    acc[x + 3] = fmaf(w, v.w, acc[x + 3]);
  }
}

template <int D, typename T>
__device__ inline void load_row(float (&r)[D], const T* src, bool active) {
#pragma unroll
  for (int x = 0; x < D; ++x) r[x] = active ? to_f32(src[x]) : 0.0f;
}

template <int D, typename T>
__device__ inline void store_row(T* dst, const float (&r)[D]) {
#pragma unroll
  for (int x = 0; x < D; ++x) dst[x] = from_f32<T>(r[x]);
}

// Rows [first, first + n) of a [T, D] head into shared memory (n <= kTile), by the whole block.
template <int D, typename T>
__device__ inline void stage(float* tile, const T* head, int first, int n) {
  const T* src = head + std::int64_t(first) * D;
  for (int e = threadIdx.x; e < n * D; e += blockDim.x) tile[e] = to_f32(src[e]);
}

// A raw dot product's score: times alpha, soft-capped to cap * tanh(s / cap) when cap > 0
// (Gemma-2), and the score's derivative with respect to the dot product.
__device__ inline float capped_score(float alpha, float cap, float dot) {
  const float s = alpha * dot;
  return cap > 0.0f ? cap * tanhf(s / cap) : s;
}
__device__ inline float score_slope(float alpha, float cap, float dot) {
  if (cap <= 0.0f) return alpha;
  const float t = tanhf(alpha * dot / cap);
  return alpha * (1.0f - t * t);
}

struct TiledArgs {
  Dims d;
  float alpha, cap, drop, keep;
  bool causal;
  std::int64_t window;  // with causal: query i sees keys i - window < j <= i (0: every j <= i)
  std::uint64_t stream_id;
};

// The first key tile (a multiple of kTile) a block of query rows from i0 on sees: the window of its
// first row starts there or later.
__device__ inline int first_key_tile(const TiledArgs& a, int i0) {
  return int(visible_keys(i0, a.d.t, a.causal, a.window).first / kTile) * kTile;
}

// Grid: x = b*H + h, y = block of kRows query rows.
template <typename T, int D>
__global__ void __launch_bounds__(kRows) attention_lse_tiled(const T* q, const T* k, float* lse, TiledArgs a) {
  __shared__ __align__(16) float ks[kTile * D];
  const Dims d = a.d;
  const std::int64_t bh = blockIdx.x;
  const int i0 = blockIdx.y * kRows, i = i0 + threadIdx.x;
  const bool active = i < d.t;
  const std::int64_t row = bh * d.t + i;
  float qr[D];
  load_row(qr, q + row * D, active);
  const T* kh = k + kv_base(d, bh);
  const int block_end = a.causal ? min(int(d.t), i0 + kRows) : int(d.t);
  const KeyRange mine = visible_keys(i, d.t, a.causal, a.window);
  const int my_first = int(mine.first), my_end = int(mine.end);
  float m = -INFINITY, l = 0.0f;  // online softmax: running max and sum of exp(s - max)
  for (int j0 = first_key_tile(a, i0); j0 < block_end; j0 += kTile) {
    const int n = min(kTile, int(d.t) - j0);
    __syncthreads();
    stage<D>(ks, kh, j0, n);
    __syncthreads();
    const int jn = active ? min(n, my_end - j0) : 0;
    for (int jj = max(0, my_first - j0); jj < jn; ++jj) {
      const float s = capped_score(a.alpha, a.cap, dot_shared<D>(qr, ks + jj * D));
      const float new_m = fmaxf(m, s);
      l = l * expf(m - new_m) + expf(s - new_m);
      m = new_m;
    }
  }
  if (active) lse[row] = m + logf(l);
}

template <typename T, int D>
__global__ void __launch_bounds__(kRows) attention_tiled(const T* q, const T* k, const T* v, const float* lse, T* y,
                                                          TiledArgs a) {
  __shared__ __align__(16) float ks[kTile * D];
  __shared__ __align__(16) float vs[kTile * D];
  const Dims d = a.d;
  const std::int64_t bh = blockIdx.x;
  const int i0 = blockIdx.y * kRows, i = i0 + threadIdx.x;
  const bool active = i < d.t;
  const std::int64_t row = bh * d.t + i;
  float qr[D], acc[D];
  load_row(qr, q + row * D, active);
#pragma unroll
  for (int x = 0; x < D; ++x) acc[x] = 0.0f;
  const float li = active ? lse[row] : 0.0f;
  const T* kh = k + kv_base(d, bh);
  const T* vh = v + kv_base(d, bh);
  const int block_end = a.causal ? min(int(d.t), i0 + kRows) : int(d.t);
  const KeyRange mine = visible_keys(i, d.t, a.causal, a.window);
  const int my_first = int(mine.first), my_end = int(mine.end);
  for (int j0 = first_key_tile(a, i0); j0 < block_end; j0 += kTile) {
    const int n = min(kTile, int(d.t) - j0);
    __syncthreads();
    stage<D>(ks, kh, j0, n);
    stage<D>(vs, vh, j0, n);
    __syncthreads();
    const int jn = active ? min(n, my_end - j0) : 0;
    for (int jj = max(0, my_first - j0); jj < jn; ++jj) {
      float p = expf(capped_score(a.alpha, a.cap, dot_shared<D>(qr, ks + jj * D)) - li);
      if (a.drop > 0.0f) p *= dropout_mask_element(a.stream_id, row * d.t + j0 + jj, a.drop, a.keep);
      axpy_shared<D>(acc, p, vs + jj * D);
    }
  }
  if (active) store_row(y + row * D, acc);
}

// dq by query rows: dq_i = sum_j ds_ij k_j, ds_ij = alpha p_ij (dy_i . v_j mask_ij - delta_i).
template <typename T, int D>
__global__ void __launch_bounds__(kRows) attention_backward_dq_tiled(const T* dy, const T* q, const T* k, const T* v,
                                                                      const float* lse, const float* delta, T* out,
                                                                      TiledArgs a) {
  __shared__ __align__(16) float ks[kTile * D];
  __shared__ __align__(16) float vs[kTile * D];
  const Dims d = a.d;
  const std::int64_t bh = blockIdx.x, b = bh / d.heads, h = bh % d.heads;
  const int i0 = blockIdx.y * kRows, i = i0 + threadIdx.x;
  const bool active = i < d.t;
  const std::int64_t row = bh * d.t + i;
  float qr[D], dyr[D], acc[D];
  load_row(qr, q + row * D, active);
  load_row(dyr, dy + row * D, active);
#pragma unroll
  for (int x = 0; x < D; ++x) acc[x] = 0.0f;
  const float li = active ? lse[row] : 0.0f, di = active ? delta[row] : 0.0f;
  const T* kh = k + kv_base(d, bh);
  const T* vh = v + kv_base(d, bh);
  const int block_end = a.causal ? min(int(d.t), i0 + kRows) : int(d.t);
  const KeyRange mine = visible_keys(i, d.t, a.causal, a.window);
  const int my_first = int(mine.first), my_end = int(mine.end);
  for (int j0 = first_key_tile(a, i0); j0 < block_end; j0 += kTile) {
    const int n = min(kTile, int(d.t) - j0);
    __syncthreads();
    stage<D>(ks, kh, j0, n);
    stage<D>(vs, vh, j0, n);
    __syncthreads();
    const int jn = active ? min(n, my_end - j0) : 0;
    for (int jj = max(0, my_first - j0); jj < jn; ++jj) {
      const float raw = dot_shared<D>(qr, ks + jj * D);
      const float p = expf(capped_score(a.alpha, a.cap, raw) - li);
      const float mask = a.drop > 0.0f ? dropout_mask_element(a.stream_id, row * d.t + j0 + jj, a.drop, a.keep) : 1.0f;
      const float ds = score_slope(a.alpha, a.cap, raw) * p * (dot_shared<D>(dyr, vs + jj * D) * mask - di);
      axpy_shared<D>(acc, ds, ks + jj * D);
    }
  }
  const std::int64_t out_heads = d.heads + 2 * d.kv_heads;
  if (active) store_row(out + ((b * out_heads + h) * d.t + i) * D, acc);
}

// dk or dv by key rows, summing over the query rows of every head in the key's group (heads, then
// rows, in order): dv_j = sum_i p_ij mask_ij dy_i; dk_j = sum_i ds_ij q_i. Two launches, so each
// thread keeps only the rows it needs in registers. Grid: x = b*KH + kv head, y = block of keys.
template <typename T, int D, bool kWantDk>
__global__ void __launch_bounds__(kRows) attention_backward_dkdv_tiled(const T* dy, const T* q, const T* k, const T* v,
                                                                        const float* lse, const float* delta, T* out,
                                                                        TiledArgs a) {
  __shared__ __align__(16) float qs[kTile * D];
  __shared__ __align__(16) float dys[kTile * D];
  __shared__ float lses[kTile], deltas[kTile];
  const Dims d = a.d;
  const std::int64_t bk = blockIdx.x, b = bk / d.kv_heads, kvh = bk % d.kv_heads;
  const int j0b = blockIdx.y * kRows, j = j0b + threadIdx.x;
  const bool active = j < d.t;
  const std::int64_t key_row = bk * d.t + j;
  float kr[D], vr[D], acc[D];
  load_row(kr, k + key_row * D, active);
  load_row(vr, v + key_row * D, active && kWantDk);  // dk's pass needs v_j, dv's does not
#pragma unroll
  for (int x = 0; x < D; ++x) acc[x] = 0.0f;
  // Under a causal mask no query before the block's first key sees it; with a window, none at or
  // past its last key's j + window.
  const int first_tile = a.causal ? (j0b / kTile) * kTile : 0;
  const int query_end = a.causal && a.window > 0 ? int(min(d.t, std::int64_t(j0b) + kRows - 1 + a.window)) : int(d.t);
  for (std::int64_t g = 0; g < d.group; ++g) {
    const std::int64_t bh = b * d.heads + kvh * d.group + g;
    const T* qh = q + bh * d.t * D;
    const T* dyh = dy + bh * d.t * D;
    for (int i0 = first_tile; i0 < query_end; i0 += kTile) {
      const int n = min(kTile, int(d.t) - i0);
      __syncthreads();
      stage<D>(qs, qh, i0, n);
      stage<D>(dys, dyh, i0, n);
      if (threadIdx.x < n) {
        lses[threadIdx.x] = lse[bh * d.t + i0 + threadIdx.x];
        deltas[threadIdx.x] = delta[bh * d.t + i0 + threadIdx.x];
      }
      __syncthreads();
      if (!active) continue;
      // Under a causal mask only queries j <= i (< j + window) see key j.
      const int ii_first = a.causal ? max(0, j - i0) : 0;
      const int ii_end = a.causal && a.window > 0 ? int(min(std::int64_t(n), std::int64_t(j) + a.window - i0)) : n;
      for (int ii = ii_first; ii < ii_end; ++ii) {
        const std::int64_t row = bh * d.t + i0 + ii;
        const float raw = dot_shared<D>(kr, qs + ii * D);
        const float p = expf(capped_score(a.alpha, a.cap, raw) - lses[ii]);
        const float mask = a.drop > 0.0f ? dropout_mask_element(a.stream_id, row * d.t + j, a.drop, a.keep) : 1.0f;
        if constexpr (kWantDk) {
          const float ds = score_slope(a.alpha, a.cap, raw) * p * (dot_shared<D>(vr, dys + ii * D) * mask - deltas[ii]);
          axpy_shared<D>(acc, ds, qs + ii * D);
        } else {
          axpy_shared<D>(acc, p * mask, dys + ii * D);
        }
      }
    }
  }
  const std::int64_t out_heads = d.heads + 2 * d.kv_heads;
  const std::int64_t head = kWantDk ? d.heads + kvh : d.heads + d.kv_heads + kvh;
  if (active) store_row(out + ((b * out_heads + head) * d.t + j) * D, acc);
}

dim3 tiled_grid(std::int64_t heads, std::int64_t t) {
  MEMPLAN_CHECK(heads <= 0x7fffffffLL && t <= 0x7fffffffLL, "attention too large for the CUDA kernels");
  return dim3(static_cast<unsigned>(heads), static_cast<unsigned>((t + kRows - 1) / kRows));
}

// An operand of the working dtype T (f32, bf16 or f16); the log-sum-exp and delta rows are f32.
template <typename T>
const T* typed(const TensorRef& r) {
  return static_cast<const T*>(r.data);
}
template <typename T>
T* typed_out(const TensorRef& r) {
  return static_cast<T*>(r.data);
}

template <typename T, int D>
void launch_tiled_lse(const KernelCall& c, const TiledArgs& a) {
  attention_lse_tiled<T, D><<<tiled_grid(a.d.batch * a.d.heads, a.d.t), kRows, 0, stream()>>>(
      typed<T>(c.inputs[0]), typed<T>(c.inputs[1]), c.outputs[0].f32(), a);
  check_launch("attention_lse");
}

template <typename T, int D>
void launch_tiled_forward(const KernelCall& c, const TiledArgs& a) {
  attention_tiled<T, D><<<tiled_grid(a.d.batch * a.d.heads, a.d.t), kRows, 0, stream()>>>(
      typed<T>(c.inputs[0]), typed<T>(c.inputs[1]), typed<T>(c.inputs[2]), c.inputs[3].f32(), typed_out<T>(c.outputs[0]),
      a);
  check_launch("attention");
}

template <typename T, int D>
void launch_tiled_backward(const KernelCall& c, const TiledArgs& a) {
  const T* dy = typed<T>(c.inputs[0]);
  const T* q = typed<T>(c.inputs[1]);
  const T* k = typed<T>(c.inputs[2]);
  const T* v = typed<T>(c.inputs[3]);
  const float* lse = c.inputs[4].f32();
  const float* delta = c.inputs[5].f32();
  T* out = typed_out<T>(c.outputs[0]);
  attention_backward_dq_tiled<T, D><<<tiled_grid(a.d.batch * a.d.heads, a.d.t), kRows, 0, stream()>>>(
      dy, q, k, v, lse, delta, out, a);
  check_launch("attention_backward (dq)");
  const dim3 keys = tiled_grid(a.d.batch * a.d.kv_heads, a.d.t);
  attention_backward_dkdv_tiled<T, D, true><<<keys, kRows, 0, stream()>>>(dy, q, k, v, lse, delta, out, a);
  check_launch("attention_backward (dk)");
  attention_backward_dkdv_tiled<T, D, false><<<keys, kRows, 0, stream()>>>(dy, q, k, v, lse, delta, out, a);
  check_launch("attention_backward (dv)");
}

TiledArgs tiled_args(const KernelCall& c, const Dims& d) {
  const float drop = c.attrs->dropout;
  return {d, c.attrs->alpha, c.attrs->softcap, drop, drop > 0.0f ? dropout_keep_scale(drop) : 1.0f, c.attrs->causal,
          c.attrs->window, dropout_stream(c.attrs->seed, c.step)};
}

// Runs Launch<T, 16|32|64>::run(c, args) for a tiled head size; false for any other.
template <typename T, template <typename, int> class Launch>
bool dispatch_tiled(const KernelCall& c, const Dims& d) {
  const TiledArgs a = tiled_args(c, d);
  switch (d.d) {
    case 16: Launch<T, 16>::run(c, a); return true;
    case 32: Launch<T, 32>::run(c, a); return true;
    case 64: Launch<T, 64>::run(c, a); return true;
    default: return false;
  }
}
template <typename T, int D> struct LseLaunch { static void run(const KernelCall& c, const TiledArgs& a) { launch_tiled_lse<T, D>(c, a); } };
template <typename T, int D> struct ForwardLaunch { static void run(const KernelCall& c, const TiledArgs& a) { launch_tiled_forward<T, D>(c, a); } };
template <typename T, int D> struct BackwardLaunch { static void run(const KernelCall& c, const TiledArgs& a) { launch_tiled_backward<T, D>(c, a); } };

// --- per-row kernels (any head size) ----------------------------------------------------------------
// A thread owns a row (a query row forward and for dq, a key row for dk and dv) and walks the keys
// (queries) in index order, recomputing each probability from the saved log-sum-exp. At f32 it
// sums into its output row in place; at 16 bits into kChunk channels at a time in registers,
// recomputing the row's probabilities for each chunk, so each 16-bit output is rounded once.
// Either way each channel's sum runs in the same order.
constexpr int kChunk = 32;

// out[x] = sum over keys.first <= j < keys.end, in order, of w(j) * rows[j * width + x], for x < width; a zero
// weight is skipped when `skip_zero`. At f32 the sums are made in `out` itself, one pass over j;
// at 16 bits kChunk channels at a time in registers (w recomputed for each chunk), each output
// rounded once.
template <typename T, typename W>
__device__ void weighted_row_sum(T* out, const T* rows, std::int64_t width, KeyRange keys, bool skip_zero, const W& w) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t x = 0; x < width; ++x) out[x] = 0.0f;
    for (std::int64_t j = keys.first; j < keys.end; ++j) {
      const float wj = w(j);
      if (skip_zero && wj == 0.0f) continue;
      for (std::int64_t x = 0; x < width; ++x) out[x] += wj * rows[j * width + x];
    }
  } else {
    for (std::int64_t x0 = 0; x0 < width; x0 += kChunk) {
      const int n = static_cast<int>(min(std::int64_t(kChunk), width - x0));
      float acc[kChunk];
      for (int x = 0; x < kChunk; ++x) acc[x] = 0.0f;
      for (std::int64_t j = keys.first; j < keys.end; ++j) {
        const float wj = w(j);
        if (skip_zero && wj == 0.0f) continue;
        for (int x = 0; x < n; ++x) acc[x] += wj * to_f32(rows[j * width + x0 + x]);
      }
      for (int x = 0; x < n; ++x) out[x0 + x] = from_f32<T>(acc[x]);
    }
  }
}

template <typename T>
__device__ void forward_row(const TiledArgs& a, const T* q, const T* k, const T* v, const float* lse, T* y,
                            std::int64_t row) {
  const Dims& d = a.d;
  const std::int64_t i = row % d.t, bh = row / d.t;
  const T* qi = q + row * d.d;
  const T* kh = k + kv_base(d, bh);
  const T* vh = v + kv_base(d, bh);
  T* yi = y + row * d.d;
  const KeyRange keys = visible_keys(i, d.t, a.causal, a.window);
  const auto prob = [&](std::int64_t j) {
    float p = expf(capped_score(a.alpha, a.cap, dot_row(qi, kh + j * d.d, d.d)) - lse[row]);
    if (a.drop > 0.0f) p *= dropout_mask_element(a.stream_id, row * d.t + j, a.drop, a.keep);
    return p;
  };
  weighted_row_sum(yi, vh, d.d, keys, /*skip_zero=*/true, prob);
}

// dq_i = sum_j ds_ij k_j into the packed output's query head.
template <typename T>
__device__ void dq_row(const TiledArgs& a, const T* dy, const T* q, const T* k, const T* v, const float* lse,
                       const float* delta, T* out, std::int64_t row) {
  const Dims& d = a.d;
  const std::int64_t i = row % d.t, bh = row / d.t, b = bh / d.heads, h = bh % d.heads;
  const std::int64_t out_heads = d.heads + 2 * d.kv_heads;
  const T* qi = q + row * d.d;
  const T* dyi = dy + row * d.d;
  const T* kh = k + kv_base(d, bh);
  const T* vh = v + kv_base(d, bh);
  T* dq = out + (b * out_heads + h) * d.t * d.d + i * d.d;
  const KeyRange keys = visible_keys(i, d.t, a.causal, a.window);
  const auto ds_at = [&](std::int64_t j) {
    const float raw = dot_row(qi, kh + j * d.d, d.d);
    const float p = expf(capped_score(a.alpha, a.cap, raw) - lse[row]);
    const float mask = a.drop > 0.0f ? dropout_mask_element(a.stream_id, row * d.t + j, a.drop, a.keep) : 1.0f;
    return score_slope(a.alpha, a.cap, raw) * p * (dot_row(dyi, vh + j * d.d, d.d) * mask - delta[row]);
  };
  weighted_row_sum(dq, kh, d.d, keys, /*skip_zero=*/false, ds_at);
}

// dk_j = sum_i ds_ij q_i and dv_j = sum_i p_ij mask_ij dy_i over the query rows of every head in
// the key's group (heads, then rows, in order), into the packed output's key and value heads.
template <typename T>
__device__ void dkdv_row(const TiledArgs& a, const T* dy, const T* q, const T* k, const T* v, const float* lse,
                         const float* delta, T* out, std::int64_t key_row) {
  const Dims& d = a.d;
  const std::int64_t j = key_row % d.t, bk = key_row / d.t, b = bk / d.kv_heads, kvh = bk % d.kv_heads;
  const std::int64_t out_heads = d.heads + 2 * d.kv_heads, head_size = d.t * d.d;
  const T* kj = k + key_row * d.d;
  const T* vj = v + key_row * d.d;
  T* dk = out + (b * out_heads + d.heads + kvh) * head_size + j * d.d;
  T* dv = out + (b * out_heads + d.heads + d.kv_heads + kvh) * head_size + j * d.d;
  // Calls f(q_i, dy_i, ds_ij, p_ij mask_ij) for every query row i that sees key j, in order.
  const auto each_query = [&](auto&& f) {
    for (std::int64_t g = 0; g < d.group; ++g) {
      const std::int64_t bh = b * d.heads + kvh * d.group + g;
      // Under a causal mask the queries j <= i (< j + window) see key j.
      const std::int64_t query_end = a.causal && a.window > 0 ? min(d.t, j + a.window) : d.t;
      for (std::int64_t i = a.causal ? j : 0; i < query_end; ++i) {
        const std::int64_t row = bh * d.t + i;
        const T* qi = q + row * d.d;
        const T* dyi = dy + row * d.d;
        const float raw = dot_row(qi, kj, d.d);
        const float p = expf(capped_score(a.alpha, a.cap, raw) - lse[row]);
        const float mask = a.drop > 0.0f ? dropout_mask_element(a.stream_id, row * d.t + j, a.drop, a.keep) : 1.0f;
        const float ds = score_slope(a.alpha, a.cap, raw) * p * (dot_row(dyi, vj, d.d) * mask - delta[row]);
        f(qi, dyi, ds, p * mask);
      }
    }
  };
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t x = 0; x < d.d; ++x) dk[x] = dv[x] = 0.0f;
    each_query([&](const float* qi, const float* dyi, float ds, float kept) {
      for (std::int64_t x = 0; x < d.d; ++x) {
        dv[x] += kept * dyi[x];
        dk[x] += ds * qi[x];
      }
    });
  } else {
    for (std::int64_t x0 = 0; x0 < d.d; x0 += kChunk) {
      const int width = static_cast<int>(min(std::int64_t(kChunk), d.d - x0));
      float acc_k[kChunk], acc_v[kChunk];
      for (int x = 0; x < kChunk; ++x) acc_k[x] = acc_v[x] = 0.0f;
      each_query([&](const T* qi, const T* dyi, float ds, float kept) {
        for (int x = 0; x < width; ++x) {
          acc_v[x] += kept * to_f32(dyi[x0 + x]);
          acc_k[x] += ds * to_f32(qi[x0 + x]);
        }
      });
      for (int x = 0; x < width; ++x) {
        dk[x0 + x] = from_f32<T>(acc_k[x]);
        dv[x0 + x] = from_f32<T>(acc_v[x]);
      }
    }
  }
}

template <typename T>
void attention_lse_rows(const KernelCall& c, const Dims& d) {
  const T* q = typed<T>(c.inputs[0]);
  const T* k = typed<T>(c.inputs[1]);
  float* lse = c.outputs[0].f32();
  const float alpha = c.attrs->alpha, cap = c.attrs->softcap;
  const bool causal = c.attrs->causal;
  const std::int64_t window = c.attrs->window;
  for_each_index(c.outputs[0].numel(), "attention_lse", [=] __device__(std::int64_t row) {
    const std::int64_t i = row % d.t, bh = row / d.t;
    const T* qi = q + row * d.d;
    const T* kh = k + kv_base(d, bh);
    const KeyRange keys = visible_keys(i, d.t, causal, window);
    float m = -INFINITY, l = 0.0f;  // online softmax: running max and sum of exp(s - max)
    for (std::int64_t j = keys.first; j < keys.end; ++j) {
      const float s = capped_score(alpha, cap, dot_row(qi, kh + j * d.d, d.d));
      const float new_m = fmaxf(m, s);
      l = l * expf(m - new_m) + expf(s - new_m);
      m = new_m;
    }
    lse[row] = m + logf(l);
  });
}

template <typename T>
void attention_rows(const KernelCall& c, const Dims& d) {
  const TiledArgs a = tiled_args(c, d);
  const T* q = typed<T>(c.inputs[0]);
  const T* k = typed<T>(c.inputs[1]);
  const T* v = typed<T>(c.inputs[2]);
  const float* lse = c.inputs[3].f32();
  T* y = typed_out<T>(c.outputs[0]);
  for_each_index(c.inputs[3].numel(), "attention", [=] __device__(std::int64_t row) { forward_row<T>(a, q, k, v, lse, y, row); });
}

template <typename T>
void attention_backward_rows(const KernelCall& c, const Dims& d) {
  const TiledArgs a = tiled_args(c, d);
  const T* dy = typed<T>(c.inputs[0]);
  const T* q = typed<T>(c.inputs[1]);
  const T* k = typed<T>(c.inputs[2]);
  const T* v = typed<T>(c.inputs[3]);
  const float* lse = c.inputs[4].f32();
  const float* delta = c.inputs[5].f32();
  T* out = typed_out<T>(c.outputs[0]);
  for_each_index(c.inputs[4].numel(), "attention_backward (dq)",
                 [=] __device__(std::int64_t row) { dq_row<T>(a, dy, q, k, v, lse, delta, out, row); });
  for_each_index(d.batch * d.kv_heads * d.t, "attention_backward (dk, dv)",
                 [=] __device__(std::int64_t key_row) { dkdv_row<T>(a, dy, q, k, v, lse, delta, out, key_row); });
}

// The kernels at the call's working dtype (q's): f32, bf16 or f16.
template <typename T>
void attention_lse_at(const KernelCall& c) {
  const Dims d = dims_of(*c.inputs[0].shape, *c.inputs[1].shape);
  if (!dispatch_tiled<T, LseLaunch>(c, d)) attention_lse_rows<T>(c, d);
}
template <typename T>
void attention_at(const KernelCall& c) {
  const Dims d = dims_of(*c.inputs[0].shape, *c.inputs[1].shape);
  if (!dispatch_tiled<T, ForwardLaunch>(c, d)) attention_rows<T>(c, d);
}
template <typename T>
void attention_backward_at(const KernelCall& c) {
  const Dims d = dims_of(*c.inputs[1].shape, *c.inputs[2].shape);
  if (!dispatch_tiled<T, BackwardLaunch>(c, d)) attention_backward_rows<T>(c, d);
}

// Calls Run<T>::run(c) for the storage type of `working`'s dtype, which the first `operands`
// inputs and the output share (the graph's rows give q, k, v, dy and the outputs one dtype).
template <template <typename> class Run>
void at_working_dtype(const KernelCall& c, const TensorRef& working, std::size_t operands) {
  for (std::size_t i = 0; i < operands; ++i) {
    MEMPLAN_CHECK(c.inputs[i].dtype == working.dtype, graph::op_name(c.kind) << ": operand " << i << " is "
                                                                           << graph::dtype_name(c.inputs[i].dtype) << ", not "
                                                                           << graph::dtype_name(working.dtype));
  }
  MEMPLAN_CHECK(c.kind == OpKind::attention_lse || c.outputs[0].dtype == working.dtype,
                graph::op_name(c.kind) << ": the output is not " << graph::dtype_name(working.dtype));
  switch (working.dtype) {
    case graph::DType::bf16: return Run<__nv_bfloat16>::run(c);
    case graph::DType::f16: return Run<__half>::run(c);
    default: return Run<float>::run(c);
  }
}
template <typename T> struct LseAt { static void run(const KernelCall& c) { attention_lse_at<T>(c); } };
template <typename T> struct ForwardAt { static void run(const KernelCall& c) { attention_at<T>(c); } };
template <typename T> struct BackwardAt { static void run(const KernelCall& c) { attention_backward_at<T>(c); } };

void k_attention_lse(const KernelCall& c) { at_working_dtype<LseAt>(c, c.inputs[0], 2); }
void k_attention(const KernelCall& c) { at_working_dtype<ForwardAt>(c, c.inputs[0], 3); }
void k_attention_backward(const KernelCall& c) { at_working_dtype<BackwardAt>(c, c.inputs[1], 4); }

void k_attention_backward_dot(const KernelCall& c) {
  const std::int64_t cols = c.inputs[0].shape->cols();
  const In dy = in(c.inputs[0]);
  const In y = in(c.inputs[1]);
  float* delta = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "attention_backward_dot", [=] __device__(std::int64_t r) {
    double s = 0.0;
    for (std::int64_t x = 0; x < cols; ++x) s += double(dy[r * cols + x]) * double(y[r * cols + x]);
    delta[r] = float(s);
  });
}

// y = x[start, start + length) along `axis`, as [outer, extent, inner].
void k_slice(const KernelCall& c) {
  const graph::Shape& s = *c.inputs[0].shape;
  std::int64_t inner = 1;
  for (int i = static_cast<int>(c.attrs->axis) + 1; i < s.rank(); ++i) inner *= s[i];
  const std::int64_t extent = s[static_cast<int>(c.attrs->axis)], start = c.attrs->start, length = c.attrs->length;
  const In x = in(c.inputs[0]);
  const Out y = out(c.outputs[0]);
  for_each_index(c.outputs[0].numel(), "slice", [=] __device__(std::int64_t e) {
    const std::int64_t within = e % inner, a = (e / inner) % length, o = e / (inner * length);
    y.set(e, x[(o * extent + start + a) * inner + within]);
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

// Every kernel here computes every dtype.
KernelEntries attention_16bit_kernel_entries() { return at_16_bits(attention_kernel_entries()); }

}  // namespace memplan::kernels::cuda
