// train/saved_run: the metadata --save writes, and a run saved after n steps and loaded into a
// fresh executor continuing bit for bit as if it had never stopped; a file without the
// optimizer's state restarts the step count; errors name the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "memplan/common/rng.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/trainer.h"
#include "memplan/train/classifier.h"
#include "memplan/train/language_model.h"
#include "memplan/train/saved_run.h"
#include "test_util.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

models::ImageDataset noisy_images(std::int64_t count) {
  models::ImageDataset data;
  data.count = count;
  data.rows = 3;
  data.cols = 3;
  data.classes = 3;
  Rng rng(17);
  for (std::int64_t i = 0; i < count * 9; ++i) data.images.push_back(rng.uniform01());
  for (std::int64_t i = 0; i < count; ++i) data.labels.push_back(static_cast<std::int32_t>(rng.below(3)));
  return data;
}

models::ModelOptions small_mlp() {
  models::ModelOptions model;
  model.mlp = {9, {6}, 3};
  return model;
}

graph::Graph mlp_training_step(graph::OptimizerKind optimizer) {
  graph::Graph g = models::build_forward(small_mlp(), 4).value();
  graph::OptimizerConfig opt;
  opt.kind = optimizer;
  opt.lr = 1e-2f;
  graph::make_training_step(g, opt);
  return g;
}

struct SavedRun : ::testing::Test {
  void SetUp() override {
    dir = fs::temp_directory_path() / ("memplan_saved_run_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  // Steps [first, first + steps) of a run over `data`, as `memplan train` feeds them.
  static void run_steps(runtime::Executor& executor, const models::ImageDataset& data, std::int64_t first,
                        std::int64_t steps) {
    train::BatchFeeder feeder(data, 4, /*seed=*/2);
    auto summary = runtime::train(
        executor, steps, [&](std::int64_t i, runtime::Executor& e) { feeder.feed(first + i, e); }, nullptr);
    ASSERT_TRUE(summary.ok()) << summary.error().message;
  }
  fs::path dir;
};

TEST_F(SavedRun, MetadataNamesTheModelAndOptimizerAndAGptsVocabulary) {
  const auto mlp = train::run_metadata(small_mlp(), "momentum", nullptr);
  EXPECT_EQ(mlp, (std::map<std::string, std::string>{{"memplan.model", "mlp"}, {"memplan.optimizer", "momentum"}}));

  std::string text;
  for (int i = 0; i < 10; ++i) text += "to be or not to be ";
  const models::TextDataset data = models::make_text_dataset(text, 5).value();
  models::ModelOptions gpt;
  gpt.name = "gpt";
  gpt.gpt.vocab = data.vocab_size();
  const auto metadata = train::run_metadata(gpt, "adamw", &data);
  EXPECT_EQ(metadata.at("memplan.optimizer"), "adamw");
  auto saved = train::parse_gpt_metadata(metadata, "gpt.safetensors");
  ASSERT_TRUE(saved.ok()) << saved.error().message;
  EXPECT_EQ(saved.value().vocab, data.vocab);
  EXPECT_EQ(saved.value().config.width, gpt.gpt.width);
}

TEST_F(SavedRun, AResumedRunEndsWithTheWeightsOfOneThatNeverStopped) {
  const models::ImageDataset data = noisy_images(20);  // 5 steps per epoch: the resume crosses an epoch
  const graph::Graph g = mlp_training_step(graph::OptimizerKind::adamw);
  testing::CpuRun whole(g);
  whole.executor.initialize_persistent(1);
  run_steps(whole.executor, data, 0, 8);

  testing::CpuRun first_half(g);
  first_half.executor.initialize_persistent(1);
  run_steps(first_half.executor, data, 0, 3);
  const std::string path = (dir / "run.safetensors").string();
  ASSERT_TRUE(train::save_run(first_half.executor, path, small_mlp(), "adamw", nullptr).ok());

  testing::CpuRun second_half(g);
  second_half.executor.initialize_persistent(99);  // loading replaces every persistent tensor
  auto loaded = train::load_run(second_half.executor, path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded.value().step, 3);
  EXPECT_TRUE(loaded.value().fresh_state.empty());
  EXPECT_EQ(second_half.executor.steps_completed(), 3);
  EXPECT_EQ(second_half.executor.params_sha256(), first_half.executor.params_sha256());
  run_steps(second_half.executor, data, loaded.value().step, 5);
  EXPECT_EQ(second_half.executor.params_sha256(), whole.executor.params_sha256());
}

TEST_F(SavedRun, AFileWithoutTheOptimizerStateRestartsTheStepCount) {
  const models::ImageDataset data = noisy_images(20);
  const graph::Graph sgd_graph = mlp_training_step(graph::OptimizerKind::sgd);
  testing::CpuRun sgd(sgd_graph);
  sgd.executor.initialize_persistent(1);
  run_steps(sgd.executor, data, 0, 2);
  const std::string path = (dir / "sgd.safetensors").string();
  ASSERT_TRUE(train::save_run(sgd.executor, path, small_mlp(), "sgd", nullptr).ok());

  const graph::Graph g = mlp_training_step(graph::OptimizerKind::adamw);
  testing::CpuRun adamw(g);
  auto loaded = train::load_run(adamw.executor, path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_FALSE(loaded.value().fresh_state.empty());
  EXPECT_EQ(loaded.value().step, 0);
  EXPECT_EQ(adamw.executor.params_sha256(), sgd.executor.params_sha256());
}

TEST_F(SavedRun, ErrorsNameTheFile) {
  const graph::Graph g = mlp_training_step(graph::OptimizerKind::adamw);
  testing::CpuRun run(g);
  const std::string missing = (dir / "missing.safetensors").string();
  auto not_there = train::load_run(run.executor, missing);
  ASSERT_FALSE(not_there.ok());
  EXPECT_NE(not_there.error().message.find(missing), std::string::npos) << not_there.error().message;

  models::ModelOptions wider = small_mlp();
  wider.mlp.hidden = {7};
  graph::Graph other_graph = models::build_forward(wider, 4).value();
  testing::CpuRun other(other_graph);
  const std::string path = (dir / "wider.safetensors").string();
  ASSERT_TRUE(train::save_run(other.executor, path, wider, "sgd", nullptr).ok());
  auto mismatch = train::load_run(run.executor, path);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.error().message.rfind(path, 0), 0u) << mismatch.error().message;
  EXPECT_NE(mismatch.error().message.find("does not match"), std::string::npos) << mismatch.error().message;
}

}  // namespace
}  // namespace memplan
