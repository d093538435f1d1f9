// Forward results of the convolutional and transformer ops against direct reference loops on
// small random inputs (the gradient checks only prove backward consistent with forward).
#include <gtest/gtest.h>

#include <cmath>

#include "memplan/graph/builder.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::Builder;
using graph::Shape;

// Runs `y = build(x)` for a random parameter x of `shape` and returns (x, y).
template <typename F>
std::pair<std::vector<float>, std::vector<float>> run_unary(const Shape& shape, F build) {
  graph::Graph g;
  Builder b(g);
  const TensorId x = b.parameter("x", shape, {});
  const TensorId y = build(b, x);
  g.retained.push_back(y);
  testing::CpuRun run(g);
  auto xs = testing::random_values(static_cast<std::size_t>(shape.numel()), 11);
  run.executor.write_tensor(x, xs.data());
  EXPECT_TRUE(run.executor.run_step().ok());
  return {xs, testing::read_floats(run.executor, y)};
}

// The fused gated activation gives the bits of its two ops run one after the other.
TEST(NnOps, SwigluIsSiluThenMulBitForBit) {
  graph::Graph g;
  Builder b(g);
  const Shape shape{3, 37};
  const TensorId gate = b.parameter("gate", shape, {});
  const TensorId up = b.parameter("up", shape, {});
  const TensorId fused = b.swiglu(gate, up, "fused");
  const TensorId composed = b.mul(b.silu(gate, "act"), up, "composed");
  g.retained = {fused, composed};
  testing::CpuRun run(g);
  const auto gs = testing::random_values(static_cast<std::size_t>(shape.numel()), 5);
  const auto us = testing::random_values(static_cast<std::size_t>(shape.numel()), 6);
  run.executor.write_tensor(gate, gs.data());
  run.executor.write_tensor(up, us.data());
  ASSERT_TRUE(run.executor.run_step().ok());
  const auto y = testing::read_floats(run.executor, fused);
  const auto want = testing::read_floats(run.executor, composed);
  ASSERT_EQ(y.size(), want.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(y[i], want[i]) << "element " << i;
    const double g64 = gs[i], expect = g64 / (1.0 + std::exp(-g64)) * us[i];
    ASSERT_NEAR(y[i], expect, 1e-6 * (1.0 + std::abs(expect))) << "element " << i;
  }
}

TEST(NnOps, Conv2dMatchesDirectConvolution) {
  const std::int64_t N = 2, Ci = 3, H = 5, W = 6, Co = 4, K = 3, S = 2, P = 1;
  graph::Graph g;
  Builder b(g);
  const TensorId x = b.parameter("x", {N, Ci, H, W}, {});
  const TensorId w = b.parameter("w", {Co, Ci, K, K}, {});
  const TensorId y = b.conv2d(x, w, S, P, "y");
  g.retained.push_back(y);
  testing::CpuRun run(g);
  const auto xs = testing::random_values(static_cast<std::size_t>(N * Ci * H * W), 1);
  const auto ws = testing::random_values(static_cast<std::size_t>(Co * Ci * K * K), 2);
  run.executor.write_tensor(x, xs.data());
  run.executor.write_tensor(w, ws.data());
  ASSERT_TRUE(run.executor.run_step().ok());
  const auto ys = testing::read_floats(run.executor, y);
  const std::int64_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
  ASSERT_EQ(g.tensor(y).shape, (Shape{N, Co, OH, OW}));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t co = 0; co < Co; ++co)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double ref = 0;
          for (std::int64_t ci = 0; ci < Ci; ++ci)
            for (std::int64_t kh = 0; kh < K; ++kh)
              for (std::int64_t kw = 0; kw < K; ++kw) {
                const std::int64_t ih = oh * S + kh - P, iw = ow * S + kw - P;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                ref += double(xs[static_cast<std::size_t>(((n * Ci + ci) * H + ih) * W + iw)]) *
                       double(ws[static_cast<std::size_t>(((co * Ci + ci) * K + kh) * K + kw)]);
              }
          EXPECT_NEAR(ys[static_cast<std::size_t>(((n * Co + co) * OH + oh) * OW + ow)], ref, 1e-4);
        }
}

