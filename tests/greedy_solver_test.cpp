// planner/greedy_solver: a few hand-worked placements, then every (order, placement) run on
// thousands of random problems, each packing checked by the independent validator.
#include <gtest/gtest.h>

#include <tuple>

#include "memplan/common/rng.h"
#include "memplan/planner/greedy_solver.h"
#include "memplan/planner/validator.h"

namespace memplan::planner {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr int kRandomProblems = 300;  // instrumented builds run the same checks, fewer times
#else
constexpr int kRandomProblems = 1500;
#endif

BufferSpec buffer(std::string id, Bytes size, TimePoint first, TimePoint end) {
  return BufferSpec{std::move(id), size, 1, first, end, std::nullopt};
}

// Three pinned buffers leave gaps [4, 10) and [14, 16) over the whole lifetime of "q".
AllocationProblem two_gaps() {
  AllocationProblem p;
  p.buffers = {buffer("f1", 4, 0, 10), buffer("f2", 4, 0, 10), buffer("f3", 4, 0, 10), buffer("q", 2, 0, 10)};
  p.buffers[0].fixed_offset = 0;
  p.buffers[1].fixed_offset = 10;
  p.buffers[2].fixed_offset = 16;
  return p;
}

TEST(GreedyPack, LowestOffsetTakesTheFirstGap) {
  const auto offsets = greedy_pack(two_gaps(), GreedyOrder::size, GreedyPlacement::lowest_offset);
  EXPECT_EQ(offsets, (std::vector<Offset>{0, 10, 16, 4}));
}

TEST(GreedyPack, BestFitTakesTheTightestGap) {
  const auto offsets = greedy_pack(two_gaps(), GreedyOrder::size, GreedyPlacement::best_fit);
  EXPECT_EQ(offsets, (std::vector<Offset>{0, 10, 16, 14}));
}

TEST(GreedyPack, AlignmentRoundsGapStartsUp) {
  AllocationProblem p;
  p.buffers = {buffer("a", 3, 0, 4), buffer("b", 8, 0, 4)};
  p.buffers[0].fixed_offset = 0;
  p.buffers[1].alignment = 8;
  const auto offsets = greedy_pack(p, GreedyOrder::size, GreedyPlacement::lowest_offset);
  EXPECT_EQ(offsets[1], 8);
}

TEST(SolveGreedy, ReachesTheLowerBoundOnMiniMallocExample) {
  AllocationProblem p;
  p.buffers = {buffer("b1", 4, 0, 3), buffer("b2", 4, 3, 9), buffer("b3", 4, 0, 9), buffer("b4", 4, 9, 21),
               buffer("b5", 4, 0, 21)};
  const Solution s = solve_greedy(p);
  EXPECT_EQ(s.height_bytes, 12);
  EXPECT_EQ(s.status, SolveStatus::optimal);
  EXPECT_TRUE(validate_solution(p, s).ok());
}

TEST(SolveGreedy, CapacityBelowItsHeightIsNotFound) {
  AllocationProblem p;
  p.buffers = {buffer("a", 4, 0, 2), buffer("b", 4, 1, 3)};
  p.capacity_bytes = 7;
  const Solution s = solve_greedy(p);
  EXPECT_EQ(s.status, SolveStatus::not_found);
  EXPECT_TRUE(s.offsets.empty());
  EXPECT_EQ(s.height_bytes, 8);  // the lowest height it reached, for messages
}

TEST(SolveGreedy, EmptyProblem) {
  const Solution s = solve_greedy(AllocationProblem{});
  EXPECT_EQ(s.status, SolveStatus::optimal);
  EXPECT_EQ(s.height_bytes, 0);
}

AllocationProblem random_problem(Rng& rng) {
  AllocationProblem p;
  const int n = 1 + int(rng.below(40));
  const TimePoint horizon = 2 + TimePoint(rng.below(30));
  for (int i = 0; i < n; ++i) {
    const TimePoint first = TimePoint(rng.below(std::uint64_t(horizon - 1)));
    const TimePoint end = first + 1 + TimePoint(rng.below(std::uint64_t(horizon - first)));
    BufferSpec b = buffer("b" + std::to_string(i), Bytes(rng.below(64)), first, end);
    if (rng.below(4) == 0) b.alignment = Bytes{1} << rng.below(5);
    p.buffers.push_back(b);
  }
  // One pinned buffer now and then, high enough to leave gaps below it.
  if (rng.below(5) == 0) {
    BufferSpec& b = p.buffers[0];
    b.fixed_offset = align_up(Offset(rng.below(100)), b.alignment);
  }
  return p;
}

class GreedyRuns : public ::testing::TestWithParam<std::tuple<GreedyOrder, GreedyPlacement>> {};

TEST_P(GreedyRuns, EveryRandomPackingValidates) {
  const auto [order, placement] = GetParam();
  Rng rng(42);
  for (int iteration = 0; iteration < kRandomProblems; ++iteration) {
    const AllocationProblem p = random_problem(rng);
    const std::vector<Offset> offsets = greedy_pack(p, order, placement);
    const Bytes height = packing_height(p, offsets);
    const Status valid = validate_packing(p, offsets, height);
    ASSERT_TRUE(valid.ok()) << "iteration " << iteration << ": " << valid.error().message;
    ASSERT_GE(height, lower_bound_bytes(p)) << "iteration " << iteration;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllRuns, GreedyRuns,
    ::testing::Combine(::testing::Values(GreedyOrder::size, GreedyOrder::lifetime, GreedyOrder::area,
                                         GreedyOrder::conflicts),
                       ::testing::Values(GreedyPlacement::best_fit, GreedyPlacement::lowest_offset)),
    [](const auto& param_info) {
      return std::string(to_string(std::get<0>(param_info.param))) + "_" + std::string(to_string(std::get<1>(param_info.param)));
    });

TEST(SolveGreedy, PortfolioIsNoWorseThanAnyRun) {
  Rng rng(7);
  for (int iteration = 0; iteration < kRandomProblems / 5; ++iteration) {
    const AllocationProblem p = random_problem(rng);
    const Solution best = solve_greedy(p);
    ASSERT_TRUE(validate_solution(p, best).ok());
    const Bytes one = packing_height(p, greedy_pack(p, GreedyOrder::lifetime, GreedyPlacement::best_fit));
    ASSERT_LE(best.height_bytes, one) << "iteration " << iteration;
  }
}

}  // namespace
}  // namespace memplan::planner

