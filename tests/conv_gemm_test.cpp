// The convolutions' register-tiled products (kernels/cpu/conv_gemm.cpp) against a double-precision
// reference on shapes that hit every tile edge: rows not a multiple of 8 or 4, columns not a
// multiple of 16 or 32, weight-gradient chunks past 256, and the same bits at 1 and 2 threads.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/kernel.h"

namespace {

using memplan::kernels::cpu::batched_gemm_nt;
using memplan::kernels::cpu::small_gemm;

std::vector<float> conv_gemm_wave(std::size_t n, float f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * f);
  return v;
}

struct ConvGemmDims {
  std::int64_t m, n, k;
};
// {40, 203, 100}: two samples share a pass of batched_gemm_nt, then one is left; 203 rows end in
// a partial block; large enough to run on two threads.
const ConvGemmDims kConvGemmDims[] = {{16, 784, 144}, {19, 49, 37}, {5, 17, 3}, {144, 196, 16}, {9, 33, 1}, {3, 300, 600}, {40, 203, 100}};

TEST(ConvGemm, SmallGemmMatchesADoubleReferenceForAAndItsTranspose) {
  for (const ConvGemmDims& d : kConvGemmDims) {
    const auto a = conv_gemm_wave(static_cast<std::size_t>(d.m * d.k), 0.37f);
    const auto b = conv_gemm_wave(static_cast<std::size_t>(d.k * d.n), 0.11f);
    for (bool trans : {false, true}) {
      // A(r, k): a[r*k + k'] as stored [M,K], or a[k'*m + r] read as the transpose of [K,M].
      std::vector<float> c(static_cast<std::size_t>(d.m * d.n), -1.0f);
      small_gemm(d.m, d.n, d.k, a.data(), trans ? 1 : d.k, trans ? d.m : 1, b.data(), d.n, c.data(), d.n);
      for (std::int64_t i = 0; i < d.m; ++i) {
        for (std::int64_t j = 0; j < d.n; ++j) {
          double s = 0.0;
          for (std::int64_t q = 0; q < d.k; ++q) s += double(a[trans ? q * d.m + i : i * d.k + q]) * b[q * d.n + j];
          ASSERT_NEAR(c[i * d.n + j], s, 1e-5 * (1.0 + double(d.k))) << d.m << "x" << d.n << "x" << d.k << " " << trans;
        }
      }
    }
  }
}

TEST(ConvGemm, BatchedNtSumsEverySampleAndGivesTheSameBitsAtOneAndTwoThreads) {
  const std::int64_t batch = 3;
  for (const ConvGemmDims& d : kConvGemmDims) {
    const auto a = conv_gemm_wave(static_cast<std::size_t>(batch * d.m * d.k), 0.07f);
    const auto b = conv_gemm_wave(static_cast<std::size_t>(batch * d.n * d.k), 0.05f);
    std::vector<float> c1(static_cast<std::size_t>(d.m * d.n), -1.0f), c2(c1.size(), -2.0f);
    const int before = memplan::kernels::cpu_threads();
    memplan::kernels::set_cpu_threads(1);
    batched_gemm_nt(batch, d.m, d.n, d.k, a.data(), b.data(), c1.data());
    memplan::kernels::set_cpu_threads(2);
    batched_gemm_nt(batch, d.m, d.n, d.k, a.data(), b.data(), c2.data());
    memplan::kernels::set_cpu_threads(before);
    for (std::int64_t i = 0; i < d.m; ++i) {
      for (std::int64_t j = 0; j < d.n; ++j) {
        double s = 0.0;
        for (std::int64_t t = 0; t < batch; ++t) {
          for (std::int64_t q = 0; q < d.k; ++q) s += double(a[(t * d.m + i) * d.k + q]) * b[(t * d.n + j) * d.k + q];
        }
        ASSERT_NEAR(c1[i * d.n + j], s, 1e-5 * (1.0 + double(batch * d.k))) << d.m << "x" << d.n << "x" << d.k;
        ASSERT_EQ(c1[i * d.n + j], c2[i * d.n + j]) << d.m << "x" << d.n << "x" << d.k;
      }
    }
  }
}

}  // namespace
