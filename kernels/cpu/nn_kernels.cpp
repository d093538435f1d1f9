// CPU kernels for convolutional nets (im2col + GEMM, pooling, batch norm) and transformers
// (layer norm, embedding, batched matmul, softmax, permute, dropout). Every reduction runs in a
// fixed order: parallel loops split only over independent outputs (samples, planes, channels,
// rows), so results never depend on the thread count or on where tensors live.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "memplan/common/check.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/cpu/vector_math.h"
#include "memplan/kernels/shared/attention_mask.h"
#include "memplan/kernels/shared/dropout.h"
#include "memplan/kernels/shared/grouped_conv.h"
#include "memplan/kernels/shared/pooling.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;
using graph::Shape;


// x [N, C, ...] as (N, C, S): S = elements per (sample, channel).
struct Nc {
  std::int64_t n, c, s;
};
Nc nc_of(const Shape& x) { return {x[0], x[1], x.numel() / (x[0] * x[1])}; }

// --- convolution ----------------------------------------------------------------------------

// Output columns [lo, hi) whose input column ow*S + kw*D - P lies inside [0, W).
struct ValidRange {
  std::int64_t lo, hi;
};
ValidRange valid_columns(const Window& g, std::int64_t kw) {
  const std::int64_t tap = kw * g.dil - g.pad_w;
  std::int64_t lo = 0;
  while (lo < g.ow && lo * g.stride + tap < 0) ++lo;
  std::int64_t hi = g.ow;
  while (hi > lo && (hi - 1) * g.stride + tap >= g.w) --hi;
  return {lo, hi};
}

// Grouped convolution and its gradients: one output element per iteration, each a fixed-order
// sum (kernels/shared/grouped_conv.h, the loops the CUDA kernels run).
void k_grouped_conv2d(const KernelCall& c) {
  const GroupedConv g = grouped_conv_of(*c.inputs[0].shape, *c.inputs[1].shape, *c.attrs);
  const float* x = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_each(n, 1, [&](std::int64_t i) { y[i] = grouped_conv_output(x, w, g, i); });
}

void k_grouped_conv2d_backward_input(const KernelCall& c) {
  const GroupedConv g = grouped_conv_of(*c.outputs[0].shape, *c.inputs[1].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_each(n, 1, [&](std::int64_t i) { dx[i] = grouped_conv_input_grad(dy, w, g, i); });
}

void k_grouped_conv2d_backward_weight(const KernelCall& c) {
  const GroupedConv g = grouped_conv_of(*c.inputs[1].shape, *c.outputs[0].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dw = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_each(n, kChunkElements, [&](std::int64_t i) { dw[i] = grouped_conv_weight_grad(dy, x, g, i); });
}

// cols[n][(c*K + kh)*K + kw][oh*OW + ow] = x[n][c][oh*S + kh*D - P][ow*S + kw*D - P], 0 outside.
// Squeeze-and-excitation: plane (n, c) of x times g[n, c]; the gate's gradient sums each plane's
// dy * x in index order, in double.
void k_channel_scale(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  const float* x = c.inputs[0].f32();
  const float* g = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  parallel_each(d.n * d.c, elements_per(c.outputs[0].numel(), d.n * d.c), [&](std::int64_t plane) {
    const float gate = g[plane];
    for (std::int64_t i = plane * d.s; i < (plane + 1) * d.s; ++i) y[i] = x[i] * gate;
  });
}

void k_channel_scale_backward(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[1].shape);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dg = c.outputs[0].f32();
  parallel_each(d.n * d.c, elements_per(c.inputs[0].numel(), d.n * d.c), [&](std::int64_t plane) {
    double s = 0.0;
    for (std::int64_t i = plane * d.s; i < (plane + 1) * d.s; ++i) s += double(dy[i]) * double(x[i]);
    dg[plane] = static_cast<float>(s);
  });
}

#if defined(__AVX512F__)
// Stride-1 windows a row of 16 lanes at a time, with masks for the image's edges (AVX-512 masked
// loads touch no masked-off element, so a row read may start before the plane or end after it).

// The lanes l of the chunk at j0 with lo <= j0 + l < hi.
inline __mmask16 lane_mask(std::int64_t lo, std::int64_t hi, std::int64_t j0) {
  const std::int64_t a = std::clamp<std::int64_t>(lo - j0, 0, 16), b = std::clamp<std::int64_t>(hi - j0, 0, 16);
  return b <= a ? __mmask16{0} : static_cast<__mmask16>(((1u << b) - 1u) & ~((1u << a) - 1u));
}
// p + elems as an address only (it may lie outside the array; the masked lanes never read there).
inline const float* shifted(const float* p, std::int64_t elems) {
  return reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(p) +
                                        static_cast<std::uintptr_t>(elems * std::int64_t{sizeof(float)}));
}

// One tap's row of columns (im2col_tap), stride 1: chunk by chunk, its masks made once.
void im2col_tap_stride1(const Window& g, const float* src, std::int64_t kh, std::int64_t kw, float* dst) {
  const std::int64_t shift = kw * g.dil - g.pad_w;  // iw = ow + shift
  const std::int64_t oh_lo = std::clamp<std::int64_t>(g.pad - kh * g.dil, 0, g.oh);  // rows inside the image
  const std::int64_t oh_hi = std::clamp<std::int64_t>(g.h + g.pad - kh * g.dil, oh_lo, g.oh);
  for (std::int64_t j0 = 0; j0 < g.ow; j0 += 16) {
    const __mmask16 load = lane_mask(-shift, g.w - shift, j0), store = lane_mask(0, g.ow, j0);
    float* out = dst + j0;
    for (std::int64_t oh = 0; oh < oh_lo; ++oh) _mm512_mask_storeu_ps(out + oh * g.ow, store, _mm512_setzero_ps());
    const float* in = shifted(src, (oh_lo + kh * g.dil - g.pad) * g.w + j0 + shift);
    for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh, in += g.w) {
      _mm512_mask_storeu_ps(out + oh * g.ow, store, _mm512_maskz_loadu_ps(load, in));
    }
    for (std::int64_t oh = oh_hi; oh < g.oh; ++oh) _mm512_mask_storeu_ps(out + oh * g.ow, store, _mm512_setzero_ps());
  }
}

