// Replays a recorded PyTorch memory snapshot through memplan's caching allocator and answers what
// the recording cannot: how faithfully the simulation reproduces the run (segment allocations,
// reserved bytes, where each allocation landed), how much of the reserved peak was
// fragmentation, what expandable segments or other allocator options would have reserved, and
// how little the very same allocations need when planned ahead (memplan's offset solver on
// their [alloc, free] intervals) against the lower bound (the peak of live bytes).
//
// Recording usually starts after the model was built, so the allocator's state at the first event
// is rebuilt from the file (start_state): segments that exist at the end (or are freed in the
// trace) but were not created in it existed before; blocks freed in the trace without being
// allocated in it, and blocks allocated at the end that the trace never allocated, were live at
// the start, each at its address.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"
#include "memplan/planner/allocation_problem.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/trace/memory_snapshot.h"

namespace memplan::trace {

// ---- Start state ----

struct StartBlock {
  std::uint64_t address = 0;
  Bytes size = 0;            // block bytes (the recorded block's, or the request rounded as the allocator would)
  Bytes requested_size = 0;
  bool size_known = false;   // true when the file states the block's size (still allocated at the end)
  std::int32_t site = kNoSite;
};

struct StartSegment {
  std::uint64_t address = 0;
  Bytes total_size = 0;
  bool large_pool = true;
  std::int64_t stream = 0;
  std::vector<StartBlock> live;  // address order
};

struct StartState {
  std::vector<StartSegment> segments;  // address order
  Bytes reserved_bytes = 0;
  Bytes live_bytes = 0;  // requested bytes of the live blocks
  std::int64_t live_blocks = 0;
  // What could not be recovered from the file, one sentence each (empty when nothing was lost).
  std::vector<std::string> unrecovered;
};

// Which action frees a block: free_completed (the block is back in the cache), or free_requested
// in files that record no free_completed.
SnapshotAction free_action(const std::vector<SnapshotEvent>& events);

// The allocator's state before events[0]; `options` rounds the sizes of blocks the file does not
// state. An error names the event or segment that makes the file inconsistent (a free of an
// address in no segment, overlapping blocks).
Result<StartState> reconstruct_start_state(const MemorySnapshot& snapshot, int device,
                                           const runtime::CachingAllocatorOptions& options);

// ---- Replay ----

struct SnapshotReplayRequest {
  int device = 0;
  // A what-if beside the recorded settings (PYTORCH_CUDA_ALLOC_CONF syntax, parsed).
  std::optional<runtime::CachingAllocatorOptions> alloc_conf;
  std::string alloc_conf_text;
  // The static plan's solver budget, in search nodes (deterministic); < 0 = no limit.
  std::int64_t solver_nodes = 20'000;
  int top_sites = 10;
  bool record_timeline = false;  // reserved/allocated after every event, for pictures
};

struct ReplayTimelinePoint {
  std::int64_t event = 0;
  Bytes allocated_bytes = 0;
  Bytes reserved_bytes = 0;
};

struct AllocatorRun {
  std::string name;
  std::string config;  // the options, PYTORCH_CUDA_ALLOC_CONF syntax
  std::vector<Bytes> segment_sizes;  // device allocations (or page maps) in order
  std::int64_t segment_frees = 0;
  Bytes reserved_peak_bytes = 0;
  std::int64_t reserved_peak_event = -1;   // first event at which reserved reached its peak
  Bytes allocated_at_reserved_peak_bytes = 0;  // the most allocated while reserved stood at its peak
  std::int64_t peak_moment_event = -1;         // the event where that was
  Bytes reserved_at_end_bytes = 0;
  bool out_of_memory = false;
  std::vector<ReplayTimelinePoint> timeline;
};

struct Divergence {
  std::int64_t event = -1;
  Bytes size = 0;
  std::string site;  // innermost user frame, "" when the file has none
  std::string what;  // what differs, in a sentence
};

struct ReplayFidelity {
  bool segment_sizes_match = false;  // the same segment sizes in the same order
  bool reserved_peak_matches = false;
  std::int64_t placements_compared = 0;
  std::int64_t placements_matched = 0;  // same segment and offset as recorded
  double placement_match_ratio = 0.0;
  std::optional<Divergence> first_divergence;
};

// One recorded out-of-memory event and whether the request would have fit otherwise.
struct OomAnalysis {
  std::int64_t event = 0;
  Bytes requested_bytes = 0;
  Bytes device_free_bytes = 0;     // as recorded
  Bytes capacity_bytes = 0;        // recorded reserved then + device free: what the process could have had
  Bytes largest_free_block_bytes = 0;  // in the simulated cache at that moment
  bool fits_cached = false;        // a cached block could serve it
  bool fits_expandable = false;    // expandable segments' reserved then + the request <= capacity
  bool fits_static_plan = false;   // the whole trace's planned arena <= capacity
};

struct SiteBytes {
  std::string site;
  Bytes live_bytes = 0;
  Bytes stranded_bytes = 0;  // free bytes of split segments beside this site's blocks
  std::int64_t blocks = 0;
};

struct SnapshotReplay {
  int device = 0;
  std::int64_t events = 0;
  std::int64_t allocs = 0;
  std::int64_t frees = 0;
  std::int64_t streams = 1;
  StartState start;
  AllocatorRun recorded;
  AllocatorRun simulated;
  AllocatorRun expandable;
  std::optional<AllocatorRun> alloc_conf;
  ReplayFidelity fidelity;
  Bytes live_peak_bytes = 0;       // the lower bound: peak of live bytes (512-byte blocks)
  Bytes planned_arena_bytes = 0;   // the static plan's arena
  planner::SolveStatus plan_status = planner::SolveStatus::not_found;
  planner::AllocationProblem problem;  // the trace as buffers, [alloc, free) in event indices
  std::vector<Offset> plan_offsets;    // one per problem buffer
  std::vector<std::uint64_t> recorded_addresses;  // one per problem buffer: where PyTorch put it
  struct RecordedSegment {
    std::uint64_t address = 0;
    Bytes size = 0;
  };
  std::vector<RecordedSegment> recorded_segments;  // every segment of the recording, address order
  std::vector<SiteBytes> top_sites;    // at the simulated reserved peak, by live bytes
  std::vector<OomAnalysis> ooms;
  std::vector<std::string> notes;      // what the replay assumed or could not model
  double plan_ms = 0.0;                // wall time of the static plan (solver + validator)
};

Result<SnapshotReplay> replay_snapshot(const MemorySnapshot& snapshot, const SnapshotReplayRequest& request);

}  // namespace memplan::trace
