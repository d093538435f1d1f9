// Window geometry of im2col and pooling, and max pooling's tie-break, shared by the CPU and CUDA
// kernels: the backward pass sends each window's gradient to one element, and both devices must
// pick the same one.
#pragma once

#include <cmath>
#include <cstdint>

#include "memplan/common/host_device.h"
#include "memplan/graph/op.h"

namespace memplan::kernels {

// Input [N, C, H, W], window K x K_W (K rows; K_W columns: im2col and col2im only, pooling is
// square), stride, padding P rows and P_W columns, dilation (taps D apart: im2col and col2im
// only; pooling has D = 1); output [N, C, OH, OW].
struct Window {
  std::int64_t n, c, h, w, k, stride, pad, oh, ow, dil;
  std::int64_t k_w, pad_w;
};

inline Window window_of(const graph::Shape& x, const graph::OpAttrs& a) {
  Window g{x[0], x[1], x[2], x[3], a.kernel, a.stride, a.padding, 0, 0, a.dilation, graph::kernel_width(a),
           graph::padding_width(a)};
  g.oh = (g.h + 2 * g.pad - (a.dilation * (g.k - 1) + 1)) / g.stride + 1;
  g.ow = (g.w + 2 * g.pad_w - (a.dilation * (g.k_w - 1) + 1)) / g.stride + 1;
  return g;
}

// The tie-break: the plane offset of the window's first maximum in (kh, kw) order; padding never
// wins (it counts as -inf). A NaN is never greater, so it wins only as the first element visited.
MEMPLAN_HD inline std::int64_t window_argmax(const float* plane, const Window& g, std::int64_t oh, std::int64_t ow) {
  std::int64_t best = -1;
  float best_value = -INFINITY;
  for (std::int64_t kh = 0; kh < g.k; ++kh) {
    const std::int64_t ih = oh * g.stride + kh - g.pad;
    if (ih < 0 || ih >= g.h) continue;
    for (std::int64_t kw = 0; kw < g.k; ++kw) {
      const std::int64_t iw = ow * g.stride + kw - g.pad;
      if (iw < 0 || iw >= g.w) continue;
      const float v = plane[ih * g.w + iw];
      if (best < 0 || v > best_value) {
        best = ih * g.w + iw;
        best_value = v;
      }
    }
  }
  return best;
}

}  // namespace memplan::kernels