// Each output row is summed in registers over the taps in (kh, kw) order, the order the scalar
// loop adds them in; a tap that misses a pixel leaves its lane as it is. Chunk by chunk, with
// the taps' masks made once per chunk.
void col2im_plane_stride1(const Window& g, const float* src_plane, float* dst) {
  const std::int64_t p = g.oh * g.ow;
  constexpr std::int64_t kMaxTaps = 16;  // masks kept for kernels up to 16 wide
  __mmask16 masks[kMaxTaps];
  for (std::int64_t j0 = 0; j0 < g.w; j0 += 16) {
    const __mmask16 store = lane_mask(0, g.w, j0);
    auto mask = [&](std::int64_t kw) {
      const std::int64_t shift = kw * g.dil - g.pad_w;  // ow = iw - shift
      return static_cast<__mmask16>(lane_mask(shift, g.ow + shift, j0) & store);
    };
    for (std::int64_t kw = 0; kw < std::min(g.k_w, kMaxTaps); ++kw) masks[kw] = mask(kw);
    for (std::int64_t ih = 0; ih < g.h; ++ih) {
      __m512 acc = _mm512_setzero_ps();
      for (std::int64_t kh = 0; kh < g.k; ++kh) {
        const std::int64_t oh = ih - kh * g.dil + g.pad;
        if (oh < 0 || oh >= g.oh) continue;
        for (std::int64_t kw = 0; kw < g.k_w; ++kw) {
          const __mmask16 m = kw < kMaxTaps ? masks[kw] : mask(kw);
          const float* row = src_plane + (kh * g.k_w + kw) * p + oh * g.ow;
          acc = _mm512_mask_add_ps(acc, m, acc, _mm512_maskz_loadu_ps(m, shifted(row, j0 - (kw * g.dil - g.pad_w))));
        }
      }
      _mm512_mask_storeu_ps(dst + ih * g.w + j0, store, acc);
    }
  }
}
#endif

// Tap (kh, kw)'s row of one (sample, channel) plane's columns: dst[oh * OW + ow] is the pixel
// the tap reads for output (oh, ow), zero in the padding.
void im2col_tap(const Window& g, const float* src, std::int64_t kh, std::int64_t kw, float* dst) {
#if defined(__AVX512F__)
  if (g.stride == 1) return im2col_tap_stride1(g, src, kh, kw, dst);
#endif
  const ValidRange v = valid_columns(g, kw);
  for (std::int64_t oh = 0; oh < g.oh; ++oh) {
    const std::int64_t ih = oh * g.stride + kh * g.dil - g.pad;
    float* row = dst + oh * g.ow;
    if (ih < 0 || ih >= g.h) {
      std::fill(row, row + g.ow, 0.0f);
      continue;
    }
    std::fill(row, row + v.lo, 0.0f);
    const float* in = src + ih * g.w + v.lo * g.stride + kw * g.dil - g.pad_w;
    if (g.stride == 1) {
      std::copy(in, in + (v.hi - v.lo), row + v.lo);
    } else {
      for (std::int64_t ow = v.lo; ow < v.hi; ++ow) row[ow] = in[(ow - v.lo) * g.stride];
    }
    std::fill(row + v.hi, row + g.ow, 0.0f);
  }
}

// One (sample, channel) plane's rows of the columns, at `dst_plane`; planes are independent.
void im2col_plane(const Window& g, const float* src, float* dst_plane) {
  const std::int64_t p = g.oh * g.ow;
  for (std::int64_t kh = 0; kh < g.k; ++kh) {
    for (std::int64_t kw = 0; kw < g.k_w; ++kw) im2col_tap(g, src, kh, kw, dst_plane + (kh * g.k_w + kw) * p);
  }
}

// Rows [r0, r1) of one sample's columns (row r: channel r / (K K_W), tap r % (K K_W)) at dst + r * P.
void im2col_rows(const Window& g, const float* x_sample, std::int64_t r0, std::int64_t r1, float* dst) {
  const std::int64_t kk = g.k * g.k_w, p = g.oh * g.ow;
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t c = r / kk, tap = r % kk;
    im2col_tap(g, x_sample + c * g.h * g.w, tap / g.k_w, tap % g.k_w, dst + r * p);
  }
}

void k_im2col(const KernelCall& c) {
  const Window g = window_of(*c.inputs[0].shape, *c.attrs);
  const float* x = c.inputs[0].f32();
  float* cols = c.outputs[0].f32();
  const std::int64_t kkp = g.k * g.k_w * g.oh * g.ow;
  parallel_each(g.n * g.c, kkp, [&](std::int64_t plane) { im2col_plane(g, x + plane * g.h * g.w, cols + plane * kkp); });
}

// The adjoint of im2col: each (sample, channel) plane sums its columns in (kh, kw, oh, ow) order
// (with a dilation several taps reach one pixel; they add up in that order too). `src` holds the
// plane's K*K rows of columns, `dst` its H*W pixels.
void col2im_plane(const Window& g, const float* src_plane, float* dst) {
#if defined(__AVX512F__)
  if (g.stride == 1) return col2im_plane_stride1(g, src_plane, dst);
#endif
  const std::int64_t p = g.oh * g.ow;
  std::fill(dst, dst + g.h * g.w, 0.0f);
  for (std::int64_t kh = 0; kh < g.k; ++kh) {
    for (std::int64_t kw = 0; kw < g.k_w; ++kw) {
      const float* src = src_plane + (kh * g.k_w + kw) * p;
      const ValidRange v = valid_columns(g, kw);
      for (std::int64_t oh = 0; oh < g.oh; ++oh) {
        const std::int64_t ih = oh * g.stride + kh * g.dil - g.pad;
        if (ih < 0 || ih >= g.h) continue;
        float* out = dst + ih * g.w + v.lo * g.stride + kw * g.dil - g.pad_w;
        const float* row = src + oh * g.ow;
        if (g.stride == 1) {
          for (std::int64_t ow = v.lo; ow < v.hi; ++ow) out[ow - v.lo] += row[ow];
        } else {
          for (std::int64_t ow = v.lo; ow < v.hi; ++ow) out[(ow - v.lo) * g.stride] += row[ow];
        }
      }
    }
  }
}

