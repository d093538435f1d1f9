#include "tools/layout_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>

#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

const char* kColors[] = {"#8da0cb", "#fc8d62", "#66c2a5", "#e78ac3", "#dddddd"};
// Rectangles shorter than this (in pixels) are pooled rather than drawn one by one.
constexpr double kMinRectPx = 1.0;
constexpr double kPanelW = 520, kPanelH = 560, kMarginL = 70, kMarginT = 60, kGap = 40, kMarginB = 70;
// Tensors under a pixel tall are pooled into cells of kCellW x kCellH pixels: each cell is drawn
// once, as opaque as the share of it they cover, in the colour covering most of it, and its
// tooltip counts them. Larger tensors are drawn one by one.
constexpr double kCellW = 4, kCellH = 2;
constexpr double kLabelLineH = 14;  // a 12 px label's line, for keeping labels apart
constexpr int kCols = static_cast<int>(kPanelW / kCellW), kRows = static_cast<int>(kPanelH / kCellH);

// Bytes upwards, shared by every panel.
struct ByteAxis {
  Bytes y_max = 1;
  double y_of(Bytes b) const { return kMarginT + kPanelH - double(b) / double(y_max) * kPanelH; }
};

struct Cell {
  double area[5] = {0, 0, 0, 0, 0};  // covered pixel area per colour
  int count = 0;
  Bytes bytes = 0;
};
using CellGrid = std::map<int, Cell>;  // row * kCols + col

// A rectangle under a pixel tall, spread over the cells it covers (x and y in panel pixels).
void pool_into_cells(CellGrid& cells, const LayoutRect& r, double x_a, double x_b, double y_a, double y_b) {
  const int c0 = std::clamp(static_cast<int>(x_a / kCellW), 0, kCols - 1);
  const int c1 = std::clamp(static_cast<int>(x_b / kCellW), 0, kCols - 1);
  const int r0 = std::clamp(static_cast<int>(y_a / kCellH), 0, kRows - 1);
  const int r1 = std::clamp(static_cast<int>(y_b / kCellH), 0, kRows - 1);
  for (int row = r0; row <= r1; ++row) {
    for (int col = c0; col <= c1; ++col) {
      const double w = std::min(x_b, (col + 1) * kCellW) - std::max(x_a, col * kCellW);
      const double h = std::min(y_b, (row + 1) * kCellH) - std::max(y_a, row * kCellH);
      Cell& cell = cells[row * kCols + col];
      if (w > 0 && h > 0) cell.area[std::clamp(r.color, 0, 4)] += w * h;
      if (row == r0 && col == c0) {
        ++cell.count;
        cell.bytes += r.hi - r.lo;
      }
    }
  }
}

// Cells drawn as runs: neighbours in a row with the same colour and opacity (in steps of 0.05)
// become one rectangle whose tooltip counts the tensors of all of them.
void draw_cells(std::ostringstream& svg, const CellGrid& cells, double x0) {
  struct Run {
    int row = -1, col0 = 0, col1 = 0, color = 0, opacity_step = 0, count = 0;
    Bytes bytes = 0;
  } run;
  char buf[512];
  auto flush = [&] {
    if (run.row < 0) return;
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" fill-opacity=\"%.2f\">",
                  x0 + run.col0 * kCellW, kMarginT + run.row * kCellH, (run.col1 - run.col0 + 1) * kCellW, kCellH,
                  kColors[run.color], run.opacity_step * 0.05);
    svg << buf;
    if (run.count > 0) {
      svg << "<title>" << run.count << (run.count == 1 ? " tensor" : " tensors") << " under a pixel tall starting here ("
          << xml_escape(format_bytes(run.bytes)) << ")</title>";
    }
    svg << "</rect>\n";
    run.row = -1;
  };
  for (const auto& [index, cell] : cells) {
    double covered = 0;
    int color = 0;
    for (int c = 0; c < 5; ++c) {
      covered += cell.area[c];
      if (cell.area[c] > cell.area[color]) color = c;
    }
    const int step = static_cast<int>(std::lround(std::clamp(covered / (kCellW * kCellH), 0.15, 1.0) / 0.05));
    const int row = index / kCols, col = index % kCols;
    if (run.row != row || run.col1 + 1 != col || run.color != color || run.opacity_step != step) {
      flush();
      run = Run{row, col, col, color, step, 0, 0};
    }
    run.col1 = col;
    run.count += cell.count;
    run.bytes += cell.bytes;
  }
  flush();
}

