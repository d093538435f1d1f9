// Numerics guard and out-of-memory at setup: a non-finite value stops training with the step and,
// with the `finite` debug switch, the first op and tensor that became non-finite; an arena larger
// than the device can give is refused at setup with the sizes and the largest batch that fits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cli_util.h"
#include "tests/test_util.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/trainer.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

graph::Graph small_mlp_step() {
  models::ModelOptions options;
  options.name = "mlp";
  options.mlp = {12, {8}, 3};
  graph::Graph g = models::build_forward(options, 4).value();
  graph::make_training_step(g, graph::OptimizerConfig{});
  return g;
}

void feed(runtime::Executor& e, float poison_pixel) {
  const graph::Graph& g = e.graph();
  std::vector<float> x(static_cast<std::size_t>(g.tensor(g.find("x")).shape.numel()), 0.5f);
  x[5] = poison_pixel;
  std::vector<std::int32_t> y = {0, 1, 2, 1};
  e.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  e.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
}

TEST(NumericsGuard, NonFiniteLossStopsTrainingWithTheStep) {
  const graph::Graph g = small_mlp_step();
  runtime::CpuDevice device;
  runtime::Executor e(g, testing::plan_for(g, device), device);
  ASSERT_TRUE(e.setup().ok());
  e.initialize_persistent(1);
  // Two good steps, then a NaN weight in the last layer (ReLU would hide a NaN pixel: max(NaN, 0)
  // is 0).
  const TensorId w = g.find("fc2.weight");
  ASSERT_NE(w, kNoTensor);
  auto summary = runtime::train(e, 5, [&](std::int64_t i, runtime::Executor& ex) {
    feed(ex, 0.5f);
    if (i == 2) {
      std::vector<float> weights(static_cast<std::size_t>(g.tensor(w).shape.numel()), 0.1f);
      weights[0] = std::numeric_limits<float>::quiet_NaN();
      ex.write_tensor(w, weights.data());
    }
  }, nullptr);
  ASSERT_FALSE(summary.ok());
  EXPECT_NE(summary.error().message.find("non-finite"), std::string::npos) << summary.error().message;
  EXPECT_NE(summary.error().message.find("at step 3"), std::string::npos) << summary.error().message;
}

TEST(NumericsGuard, FiniteDebugNamesTheFirstOpAndTensor) {
  const graph::Graph g = small_mlp_step();
  runtime::CpuDevice device;
  runtime::ExecutorOptions options;
  options.debug.finite = true;
  runtime::Executor e(g, testing::plan_for(g, device), device, options);
  ASSERT_TRUE(e.setup().ok());
  e.initialize_persistent(1);
  feed(e, 0.5f);
  ASSERT_TRUE(e.run_step().ok()) << "finite data must pass the guard";
  // Infinity in the data: the first op to read the input is named, with the element.
  feed(e, std::numeric_limits<float>::infinity());
  Status s = e.run_step();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("reads inf from 'x'[5] (input)"), std::string::npos) << s.error().message;
  // A NaN weight: the first op that reads it, not the loss, is reported.
  feed(e, 0.5f);
  const TensorId w = g.find("fc2.weight");
  ASSERT_NE(w, kNoTensor);
  std::vector<float> weights(static_cast<std::size_t>(g.tensor(w).shape.numel()), 0.1f);
  weights[3] = std::numeric_limits<float>::quiet_NaN();
  e.write_tensor(w, weights.data());
  s = e.run_step();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("from 'fc2.weight'[3] (parameter)"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("first non-finite tensor: op '"), std::string::npos) << s.error().message;
}

TEST(NumericsGuard, OutOfMemoryAtSetupNamesTheArena) {
  const graph::Graph g = small_mlp_step();
  runtime::CpuDevice device(/*capacity_bytes=*/1024);
  runtime::Executor e(g, testing::plan_for(g, device), device);
  const Status s = e.setup();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("cannot allocate the arena of " + std::to_string(e.plan()->arena_bytes)),
            std::string::npos)
      << s.error().message;
  EXPECT_EQ(device.stats().bytes_in_use, 0);
}

// The digits that start at `pos` in `text` ("" if none). Plain string search rather than <regex>,
// whose headers trip -Wmaybe-uninitialized (an error here) in the -O1 sanitizer build.
std::string digits_at(const std::string& text, std::size_t pos) {
  std::size_t end = pos;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  return pos < text.size() ? text.substr(pos, end - pos) : std::string();
}

// The number that follows the first `prefix` in `text` ("" if the prefix is missing or no digits follow).
std::string number_after(const std::string& text, const std::string& prefix) {
  const auto at = text.find(prefix);
  return at == std::string::npos ? std::string() : digits_at(text, at + prefix.size());
}

