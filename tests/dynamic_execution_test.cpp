// Dynamic execution (the caching allocator) runs the same schedule as the plan: identical
// parameters to planned and naive runs, and, once its cache is warm, no device allocations.
#include <gtest/gtest.h>

#include "memplan/common/rng.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/mlp.h"
#include "test_util.h"

namespace memplan {
namespace {

using runtime::ExecutionMode;

std::string train_sha(const graph::Graph& g, runtime::Executor& exec, int steps, std::int64_t batch) {
  exec.initialize_persistent(9);
  Rng rng(3);
  std::vector<float> x(static_cast<std::size_t>(batch * 64));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (int s = 0; s < steps; ++s) {
    for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
    for (auto& v : y) v = static_cast<std::int32_t>(rng.below(10));
    exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
    exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
    EXPECT_TRUE(exec.run_step().ok());
  }
  return exec.params_sha256();
}

TEST(DynamicExecution, SameBitsAsPlannedAndNaive) {
  const std::int64_t batch = 16;
  graph::Graph g = models::build_mlp(models::MlpConfig{64, {32, 32}, 10}, batch);
  graph::make_training_step(g, graph::OptimizerConfig{});
  testing::CpuRun planned(g, ExecutionMode::planned);
  testing::CpuRun naive(g, ExecutionMode::naive);
  testing::CpuRun dynamic(g, ExecutionMode::dynamic);
  const std::string reference = train_sha(g, planned.executor, 30, batch);
  EXPECT_EQ(train_sha(g, naive.executor, 30, batch), reference);
  EXPECT_EQ(train_sha(g, dynamic.executor, 30, batch), reference);
}

TEST(DynamicExecution, NoDeviceAllocationsOnceTheCacheIsWarm) {
  // Activations of 512 x 1024 floats (2 MiB) go to the large pool, whose segments the first
  // step must obtain from the device.
  const std::int64_t batch = 512;
  graph::Graph g = models::build_mlp(models::MlpConfig{64, {1024}, 10}, batch);
  graph::make_training_step(g, graph::OptimizerConfig{});
  testing::CpuRun dynamic(g, ExecutionMode::dynamic);
  ASSERT_NE(dynamic.executor.allocator(), nullptr);
  train_sha(g, dynamic.executor, 1, batch);
  const auto after_first = dynamic.executor.device_allocations_during_steps();
  EXPECT_GT(after_first, 0) << "the first step must fill the cache from the device";
  train_sha(g, dynamic.executor, 5, batch);
  EXPECT_EQ(dynamic.executor.device_allocations_during_steps(), after_first);
  EXPECT_GT(dynamic.executor.allocator()->stats().reserved_bytes[0].peak, 0);
}

}  // namespace
}  // namespace memplan
