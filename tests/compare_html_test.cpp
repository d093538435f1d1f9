// The compare HTML report in real headless Chromium (Debian's chromium, installed by
// scripts/test.sh): the page loads with no console messages and shows the expected table and
// rectangles. A control page with a script error proves the console check can fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli_util.h"

namespace memplan {
namespace {

constexpr const char* kChromium = "/usr/bin/chromium";

struct PageLoad {
  int exit_code = -1;
  std::string dom;
  std::vector<std::string> console;  // lines Chromium logged for console messages
};

PageLoad load_in_chromium(const std::filesystem::path& page, const std::filesystem::path& profile) {
  const std::filesystem::path dom = profile.string() + ".dom", log = profile.string() + ".log";
  const std::string cmd = std::string("timeout 120 ") + kChromium +
                          " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                          " --disable-background-networking --disable-component-update --disable-sync"
                          " --user-data-dir=" + profile.string() + " --enable-logging=stderr --v=0 --dump-dom file://" +
                          page.string() + " > " + dom.string() + " 2> " + log.string();
  PageLoad r;
  r.exit_code = std::system(cmd.c_str());
  std::ifstream d(dom);
  r.dom.assign((std::istreambuf_iterator<char>(d)), std::istreambuf_iterator<char>());
  std::ifstream l(log);
  for (std::string line; std::getline(l, line);) {
    if (line.find(":CONSOLE") != std::string::npos) r.console.push_back(line);
  }
  return r;
}

class CompareHtml : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kChromium)) {
      GTEST_SKIP() << "Debian's chromium is not installed (scripts/test.sh installs it); the HTML report is not checked";
    }
    // One folder per test and process: ctest runs these tests in parallel.
    dir_ = std::filesystem::temp_directory_path() /
           ("memplan_html_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(CompareHtml, ConsoleCheckCatchesAScriptError) {
  const auto page = dir_ / "bad.html";
  std::ofstream(page) << "<!DOCTYPE html><html><body><script>undefined_function();</script></body></html>";
  const PageLoad r = load_in_chromium(page, dir_ / "profile-bad");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_FALSE(r.console.empty()) << "the console check would miss errors";
}

TEST_F(CompareHtml, ReportLoadsCleanlyAndShowsTableLayoutsAndTimeline) {
  const auto page = dir_ / "report.html";
  const auto cli = testing::run_cli("compare --batch 512 --hidden 512,512 --html " + page.string());
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const PageLoad r = load_in_chromium(page, dir_ / "profile");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_TRUE(r.console.empty()) << r.console.front();
  EXPECT_NE(r.dom.find("id=\"summary\""), std::string::npos);
  EXPECT_NE(r.dom.find("memplan planned arena"), std::string::npos);
  EXPECT_NE(r.dom.find("class=\"timeline\""), std::string::npos);
  // One rectangle per planned buffer at least (the MLP step has > 20), plus segments.
  std::size_t rects = 0;
  for (std::size_t at = r.dom.find("<rect "); at != std::string::npos; at = r.dom.find("<rect ", at + 1)) ++rects;
  EXPECT_GT(rects, 40u);
  EXPECT_NE(r.dom.find("<title>fc1.weight"), std::string::npos) << "tensors are labelled";
  EXPECT_EQ(r.dom.find("http://") != std::string::npos && r.dom.find("<script") != std::string::npos, false)
      << "the report must be self-contained";
}

// The replay report of a snapshot: the same checks, on a file PyTorch's format describes.
TEST_F(CompareHtml, ReplayReportLoadsCleanlyAndShowsBothLayouts) {
  const auto page = dir_ / "replay.html";
  const auto cli = testing::run_cli("replay " + std::string(MEMPLAN_TEST_DATA_DIR) + "/snapshots/late_start.pickle --html " +
                                    page.string());
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const PageLoad r = load_in_chromium(page, dir_ / "profile");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_TRUE(r.console.empty()) << r.console.front();
  EXPECT_NE(r.dom.find("id=\"summary\""), std::string::npos);
  EXPECT_NE(r.dom.find("id=\"fidelity\""), std::string::npos);
  EXPECT_NE(r.dom.find("memplan static plan"), std::string::npos);
  EXPECT_NE(r.dom.find("recorded by PyTorch"), std::string::npos);
  EXPECT_NE(r.dom.find("class=\"timeline\""), std::string::npos);
  EXPECT_NE(r.dom.find("/home/user/model.py:10 forward"), std::string::npos) << "sites are listed";
  // Every allocation of the trace drawn in both panels: 7 buffers (4 live at the start, 3
  // allocated), 3 recorded segments.
  std::size_t rects = 0;
  for (std::size_t at = r.dom.find("<rect "); at != std::string::npos; at = r.dom.find("<rect ", at + 1)) ++rects;
  EXPECT_GE(rects, 7u + 7u + 3u);
  EXPECT_EQ(r.dom.find("<script"), std::string::npos) << "the report must be self-contained";
}

}  // namespace
}  // namespace memplan
