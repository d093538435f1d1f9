#include "memplan/trace/snapshot_replay.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>

#include "memplan/planner/exact_solver.h"
#include "memplan/planner/validator.h"
#include "memplan/runtime/simulated_device.h"

namespace memplan::trace {

namespace {

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

const std::vector<SnapshotEvent>& events_of(const MemorySnapshot& snapshot, int device) {
  static const std::vector<SnapshotEvent> kNone;
  if (device < 0 || static_cast<std::size_t>(device) >= snapshot.device_traces.size()) return kNone;
  return snapshot.device_traces[static_cast<std::size_t>(device)];
}

std::string site_text(const MemorySnapshot& snapshot, std::int32_t site) {
  if (site < 0 || static_cast<std::size_t>(site) >= snapshot.sites.size()) return "";
  return snapshot.sites[static_cast<std::size_t>(site)];
}

}  // namespace

SnapshotAction free_action(const std::vector<SnapshotEvent>& events) {
  for (const SnapshotEvent& e : events) {
    if (e.action == SnapshotAction::free_completed) return SnapshotAction::free_completed;
  }
  return SnapshotAction::free_requested;
}

Result<StartState> reconstruct_start_state(const MemorySnapshot& snapshot, int device,
                                           const runtime::CachingAllocatorOptions& options) {
  const std::vector<SnapshotEvent>& events = events_of(snapshot, device);
  const SnapshotAction frees = free_action(events);
  std::map<std::uint64_t, Bytes> trace_segments;     // live segments the trace created
  std::set<std::uint64_t> created_in_trace;
  struct Before {
    Bytes size = 0;
    bool large_pool = true;
    std::int64_t stream = 0;
  };
  std::map<std::uint64_t, Before> before;
  std::unordered_map<std::uint64_t, std::int64_t> live;    // address -> event that allocated it
  struct Earlier {
    StartBlock block;
    std::int64_t freed_at = -1;  // event index, -1 when still allocated at the end
  };
  std::map<std::uint64_t, Earlier> earlier;
  StartState state;

  for (std::size_t i = 0; i < events.size(); ++i) {
    const SnapshotEvent& e = events[i];
    switch (e.action) {
      case SnapshotAction::segment_alloc:
        trace_segments[e.address] = e.size;
        created_in_trace.insert(e.address);
        break;
      case SnapshotAction::segment_free:
        if (trace_segments.erase(e.address) == 0 && !created_in_trace.count(e.address)) {
          before.emplace(e.address, Before{e.size, e.size != runtime::kSmallBuffer, e.stream});
        }
        break;
      case SnapshotAction::alloc:
        if (!live.emplace(e.address, static_cast<std::int64_t>(i)).second) {
          return Error{"event " + std::to_string(i) + " allocates " + hex(e.address) +
                       ", which the trace already holds allocated (inconsistent trace)"};
        }
        break;
      default:
        if (e.action != frees) break;
        if (live.erase(e.address) == 0) {
          if (earlier.count(e.address)) {
            return Error{"event " + std::to_string(i) + " frees " + hex(e.address) + " a second time (inconsistent trace)"};
          }
          Earlier b;
          b.block.address = e.address;
          b.block.requested_size = e.size;
          b.freed_at = static_cast<std::int64_t>(i);
          earlier.emplace(e.address, b);
        }
        break;
    }
  }
  for (const SnapshotSegment& seg : snapshot.segments) {
    if (seg.device != device) continue;
    if (seg.is_expandable) {
      state.unrecovered.push_back("expandable segment at " + hex(seg.address) +
                                  ": its pages mapped before recording are not rebuilt");
      continue;
    }
    if (!created_in_trace.count(seg.address)) before.emplace(seg.address, Before{seg.total_size, seg.large_pool, seg.stream});
    for (const SnapshotBlock& b : seg.blocks) {
      if (b.state == runtime::BlockState::inactive || live.count(b.address)) continue;
      if (created_in_trace.count(seg.address)) {
        return Error{"segments: block at " + hex(b.address) + " is allocated at the end in a segment the trace created, "
                     "but the trace never allocates it (inconsistent file)"};
      }
      if (earlier.count(b.address)) {
        return Error{"segments: block at " + hex(b.address) + " is allocated at the end, but the trace frees it and never "
                     "allocates it again (inconsistent file)"};
      }
      Earlier e;
      e.block = StartBlock{b.address, b.size, b.requested_size > 0 ? b.requested_size : b.size, true, b.site};
      earlier.emplace(b.address, e);
    }
  }

  for (const auto& [base, info] : before) {
    StartSegment seg;
    seg.address = base;
    seg.total_size = info.size;
    seg.large_pool = info.large_pool;
    seg.stream = info.stream;
    state.segments.push_back(seg);
    state.reserved_bytes += info.size;
  }
  // Every earlier block lies in one segment that existed before the trace.
  for (auto& [address, e] : earlier) {
    auto it = std::upper_bound(state.segments.begin(), state.segments.end(), address,
                               [](std::uint64_t a, const StartSegment& s) { return a < s.address; });
    if (it == state.segments.begin() || address >= std::prev(it)->address + static_cast<std::uint64_t>(std::prev(it)->total_size)) {
      if (e.freed_at >= 0) {
        return Error{"event " + std::to_string(e.freed_at) + " frees " + hex(address) +
                     ", an address that is in no segment of the file and was never allocated in its trace"};
      }
      return Error{"segments: block at " + hex(address) + " lies outside every segment"};
    }
    std::prev(it)->live.push_back(e.block);
  }
  bool guessed_sizes = false;
  for (StartSegment& seg : state.segments) {
    std::sort(seg.live.begin(), seg.live.end(), [](const StartBlock& a, const StartBlock& b) { return a.address < b.address; });
    const std::uint64_t end = seg.address + static_cast<std::uint64_t>(seg.total_size);
    for (std::size_t i = 0; i < seg.live.size(); ++i) {
      StartBlock& b = seg.live[i];
      const std::uint64_t next = i + 1 < seg.live.size() ? seg.live[i + 1].address : end;
      if (!b.size_known) {
        guessed_sizes = true;
        b.size = runtime::CachingAllocator::round_size(b.requested_size, options);
        const Bytes gap = static_cast<Bytes>(next - b.address) - b.size;
        // A large-pool block is never split off a remainder of 1 MiB or less, so such a gap
        // after a block is part of the block.
        if (seg.large_pool && gap > 0 && gap <= runtime::kSmallSize) b.size += gap;
      }
      if (b.address + static_cast<std::uint64_t>(b.size) > next) {
        return Error{"segment " + hex(seg.address) + ": the block at " + hex(b.address) + " (" + std::to_string(b.size) +
                     " bytes) overlaps the next block or the segment's end (inconsistent file)"};
      }
      state.live_bytes += b.requested_size;
      ++state.live_blocks;
    }
  }
  // A block allocated before the trace may be larger than its rounded request: the allocator
  // hands out a whole free block when the rest would be 1 MiB or less (large pool). The trace
  // shows it: an allocation always takes the front of a free block, so the first allocation that
  // lands in the free space after such a block, before that block is freed, marks where the free
  // space really began.
  struct Gap {
    std::uint64_t start = 0, end = 0;
    StartBlock* owner = nullptr;
    bool resolved = false;
  };
  std::vector<Gap> gaps;
  for (StartSegment& seg : state.segments) {
    if (!seg.large_pool) continue;
    const std::uint64_t end = seg.address + static_cast<std::uint64_t>(seg.total_size);
    for (std::size_t i = 0; i < seg.live.size(); ++i) {
      StartBlock& b = seg.live[i];
      const std::uint64_t gap_start = b.address + static_cast<std::uint64_t>(b.size);
      const std::uint64_t next = i + 1 < seg.live.size() ? seg.live[i + 1].address : end;
      if (!b.size_known && next > gap_start) gaps.push_back({gap_start, next, &b, false});
    }
  }
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.start < b.start; });
  if (!gaps.empty()) {
    std::unordered_map<std::uint64_t, std::size_t> gap_after;  // owner address -> gap
    for (std::size_t g = 0; g < gaps.size(); ++g) gap_after[gaps[g].owner->address] = g;
    for (const SnapshotEvent& e : events) {
      if (e.action == SnapshotAction::alloc) {
        auto it = std::upper_bound(gaps.begin(), gaps.end(), e.address, [](std::uint64_t a, const Gap& g) { return a < g.start; });
        if (it == gaps.begin()) continue;
        Gap& g = *std::prev(it);
        if (g.resolved || e.address >= g.end) continue;
        g.resolved = true;
        const auto slack = static_cast<Bytes>(e.address - g.start);
        if (slack > 0 && slack <= runtime::kSmallSize) g.owner->size += slack;
      } else if (e.action == frees) {
        if (auto it = gap_after.find(e.address); it != gap_after.end()) gaps[it->second].resolved = true;
      }
    }
  }
  if (guessed_sizes) {
    state.unrecovered.push_back(
        "blocks freed in the trace but allocated before it: their block sizes are their requests rounded as the "
        "allocator rounds (plus any gap of 1 MiB or less after a large-pool block)");
  }
  if (!state.segments.empty()) {
    state.unrecovered.push_back(
        "free space inside segments that existed before the trace is taken as one free block per gap between live "
        "blocks (the cache's earlier splits are not in the file)");
  }
  return state;
}

