// planner/validator: each rule, on a packing built by hand to break exactly that rule.
#include <gtest/gtest.h>

#include "memplan/planner/validator.h"

namespace memplan::planner {
namespace {

AllocationProblem two_buffers() {
  AllocationProblem p;
  p.buffers = {BufferSpec{"act", 16, 8, 0, 4, std::nullopt}, BufferSpec{"grad", 8, 8, 2, 6, std::nullopt}};
  return p;
}

std::string error_of(const Status& s) { return s.ok() ? "ok" : s.error().message; }

TEST(Validator, AcceptsValidPacking) {
  EXPECT_EQ(error_of(validate_packing(two_buffers(), {0, 16}, 24)), "ok");
  // Not live together: the same bytes may be reused.
  AllocationProblem p = two_buffers();
  p.buffers[1].first_op = 4;
  EXPECT_EQ(error_of(validate_packing(p, {0, 0}, 16)), "ok");
}

TEST(Validator, NamesBothBuffersOfAnOverlap) {
  const std::string e = error_of(validate_packing(two_buffers(), {0, 8}, 24));
  EXPECT_NE(e.find("'act'"), std::string::npos) << e;
  EXPECT_NE(e.find("'grad'"), std::string::npos) << e;
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 16)"), std::string::npos) << e;
  EXPECT_NE(e.find("times [2, 4)"), std::string::npos) << e;
}

TEST(Validator, Misalignment) {
  const std::string e = error_of(validate_packing(two_buffers(), {0, 20}, 28));
  EXPECT_NE(e.find("misaligned"), std::string::npos) << e;
  EXPECT_NE(e.find("'grad'"), std::string::npos) << e;
}

TEST(Validator, FixedOffsetNotRespected) {
  AllocationProblem p = two_buffers();
  p.buffers[1].fixed_offset = 32;
  const std::string e = error_of(validate_packing(p, {0, 16}, 24));
  EXPECT_NE(e.find("fixed offset 32"), std::string::npos) << e;
}

TEST(Validator, HeightBelowABuffersEnd) {
  const std::string e = error_of(validate_packing(two_buffers(), {0, 16}, 23));
  EXPECT_NE(e.find("above the arena height 23"), std::string::npos) << e;
}

TEST(Validator, CapacityExceeded) {
  AllocationProblem p = two_buffers();
  p.capacity_bytes = 20;
  const std::string e = error_of(validate_packing(p, {0, 16}, 24));
  EXPECT_NE(e.find("exceeds the capacity 20"), std::string::npos) << e;
}

TEST(Validator, NegativeOffsetAndWrongCount) {
  EXPECT_NE(error_of(validate_packing(two_buffers(), {-8, 16}, 24)).find("negative"), std::string::npos);
  EXPECT_NE(error_of(validate_packing(two_buffers(), {0}, 24)).find("1 offsets for 2 buffers"), std::string::npos);
}

TEST(Validator, ZeroSizeBuffersConflictWithNothing) {
  AllocationProblem p = two_buffers();
  p.buffers.push_back(BufferSpec{"empty", 0, 1, 0, 6, std::nullopt});
  EXPECT_EQ(error_of(validate_packing(p, {0, 16, 4}, 24)), "ok");
}

TEST(Validator, SolutionWithoutPackingIsAnError) {
  Solution s;
  s.status = SolveStatus::timed_out;
  EXPECT_NE(error_of(validate_solution(two_buffers(), s)).find("timed_out"), std::string::npos);
}

}  // namespace
}  // namespace memplan::planner
