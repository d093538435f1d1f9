// 'memplan train' end to end: bad flags are usage errors (exit 2) with a message, and a seed
// fixes the result bit for bit. Needs Fashion-MNIST (scripts/test.sh installs it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/models/fashion_mnist.h"

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
  const auto r = run_cli("train --steps 40 --batch 64 --json --quiet " + extra, false);
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

}  // namespace
}  // namespace memplan