namespace {

struct RunSetup {
  const MemorySnapshot& snapshot;
  const std::vector<SnapshotEvent>& events;
  const StartState& start;
  SnapshotAction frees;
  // More than any allocator can reserve for this trace (each allocation gets at most one new
  // segment of at most its size rounded up to 20 MiB), so the simulation never runs out; kept
  // this small because expandable segments reserve address space in proportion to it.
  Bytes device_bytes = 0;
};

Bytes device_bound(const StartState& start, const std::vector<SnapshotEvent>& events) {
  Bytes bound = start.reserved_bytes + (Bytes{1} << 30);
  for (const SnapshotEvent& e : events) {
    if (e.action == SnapshotAction::alloc) bound += align_up(e.size, runtime::kRoundLarge) + runtime::kLargeBuffer;
  }
  for (const StartSegment& seg : start.segments) {
    for (const StartBlock& b : seg.live) bound += align_up(b.size, runtime::kRoundLarge) + runtime::kLargeBuffer;
  }
  return align_up(bound, runtime::SimulatedDevice::kPageGranularity);
}

struct RunResult {
  AllocatorRun run;
  std::int64_t peak_moment_event = -1;  // the event with the most allocated at the reserved peak
  std::vector<std::pair<std::int64_t, Bytes>> largest_free_at_oom;  // event, largest free block
  std::unordered_map<runtime::DeviceAddress, std::int32_t> site_of_block;  // live blocks at stop
};

// One replay of the trace through a caching allocator with `options`. With `fidelity`, compares
// each allocation's segment and offset with the recording. Stops after event `stop_at` (>= 0; -1
// = before the first) and hands the allocator to `at_stop` there.
using AtStop = std::function<void(runtime::CachingAllocator&)>;
RunResult run_allocator(const RunSetup& setup, const runtime::CachingAllocatorOptions& options, const std::string& name,
                        ReplayFidelity* fidelity, std::int64_t stop_at, bool record_timeline, const AtStop& at_stop = {}) {
  RunResult out;
  out.run.name = name;
  out.run.config = options.to_string();
  runtime::SimulatedDevice device(setup.device_bytes);
  runtime::CachingAllocator allocator(device, options);
  runtime::AllocationTrace sim_trace;

  struct RecordedSegment {
    Bytes size = 0;
    runtime::DeviceAddress sim_base = 0;  // 0: no simulated counterpart
  };
  std::map<std::uint64_t, RecordedSegment> rec_segments;
  std::unordered_map<std::uint64_t, void*> live;  // recorded address -> simulated pointer
  const bool restore = !options.expandable_segments;
  for (const StartSegment& seg : setup.start.segments) {
    if (restore) {
      std::vector<runtime::CachingAllocator::RestoredBlock> blocks;
      std::uint64_t at = seg.address;
      for (const StartBlock& b : seg.live) {
        if (b.address > at) blocks.push_back({static_cast<Bytes>(b.address - at), 0, false});
        blocks.push_back({b.size, b.requested_size, true});
        at = b.address + static_cast<std::uint64_t>(b.size);
      }
      const std::uint64_t end = seg.address + static_cast<std::uint64_t>(seg.total_size);
      if (end > at) blocks.push_back({static_cast<Bytes>(end - at), 0, false});
      Result<runtime::DeviceAddress> base = allocator.restore_segment(seg.large_pool, blocks, seg.stream);
      MEMPLAN_CHECK(base.ok(), "restoring a checked start segment failed: " << base.error().message);
      rec_segments[seg.address] = {seg.total_size, base.value()};
      for (const StartBlock& b : seg.live) {
        void* ptr = reinterpret_cast<void*>(base.value() + (b.address - seg.address));
        live[b.address] = ptr;
        out.site_of_block[reinterpret_cast<runtime::DeviceAddress>(ptr)] = b.site;
      }
    } else {
      // Expandable segments cannot take a recorded layout: the live blocks are allocated afresh.
      for (const StartBlock& b : seg.live) {
        Result<void*> ptr = allocator.allocate(b.requested_size, seg.stream);
        MEMPLAN_CHECK(ptr.ok(), "an unlimited simulated device ran out of memory");
        live[b.address] = ptr.value();
        out.site_of_block[reinterpret_cast<runtime::DeviceAddress>(ptr.value())] = b.site;
      }
    }
  }
  if (stop_at == -1 && at_stop) at_stop(allocator);
  allocator.set_trace(&sim_trace);
  std::size_t seen = 0;
  std::vector<std::uint64_t> pending;  // recorded segment allocations since the last alloc
  const auto all = static_cast<std::size_t>(runtime::StatPool::all);

  auto diverge = [&](std::int64_t event, Bytes size, std::int32_t site, std::string what) {
    if (fidelity != nullptr && !fidelity->first_divergence) {
      fidelity->first_divergence = Divergence{event, size, site_text(setup.snapshot, site), std::move(what)};
    }
  };
  auto segment_list = [](const std::vector<Bytes>& sizes) {
    std::string s = "[";
    for (std::size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + runtime::format_size(sizes[i]);
    return s + "]";
  };

  Bytes peak = -1;
  for (std::size_t i = 0; i < setup.events.size(); ++i) {
    const SnapshotEvent& e = setup.events[i];
    const auto index = static_cast<std::int64_t>(i);
    switch (e.action) {
      case SnapshotAction::segment_alloc:
        rec_segments[e.address] = {e.size, 0};
        pending.push_back(e.address);
        break;
      case SnapshotAction::segment_free: {
        auto it = rec_segments.find(e.address);
        const bool released = it != rec_segments.end() && it->second.sim_base != 0 && allocator.release_segment(it->second.sim_base);
        if (!released && restore) {
          diverge(index, e.size, e.site, "the recording returns a " + runtime::format_size(e.size) +
                                             " segment to the device that the simulation does not hold free");
        }
        if (it != rec_segments.end()) rec_segments.erase(it);
        break;
      }
      case SnapshotAction::alloc: {
        Result<void*> ptr = allocator.allocate(e.size, e.stream);
        if (!ptr.ok()) {
          out.run.out_of_memory = true;
          break;
        }
        std::vector<runtime::DeviceAddress> sim_segments;
        std::vector<Bytes> sim_sizes;
        for (; seen < sim_trace.events().size(); ++seen) {
          const runtime::TraceEvent& t = sim_trace.events()[seen];
          if (t.action == runtime::TraceAction::segment_alloc || t.action == runtime::TraceAction::segment_map) {
            out.run.segment_sizes.push_back(t.size);
            sim_sizes.push_back(t.size);
            if (t.action == runtime::TraceAction::segment_alloc) sim_segments.push_back(t.address);
          } else if (t.action == runtime::TraceAction::segment_free || t.action == runtime::TraceAction::segment_unmap) {
            ++out.run.segment_frees;
          }
        }
        if (fidelity != nullptr) {
          std::vector<Bytes> rec_sizes;
          for (std::size_t k = 0; k < pending.size(); ++k) {
            rec_sizes.push_back(rec_segments[pending[k]].size);
            if (k < sim_segments.size()) rec_segments[pending[k]].sim_base = sim_segments[k];
          }
          if (rec_sizes != sim_sizes) {
            diverge(index, e.size, e.site,
                    "before this allocation the recording allocated segments " + segment_list(rec_sizes) +
                        ", the simulation " + segment_list(sim_sizes));
          }
          auto seg = rec_segments.upper_bound(e.address);
          if (seg != rec_segments.begin() && e.address < std::prev(seg)->first + static_cast<std::uint64_t>(std::prev(seg)->second.size)) {
            --seg;
            ++fidelity->placements_compared;
            const auto sim = reinterpret_cast<runtime::DeviceAddress>(ptr.value());
            if (seg->second.sim_base != 0 && sim == seg->second.sim_base + (e.address - seg->first)) {
              ++fidelity->placements_matched;
            } else if (fidelity->first_divergence == std::nullopt) {
              // Name where the simulation put it, in the recording's terms.
              std::string where = "in a segment the recording does not have";
              for (const auto& [rec_base, rs] : rec_segments) {
                if (rs.sim_base != 0 && sim >= rs.sim_base && sim < rs.sim_base + static_cast<runtime::DeviceAddress>(rs.size)) {
                  where = "at offset " + std::to_string(sim - rs.sim_base) + " of the " + runtime::format_size(rs.size) +
                          " segment recorded at " + hex(rec_base);
                }
              }
              diverge(index, e.size, e.site,
                      "recorded at offset " + std::to_string(e.address - seg->first) + " of the " +
                          runtime::format_size(seg->second.size) + " segment at " + hex(seg->first) + ", simulated " + where);
            }
          }
        }
        pending.clear();
        live[e.address] = ptr.value();
        out.site_of_block[reinterpret_cast<runtime::DeviceAddress>(ptr.value())] = e.site;
        break;
      }
      case SnapshotAction::oom:
        out.largest_free_at_oom.emplace_back(index, allocator.largest_free_block());
        break;
      default:
        if (e.action == setup.frees) {
          auto it = live.find(e.address);
          if (it != live.end()) {
            out.site_of_block.erase(reinterpret_cast<runtime::DeviceAddress>(it->second));
            allocator.free(it->second);
            live.erase(it);
          }
        }
        break;
    }
    // Frees without an allocation still count (a segment release).
    for (; seen < sim_trace.events().size(); ++seen) {
      const runtime::TraceAction a = sim_trace.events()[seen].action;
      if (a == runtime::TraceAction::segment_free || a == runtime::TraceAction::segment_unmap) ++out.run.segment_frees;
    }
    const Bytes reserved = allocator.stats().reserved_bytes[all].current;
    const Bytes allocated = allocator.stats().allocated_bytes[all].current;
    if (reserved > peak) {
      peak = reserved;
      out.run.reserved_peak_bytes = reserved;
      out.run.reserved_peak_event = index;
      out.run.allocated_at_reserved_peak_bytes = allocated;
      out.run.peak_moment_event = out.peak_moment_event = index;
    } else if (reserved == peak && allocated > out.run.allocated_at_reserved_peak_bytes) {
      out.run.allocated_at_reserved_peak_bytes = allocated;
      out.run.peak_moment_event = out.peak_moment_event = index;
    }
    if (record_timeline) out.run.timeline.push_back({index, allocated, reserved});
    if (index == stop_at) {
      if (at_stop) at_stop(allocator);
      break;
    }
  }
  if (setup.events.empty()) {
    out.run.reserved_peak_bytes = allocator.stats().reserved_bytes[all].current;
    out.run.allocated_at_reserved_peak_bytes = allocator.stats().allocated_bytes[all].current;
  }
  out.run.reserved_at_end_bytes = allocator.stats().reserved_bytes[all].current;
  allocator.set_trace(nullptr);
  return out;
}

// The recording itself: reserved bytes from the start state and the segment events, live
// (requested) bytes from the allocations.
AllocatorRun recorded_run(const RunSetup& setup, bool record_timeline) {
  AllocatorRun run;
  run.name = "recorded";
  Bytes reserved = setup.start.reserved_bytes;
  Bytes live = setup.start.live_bytes;
  std::unordered_map<std::uint64_t, Bytes> sizes;
  for (const StartSegment& seg : setup.start.segments) {
    for (const StartBlock& b : seg.live) sizes[b.address] = b.requested_size;
  }
  run.reserved_peak_bytes = reserved;
  run.allocated_at_reserved_peak_bytes = live;
  for (std::size_t i = 0; i < setup.events.size(); ++i) {
    const SnapshotEvent& e = setup.events[i];
    switch (e.action) {
      case SnapshotAction::segment_alloc:
      case SnapshotAction::segment_map:
        reserved += e.size;
        run.segment_sizes.push_back(e.size);
        break;
      case SnapshotAction::segment_free:
      case SnapshotAction::segment_unmap:
        reserved -= e.size;
        ++run.segment_frees;
        break;
      case SnapshotAction::alloc:
        live += e.size;
        sizes[e.address] = e.size;
        break;
      default:
        if (e.action == setup.frees) {
          if (auto it = sizes.find(e.address); it != sizes.end()) {
            live -= it->second;
            sizes.erase(it);
          }
        }
        break;
    }
    if (reserved > run.reserved_peak_bytes) {
      run.reserved_peak_bytes = reserved;
      run.reserved_peak_event = run.peak_moment_event = static_cast<std::int64_t>(i);
      run.allocated_at_reserved_peak_bytes = live;
    } else if (reserved == run.reserved_peak_bytes && live > run.allocated_at_reserved_peak_bytes) {
      run.allocated_at_reserved_peak_bytes = live;
      run.peak_moment_event = static_cast<std::int64_t>(i);
    }
    if (record_timeline) run.timeline.push_back({static_cast<std::int64_t>(i), live, reserved});
  }
  run.reserved_at_end_bytes = reserved;
  return run;
}

// Every allocation of the trace as a buffer live over [alloc, free) in event indices; blocks
// live at the start begin at 0, blocks never freed end one past the last event.
planner::AllocationProblem trace_problem(const RunSetup& setup, std::vector<std::uint64_t>* addresses) {
  planner::AllocationProblem problem;
  const auto n = static_cast<planner::TimePoint>(setup.events.size());
  if (n == 0) return problem;
  std::unordered_map<std::uint64_t, std::size_t> open;  // address -> buffer index
  auto add = [&](std::uint64_t address, Bytes requested, planner::TimePoint first, std::string id) {
    planner::BufferSpec b;
    b.id = std::move(id);
    b.size_bytes = align_up(std::max<Bytes>(requested, 1), runtime::kMinBlockSize);
    b.alignment = 1;
    b.first_op = first;
    b.end_op = n;
    open[address] = problem.buffers.size();
    problem.buffers.push_back(std::move(b));
    addresses->push_back(address);
  };
  for (const StartSegment& seg : setup.start.segments) {
    for (const StartBlock& b : seg.live) add(b.address, b.requested_size, 0, "start@" + hex(b.address));
  }
  for (std::size_t i = 0; i < setup.events.size(); ++i) {
    const SnapshotEvent& e = setup.events[i];
    if (e.action == SnapshotAction::alloc) {
      add(e.address, e.size, static_cast<planner::TimePoint>(i), "event" + std::to_string(i));
    } else if (e.action == setup.frees) {
      auto it = open.find(e.address);
      if (it == open.end()) continue;
      planner::BufferSpec& b = problem.buffers[it->second];
      b.end_op = std::max<planner::TimePoint>(static_cast<planner::TimePoint>(i), b.first_op + 1);
      open.erase(it);
    }
  }
  return problem;
}

// Live bytes per site at the simulated allocator's state, and the free bytes of split segments
// beside each site's blocks (a free block counts toward the block before it, else after it).
std::vector<SiteBytes> sites_at(const MemorySnapshot& snapshot, const RunResult& r,
                                const runtime::AllocatorSnapshot& state, int top) {
  std::map<std::string, SiteBytes> by_site;
  auto site_name = [&](runtime::DeviceAddress a) {
    auto it = r.site_of_block.find(a);
    const std::string s = it == r.site_of_block.end() ? "" : site_text(snapshot, it->second);
    return s.empty() ? std::string("(no Python frame recorded)") : s;
  };
  for (const runtime::SegmentSnapshot& seg : state.segments) {
    const auto& blocks = seg.blocks;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const runtime::BlockSnapshot& b = blocks[i];
      if (b.state != runtime::BlockState::inactive) {
        SiteBytes& s = by_site[site_name(b.address)];
        s.live_bytes += b.size;
        ++s.blocks;
        continue;
      }
      if (blocks.size() == 1) {
        by_site["(cached segments with nothing allocated)"].stranded_bytes += b.size;
        continue;
      }
      const runtime::BlockSnapshot& owner = i > 0 ? blocks[i - 1] : blocks[i + 1];
      by_site[site_name(owner.address)].stranded_bytes += b.size;
    }
  }
  std::vector<SiteBytes> out;
  for (auto& [name, s] : by_site) {
    s.site = name;
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const SiteBytes& a, const SiteBytes& b) {
    return a.live_bytes + a.stranded_bytes != b.live_bytes + b.stranded_bytes
               ? a.live_bytes + a.stranded_bytes > b.live_bytes + b.stranded_bytes
               : a.site < b.site;
  });
  if (top >= 0 && out.size() > static_cast<std::size_t>(top)) out.resize(static_cast<std::size_t>(top));
  return out;
}

}  // namespace