void k_col2im(const KernelCall& c) {
  const Window g = window_of(*c.outputs[0].shape, *c.attrs);
  const float* cols = c.inputs[0].f32();
  float* x = c.outputs[0].f32();
  parallel_each(g.n * g.c, elements_per(c.inputs[0].numel(), g.n * g.c), [&](std::int64_t plane) {
    col2im_plane(g, cols + plane * g.k * g.k_w * g.oh * g.ow, x + plane * g.h * g.w);
  });
}

// Images of fewer output positions than this go through Eigen: small_gemm's 32-column tiles
// waste too much of a narrow image (bench/results/gemm_blas.md, one thread: 7x7 at 48 GFLOP/s
// against Eigen's 110; 14x14 at 113 against 104; 28x28 at 184 against 63).
constexpr std::int64_t kSmallGemmMinColumns = 128;

// One sample's products: y [Cout, P] = w [Cout, CKK] cols [CKK, P], and dcols [CKK, P] = w^T dy.
void conv_image(std::int64_t cout, std::int64_t ckk, std::int64_t p, const float* w, const float* cols, float* y) {
  if (p >= kSmallGemmMinColumns) small_gemm(cout, p, ckk, w, ckk, 1, cols, p, y, p);
  else gemm(false, false, cout, p, ckk, w, cols, y);
}
void conv_cols_image(std::int64_t cout, std::int64_t ckk, std::int64_t p, const float* w, const float* dy, float* dcols) {
  if (p >= kSmallGemmMinColumns) small_gemm(ckk, p, cout, w, 1, ckk, dy, p, dcols, p);
  else gemm(true, false, ckk, p, cout, w, dy, dcols);
}

// y[n] [Cout, P] = w [Cout, CKK] cols[n] [CKK, P]; one register-tiled product per sample
// (small_gemm, or Eigen for narrow images), samples in parallel.
void k_conv2d(const KernelCall& c) {
  const Shape& cs = *c.inputs[0].shape;
  const std::int64_t n = cs[0], ckk = cs[1], p = cs[2];
  const std::int64_t cout = (*c.inputs[1].shape)[0];
  const float* cols = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  parallel_each(n, kChunkElements,
                [&](std::int64_t i) { conv_image(cout, ckk, p, w, cols + i * ckk * p, y + i * cout * p); });
}

// dw [Cout, CKK] = sum_n dy[n] [Cout, P] cols[n]^T (batched_gemm_nt: threads split dw's tiles,
// each summing the samples in a fixed order).
void k_conv2d_backward_weight(const KernelCall& c) {
  const Shape& cs = *c.inputs[1].shape;
  const std::int64_t n = cs[0], ckk = cs[1], p = cs[2];
  const std::int64_t cout = (*c.inputs[0].shape)[1];
  batched_gemm_nt(n, cout, ckk, p, c.inputs[0].f32(), c.inputs[1].f32(), c.outputs[0].f32(), c.accumulate);
}

// dcols[n] [CKK, P] = w^T dy[n].
void k_conv2d_backward_cols(const KernelCall& c) {
  const Shape& ds = *c.outputs[0].shape;
  const std::int64_t n = ds[0], ckk = ds[1], p = ds[2];
  const std::int64_t cout = (*c.inputs[1].shape)[0];
  const float* dy = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* dcols = c.outputs[0].f32();
  parallel_each(n, kChunkElements,
                [&](std::int64_t i) { conv_cols_image(cout, ckk, p, w, dy + i * cout * p, dcols + i * ckk * p); });
}

// --- fused pairs (kernels/kernel.h: find_fused_kernel) ----------------------------------------
// Each runs two adjacent ops sample by sample, so the columns one writes are read back by the
// other while they are in cache instead of after the whole batch. Every value is computed by the
// same code in the same order as the two kernels one after the other (their loops split only
// over independent samples, planes and tiles of the result), so the results are bitwise equal.
// The columns are the kernel's scratch: no other op reads them (the executor checks), so each
// thread reuses a sample-sized slot of them instead of writing them in full.

// im2col(x) -> cols, then conv2d(cols, w) -> y. cols has no other reader (the weight gradient
// rebuilds them: grad_conv2d in graph/op_conv_pool.cpp; FusedKernel::first_output_is_scratch): each thread makes
// its sample's columns in its own sample-sized slot of cols, where the product reads them from
// the cache.
void k_im2col_then_conv2d(const KernelCall& a, const KernelCall& b) {
  const Window g = window_of(*a.inputs[0].shape, *a.attrs);
  const float* x = a.inputs[0].f32();
  float* cols = a.outputs[0].f32();
  const std::int64_t ckk = g.c * g.k * g.k_w, p = g.oh * g.ow;
  const std::int64_t cout = (*b.inputs[1].shape)[0];
  const float* w = b.inputs[1].f32();
  float* y = b.outputs[0].f32();
  // A chunk's slot is below the loop's chunk count, at most g.n: a sample slot of cols.
  parallel_for(g.n, 1, [&](std::int64_t begin, std::int64_t end, int thread_slot) {
    float* slot = cols + thread_slot * ckk * p;
    for (std::int64_t i = begin; i < end; ++i) {
      for (std::int64_t c = 0; c < g.c; ++c) im2col_plane(g, x + (i * g.c + c) * g.h * g.w, slot + c * g.k * g.k_w * p);
      conv_image(cout, ckk, p, w, slot, y + i * cout * p);
    }
  });
}

// im2col(x) -> cols, then conv2d_backward_weight(dy, cols) -> dw: cols has no other reader, and
// each thread makes the rows of the columns its tiles of dw need, pass by pass, into the first
// sample slots of cols (batched_gemm_nt_filled).
void k_im2col_then_conv2d_backward_weight(const KernelCall& a, const KernelCall& b) {
  const Window g = window_of(*a.inputs[0].shape, *a.attrs);
  const float* x = a.inputs[0].f32();
  float* cols = a.outputs[0].f32();
  const std::int64_t ckk = g.c * g.k * g.k_w, p = g.oh * g.ow;
  const std::int64_t cout = (*b.inputs[0].shape)[1];
  const RowFill fill = [&](std::int64_t s, std::int64_t r0, std::int64_t r1, float* dst) {
    im2col_rows(g, x + s * g.c * g.h * g.w, r0, r1, dst);
  };
  batched_gemm_nt_filled(g.n, cout, ckk, p, b.inputs[0].f32(), cols, b.outputs[0].f32(), fill);
}

