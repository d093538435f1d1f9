#include "memplan/planner/validator.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <string>

namespace memplan::planner {

namespace {

std::string name(const AllocationProblem& problem, std::size_t i) {
  return "buffer '" + problem.buffers[i].id + "' (#" + std::to_string(i) + ")";
}

std::string range(Offset lo, Offset hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + ")";
}

}  // namespace

Status validate_packing(const AllocationProblem& problem, const std::vector<Offset>& offsets,
                        Bytes height_bytes) {
  const std::size_t n = problem.buffers.size();
  if (offsets.size() != n) {
    return Error{"packing has " + std::to_string(offsets.size()) + " offsets for " +
                 std::to_string(n) + " buffers"};
  }
  for (std::size_t i = 0; i < n; ++i) {
    const BufferSpec& buffer = problem.buffers[i];
    const Offset offset = offsets[i];
    if (offset < 0) return Error{name(problem, i) + " has negative offset " + std::to_string(offset)};
    if (buffer.alignment < 1 || offset % buffer.alignment != 0) {
      return Error{name(problem, i) + " is misaligned: offset " + std::to_string(offset) +
                   " is not a multiple of " + std::to_string(buffer.alignment)};
    }
    if (buffer.fixed_offset && *buffer.fixed_offset != offset) {
      return Error{name(problem, i) + " must be at fixed offset " +
                   std::to_string(*buffer.fixed_offset) + " but is at " + std::to_string(offset)};
    }
    if (buffer.size_bytes > 0 && offset + buffer.size_bytes > height_bytes) {
      return Error{name(problem, i) + " ends at " + std::to_string(offset + buffer.size_bytes) +
                   ", above the arena height " + std::to_string(height_bytes)};
    }
  }
  if (problem.capacity_bytes && height_bytes > *problem.capacity_bytes) {
    return Error{"arena height " + std::to_string(height_bytes) + " exceeds the capacity " +
                 std::to_string(*problem.capacity_bytes)};
  }
  // A sweep over time keeping the live buffers ordered by offset. While no two live buffers
  // overlap, a new one overlaps some live buffer exactly when it overlaps its neighbour below or
  // above in that order, so each buffer costs O(log n): long recordings (300,000 buffers, some
  // live across all of them) would otherwise mean billions of pairs. Ends come before starts at
  // the same time (lifetimes are half-open).
  struct Event {
    TimePoint time;
    bool start;
    std::size_t buffer;
  };
  std::vector<Event> events;
  for (std::size_t i = 0; i < n; ++i) {
    if (problem.buffers[i].size_bytes == 0) continue;
    events.push_back({problem.buffers[i].first_op, true, i});
    events.push_back({problem.buffers[i].end_op, false, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.time != b.time) return a.time < b.time;
    if (a.start != b.start) return !a.start;
    return a.buffer < b.buffer;
  });
  std::map<Offset, std::size_t> live;  // offset -> buffer
  auto overlap = [&](std::size_t i, std::size_t j) -> Status {
    const BufferSpec &a = problem.buffers[i], &b = problem.buffers[j];
    const std::size_t first = std::min(i, j), second = std::max(i, j);
    return Error{name(problem, first) + " at " + range(offsets[first], offsets[first] + problem.buffers[first].size_bytes) +
                 " and " + name(problem, second) + " at " +
                 range(offsets[second], offsets[second] + problem.buffers[second].size_bytes) +
                 " overlap in memory while both are live (times " +
                 range(std::max(a.first_op, b.first_op), std::min(a.end_op, b.end_op)) + ")"};
  };
  for (const Event& e : events) {
    const Offset lo = offsets[e.buffer], hi = lo + problem.buffers[e.buffer].size_bytes;
    if (!e.start) {
      live.erase(lo);
      continue;
    }
    auto above = live.lower_bound(lo);
    if (above != live.end() && above->first < hi) return overlap(e.buffer, above->second);
    if (above != live.begin()) {
      const std::size_t below = std::prev(above)->second;
      if (offsets[below] + problem.buffers[below].size_bytes > lo) return overlap(e.buffer, below);
    }
    live.emplace(lo, e.buffer);
  }
  return Status::success();
}

Status validate_solution(const AllocationProblem& problem, const Solution& solution) {
  if (!solution.has_packing()) {
    return Error{"solution has no packing (status " + std::string(to_string(solution.status)) + ")"};
  }
  return validate_packing(problem, solution.offsets, solution.height_bytes);
}

}  // namespace memplan::planner
