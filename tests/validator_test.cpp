// planner/validator: each rule, on a packing built by hand to break exactly that rule.
#include <gtest/gtest.h>

#include <algorithm>

#include "memplan/common/rng.h"
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

// The sweep finds an overlap exactly when one exists: against every pair checked directly, on
// random packings (dense, so about half of them overlap somewhere) with touching ends and
// zero-size buffers.
TEST(Validator, AgreesWithEveryPairCheckedDirectly) {
  Rng rng(17);
  int overlapping = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    AllocationProblem p;
    std::vector<Offset> offsets;
    const int n = 1 + int(rng.below(12));
    for (int i = 0; i < n; ++i) {
      const TimePoint first = TimePoint(rng.below(10));
      p.buffers.push_back({"b" + std::to_string(i), Bytes(rng.below(6)), 1, first, first + 1 + TimePoint(rng.below(6)), std::nullopt});
      offsets.push_back(Offset(rng.below(24)));
    }
    bool clash = false;
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        const BufferSpec &a = p.buffers[std::size_t(i)], &b = p.buffers[std::size_t(j)];
        if (a.size_bytes == 0 || b.size_bytes == 0 || !lifetimes_overlap(a, b)) continue;
        clash = clash || (offsets[std::size_t(i)] < offsets[std::size_t(j)] + b.size_bytes &&
                          offsets[std::size_t(j)] < offsets[std::size_t(i)] + a.size_bytes);
      }
    }
    overlapping += clash;
    const Status status = validate_packing(p, offsets, packing_height(p, offsets));
    EXPECT_EQ(status.ok(), !clash) << "trial " << trial << (status.ok() ? "" : ": " + status.error().message);
  }
  EXPECT_GT(overlapping, 200);
  EXPECT_LT(overlapping, 1800);
}

}  // namespace
}  // namespace memplan::planner
