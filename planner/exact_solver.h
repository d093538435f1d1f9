// Exact offset assignment by depth-first search over canonical packings, in the spirit of
// MiniMalloc (Moffitt, ASPLOS 2023): each buffer sits at the lowest offset the buffers placed
// before it allow, buffers are placed in order of offset, and the search prunes with
// per-section floors, dominance and decomposition. It is not a heuristic: with no budget hit,
// its answers are proofs. Large problems fall back to the greedy portfolio (greedy_solver.h).
// A target height that every occupied section fills exactly (zero slack) goes to a narrower
// complete search instead: valleys of the placed profile filled from their ends, independent
// time ranges solved apart, refuted states remembered across restarts. Taking turns with it, a
// band decomposition looks for a packing cut recursively in time and offset (guillotine), which
// it finds far faster when one exists.
#pragma once

#include <cstdint>

#include "memplan/planner/allocation_problem.h"

namespace memplan::planner {

struct ExactSolverOptions {
  double time_limit_s = 10.0;     // wall clock for the whole solve; <= 0 means no limit
  std::int64_t node_limit = -1;   // search nodes over the whole solve; < 0 means no limit
  // Above this many buffer pairs live together (in one part, see below) the search's conflict
  // lists would not fit comfortably in memory; that part then keeps its greedy packing.
  std::int64_t max_conflict_pairs = 20'000'000;
  // Zero-waste targets try the band decomposition (guillotine packings) in turns with the
  // zero-waste search; off only to exercise that search alone.
  bool band_search = true;
};

struct ExactSolverStats {
  std::int64_t nodes = 0;        // search nodes visited
  std::int64_t attempts = 0;     // feasibility searches run (target heights x orderings)
  Bytes greedy_height_bytes = 0; // the seed
  bool searched = false;         // false when greedy already met the lower bound (or fallback)
  std::int64_t backtracks = 0;   // search nodes whose every branch failed
  bool zero_waste = false;       // some target was searched by the zero-waste search
  bool bands = false;            // the band decomposition found the packing
  double greedy_ms = 0;          // time per phase: the greedy portfolio,
  double setup_ms = 0;           //   building the search's instance,
  double search_ms = 0;          //   and the search itself
  // What settled the answer: "greedy" (its packing met the lower bound), "search" (the search
  // met the lower bound), "exhausted" (the search proved nothing lower exists: a complete
  // search ran out of placements), "none" (not proven: a budget ran out or the search was
  // skipped), "capacity" (with a capacity: the lower bound exceeds it, or the search proved no
  // packing fits).
  const char* proof = "none";
  // Why the search stopped: "bound" (an answer at the lower bound), "proof" (an answer proven
  // otherwise: exhausted, or no packing within the capacity), "time limit", "node limit", or
  // "conflict limit" (a part had more than max_conflict_pairs pairs and was not searched).
  const char* stopped = "bound";
  // The problem cut apart (planner/problem_parts.h): leaves solved apart, how many distinct
  // (the rest are copies shifted in time, packed alike), and buffers stacked in floors.
  std::int64_t parts = 1;
  std::int64_t distinct_parts = 1;
  std::int64_t floor_buffers = 0;
};

// Problems without fixed buffers are first cut into parts (planner/problem_parts.h): each
// distinct part is packed by the greedy portfolio, and only the parts that keep the whole above
// its lower bound (or the capacity) are searched, each with a share of the time and nodes left.
// The search recurses once per placed buffer, on a thread whose stack is sized from the buffer
// count (2 KiB a buffer, 16 KiB under the sanitizers; address space, touched only as deep as the
// search goes), so memory bounds the buffers, not a thread's default stack.
//
// With a capacity: a packing within it (stops at the first one found; optimal if it meets the
// lower bound), not_found when the search proves none exists, timed_out when the budget runs
// out first. Without: the lowest height it can find, seeded with the greedy height and
// stopping at the lower bound; optimal when proven, feasible otherwise.
// The problem must pass check_problem().
Solution solve_exact(const AllocationProblem& problem, const ExactSolverOptions& options = {},
                     ExactSolverStats* stats = nullptr);

}  // namespace memplan::planner
