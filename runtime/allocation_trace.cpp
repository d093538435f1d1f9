#include "memplan/runtime/allocation_trace.h"

#include "memplan/common/check.h"

namespace memplan::runtime {

std::string_view trace_action_name(TraceAction action) {
  switch (action) {
    case TraceAction::alloc: return "alloc";
    case TraceAction::free_requested: return "free_requested";
    case TraceAction::free_completed: return "free_completed";
    case TraceAction::segment_alloc: return "segment_alloc";
    case TraceAction::segment_free: return "segment_free";
    case TraceAction::segment_map: return "segment_map";
    case TraceAction::segment_unmap: return "segment_unmap";
    case TraceAction::oom: return "oom";
  }
  MEMPLAN_CHECK(false, "unknown trace action");
}

std::string_view block_state_name(BlockState state) {
  switch (state) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: return "inactive";
  }
  MEMPLAN_CHECK(false, "unknown block state");
}

void AllocationTrace::set_label(std::string_view label) {
  auto it = label_index_.find(std::string(label));
  if (it == label_index_.end()) {
    it = label_index_.emplace(std::string(label), static_cast<std::int32_t>(labels_.size())).first;
    labels_.emplace_back(label);
  }
  label_ = it->second;
}

void AllocationTrace::record(TraceAction action, DeviceAddress address, Bytes size) {
  events_.push_back(TraceEvent{action, address, size, step_, label_, next_sequence_++});
}

std::string_view AllocationTrace::label(std::int32_t index) const {
  if (index == kNoLabel) return {};
  MEMPLAN_CHECK(index >= 0 && static_cast<std::size_t>(index) < labels_.size(), "unknown label " << index);
  return labels_[static_cast<std::size_t>(index)];
}

}  // namespace memplan::runtime
