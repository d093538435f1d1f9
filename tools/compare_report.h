// The compare command's self-contained HTML report (no script, nothing fetched): the numbers
// table, the layout picture, and allocated vs reserved bytes over the replayed steps.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/runtime/dynamic_replay.h"

namespace memplan::tools {

struct TimelineSample {
  Bytes allocated_bytes = 0;
  Bytes reserved_bytes = 0;
};

struct TimelineSeries {
  std::string name;
  std::vector<TimelineSample> samples;  // after every allocation and free
};

// A replay's recorded timeline as samples.
TimelineSeries timeline_series(const std::string& name, const runtime::ReplayResult& result);

// Allocated (solid) and reserved (dashed) bytes over time, one colour per allocator, with the
// planned arena as a flat line. Long series are drawn at most 2000 points wide, each point the
// maximum of the samples it covers, so no peak disappears.
std::string render_timeline_svg(const std::vector<TimelineSeries>& series, Bytes planned_arena_bytes);

// The opening of a report page up to <body>: a page that fits its window (1,280 px, a notebook
// cell's 800): pictures scale to the width, keeping every rectangle; wide tables scroll inside
// their own box (class "wide"); the JSON wraps.
std::string report_page_head(const std::string& title, const std::string& extra_css = "");

// `comparison` is the compare command's JSON; the SVGs are embedded as they are.
std::string render_compare_html(const nlohmann::json& comparison, const std::string& layout_svg,
                                const std::string& timeline_svg);

}  // namespace memplan::tools