// Dilated (and undilated) convolutions, dense through im2col and grouped through the direct
// kernel, against the definition: tap (kh, kw) of output (oh, ow) reads x at
// (oh*S + kh*D - P, ow*S + kw*D - P), and OH = (H + 2P - D(K-1) - 1) / S + 1.
TEST(NnOps, DilatedConvolutionsMatchDirectConvolution) {
  struct Case {
    std::int64_t h, w, k, stride, pad, dil, groups;
  };
  for (const Case c : {Case{7, 7, 3, 1, 2, 2, 1}, Case{9, 8, 3, 2, 1, 3, 1}, Case{6, 7, 2, 1, 0, 2, 1},
                       Case{7, 7, 3, 1, 2, 2, 4}, Case{8, 9, 3, 2, 3, 3, 2}, Case{5, 5, 3, 1, 1, 1, 2}}) {
    const std::int64_t N = 2, Ci = 4, Co = 4;
    graph::Graph g;
    Builder b(g);
    const TensorId x = b.parameter("x", {N, Ci, c.h, c.w}, {});
    const TensorId w = b.parameter("w", {Co, Ci / c.groups, c.k, c.k}, {});
    const TensorId y = c.groups == 1 ? b.conv2d(x, w, c.stride, c.pad, "y", c.dil)
                                     : b.grouped_conv2d(x, w, c.stride, c.pad, c.groups, "y", c.dil);
    g.retained.push_back(y);
    testing::CpuRun run(g);
    const auto xs = testing::random_values(static_cast<std::size_t>(N * Ci * c.h * c.w), 1);
    const auto ws = testing::random_values(static_cast<std::size_t>(Co * Ci / c.groups * c.k * c.k), 2);
    run.executor.write_tensor(x, xs.data());
    run.executor.write_tensor(w, ws.data());
    ASSERT_TRUE(run.executor.run_step().ok());
    const auto ys = testing::read_floats(run.executor, y);
    const std::int64_t OH = (c.h + 2 * c.pad - c.dil * (c.k - 1) - 1) / c.stride + 1;
    const std::int64_t OW = (c.w + 2 * c.pad - c.dil * (c.k - 1) - 1) / c.stride + 1;
    ASSERT_EQ(g.tensor(y).shape, (Shape{N, Co, OH, OW}));
    const std::int64_t cin = Ci / c.groups, cout = Co / c.groups;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t co = 0; co < Co; ++co)
        for (std::int64_t oh = 0; oh < OH; ++oh)
          for (std::int64_t ow = 0; ow < OW; ++ow) {
            double ref = 0;
            for (std::int64_t ci = 0; ci < cin; ++ci)
              for (std::int64_t kh = 0; kh < c.k; ++kh)
                for (std::int64_t kw = 0; kw < c.k; ++kw) {
                  const std::int64_t ih = oh * c.stride + kh * c.dil - c.pad, iw = ow * c.stride + kw * c.dil - c.pad;
                  if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
                  const std::int64_t channel = (co / cout) * cin + ci;
                  ref += double(xs[static_cast<std::size_t>(((n * Ci + channel) * c.h + ih) * c.w + iw)]) *
                         double(ws[static_cast<std::size_t>(((co * cin + ci) * c.k + kh) * c.k + kw)]);
                }
            EXPECT_NEAR(ys[static_cast<std::size_t>(((n * Co + co) * OH + oh) * OW + ow)], ref, 1e-4)
                << "H " << c.h << " K " << c.k << " S " << c.stride << " P " << c.pad << " D " << c.dil << " groups " << c.groups;
          }
  }
}

TEST(NnOps, PoolingMatchesReference) {
  const Shape shape{1, 2, 5, 5};
  auto [xs, ys] = run_unary(shape, [](Builder& b, TensorId x) { return b.max_pool2d(x, 3, 2, 1, "y"); });
  // Window (oh, ow) covers rows 2*oh-1..2*oh+1, cols likewise, clipped to the image.
  for (std::int64_t c = 0; c < 2; ++c)
    for (std::int64_t oh = 0; oh < 3; ++oh)
      for (std::int64_t ow = 0; ow < 3; ++ow) {
        float m = -INFINITY;
        for (std::int64_t ih = std::max<std::int64_t>(0, 2 * oh - 1); ih <= std::min<std::int64_t>(4, 2 * oh + 1); ++ih)
          for (std::int64_t iw = std::max<std::int64_t>(0, 2 * ow - 1); iw <= std::min<std::int64_t>(4, 2 * ow + 1); ++iw)
            m = std::max(m, xs[static_cast<std::size_t>((c * 5 + ih) * 5 + iw)]);
        EXPECT_EQ(ys[static_cast<std::size_t>((c * 3 + oh) * 3 + ow)], m);
      }
  auto [xa, ya] = run_unary({1, 1, 4, 4}, [](Builder& b, TensorId x) { return b.avg_pool2d(x, 2, 2, "y"); });
  EXPECT_NEAR(ya[3], (xa[10] + xa[11] + xa[14] + xa[15]) / 4.0f, 1e-6f);
  auto [xg, yg] = run_unary({2, 1, 2, 2}, [](Builder& b, TensorId x) { return b.global_avg_pool(x, "y"); });
  EXPECT_NEAR(yg[1], (xg[4] + xg[5] + xg[6] + xg[7]) / 4.0f, 1e-6f);
}

TEST(NnOps, CausalSoftmaxMasksTheFuture) {
  auto [xs, ys] = run_unary({2, 3, 3}, [](Builder& b, TensorId x) { return b.softmax(x, true, "y"); });
  for (std::size_t blk = 0; blk < 2; ++blk)
    for (std::size_t i = 0; i < 3; ++i) {
      double z = 0;
      for (std::size_t j = 0; j <= i; ++j) z += std::exp(double(xs[blk * 9 + i * 3 + j]));
      for (std::size_t j = 0; j < 3; ++j) {
        const double want = j <= i ? std::exp(double(xs[blk * 9 + i * 3 + j])) / z : 0.0;
        EXPECT_NEAR(ys[blk * 9 + i * 3 + j], want, 1e-6);
      }
    }
}