// Columns a thread keeps per wave of the backward pair below: about what its L2 cache holds.
constexpr std::int64_t kWaveBytes = 512 * 1024;

// conv2d_backward_cols(dy, w) -> dcols, then col2im(dcols) -> dx. dcols has no other reader
// (FusedKernel::first_output_is_scratch): each thread keeps its sample's columns in its own
// sample-sized slot of it, so they stay in cache instead of going out to memory and back. In
// waves of a few samples a thread (FusedKernel::sample_waves): the wave's dy samples are all read
// before any of its dx samples is written, the waves in the order that never overwrites a dy
// sample still to be read where dx is planned over dy.
void k_conv2d_backward_cols_then_col2im(const KernelCall& a, const KernelCall& b) {
  const Window g = window_of(*b.outputs[0].shape, *b.attrs);
  const float* dy = a.inputs[0].f32();
  const float* w = a.inputs[1].f32();
  float* dcols = a.outputs[0].f32();
  float* dx = b.outputs[0].f32();
  const std::int64_t ckk = g.c * g.k * g.k_w, p = g.oh * g.ow;
  const std::int64_t cout = (*a.inputs[1].shape)[0];
  const SampleOrder order = sample_wave_order(dx, b.outputs[0].numel() * std::int64_t{sizeof(float)}, dy,
                                              a.inputs[0].numel() * std::int64_t{sizeof(float)}, g.n);
  MEMPLAN_CHECK(order != SampleOrder::none, "dx overlaps samples of dy it would overwrite before they are read");
  // A wave holds a few samples a thread (as many as fit kWaveBytes of columns), each in the slot
  // of dcols at its place in the wave.
  const std::int64_t per_thread = std::max<std::int64_t>(1, kWaveBytes / (ckk * p * std::int64_t{sizeof(float)}));
  const std::int64_t wave_size = std::min(g.n, per_thread * parallel_threads());
  for (std::int64_t wave = 0; wave < g.n; wave += wave_size) {
    const std::int64_t size = std::min(wave_size, g.n - wave);
    const auto sample = [&](std::int64_t j) {
      return order == SampleOrder::ascending ? wave + j : g.n - 1 - (wave + j);
    };
    parallel_each(size, kChunkElements, [&](std::int64_t j) {
      conv_cols_image(cout, ckk, p, w, dy + sample(j) * cout * p, dcols + j * ckk * p);
    });
    // Every dy sample of the wave is read before any dx sample of it is written.
    parallel_each(size, kChunkElements, [&](std::int64_t j) {
      for (std::int64_t c = 0; c < g.c; ++c) {
        col2im_plane(g, dcols + (j * g.c + c) * g.k * g.k_w * p, dx + (sample(j) * g.c + c) * g.h * g.w);
      }
    });
  }
}

// --- pooling ------------------------------------------------------------------------------

// Max pooling and its backward take each window's element by window_argmax (kernels/shared/
// pooling.h), the tie-break the CUDA kernels share.
void k_max_pool2d(const KernelCall& c) {
  const Window g = window_of(*c.inputs[0].shape, *c.attrs);
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  parallel_each(g.n * g.c, elements_per(c.inputs[0].numel(), g.n * g.c), [&](std::int64_t plane) {
    const float* src = x + plane * g.h * g.w;
    for (std::int64_t oh = 0; oh < g.oh; ++oh) {
      for (std::int64_t ow = 0; ow < g.ow; ++ow) y[(plane * g.oh + oh) * g.ow + ow] = src[window_argmax(src, g, oh, ow)];
    }
  });
}

void k_max_pool2d_backward(const KernelCall& c) {
  const Window g = window_of(*c.inputs[1].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  parallel_each(g.n * g.c, elements_per(c.inputs[1].numel(), g.n * g.c), [&](std::int64_t plane) {
    const float* src = x + plane * g.h * g.w;
    float* dst = dx + plane * g.h * g.w;
    std::fill(dst, dst + g.h * g.w, 0.0f);
    for (std::int64_t oh = 0; oh < g.oh; ++oh) {
      for (std::int64_t ow = 0; ow < g.ow; ++ow) dst[window_argmax(src, g, oh, ow)] += dy[(plane * g.oh + oh) * g.ow + ow];
    }
  });
}

void k_avg_pool2d(const KernelCall& c) {
  const Window g = window_of(*c.inputs[0].shape, *c.attrs);
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const float inv = 1.0f / static_cast<float>(g.k * g.k);
  parallel_each(g.n * g.c, elements_per(c.inputs[0].numel(), g.n * g.c), [&](std::int64_t plane) {
    const float* src = x + plane * g.h * g.w;
    for (std::int64_t oh = 0; oh < g.oh; ++oh) {
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        float s = 0.0f;
        for (std::int64_t kh = 0; kh < g.k; ++kh) {
          for (std::int64_t kw = 0; kw < g.k; ++kw) s += src[(oh * g.stride + kh) * g.w + ow * g.stride + kw];
        }
        y[(plane * g.oh + oh) * g.ow + ow] = s * inv;
      }
    }
  });
}

void k_avg_pool2d_backward(const KernelCall& c) {
  const Window g = window_of(*c.outputs[0].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  float* dx = c.outputs[0].f32();
  const float inv = 1.0f / static_cast<float>(g.k * g.k);
  parallel_each(g.n * g.c, elements_per(c.outputs[0].numel(), g.n * g.c), [&](std::int64_t plane) {
    float* dst = dx + plane * g.h * g.w;
    std::fill(dst, dst + g.h * g.w, 0.0f);
    for (std::int64_t oh = 0; oh < g.oh; ++oh) {
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        const float v = dy[(plane * g.oh + oh) * g.ow + ow] * inv;
        for (std::int64_t kh = 0; kh < g.k; ++kh) {
          for (std::int64_t kw = 0; kw < g.k; ++kw) dst[(oh * g.stride + kh) * g.w + ow * g.stride + kw] += v;
        }
      }
    }
  });
}

void k_global_avg_pool(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  parallel_each(d.n * d.c, elements_per(c.inputs[0].numel(), d.n * d.c), [&](std::int64_t plane) {
    double s = 0.0;
    for (std::int64_t i = 0; i < d.s; ++i) s += x[plane * d.s + i];
    y[plane] = static_cast<float>(s / double(d.s));
  });
}