namespace memplan::planner {
namespace {

// Large problems' answers are kept for an equal problem planned again (fit plans a step several
// times): the same problem gets the same packing, and a problem that differs in one buffer's
// geometry is packed afresh, never given the kept answer (which would not be valid for it).
TEST(SolveGreedy, AnEqualLargeProblemGetsTheSameAnswerAndAChangedOneItsOwn) {
  AllocationProblem p;
  for (int i = 0; i < 3000; ++i) {
    const TimePoint first = i % 97;
    p.buffers.push_back(buffer("b" + std::to_string(i), 64 + (i * 37) % 512, first, first + 1 + (i * 13) % 40));
  }
  const Solution a = solve_greedy(p);
  const Solution again = solve_greedy(p);
  EXPECT_EQ(again.offsets, a.offsets);
  EXPECT_EQ(again.height_bytes, a.height_bytes);
  for (int changed : {0, 1500, 2999}) {
    AllocationProblem q = p;
    q.buffers[static_cast<std::size_t>(changed)].end_op += 60;  // live beside more buffers
    const Solution b = solve_greedy(q);
    EXPECT_TRUE(validate_solution(q, b).ok()) << "buffer " << changed << ": " << validate_solution(q, b).error().message;
    AllocationProblem r = p;
    r.buffers[static_cast<std::size_t>(changed)].size_bytes *= 8;
    EXPECT_TRUE(validate_solution(r, solve_greedy(r)).ok()) << "buffer " << changed;
  }
}

}  // namespace
}  // namespace memplan::planner
