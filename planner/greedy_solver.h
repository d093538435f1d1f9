// Fast heuristic offset assignment: a small portfolio of greedy runs (buffer orderings x
// gap-choice rules), keeping the lowest packing. Each run is O(n log n + P log P) where P is
// the number of buffer pairs live together; no search, no optimality proof (see
// exact_solver.h for that).
#pragma once

#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

#include "memplan/planner/allocation_problem.h"

namespace memplan::planner {

// The order in which buffers are placed: largest first by the named key (ties by index).
enum class GreedyOrder { size, lifetime, area, conflicts };
// Where a buffer goes among the gaps left by already-placed buffers live at the same time.
//   best_fit: the smallest gap that holds it (else on top); lowest_offset: the first such gap.
enum class GreedyPlacement { best_fit, lowest_offset };

std::string_view to_string(GreedyOrder order);
std::string_view to_string(GreedyPlacement placement);

struct GreedyOptions {
  std::vector<GreedyOrder> orders = {GreedyOrder::size, GreedyOrder::lifetime, GreedyOrder::area,
                                     GreedyOrder::conflicts};
  std::vector<GreedyPlacement> placements = {GreedyPlacement::best_fit,
                                             GreedyPlacement::lowest_offset};
  // No new run starts after this (the first always runs): a wall-clock budget asked for by
  // the caller. Without one the portfolio is deterministic.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// One greedy run: an offset for every buffer (fixed buffers keep theirs; zero-size buffers
// get 0 unless fixed). Ignores the capacity. The problem must pass check_problem(). With a
// deadline, a run still going when it passes stops and returns no offsets.
std::vector<Offset> greedy_pack(const AllocationProblem& problem, GreedyOrder order, GreedyPlacement placement,
                                std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

// The best of all (order, placement) runs in `options`, every order with the first placement
// rule before any with the next (the first rule is the stronger one). A problem without fixed
// buffers is first cut into parts (planner/problem_parts.h), each distinct part packed alone. Status: optimal when the height
// equals the lower bound, feasible when within the capacity (or there is none), otherwise
// not_found with no offsets and height_bytes set to the lowest height the greedy runs reached.
Solution solve_greedy(const AllocationProblem& problem, const GreedyOptions& options = {});

}  // namespace memplan::planner
