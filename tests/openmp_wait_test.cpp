// The CLI's OpenMP wait policy: a short spin (GOMP_SPINCOUNT=10000) unless the user chose one (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT), reported in train --json; and train --profile's JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memplan {
namespace {

nlohmann::json run_json(const std::string& env, const std::string& args) {
  const auto r = testing::run_cli_with_env(env, args + " --json", false);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

std::string policy_with(const std::string& env) {
  return run_json(env, "plan --model mlp --batch 8 --profile")["openmp_wait_policy"].get<std::string>();
}

TEST(OpenMpWait, ShortSpinByDefaultAndTheUsersChoiceWins) {
  EXPECT_EQ(policy_with("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT"), "spincount 10000");
  EXPECT_EQ(policy_with("env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive"), "passive");
  EXPECT_EQ(policy_with("env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=ACTIVE"), "active");
  EXPECT_EQ(policy_with("env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=1000"), "spincount 1000");
}

TEST(OpenMpWait, TrainProfileLeavesOutTheFirstStep) {
  const auto j = run_json("", "train --steps 3 --batch 16 --quiet --profile");
  ASSERT_TRUE(j.contains("profile")) << j.dump();
  EXPECT_EQ(j["profile"]["steps"].get<int>(), 2);
  EXPECT_EQ(j["profile"]["slowest"].size(), 5u);
  double sum = 0.0;
  for (const auto& op : j["profile"]["ops"]) sum += op["ms"].get<double>();
  EXPECT_NEAR(sum, j["profile"]["ops_ms"].get<double>(), 1e-6);
}

}  // namespace
}  // namespace memplan
