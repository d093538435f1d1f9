// The array conversions of kernels/half.h on the CPU: loops over the scalar forms, which the
// compiler vectorises for bf16 (a shift and an add); f16 uses the CPU's F16C instructions where
// the build targets them (-march=native on x86), whose results are the scalar forms' bit for bit.
// Long arrays split over the thread pool. Each element's result depends on that element alone, so the
// thread count changes no bit.
#include <algorithm>
#include <cstring>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

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
      std::int64_t i = begin;
#if defined(__F16C__) && defined(__AVX__)
      // The CPU's own conversion (exact, as the scalar form), eight at a time.
      for (; i + 8 <= end; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
      }
#endif
      for (; i < end; ++i) dst[i] = f16_to_f32(h[i]);
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
      std::int64_t i = begin;
#if defined(__F16C__) && defined(__AVX__)
      // Rounding to nearest even, as the scalar form (tests/mixed_precision_test.cpp checks both).
      for (; i + 8 <= end; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#endif
      for (; i < end; ++i) h[i] = f32_to_f16(src[i]);
    });
  }
}

}  // namespace memplan::kernels
