// `train --dtype bf16|fp16` end to end: the arena `fit --device cpu --dtype D` answers is the
// arena train allocates, no allocation happens during steps, planned and naive execution end with
// the same bits, and the run says its precision.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "small_datasets.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

struct MixedPrecisionCli : ::testing::Test {
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("memplan_mixed_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    testing::write_small_fashion_mnist(dir / "images", 128, 32);
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 300; ++i) text << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  static inline fs::path dir;
};

nlohmann::json json_of(const std::string& command) {
  const auto r = testing::run_cli(command, /*merge_stderr=*/false);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

TEST_F(MixedPrecisionCli, FitAnswersTheArenaTrainAllocatesAndModesAgreeBitForBit) {
  struct Model {
    std::string fit, train;
  };
  const std::string images = " --data " + (dir / "images").string();
  const Model models[] = {
      {"--model mlp --batch 16", "--model mlp --batch 16" + images},
      {"--model cnn --batch 64", "--model cnn --batch 64" + images},  // large enough that a view outgrows the slack
      {"--model gpt --batch 2 --vocab 64", "--model gpt --batch 2 --vocab 64 --data " + (dir / "text.txt").string()},
  };
  // Under the sanitizers each model runs in one of the two dtypes, alternating; the normal build
  // runs both.
  int model_index = 0;
  for (const Model& m : models) {
    int dtype_index = 0;
    for (const char* dtype : {"bf16", "fp16"}) {
      if (testing::kSanitized && (model_index + dtype_index++) % 2 == 1) continue;
      const std::string d = std::string(" --dtype ") + dtype;
      const nlohmann::json fit = json_of("fit " + m.fit + d + " --device cpu --device-memory 1TiB --json");
      const std::string train = "train " + m.train + d + " --steps 2 --eval-samples 0 --threads 1 --quiet --json";
      const nlohmann::json planned = json_of(train);
      const nlohmann::json naive = json_of(train + " --mode naive");
      ASSERT_TRUE(planned.contains("arena_bytes")) << m.train << d;
      EXPECT_EQ(planned["dtype"], dtype);
      EXPECT_EQ(fit["arena_bytes"], planned["arena_bytes"]) << m.train << d;
      EXPECT_EQ(planned["device_allocations_during_steps"], 0) << m.train << d;
      EXPECT_EQ(planned["params_sha256"], naive["params_sha256"]) << m.train << d;
      EXPECT_TRUE(std::isfinite(planned["final_loss"].get<double>())) << m.train << d;
    }
    ++model_index;
  }
}

// The 16-bit step's arena is smaller than the f32 one where activations dominate (the GPT), and
// fit's breakdown counts the 16-bit working copies apart from the f32 master copies.
TEST_F(MixedPrecisionCli, SixteenBitActivationsShrinkTheGptArena) {
  const nlohmann::json f32 = json_of("fit --model gpt --batch 32 --device cpu --device-memory 1TiB --json");
  const nlohmann::json bf16 = json_of("fit --model gpt --batch 32 --device cpu --device-memory 1TiB --json --dtype bf16");
  EXPECT_LT(bf16["arena_bytes"].get<double>(), 0.75 * f32["arena_bytes"].get<double>());
  EXPECT_EQ(2 * bf16["breakdown"]["parameters"].get<std::int64_t>(), f32["breakdown"]["parameters"].get<std::int64_t>());
  EXPECT_EQ(bf16["breakdown"]["master_weights"].get<std::int64_t>(), f32["breakdown"]["parameters"].get<std::int64_t>());
  EXPECT_EQ(bf16["breakdown"]["optimizer_state"].get<std::int64_t>(), f32["breakdown"]["optimizer_state"].get<std::int64_t>());
  EXPECT_EQ(f32["breakdown"]["master_weights"].get<std::int64_t>(), 0);
}

// --tf32 is CUDA's: on the CPU the run says it changes nothing, and the JSON records it.
TEST_F(MixedPrecisionCli, Tf32IsRecordedAndSaysWhereItChangesNothing) {
  const std::string train = "train --model mlp --batch 16 --steps 1 --threads 1 --device cpu --data " + (dir / "images").string();
  const auto r = testing::run_cli(train + " --tf32", /*merge_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--tf32 changes nothing on cpu"), std::string::npos) << r.output;
  EXPECT_EQ(json_of(train + " --tf32 --quiet --json")["tf32"], true);
  EXPECT_EQ(json_of(train + " --quiet --json")["tf32"], false);
}

}  // namespace
}  // namespace memplan
