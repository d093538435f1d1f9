// planner/allocation_problem: the lower bound (hand-worked) and the input checks.
#include <gtest/gtest.h>

#include "memplan/planner/allocation_problem.h"

namespace memplan::planner {
namespace {

BufferSpec buffer(std::string id, Bytes size, TimePoint first, TimePoint end, Bytes alignment = 1) {
  return BufferSpec{std::move(id), size, alignment, first, end, std::nullopt};
}

TEST(LowerBound, EmptyProblemIsZero) { EXPECT_EQ(lower_bound_bytes(AllocationProblem{}), 0); }

TEST(LowerBound, PeakOfLiveSums) {
  AllocationProblem p;
  p.buffers = {buffer("a", 4, 0, 3), buffer("b", 4, 3, 9), buffer("c", 4, 0, 9), buffer("d", 4, 9, 21),
               buffer("e", 4, 0, 21)};
  EXPECT_EQ(lower_bound_bytes(p), 12);  // MiniMalloc's README example
}

TEST(LowerBound, HalfOpenLifetimesDoNotTouch) {
  AllocationProblem p;
  p.buffers = {buffer("a", 10, 0, 5), buffer("b", 7, 5, 8)};
  EXPECT_EQ(lower_bound_bytes(p), 10);
  p.buffers[1].first_op = 4;  // now they share op 4
  EXPECT_EQ(lower_bound_bytes(p), 17);
}

TEST(LowerBound, UsesAlignedFootprints) {
  AllocationProblem p;
  p.buffers = {buffer("a", 10, 0, 2, 8), buffer("b", 3, 1, 3, 4)};
  EXPECT_EQ(footprint_bytes(p.buffers[0]), 16);
  EXPECT_EQ(lower_bound_bytes(p), 16 + 4);
}

TEST(LowerBound, CountsFixedBufferTops) {
  AllocationProblem p;
  p.buffers = {buffer("a", 8, 0, 2)};
  p.buffers[0].fixed_offset = 100;
  EXPECT_EQ(lower_bound_bytes(p), 108);
}

TEST(CheckProblem, AcceptsValidProblem) {
  AllocationProblem p;
  p.buffers = {buffer("a", 8, 0, 2, 8), buffer("z", 0, 1, 2)};
  p.capacity_bytes = 64;
  EXPECT_TRUE(check_problem(p).ok());
}

TEST(CheckProblem, RejectsEachBadField) {
  auto message = [](AllocationProblem p) {
    const Status s = check_problem(p);
    return s.ok() ? std::string("ok") : s.error().message;
  };
  AllocationProblem p;
  p.buffers = {buffer("a", -1, 0, 2)};
  EXPECT_NE(message(p).find("size"), std::string::npos);
  p.buffers = {buffer("a", 4, 2, 2)};
  EXPECT_NE(message(p).find("empty lifetime"), std::string::npos);
  p.buffers = {buffer("a", 4, 0, 2, 0)};
  EXPECT_NE(message(p).find("alignment"), std::string::npos);
  p.buffers = {buffer("a", 4, 0, 2, 8)};
  p.buffers[0].fixed_offset = 4;
  EXPECT_NE(message(p).find("not a multiple"), std::string::npos);
  p.buffers = {buffer("a", 4, 0, 2), buffer("b", 4, 1, 3)};
  p.buffers[0].fixed_offset = 0;
  p.buffers[1].fixed_offset = 2;
  EXPECT_NE(message(p).find("overlap"), std::string::npos);
  EXPECT_NE(message(p).find("'b'"), std::string::npos);
  p.buffers = {buffer("a", 4, 0, 2)};
  p.capacity_bytes = -5;
  EXPECT_NE(message(p).find("capacity"), std::string::npos);
}

// Found by fuzzing (fuzz/corpus/solver/regress-lower-bound-overflow): buffers of legal size whose
// sum overflowed 64 bits in the lower bound. Four of 2^60 fit the limit; a fifth byte does not.
TEST(CheckProblem, RejectsBuffersWhoseTotalOverflowsHeights) {
  AllocationProblem p;
  for (int i = 0; i < 4; ++i) p.buffers.push_back(buffer("b" + std::to_string(i), Bytes{1} << 60, 0, 2));
  ASSERT_TRUE(check_problem(p).ok());
  EXPECT_EQ(lower_bound_bytes(p), Bytes{1} << 62);
  p.buffers.push_back(buffer("last", 1, 5, 6));
  const Status s = check_problem(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("'last'"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("2^62"), std::string::npos) << s.error().message;
}

TEST(SolveStatus, Names) {
  EXPECT_EQ(to_string(SolveStatus::optimal), "optimal");
  EXPECT_EQ(to_string(SolveStatus::feasible), "feasible");
  EXPECT_EQ(to_string(SolveStatus::not_found), "not_found");
  EXPECT_EQ(to_string(SolveStatus::timed_out), "timed_out");
}

}  // namespace
}  // namespace memplan::planner
