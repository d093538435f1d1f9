// 'memplan train' end to end: bad flags are usage errors (exit 2) with a message, and a seed
// fixes the result bit for bit. Needs Fashion-MNIST (scripts/test.sh installs it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/models/fashion_mnist.h"
#include "small_datasets.h"

namespace memplan {
namespace {

using testing::run_cli;

struct BadFlag {
  const char* args;
  const char* expected;  // a fragment of the message
};

TEST(TrainCli, BadFlagsAreUsageErrors) {
  const BadFlag cases[] = {
      {"train --batch 0", "--batch"},
      {"train --batch -5", "--batch"},
      {"train --batch abc", "--batch"},
      {"train --lr nan", "--lr"},
      {"train --lr -1", "--lr"},
      {"train --lr inf", "--lr"},
      {"train --model resnet9000", "--model"},
      {"train --optimizer adam", "--optimizer"},
      {"train --steps 10 --epochs 2", "excludes"},
      {"train --hidden 256,0", "--hidden"},
      {"train --lr-schedule linear", "--lr-schedule"},
      {"train --warmup -3", "--warmup"},
      {"train --steps 5 --warmup 5", "--warmup 5 leaves no step"},
      {"train --no-such-flag", "no-such-flag"},
      {"train --eval-samples -1", "--eval-samples"},
      {"train --eval-samples 1.5", "--eval-samples"},
      {"frobnicate", "frobnicate"},
  };
  for (const BadFlag& c : cases) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(TrainCli, MissingDatasetNamesTheDebianPackage) {
  const auto r = run_cli("train --steps 1 --data /nonexistent/memplan-data");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--data"), std::string::npos) << r.output;
}

TEST(TrainCli, HelpExplainsTheFlags) {
  const auto r = run_cli("train --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--model", "--epochs", "--steps", "--batch", "--lr", "--optimizer", "--seed",
                           "--data", "--json"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  }
}

nlohmann::json train_json(const std::string& extra) {
  // The first 2000 test images: enough to tell training from chance, a fifth of the evaluation.
  const auto r = run_cli("train --steps 40 --batch 64 --eval-samples 2000 --json --quiet " + extra, false);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(TrainCli, SameSeedSameParametersOtherSeedOtherParameters) {
  const auto a = train_json("--seed 7");
  const auto b = train_json("--seed 7");
  const auto c = train_json("--seed 8");
  for (const char* key : {"model", "steps", "final_loss", "test_accuracy", "params_sha256", "step_time_ms_median"}) {
    EXPECT_TRUE(a.contains(key)) << key;
  }
  EXPECT_EQ(a["steps"], 40);
  EXPECT_EQ(a["params_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(a["params_sha256"], b["params_sha256"]);
  EXPECT_EQ(a["final_loss"], b["final_loss"]);
  EXPECT_NE(a["params_sha256"], c["params_sha256"]);
  // 40 steps already beat chance (10%) by far on Fashion-MNIST.
  EXPECT_GT(a["test_accuracy"].get<double>(), 0.5);
  EXPECT_EQ(a["test_images"], 2000);
  EXPECT_EQ(a["lr_schedule"], "constant");
  EXPECT_EQ(a["warmup_steps"], 0);
}

TEST(TrainCli, CosineScheduleWithWarmupIsReportedAndChangesTheRun) {
  const auto constant = train_json("--seed 7");
  const auto cosine = train_json("--seed 7 --lr-schedule cosine --warmup 5");
  EXPECT_EQ(cosine["lr_schedule"], "cosine");
  EXPECT_EQ(cosine["warmup_steps"], 5);
  EXPECT_NE(cosine["params_sha256"], constant["params_sha256"]);
  EXPECT_GT(cosine["test_accuracy"].get<double>(), 0.5);
  // The planned step is the same: the schedule scales the rate the updates read, nothing else.
  EXPECT_EQ(cosine["arena_bytes"], constant["arena_bytes"]);
}

// --eval-samples bounds what is evaluated when training ends: the first N test images or N
// validation sequences, never more than the split holds; 0 evaluates nothing and says so.
TEST(TrainCli, EvalSamplesBoundsTheEvaluation) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("memplan_eval_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  testing::write_small_fashion_mnist(dir / "images", 64, 40);
  {
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 300; ++i) text << "a text to validate on, line " << i << "\n";
  }
  const std::string mlp = "train --model mlp --hidden 8 --batch 16 --steps 1 --threads 1 --quiet --json --data " + (dir / "images").string();
  auto json_of = [](const std::string& args) {
    const auto r = run_cli(args, false);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
  };
  EXPECT_EQ(json_of(mlp)["test_images"], 40) << "all of them by default";
  const nlohmann::json some = json_of(mlp + " --eval-samples 25");
  EXPECT_EQ(some["test_images"], 25);
  const double correct = some["test_accuracy"].get<double>() * 25.0;
  EXPECT_NEAR(correct, std::round(correct), 1e-9) << "the accuracy counts 25 images";
  EXPECT_EQ(json_of(mlp + " --eval-samples 1000")["test_images"], 40) << "never more than the test set";
  const nlohmann::json none = json_of(mlp + " --eval-samples 0");
  EXPECT_FALSE(none.contains("test_accuracy")) << none.dump();
  EXPECT_TRUE(none.contains("params_sha256"));
  const auto said = run_cli("train --model mlp --hidden 8 --batch 16 --steps 1 --threads 1 --eval-samples 0 --data " +
                            (dir / "images").string());
  EXPECT_NE(said.output.find("no evaluation"), std::string::npos) << said.output;

  const std::string gpt = "train --model gpt --layers 1 --width 16 --heads 2 --seq 16 --batch 2 --steps 1 --threads 1 --quiet --json --data " +
                          (dir / "text.txt").string();
  EXPECT_EQ(json_of(gpt + " --eval-samples 3")["val_tokens"], 3 * 16);
  EXPECT_FALSE(json_of(gpt + " --eval-samples 0").contains("val_loss"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memplan
