// Replays a MemoryPlan's allocations and frees through a caching allocator, without running
// any kernel: the same schedule and tensor lifetimes the static plan packs, so the difference
// between the two is purely where the allocator puts things. Over a SimulatedDevice this
// answers "what would a PyTorch-style allocator reserve for this step?" for models of any size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memplan/planner/memory_plan.h"
#include "memplan/runtime/allocation_trace.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/device.h"

namespace memplan::runtime {

struct ReplayOptions {
  int steps = 3;
  CachingAllocatorOptions allocator;
  AllocationTrace* trace = nullptr;  // events labelled with step and op, when set
  // PyTorch creates optimizer state lazily inside the first optimizer step, interleaved with
  // freeing gradients; false allocates it with the parameters before the first step.
  bool lazy_optimizer_state = true;
  bool record_timeline = false;  // allocated and reserved bytes after every allocation and free
};

struct ReplayStep {
  std::int64_t step = 0;  // 1-based
  Bytes peak_reserved_bytes = 0;
  Bytes peak_allocated_bytes = 0;
  Bytes peak_requested_bytes = 0;
  std::int64_t device_allocations = 0;  // segment allocations (or page maps) during the step
  std::int64_t device_frees = 0;
};

// Where a buffer sat during the last replayed step (for pictures).
struct ReplayPlacement {
  int buffer = -1;  // index into plan.buffers
  DeviceAddress address = 0;
  Bytes block_bytes = 0;
};

struct ReplayResult {
  bool out_of_memory = false;
  std::string oom_message;  // PyTorch-shaped, when out_of_memory
  std::int64_t oom_step = 0;
  OpIndex oom_op = -1;  // schedule position (-1: before the first op, e.g. inputs)
  std::string oom_tensor;
  std::vector<ReplayStep> steps;
  Bytes peak_reserved_bytes = 0;
  Bytes peak_allocated_bytes = 0;
  Bytes peak_requested_bytes = 0;
  // At the moment reserved memory peaked: what was allocated, and what sat in free blocks of
  // split segments (cached but unusable for a larger request).
  Bytes allocated_at_reserved_peak_bytes = 0;
  Bytes inactive_split_at_reserved_peak_bytes = 0;
  struct TimelinePoint {
    std::int64_t step;
    OpIndex op;
    Bytes allocated_bytes;
    Bytes reserved_bytes;
  };
  std::vector<TimelinePoint> timeline;  // when ReplayOptions::record_timeline
  AllocatorStats stats;
  std::vector<ReplayPlacement> last_step;
  AllocatorSnapshot snapshot_at_end;  // segments and blocks after the last step
};

ReplayResult replay_dynamic(const planner::MemoryPlan& plan, Device& device, const ReplayOptions& options);

}  // namespace memplan::runtime
