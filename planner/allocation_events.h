// The allocations and frees of a planned step, derived once from its MemoryPlan: which buffers
// live across steps, which arrive with each step's inputs, which are created before an op runs
// and which die after it. Planned execution (offsets in one arena), naive execution (one device
// allocation per buffer), dynamic execution (a caching allocator) and `memplan compare`'s replay
// all walk this one list, so "the same allocations" is true by construction.
#pragma once

#include <vector>

#include "memplan/planner/memory_plan.h"

namespace memplan::planner {

struct AllocationEvents {
  std::vector<int> persistent;    // parameters and optimizer state (buffer indices), in plan order
  std::vector<int> inputs;        // allocated as each step starts, filled from the host
  std::vector<int> step_results;  // loss, outputs, retained tensors: freed when the next step starts
  std::vector<std::vector<int>> alloc_before;  // per schedule position: buffers first written there
  std::vector<std::vector<int>> free_after;    // per schedule position: buffers dead after it
  // Per schedule position: optimizer state first touched there. Eager frameworks create it
  // lazily inside the first optimizer step; the executor creates it with the parameters.
  std::vector<std::vector<int>> optimizer_state_first_use;
};

AllocationEvents allocation_events(const MemoryPlan& plan);

}  // namespace memplan::planner
