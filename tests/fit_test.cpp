// memplan fit: the predicted arena is exactly what the planned executor allocates; the batch
// search is exact (max_batch fits, max_batch + 1 does not); budgets are parsed strictly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/common/byte_size.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/fit.h"
#include "memplan/planner/order_free_bound.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"
#include "tests/test_util.h"

namespace memplan {
namespace {

using testing::run_cli;

TEST(Fit, PredictedArenaEqualsWhatThePlannedExecutorAllocates) {
  for (const char* name : {"mlp", "cnn"}) {
    for (std::int64_t batch : {1, 8, 33}) {
      models::ModelOptions model;
      model.name = name;
      const auto step = planner::StepDescription::of_source(models::registry_source(model), batch);
      planner::FitQuestion question;
      question.step = step;
      question.device_memory = Bytes{1} << 40;
      const planner::FitAnswer answer = planner::answer_fit(question).value();
      runtime::CpuDevice device;
      const planner::PlannedStep planned = runtime::plan_step_for(step, device).value();
      runtime::Executor exec(planned, device);
      ASSERT_TRUE(exec.setup().ok());
      EXPECT_EQ(exec.device_bytes_at_setup(), answer.breakdown.arena) << name << " batch " << batch;
      EXPECT_EQ(answer.breakdown.total, answer.breakdown.arena) << "the CPU has no runtime overheads";
      EXPECT_EQ(device.stats().allocations, 1);
    }
  }
}

// A CPU device that asks for the CUDA backend's kernel workspace, as the CUDA device does: the
// executor places it in the arena exactly as it would on the GPU.
class WorkspaceDevice final : public runtime::Device {
 public:
  kernels::DeviceKind kind() const override { return kernels::DeviceKind::cpu; }
  std::string name() const override { return "cpu with a CUDA-sized workspace"; }
  void copy_from_host(void* dst, const void* src, Bytes n) override { cpu_.copy_from_host(dst, src, n); }
  void copy_to_host(void* dst, const void* src, Bytes n) override { cpu_.copy_to_host(dst, src, n); }
  Bytes workspace_bytes() const override { return planner::kCudaWorkspaceBytes; }

 protected:
  void* raw_allocate(Bytes n) override { return cpu_.allocate(n).value(); }
  void raw_deallocate(void* p) override { cpu_.deallocate(p, 0); }

 private:
  runtime::CpuDevice cpu_;
};

TEST(Fit, TheCudaProfilePlannedWithoutAGpuIsTheArenaTheCudaExecutorAllocates) {
  for (const char* name : {"mlp", "cnn", "gpt"}) {
    models::ModelOptions model;
    model.name = name;
    const auto step = planner::StepDescription::of_source(models::registry_source(model), 4);
    planner::FitQuestion question;
    question.step = step;
    question.request.device = planner::documented_device_profile("cuda").value();
    question.device_memory = Bytes{80} << 30;
    const planner::FitAnswer answer = planner::answer_fit(question).value();
    EXPECT_EQ(answer.breakdown.workspace, planner::kCudaWorkspaceBytes) << name;
    WorkspaceDevice device;
    const planner::PlannedStep planned = runtime::plan_step_for(step, device).value();
    EXPECT_EQ(planned.plan.arena_bytes, answer.breakdown.arena) << name;
    runtime::Executor exec(planned, device);
    ASSERT_TRUE(exec.setup().ok()) << name;
    EXPECT_EQ(exec.device_bytes_at_setup(), answer.breakdown.arena) << name << ": the workspace lives in the arena";
    EXPECT_EQ(device.stats().allocations, 1) << name;
    // The CPU profile's arena is smaller by the workspace, placed in the persistent region.
    runtime::CpuDevice cpu;
    EXPECT_EQ(runtime::plan_step_for(step, cpu).value().plan.arena_bytes + planner::kCudaWorkspaceBytes,
              answer.breakdown.arena)
        << name;
  }
}

TEST(Fit, AnExecutorRefusesAPlanMadeWithoutItsDevicesWorkspace) {
  models::ModelOptions model;
  const auto step = planner::StepDescription::of_source(models::registry_source(model), 4);
  runtime::CpuDevice cpu;
  const planner::PlannedStep cpu_plan = runtime::plan_step_for(step, cpu).value();
  WorkspaceDevice device;
  runtime::Executor exec(cpu_plan, device);
  const Status s = exec.setup();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("kernel workspace"), std::string::npos) << s.error().message;
  EXPECT_EQ(device.stats().allocations, 0);
}

// Plans are deterministic: the exact search stops after a number of nodes, not seconds, so the
// same step gives the same arena in plan, fit and train while other threads load every core.
TEST(Fit, PlanFitAndTrainGiveTheSameArenaOnALoadedMachine) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> load;
  for (int i = 0; i < 2; ++i) {
    load.emplace_back([&stop] {
      volatile std::uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x * 6364136223846793005ULL + 1;
    });
  }
  // plan, fit and train every trainable model (the GPT's vocabulary is the default text's, which
  // fit reads too; no evaluation, which would only slow the sanitizer run).
  for (const char* model : {"mlp", "cnn", "gpt"}) {
    const std::string step = std::string("--model ") + model + " --batch 8";
    const auto plan = nlohmann::json::parse(run_cli("plan " + step + " --json", false).output);
    const auto fit = nlohmann::json::parse(run_cli("fit " + step + " --device cpu --device-memory 1TiB --json", false).output);
    EXPECT_EQ(plan["arena_bytes"], fit["arena_bytes"]) << model;
    const auto train = nlohmann::json::parse(run_cli("train " + step + " --steps 1 --eval-samples 0 --quiet --json", false).output);
    EXPECT_EQ(fit["arena_bytes"], train["arena_bytes"]) << model;
    EXPECT_EQ(train["device_bytes_at_setup"], train["arena_bytes"]) << model << ": train allocates the arena fit states";
  }
  stop = true;
  for (std::thread& t : load) t.join();
}

