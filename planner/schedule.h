// Op orders for a training step. The program order runs every update after the whole backward
// pass, so every parameter gradient is alive at once; the memory-aware order runs each update as
// soon as its gradient is final and no remaining op reads the old parameter, so gradients die early;
// the searched order starts from the lower-peak of the two and moves ops across its peak
// (planner/order_search.h).
#pragma once

#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/liveness.h"
#include "memplan/planner/order_search.h"

namespace memplan::planner {

enum class ScheduleKind { program, memory_aware, searched };

// The names --schedule takes and plans report (common/enum_names.h).
inline constexpr EnumName<ScheduleKind> kScheduleNames[] = {{"program", ScheduleKind::program},
                                                            {"memory_aware", ScheduleKind::memory_aware},
                                                            {"searched", ScheduleKind::searched}};

std::string_view schedule_name(ScheduleKind kind);
Result<ScheduleKind> parse_schedule_kind(std::string_view name);

// `search`: how the searched order counts bytes and how long it searches (the other kinds ignore
// it); `found`, when given, receives the search's account (searched order only).
Schedule make_schedule(const graph::Graph& graph, ScheduleKind kind, const OrderSearchOptions& search = {},
                       OrderSearchResult* found = nullptr);

// Whether op `next` should follow op `i` directly, with nothing run between: a pair a backend
// runs as one kernel (graph::fusable_pair). An update between would free its gradient for the
// second op's output to be planned over, and the two could not run together.
bool keep_next_adjacent(const graph::Graph& graph, int i, int next);

// Checks that every op appears once and runs after the producers of its inputs and, for
// in-place updates, after every reader of the tensors it updates and after every earlier (in
// program order) update of them.
Status check_schedule(const graph::Graph& graph, const Schedule& schedule);

}  // namespace memplan::planner
