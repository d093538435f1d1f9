// `memplan train --model gpt` and `memplan sample` end to end, on a small text file.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

struct GptCli : ::testing::Test {
  void SetUp() override {
    dir = fs::temp_directory_path() / ("memplan_gpt_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 200; ++i) text << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string small_model(const std::string& heads = "2", const std::string& seq = "16") const {
    return "--model gpt --layers 1 --width 32 --heads " + heads + " --seq " + seq +
           " --batch 4 --threads 1 --quiet --data " + (dir / "text.txt").string();
  }
  fs::path dir;
};

TEST_F(GptCli, TrainsReportsValidationLossAndSavesASampleableModel) {
  const std::string weights = (dir / "gpt.safetensors").string();
  auto r = testing::run_cli("train " + small_model() + " --steps 30 --json --save " + weights, /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  const double val = j.at("val_loss").get<double>(), entropy = j.at("unigram_entropy").get<double>();
  EXPECT_TRUE(std::isfinite(val));
  EXPECT_GT(val, 0.0);
  // 30 steps on a text this regular beat the unigram model.
  EXPECT_LT(val, entropy) << "val_loss " << val << " vs unigram entropy " << entropy;
  EXPECT_EQ(j.at("device_allocations_during_steps").get<std::int64_t>(), 0);
  EXPECT_TRUE(fs::exists(weights));

  auto a = testing::run_cli("sample --load " + weights + " --prompt 'the quick' --tokens 40 --seed 3", false);
  auto b = testing::run_cli("sample --load " + weights + " --prompt 'the quick' --tokens 40 --seed 3", false);
  auto c = testing::run_cli("sample --load " + weights + " --prompt 'the quick' --tokens 40 --seed 4", false);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output) << "same seed, same text";
  EXPECT_NE(a.output, c.output) << "another seed, another text";
  EXPECT_EQ(a.output.rfind("the quick", 0), 0u) << "the output starts with the prompt: " << a.output;
  EXPECT_EQ(a.output.size(), std::string("the quick").size() + 40 + 1);  // + newline

  auto bad_char = testing::run_cli("sample --load " + weights + " --prompt 'QZX'");
  EXPECT_EQ(bad_char.exit_code, 2);
  EXPECT_NE(bad_char.output.find("never saw"), std::string::npos) << bad_char.output;
  auto bad_temp = testing::run_cli("sample --load " + weights + " --temperature -1");
  EXPECT_EQ(bad_temp.exit_code, 2);
  auto missing = testing::run_cli("sample --load " + (dir / "nope.safetensors").string());
  EXPECT_EQ(missing.exit_code, 2);
}

TEST_F(GptCli, SameSeedSameWeights) {
  auto a = testing::run_cli("train " + small_model() + " --steps 3 --json --seed 5", false);
  auto b = testing::run_cli("train " + small_model() + " --steps 3 --json --seed 5", false);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(nlohmann::json::parse(a.output).at("params_sha256"), nlohmann::json::parse(b.output).at("params_sha256"));
}

TEST_F(GptCli, BadModelFlagsAreUsageErrors) {
  auto heads = testing::run_cli("train " + small_model("5") + " --steps 1");
  EXPECT_EQ(heads.exit_code, 2);
  EXPECT_NE(heads.output.find("not divisible"), std::string::npos) << heads.output;
  auto seq = testing::run_cli("train " + small_model("2", "100000") + " --steps 1");
  EXPECT_EQ(seq.exit_code, 2);
  EXPECT_NE(seq.output.find("too short"), std::string::npos) << seq.output;
  auto wrong_model = testing::run_cli("train --model mlp --layers 3 --steps 1");
  EXPECT_EQ(wrong_model.exit_code, 2);
  EXPECT_NE(wrong_model.output.find("applies to --model gpt"), std::string::npos) << wrong_model.output;
  auto no_text = testing::run_cli("train --model gpt --steps 1 --data " + (dir / "missing").string());
  EXPECT_EQ(no_text.exit_code, 2);
  EXPECT_NE(no_text.output.find("missing"), std::string::npos) << no_text.output;
  auto nan_dropout = testing::run_cli("train " + small_model() + " --dropout nan --steps 1");
  EXPECT_EQ(nan_dropout.exit_code, 2);
}

}  // namespace
}  // namespace memplan