void k_global_avg_pool_backward(const KernelCall& c) {
  const Nc d = nc_of(*c.outputs[0].shape);
  const float* dy = c.inputs[0].f32();
  float* dx = c.outputs[0].f32();
  const float inv = 1.0f / static_cast<float>(d.s);
  parallel_each(d.n * d.c, elements_per(c.outputs[0].numel(), d.n * d.c), [&](std::int64_t plane) {
    std::fill(dx + plane * d.s, dx + (plane + 1) * d.s, dy[plane] * inv);
  });
}

// --- batch norm: x [N, C, S]; statistics [2, C] = (mean, biased variance) ------------------

// Per channel: sum over (n, s) of f(ch, plane offset + i) in double, in eight lanes (lane i % 8 of
// each plane, samples in order), the lanes then added in order: fixed by the shape alone, and
// the lanes let the loop vectorise.
constexpr int kSumLanes = 8;
template <typename F>
double channel_sum_of(const Nc& d, std::int64_t ch, F term) {
  double lanes[kSumLanes] = {};
  for (std::int64_t n = 0; n < d.n; ++n) {
    const std::int64_t base = (n * d.c + ch) * d.s;
    std::int64_t i = 0;
    for (; i + kSumLanes <= d.s; i += kSumLanes) {
      for (int l = 0; l < kSumLanes; ++l) lanes[l] += term(base + i + l);
    }
    for (int l = 0; i < d.s; ++i, ++l) lanes[l] += term(base + i);
  }
  double sum = 0.0;
  for (double l : lanes) sum += l;
  return sum;
}

void k_batch_norm_stats(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  const float* x = c.inputs[0].f32();
  float* stats = c.outputs[0].f32();
  const double count = double(d.n * d.s);
  parallel_each(d.c, elements_per(c.inputs[0].numel(), d.c), [&](std::int64_t ch) {
    const double mean = channel_sum_of(d, ch, [=](std::int64_t i) { return double(x[i]); }) / count;
    const double sq = channel_sum_of(d, ch, [=](std::int64_t i) { return (x[i] - mean) * (x[i] - mean); });
    stats[ch] = static_cast<float>(mean);
    stats[d.c + ch] = static_cast<float>(sq / count);
  });
}

// The mean comes from the input (every rank's, averaged); the deviation about it is this rank's,
// accumulated in double as in k_batch_norm_stats.
void k_batch_norm_centered_stats(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  const float* x = c.inputs[0].f32();
  const float* centre = c.inputs[1].f32();
  float* stats = c.outputs[0].f32();
  const double count = double(d.n * d.s);
  parallel_each(d.c, elements_per(c.inputs[0].numel(), d.c), [&](std::int64_t ch) {
    const double mean = centre[ch];
    double sq = 0.0;
    for (std::int64_t n = 0; n < d.n; ++n) {
      const float* p = x + (n * d.c + ch) * d.s;
      for (std::int64_t i = 0; i < d.s; ++i) sq += (p[i] - mean) * (p[i] - mean);
    }
    stats[ch] = centre[ch];
    stats[d.c + ch] = static_cast<float>(sq / count);
  });
}

// y = x * scale[c] + shift[c] with scale = gamma * rstd, shift = beta - mean * scale.
void normalize_channels(const Nc& d, const float* x, const float* mean, const float* var, const float* gamma,
                        const float* beta, float eps, float* y) {
  parallel_each(d.n * d.c, d.s, [&](std::int64_t plane) {
    const std::int64_t ch = plane % d.c;
    const float rstd = 1.0f / std::sqrt(var[ch] + eps);
    const float scale = gamma[ch] * rstd;
    const float shift = beta[ch] - mean[ch] * scale;
    const float* src = x + plane * d.s;
    float* dst = y + plane * d.s;
    for (std::int64_t i = 0; i < d.s; ++i) dst[i] = src[i] * scale + shift;
  });
}

void k_batch_norm(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  const float* stats = c.inputs[1].f32();
  normalize_channels(d, c.inputs[0].f32(), stats, stats + d.c, c.inputs[2].f32(), c.inputs[3].f32(),
                     c.attrs->norm_eps, c.outputs[0].f32());
}

void k_batch_norm_inference(const KernelCall& c) {
  normalize_channels(nc_of(*c.inputs[0].shape), c.inputs[0].f32(), c.inputs[1].f32(), c.inputs[2].f32(),
                     c.inputs[3].f32(), c.inputs[4].f32(), c.attrs->norm_eps, c.outputs[0].f32());
}

// PyTorch's running statistics: new = (1 - m) * old + m * batch, with the unbiased variance.
void k_running_stats_update(const KernelCall& c) {
  const std::int64_t channels = (*c.inputs[0].shape)[1];
  const float* stats = c.inputs[0].f32();
  float* mean = c.updates[0].f32();
  float* var = c.updates[1].f32();
  const float m = c.attrs->momentum, unbias = c.attrs->alpha;
  for (std::int64_t ch = 0; ch < channels; ++ch) {
    mean[ch] = (1.0f - m) * mean[ch] + m * stats[ch];
    var[ch] = (1.0f - m) * var[ch] + m * (stats[channels + ch] * unbias);
  }
}

// Per channel: channel_sum_of f(ch, offset), as float.
template <typename F>
void per_channel_sum(const Nc& d, float* out, F term) {
  parallel_each(d.c, d.n * d.s, [&](std::int64_t ch) {
    out[ch] = static_cast<float>(channel_sum_of(d, ch, [&](std::int64_t i) { return term(ch, i); }));
  });
}

void k_channel_sum(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  per_channel_sum(nc_of(*c.inputs[0].shape), c.outputs[0].f32(), [=](std::int64_t, std::int64_t i) { return double(x[i]); });
}

void k_batch_norm_dgamma(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[1].shape);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  const float* stats = c.inputs[2].f32();
  const float eps = c.attrs->norm_eps;
  parallel_each(d.c, d.n * d.s, [&](std::int64_t ch) {
    const float rstd = 1.0f / std::sqrt(stats[d.c + ch] + eps), mean = stats[ch];
    c.outputs[0].f32()[ch] = static_cast<float>(
        channel_sum_of(d, ch, [=](std::int64_t i) { return double(dy[i]) * double((x[i] - mean) * rstd); }));
  });
}

