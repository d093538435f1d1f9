// What the Python package stands on: inputs and reports kept in memory under a name
// (common/memory_files.h), a command run in-process with its output kept (run_cli_captured), and
// a cancellation that stops a search (common/cancellation.h).
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "memplan/common/cancellation.h"
#include "memplan/common/input_file.h"
#include "memplan/common/memory_files.h"
#include "tools/cli_app.h"
#include "tools/commands.h"

namespace memplan {
namespace {

TEST(MemoryFiles, AnInputIsReadUnderItsNameOnlyWhileItIsRegistered) {
  const std::string name = "<test input>";
  {
    auto input = ScopedMemoryInput::create(name, std::string("abc\0def", 7));
    ASSERT_TRUE(input.ok()) << input.error().message;
    auto read = read_regular_file(name, 100, "test file");
    ASSERT_TRUE(read.ok()) << read.error().message;
    EXPECT_EQ(read.value(), std::string("abc\0def", 7));
    // Each open has its own offset: a second reader starts at the beginning too.
    EXPECT_EQ(read_regular_file(name, 100, "test file").value(), read.value());
    // The size limit holds as for a file, and the message names the input.
    auto too_big = read_regular_file(name, 3, "test file");
    ASSERT_FALSE(too_big.ok());
    EXPECT_NE(too_big.error().message.find(name), std::string::npos) << too_big.error().message;
    // A second input under the same name is refused, not shadowed.
    EXPECT_FALSE(ScopedMemoryInput::create(name, "other").ok());
  }
  auto gone = read_regular_file(name, 100, "test file");
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.error().message.find("cannot open test file '<test input>'"), std::string::npos) << gone.error().message;
}

TEST(MemoryFiles, AReportWrittenToAnOutputIsKept) {
  EXPECT_FALSE(write_memory_output("<test report>", "x"));  // unregistered: the caller writes a file
  auto output = ScopedMemoryOutput::create("<test report>");
  ASSERT_TRUE(output.ok());
  EXPECT_FALSE(output.value().bytes().has_value());
  EXPECT_TRUE(write_memory_output("<test report>", "first"));
  EXPECT_TRUE(write_memory_output("<test report>", "second"));
  EXPECT_EQ(output.value().bytes().value_or(""), "second");
  EXPECT_FALSE(ScopedMemoryOutput::create("<test report>").ok());
}

TEST(InProcessCli, OutputErrorsAndExitCodesAreTheClis) {
  std::streambuf* cout_before = std::cout.rdbuf();
  std::streambuf* cerr_before = std::cerr.rdbuf();
  const tools::CapturedRun ok =
      tools::run_cli_captured({"fit", "--model", "mlp", "--device-memory", "1GiB", "--json"});
  EXPECT_EQ(ok.exit_code, tools::kExitOk) << ok.err;
  const nlohmann::json j = nlohmann::json::parse(ok.out);
  EXPECT_TRUE(j.at("fits").get<bool>());
  EXPECT_GT(ok.seconds, 0.0);
  // The text answer goes through std::cout as well (printf would escape the capture).
  const tools::CapturedRun text = tools::run_cli_captured({"fit", "--model", "mlp", "--device-memory", "1GiB"});
  EXPECT_NE(text.out.find("FITS"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("arena (exact)"), std::string::npos) << text.out;

  const tools::CapturedRun bad = tools::run_cli_captured({"fit", "--model", "mlp", "--device-memory", "lots"});
  EXPECT_EQ(bad.exit_code, tools::kExitUsage);
  EXPECT_NE(bad.err.find("--device-memory"), std::string::npos) << bad.err;
  EXPECT_TRUE(bad.out.empty()) << bad.out;
  EXPECT_EQ(std::cout.rdbuf(), cout_before);
  EXPECT_EQ(std::cerr.rdbuf(), cerr_before);
}

TEST(InProcessCli, ASvgReportReachesAMemoryOutput) {
  auto output = ScopedMemoryOutput::create("<plan svg>");
  ASSERT_TRUE(output.ok());
  const tools::CapturedRun run = tools::run_cli_captured({"plan", "--model", "mlp", "--svg", "<plan svg>"});
  EXPECT_EQ(run.exit_code, tools::kExitOk) << run.err;
  const std::string svg = output.value().bytes().value_or("");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("arena"), std::string::npos);
}

TEST(InProcessCli, ACancelledRunStopsAndTheNextRunsNormally) {
  request_cancellation();
  const tools::CapturedRun stopped = tools::run_cli_captured({"fit", "--model", "gpt2", "--device-memory", "80GiB"});
  clear_cancellation();
  EXPECT_EQ(stopped.exit_code, tools::kExitCancelled);
  EXPECT_NE(stopped.err.find("stopped on request"), std::string::npos) << stopped.err;
  const tools::CapturedRun next = tools::run_cli_captured({"fit", "--model", "mlp", "--device-memory", "1GiB", "--json"});
  EXPECT_EQ(next.exit_code, tools::kExitOk) << next.err;
}

}  // namespace
}  // namespace memplan
