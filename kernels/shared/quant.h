// Dequantizing the weights quant_matmul reads (graph/quantize.h gives the layouts): the
// arithmetic every backend shares, one row of the weight at a time. Host and device code.
#pragma once

#include <cmath>
#include <cstdint>

#include "memplan/common/host_device.h"
#include "memplan/graph/op.h"
#include "memplan/kernels/kernel.h"

namespace memplan::kernels {

// NF4's code values (QLoRA's normal-float quantiles as bitsandbytes stores them) and FP4's
// (bitsandbytes' e2m1 table, divided by its largest value 12), index = the 4-bit code.
MEMPLAN_HD inline float nf4_value(unsigned code) {
  constexpr float kNf4[16] = {-1.0f,
                              -0.6961928009986877f,
                              -0.5250730514526367f,
                              -0.39491748809814453f,
                              -0.28444138169288635f,
                              -0.18477343022823334f,
                              -0.09105003625154495f,
                              0.0f,
                              0.07958029955625534f,
                              0.16093020141124725f,
                              0.24611230194568634f,
                              0.33791524171829224f,
                              0.44070982933044434f,
                              0.5626170039176941f,
                              0.7229568362236023f,
                              1.0f};
  return kNf4[code & 15u];
}
MEMPLAN_HD inline float fp4_value(unsigned code) {
  constexpr float kFp4[16] = {0.0f,  0.0625f / 12,  8.0f / 12,  12.0f / 12,  4.0f / 12,  6.0f / 12,  2.0f / 12,  3.0f / 12,
                              -0.0f, -0.0625f / 12, -8.0f / 12, -12.0f / 12, -4.0f / 12, -6.0f / 12, -2.0f / 12, -3.0f / 12};
  return kFp4[code & 15u];
}

// bitsandbytes' dynamic 8-bit maps (create_dynamic_map), 256 values sorted ascending. Signed:
// 127 positive and 127 negative values, 10^(i-6) times the midpoints of 2^i + 1 points evenly
// from 0.1 to 1 for i = 0..6, with 0 and 1; double quantization's absmax codes and 8-bit Adam's
// first moment index it. Unsigned (signed=False; 8-bit Adam's second moment): 254 positive
// values, 2^(i+1) midpoints of 2^(i+1) + 1 points per decade i = 0..6, with 0 and 1.
MEMPLAN_HD inline float dynamic_map_value(unsigned code, bool is_signed = true) {
  // The k-th positive (k = 0 smallest) of a map whose decade i holds `first << i` midpoints.
  auto positive = [](unsigned k, unsigned first) {
    unsigned i = 0, start = 0;
    while (k >= start + (first << i)) start += first << i++;
    const unsigned j = k - start;                   // index within the decade
    const double n = double(first << i);            // midpoints in the decade
    const double step = 0.9 / n;                    // linspace(0.1, 1, n + 1)
    const double mid = 0.1 + step * (double(j) + 0.5);
    double scale = 1.0;
    for (unsigned e = i; e < 6; ++e) scale *= 0.1;  // 10^(i - 6)
    return float(scale * mid);
  };
  code &= 255u;
  if (code == 255u) return 1.0f;
  if (!is_signed) return code == 0u ? 0.0f : positive(code - 1u, 2u);
  // Signed, sorted: codes 0..126 the negatives (most negative first), 127 zero, 128..254 the
  // positives.
  if (code == 127u) return 0.0f;
  if (code > 127u) return positive(code - 128u, 1u);
  return -positive(126u - code, 1u);
}

// The code whose value in `map` (256 ascending values) is nearest x, a tie taking the smaller
// code: a binary search, as bnb's quantize kernels do.
MEMPLAN_HD inline unsigned nearest_code(const float* map, float x) {
  if (!(x > map[0])) return 0u;
  if (x >= map[255]) return 255u;
  unsigned lo = 0u, hi = 255u;  // map[lo] < x <= map[hi]
  while (hi - lo > 1u) {
    const unsigned mid = (lo + hi) / 2u;
    if (map[mid] < x) lo = mid;
    else hi = mid;
  }
  return x - map[lo] <= map[hi] - x ? lo : hi;
}

// Where a quant_matmul's storage is: its operands after x, in the layout's order.
struct QuantView {
  graph::QuantFormat format = graph::QuantFormat::none;
  bool double_quant = false;
  std::int64_t out = 0, in = 0, group_size = 0;
  const std::uint8_t* data = nullptr;
  const void* scales = nullptr;   // absmax f32 (or u8 codes), row scales, the scale, or f16 group scales
  const float* absmax2 = nullptr;
  const float* offset = nullptr;
  const std::uint8_t* zeros = nullptr;
  const std::int32_t* g_idx = nullptr;
};

// The storage a quant_matmul call reads: its operands after x, in the layout's order.
inline QuantView quant_view(const KernelCall& c) {
  const graph::OpAttrs& a = *c.attrs;
  QuantView q;
  q.format = a.quant;
  q.double_quant = a.double_quant;
  q.out = a.shape[0];
  q.in = a.shape[1];
  q.group_size = a.group_size;
  q.data = static_cast<const std::uint8_t*>(c.inputs[1].data);
  q.scales = c.inputs[2].data;
  if (q.double_quant) {
    q.absmax2 = static_cast<const float*>(c.inputs[3].data);
    q.offset = static_cast<const float*>(c.inputs[4].data);
  }
  return q;
}
// Whether the kernels compute this format (fp8, gptq and awq are planned only).
inline bool kernels_compute(graph::QuantFormat f) {
  return f == graph::QuantFormat::nf4 || f == graph::QuantFormat::fp4 || f == graph::QuantFormat::int8;
}

// The 4-bit code of element `i` of a packed array: element 2k in byte k's high nibble, 2k + 1 in
// its low one (bitsandbytes' order).
MEMPLAN_HD inline unsigned nibble(const std::uint8_t* packed, std::int64_t i) {
  const unsigned byte = packed[i >> 1];
  return (i & 1) ? (byte & 15u) : (byte >> 4);
}

// Element i of the weight's flat [out * in] values.
MEMPLAN_HD inline float dequantize_element(const QuantView& q, std::int64_t i) {
  switch (q.format) {
    case graph::QuantFormat::nf4:
    case graph::QuantFormat::fp4: {
      const std::int64_t block = i / 64;
      float absmax;
      if (q.double_quant) {
        const std::uint8_t code = static_cast<const std::uint8_t*>(q.scales)[block];
        absmax = dynamic_map_value(code) * q.absmax2[block / 256] + q.offset[0];
      } else {
        absmax = static_cast<const float*>(q.scales)[block];
      }
      const unsigned c = nibble(q.data, i);
      return (q.format == graph::QuantFormat::nf4 ? nf4_value(c) : fp4_value(c)) * absmax;
    }
    case graph::QuantFormat::int8: {
      const auto v = static_cast<std::int8_t>(q.data[i]);
      return float(v) * static_cast<const float*>(q.scales)[i / q.in] / 127.0f;
    }
    default: return NAN;  // planned only (fp8, gptq, awq): train refuses them before a kernel runs
  }
}

}  // namespace memplan::kernels
