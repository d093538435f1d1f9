// Op orders for a training step. The program order runs every update after the whole backward
// pass, so every parameter gradient is alive at once; the memory-aware order runs each update as
// soon as its gradient is final and no remaining op reads the old parameter, so gradients die early.
#pragma once

#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/liveness.h"

namespace memplan::planner {

enum class ScheduleKind { program, memory_aware };

// The names --schedule takes and plans report (common/enum_names.h).
inline constexpr EnumName<ScheduleKind> kScheduleNames[] = {{"program", ScheduleKind::program},
                                                            {"memory_aware", ScheduleKind::memory_aware}};

std::string_view schedule_name(ScheduleKind kind);
Result<ScheduleKind> parse_schedule_kind(std::string_view name);

Schedule make_schedule(const graph::Graph& graph, ScheduleKind kind);

// Checks that every op appears once and runs after the producers of its inputs and, for
// in-place updates, after every reader of the tensors it updates and after every earlier (in
// program order) update of them.
Status check_schedule(const graph::Graph& graph, const Schedule& schedule);

}  // namespace memplan::planner