// dx = gamma * rstd * (dy - dbeta / M - xhat * dgamma / M), M = N * S.
void k_batch_norm_backward(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[1].shape);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  const float* stats = c.inputs[2].f32();
  const float* gamma = c.inputs[3].f32();
  const float* dgamma = c.inputs[4].f32();
  const float* dbeta = c.inputs[5].f32();
  float* dx = c.outputs[0].f32();
  const float eps = c.attrs->norm_eps;
  const float inv_m = 1.0f / static_cast<float>(d.n * d.s);
  parallel_each(d.n * d.c, d.s, [&](std::int64_t plane) {
    const std::int64_t ch = plane % d.c;
    const float mean = stats[ch];
    const float rstd = 1.0f / std::sqrt(stats[d.c + ch] + eps);
    const float k = gamma[ch] * rstd;
    const float db = dbeta[ch] * inv_m, dg = dgamma[ch] * inv_m;
    for (std::int64_t i = plane * d.s; i < (plane + 1) * d.s; ++i) {
      const float xhat = (x[i] - mean) * rstd;
      dx[i] = k * (dy[i] - db - xhat * dg);
    }
  });
}

// --- layer norm: statistics [rows, 2] = (mean, rstd) -------------------------------------

// sum over j < n of term(j) in double, in eight lanes (lane j % 8) added in order at the end: the
// order is set by n alone, and the lanes let the loop vectorise.
template <typename F>
double lane_sum(std::int64_t n, F term) {
  double lanes[kSumLanes] = {};
  std::int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) lanes[l] += term(j + l);
  }
  for (int l = 0; j < n; ++j, ++l) lanes[l] += term(j);
  double sum = 0.0;
  for (double l : lanes) sum += l;
  return sum;
}

void k_layer_norm_stats(const KernelCall& c) {
  const std::int64_t rows = c.inputs[0].shape->rows(), cols = c.inputs[0].shape->cols();
  const float* x = c.inputs[0].f32();
  float* stats = c.outputs[0].f32();
  const double eps = c.attrs->norm_eps;
  parallel_each(rows, cols, [&](std::int64_t r) {
    const float* row = x + r * cols;
    const double mean = lane_sum(cols, [=](std::int64_t j) { return double(row[j]); }) / double(cols);
    const double sq = lane_sum(cols, [=](std::int64_t j) { return (row[j] - mean) * (row[j] - mean); });
    stats[2 * r] = static_cast<float>(mean);
    stats[2 * r + 1] = static_cast<float>(1.0 / std::sqrt(sq / double(cols) + eps));
  });
}

void k_layer_norm(const KernelCall& c) {
  const std::int64_t rows = c.inputs[0].shape->rows(), cols = c.inputs[0].shape->cols();
  const float* x = c.inputs[0].f32();
  const float* stats = c.inputs[1].f32();
  const float* gamma = c.inputs[2].f32();
  const float* beta = c.inputs[3].f32();
  float* y = c.outputs[0].f32();
  parallel_each(rows, cols, [&](std::int64_t r) {
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    for (std::int64_t j = 0; j < cols; ++j) y[r * cols + j] = (x[r * cols + j] - mean) * rstd * gamma[j] + beta[j];
  });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = gamma * dy, per row.
void k_layer_norm_backward(const KernelCall& c) {
  const std::int64_t rows = c.inputs[1].shape->rows(), cols = c.inputs[1].shape->cols();
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  const float* stats = c.inputs[2].f32();
  const float* gamma = c.inputs[3].f32();
  float* dx = c.outputs[0].f32();
  parallel_each(rows, cols, [&](std::int64_t r) {
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const double sum_g = lane_sum(cols, [=](std::int64_t j) { return double(gamma[j] * dyr[j]); });
    const double sum_gx =
        lane_sum(cols, [=](std::int64_t j) { return double(gamma[j] * dyr[j]) * double((xr[j] - mean) * rstd); });
    const float mg = static_cast<float>(sum_g / double(cols)), mgx = static_cast<float>(sum_gx / double(cols));
    for (std::int64_t j = 0; j < cols; ++j) {
      const float xhat = (xr[j] - mean) * rstd;
      dx[r * cols + j] = rstd * (gamma[j] * dyr[j] - mg - xhat * mgx);
    }
  });
}

// Column sums in row order; threads split the columns.
constexpr std::int64_t kColumnBlock = 64;

void k_layer_norm_dgamma(const KernelCall& c) {
  const std::int64_t rows = c.inputs[1].shape->rows(), cols = c.inputs[1].shape->cols();
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  const float* stats = c.inputs[2].f32();
  float* dg = c.outputs[0].f32();
  const std::int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  parallel_each(blocks, elements_per(rows * cols, blocks), [&](std::int64_t blk) {
    const std::int64_t j0 = blk * kColumnBlock, j1 = std::min(cols, j0 + kColumnBlock);
    std::fill(dg + j0, dg + j1, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float mean = stats[2 * r], rstd = stats[2 * r + 1];
      for (std::int64_t j = j0; j < j1; ++j) dg[j] += dy[r * cols + j] * ((x[r * cols + j] - mean) * rstd);
    }
  });
}

// --- embedding ----------------------------------------------------------------------------

// The gather of rows `table` [vocab, dim] holds; a vocabulary-parallel slice (attrs world > 1)
// holds ids [start, start + vocab) and gives zero rows for the others.
template <typename T>
void gather_rows(const KernelCall& c, const T* table, T* y) {
  const std::int32_t* ids = c.inputs[0].i32();
  const std::int64_t vocab = (*c.inputs[1].shape)[0], dim = (*c.inputs[1].shape)[1];
  const bool sliced = c.attrs->world > 1;
  const std::int64_t start = sliced ? c.attrs->start : 0;
  const std::int64_t n = c.inputs[0].numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t row = std::int64_t{ids[i]} - start;
    if (sliced && (row < 0 || row >= vocab)) {
      std::fill(y + i * dim, y + (i + 1) * dim, T{0});
      continue;
    }
    MEMPLAN_CHECK(row >= 0 && row < vocab, "embedding id " << ids[i] << " outside [0, " << vocab << ")");
    std::copy(table + row * dim, table + (row + 1) * dim, y + i * dim);
  }
}

