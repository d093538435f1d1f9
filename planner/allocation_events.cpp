#include "memplan/planner/allocation_events.h"

namespace memplan::planner {

AllocationEvents allocation_events(const MemoryPlan& plan) {
  AllocationEvents e;
  const std::size_t positions = plan.schedule.size();
  e.alloc_before.assign(positions, {});
  e.free_after.assign(positions, {});
  e.optimizer_state_first_use.assign(positions, {});
  for (std::size_t b = 0; b < plan.buffers.size(); ++b) {
    const PlannedBuffer& buf = plan.buffers[b];
    const int i = static_cast<int>(b);
    if (buf.persistent) {
      e.persistent.push_back(i);
      if (buf.role == graph::Role::optimizer_state && positions > 0) {
        e.optimizer_state_first_use[static_cast<std::size_t>(buf.first_use)].push_back(i);
      }
      continue;
    }
    if (buf.role == graph::Role::input) {
      e.inputs.push_back(i);
    } else {
      e.alloc_before[static_cast<std::size_t>(buf.first_op)].push_back(i);
    }
    if (buf.step_result) {
      e.step_results.push_back(i);
    } else {
      e.free_after[static_cast<std::size_t>(buf.last_op)].push_back(i);
    }
  }
  return e;
}

}  // namespace memplan::planner
