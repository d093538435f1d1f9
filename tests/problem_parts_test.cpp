// planner/problem_parts and the solvers on parts: where a problem is cut (floors, times no
// buffer crosses), that lower bounds and heights compose, that copies are solved once, that
// answers on parts equal brute force on the pieces, and that the solvers say why they stopped.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "memplan/common/rng.h"
#include "memplan/planner/exact_solver.h"
#include "memplan/planner/greedy_solver.h"
#include "memplan/planner/problem_parts.h"
#include "memplan/planner/validator.h"
#include "solver_test_problems.h"

namespace memplan::planner {
namespace {

BufferSpec buffer(Bytes size, TimePoint first, TimePoint end, Bytes alignment = 1) {
  return {"b", size, alignment, first, end, std::nullopt};
}

ExactSolverOptions node_budget(std::int64_t nodes) {
  ExactSolverOptions options;
  options.time_limit_s = 0;
  options.node_limit = nodes;
  return options;
}

TEST(ProblemParts, FloorsAreStackedAndTheRestCutWhereNoBufferCrosses) {
  AllocationProblem p;
  p.buffers = {buffer(8, 0, 10),                    // spans everything: floor
               buffer(4, 0, 3), buffer(2, 1, 4),    // part [0, 4)
               buffer(6, 4, 6),                     // part [4, 6)
               buffer(3, 6, 10), buffer(5, 7, 10),  // part [6, 10): its own floor is none
               buffer(0, 2, 8)};                    // zero size: in no part
  const ProblemParts parts = split_problem(p);
  // Below buffer 0, the pieces [0, 4), [4, 6) and [6, 10); a buffer spanning its piece floors
  // it: 3 alone, 4 and then 5 (which spans what is left of [6, 10) once 4 is out).
  using Placed = std::pair<std::size_t, Offset>;
  EXPECT_EQ(parts.floor, (std::vector<Placed>{{0, 0}, {3, 8}, {4, 8}, {5, 11}}));
  ASSERT_EQ(parts.leaves.size(), 1u);
  EXPECT_EQ(parts.leaves[0].buffers, (std::vector<std::size_t>{1, 2}));
  EXPECT_EQ(parts.leaves[0].base, 8);
  // The lower bound composes: the floors under a part + the highest part's own bound.
  Bytes composed = 0;
  for (const auto& [b, offset] : parts.floor) composed = std::max(composed, offset + footprint_bytes(p.buffers[b]));
  for (const ProblemLeaf& leaf : parts.leaves) composed = std::max(composed, leaf.base + lower_bound_bytes(leaf_problem(p, leaf)));
  EXPECT_EQ(composed, lower_bound_bytes(p));
  const Solution s = solve_exact(p);
  EXPECT_EQ(s.height_bytes, lower_bound_bytes(p));
  EXPECT_TRUE(validate_solution(p, s).ok());
}

TEST(ProblemParts, AFloorThatWouldMisalignThePartsAboveIsNotCut) {
  AllocationProblem p;
  p.buffers = {buffer(3, 0, 10), buffer(8, 0, 4, 8), buffer(8, 5, 10, 8)};
  const ProblemParts parts = split_problem(p);
  EXPECT_TRUE(parts.floor.empty());
  EXPECT_FALSE(parts.decomposed());
  p.buffers[0].size_bytes = 16;  // a multiple of every alignment: cut, and the two pieces
  const ProblemParts cut = split_problem(p);  // under it are one buffer each: floors too
  using Placed = std::pair<std::size_t, Offset>;
  EXPECT_EQ(cut.floor, (std::vector<Placed>{{0, 0}, {1, 16}, {2, 16}}));
  EXPECT_TRUE(cut.leaves.empty());
}

// Nested lifetimes peel one floor per level, 200,000 levels: a work list, not recursion.
TEST(ProblemParts, DeeplyNestedLifetimesSplitWithoutRecursion) {
  constexpr int kBuffers = 200'000;
  AllocationProblem p;
  for (int i = 0; i < kBuffers; ++i) p.buffers.push_back(buffer(1 + i % 7, i, 2 * kBuffers - i));
  const ProblemParts parts = split_problem(p);
  EXPECT_EQ(parts.floor.size(), std::size_t(kBuffers));
  EXPECT_TRUE(parts.leaves.empty());
  const Solution s = solve_exact(p);
  ASSERT_EQ(s.status, SolveStatus::optimal);
  EXPECT_EQ(s.height_bytes, lower_bound_bytes(p));
  // Every pair is live together, so a packing is valid when the [offset, offset + size) ranges
  // are disjoint: sorted by offset, each ends before the next begins (the validator would check
  // all 2 * 10^10 pairs).
  std::vector<std::size_t> by_offset(p.buffers.size());
  std::iota(by_offset.begin(), by_offset.end(), 0);
  std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) { return s.offsets[a] < s.offsets[b]; });
  for (std::size_t k = 1; k < by_offset.size(); ++k) {
    ASSERT_LE(s.offsets[by_offset[k - 1]] + p.buffers[by_offset[k - 1]].size_bytes, s.offsets[by_offset[k]]) << k;
  }
}