// One panel at x0: its frame, its tensors (pooled where under a pixel), its lines and its time axis.
void draw_panel(std::ostringstream& svg, const LayoutPanel& p, double x0, const ByteAxis& axis) {
  char buf[512];
  auto x_of = [&](double t) { return x0 + t / std::max(1.0, p.t_max) * kPanelW; };
  svg << "<text x=\"" << x0 << "\" y=\"" << kMarginT - 10 << "\" font-weight=\"bold\">" << xml_escape(p.title) << "</text>\n";
  std::snprintf(buf, sizeof(buf), "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n",
                x0, kMarginT, kPanelW, kPanelH);
  svg << buf;
  CellGrid cells;
  std::int64_t pooled = 0;
  for (const LayoutRect& r : p.rects) {
    const double y_top = axis.y_of(r.hi), y_bottom = axis.y_of(r.lo);
    if (y_bottom - y_top < kMinRectPx) {
      ++pooled;
      const double x_a = x_of(r.t0) - x0, x_b = std::max(x_of(r.t1) - x0, x_a + 0.5);
      const double y_a = y_top - kMarginT, y_b = std::max(y_bottom - kMarginT, y_a + 1e-9);
      pool_into_cells(cells, r, x_a, x_b, y_a, y_b);
      continue;
    }
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" stroke=\"#333\" "
                  "stroke-width=\"0.2\"><title>",
                  x_of(r.t0), y_top, std::max(0.5, x_of(r.t1) - x_of(r.t0)), std::max(0.5, y_bottom - y_top),
                  kColors[std::clamp(r.color, 0, 4)]);
    svg << buf << xml_escape(r.label) << "</title></rect>\n";
  }
  draw_cells(svg, cells, x0);
  if (pooled > 0) {
    std::snprintf(buf, sizeof(buf), "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#555\">", x0,
                  kMarginT + kPanelH + 36);
    svg << buf << pooled << " of " << p.rects.size() << " rectangles under a pixel tall, pooled into "
        << kCellW << "x" << kCellH << " px cells (opacity: the share they cover)</text>\n";
  }
  // Lines at the same height are drawn once with their labels joined ("arena 4.1 MiB = lower
  // bound 4.1 MiB"); labels closer than a text line are moved apart, downwards.
  std::vector<LayoutLine> lines = p.lines;
  std::stable_sort(lines.begin(), lines.end(), [](const LayoutLine& a, const LayoutLine& b) { return a.at > b.at; });
  double last_label_y = -1e9;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string label = lines[i].label;
    while (i + 1 < lines.size() && lines[i + 1].at == lines[i].at) label += " = " + lines[++i].label;
    const double y = axis.y_of(lines[i].at);
    double label_y = y - 4 < kMarginT + 14 ? y + 14 : y - 4;  // stay inside the panel
    label_y = std::max(label_y, last_label_y + kLabelLineH);
    last_label_y = label_y;
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" stroke-dasharray=\"4 3\"/>\n"
                  "<text class=\"line-label\" x=\"%.1f\" y=\"%.1f\" fill=\"#c00\">",
                  x0, x0 + kPanelW, y, y, x0 + 4, label_y);
    svg << buf << xml_escape(label) << "</text>\n";
  }
  std::snprintf(buf, sizeof(buf), "<text x=\"%.1f\" y=\"%.1f\">time (ops) →</text>\n", x0 + kPanelW / 2 - 40,
                kMarginT + kPanelH + 20);
  svg << buf;
}

}  // namespace

int layout_color(graph::Role role) {
  switch (role) {
    case graph::Role::parameter:
    case graph::Role::optimizer_state: return 0;
    case graph::Role::activation:
    case graph::Role::input: return 1;
    case graph::Role::gradient: return 2;
    default: return 3;
  }
}

LayoutPanel planned_layout_panel(const planner::MemoryPlan& plan) {
  LayoutPanel panel;
  panel.title = "memplan static plan (one arena)";
  panel.t_max = double(plan.schedule.size());
  for (const planner::PlannedBuffer& b : plan.buffers) {
    const double t0 = b.persistent ? 0 : b.first_op, t1 = b.persistent ? panel.t_max : b.last_op + 1;
    panel.rects.push_back({t0, t1, b.offset, b.offset + b.size_bytes, b.name + " (" + format_bytes(b.size_bytes) + ")",
                           layout_color(b.role)});
  }
  panel.lines.push_back({plan.arena_bytes, "arena " + format_bytes(plan.arena_bytes)});
  return panel;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_layout_svg(const std::string& title, const std::vector<LayoutPanel>& panels) {
  ByteAxis axis;
  for (const LayoutPanel& p : panels) {
    for (const LayoutRect& r : p.rects) axis.y_max = std::max(axis.y_max, r.hi);
    for (const LayoutLine& l : p.lines) axis.y_max = std::max(axis.y_max, l.at);
  }
  const double width = kMarginL + double(panels.size()) * (kPanelW + kGap);
  const double height = kMarginT + kPanelH + kMarginB;
  std::ostringstream svg;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"layout\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\" style=\"max-width:100%%;height:auto\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height, width, height);
  svg << buf;
  svg << "<text x=\"" << kMarginL << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" << xml_escape(title) << "</text>\n";
  for (std::size_t i = 0; i < panels.size(); ++i) draw_panel(svg, panels[i], kMarginL + double(i) * (kPanelW + kGap), axis);
  // Byte axis, shared.
  for (int k = 0; k <= 4; ++k) {
    const Bytes b = axis.y_max * k / 4;
    std::snprintf(buf, sizeof(buf), "<text x=\"4\" y=\"%.1f\">%s</text>\n", axis.y_of(b) + 4, xml_escape(format_bytes(b)).c_str());
    svg << buf;
  }
  // Legend.
  const char* names[] = {"parameters / optimizer state", "activations / inputs", "gradients", "other", "cached, unused"};
  double lx = kMarginL;
  for (int c = 0; c < 5; ++c) {
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                  lx, height - 22, kColors[c], lx + 16, height - 12, names[c]);
    svg << buf;
    lx += 200;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace memplan::tools
