#include "memplan/runtime/dynamic_replay.h"

#include <algorithm>

#include "memplan/planner/allocation_events.h"

namespace memplan::runtime {

ReplayResult replay_dynamic(const planner::MemoryPlan& plan, Device& device, const ReplayOptions& options) {
  ReplayResult result;
  CachingAllocator allocator(device, options.allocator);
  allocator.set_trace(options.trace);
  const auto n = plan.buffers.size();
  std::vector<void*> ptr(n, nullptr);
  // The same events planned, naive and dynamic execution walk.
  const planner::AllocationEvents events = planner::allocation_events(plan);
  const std::vector<int>& inputs = events.inputs;
  const std::vector<int>& results = events.step_results;
  const std::vector<std::vector<int>>& alloc_at = events.alloc_before;
  const std::vector<std::vector<int>>& free_after = events.free_after;
  std::vector<int> upfront;
  for (int b : events.persistent) {
    const bool lazy = options.lazy_optimizer_state && plan.buffers[static_cast<std::size_t>(b)].role == graph::Role::optimizer_state;
    if (!lazy) upfront.push_back(b);
  }
  OpIndex current_op = -1;
  std::int64_t current_step = 0;
  Bytes best_reserved = -1;
  auto observe = [&] {
    const AllocatorStats& s = allocator.stats();
    if (s.reserved_bytes[0].current > best_reserved) {
      best_reserved = s.reserved_bytes[0].current;
      result.allocated_at_reserved_peak_bytes = s.allocated_bytes[0].current;
      result.inactive_split_at_reserved_peak_bytes = s.inactive_split_bytes[0].current;
    }
    if (options.record_timeline) {
      result.timeline.push_back({current_step, current_op, s.allocated_bytes[0].current, s.reserved_bytes[0].current});
    }
  };
  auto allocate = [&](int b, std::int64_t step) {
    Result<void*> p = allocator.allocate(std::max<Bytes>(plan.buffers[static_cast<std::size_t>(b)].size_bytes, 1));
    if (!p) {
      result.out_of_memory = true;
      result.oom_message = p.error().message;
      result.oom_step = step;
      result.oom_op = current_op;
      result.oom_tensor = plan.buffers[static_cast<std::size_t>(b)].name;
      return false;
    }
    ptr[static_cast<std::size_t>(b)] = p.value();
    observe();
    if (step == options.steps || plan.buffers[static_cast<std::size_t>(b)].persistent) {
      result.last_step.push_back({b, reinterpret_cast<DeviceAddress>(p.value()), allocator.block_size(p.value())});
    }
    return true;
  };
  auto release = [&](int b) {
    allocator.free(ptr[static_cast<std::size_t>(b)]);
    ptr[static_cast<std::size_t>(b)] = nullptr;
    observe();
  };
  if (options.trace) options.trace->set_label("parameters");
  for (int b : upfront) {
    if (!allocate(b, 0)) return result;
  }

  for (std::int64_t step = 1; step <= options.steps; ++step) {
    if (options.trace) {
      options.trace->set_step(step);
      options.trace->set_label("inputs");
    }
    allocator.reset_peak_stats();
    current_step = step;
    current_op = -1;
    const std::int64_t device_allocs_before = allocator.stats().num_device_alloc;
    const std::int64_t device_frees_before = allocator.stats().num_device_free;
    // Last step's results and inputs are released as the new step starts (as a training loop
    // drops its references when it fetches the next batch).
    for (int b : results) release(b);
    for (int b : inputs) {
      release(b);
      if (!allocate(b, step)) return result;
    }
    for (std::size_t pos = 0; pos < plan.schedule.size(); ++pos) {
      current_op = static_cast<OpIndex>(pos);
      if (options.trace) options.trace->set_label("op " + std::to_string(pos));
      if (step == 1 && options.lazy_optimizer_state) {
        for (int b : events.optimizer_state_first_use[pos]) {
          if (!allocate(b, step)) return result;
        }
      }
      for (int b : alloc_at[pos]) {
        if (!allocate(b, step)) return result;
      }
      for (int b : free_after[pos]) release(b);
    }
    const AllocatorStats& s = allocator.stats();
    ReplayStep r;
    r.step = step;
    r.peak_reserved_bytes = s.reserved_bytes[0].peak;
    r.peak_allocated_bytes = s.allocated_bytes[0].peak;
    r.peak_requested_bytes = s.requested_bytes[0].peak;
    r.device_allocations = s.num_device_alloc - device_allocs_before;
    r.device_frees = s.num_device_free - device_frees_before;
    result.steps.push_back(r);
    result.peak_reserved_bytes = std::max(result.peak_reserved_bytes, r.peak_reserved_bytes);
    result.peak_allocated_bytes = std::max(result.peak_allocated_bytes, r.peak_allocated_bytes);
    result.peak_requested_bytes = std::max(result.peak_requested_bytes, r.peak_requested_bytes);
  }
  result.stats = allocator.stats();
  result.snapshot_at_end = allocator.snapshot();
  return result;
}

}  // namespace memplan::runtime