AllocationProblem repeated(const AllocationProblem& step, int copies, int shared) {
  TimePoint span = 0;
  for (const BufferSpec& b : step.buffers) span = std::max(span, b.end_op);
  AllocationProblem p;
  for (int c = 0; c < copies; ++c) {
    for (BufferSpec b : step.buffers) {
      b.first_op += c * span;
      b.end_op += c * span;
      p.buffers.push_back(b);
    }
  }
  for (int k = 0; k < shared; ++k) p.buffers.push_back(buffer(4096 * (k + 1), 0, copies * span));
  return p;
}

// Copies of one step shifted in time, under buffers alive across all of them: one distinct
// part, solved once, and the whole packs exactly as one copy on the same floor does.
TEST(ProblemParts, CopiesOfAStepAreSolvedOnceAndPackAsOneCopy) {
  const AllocationProblem step = trace_like(11, 40);
  const AllocationProblem one = repeated(step, 1, 3);
  const AllocationProblem many = repeated(step, 50, 3);
  ExactSolverStats one_stats, many_stats;
  const Solution a = solve_exact(one, node_budget(200'000), &one_stats);
  const Solution b = solve_exact(many, node_budget(200'000), &many_stats);
  ASSERT_TRUE(a.has_packing() && b.has_packing());
  EXPECT_TRUE(validate_solution(many, b).ok());
  EXPECT_EQ(b.height_bytes, a.height_bytes);
  EXPECT_EQ(lower_bound_bytes(many), lower_bound_bytes(one));
  EXPECT_EQ(many_stats.parts, 50);
  EXPECT_EQ(many_stats.distinct_parts, 1);
  EXPECT_EQ(many_stats.floor_buffers, 3);
  EXPECT_EQ(b.status, a.status);
  // The greedy portfolio on parts too.
  const Solution g = solve_greedy(many);
  EXPECT_TRUE(validate_solution(many, g).ok());
  EXPECT_EQ(g.height_bytes, solve_greedy(one).height_bytes);
}

// The optimum of the whole is the floor plus the highest piece's optimum, each piece's by brute
// force (solver_test_problems.h): the solver on parts must reach exactly that, on random pieces
// glued in time under a random floor.

TEST(ProblemParts, SolvingByPartsEqualsBruteForceOnEachPiece) {
  Rng rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    AllocationProblem whole;
    Bytes floor = 0;
    const int floors = int(rng.below(3));
    for (int f = 0; f < floors; ++f) {
      const Bytes size = 1 + Bytes(rng.below(9));
      floor += size;
      whole.buffers.push_back(buffer(size, 0, 30));
    }
    Bytes highest = 0;
    for (int piece = 0; piece < 3; ++piece) {
      AllocationProblem part;
      const int n = 2 + int(rng.below(5));
      for (int i = 0; i < n; ++i) {
        const TimePoint first = TimePoint(rng.below(8));
        part.buffers.push_back(buffer(1 + Bytes(rng.below(12)), first, first + 1 + TimePoint(rng.below(9 - first))));
      }
      // Piece k lives in [10k, 10k + 10): shifted so none crosses into the next.
      for (BufferSpec b : part.buffers) {
        b.first_op += 10 * piece;
        b.end_op = std::min<TimePoint>(b.end_op + 10 * piece, 10 * piece + 10);
        whole.buffers.push_back(b);
      }
      AllocationProblem shifted;
      for (std::size_t k = whole.buffers.size() - part.buffers.size(); k < whole.buffers.size(); ++k) shifted.buffers.push_back(whole.buffers[k]);
      highest = std::max(highest, brute_force_height(shifted));
    }
    ExactSolverStats stats;
    const Solution s = solve_exact(whole, node_budget(100'000), &stats);
    ASSERT_TRUE(s.has_packing());
    EXPECT_TRUE(validate_solution(whole, s).ok()) << "trial " << trial;
    EXPECT_EQ(s.height_bytes, floor + highest) << "trial " << trial;
    EXPECT_EQ(s.status, SolveStatus::optimal) << "trial " << trial << ": stopped " << stats.stopped;
    // With the capacity one byte under the optimum, no packing exists, and the solver proves it.
    AllocationProblem tight = whole;
    tight.capacity_bytes = floor + highest - 1;
    ExactSolverStats tight_stats;
    const Solution none = solve_exact(tight, node_budget(100'000), &tight_stats);
    EXPECT_EQ(none.status, SolveStatus::not_found) << "trial " << trial;
    EXPECT_STREQ(tight_stats.stopped, "proof") << "trial " << trial;
  }
}

// Why the solver stopped is what happened: a node budget is "node limit", a wall-clock budget
// "time limit", a part too dense to search "conflict limit"; never a time limit it did not hit.
TEST(ProblemParts, TheSolverSaysWhyItStopped) {
  // Steps whose greedy packing misses the lower bound, so the bound needs the search.
  AllocationProblem p;
  for (std::uint64_t seed = 1; seed < 200 && p.buffers.empty(); ++seed) {
    AllocationProblem candidate = repeated(trace_like(seed, 60), 4, 0);
    if (solve_greedy(candidate).height_bytes > lower_bound_bytes(candidate)) p = candidate;
  }
  ASSERT_FALSE(p.buffers.empty()) << "no step among 200 seeds where greedy misses the bound";
  AllocationProblem at_bound = p;
  at_bound.capacity_bytes = lower_bound_bytes(p);
  ExactSolverStats stats;
  const Solution few = solve_exact(at_bound, node_budget(1), &stats);
  EXPECT_FALSE(few.has_packing());
  EXPECT_EQ(few.status, SolveStatus::timed_out);
  EXPECT_STREQ(stats.stopped, "node limit");

  ExactSolverOptions dense = node_budget(1'000'000);
  dense.max_conflict_pairs = 10;
  ExactSolverStats dense_stats;
  const Solution skipped = solve_exact(at_bound, dense, &dense_stats);
  EXPECT_FALSE(skipped.has_packing());
  EXPECT_EQ(skipped.status, SolveStatus::timed_out);
  EXPECT_STREQ(dense_stats.stopped, "conflict limit");

  ExactSolverOptions clock;
  clock.time_limit_s = 1e-9;
  ExactSolverStats clock_stats;
  const Solution late = solve_exact(at_bound, clock, &clock_stats);
  if (!late.has_packing()) {
    EXPECT_STREQ(clock_stats.stopped, "time limit");
  }
  // Given the nodes, the bound is reached (or refuted) and the reason says so.
  ExactSolverStats enough_stats;
  const Solution enough = solve_exact(at_bound, node_budget(5'000'000), &enough_stats);
  if (enough.has_packing()) {
    EXPECT_STREQ(enough_stats.stopped, "bound");
  } else {
    EXPECT_STREQ(enough_stats.stopped, "proof");
  }
}

}  // namespace
}  // namespace memplan::planner
