#include "memplan/planner/validator.h"

#include <algorithm>
#include <numeric>
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
  // Pairs whose lifetimes overlap, found by scanning in order of first_op: every pair is
  // still examined directly, but pairs that are never live together are skipped cheaply.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return problem.buffers[a].first_op < problem.buffers[b].first_op;
  });
  for (std::size_t x = 0; x < n; ++x) {
    const std::size_t i = order[x];
    const BufferSpec& a = problem.buffers[i];
    if (a.size_bytes == 0) continue;
    for (std::size_t y = x + 1; y < n; ++y) {
      const std::size_t j = order[y];
      const BufferSpec& b = problem.buffers[j];
      if (b.first_op >= a.end_op) break;  // sorted: no later buffer is live together with a
      if (b.size_bytes == 0) continue;
      const Offset a_end = offsets[i] + a.size_bytes;
      const Offset b_end = offsets[j] + b.size_bytes;
      if (offsets[i] < b_end && offsets[j] < a_end) {
        const std::size_t first = std::min(i, j), second = std::max(i, j);
        return Error{name(problem, first) + " at " + range(offsets[first], offsets[first] + problem.buffers[first].size_bytes) +
                     " and " + name(problem, second) + " at " +
                     range(offsets[second], offsets[second] + problem.buffers[second].size_bytes) +
                     " overlap in memory while both are live (times " +
                     range(std::max(a.first_op, b.first_op), std::min(a.end_op, b.end_op)) + ")"};
      }
    }
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
