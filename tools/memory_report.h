// Human and JSON renderings of a MemoryPlan: totals by region and role, arena vs lower bound,
// and the buffer table (tensor, role, offset, size, first/last op).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "memplan/common/byte_size.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::tools {


// The end-of-training summary: parameters, optimizer state, peak activations + gradients,
// arena total, lower bound and the ratio.
std::string memory_summary(const graph::Graph& graph, const planner::MemoryPlan& plan);

// Every buffer in offset order.
std::string buffer_table(const planner::MemoryPlan& plan);

// Totals (arena_bytes, persistent_bytes, transient_bytes, lower_bound_bytes, ...) and, when
// `with_buffers`, the buffer list.
nlohmann::json plan_json(const graph::Graph& graph, const planner::MemoryPlan& plan, bool with_buffers);

}  // namespace memplan::tools
