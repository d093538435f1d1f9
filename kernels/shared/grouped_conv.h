// Grouped (and depthwise) convolution, computed one output element at a time by the CPU and CUDA
// kernels alike: the same loops in the same order on both devices. Channels split into `groups`
// equal groups; output channel co reads only the input channels of its group.
#pragma once

#include <cstdint>

#include "memplan/common/host_device.h"
#include "memplan/graph/op.h"

namespace memplan::kernels {

// x [N, C, H, W], w [Cout, C / groups, K, K], y [N, Cout, OH, OW]; tap (kh, kw) of output
// (oh, ow) reads x at (oh*S + kh*D - P, ow*S + kw*D - P) (D = dilation).
struct GroupedConv {
  std::int64_t n, c, h, w, cout, groups, k, stride, pad, oh, ow, dil;
  MEMPLAN_HD std::int64_t cin_per_group() const { return c / groups; }
  MEMPLAN_HD std::int64_t cout_per_group() const { return cout / groups; }
};

inline GroupedConv grouped_conv_of(const graph::Shape& x, const graph::Shape& w, const graph::OpAttrs& a) {
  GroupedConv g{x[0], x[1], x[2], x[3], w[0], a.groups, a.kernel, a.stride, a.padding, 0, 0, a.dilation};
  const std::int64_t span = a.dilation * (g.k - 1) + 1;
  g.oh = (g.h + 2 * g.pad - span) / g.stride + 1;
  g.ow = (g.w + 2 * g.pad - span) / g.stride + 1;
  return g;
}

// y at flat index i of [N, Cout, OH, OW].
MEMPLAN_HD inline float grouped_conv_output(const float* x, const float* w, const GroupedConv& g, std::int64_t i) {
  const std::int64_t ow = i % g.ow, oh = (i / g.ow) % g.oh, co = (i / (g.ow * g.oh)) % g.cout, n = i / (g.ow * g.oh * g.cout);
  const std::int64_t cin = g.cin_per_group(), first = (co / g.cout_per_group()) * cin;
  float acc = 0.0f;
  for (std::int64_t ci = 0; ci < cin; ++ci) {
    const float* plane = x + (n * g.c + first + ci) * g.h * g.w;
    const float* kernel = w + (co * cin + ci) * g.k * g.k;
    for (std::int64_t kh = 0; kh < g.k; ++kh) {
      const std::int64_t ih = oh * g.stride + kh * g.dil - g.pad;
      if (ih < 0 || ih >= g.h) continue;
      for (std::int64_t kw = 0; kw < g.k; ++kw) {
        const std::int64_t iw = ow * g.stride + kw * g.dil - g.pad;
        if (iw < 0 || iw >= g.w) continue;
        acc += plane[ih * g.w + iw] * kernel[kh * g.k + kw];
      }
    }
  }
  return acc;
}

// dx at flat index i of [N, C, H, W]: every output of its group whose window covers it.
MEMPLAN_HD inline float grouped_conv_input_grad(const float* dy, const float* w, const GroupedConv& g, std::int64_t i) {
  const std::int64_t iw = i % g.w, ih = (i / g.w) % g.h, c = (i / (g.w * g.h)) % g.c, n = i / (g.w * g.h * g.c);
  const std::int64_t cin = g.cin_per_group(), cout = g.cout_per_group();
  const std::int64_t group = c / cin, local = c % cin;
  float acc = 0.0f;
  for (std::int64_t co = group * cout; co < (group + 1) * cout; ++co) {
    const float* plane = dy + (n * g.cout + co) * g.oh * g.ow;
    const float* kernel = w + (co * cin + local) * g.k * g.k;
    for (std::int64_t kh = 0; kh < g.k; ++kh) {
      const std::int64_t th = ih + g.pad - kh * g.dil;
      if (th < 0 || th % g.stride != 0 || th / g.stride >= g.oh) continue;
      for (std::int64_t kw = 0; kw < g.k; ++kw) {
        const std::int64_t tw = iw + g.pad - kw * g.dil;
        if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.ow) continue;
        acc += plane[(th / g.stride) * g.ow + tw / g.stride] * kernel[kh * g.k + kw];
      }
    }
  }
  return acc;
}

// dw at flat index i of [Cout, C / groups, K, K]: summed over the batch and every output position.
MEMPLAN_HD inline float grouped_conv_weight_grad(const float* dy, const float* x, const GroupedConv& g, std::int64_t i) {
  const std::int64_t kw = i % g.k, kh = (i / g.k) % g.k, ci = (i / (g.k * g.k)) % g.cin_per_group();
  const std::int64_t co = i / (g.k * g.k * g.cin_per_group());
  const std::int64_t c = (co / g.cout_per_group()) * g.cin_per_group() + ci;
  float acc = 0.0f;
  for (std::int64_t n = 0; n < g.n; ++n) {
    const float* plane = x + (n * g.c + c) * g.h * g.w;
    const float* grad = dy + (n * g.cout + co) * g.oh * g.ow;
    for (std::int64_t oh = 0; oh < g.oh; ++oh) {
      const std::int64_t ih = oh * g.stride + kh * g.dil - g.pad;
      if (ih < 0 || ih >= g.h) continue;
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        const std::int64_t iw = ow * g.stride + kw * g.dil - g.pad;
        if (iw < 0 || iw >= g.w) continue;
        acc += plane[ih * g.w + iw] * grad[oh * g.ow + ow];
      }
    }
  }
  return acc;
}

}  // namespace memplan::kernels
