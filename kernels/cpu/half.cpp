// The array conversions of kernels/half.h on the CPU: plain loops over the scalar forms, which the
// compiler vectorises (bf16 is a shift; f16 selects among its cases branch-free), split over the
// thread pool for long arrays. Each element's result depends on that element alone, so the
// thread count changes no bit.
#include <algorithm>
#include <cstring>

#include "memplan/kernels/half.h"
#include "memplan/kernels/cpu/parallel.h"

namespace memplan::kernels {

void widen_to_f32(graph::DType dtype, const void* src, float* dst, std::int64_t count) {
  if (dtype == graph::DType::f32) {
    if (dst != src) std::memmove(dst, src, static_cast<std::size_t>(count) * sizeof(float));
    return;
  }
  const auto* h = static_cast<const std::uint16_t*>(src);
  if (dtype == graph::DType::bf16) {
    cpu::parallel_ranges(count, 1, [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) dst[i] = bf16_to_f32(h[i]);
    });
  } else {
    cpu::parallel_ranges(count, 1, [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) dst[i] = f16_to_f32(h[i]);
    });
  }
}

void narrow_from_f32(graph::DType dtype, const float* src, void* dst, std::int64_t count) {
  if (dtype == graph::DType::f32) {
    if (dst != src) std::memmove(dst, src, static_cast<std::size_t>(count) * sizeof(float));
    return;
  }
  auto* h = static_cast<std::uint16_t*>(dst);
  if (dtype == graph::DType::bf16) {
    cpu::parallel_ranges(count, 1, [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) h[i] = f32_to_bf16(src[i]);
    });
  } else {
    cpu::parallel_ranges(count, 1, [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) h[i] = f32_to_f16(src[i]);
    });
  }
}

}  // namespace memplan::kernels
