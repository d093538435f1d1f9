// `memplan solve` end to end: runs the real binary (MEMPLAN_CLI_PATH) and checks exit codes,
// JSON keys, the output file, and that no output file appears when the answer is an error.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "memplan/planner/minimalloc_csv.h"
#include "memplan/planner/validator.h"

namespace memplan::tools {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class SolveCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("memplan_solve_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Arguments are fixed strings written by the tests (no shell metacharacters).
  CliRun run(const std::string& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string command = std::string(MEMPLAN_CLI_PATH) + " solve " + args + " >" + out.string() + " 2>" + err.string();
    const int status = std::system(command.c_str());
    CliRun r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    fs::remove(out);
    fs::remove(err);
    return r;
  }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // Files in the scratch dir other than the inputs this test wrote.
  std::size_t file_count() const {
    return std::size_t(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }

  fs::path dir_;
};

const std::string kExample = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n";

TEST_F(SolveCli, MinimisesAndWritesAValidOutputFile) {
  const fs::path in = write("in.csv", kExample);
  const fs::path out = dir_ / "out.csv";
  const CliRun r = run("--input " + in.string() + " --output " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("optimal"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lower bound"), std::string::npos) << r.out;
  const Result<planner::MinimallocCsv> back = planner::read_minimalloc_csv(out.string());
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_TRUE(back.value().offsets.has_value());
  const Status valid = planner::validate_packing(back.value().problem, *back.value().offsets, 12);
  EXPECT_TRUE(valid.ok()) << valid.error().message;
  EXPECT_EQ(file_count(), 2u);  // in.csv and out.csv: no temporary left behind
}

TEST_F(SolveCli, JsonHasTheDocumentedKeys) {
  const fs::path in = write("in.csv", kExample);
  const CliRun r = run("--input " + in.string() + " --budget 12 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"buffers", "lower_bound", "height", "status", "solve_ms"}) {
    EXPECT_TRUE(j.contains(key)) << key << " missing in " << r.out;
  }
  EXPECT_EQ(j["buffers"], 5);
  EXPECT_EQ(j["lower_bound"], 12);
  EXPECT_EQ(j["height"], 12);
  EXPECT_EQ(j["status"], "optimal");
  EXPECT_EQ(j["capacity"], 12);
}

TEST_F(SolveCli, StatsReportTheSearchAndWhatProvedTheAnswer) {
  const fs::path in = write("in.csv", kExample);
  const CliRun j = run("--input " + in.string() + " --json --stats");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const nlohmann::json stats = nlohmann::json::parse(j.out)["stats"];
  for (const char* key : {"nodes", "backtracks", "attempts", "greedy_ms", "setup_ms", "search_ms", "zero_waste", "bands", "proof"}) {
    EXPECT_TRUE(stats.contains(key)) << key << " missing in " << j.out;
  }
  EXPECT_EQ(stats["proof"], "greedy");  // the greedy packing meets the lower bound here
  const CliRun text = run("--input " + in.string() + " --stats");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("backtracks"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("proof         greedy"), std::string::npos) << text.out;
}

// --budget is the arena budget's name in every command; --capacity, its older name here, still works.
TEST_F(SolveCli, BudgetAndItsOlderNameCapacityMeanTheSame) {
  const fs::path in = write("in.csv", kExample);
  for (const char* flag : {"--budget", "--capacity"}) {
    const CliRun fits = run("--input " + in.string() + " " + flag + " 16 --json");
    ASSERT_EQ(fits.exit_code, 0) << flag << ": " << fits.err;
    const nlohmann::json j = nlohmann::json::parse(fits.out);
    EXPECT_EQ(j["capacity"], 16) << flag;
    EXPECT_LE(j["height"].get<long long>(), 16) << flag;
    const CliRun over = run("--input " + in.string() + " " + flag + " 11");
    EXPECT_EQ(over.exit_code, 1) << flag;
    EXPECT_NE(over.err.find("no packing within capacity 11"), std::string::npos) << flag << ": " << over.err;
    EXPECT_EQ(run("--input " + in.string() + " " + flag + " -3").exit_code, 2) << flag;
    EXPECT_EQ(run("--input " + in.string() + " " + flag + " lots").exit_code, 2) << flag;
  }
  const CliRun help = run("--help");
  EXPECT_NE(help.out.find("--budget"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--capacity: the older name, kept for a release"), std::string::npos) << help.out;
}

TEST_F(SolveCli, CapacityBelowTheLowerBoundExitsOneWithoutOutput) {
  const fs::path in = write("in.csv", kExample);
  const fs::path out = dir_ / "out.csv";
  const CliRun r = run("--input " + in.string() + " --budget 11 --output " + out.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no packing within capacity 11"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(file_count(), 1u);
}

TEST_F(SolveCli, BadInputExitsTwoNamingFileAndLine) {
  const fs::path in = write("bad.csv", "id,lower,upper,size\nb1,0,3,4\nb2,9,3,4\n");
  const fs::path out = dir_ / "out.csv";
  const CliRun r = run("--input " + in.string() + " --output " + out.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(in.string() + ":3:"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(SolveCli, MissingFileAndBadFlagsExitTwo) {
  EXPECT_EQ(run("--input " + (dir_ / "missing.csv").string()).exit_code, 2);
  EXPECT_EQ(run("").exit_code, 2);  // --input is required
  const fs::path in = write("in.csv", kExample);
  EXPECT_EQ(run("--input " + in.string() + " --capacity -3").exit_code, 2);
  EXPECT_EQ(run("--input " + in.string() + " --capacity lots").exit_code, 2);
  EXPECT_EQ(run("--input " + in.string() + " --time-limit 0").exit_code, 2);
}

TEST_F(SolveCli, UnwritableOutputExitsTwo) {
  const fs::path in = write("in.csv", kExample);
  const CliRun r = run("--input " + in.string() + " --output " + (dir_ / "no_such_dir" / "out.csv").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(fs::exists(dir_ / "no_such_dir"));
}

}  // namespace
}  // namespace memplan::tools
