#include "memplan/planner/allocation_problem.h"

#include <algorithm>
#include <sstream>
#include <utility>

namespace memplan::planner {

namespace {

// Large enough for any real arena, small enough that offset + size never overflows int64.
constexpr Bytes kMaxBytes = Bytes{1} << 60;
// The footprints of all buffers together: keeps every stacked height, the lower bound's sums and
// a solver's offset + footprint inside 64 bits however the buffers are packed.
constexpr Bytes kMaxTotalBytes = Bytes{1} << 62;

std::string describe(const BufferSpec& buffer, std::size_t index) {
  std::ostringstream out;
  out << "buffer '" << buffer.id << "' (#" << index << ")";
  return out.str();
}

}  // namespace

std::string_view to_string(SolveStatus status) {
  switch (status) {
    case SolveStatus::optimal: return "optimal";
    case SolveStatus::feasible: return "feasible";
    case SolveStatus::not_found: return "not_found";
    case SolveStatus::timed_out: return "timed_out";
  }
  return "unknown";
}

Bytes lower_bound_bytes(const AllocationProblem& problem) {
  // Sweep over lifetime endpoints; at equal times ends come first because lifetimes are
  // half-open ([a, b) and [b, c) never coexist).
  std::vector<std::pair<TimePoint, Bytes>> events;
  events.reserve(problem.buffers.size() * 2);
  Bytes fixed_top = 0;
  for (const BufferSpec& buffer : problem.buffers) {
    const Bytes footprint = footprint_bytes(buffer);
    if (footprint == 0) continue;
    if (buffer.fixed_offset) fixed_top = std::max(fixed_top, *buffer.fixed_offset + footprint);
    events.emplace_back(buffer.first_op, footprint);
    events.emplace_back(buffer.end_op, -footprint);
  }
  std::sort(events.begin(), events.end());  // negative deltas sort first at equal times
  Bytes live = 0;
  Bytes peak = 0;
  for (const auto& [time, delta] : events) {
    live += delta;
    peak = std::max(peak, live);
  }
  return std::max(peak, fixed_top);
}

Status check_problem(const AllocationProblem& problem) {
  if (problem.capacity_bytes && (*problem.capacity_bytes < 0 || *problem.capacity_bytes > kMaxBytes)) {
    return Error{"capacity " + std::to_string(*problem.capacity_bytes) + " is out of range [0, 2^60]"};
  }
  std::vector<std::size_t> fixed;
  Bytes total = 0;
  for (std::size_t i = 0; i < problem.buffers.size(); ++i) {
    const BufferSpec& buffer = problem.buffers[i];
    if (buffer.size_bytes < 0 || buffer.size_bytes > kMaxBytes) {
      return Error{describe(buffer, i) + ": size " + std::to_string(buffer.size_bytes) +
                   " is out of range [0, 2^60]"};
    }
    if (buffer.alignment < 1 || buffer.alignment > kMaxBytes) {
      return Error{describe(buffer, i) + ": alignment " + std::to_string(buffer.alignment) +
                   " must be in [1, 2^60]"};
    }
    total += footprint_bytes(buffer);  // each footprint is at most 2^61: no overflow before the check
    if (total > kMaxTotalBytes) {
      return Error{describe(buffer, i) + ": the buffers up to here add up to more than 2^62 bytes, "
                   "more than any arena can hold"};
    }
    if (buffer.first_op >= buffer.end_op) {
      return Error{describe(buffer, i) + ": empty lifetime [" + std::to_string(buffer.first_op) +
                   ", " + std::to_string(buffer.end_op) + ")"};
    }
    if (buffer.fixed_offset) {
      const Offset offset = *buffer.fixed_offset;
      if (offset < 0 || offset > kMaxBytes) {
        return Error{describe(buffer, i) + ": fixed offset " + std::to_string(offset) +
                     " is out of range [0, 2^60]"};
      }
      if (offset % buffer.alignment != 0) {
        return Error{describe(buffer, i) + ": fixed offset " + std::to_string(offset) +
                     " is not a multiple of its alignment " + std::to_string(buffer.alignment)};
      }
      fixed.push_back(i);
    }
  }
  // Pinned buffers are few; a pairwise check keeps this obvious.
  for (std::size_t a = 0; a < fixed.size(); ++a) {
    for (std::size_t b = a + 1; b < fixed.size(); ++b) {
      const BufferSpec& x = problem.buffers[fixed[a]];
      const BufferSpec& y = problem.buffers[fixed[b]];
      if (!lifetimes_overlap(x, y) || x.size_bytes == 0 || y.size_bytes == 0) continue;
      const Offset x_lo = *x.fixed_offset, y_lo = *y.fixed_offset;
      if (x_lo < y_lo + footprint_bytes(y) && y_lo < x_lo + footprint_bytes(x)) {
        return Error{describe(x, fixed[a]) + " and " + describe(y, fixed[b]) +
                     " have fixed offsets that overlap while both are live"};
      }
    }
  }
  return Status::success();
}

Bytes packing_height(const AllocationProblem& problem, const std::vector<Offset>& offsets) {
  MEMPLAN_CHECK(offsets.size() == problem.buffers.size());
  Bytes height = 0;
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    const Bytes footprint = footprint_bytes(problem.buffers[i]);
    if (footprint > 0) height = std::max(height, offsets[i] + footprint);
  }
  return height;
}

}  // namespace memplan::planner
