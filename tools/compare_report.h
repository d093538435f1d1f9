// The compare command's self-contained HTML report (no script, nothing fetched): the numbers
// table, the layout picture, and allocated vs reserved bytes over the replayed steps.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/runtime/dynamic_replay.h"

namespace memplan::tools {

struct TimelineSeries {
  std::string name;
  const runtime::ReplayResult* result = nullptr;  // with a recorded timeline
};

// Allocated (solid) and reserved (dashed) bytes after every allocation and free, one colour per
// allocator, with the planned arena as a flat line.
std::string render_timeline_svg(const std::vector<TimelineSeries>& series, Bytes planned_arena_bytes);

// `comparison` is the compare command's JSON; the SVGs are embedded as they are.
std::string render_compare_html(const nlohmann::json& comparison, const std::string& layout_svg,
                                const std::string& timeline_svg);

}  // namespace memplan::tools
