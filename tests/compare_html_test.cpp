// The compare HTML report in real headless Chromium (Debian's chromium, installed by
// scripts/test.sh): the page loads with no console messages and shows the expected table and
// rectangles. A control page with a script error proves the console check can fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <cstdio>
#include <fstream>
#include <utility>

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

// How wide a page lays out in a window `width` px wide: a copy of it with a script that records
// the document's scroll width and the viewport's width is loaded, and the two read back from the
// dumped DOM. {scroll width, viewport width}; {-1, -1} when the page could not be measured.
std::pair<int, int> laid_out_width(const std::filesystem::path& page, int width, const std::filesystem::path& profile) {
  std::ifstream in(page);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string probe =
      "<script>document.body.setAttribute('data-widths', document.documentElement.scrollWidth + ' ' + "
      "window.innerWidth);</script>";
  const std::size_t end = html.rfind("</body>");
  html.insert(end == std::string::npos ? html.size() : end, probe);
  const std::filesystem::path measured = profile.string() + ".measured.html", dom = profile.string() + ".dom";
  std::ofstream(measured) << html;
  const std::string cmd = std::string("timeout 120 ") + kChromium +
                          " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                          " --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars"
                          " --window-size=" + std::to_string(width) + ",900 --user-data-dir=" + profile.string() +
                          " --dump-dom file://" + measured.string() + " > " + dom.string() + " 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) return {-1, -1};
  std::ifstream d(dom);
  const std::string text((std::istreambuf_iterator<char>(d)), std::istreambuf_iterator<char>());
  const std::string key = "data-widths=\"";
  const std::size_t at = text.find(key);
  if (at == std::string::npos) return {-1, -1};
  int scroll = -1, viewport = -1;
  if (std::sscanf(text.c_str() + at + key.size(), "%d %d", &scroll, &viewport) != 2) return {-1, -1};
  return {scroll, viewport};
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

// The reports fit a laptop's 1,280 px and a notebook cell's 800 px: the page is never wider than
// the window (pictures scale, wide tables scroll in their own box). A page with a fixed 2,000 px
// element proves the measurement can fail.
TEST_F(CompareHtml, ReportsAreNoWiderThanTheWindow) {
  const auto wide = dir_ / "wide.html";
  std::ofstream(wide) << "<!DOCTYPE html><html><body><div style=\"width:2000px\">x</div></body></html>";
  const auto control = laid_out_width(wide, 1280, dir_ / "profile-wide");
  ASSERT_GT(control.second, 0) << "the page could not be measured";
  EXPECT_GT(control.first, control.second) << "the width check would miss a page too wide";

  const auto compare = dir_ / "compare.html";
  ASSERT_EQ(testing::run_cli("compare --model gpt2 --batch 2 --seq 128 --html " + compare.string()).exit_code, 0);
  const auto replay = dir_ / "replay.html";
  ASSERT_EQ(testing::run_cli("replay " + std::string(MEMPLAN_TEST_DATA_DIR) + "/snapshots/late_start.pickle --html " +
                             replay.string()).exit_code, 0);
  for (const auto& page : {compare, replay}) {
    for (int width : {1280, 800}) {
      const auto [scroll, viewport] = laid_out_width(page, width, dir_ / ("profile-" + std::to_string(width)));
      ASSERT_GT(viewport, 0) << page << " at " << width << " px could not be measured";
      EXPECT_EQ(viewport, width);
      EXPECT_LE(scroll, viewport) << page.filename() << " is " << scroll << " px wide in a " << width << " px window";
    }
  }
}

}  // namespace
}  // namespace memplan