// The GPT takes its vocabulary from its text: fit plans the one train builds from its default
// text, so the arena fit states is the arena train allocates, alone and on each of two ranks.
TEST(Fit, TheGptFitPlansIsTheGptTrainRuns) {
  const std::string step = "--model gpt --batch 2";  // small: this test runs under ASan too
  const auto fit = nlohmann::json::parse(run_cli("fit " + step + " --device cpu --device-memory 1TiB --json", false).output);
  const auto train = nlohmann::json::parse(run_cli("train " + step + " --steps 1 --eval-samples 0 --quiet --threads 1 --json", false).output);
  ASSERT_TRUE(train.contains("arena_bytes")) << train.dump();
  EXPECT_EQ(fit["arena_bytes"], train["arena_bytes"]) << "fit plans the vocabulary train builds";
  EXPECT_EQ(train["device_bytes_at_setup"], train["arena_bytes"]);

  const auto fit2 = nlohmann::json::parse(
      run_cli("fit " + step + " --devices 2 --device cpu --device-memory 1TiB --json", false).output);
  const auto r = testing::run_cli_with_env(testing::mpirun(2), "train " + step + " --steps 1 --eval-samples 0 --quiet --threads 1 --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto train2 = nlohmann::json::parse(r.output);
  ASSERT_EQ(train2["ranks"].size(), 2u) << train2.dump();
  for (const auto& rank : train2["ranks"]) EXPECT_EQ(rank["arena_bytes"], fit2["arena_bytes"]) << "per rank";

  // --vocab plans another vocabulary; train refuses one smaller than its text's.
  const auto wider = nlohmann::json::parse(run_cli("fit " + step + " --vocab 256 --device cpu --device-memory 1TiB --json", false).output);
  EXPECT_GT(wider["arena_bytes"].get<std::int64_t>(), fit["arena_bytes"].get<std::int64_t>());
  const auto narrow = run_cli("train " + step + " --vocab 20 --steps 1 --quiet");
  EXPECT_EQ(narrow.exit_code, 2) << narrow.output;
  EXPECT_NE(narrow.output.find("more than --vocab 20"), std::string::npos) << narrow.output;
}

TEST(Fit, BatchSearchIsExactOnAStepFunction) {
  // total(b) = 1000 + 37 b: the largest b with total <= budget is (budget - 1000) / 37.
  for (Bytes budget : {Bytes{999}, Bytes{1037}, Bytes{5000}, Bytes{123457}, Bytes{10'000'000}}) {
    auto search = planner::search_max_batch([budget](std::int64_t b) -> Result<bool> { return 1000 + 37 * b <= budget; });
    ASSERT_TRUE(search.ok());
    EXPECT_EQ(search.value().max_batch, budget < 1037 ? 0 : (budget - 1000) / 37) << budget;
  }
  auto limited = planner::search_max_batch([](std::int64_t b) -> Result<bool> { return b <= 1'000'000; }, 100);
  EXPECT_EQ(limited.value().max_batch, 100);
}

// The interpolating search gives the bisection's answer on every monotone need, and on affine
// needs (a training step's shape) in a handful of plans.
TEST(Fit, InterpolatingBatchSearchIsExactAndFewProbesOnAffineNeeds) {
  // only_when_over: the slack is known only for batches that do not fit (as for the optimal
  // checkpoint strategy, which spends the budget on less recomputation).
  auto probe_of = [](std::function<double(std::int64_t)> need, double budget, bool only_when_over = false) {
    return [need, budget, only_when_over](std::int64_t b) -> Result<planner::BatchProbe> {
      planner::BatchProbe p{need(b) <= budget, budget - need(b)};
      if (only_when_over && p.fits) p.slack_bytes.reset();
      return p;
    };
  };
  auto bisect_of = [](std::function<double(std::int64_t)> need, double budget) {
    return [need, budget](std::int64_t b) -> Result<bool> { return need(b) <= budget; };
  };
  struct Case {
    const char* name;
    std::function<double(std::int64_t)> need;
  };
  const Case cases[] = {
      {"affine", [](std::int64_t b) { return 1.0e9 + 3.7e6 * double(b); }},
      {"affine, rounded to 2 MiB", [](std::int64_t b) { return std::ceil((5.0e8 + 1.3e6 * double(b)) / 2097152.0) * 2097152.0; }},
      {"quadratic", [](std::int64_t b) { return 1.0e6 + 10.0 * double(b) * double(b); }},
      {"steps of 64", [](std::int64_t b) { return 1.0e6 + 5.0e5 * double((b + 63) / 64); }},
      {"square root", [](std::int64_t b) { return 1.0e6 * std::sqrt(double(b)); }},
      {"flat then steep", [](std::int64_t b) { return b < 700 ? 1.0e6 + double(b) : 1.0e6 + 1.0e5 * double(b - 699); }},
  };
  for (const Case& c : cases) {
    for (double budget : {c.need(1) - 1.0, c.need(1), c.need(2) - 1.0, c.need(37), c.need(1000) + 0.5, c.need(77777),
                          c.need(1 << 19)}) {
      for (std::int64_t limit : {std::int64_t{1} << 20, std::int64_t{500}}) {
        auto interpolated = planner::search_max_batch(planner::ProbeAtBatch(probe_of(c.need, budget)), limit);
        auto over_only = planner::search_max_batch(planner::ProbeAtBatch(probe_of(c.need, budget, true)), limit);
        auto bisected = planner::search_max_batch(planner::FitsAtBatch(bisect_of(c.need, budget)), limit);
        ASSERT_TRUE(interpolated.ok() && over_only.ok() && bisected.ok());
        EXPECT_EQ(interpolated.value().max_batch, bisected.value().max_batch) << c.name << " budget " << budget;
        EXPECT_EQ(over_only.value().max_batch, bisected.value().max_batch) << c.name << " budget " << budget;
        EXPECT_LE(over_only.value().probes, 2 * bisected.value().probes + 2) << c.name << " budget " << budget;
        for (std::int64_t start : {std::int64_t{2}, std::int64_t{37}, std::int64_t{4000}}) {
          auto started = planner::search_max_batch(planner::ProbeAtBatch(probe_of(c.need, budget, true)), limit, start);
          ASSERT_TRUE(started.ok());
          EXPECT_EQ(started.value().max_batch, bisected.value().max_batch) << c.name << " start " << start;
        }
        // Never much worse than doubling + bisection (40 plans at this limit).
        EXPECT_LE(interpolated.value().probes, 2 * bisected.value().probes + 2) << c.name << " budget " << budget;
        if (std::string(c.name) == "affine" && interpolated.value().max_batch > 2) {
          EXPECT_LE(interpolated.value().probes, 5) << "budget " << budget;
        }
      }
    }
  }
}

// A start that fits stands for batch 1 as well: the search plans batch 1 only without one.
TEST(FitAnswer, AStartThatFitsSavesProbingBatchOne) {
  for (std::int64_t start : {std::int64_t{2}, std::int64_t{30}, std::int64_t{40}}) {
    std::vector<std::int64_t> probed;
    auto probe = [&](std::int64_t b) -> Result<planner::BatchProbe> {
      probed.push_back(b);
      return planner::BatchProbe{b <= 33, 33.5 - double(b)};
    };
    auto search = planner::search_max_batch(planner::ProbeAtBatch(probe), 1000, start);
    ASSERT_TRUE(search.ok());
    EXPECT_EQ(search.value().max_batch, 33) << "start " << start;
    EXPECT_EQ(std::count(probed.begin(), probed.end(), 1), start <= 33 ? 0 : 1) << "start " << start;
    EXPECT_EQ(search.value().probes, static_cast<std::int64_t>(probed.size()));
  }
}

std::int64_t arena_at(const std::string& model, std::int64_t batch, const std::string& device = "cpu") {
  const auto r = run_cli("fit --model " + model + " --batch " + std::to_string(batch) + " --device-memory 1TiB --device " +
                             device + " --json",
                         false);
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
    const std::int64_t budget = j["device_memory_bytes"].get<std::int64_t>();
    const std::int64_t arena = arena_at(c.model, max_batch, c.device);
    EXPECT_LE(arena + overhead, budget) << c.model << " " << c.budget;
    EXPECT_GT(arena_at(c.model, max_batch + 1, c.device) + overhead, budget) << c.model << " " << c.budget;
    // Both plans are named: the top-level figures are the batch asked's, max_batch_plan the largest's.
    const std::int64_t batch = j["batch"].get<std::int64_t>();
    EXPECT_EQ(j["described_plan"].get<std::string>().rfind("batch " + std::to_string(batch) + ", the batch asked", 0), 0u)
        << j["described_plan"];
    ASSERT_TRUE(j.contains("max_batch_plan")) << r.output;
    EXPECT_EQ(j["max_batch_plan"]["batch"].get<std::int64_t>(), max_batch);
    EXPECT_EQ(j["max_batch_plan"]["checkpoint_strategy"].get<std::string>(), "none");
    EXPECT_EQ(j["max_batch_plan"]["arena_bytes"].get<std::int64_t>(), arena) << c.model << " " << c.budget;
    EXPECT_EQ(j["max_batch_plan"]["total_bytes"].get<std::int64_t>(), arena + overhead);
    EXPECT_EQ(j["max_batch_plan"]["headroom_bytes"].get<std::int64_t>(), budget - arena - overhead);
  }
}