struct TrainGuardsCli : ::testing::Test {
  void SetUp() override {
    dir = fs::temp_directory_path() / ("memplan_guards_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 100; ++i) text << "numbers that grow without bound " << i << "\n";
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string gpt(const std::string& batch) const {
    return "train --model gpt --layers 1 --width 16 --heads 2 --seq 16 --batch " + batch +
           " --threads 1 --quiet --data " + (dir / "text.txt").string();
  }
  // Four layers: a chain long enough for checkpointing to matter (5.5 MiB -> 1.6 MiB at batch 16).
  std::string deep_gpt(const std::string& batch) const {
    return "train --model gpt --layers 4 --width 32 --heads 2 --seq 32 --batch " + batch +
           " --threads 1 --quiet --steps 1 --data " + (dir / "text.txt").string();
  }
  fs::path dir;
};

TEST_F(TrainGuardsCli, DivergingLearningRateStopsWithTheStepAndTheFirstTensor) {
  const auto plain = testing::run_cli(gpt("2") + " --steps 20 --optimizer sgd --lr 1e30");
  EXPECT_EQ(plain.exit_code, 1) << plain.output;
  const auto non_finite = plain.output.find("non-finite");
  ASSERT_NE(non_finite, std::string::npos) << plain.output;
  EXPECT_FALSE(number_after(plain.output.substr(non_finite), " at step ").empty()) << plain.output;
  EXPECT_NE(plain.output.find("--debug finite"), std::string::npos) << plain.output;

  const auto debug = testing::run_cli(gpt("2") + " --steps 20 --optimizer sgd --lr 1e30 --debug finite");
  EXPECT_EQ(debug.exit_code, 1) << debug.output;
  // "step N: first non-finite tensor: op 'OP' ... 'TENSOR'[INDEX]"
  const std::string marker = ": first non-finite tensor: op '";
  const auto at = debug.output.find(marker);
  ASSERT_NE(at, std::string::npos) << debug.output;
  const auto step_at = debug.output.rfind("step ", at);
  ASSERT_NE(step_at, std::string::npos) << debug.output;
  EXPECT_EQ(digits_at(debug.output, step_at + 5).size(), at - step_at - 5) << debug.output;
  const auto op_end = debug.output.find('\'', at + marker.size());
  ASSERT_NE(op_end, std::string::npos) << debug.output;
  EXPECT_GT(op_end, at + marker.size()) << "empty op name: " << debug.output;
  const auto index_at = debug.output.find("'[", op_end + 1);
  ASSERT_NE(index_at, std::string::npos) << debug.output;
  EXPECT_FALSE(digits_at(debug.output, index_at + 2).empty()) << debug.output;
}

TEST_F(TrainGuardsCli, ArenaLargerThanTheDeviceSuggestsABatchThatFits) {
  const auto r = testing::run_cli(gpt("64") + " --steps 1 --device-memory 1MiB --save " + (dir / "w.safetensors").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("out of memory at setup: the arena needs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the device can give 1.00 MiB (1048576 bytes"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "w.safetensors"));
  const std::string batch = number_after(r.output, "largest batch that fits is ");
  ASSERT_FALSE(batch.empty()) << r.output;
  EXPECT_NE(r.output.find("largest batch that fits is " + batch + ": try --batch"), std::string::npos) << r.output;
  EXPECT_LT(std::stoll(batch), 64);
  // The suggestion is right: that batch trains within the same device memory; one more does not.
  const auto fits = testing::run_cli(gpt(batch) + " --steps 1 --device-memory 1MiB");
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  const auto over = testing::run_cli(gpt(std::to_string(std::stoll(batch) + 1)) + " --steps 1 --device-memory 1MiB");
  EXPECT_EQ(over.exit_code, 1) << over.output;
}

TEST_F(TrainGuardsCli, ArenaLargerThanTheDeviceSuggestsCheckpointingThatFits) {
  const std::string run = deep_gpt("16") + " --device-memory 3MiB";
  const auto r = testing::run_cli(run);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string prefix = "batch 16 fits with activation checkpointing: add ";
  const auto at = r.output.find(prefix);
  ASSERT_NE(at, std::string::npos) << r.output;
  const auto end = r.output.find(" (", at);
  ASSERT_NE(end, std::string::npos) << r.output;
  const std::string flags = r.output.substr(at + prefix.size(), end - at - prefix.size());
  EXPECT_EQ(flags.rfind("--checkpoint auto --budget ", 0), 0u) << flags;
  // The suggestion is right: the same run with those flags trains within the same device memory.
  const auto fits = testing::run_cli(run + " " + flags);
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
}

TEST_F(TrainGuardsCli, LargestBatchAdviceUsesTheRunsCheckpointStrategy) {
  const auto r = testing::run_cli(deep_gpt("64") + " --device-memory 3MiB --checkpoint sqrt");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.find("fits with activation checkpointing"), std::string::npos) << "already checkpointing: " << r.output;
  const std::string batch = number_after(r.output, "largest batch that fits with --checkpoint sqrt is ");
  ASSERT_FALSE(batch.empty()) << r.output;
  EXPECT_LT(std::stoll(batch), 64);
  const auto fits = testing::run_cli(deep_gpt(batch) + " --device-memory 3MiB --checkpoint sqrt");
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  const auto over = testing::run_cli(deep_gpt(std::to_string(std::stoll(batch) + 1)) + " --device-memory 3MiB --checkpoint sqrt");
  EXPECT_EQ(over.exit_code, 1) << over.output;
}

}  // namespace
}  // namespace memplan