void k_embedding(const KernelCall& c) { gather_rows(c, c.inputs[1].f32(), c.outputs[0].f32()); }

// The 16-bit gather: the table's rows copied as they are (no arithmetic, so no f32 copy of a
// vocabulary-sized table); bitwise what widening and rounding back would give.
void k_embedding_16bit(const KernelCall& c) {
  gather_rows(c, static_cast<const std::uint16_t*>(c.inputs[1].data), static_cast<std::uint16_t*>(c.outputs[0].data));
}

// Rows of dy added into dtable in id-position order: repeated ids sum deterministically. A call
// for a slice of the table's rows (KernelCall::first_row) sums the positions whose id is in it.
void k_embedding_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const std::int32_t* ids = c.inputs[1].i32();
  float* dt = c.outputs[0].f32();
  const std::int64_t rows = (*c.outputs[0].shape)[0], dim = (*c.outputs[0].shape)[1];
  std::fill(dt, dt + c.outputs[0].numel(), 0.0f);
  const std::int64_t n = c.inputs[1].numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t r = ids[i] - c.first_row - (c.attrs->world > 1 ? c.attrs->start : 0);
    if (r < 0 || r >= rows) continue;
    float* row = dt + r * dim;
    for (std::int64_t j = 0; j < dim; ++j) row[j] += dy[i * dim + j];
  }
}

// --- T5's relative attention bias ---------------------------------------------------------

// Walks the (query i, key j) pairs of a [Tq, Tk] block diagonal by diagonal (distance d = j - i
// ascending, i ascending), so each distance's bucket is computed once: f(bucket, i, j).
template <typename F>
void for_each_relative_pair(const graph::OpAttrs& a, F&& f) {
  const std::int64_t tq = a.shape[0], tk = a.shape[1];
  for (std::int64_t d = -(tq - 1); d < tk; ++d) {
    const std::int64_t bucket = graph::relative_position_bucket(d, a.bidirectional, a.buckets, a.max_distance);
    for (std::int64_t i = std::max<std::int64_t>(0, -d); i < tq && i + d < tk; ++i) f(bucket, i, i + d);
  }
}

void k_relative_position_bias(const KernelCall& c) {
  const float* table = c.inputs[0].f32();
  const std::int64_t heads = (*c.inputs[0].shape)[1], tq = c.attrs->shape[0], tk = c.attrs->shape[1];
  float* y = c.outputs[0].f32();
  parallel_each(heads, tq * tk, [&](std::int64_t h) {
    float* yh = y + h * tq * tk;
    for_each_relative_pair(*c.attrs, [&](std::int64_t bucket, std::int64_t i, std::int64_t j) {
      yh[i * tk + j] = table[bucket * heads + h];
    });
  });
}

// Each head's column of the table on its own thread, in the contract's order: the sums do not
// depend on the thread count.
void k_relative_position_bias_backward(const KernelCall& c) {
  const float* dy = c.inputs[0].f32();
  const std::int64_t heads = (*c.inputs[0].shape)[0], tq = c.attrs->shape[0], tk = c.attrs->shape[1];
  float* dt = c.outputs[0].f32();
  std::fill(dt, dt + c.outputs[0].numel(), 0.0f);
  parallel_each(heads, tq * tk, [&](std::int64_t h) {
    const float* dyh = dy + h * tq * tk;
    for_each_relative_pair(*c.attrs, [&](std::int64_t bucket, std::int64_t i, std::int64_t j) {
      dt[bucket * heads + h] += dyh[i * tk + j];
    });
  });
}

// --- attention ----------------------------------------------------------------------------

void k_batched_matmul(const KernelCall& c) {
  const Shape& a = *c.inputs[0].shape;
  const Shape& out = *c.outputs[0].shape;
  const int r = out.rank();
  const std::int64_t m = out[r - 2], n = out[r - 1];
  const std::int64_t k = c.attrs->trans_a ? a[r - 2] : a[r - 1];
  const std::int64_t batch = out.numel() / (m * n);
  const float* pa = c.inputs[0].f32();
  const float* pb = c.inputs[1].f32();
  float* pc = c.outputs[0].f32();
  const bool ta = c.attrs->trans_a, tb = c.attrs->trans_b;
  parallel_each(batch, kChunkElements,
                [&](std::int64_t i) { gemm(ta, tb, m, n, k, pa + i * m * k, pb + i * k * n, pc + i * m * n); });
}

void k_softmax(const KernelCall& c) {
  const Shape& s = *c.inputs[0].shape;
  const std::int64_t rows = s.rows(), cols = s.cols();
  const bool causal = c.attrs->causal;
  const std::int64_t t = causal ? s[s.rank() - 2] : 1, window = c.attrs->window;
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  parallel_each(rows, cols, [&](std::int64_t r) {
    // Row i of its [T, T] block sees j <= i (and j > i - window); without a mask, every column.
    const KeyRange keys = causal ? visible_keys(r % t, t, true, window) : KeyRange{0, cols};
    const std::int64_t first = keys.first, end = keys.end;
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float max = *std::max_element(xr + first, xr + end);
#pragma omp simd
    for (std::int64_t j = first; j < end; ++j) yr[j] = exp_approx(xr[j] - max);
    double z = 0.0;
    for (std::int64_t j = first; j < end; ++j) z += yr[j];
    const float inv = static_cast<float>(1.0 / z);
#pragma omp simd
    for (std::int64_t j = first; j < end; ++j) yr[j] *= inv;
    std::fill(yr, yr + first, 0.0f);
    std::fill(yr + end, yr + cols, 0.0f);
  });
}

void k_softmax_backward(const KernelCall& c) {
  const std::int64_t rows = c.inputs[1].shape->rows(), cols = c.inputs[1].shape->cols();
  const float* dy = c.inputs[0].f32();
  const float* y = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  parallel_each(rows, cols, [&](std::int64_t r) {
    double dot = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) dot += double(dy[r * cols + j]) * double(y[r * cols + j]);
    const float d = static_cast<float>(dot);
    for (std::int64_t j = 0; j < cols; ++j) dx[r * cols + j] = y[r * cols + j] * (dy[r * cols + j] - d);
  });
}

