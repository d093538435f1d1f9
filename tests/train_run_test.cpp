// Training as a library call (train/run.h): a TrainSpec runs to a TrainReport that holds what a
// session driven by hand computes, the events arrive in order, and each way a run can stop says
// which it is (input, budget, run) with what would work.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "small_datasets.h"
#include "memplan/runtime/devices.h"
#include "memplan/train/run.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

const std::string& small_images() {
  static const std::string dir = [] {
    const fs::path d = fs::temp_directory_path() / ("memplan_train_run_" + std::to_string(::getpid())) / "images";
    testing::write_small_fashion_mnist(d, 256, 64);
    return d.string();
  }();
  return dir;
}

train::TrainSpec small_mlp_spec() {
  train::TrainSpec spec;
  spec.model.name = "mlp";
  spec.model.mlp.hidden = {16};
  spec.data = small_images();
  spec.batch = 16;
  spec.steps = 3;
  spec.seed = 11;
  spec.optimizer.kind = graph::OptimizerKind::adamw;
  spec.optimizer.lr = 3e-3f;
  spec.device = kernels::DeviceKind::cpu;
  spec.threads = 1;
  return spec;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(TrainRun, TheReportHoldsWhatASessionDrivenByHandComputes) {
  const train::TrainSpec spec = small_mlp_spec();
  int starts = 0;
  std::vector<std::int64_t> steps_seen;
  train::TrainEvents events;
  events.start = [&](const train::TrainStart& s) {
    ++starts;
    EXPECT_EQ(s.steps, 3);
    EXPECT_EQ(s.steps_per_epoch, 256 / 16);
    EXPECT_EQ(s.samples_per_step, 16);
    EXPECT_FALSE(s.text_model);
  };
  events.step = [&](const runtime::StepReport& r) { steps_seen.push_back(r.step); };
  auto report = train::run_training(spec, nullptr, events);
  ASSERT_TRUE(report.ok()) << report.error().message;
  const train::TrainReport& r = report.value();
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(steps_seen, (std::vector<std::int64_t>{1, 2, 3}));

  // The same run by hand: data, session, setup, three steps, evaluation.
  runtime::CpuDevice device;
  auto data = train::load_run_data(spec.model, spec.data, spec.batch);
  ASSERT_TRUE(data.ok()) << data.error().message;
  train::SessionOptions options;
  options.batch = spec.batch;
  options.seed = spec.seed;
  options.optimizer = spec.optimizer;
  auto session = train::TrainingSession::plan(std::move(data).value(), options, device);
  ASSERT_TRUE(session.ok()) << session.error().message;
  ASSERT_TRUE(session.value()->setup().ok());
  auto summary = session.value()->run(3, {});
  ASSERT_TRUE(summary.ok()) << summary.error().message;
  auto evaluation = session.value()->evaluate();
  ASSERT_TRUE(evaluation.ok());

  EXPECT_TRUE(r.reporting);
  EXPECT_EQ(r.params_sha256, session.value()->params_sha256());
  EXPECT_EQ(r.summary.losses, summary.value().losses);
  ASSERT_TRUE(r.plan.has_value());
  EXPECT_EQ(r.plan->arena_bytes, session.value()->executor().plan()->arena_bytes);
  ASSERT_TRUE(r.test.has_value());
  EXPECT_EQ(r.test->accuracy, evaluation.value().classifier->accuracy);
  EXPECT_EQ(r.world, 1);
  EXPECT_EQ(r.device_allocations_during_steps, 0);
  EXPECT_DOUBLE_EQ(r.epochs, 3.0 / 16.0);
  EXPECT_EQ(r.spec.label(), "mlp");
}

TEST(TrainRun, StepsLeftAtZeroArePassesOverTheData) {
  train::TrainSpec spec = small_mlp_spec();
  spec.steps = 0;
  spec.epochs = 1;
  auto report = train::run_training(spec);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_EQ(report.value().summary.steps, 256 / 16);
  EXPECT_EQ(report.value().spec.steps, 256 / 16);
  EXPECT_DOUBLE_EQ(report.value().epochs, 1.0);
}

TEST(TrainRun, TheGlobalBatchIsCheckedOnceAndNamedAsTheCallerNamesIt) {
  train::TrainSpec spec = small_mlp_spec();
  spec.batch = 10;
  EXPECT_TRUE(train::check_train_spec(spec, 1).ok());
  const Status quantities = train::check_train_spec(spec, 4);
  ASSERT_FALSE(quantities.ok());
  EXPECT_TRUE(has(quantities.error().message, "the batch 10 is the global batch and must divide among the 4 ranks: use a "
                                              "multiple of 4 (e.g. 8 or 12)"))
      << quantities.error().message;
  planner::SizeNaming flags = planner::quantity_naming();
  flags.name = [](const graph::SizeKnob& k, std::optional<std::int64_t> v) {
    return (k.key == "batch" ? std::string("--batch") : k.quantity) + (v ? " " + std::to_string(*v) : "");
  };
  const Status named = train::check_train_spec(spec, 4, flags);
  ASSERT_FALSE(named.ok());
  EXPECT_TRUE(has(named.error().message, "--batch 10 is the global batch")) << named.error().message;
  // An ONNX model is read later, but its global batch is refused just as early.
  spec.onnx.path = "model.onnx";
  const Status onnx = train::check_train_spec(spec, 3);
  ASSERT_FALSE(onnx.ok());
  EXPECT_TRUE(has(onnx.error().message, "use a multiple of 3 (e.g. 9 or 12)")) << onnx.error().message;
}

TEST(TrainRun, WhatSeveralRanksCannotDoIsRefusedBeforeAnythingRuns) {
  train::TrainSpec spec = small_mlp_spec();
  spec.mode = runtime::ExecutionMode::naive;
  EXPECT_TRUE(train::check_train_spec(spec, 1).ok());
  const Status naive = train::check_train_spec(spec, 2);
  ASSERT_FALSE(naive.ok());
  EXPECT_TRUE(has(naive.error().message, "--mode planned only")) << naive.error().message;
  spec = small_mlp_spec();
  spec.save = "weights.safetensors";
  spec.zero = 1;
  const Status sharded_save = train::check_train_spec(spec, 2);
  ASSERT_FALSE(sharded_save.ok());
  EXPECT_TRUE(has(sharded_save.error().message, "--zero 0 only")) << sharded_save.error().message;
}

TEST(TrainRun, EachWayARunStopsSaysWhichItIs) {
  // A budget the checkpoint strategies cannot meet: the plan that came closest comes back.
  train::TrainSpec spec = small_mlp_spec();
  spec.request.budget = 1024;
  spec.request.checkpoint = planner::CheckpointStrategy::kSqrt;
  auto over = train::run_training(spec);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().kind, train::TrainError::Kind::over_budget);
  ASSERT_TRUE(over.error().unmet.has_value());
  EXPECT_FALSE(over.error().unmet->fits);

  // A device too small for the arena: a run failure, with the batch that would fit.
  spec = small_mlp_spec();
  spec.batch = 128;
  spec.device_memory = 256 * 1024;
  auto small = train::run_training(spec);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().kind, train::TrainError::Kind::run);
  EXPECT_TRUE(has(small.error().message, "out of memory at setup: the arena needs")) << small.error().message;
  EXPECT_TRUE(has(small.error().message, "\nthe largest batch that fits is ")) << small.error().message;

  // A file that is not a saved run: an input error, found before any data is read.
  const fs::path not_weights = fs::temp_directory_path() / ("memplan_train_run_" + std::to_string(::getpid())) / "x.txt";
  std::ofstream(not_weights) << "not a safetensors file";
  spec = small_mlp_spec();
  spec.load = not_weights.string();
  spec.data = "/nonexistent/folder";  // read after the check: the error is the file's
  auto bad_load = train::run_training(spec);
  ASSERT_FALSE(bad_load.ok());
  EXPECT_EQ(bad_load.error().kind, train::TrainError::Kind::input);
  EXPECT_TRUE(has(bad_load.error().message, "--load: ")) << bad_load.error().message;
}

}  // namespace
}  // namespace memplan
