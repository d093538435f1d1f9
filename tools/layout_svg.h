// Pictures of memory layouts: address (vertical) against time in ops (horizontal), one rectangle
// per live tensor, panels side by side on one byte scale so a static plan and a dynamic
// allocator's layout of the same step can be compared at a glance. Plain SVG, no dependencies.
// Graphs with thousands of tensors stay readable: tensors under a pixel tall are pooled into
// small cells drawn as opaque as the share of the cell they cover (each tensor counted once, in
// the cell where it starts), so the picture keeps every byte where it lives.
#pragma once

#include <string>
#include <vector>

#include "memplan/common/types.h"
#include "memplan/graph/tensor.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::tools {

struct LayoutRect {
  double t0 = 0, t1 = 0;  // time span (ops), t1 exclusive
  Bytes lo = 0, hi = 0;   // address span relative to the panel's base
  std::string label;      // shown as a tooltip
  int color = 0;          // a category: 0 parameter/state, 1 activation, 2 gradient, 3 other, 4 free/cached
};

struct LayoutLine {
  Bytes at = 0;
  std::string label;  // drawn across the panel, e.g. "reserved peak 12.0 MiB"
};

struct LayoutPanel {
  std::string title;
  std::vector<LayoutRect> rects;
  std::vector<LayoutLine> lines;
  double t_max = 1;
};

// A tensor role's colour category (LayoutRect::color).
int layout_color(graph::Role role);
// A static plan's arena as a panel: every buffer over its lifetime (persistent ones over the whole
// step) at its offset, and the arena's size.
LayoutPanel planned_layout_panel(const planner::MemoryPlan& plan);

// One SVG document with the panels side by side sharing the vertical (byte) scale.
std::string render_layout_svg(const std::string& title, const std::vector<LayoutPanel>& panels);

// Text made safe inside SVG/HTML elements and attribute values (<, >, & and ").
std::string xml_escape(const std::string& text);

}  // namespace memplan::tools
