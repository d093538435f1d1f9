// kernels/shared/ and common/splitmix64.h: the rules the CPU and CUDA kernels share (the
// SplitMix64 finaliser behind Rng and dropout masks, the optimizer arithmetic, max pooling's
// tie-break), checked on the host. The CUDA kernels compile the same functions.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "memplan/common/rng.h"
#include "memplan/common/splitmix64.h"
#include "memplan/kernels/shared/dropout.h"
#include "memplan/kernels/shared/optimizers.h"
#include "memplan/kernels/shared/pooling.h"

namespace memplan::kernels {
namespace {

// The reference SplitMix64 generator seeded with 0 (Vigna's splitmix64.c) starts with these.
TEST(SharedKernels, SplitMix64MatchesTheReferenceSequence) {
  Rng rng(0);
  EXPECT_EQ(rng.next_u64(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.next_u64(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.next_u64(), 0x06c45d188009454fULL);
  static_assert(splitmix64_mix(0) == 0, "the finaliser maps 0 to 0");
  EXPECT_EQ(splitmix64_mix(kSplitMix64Gamma), 0xe220a8397b1dcdafULL);
}

TEST(SharedKernels, DropoutMaskDependsOnlyOnSeedStepAndIndex) {
  const float p = 0.25f;
  const float keep = dropout_keep_scale(p);
  EXPECT_FLOAT_EQ(keep, 1.0f / 0.75f);
  const std::uint64_t stream = dropout_stream(1234, 7);
  EXPECT_EQ(stream, dropout_stream(1234, 7));
  EXPECT_NE(stream, dropout_stream(1234, 8));
  EXPECT_NE(stream, dropout_stream(1235, 7));
  const std::int64_t n = 200000;
  std::int64_t zeros = 0, differ_next_step = 0;
  const std::uint64_t next = dropout_stream(1234, 8);
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = dropout_mask_element(stream, i, p, keep);
    ASSERT_TRUE(v == 0.0f || v == keep) << "element " << i << " is " << v;
    zeros += v == 0.0f;
    differ_next_step += v != dropout_mask_element(next, i, p, keep);
  }
  EXPECT_NEAR(double(zeros) / double(n), p, 0.01);
  EXPECT_GT(differ_next_step, n / 4) << "the next step's mask must be a fresh draw";
  // p = 0 keeps everything, unscaled.
  for (std::int64_t i = 0; i < 1000; ++i) EXPECT_EQ(dropout_mask_element(stream, i, 0.0f, dropout_keep_scale(0.0f)), 1.0f);
}

Window window(std::int64_t h, std::int64_t w, std::int64_t k, std::int64_t stride, std::int64_t pad) {
  graph::OpAttrs attrs;
  attrs.kernel = k;
  attrs.stride = stride;
  attrs.padding = pad;
  return window_of(graph::Shape{1, 1, h, w}, attrs);
}

TEST(SharedKernels, WindowGeometry) {
  const Window g = window(5, 7, 3, 2, 1);
  EXPECT_EQ(g.oh, 3);
  EXPECT_EQ(g.ow, 4);
}

TEST(SharedKernels, MaxPoolTieBreakIsTheFirstMaximumInRowMajorWindowOrder) {
  // 3x3 plane, 2x2 windows, stride 1: window (0, 0) covers offsets 0, 1, 3, 4.
  const Window g = window(3, 3, 2, 1, 0);
  const std::vector<float> all_equal(9, 2.0f);
  EXPECT_EQ(window_argmax(all_equal.data(), g, 0, 0), 0);
  EXPECT_EQ(window_argmax(all_equal.data(), g, 1, 1), 4);
  const std::vector<float> tie_late = {0, 5, 0, 5, 1, 0, 0, 0, 0};  // 5 at offsets 1 and 3
  EXPECT_EQ(window_argmax(tie_late.data(), g, 0, 0), 1);
  const std::vector<float> strict = {0, 1, 0, 2, 9, 0, 0, 0, 0};
  EXPECT_EQ(window_argmax(strict.data(), g, 0, 0), 4);
}

TEST(SharedKernels, MaxPoolPaddingNeverWins) {
  // 2x2 plane of negative values, 3x3 windows with padding 1: window (0, 0) is mostly padding.
  const Window g = window(2, 2, 3, 1, 1);
  const std::vector<float> negative = {-5, -3, -4, -6};
  EXPECT_EQ(window_argmax(negative.data(), g, 0, 0), 1);
  const std::vector<float> minus_inf(4, -INFINITY);
  EXPECT_EQ(window_argmax(minus_inf.data(), g, 0, 0), 0) << "a real element, even at -inf, beats padding";
}

TEST(SharedKernels, SgdAndMomentumFollowPyTorch) {
  float p = 1.0f;
  sgd_element(p, 0.5f, 0.25f, 0.5f);  // g + wd * p = 1; p -= 0.25 * 1
  EXPECT_EQ(p, 0.75f);

  p = 1.0f;
  float buf = 0.0f;  // the first step: buf = g (+ wd * p)
  sgd_momentum_element(p, buf, 0.5f, 0.25f, 0.5f, 0.5f);
  EXPECT_EQ(buf, 1.0f);
  EXPECT_EQ(p, 0.75f);
  sgd_momentum_element(p, buf, 0.125f, 0.25f, 0.0f, 0.5f);  // buf = 0.5 * 1 + 0.125
  EXPECT_EQ(buf, 0.625f);
  EXPECT_EQ(p, 0.75f - 0.25f * 0.625f);
}

TEST(SharedKernels, AdamWFollowsPyTorchsFormula) {
  graph::OpAttrs a;
  a.lr = 1e-2f;
  a.beta1 = 0.9f;
  a.beta2 = 0.999f;
  a.eps = 1e-8f;
  a.weight_decay = 0.1f;
  float p = 2.0f, m = 0.0f, v = 0.0f;
  const float g = -0.5f;
  const double b1 = a.beta1, b2 = a.beta2, lr = a.lr, wd = a.weight_decay, eps = a.eps;
  for (std::int64_t step = 1; step <= 3; ++step) {
    const double bc1 = 1.0 - std::pow(b1, double(step)), bc2 = 1.0 - std::pow(b2, double(step));
    const AdamWScalars s = adamw_scalars(a, step, a.lr);
    EXPECT_FLOAT_EQ(s.decay, static_cast<float>(1.0 - lr * wd));
    EXPECT_FLOAT_EQ(s.step_size, static_cast<float>(lr / bc1));
    EXPECT_FLOAT_EQ(s.bc2_sqrt, static_cast<float>(std::sqrt(bc2)));
    // The same update in double, as PyTorch's documentation writes it.
    const double pd = double(p) * (1.0 - lr * wd);
    const double md = b1 * double(m) + (1.0 - b1) * double(g);
    const double vd = b2 * double(v) + (1.0 - b2) * double(g) * double(g);
    const double want = pd - lr * (md / bc1) / (std::sqrt(vd / bc2) + eps);
    adamw_element(p, m, v, g, s);
    EXPECT_NEAR(m, md, 1e-7);
    EXPECT_NEAR(v, vd, 1e-9);
    EXPECT_NEAR(p, want, 1e-6) << "step " << step;
  }
  EXPECT_GT(p, 2.0f * (1.0f - 3e-3f)) << "a negative gradient moves the parameter up";
}

}  // namespace
}  // namespace memplan::kernels
