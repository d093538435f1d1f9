// `memplan fit --suggest` and the per-lever savings of `fit`, end to end: the suggestion fits and
// is the plan `fit` makes for the same flags, and each lever's saving is the difference between
// two `fit` answers.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli_util.h"

namespace memplan {
namespace {

nlohmann::json fit_json(const std::string& args) {
  const auto r = testing::run_cli("fit " + args + " --device cpu --json", false);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

const std::string kGpt = "--model gpt --vocab 96 --seq 64 --batch 16";

// One byte less than the step needs without recomputation: the suggestion checkpoints, and fit
// with its flags plans the same bytes.
TEST(FitSuggestCli, OneByteShortTheSuggestionCheckpointsAndFitAgrees) {
  const nlohmann::json plain = fit_json(kGpt + " --device-memory 1TiB");
  const std::int64_t memory = plain["total_bytes"].get<std::int64_t>() - 1;
  const nlohmann::json s = fit_json(kGpt + " --device-memory " + std::to_string(memory) + " --suggest");
  ASSERT_TRUE(s.contains("best")) << s.dump();
  const nlohmann::json& best = s["best"];
  EXPECT_EQ(best["checkpoint"], "optimal");
  EXPECT_TRUE(best["fits"].get<bool>());
  EXPECT_LE(best["total_bytes"].get<std::int64_t>(), memory);
  EXPECT_GT(best["recompute_fraction"].get<double>(), 0.0);
  EXPECT_GE(s["candidates"].size(), 1u);
  const nlohmann::json fit = fit_json(kGpt + " --device-memory " + std::to_string(memory) + " --checkpoint optimal");
  EXPECT_TRUE(fit["fits"].get<bool>());
  EXPECT_EQ(fit["total_bytes"], best["total_bytes"]) << "fit --suggest and fit plan different steps";
  ASSERT_EQ(s["lever_savings"].size(), 1u) << s.dump();
  EXPECT_EQ(s["lever_savings"][0]["lever"], "--checkpoint optimal");
  EXPECT_EQ(s["lever_savings"][0]["total_without_bytes"], plain["total_bytes"]);
}

// With --sequence-parallel every tensor-parallel candidate is planned with it and names it; a
// candidate's flags given to fit plan the step it stands for (the table's bytes are the fast
// "fits" answer's, a greedy packing: never below fit's exact plan, and a few percent above it at
// most where the searched op order leaves the greedy packing above its lower bound).
TEST(FitSuggestCli, TensorParallelCandidatesNameSequenceParallelismAndFitAgrees) {
  const std::string shape = "--model gpt --vocab 96 --seq 64 --batch 16 --devices 4";
  const nlohmann::json s = fit_json(shape + " --device-memory 1TiB --sequence-parallel --tensor-parallel 2 --suggest");
  int split = 0;
  for (const nlohmann::json& c : s["candidates"]) {
    const bool tp = c["tensor_parallel"].get<int>() > 1;
    const std::string levers = c["levers"];
    EXPECT_EQ(c["sequence_parallel"].get<bool>(), tp) << levers;
    EXPECT_EQ(levers.find("--sequence-parallel") != std::string::npos, tp) << levers;
    if (!tp || !c.contains("total_bytes") || c["micro_batch"].get<int>() > 0) continue;
    const nlohmann::json fit = fit_json(shape + " --device-memory 1TiB " + levers);
    EXPECT_LE(fit["total_bytes"].get<std::int64_t>(), c["total_bytes"].get<std::int64_t>()) << levers;
    EXPECT_GT(fit["total_bytes"].get<std::int64_t>(), c["total_bytes"].get<std::int64_t>() * 95 / 100) << levers;
    EXPECT_EQ(fit["sequence_parallel"], true) << levers;
    ++split;
  }
  EXPECT_GT(split, 0) << "no tensor-parallel candidate was planned: the test checks nothing";
}

// fit with levers pulled says what each saves: ZeRO-2's saving is ZeRO-0's total less its own,
// tensor parallelism's the total with one slice per replica less its own.
TEST(FitSuggestCli, FitSaysWhatEachLeverSavesAsTheDifferenceOfTwoAnswers) {
  const std::string shape = "--model gpt --vocab 96 --seq 16 --batch 4 --devices 4 --device-memory 1TiB";
  const nlohmann::json levers = fit_json(shape + " --zero 2 --tensor-parallel 2");
  const nlohmann::json zero0 = fit_json(shape + " --zero 0 --tensor-parallel 2");
  const nlohmann::json whole = fit_json(shape + " --zero 2");
  ASSERT_TRUE(levers.contains("lever_savings")) << levers.dump();
  ASSERT_EQ(levers["lever_savings"].size(), 2u);
  for (const nlohmann::json& s : levers["lever_savings"]) {
    const nlohmann::json& without = s["lever"] == "--zero 2" ? zero0 : whole;
    EXPECT_EQ(s["total_without_bytes"], without["total_bytes"]) << s.dump();
    EXPECT_EQ(s["saved_bytes"].get<std::int64_t>(),
              without["total_bytes"].get<std::int64_t>() - levers["total_bytes"].get<std::int64_t>())
        << s.dump();
  }
  // No lever pulled: nothing to say.
  EXPECT_FALSE(fit_json(kGpt + " --device-memory 1TiB").contains("lever_savings"));
}

}  // namespace
}  // namespace memplan