TEST(NnOps, PermuteAndBatchedMatmulMatchIndexing) {
  auto [xs, ys] = run_unary({2, 3, 4}, [](Builder& b, TensorId x) { return b.permute(x, {2, 0, 1}, "y"); });
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(ys[(k * 2 + i) * 3 + j], xs[(i * 3 + j) * 4 + k]);

  graph::Graph g;
  Builder b(g);
  const TensorId a = b.parameter("a", {2, 4, 3}, {});  // used transposed: [2, 3, 4]
  const TensorId w = b.parameter("w", {2, 4, 5}, {});
  const TensorId y = b.batched_matmul(a, w, true, false, "y");
  g.retained.push_back(y);
  testing::CpuRun run(g);
  const auto as = testing::random_values(24, 3), bs = testing::random_values(40, 4);
  run.executor.write_tensor(a, as.data());
  run.executor.write_tensor(w, bs.data());
  ASSERT_TRUE(run.executor.run_step().ok());
  const auto out = testing::read_floats(run.executor, y);
  for (std::size_t n = 0; n < 2; ++n)
    for (std::size_t m = 0; m < 3; ++m)
      for (std::size_t c = 0; c < 5; ++c) {
        double ref = 0;
        for (std::size_t k = 0; k < 4; ++k) ref += double(as[n * 12 + k * 3 + m]) * double(bs[n * 20 + k * 5 + c]);
        EXPECT_NEAR(out[(n * 3 + m) * 5 + c], ref, 1e-5);
      }
}

TEST(NnOps, BatchNormUpdatesRunningStatisticsAndInferenceUsesThem) {
  graph::Graph g;
  Builder b(g);
  const TensorId x = b.parameter("x", {4, 2, 3}, {});
  const TensorId gamma = b.parameter("gamma", {2}, {graph::InitSpec::Kind::ones, 0});
  const TensorId beta = b.parameter("beta", {2}, {});
  const TensorId mean = b.buffer("mean", {2}, {});
  const TensorId var = b.buffer("var", {2}, {graph::InitSpec::Kind::ones, 0});
  g.retained.push_back(b.batch_norm(x, gamma, beta, mean, var, true, "y", 0.5f));
  testing::CpuRun run(g);
  run.executor.initialize_persistent(0);
  const auto xs = testing::random_values(24, 5);
  run.executor.write_tensor(x, xs.data());
  ASSERT_TRUE(run.executor.run_step().ok());
  for (std::size_t c = 0; c < 2; ++c) {
    double s = 0, sq = 0;
    for (std::size_t n = 0; n < 4; ++n)
      for (std::size_t i = 0; i < 3; ++i) s += xs[(n * 2 + c) * 3 + i];
    const double mu = s / 12;
    for (std::size_t n = 0; n < 4; ++n)
      for (std::size_t i = 0; i < 3; ++i) sq += std::pow(xs[(n * 2 + c) * 3 + i] - mu, 2);
    EXPECT_NEAR(testing::read_floats(run.executor, mean)[c], 0.5 * mu, 1e-6);
    EXPECT_NEAR(testing::read_floats(run.executor, var)[c], 0.5 + 0.5 * sq / 11, 1e-5);  // unbiased
  }
  graph::Graph e;
  Builder eb(e);
  const TensorId ex = eb.input("x", {1, 2, 1});
  const TensorId eg = eb.parameter("gamma", {2}, {});
  const TensorId ebt = eb.parameter("beta", {2}, {});
  const TensorId em = eb.buffer("mean", {2}, {});
  const TensorId ev = eb.buffer("var", {2}, {});
  e.retained.push_back(eb.batch_norm(ex, eg, ebt, em, ev, false, "y"));
  testing::CpuRun eval(e);
  const float g2[] = {2, 3}, b2[] = {1, -1}, m2[] = {0.5f, -1}, v2[] = {4, 0.25f}, in[] = {2.5f, 0};
  eval.executor.write_tensor(eg, g2);
  eval.executor.write_tensor(ebt, b2);
  eval.executor.write_tensor(em, m2);
  eval.executor.write_tensor(ev, v2);
  eval.executor.set_input(ex, in, 8);
  ASSERT_TRUE(eval.executor.run_step().ok());
  const auto out = testing::read_floats(eval.executor, e.retained[0]);
  EXPECT_NEAR(out[0], 2 * (2.5 - 0.5) / std::sqrt(4 + 1e-5) + 1, 1e-5);
  EXPECT_NEAR(out[1], 3 * (0 + 1) / std::sqrt(0.25 + 1e-5) - 1, 1e-5);
}

}  // namespace
}  // namespace memplan