// Output rows (all dims but the last) in parallel; each row walks the input with the stride of
// the input dim that became the output's last.
void k_permute(const KernelCall& c) {
  const Shape& in = *c.inputs[0].shape;
  const Shape& out = *c.outputs[0].shape;
  const std::vector<std::int64_t>& perm = c.attrs->perm;
  const int r = in.rank();
  const std::size_t elem = static_cast<std::size_t>(graph::dtype_size(c.inputs[0].dtype));
  // The input stride of each output dimension, computed once.
  std::vector<std::int64_t> stride_of_out(static_cast<std::size_t>(r), 1);
  for (int i = 0; i < r; ++i) {
    std::int64_t s = 1;
    for (int d = static_cast<int>(perm[static_cast<std::size_t>(i)]) + 1; d < r; ++d) s *= in[d];
    stride_of_out[static_cast<std::size_t>(i)] = s;
  }
  const std::int64_t cols = r == 0 ? 1 : out[r - 1];
  const std::int64_t inner_stride = r == 0 ? 1 : stride_of_out[static_cast<std::size_t>(r - 1)];
  const std::int64_t rows = out.numel() / cols;
  const auto* src = static_cast<const std::byte*>(c.inputs[0].data);
  auto* dst = static_cast<std::byte*>(c.outputs[0].data);
  parallel_each(rows, elements_per(out.numel(), rows), [&](std::int64_t row) {
    std::int64_t rem = row, base = 0;
    for (int i = r - 2; i >= 0; --i) {
      base += (rem % out[i]) * stride_of_out[static_cast<std::size_t>(i)];
      rem /= out[i];
    }
    if (inner_stride == 1) {
      // The last dimension stays last: each output row is one contiguous input run.
      std::copy_n(src + base * static_cast<std::int64_t>(elem), cols * static_cast<std::int64_t>(elem),
                  dst + row * cols * static_cast<std::int64_t>(elem));
    } else if (elem == sizeof(float)) {
      const float* s = reinterpret_cast<const float*>(src) + base;
      float* d = reinterpret_cast<float*>(dst) + row * cols;
      for (std::int64_t j = 0; j < cols; ++j) d[j] = s[j * inner_stride];
    } else {
      for (std::int64_t j = 0; j < cols; ++j) {
        std::copy_n(src + (base + j * inner_stride) * static_cast<std::int64_t>(elem), elem,
                    dst + (row * cols + j) * static_cast<std::int64_t>(elem));
      }
    }
  });
}

// The counter-based stream of kernels/shared/dropout.h: element i's draw depends only on
// (seed, step, i), never on threads or order.
void k_dropout_mask(const KernelCall& c) {
  const float p = c.attrs->dropout;
  const float keep = dropout_keep_scale(p);
  const std::uint64_t stream = dropout_stream(c.attrs->seed, c.step);
  float* mask = c.outputs[0].f32();
  const std::int64_t n = c.outputs[0].numel();
  parallel_each(n, 1, [&](std::int64_t i) { mask[i] = dropout_mask_element(stream, i, p, keep); });
}

}  // namespace

KernelEntries nn_16bit_kernel_entries() {
  return {{OpKind::embedding, k_embedding_16bit, graph::DType::bf16}, {OpKind::embedding, k_embedding_16bit, graph::DType::f16}};
}

KernelEntries nn_kernel_entries() {
  return {
      {OpKind::im2col, k_im2col},
      {OpKind::grouped_conv2d, k_grouped_conv2d},
      {OpKind::channel_scale, k_channel_scale},
      {OpKind::channel_scale_backward, k_channel_scale_backward},
      {OpKind::grouped_conv2d_backward_input, k_grouped_conv2d_backward_input},
      {OpKind::grouped_conv2d_backward_weight, k_grouped_conv2d_backward_weight},
      {OpKind::conv2d, k_conv2d},
      {OpKind::max_pool2d, k_max_pool2d},
      {OpKind::avg_pool2d, k_avg_pool2d},
      {OpKind::global_avg_pool, k_global_avg_pool},
      {OpKind::batch_norm_stats, k_batch_norm_stats},
      {OpKind::batch_norm_centered_stats, k_batch_norm_centered_stats},
      {OpKind::batch_norm, k_batch_norm},
      {OpKind::batch_norm_inference, k_batch_norm_inference},
      {OpKind::running_stats_update, k_running_stats_update},
      {OpKind::layer_norm_stats, k_layer_norm_stats},
      {OpKind::layer_norm, k_layer_norm},
      {OpKind::embedding, k_embedding},
      {OpKind::batched_matmul, k_batched_matmul},
      {OpKind::softmax, k_softmax},
      {OpKind::permute, k_permute},
      {OpKind::dropout_mask, k_dropout_mask},
      {OpKind::conv2d_backward_weight, k_conv2d_backward_weight},
      {OpKind::conv2d_backward_cols, k_conv2d_backward_cols},
      {OpKind::col2im, k_col2im},
      {OpKind::max_pool2d_backward, k_max_pool2d_backward},
      {OpKind::avg_pool2d_backward, k_avg_pool2d_backward},
      {OpKind::global_avg_pool_backward, k_global_avg_pool_backward},
      {OpKind::batch_norm_backward, k_batch_norm_backward},
      {OpKind::batch_norm_dgamma, k_batch_norm_dgamma},
      {OpKind::channel_sum, k_channel_sum},
      {OpKind::layer_norm_backward, k_layer_norm_backward},
      {OpKind::layer_norm_dgamma, k_layer_norm_dgamma},
      {OpKind::embedding_backward, k_embedding_backward},
      {OpKind::relative_position_bias, k_relative_position_bias},
      {OpKind::relative_position_bias_backward, k_relative_position_bias_backward},
      {OpKind::softmax_backward, k_softmax_backward},
  };
}

std::vector<FusedKernelEntry> nn_fused_kernel_entries() {
  return {
      {OpKind::im2col, OpKind::conv2d, {k_im2col_then_conv2d, /*first_output_is_scratch=*/true}},
      {OpKind::im2col, OpKind::conv2d_backward_weight,
       {k_im2col_then_conv2d_backward_weight, /*first_output_is_scratch=*/true}},
      {OpKind::conv2d_backward_cols, OpKind::col2im,
       {k_conv2d_backward_cols_then_col2im, /*first_output_is_scratch=*/true, /*sample_waves=*/true}},
  };
}

}  // namespace memplan::kernels::cpu
