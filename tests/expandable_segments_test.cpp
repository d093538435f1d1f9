// runtime/caching_allocator with expandable_segments: one reserved address range per pool,
// grown in 2 MiB (small) / 20 MiB (large) pages, shrunk by unmapping fully free pages. Expected
// numbers are worked by hand from docs/caching_allocator.md section 9.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "allocator_test_util.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/simulated_device.h"

namespace memplan::runtime {
namespace {

using test_support::MiB;
constexpr Bytes GiB = Bytes{1} << 30;
constexpr auto kAll = static_cast<std::size_t>(StatPool::all);

using test_support::addr;

CachingAllocatorOptions expandable() {
  CachingAllocatorOptions o;
  o.expandable_segments = true;
  return o;
}

void* must_allocate(CachingAllocator& a, Bytes n) {
  Result<void*> r = a.allocate(n);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : nullptr;
}

Bytes reserved(const CachingAllocator& a) { return a.stats().reserved_bytes[kAll].current; }

TEST(ExpandableSegments, EightSixteensMapSevenPagesAndFreedSpaceServesFourThirtyTwos) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device, expandable());
  std::vector<void*> live;
  for (int i = 0; i < 8; ++i) live.push_back(must_allocate(a, 16 * MiB));
  // Tails of 4, 8, 12 and 16 MiB get reused: 7 pages of 20 MiB for 128 MiB of tensors.
  EXPECT_EQ(reserved(a), 140 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 7);
  EXPECT_EQ(a.stats().segment[kAll].current, 0);  // maps are not segments
  for (int i = 1; i < 8; ++i) {
    EXPECT_EQ(addr(live[static_cast<std::size_t>(i)]), addr(live[0]) + static_cast<DeviceAddress>(16 * MiB * i));
  }
  for (void* p : live) a.free(p);
  live.clear();
  for (int i = 0; i < 4; ++i) live.push_back(must_allocate(a, 32 * MiB));
  EXPECT_EQ(reserved(a), 140 * MiB);  // everything merged into one block: no new pages
  EXPECT_EQ(a.stats().num_device_alloc, 7);
  EXPECT_EQ(device.simulated_stats().reservations, 1);
}

TEST(ExpandableSegments, SmallPoolGrowsIn2MiBPages) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device, expandable());
  must_allocate(a, 1);
  EXPECT_EQ(reserved(a), 2 * MiB);
  const Bytes n = 600 * 1024;  // a multiple of 512: three fit beside the 512 B, a fourth does not
  void* first = must_allocate(a, n);
  must_allocate(a, n);
  must_allocate(a, n);
  EXPECT_EQ(reserved(a), 2 * MiB);
  void* fourth = must_allocate(a, n);
  EXPECT_EQ(reserved(a), 4 * MiB);
  EXPECT_EQ(addr(fourth), addr(first) + static_cast<DeviceAddress>(3 * n));  // contiguous growth
  EXPECT_EQ(a.stats().num_device_alloc, 2);
  EXPECT_EQ(device.simulated_stats().reservations, 1);
}

TEST(ExpandableSegments, PoolsStaySeparate) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device, expandable());
  a.free(must_allocate(a, 2 * MiB));  // one 20 MiB large page
  must_allocate(a, MiB / 2);          // small pool: its own segment and 2 MiB page
  EXPECT_EQ(reserved(a), 22 * MiB);
  EXPECT_EQ(device.simulated_stats().reservations, 2);
}

TEST(ExpandableSegments, LargeBlocksSplitAnyRemainderOf512OrMore) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device, expandable());
  void* p = must_allocate(a, 19 * MiB);
  EXPECT_EQ(a.block_size(p), 19 * MiB);  // the classic allocator hands out all 20 MiB
  void* q = must_allocate(a, MiB);        // 1 MiB is a small request: the small pool
  EXPECT_EQ(a.block_size(q), MiB);
  void* r = must_allocate(a, MiB + 512);  // 1 MiB tail of the large page is too small: grow
  EXPECT_EQ(addr(r), addr(p) + static_cast<DeviceAddress>(19 * MiB));
  EXPECT_EQ(reserved(a), 40 * MiB + 2 * MiB);
  EXPECT_EQ(a.stats().inactive_split[kAll].current, 0);  // never counted for expandable blocks
  EXPECT_EQ(a.stats().inactive_split_bytes[kAll].current, 0);
}

