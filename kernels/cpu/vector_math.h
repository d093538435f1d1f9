// exp and erf for float written as straight-line arithmetic (polynomials, a bit-built power of
// two, selects instead of branches), so loops over them vectorise; the scalar remainder of a
// loop computes exactly what a vector lane does (every multiply-add is an explicit fma when the
// target has one), so an element's value never depends on its position or address.
// Accuracy against float64: exp within 1 ulp on [-87, 88]; erf within 2.5 ulp
// (kernels/cpu/fit_erf.py fits the coefficients and measures the error).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace memplan::kernels::cpu {

// a * b + c, fused where the target has FMA (then the scalar and vector forms agree bit for bit).
inline float madd(float a, float b, float c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// e^x for x in [-87.3, 88.3] (clamped there): x = n ln2 + r, |r| <= ln2/2, e^r by its Taylor
// polynomial of degree 7 (truncation below 6e-9), 2^n built in the exponent bits.
inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = madd(x, 1.44269504088896341f, kShifter);
  const float n = t - kShifter;
  // n as the low bits of an unsigned difference: no signed overflow even for NaN or infinity.
  const std::uint32_t ni = std::bit_cast<std::uint32_t>(t) - std::bit_cast<std::uint32_t>(kShifter);
  float r = madd(-n, 0.693145751953125f, x);  // ln 2 in two parts: the first exact in n * hi
  r = madd(-n, 1.42860682030941723e-6f, r);
  float p = 1.0f / 5040.0f;
  p = madd(p, r, 1.0f / 720.0f);
  p = madd(p, r, 1.0f / 120.0f);
  p = madd(p, r, 1.0f / 24.0f);
  p = madd(p, r, 1.0f / 6.0f);
  p = madd(p, r, 0.5f);
  p = madd(p, r, 1.0f);
  p = madd(p, r, 1.0f);
  return p * std::bit_cast<float>((ni + 127u) << 23);
}

// erf(x): x P(x^2) below 1, 1 - e^(-x^2) Q(1/x) from 1 to 4 (erf is 1 in float beyond).
inline float erf_approx(float x) {
  const float a = std::fabs(x);
  const float s = a * a;
  float p = 7.971016757e-05f;
  p = madd(p, s, -8.043364017e-04f);
  p = madd(p, s, 5.191832086e-03f);
  p = madd(p, s, -2.685550856e-02f);
  p = madd(p, s, 1.128362203e-01f);
  p = madd(p, s, -3.761262873e-01f);
  p = madd(p, s, 1.128379166e+00f);
  const float small = a * p;
  const float c = a < 1.0f ? 1.0f : (a > 4.0f ? 4.0f : a);
  const float v = (1.0f / c - 0.625f) * (1.0f / 0.375f);
  float q = -2.197840035e-06f;
  q = madd(q, v, 3.661126789e-06f);
  q = madd(q, v, 2.663167771e-06f);
  q = madd(q, v, -2.775358395e-05f);
  q = madd(q, v, 1.194963079e-04f);
  q = madd(q, v, -3.483389346e-04f);
  q = madd(q, v, 4.616008044e-04f);
  q = madd(q, v, 2.308077448e-03f);
  q = madd(q, v, -2.424304037e-02f);
  q = madd(q, v, 1.433564107e-01f);
  q = madd(q, v, 3.059529928e-01f);
  const float c2 = c * c;
#ifdef __FMA__
  const float c2_lo = std::fma(c, c, -c2);  // c^2 = c2 + c2_lo exactly: e^-(c^2) to float accuracy
#else
  const float c2_lo = 0.0f;
#endif
  const float e = exp_approx(-c2) * (1.0f - c2_lo);
  const float large = madd(-e, q, 1.0f);
  const float r = a < 1.0f ? small : large;
  return std::copysign(r, x);
}

}  // namespace memplan::kernels::cpu
