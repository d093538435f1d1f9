// 16-bit floats (bf16 and IEEE binary16) to and from f32, bit for bit as the hardware converts:
// narrowing rounds to nearest, ties to even; NaN stays NaN (quiet), infinities stay infinite, and
// f16 overflows to infinity past its largest value. The scalar forms are host-and-device inline;
// the array forms (the CPU's, vectorised by the compiler, on the thread pool for long arrays)
// serve the executor and the CPU kernels that compute 16-bit ops in f32.
#pragma once

#include <cstdint>
#include <cstring>

#include "memplan/graph/tensor.h"

namespace memplan::kernels {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_to_f32(std::uint16_t h) { return bits_float(std::uint32_t{h} << 16); }

inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  // Both results computed and one selected, so the compiler vectorises array loops (a blend).
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float f16_to_f32(std::uint16_t h);
inline std::uint16_t f32_to_f16(float f);
// f rounded to `dtype` (to nearest, ties to even) and back: f itself at f32.
inline float round_to(graph::DType dtype, float f) {
  if (dtype == graph::DType::bf16) return bf16_to_f32(f32_to_bf16(f));
  if (dtype == graph::DType::f16) return f16_to_f32(f32_to_f16(f));
  return f;
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {
    // Zero and subnormals: mantissa * 2^-24, exact in f32.
    return bits_float(sign | float_bits(static_cast<float>(mantissa) * 5.9604644775390625e-8f));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (a < 0x38800000u) {
    // Below f16's smallest normal (2^-14): adding 0.5 puts the f16 subnormal's bits, rounded to
    // nearest even by the f32 addition itself, at the bottom of the sum's mantissa.
    const float sum = bits_float(a) + 0.5f;
    return static_cast<std::uint16_t>(sign | (float_bits(sum) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  const std::uint32_t odd = (a >> 13) & 1u;
  return static_cast<std::uint16_t>(sign | ((a + 0xc8000fffu + odd) >> 13));
}

// `count` elements of `dtype` (f32, bf16 or f16) at `src` as f32 at `dst`, and back. f32 copies.
void widen_to_f32(graph::DType dtype, const void* src, float* dst, std::int64_t count);
void narrow_from_f32(graph::DType dtype, const float* src, void* dst, std::int64_t count);

}  // namespace memplan::kernels