TEST(ExpandableSegments, EmptyCacheUnmapsWholeFreePagesAndGrowthRefillsTheLowestHole) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device, expandable());
  void* p = must_allocate(a, 30 * MiB);  // pages 0-1: p = [0, 30), free [30, 40)
  void* q = must_allocate(a, 25 * MiB);  // grows by page 2: q = [30, 55), free [55, 60)
  const DeviceAddress base = addr(p);
  EXPECT_EQ(addr(q), base + 30 * MiB);
  EXPECT_EQ(reserved(a), 60 * MiB);
  a.free(p);
  a.empty_cache();  // only page 0 lies wholly in a free block; [20, 30) and [55, 60) stay
  EXPECT_EQ(reserved(a), 40 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(device.simulated_stats().mapped_bytes, 40 * MiB);

  AllocatorSnapshot snap = a.snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);  // one segment per contiguous mapped range
  const SegmentSnapshot& seg = snap.segments[0];
  EXPECT_TRUE(seg.is_expandable);
  EXPECT_EQ(seg.address, base + 20 * MiB);
  EXPECT_EQ(seg.total_size, 40 * MiB);
  ASSERT_EQ(seg.blocks.size(), 3u);
  EXPECT_EQ(seg.blocks[0].size, 10 * MiB);
  EXPECT_EQ(seg.blocks[0].state, BlockState::inactive);
  EXPECT_EQ(seg.blocks[1].size, 25 * MiB);
  EXPECT_EQ(seg.blocks[1].state, BlockState::active_allocated);
  EXPECT_EQ(seg.blocks[2].size, 5 * MiB);

  // 20 MiB fits neither free piece (10 and 5 MiB); the hole at the bottom plus the 10 MiB after
  // it does, so page 0 is mapped again rather than growing the top.
  void* r = must_allocate(a, 20 * MiB);
  EXPECT_EQ(addr(r), base);
  EXPECT_EQ(reserved(a), 60 * MiB);
  a.free(q);
  a.free(r);
  a.empty_cache();
  EXPECT_EQ(reserved(a), 0);
  EXPECT_EQ(device.simulated_stats().reservations, 0);  // fully unmapped segments are released
  EXPECT_EQ(device.simulated_stats().physical_bytes_in_use, 0);
}

TEST(ExpandableSegments, AvoidTheOutOfMemoryThatAPinnedSplitSegmentCauses) {
  // The scenario of CachingAllocator.PinnedSplitSegmentForcesANewSegmentAndRunsOutOfMemory:
  // there it fails; here the free 98 MiB grows by one page in place.
  SimulatedDevice device(150 * MiB);
  CachingAllocator a(device, expandable());
  a.free(must_allocate(a, 100 * MiB));  // 5 pages
  std::vector<void*> temps;
  for (int i = 0; i < 5; ++i) temps.push_back(must_allocate(a, 2 * MiB));
  for (int i = 1; i < 5; ++i) a.free(temps[static_cast<std::size_t>(i)]);
  void* big = must_allocate(a, 100 * MiB);
  EXPECT_EQ(addr(big), addr(temps[0]) + static_cast<DeviceAddress>(2 * MiB));
  EXPECT_EQ(reserved(a), 120 * MiB);
  EXPECT_EQ(a.stats().num_ooms, 0);
}

TEST(ExpandableSegments, OutOfMemoryUnmapsCachedPagesRetriesAndOmitsTheHint) {
  SimulatedDevice device(60 * MiB);
  CachingAllocator a(device, expandable());
  void* p = must_allocate(a, 20 * MiB);  // page 0
  void* q = must_allocate(a, 20 * MiB);  // page 1
  a.free(p);
  // Two more pages do not fit the device; the flush unmaps page 0 (free), which makes room.
  Result<void*> r = a.allocate(40 * MiB);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(reserved(a), 60 * MiB);
  Result<void*> s = a.allocate(20 * MiB);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_NE(s.error().message.find("Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 60.00 MiB of which "
                                   "0 bytes is free."),
            std::string::npos)
      << s.error().message;
  EXPECT_EQ(s.error().message.find("expandable_segments:True"), std::string::npos);
  a.free(q);
  a.free(r.value());
}

TEST(ExpandableSegments, NeedsAVirtualMemoryDevice) {
  CpuDevice cpu;
  EXPECT_THROW({ CachingAllocator bad(cpu, expandable()); }, InternalError);
}

}  // namespace
}  // namespace memplan::runtime
