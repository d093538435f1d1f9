// The CPU kernels' vectorisable exp and erf (kernels/cpu/vector_math.h): accuracy in float ulps
// against the float64 functions over their whole range, and the same bits whether an element is
// computed in a vectorised loop or on its own.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "memplan/kernels/cpu/vector_math.h"

namespace memplan {
namespace {

using kernels::cpu::erf_approx;
using kernels::cpu::exp_approx;

// |got - want| in units of the float spacing at want.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double spacing = double(std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity())) - std::fabs(double(w));
  return std::fabs(double(got) - want) / spacing;
}

TEST(VectorMath, ExpWithinTwoUlpsOnItsRange) {
  double worst = 0.0;
  for (double x = -87.0; x <= 88.0; x += 0.000731) {
    const auto xf = static_cast<float>(x);
    worst = std::max(worst, ulps(exp_approx(xf), std::exp(double(xf))));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
  EXPECT_GT(exp_approx(-1000.0f), 0.0f);  // clamped, never NaN
  EXPECT_LT(exp_approx(-1000.0f), 1e-37f);
  EXPECT_TRUE(std::isnan(exp_approx(std::numeric_limits<float>::quiet_NaN())));  // NaN stays NaN
  EXPECT_TRUE(std::isnan(erf_approx(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VectorMath, ErfWithinThreeUlpsAndExactlyOneInTheTails) {
  double worst = 0.0;
  for (double x = -6.0; x <= 6.0; x += 0.0000917) {
    const auto xf = static_cast<float>(x);
    worst = std::max(worst, ulps(erf_approx(xf), std::erf(double(xf))));
  }
  EXPECT_LE(worst, 3.0);
  EXPECT_EQ(erf_approx(0.0f), 0.0f);
  EXPECT_EQ(erf_approx(10.0f), 1.0f);
  EXPECT_EQ(erf_approx(-10.0f), -1.0f);
  EXPECT_EQ(erf_approx(1e-20f), 1e-20f * 1.128379166e+00f);  // odd, and linear near 0
}

// A loop the compiler vectorises, then each element through a call it cannot vectorise.
TEST(VectorMath, VectorisedLoopAndSingleElementsAgreeBitForBit) {
  std::vector<float> x(1031);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -5.0f + 10.0f * static_cast<float>(i) / 1031.0f;
  std::vector<float> e(x.size()), f(x.size());
#pragma omp simd
  for (std::size_t i = 0; i < x.size(); ++i) {
    e[i] = erf_approx(x[i]);
    f[i] = exp_approx(x[i]);
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    volatile float xi = x[i];  // a value the compiler cannot see through
    EXPECT_EQ(e[i], erf_approx(xi)) << x[i];
    EXPECT_EQ(f[i], exp_approx(xi)) << x[i];
  }
}

}  // namespace
}  // namespace memplan
