// Forward checks the op harness (tests/op_harness_test.cpp, whose references compare each op's
// output with a double-precision computation) does not make: a fused op giving the bits of its
// parts, and the batch-norm builder's running statistics (its momentum and unbiased variance
// over a step) and their use at inference, against values worked by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "memplan/graph/builder.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::Builder;
using graph::Shape;

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
