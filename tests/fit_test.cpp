// memplan fit: the predicted arena is exactly what the planned executor allocates; the batch
// search is exact (max_batch fits, max_batch + 1 does not); budgets are parsed strictly.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/planner/fit.h"
#include "memplan/runtime/executor.h"

namespace memplan {
namespace {

using testing::run_cli;

TEST(Fit, PredictedArenaEqualsWhatThePlannedExecutorAllocates) {
  for (const char* name : {"mlp", "cnn"}) {
    for (std::int64_t batch : {1, 8, 33}) {
      models::ModelOptions model;
      model.name = name;
      graph::Graph g = models::build_forward(model, batch).value();
      graph::make_training_step(g, graph::OptimizerConfig{});
      const planner::MemoryPlan plan = planner::plan_memory(g).value();
      runtime::CpuDevice device;
      runtime::Executor exec(g, device, runtime::ExecutorOptions{});
      ASSERT_TRUE(exec.setup().ok());
      EXPECT_EQ(exec.device_bytes_at_setup(), plan.arena_bytes) << name << " batch " << batch;
      EXPECT_EQ(device.stats().allocations, 1);
    }
  }
}

TEST(Fit, BatchSearchIsExactOnAStepFunction) {
  // total(b) = 1000 + 37 b: the largest b with total <= budget is (budget - 1000) / 37.
  for (Bytes budget : {Bytes{999}, Bytes{1037}, Bytes{5000}, Bytes{123457}, Bytes{10'000'000}}) {
    auto search = planner::search_max_batch([](std::int64_t b) -> Result<Bytes> { return 1000 + 37 * b; }, budget);
    ASSERT_TRUE(search.ok());
    EXPECT_EQ(search.value().max_batch, budget < 1037 ? 0 : (budget - 1000) / 37) << budget;
  }
  auto limited = planner::search_max_batch([](std::int64_t b) -> Result<Bytes> { return b; }, 1'000'000, 100);
  EXPECT_EQ(limited.value().max_batch, 100);
}

std::int64_t arena_at(const std::string& model, std::int64_t batch) {
  const auto r = run_cli("fit --model " + model + " --batch " + std::to_string(batch) + " --budget 1TiB --device cpu --json", false);
  return nlohmann::json::parse(r.output)["arena_bytes"].get<std::int64_t>();
}

TEST(Fit, MaxBatchFitsAndOneMoreDoesNot) {
  struct Case {
    const char* model;
    const char* budget;
    const char* device;
  };
  for (const Case& c : {Case{"mlp", "20MiB", "cpu"}, Case{"mlp", "7MB", "cpu"}, Case{"cnn", "300MiB", "cpu"},
                        Case{"cnn", "1GiB", "cuda"}}) {
    const auto r = run_cli(std::string("fit --model ") + c.model + " --budget " + c.budget + " --device " + c.device +
                               " --max-batch --json",
                           false);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    const std::int64_t max_batch = j["max_batch"].get<std::int64_t>();
    ASSERT_GT(max_batch, 0) << c.model << " " << c.budget;
    const std::int64_t overhead = j["breakdown"]["runtime_overhead"].get<std::int64_t>();
    const std::int64_t budget = j["budget_bytes"].get<std::int64_t>();
    EXPECT_LE(arena_at(c.model, max_batch) + overhead, budget) << c.model << " " << c.budget;
    EXPECT_GT(arena_at(c.model, max_batch + 1) + overhead, budget) << c.model << " " << c.budget;
  }
}

TEST(Fit, DoesNotFitSuggestsAMicroBatchThatDoes) {
  const auto r = run_cli("fit --model mlp --batch 100000 --budget 64MiB --device cpu --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_FALSE(j["fits"].get<bool>());
  const std::int64_t micro = j["suggestion"]["micro_batch"].get<std::int64_t>();
  ASSERT_GT(micro, 0);
  EXPECT_GE(micro * j["suggestion"]["gradient_accumulation_steps"].get<std::int64_t>(), 100000);
  EXPECT_LE(arena_at("mlp", micro), 64 << 20);
  for (const char* key : {"fits", "total_bytes", "arena_bytes", "breakdown", "suggestion"}) EXPECT_TRUE(j.contains(key)) << key;
}

TEST(Fit, ABatchThatFitsOnlyWithCheckpointingIsSuggestedOnce) {
  const auto sides = nlohmann::json::parse(run_cli("fit --model gpt --budget 64MiB --device cpu --max-batch --json", false).output);
  const std::int64_t plain = sides["max_batch_by_checkpoint"]["none"].get<std::int64_t>();
  const std::int64_t with_sqrt = sides["max_batch_by_checkpoint"]["sqrt"].get<std::int64_t>();
  ASSERT_GT(with_sqrt, plain) << sides.dump();
  const std::string batch = std::to_string(with_sqrt);
  // --max-batch: the suggestion chooses among every strategy, so it can be the whole batch.
  const std::string fit = "fit --model gpt --budget 64MiB --device cpu --max-batch --batch " + batch;
  const auto j = nlohmann::json::parse(run_cli(fit + " --json", false).output);
  EXPECT_FALSE(j["fits"].get<bool>());
  EXPECT_EQ(j["suggestion"]["micro_batch"].get<std::int64_t>(), with_sqrt);
  EXPECT_EQ(j["suggestion"]["gradient_accumulation_steps"].get<std::int64_t>(), 1);
  EXPECT_FALSE(j["suggestion"].contains("whole_batch_checkpoint")) << "the whole batch is the suggestion itself";
  const auto text = run_cli(fit, false).output;
  const auto at = text.find("suggestion: batch " + batch + " fits with --checkpoint ");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.find("or the whole batch", at), std::string::npos) << text;
}

TEST(Fit, BadBudgetsAreUsageErrors) {
  for (const char* budget : {"0", "-1GiB", "12parsecs", "nan", "99999999999TiB", "''"}) {
    const auto r = run_cli(std::string("fit --budget ") + budget);
    EXPECT_EQ(r.exit_code, 2) << budget << "\n" << r.output;
    EXPECT_NE(r.output.find("--budget"), std::string::npos) << r.output;
  }
  EXPECT_EQ(run_cli("fit").exit_code, 2) << "--budget is required";
}

}  // namespace
}  // namespace memplan
