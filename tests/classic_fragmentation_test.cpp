// The failure memplan exists for, worked by hand: fifteen 4 MiB tensors fill three 20 MiB
// segments of a 60 MiB device; every other one is freed (28 MiB free in total, but in 4 MiB
// holes); a 12 MiB request then finds no block, no free device memory and no fully free segment
// to release, so the caching allocator runs out of memory with "reserved but unallocated" in
// its message. The static planner, given the same tensors and lifetimes and the same 60 MiB,
// packs them with room to spare.
#include <gtest/gtest.h>

#include "memplan/planner/exact_solver.h"
#include "memplan/planner/validator.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/simulated_device.h"

namespace memplan {
namespace {

constexpr Bytes kMiB = Bytes{1} << 20;
constexpr Bytes kCapacity = 60 * kMiB;

TEST(ClassicFragmentation, CachingAllocatorRunsOutWhereThePlanFits) {
  // --- dynamic: the caching allocator over a 60 MiB device ---
  runtime::SimulatedDevice device(kCapacity);
  runtime::CachingAllocator allocator(device);
  std::vector<void*> small;
  for (int i = 0; i < 15; ++i) {
    auto p = allocator.allocate(4 * kMiB);
    ASSERT_TRUE(p.ok()) << "allocation " << i << ": " << p.error().message;
    small.push_back(p.value());
  }
  EXPECT_EQ(allocator.stats().reserved_bytes[0].current, 60 * kMiB);  // three 20 MiB segments
  for (int i = 1; i < 15; i += 2) allocator.free(small[static_cast<std::size_t>(i)]);
  const Bytes free_in_cache = allocator.stats().reserved_bytes[0].current - allocator.stats().allocated_bytes[0].current;
  EXPECT_EQ(free_in_cache, 28 * kMiB);
  auto big = allocator.allocate(12 * kMiB);
  ASSERT_FALSE(big.ok()) << "12 MiB fits in none of the 4 MiB holes and the device is full";
  EXPECT_NE(big.error().message.find("reserved by PyTorch but unallocated"), std::string::npos) << big.error().message;
  EXPECT_EQ(allocator.stats().num_ooms, 1);

  // --- static: the same tensors and lifetimes, packed by the planner within 60 MiB ---
  planner::AllocationProblem problem;
  problem.capacity_bytes = kCapacity;
  for (int i = 0; i < 15; ++i) {
    const bool freed = i % 2 == 1;
    problem.buffers.push_back({"t" + std::to_string(i), 4 * kMiB, 512, i, freed ? 15 : 17, std::nullopt});
  }
  problem.buffers.push_back({"big", 12 * kMiB, 512, 16, 17, std::nullopt});
  const planner::Solution solution = planner::solve_exact(problem);
  ASSERT_TRUE(solution.has_packing()) << planner::to_string(solution.status);
  ASSERT_TRUE(planner::validate_solution(problem, solution).ok());
  EXPECT_LE(solution.height_bytes, kCapacity);
  EXPECT_EQ(solution.height_bytes, planner::lower_bound_bytes(problem));  // 60 MiB at t=14, 40 MiB at t=16
}

}  // namespace
}  // namespace memplan
