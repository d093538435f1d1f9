// PyTorch memory snapshots as plain data: what torch.cuda.memory._dump_snapshot() writes after
// torch.cuda.memory._record_memory_history() (and what `memplan compare --snapshot` writes),
// read through the whitelisting unpickler (pickle.h). The schema is PyTorch's: top-level
// `segments` (the allocator's state when the file was written), `device_traces` (one event list
// per device, oldest first), `allocator_settings` and `external_annotations`. Stack frames are
// not kept: each event and block keeps only its allocation site, the innermost frame of the
// user's own Python code, interned once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"
#include "memplan/runtime/allocation_trace.h"
#include "memplan/runtime/caching_allocator.h"

namespace memplan::trace {

inline constexpr std::int32_t kNoSite = -1;

// PyTorch's trace actions; `snapshot` marks where a snapshot was taken and changes nothing.
enum class SnapshotAction : std::uint8_t {
  alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot
};
std::string_view snapshot_action_name(SnapshotAction action);

struct SnapshotEvent {
  SnapshotAction action = SnapshotAction::alloc;
  std::uint64_t address = 0;  // for oom: the device's free bytes (PyTorch's `device_free`)
  Bytes size = 0;             // alloc/free: requested bytes; segment events: segment bytes
  std::int64_t stream = 0;
  std::int64_t time_us = 0;
  std::int32_t site = kNoSite;  // index into MemorySnapshot::sites
};

struct SnapshotBlock {
  std::uint64_t address = 0;
  Bytes size = 0;
  Bytes requested_size = 0;
  runtime::BlockState state = runtime::BlockState::inactive;
  std::int32_t site = kNoSite;
};

struct SnapshotSegment {
  std::int64_t device = 0;
  std::uint64_t address = 0;
  Bytes total_size = 0;
  Bytes allocated_size = 0;
  Bytes requested_size = 0;
  std::int64_t stream = 0;
  bool large_pool = true;  // segment_type "large" / "small"
  bool is_expandable = false;
  std::vector<SnapshotBlock> blocks;  // address order, covering the segment
};

struct MemorySnapshot {
  std::vector<SnapshotSegment> segments;
  std::vector<std::vector<SnapshotEvent>> device_traces;  // index = device
  // The allocator options the run used, when the file says (allocator_settings).
  std::optional<runtime::CachingAllocatorOptions> settings;
  std::string settings_config;  // PYTORCH_CUDA_ALLOC_CONF as recorded ("" when unset)
  std::vector<std::string> sites;  // "file:line function"
  // What the reader saw but does not model, one line each (e.g. unknown actions skipped).
  std::vector<std::string> notes;
};

struct SnapshotReadLimits {
  Bytes max_file_bytes = Bytes{2} << 30;  // 2 GiB: far above any recorded snapshot
};

// The snapshot in `bytes`; errors name `source` (a file name) and the field or byte at fault.
Result<MemorySnapshot> parse_memory_snapshot(std::string_view bytes, std::string_view source);
// Reads a regular file (not a stream, not a directory) of at most limits.max_file_bytes.
Result<MemorySnapshot> read_memory_snapshot(const std::string& path, const SnapshotReadLimits& limits = {});

// The snapshot as if the recording on `device` had started at its event `first`: the events
// before it dropped, the dumped state (segments, blocks) and everything else kept. A recording
// whose replay memplan reproduces becomes one that starts mid-run, as most users' do: the
// self-test of the start state (trace/snapshot_replay.h). `first` past the end keeps no event.
MemorySnapshot cut_snapshot(const MemorySnapshot& snapshot, int device, std::size_t first);

// The frame a user would name for an allocation: the innermost Python frame outside installed
// packages and the standard library, else the innermost Python frame; none when the stack has
// no Python frame. Frames are innermost first, as PyTorch lists them.
struct StackFrame {
  std::string_view filename;
  std::int64_t line = 0;
  std::string_view name;
};
std::optional<std::size_t> user_frame_index(const std::vector<StackFrame>& frames);

}  // namespace memplan::trace