TEST(Fit, MaxBatchTextNamesThePlanItsFiguresDescribe) {
  const auto r = run_cli("fit --model mlp --batch 8 --budget 20MiB --device cpu --max-batch", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(run_cli("fit --model mlp --batch 8 --budget 20MiB --device cpu --max-batch --json", false).output);
  const std::int64_t max_batch = j["max_batch"].get<std::int64_t>();
  EXPECT_NE(r.output.find("plan at batch 8, the batch asked:\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("largest batch " + std::to_string(max_batch) + " (--checkpoint none), its plan: arena " +
                          format_bytes(j["max_batch_plan"]["arena_bytes"].get<std::int64_t>())),
            std::string::npos)
      << r.output;
  // Without --max-batch there is one plan, and nothing to tell apart.
  const auto single = run_cli("fit --model mlp --batch 8 --budget 20MiB --device cpu --json", false);
  const auto one = nlohmann::json::parse(single.output);
  EXPECT_FALSE(one.contains("max_batch_plan"));
  EXPECT_FALSE(one.contains("described_plan"));
}

// The batch search asks optimal and auto only whether some frontier point fits (any_fitting,
// searched from the least-memory end). Its yes or no must be the one of the least-recomputation
// search at every batch, and the largest batch must be exact under the least-recomputation plans.
TEST(Fit, AnyFittingProbesAnswerAsTheLeastRecomputationDoes) {
  models::ModelOptions model;
  model.name = "gpt";
  model.gpt.vocab = 32;
  model.gpt.context = 32;
  model.gpt.layers = 4;
  model.gpt.heads = 2;
  model.gpt.width = 32;
  const Bytes budget = 6 << 20;
  planner::FitQuestion question;
  question.step = planner::StepDescription::of_source(models::registry_source(model), 1);
  question.request.checkpoint = planner::CheckpointStrategy::kOptimal;
  question.device_memory = budget;
  question.max_batch_strategies = {planner::CheckpointStrategy::kNone, planner::CheckpointStrategy::kOptimal,
                                   planner::CheckpointStrategy::kAuto};
  auto answer = planner::answer_fit(question);
  ASSERT_TRUE(answer.ok()) << answer.error().message;
  ASSERT_EQ(answer.value().max_batch.size(), 3u);
  const std::int64_t none_max = answer.value().max_batch[0].max_batch;
  for (std::size_t row = 1; row < 3; ++row) {
    const planner::StrategyMaxBatch& r = answer.value().max_batch[row];
    ASSERT_GT(r.max_batch, none_max) << "checkpointing must buy batch here, or the test checks nothing";
    auto plan_at = [&](std::int64_t batch, bool any_fitting) {
      planner::StepDescription step = question.step;
      step.batch = batch;
      planner::PlanRequest request;
      request.checkpoint = r.strategy;
      request.budget = question.request.device.arena_budget(budget);
      request.answer_only = true;
      request.any_fitting = any_fitting;
      auto p = planner::plan_step(step, request);
      EXPECT_TRUE(p.ok());
      return std::move(p).value();
    };
    EXPECT_TRUE(plan_at(r.max_batch, false).fits) << planner::checkpoint_strategy_name(r.strategy);
    EXPECT_FALSE(plan_at(r.max_batch + 1, false).fits) << planner::checkpoint_strategy_name(r.strategy);
    // Either side of both boundaries (none's and this strategy's) and between them.
    for (std::int64_t batch : {none_max, none_max + 1, (none_max + r.max_batch) / 2, r.max_batch - 1, r.max_batch,
                               r.max_batch + 1, r.max_batch + 2}) {
      // Under the sanitizers the three batches at the boundaries (each probe plans twice, seconds there).
      if (testing::kSanitized && batch != none_max + 1 && batch != r.max_batch && batch != r.max_batch + 1) continue;
      const planner::PlannedStep any = plan_at(batch, true);
      EXPECT_EQ(any.fits, plan_at(batch, false).fits) << "batch " << batch;
      if (any.fits) {
        EXPECT_LE(any.plan.arena_bytes, *any.budget) << "batch " << batch;
      }
      if (batch > none_max) {
        ASSERT_TRUE(any.checkpoint && any.checkpoint->least_arena_estimate) << "batch " << batch;
        EXPECT_GT(*any.checkpoint->least_arena_estimate, 0);
      }
    }
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

TEST(Fit, MinimumNamesTheLeastArenaAndAStrategyThatReachesIt) {
  const std::string step = "fit --model gpt --batch 32 --device cpu --json";
  const auto roomy = nlohmann::json::parse(run_cli(step + " --device-memory 1TiB", false).output);
  const std::int64_t arena = roomy["arena_bytes"].get<std::int64_t>();
  const std::string tight = " --device-memory " + std::to_string(arena / 2);
  const auto plain = nlohmann::json::parse(run_cli(step + tight, false).output);
  EXPECT_FALSE(plain["fits"].get<bool>());
  EXPECT_FALSE(plain.contains("minimum_arena")) << "only searched when asked";
  const auto j = nlohmann::json::parse(run_cli(step + tight + " --minimum", false).output);
  ASSERT_TRUE(j.contains("minimum_arena")) << j.dump();
  const std::int64_t least = j["minimum_arena"]["arena_bytes"].get<std::int64_t>();
  const std::string strategy = j["minimum_arena"]["strategy"].get<std::string>();
  EXPECT_LT(least, arena);
  // The named strategy fits in exactly that much memory; a byte less fits under no strategy.
  const auto at = nlohmann::json::parse(
      run_cli(step + " --checkpoint " + strategy + " --device-memory " + std::to_string(least), false).output);
  EXPECT_TRUE(at["fits"].get<bool>()) << at.dump();
  const auto below = nlohmann::json::parse(
      run_cli(step + " --checkpoint auto --device-memory " + std::to_string(least - 1), false).output);
  EXPECT_FALSE(below["fits"].get<bool>()) << below.dump();
}

TEST(Fit, BadDeviceMemoryIsAUsageError) {
  for (const char* flag : {"--device-memory", "--budget"}) {  // --budget: the older name, still accepted
    for (const char* size : {"0", "-1GiB", "12parsecs", "nan", "99999999999TiB", "''"}) {
      const auto r = run_cli(std::string("fit ") + flag + " " + size);
      EXPECT_EQ(r.exit_code, 2) << flag << " " << size << "\n" << r.output;
      EXPECT_NE(r.output.find("--device-memory"), std::string::npos) << r.output;
    }
  }
  EXPECT_EQ(run_cli("fit").exit_code, 2) << "--device-memory is required";
  const auto old_name = nlohmann::json::parse(run_cli("fit --budget 64MiB --device cpu --json", false).output);
  const auto new_name = nlohmann::json::parse(run_cli("fit --device-memory 64MiB --device cpu --json", false).output);
  EXPECT_EQ(old_name["device_memory_bytes"], new_name["device_memory_bytes"]);
  EXPECT_EQ(old_name["arena_bytes"], new_name["arena_bytes"]);
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

// A probe that asks only "fits or not" runs the exact search only where it can change that
// answer, so it answers as the full plan does at every budget around the two arenas, and where
// the greedy packing already fits it answers with that packing (no search run).
TEST(DecideAgainst, AnswersAsTheFullPlanAndSearchesOnlyWhereTheAnswerDepends) {
  models::ModelOptions model;
  model.name = "cnn";
  graph::Graph g = models::build_forward(model, 8).value();
  graph::make_training_step(g, graph::OptimizerConfig{});
  planner::PlanOptions greedy_only;
  greedy_only.solver = planner::SolverBudget::greedy_only();
  const Bytes greedy = planner::plan_memory(g, greedy_only).value().arena_bytes;
  const Bytes best = planner::plan_memory(g).value().arena_bytes;
  ASSERT_LT(best, greedy) << "the exact search must beat the greedy packing here, or the test checks nothing";
  const Bytes bound = planner::arena_lower_bound(g).value();
  for (bool skip_dominated : {false, true}) {
    for (Bytes budget : {bound - 1, bound, best - 1, best, (best + greedy) / 2, greedy - 1, greedy, greedy + 1}) {
      planner::PlanOptions probe;
      probe.skip_dominated_schedule = skip_dominated;
      probe.decide_against = budget;
      const planner::MemoryPlan plan = planner::plan_memory(g, probe).value();
      EXPECT_EQ(plan.arena_bytes <= budget, best <= budget) << "budget " << budget << " skip " << skip_dominated;
      EXPECT_TRUE(planner::validate_plan(plan).ok());
    }
  }
  // Where both orders' greedy packings fit, neither is searched; planning the memory-aware order
  // first, the program order is not even planned.
  planner::PlanOptions roomy;
  roomy.decide_against = 2 * greedy;
  EXPECT_EQ(planner::plan_memory(g, roomy).value().arena_bytes, greedy) << "searched where the answer was known";
  roomy.skip_dominated_schedule = true;
  const planner::MemoryPlan aware_only = planner::plan_memory(g, roomy).value();
  EXPECT_TRUE(aware_only.program_order_skipped);
  EXPECT_EQ(aware_only.schedule_kind, planner::ScheduleKind::memory_aware);
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

// arena_lower_bound sums what plan_memory's plans state as their lower bounds, without building
// them: the least over the two orders, equal to the plans' to the byte (16-bit, ZeRO, checkpointed
// and guarded steps included).
TEST(ArenaLowerBound, EqualsTheLowerBoundOfThePlansItStandsFor) {
  struct Case {
    const char* model;
    std::int64_t batch;
    graph::DType dtype;
    Bytes guard;
  };
  for (const Case& c : {Case{"mlp", 16, graph::DType::f32, 0}, Case{"cnn", 8, graph::DType::bf16, 0},
                        Case{"gpt", 4, graph::DType::f16, 256}, Case{"gpt", 3, graph::DType::f32, 0}}) {
    models::ModelOptions model;
    model.name = c.model;
    graph::Graph g = models::build_forward(model, c.batch).value();
    if (c.dtype != graph::DType::f32) g = graph::with_working_dtype(g, c.dtype);
    graph::make_training_step(g, graph::OptimizerConfig{});
    for (bool widen : {false, true}) {
      planner::PlanOptions options;
      options.guard_bytes = c.guard;
      options.workspace_bytes = 4096 + 3;
      options.widen_16bit = widen;
      Bytes least = 0;
      for (planner::ScheduleKind kind :
           {planner::ScheduleKind::program, planner::ScheduleKind::memory_aware, planner::ScheduleKind::searched}) {
        planner::PlanOptions one = options;
        one.choose_best_schedule = false;
        one.schedule = kind;
        const Bytes bound = planner::plan_memory(g, one).value().lower_bound_bytes;
        EXPECT_EQ(planner::arena_lower_bound(g, one).value(), bound) << c.model << " " << planner::schedule_name(kind);
        least = least == 0 ? bound : std::min(least, bound);
      }
      EXPECT_EQ(planner::arena_lower_bound(g, options).value(), least) << c.model << " widen " << widen;
    }
  }
}

// The order-free bound holds for every order plan_memory considers: never above the searched
// bound (on the steps above, with and without in-place merging and guard bytes), and not far
// below it on a training step, where it decides for a checkpoint frontier's search.
TEST(OrderFreeLowerBound, IsBelowTheSearchedBoundAndNearIt) {
  for (const char* name : {"mlp", "cnn", "gpt"}) {
    models::ModelOptions model;
    model.name = name;
    graph::Graph g = models::build_forward(model, 4).value();
    graph::make_training_step(g, graph::OptimizerConfig{});
    for (bool in_place : {false, true}) {
      for (Bytes guard : {Bytes{0}, Bytes{512}}) {
        planner::PlanOptions options;
        options.in_place = in_place;
        options.guard_bytes = guard;
        const Bytes searched = planner::arena_lower_bound(g, options).value();
        const Bytes cheap = planner::order_free_lower_bound(g, options).value();
        EXPECT_LE(cheap, searched) << name << " in_place " << in_place << " guard " << guard;
        EXPECT_GE(double(cheap), 0.9 * double(searched)) << name << " in_place " << in_place << " guard " << guard;
      }
    }
  }
}

// In-place merging shares one buffer among an op's input and the output it writes over it: at
// that op the bound counts the buffer once, as liveness does (x, its scaled copy and their ReLU
// all live in x's storage, one buffer of 4 KiB).
TEST(OrderFreeLowerBound, CountsAnOutputWrittenOverItsInputOnce) {
  graph::Graph g;
  const TensorId x = g.add_tensor({.name = "x", .shape = graph::Shape{1024}, .dtype = graph::DType::f32, .role = graph::Role::input});
  const TensorId a = g.add_op(graph::OpKind::scale, {x}, graph::OpAttrs{}, "a", graph::Role::activation, graph::Phase::forward);
  g.output = g.add_op(graph::OpKind::relu, {a}, graph::OpAttrs{}, "b", graph::Role::activation, graph::Phase::forward);
  planner::PlanOptions options;
  options.in_place = true;
  EXPECT_EQ(planner::plan_memory(g, options).value().arena_bytes, 4096);
  EXPECT_EQ(planner::arena_lower_bound(g, options).value(), 4096);
  EXPECT_EQ(planner::order_free_lower_bound(g, options).value(), 4096);
  options.in_place = false;  // three buffers; at each op two of them live
  EXPECT_EQ(planner::arena_lower_bound(g, options).value(), 8192);
  EXPECT_EQ(planner::order_free_lower_bound(g, options).value(), 8192);
}

}  // namespace
}  // namespace memplan