Result<SnapshotReplay> replay_snapshot(const MemorySnapshot& snapshot, const SnapshotReplayRequest& request) {
  SnapshotReplay out;
  out.device = request.device;
  if (request.device < 0 || (static_cast<std::size_t>(request.device) >= snapshot.device_traces.size() &&
                             !(request.device == 0 && snapshot.device_traces.empty()))) {
    return Error{"device " + std::to_string(request.device) + " has no trace in this snapshot (it has " +
                 std::to_string(snapshot.device_traces.size()) + " device traces)"};
  }
  const std::vector<SnapshotEvent>& events = events_of(snapshot, request.device);
  const runtime::CachingAllocatorOptions recorded_options = snapshot.settings.value_or(runtime::CachingAllocatorOptions{});
  if (!snapshot.settings) out.notes.push_back("the file has no allocator_settings: PyTorch's defaults assumed");
  if (recorded_options.garbage_collection_threshold > 0) {
    out.notes.push_back("garbage_collection_threshold is recorded but acts only under a memory fraction, which the file "
                        "does not state: not applied");
  }
  runtime::CachingAllocatorOptions sim_options = recorded_options;
  sim_options.garbage_collection_threshold = 0.0;
  sim_options.per_process_memory_fraction = 0.0;

  auto start = reconstruct_start_state(snapshot, request.device, sim_options);
  if (!start) return start.error();
  out.start = std::move(start.value());
  const RunSetup setup{snapshot, events, out.start, free_action(events), device_bound(out.start, events)};

  std::set<std::int64_t> streams;
  for (const SnapshotEvent& e : events) {
    ++out.events;
    if (e.action == SnapshotAction::alloc) ++out.allocs;
    if (e.action == setup.frees) ++out.frees;
    streams.insert(e.stream);
  }
  out.streams = std::max<std::int64_t>(1, static_cast<std::int64_t>(streams.size()));
  if (streams.size() > 1) {
    out.notes.push_back("events on " + std::to_string(streams.size()) +
                        " streams: each stream has its own cached blocks, and a free takes effect at once (the events "
                        "that delay cross-stream frees are not in the trace)");
  }
  if (setup.frees == SnapshotAction::free_requested && out.frees > 0) {
    out.notes.push_back("the trace records no free_completed: blocks are taken as free at free_requested");
  }

  out.recorded = recorded_run(setup, request.record_timeline);
  RunResult sim = run_allocator(setup, sim_options, "simulated (recorded settings)", &out.fidelity, -1, request.record_timeline);
  out.simulated = sim.run;
  out.fidelity.segment_sizes_match = out.simulated.segment_sizes == out.recorded.segment_sizes;
  out.fidelity.reserved_peak_matches = out.simulated.reserved_peak_bytes == out.recorded.reserved_peak_bytes;
  out.fidelity.placement_match_ratio = out.fidelity.placements_compared == 0
                                           ? 1.0
                                           : double(out.fidelity.placements_matched) / double(out.fidelity.placements_compared);

  runtime::CachingAllocatorOptions expandable_options = sim_options;
  expandable_options.expandable_segments = true;
  RunResult exp = run_allocator(setup, expandable_options, "expandable segments", nullptr, -1, request.record_timeline);
  out.expandable = exp.run;
  if (request.alloc_conf) {
    runtime::CachingAllocatorOptions conf = *request.alloc_conf;
    conf.per_process_memory_fraction = 0.0;
    out.alloc_conf = run_allocator(setup, conf, "--alloc-conf " + request.alloc_conf_text, nullptr, -1, request.record_timeline).run;
  }

  // The static plan of the same allocations.
  out.problem = trace_problem(setup, &out.recorded_addresses);
  {
    std::map<std::uint64_t, Bytes> segments;
    for (const StartSegment& seg : out.start.segments) segments[seg.address] = seg.total_size;
    for (const SnapshotEvent& e : events) {
      if (e.action == SnapshotAction::segment_alloc) segments[e.address] = std::max(segments[e.address], e.size);
    }
    for (const auto& [address, size] : segments) out.recorded_segments.push_back({address, size});
  }
  out.live_peak_bytes = planner::lower_bound_bytes(out.problem);
  const auto plan_start = std::chrono::steady_clock::now();
  if (!out.problem.buffers.empty()) {
    planner::ExactSolverOptions solver;
    solver.time_limit_s = 0;  // deterministic: the node budget decides
    solver.node_limit = request.solver_nodes;
    const planner::Solution plan = planner::solve_exact(out.problem, solver);
    MEMPLAN_CHECK(plan.has_packing(), "the solver found no packing without a capacity");
    const Status valid = planner::validate_solution(out.problem, plan);
    MEMPLAN_CHECK(valid.ok(), "the static plan of a trace failed validation: " << valid.error().message);
    out.planned_arena_bytes = plan.height_bytes;
    out.plan_status = plan.status;
    out.plan_offsets = plan.offsets;
  } else {
    out.plan_status = planner::SolveStatus::optimal;
  }
  out.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - plan_start).count();

  // Where the memory went, at the simulated reserved peak.
  if (sim.peak_moment_event >= 0 && request.top_sites > 0) {
    runtime::AllocatorSnapshot state;
    RunResult at_peak = run_allocator(setup, sim_options, "", nullptr, sim.peak_moment_event, false,
                                      [&state](runtime::CachingAllocator& a) { state = a.snapshot(); });
    out.top_sites = sites_at(snapshot, at_peak, state, request.top_sites);
  }

  // Recorded out-of-memory events: would the request have fit otherwise? Each alternative is
  // replayed to the moment before the failed request and then asked for it.
  for (std::size_t k = 0; k < sim.largest_free_at_oom.size(); ++k) {
    const std::int64_t i = sim.largest_free_at_oom[k].first;
    const SnapshotEvent& e = events[static_cast<std::size_t>(i)];
    OomAnalysis o;
    o.event = i;
    o.requested_bytes = e.size;
    o.device_free_bytes = static_cast<Bytes>(e.address);
    Bytes recorded_reserved = out.start.reserved_bytes;
    for (std::int64_t j = 0; j < i; ++j) {
      const SnapshotEvent& p = events[static_cast<std::size_t>(j)];
      if (p.action == SnapshotAction::segment_alloc || p.action == SnapshotAction::segment_map) recorded_reserved += p.size;
      if (p.action == SnapshotAction::segment_free || p.action == SnapshotAction::segment_unmap) recorded_reserved -= p.size;
    }
    o.capacity_bytes = recorded_reserved + o.device_free_bytes;
    o.largest_free_block_bytes = sim.largest_free_at_oom[k].second;
    o.fits_cached = o.largest_free_block_bytes >= runtime::CachingAllocator::round_size(e.size, sim_options);
    run_allocator(setup, expandable_options, "", nullptr, i - 1, false, [&](runtime::CachingAllocator& a) {
      Result<void*> ptr = a.allocate(e.size, e.stream);
      o.fits_expandable = ptr.ok() && a.stats().reserved_bytes[static_cast<std::size_t>(runtime::StatPool::all)].current <= o.capacity_bytes;
    });
    // The static plan with the failed request added, live from its moment to the next event,
    // packed within the capacity.
    planner::AllocationProblem with_request = out.problem;
    planner::BufferSpec request_buffer;
    request_buffer.id = "oom" + std::to_string(i);
    request_buffer.size_bytes = align_up(std::max<Bytes>(e.size, 1), runtime::kMinBlockSize);
    request_buffer.first_op = i;
    request_buffer.end_op = i + 1;
    with_request.buffers.push_back(request_buffer);
    with_request.capacity_bytes = o.capacity_bytes;
    planner::ExactSolverOptions solver;
    solver.time_limit_s = 0;
    solver.node_limit = request.solver_nodes;
    const planner::Solution fit = planner::solve_exact(with_request, solver);
    o.fits_static_plan = fit.has_packing();
    if (fit.status == planner::SolveStatus::timed_out) {
      out.notes.push_back("out of memory at event " + std::to_string(i) +
                          ": the solver's budget ran out before it settled whether a static plan fits");
    }
    out.ooms.push_back(o);
  }
  for (const std::string& n : snapshot.notes) out.notes.push_back(n);
  return out;
}

}  // namespace memplan::trace
