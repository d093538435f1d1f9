// The layout picture (tools/layout_svg.h) for graphs with thousands of tensors: tensors under a
// pixel tall are pooled into cells whose tooltips count every one of them once; larger tensors
// keep their own rectangle and label.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tools/layout_svg.h"

namespace memplan {
namespace {

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LayoutSvg, TinyTensorsArePooledAndEveryOneIsCounted) {
  tools::LayoutPanel panel;
  panel.title = "many tensors";
  panel.t_max = 1000;
  const Bytes big = Bytes{1} << 30;
  // Three large tensors stacked at the bottom, then 20,000 tiny ones (64 KiB in a 3 GiB+ panel:
  // far under a pixel) over time.
  for (int i = 0; i < 3; ++i) panel.rects.push_back({0, 1000, i * big, (i + 1) * big, "big" + std::to_string(i), 0});
  const Bytes tiny = Bytes{64} << 10;
  for (int i = 0; i < 20000; ++i) {
    const Bytes lo = 3 * big + (i % 500) * tiny;
    panel.rects.push_back({double(i % 1000), double(i % 1000 + 2), lo, lo + tiny, "tiny", 1});
  }
  const std::string svg = tools::render_layout_svg("t", {panel});
  for (int i = 0; i < 3; ++i) EXPECT_NE(svg.find("<title>big" + std::to_string(i) + "</title>"), std::string::npos);
  EXPECT_EQ(svg.find("<title>tiny</title>"), std::string::npos) << "tiny tensors are not drawn one by one";
  // Far fewer rectangles than tensors; the cells' tooltips add up to every tiny tensor.
  EXPECT_LT(count_of(svg, "<rect "), 20000u / 2);
  std::int64_t counted = 0;
  // Every "<title>N tensor(s) under a pixel tall" tooltip: read N.
  const std::string open = "<title>";
  for (std::size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
    std::size_t end = at + open.size();
    while (end < svg.size() && svg[end] >= '0' && svg[end] <= '9') ++end;
    if (end == at + open.size()) continue;
    const std::string rest = svg.substr(end, 32);
    if (rest.rfind(" tensor under a pixel tall", 0) == 0 || rest.rfind(" tensors under a pixel tall", 0) == 0) {
      counted += std::stoll(svg.substr(at + open.size(), end - at - open.size()));
    }
  }
  EXPECT_EQ(counted, 20000);
  EXPECT_NE(svg.find("20000 of 20003 rectangles under a pixel tall"), std::string::npos);
}

TEST(LayoutSvg, SmallGraphsAreDrawnTensorByTensor) {
  tools::LayoutPanel panel;
  panel.t_max = 10;
  for (int i = 0; i < 20; ++i) panel.rects.push_back({0, 10, i * 100, (i + 1) * 100, "t" + std::to_string(i), 1});
  const std::string svg = tools::render_layout_svg("t", {panel});
  for (int i = 0; i < 20; ++i) EXPECT_NE(svg.find("<title>t" + std::to_string(i) + "</title>"), std::string::npos) << i;
  EXPECT_EQ(svg.find("under a pixel tall"), std::string::npos);
}

// Reference lines (arena, lower bound, reserved peak): equal ones drawn once with both names,
// near ones with their labels a text line apart, never printed over each other.
TEST(LayoutSvg, LineLabelsNeverOverlap) {
  tools::LayoutPanel panel;
  panel.t_max = 10;
  panel.rects.push_back({0, 10, 0, 1000, "t", 1});
  panel.lines.push_back({1000, "arena 1000 B"});
  panel.lines.push_back({1000, "lower bound 1000 B"});
  panel.lines.push_back({995, "reserved peak 995 B"});
  const std::string svg = tools::render_layout_svg("t", {panel});
  EXPECT_EQ(count_of(svg, "<line "), 2u) << svg;
  EXPECT_NE(svg.find(">arena 1000 B = lower bound 1000 B</text>"), std::string::npos) << svg;
  std::vector<double> ys;
  const std::string open = "class=\"line-label\" x=\"";
  for (std::size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
    const std::size_t y = svg.find("y=\"", at) + 3;
    ys.push_back(std::stod(svg.substr(y, svg.find('"', y) - y)));
  }
  ASSERT_EQ(ys.size(), 2u) << svg;
  EXPECT_GE(std::abs(ys[1] - ys[0]), 14.0) << ys[0] << " " << ys[1];
}

// The picture scales to its container: a viewBox and a width of at most 100%.
TEST(LayoutSvg, ThePictureScalesToTheWidthItIsGiven) {
  tools::LayoutPanel panel;
  panel.t_max = 10;
  panel.rects.push_back({0, 10, 0, 1000, "t", 1});
  const std::string svg = tools::render_layout_svg("t", {panel, panel, panel});
  EXPECT_NE(svg.find("viewBox=\"0 0 "), std::string::npos);
  EXPECT_NE(svg.find("style=\"max-width:100%;height:auto\""), std::string::npos);
}

}  // namespace
}  // namespace memplan
