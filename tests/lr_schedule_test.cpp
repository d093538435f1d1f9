// Learning-rate schedules: the factors against the closed forms PyTorch documents
// (CosineAnnealingLR, linear warm-up as a LambdaLR), the executor's factor reaching every
// optimizer's update (a factor of 1/2 gives the bits of half the learning rate), and
// runtime::train applying factor(s, steps) at step s.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "memplan/common/rng.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/lr_schedule.h"
#include "memplan/runtime/trainer.h"
#include "test_util.h"

namespace memplan {
namespace {

using runtime::LrSchedule;
using runtime::LrScheduleKind;

TEST(LrSchedule, ConstantIsOneEverywhere) {
  const LrSchedule s;
  for (std::int64_t step : {0, 1, 50, 99}) EXPECT_EQ(s.factor(step, 100), 1.0);
}

TEST(LrSchedule, CosineFollowsCosineAnnealingFromOneTowardsZero) {
  const LrSchedule s{LrScheduleKind::cosine, 0};
  const std::int64_t steps = 40;
  for (std::int64_t t = 0; t < steps; ++t) {
    // eta_t = eta_min + (eta_max - eta_min) (1 + cos(pi t / T_max)) / 2 with eta_min 0, eta_max 1.
    const double want = (1.0 + std::cos(std::numbers::pi * double(t) / double(steps))) / 2.0;
    EXPECT_NEAR(s.factor(t, steps), want, 1e-15) << "step " << t;
    if (t > 0) {
      EXPECT_LT(s.factor(t, steps), s.factor(t - 1, steps)) << "cosine decreases at every step";
    }
  }
  EXPECT_EQ(s.factor(0, steps), 1.0);
  EXPECT_NEAR(s.factor(steps / 2, steps), 0.5, 1e-15);
  EXPECT_GT(s.factor(steps - 1, steps), 0.0) << "the last step still learns";
  EXPECT_LT(s.factor(steps - 1, steps), 0.01);
}

TEST(LrSchedule, WarmupRampsLinearlyThenHandsOver) {
  const LrSchedule cosine{LrScheduleKind::cosine, 10};
  const LrSchedule constant{LrScheduleKind::constant, 10};
  for (std::int64_t t = 0; t < 10; ++t) {
    EXPECT_DOUBLE_EQ(cosine.factor(t, 110), double(t + 1) / 10.0);
    EXPECT_DOUBLE_EQ(constant.factor(t, 110), double(t + 1) / 10.0);
  }
  EXPECT_EQ(cosine.factor(10, 110), 1.0) << "the cosine starts at its top after warm-up";
  EXPECT_NEAR(cosine.factor(60, 110), 0.5, 1e-15) << "half way through the 100 cosine steps";
  EXPECT_EQ(constant.factor(60, 110), 1.0);
}

TEST(LrSchedule, WarmupMustLeaveAStep) {
  EXPECT_TRUE(runtime::check_lr_schedule({LrScheduleKind::cosine, 99}, 100).ok());
  EXPECT_TRUE(runtime::check_lr_schedule({LrScheduleKind::constant, 0}, 1).ok());
  const Status too_long = runtime::check_lr_schedule({LrScheduleKind::cosine, 100}, 100);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("--warmup 100"), std::string::npos) << too_long.error().message;
  EXPECT_FALSE(runtime::check_lr_schedule({LrScheduleKind::constant, -1}, 10).ok());
}

graph::Graph mlp_step(graph::OptimizerKind kind, float lr) {
  models::ModelOptions model;
  model.name = "mlp";
  model.mlp = {16, {12}, 4};
  graph::Graph g = models::build_forward(model, 8).value();
  graph::OptimizerConfig opt;
  opt.kind = kind;
  opt.lr = lr;
  opt.weight_decay = 0.05f;
  graph::make_training_step(g, opt);
  return g;
}

// Random inputs and labels for step `step`, the same for every run.
void feed(const graph::Graph& g, std::int64_t step, runtime::Executor& exec) {
  Rng rng(100 + static_cast<std::uint64_t>(step));
  std::vector<float> x(static_cast<std::size_t>(g.tensor(g.find("x")).shape.numel()));
  for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
  std::vector<std::int32_t> y(static_cast<std::size_t>(g.tensor(g.find("labels")).shape.numel()));
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(4));
  exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * sizeof(float)));
  exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * sizeof(std::int32_t)));
}

std::string run_steps(const graph::Graph& g, double scale, int steps) {
  testing::CpuRun run(g);
  run.executor.initialize_persistent(7);
  run.executor.set_lr_scale(scale);
  for (int s = 0; s < steps; ++s) {
    feed(g, s, run.executor);
    EXPECT_TRUE(run.executor.run_step().ok());
  }
  return run.executor.params_sha256();
}

TEST(LrSchedule, HalfTheFactorIsHalfTheLearningRateForEveryOptimizer) {
  for (auto kind : {graph::OptimizerKind::sgd, graph::OptimizerKind::momentum, graph::OptimizerKind::adamw}) {
    const std::string scaled = run_steps(mlp_step(kind, 0.02f), 0.5, 4);
    EXPECT_EQ(scaled, run_steps(mlp_step(kind, 0.01f), 1.0, 4)) << graph::optimizer_name(kind);
    EXPECT_NE(scaled, run_steps(mlp_step(kind, 0.02f), 1.0, 4)) << graph::optimizer_name(kind) << " ignores the factor";
  }
}

TEST(LrSchedule, TrainAppliesTheFactorOfEachStep) {
  const graph::Graph g = mlp_step(graph::OptimizerKind::adamw, 0.05f);
  const LrSchedule schedule{LrScheduleKind::cosine, 2};
  const int steps = 6;

  testing::CpuRun scheduled(g);
  scheduled.executor.initialize_persistent(7);
  auto summary = runtime::train(
      scheduled.executor, steps, [&](std::int64_t i, runtime::Executor& e) { feed(g, i, e); }, {}, schedule);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(scheduled.executor.lr_scale(), 1.0) << "the factor does not outlive the run";

  // The same steps by hand, each with the factor written out: 1/2, 1 (warm-up), then cosine over 4.
  const double by_hand[steps] = {0.5, 1.0, 1.0, (1.0 + std::cos(std::numbers::pi / 4)) / 2, 0.5,
                                 (1.0 + std::cos(3 * std::numbers::pi / 4)) / 2};
  testing::CpuRun manual(g);
  manual.executor.initialize_persistent(7);
  for (int s = 0; s < steps; ++s) {
    feed(g, s, manual.executor);
    manual.executor.set_lr_scale(by_hand[s]);
    ASSERT_TRUE(manual.executor.run_step().ok());
  }
  EXPECT_EQ(scheduled.executor.params_sha256(), manual.executor.params_sha256());
  EXPECT_NE(scheduled.executor.params_sha256(), run_steps(g, 1.0, steps)) << "the schedule must change the run";
}

}  // namespace
}  // namespace memplan
