// Allocation traces: what an allocator did, event by event, labelled with the training step and
// op the caller was running; plus plain-data snapshots of an allocator's segments and blocks.
// Both export as plain JSON and in the layout of PyTorch's memory snapshot (torch.cuda.memory.
// _snapshot(): segments with blocks, device_traces with actions), so a dynamic replay can be
// opened in the same viewers as a real PyTorch run. The trace records; it decides nothing.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memplan/common/types.h"
#include "memplan/runtime/virtual_memory.h"

namespace memplan::runtime {

// PyTorch's trace actions, same names (trace_action_name).
enum class TraceAction : std::uint8_t {
  alloc,           // size = requested bytes, address = block
  free_requested,  // the user freed the block; size = requested bytes
  free_completed,  // the block is back in the cache (same moment on a single stream)
  segment_alloc,   // a device allocation; size = segment bytes
  segment_free,    // a device free; size = segment bytes
  segment_map,     // expandable segment grew; size = mapped bytes
  segment_unmap,   // expandable segment shrank; size = unmapped bytes
  oom,             // size = rounded request; address slot = bytes the device reported free
};
std::string_view trace_action_name(TraceAction action);

inline constexpr std::int32_t kNoLabel = -1;

struct TraceEvent {
  TraceAction action = TraceAction::alloc;
  DeviceAddress address = 0;      // for oom: device free bytes (PyTorch's `device_free`)
  Bytes size = 0;
  std::int64_t step = 0;          // the caller's step when the event happened
  std::int32_t label = kNoLabel;  // index into AllocationTrace::label(); the caller's op label
  std::int64_t sequence = 0;      // position in the trace: the logical clock exported as time_us
};

class AllocationTrace {
 public:
  // Context stamped on every later event until changed.
  void set_step(std::int64_t step) { step_ = step; }
  void set_label(std::string_view label);
  void clear_label() { label_ = kNoLabel; }
  std::int64_t step() const { return step_; }

  void record(TraceAction action, DeviceAddress address, Bytes size);
  void clear() { events_.clear(); }

  const std::vector<TraceEvent>& events() const { return events_; }
  std::string_view label(std::int32_t index) const;  // "" for kNoLabel

 private:
  std::vector<TraceEvent> events_;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, std::int32_t> label_index_;
  std::int64_t step_ = 0;
  std::int32_t label_ = kNoLabel;
  std::int64_t next_sequence_ = 0;
};

// ---- Snapshots (plain data; CachingAllocator::snapshot() fills them) ----

enum class BlockState : std::uint8_t { active_allocated, active_pending_free, inactive };
std::string_view block_state_name(BlockState state);

struct BlockSnapshot {
  DeviceAddress address = 0;
  Bytes size = 0;
  Bytes requested_size = 0;  // 0 for inactive blocks
  BlockState state = BlockState::inactive;
};

// One device allocation, or one contiguous mapped range of an expandable segment.
struct SegmentSnapshot {
  DeviceAddress address = 0;
  Bytes total_size = 0;
  Bytes allocated_size = 0;
  Bytes active_size = 0;
  Bytes requested_size = 0;
  bool large_pool = false;  // PyTorch's segment_type "large" / "small"
  bool is_expandable = false;
  std::vector<BlockSnapshot> blocks;  // address order, covering the segment exactly
};

struct AllocatorSettings {
  std::string config;                // the option string, PYTORCH_CUDA_ALLOC_CONF syntax
  Bytes max_split_size = -1;         // -1 = unlimited, as PyTorch reports SIZE_MAX
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  std::array<int, 16> roundup_power2_divisions{};  // entry i: sizes in [2^i, 2^(i+1)) MiB
};

struct AllocatorSnapshot {
  std::vector<SegmentSnapshot> segments;  // address order
  AllocatorSettings settings;
};

// ---- JSON export (allocation_trace_json.cpp) ----

// {"events":[{"action","address","size","step","label","sequence"}...]}; indent < 0 = compact.
std::string trace_to_json(const AllocationTrace& trace, int indent = -1);

// PyTorch's memory-snapshot dict: segments, device_traces (one device), allocator_settings,
// external_annotations. The caller's step and label travel as one stack frame per event
// ({"filename": "step N", "line": N, "name": label}) so the viewers show them on hover.
std::string memory_snapshot_json(const AllocatorSnapshot& snapshot, const AllocationTrace* trace,
                                 int indent = -1);

// The same dict as a pickle (protocol 2), the file format pytorch.org/memory_viz and
// torch/cuda/_memory_viz.py load (what torch.cuda.memory._dump_snapshot writes). Binary bytes.
std::string memory_snapshot_pickle(const AllocatorSnapshot& snapshot, const AllocationTrace* trace);

// Any JSON text as a protocol-2 pickle of the equivalent Python value (dict, list, str, int,
// float, bool, None). Object keys keep JSON's order.
std::string pickle_from_json(std::string_view json_text);

}  // namespace memplan::runtime
