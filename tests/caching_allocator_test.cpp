// runtime/caching_allocator: PyTorch's caching-allocator rules, each checked against numbers
// worked by hand from docs/caching_allocator.md, then a randomized property test and a
// speed check. Devices are simulated, so sizes are real-model sizes and nothing is touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "allocator_test_util.h"
#include "memplan/common/rng.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/simulated_device.h"

namespace memplan::runtime {
namespace {

using test_support::MiB;
constexpr Bytes GiB = Bytes{1} << 30;
constexpr auto kAll = static_cast<std::size_t>(StatPool::all);
constexpr auto kSmall = static_cast<std::size_t>(StatPool::small_pool);
constexpr auto kLarge = static_cast<std::size_t>(StatPool::large_pool);

using test_support::addr;

void* must_allocate(CachingAllocator& a, Bytes n) {
  Result<void*> r = a.allocate(n);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : nullptr;
}

CachingAllocatorOptions parsed(std::string_view config) {
  Result<CachingAllocatorOptions> o = CachingAllocatorOptions::parse(config);
  EXPECT_TRUE(o.ok()) << (o.ok() ? "" : o.error().message);
  return o.ok() ? o.value() : CachingAllocatorOptions{};
}

Bytes reserved(const CachingAllocator& a) { return a.stats().reserved_bytes[kAll].current; }
Bytes allocated(const CachingAllocator& a) { return a.stats().allocated_bytes[kAll].current; }

// ---- Sizes ----------------------------------------------------------------------------------

TEST(CachingAllocatorSizes, RoundsToMultiplesOf512) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  EXPECT_EQ(a.round_size(1), 512);
  EXPECT_EQ(a.round_size(511), 512);
  EXPECT_EQ(a.round_size(512), 512);
  EXPECT_EQ(a.round_size(513), 1024);
  EXPECT_EQ(a.round_size(1200), 1536);
  EXPECT_EQ(a.round_size(MiB), MiB);
  EXPECT_EQ(a.round_size(MiB + 1), MiB + 512);
  EXPECT_EQ(a.round_size(5 * MiB + 1), 5 * MiB + 512);
}

TEST(CachingAllocatorSizes, RoundupPower2DivisionsRoundsToDivisionsOfThePowerOfTwoInterval) {
  SimulatedDevice device(GiB);
  CachingAllocator four(device, parsed("roundup_power2_divisions:4"));
  EXPECT_EQ(four.round_size(5 * MiB + 1), 6 * MiB);        // [4, 8) MiB in steps of 1 MiB
  EXPECT_EQ(four.round_size(3 * MiB + 1), 3 * MiB + MiB / 2);  // [2, 4) MiB in steps of 512 KiB
  EXPECT_EQ(four.round_size(4 * MiB), 4 * MiB);            // a power of two stays
  EXPECT_EQ(four.round_size(1200), 1536);                  // not > 512 * 4: plain rounding
  EXPECT_EQ(four.round_size(2049), 2560);                  // > 2048: step 2048 / 4 = 512
  EXPECT_EQ(four.round_size(3000), 3072);                  // [2048, 4096) in steps of 512
  EXPECT_EQ(four.round_size(100), 512);
  CachingAllocator eight(device, parsed("roundup_power2_divisions:8"));
  EXPECT_EQ(eight.round_size(2049), 2560);                 // not > 4096: plain rounding
  EXPECT_EQ(eight.round_size(9 * MiB + 1), 10 * MiB);      // [8, 16) MiB in steps of 1 MiB
  EXPECT_EQ(eight.round_size(9 * MiB), 9 * MiB);
  EXPECT_EQ(eight.round_size(600 * MiB + 1), 640 * MiB);   // [512, 1024) MiB in steps of 64 MiB
}

TEST(CachingAllocatorSizes, DivisionsListFillsIntervalsAsThePyTorchUnitTestPins) {
  // Entry i covers [2^i, 2^(i+1)) MiB.
  CachingAllocatorOptions o = parsed("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]");
  EXPECT_EQ(o.roundup_power2_divisions[0], 8);   // below 2 MiB: the first key fills down
  EXPECT_EQ(o.roundup_power2_divisions[5], 8);   // 32 MiB
  EXPECT_EQ(o.roundup_power2_divisions[6], 8);   // 64 MiB
  EXPECT_EQ(o.roundup_power2_divisions[7], 2);   // 128 MiB
  EXPECT_EQ(o.roundup_power2_divisions[8], 4);
  EXPECT_EQ(o.roundup_power2_divisions[9], 2);
  EXPECT_EQ(o.roundup_power2_divisions[10], 4);  // 1024 MiB
  EXPECT_EQ(o.roundup_power2_divisions[11], 1);  // 2048 MiB and up: ">"
  EXPECT_EQ(o.roundup_power2_divisions[15], 1);

  CachingAllocatorOptions gaps = parsed("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]");
  EXPECT_EQ(gaps.roundup_power2_divisions[10], 0);  // 1024 MiB is never named
  EXPECT_EQ(gaps.roundup_power2_divisions[7], 8);
  EXPECT_EQ(gaps.roundup_power2_divisions[8], 16);
  EXPECT_EQ(gaps.roundup_power2_divisions[11], 8);
  EXPECT_EQ(gaps.roundup_power2_divisions[12], 2);

  SimulatedDevice device(GiB);
  CachingAllocator a(device, o);
  EXPECT_EQ(a.round_size(33 * MiB), 36 * MiB);     // [32, 64) MiB, 8 divisions: steps of 4 MiB
  EXPECT_EQ(a.round_size(129 * MiB), 192 * MiB);   // [128, 256) MiB, 2 divisions: steps of 64 MiB
  EXPECT_EQ(a.round_size(3 * GiB + 1), 3 * GiB + 512);  // 1 division: plain rounding
}

TEST(CachingAllocatorSizes, ParsesOptionsAndRejectsBadOnes) {
  CachingAllocatorOptions o = parsed("max_split_size_mb:100, expandable_segments:True,garbage_collection_threshold:0.6");
  EXPECT_EQ(o.max_split_size, 100 * MiB);
  EXPECT_TRUE(o.expandable_segments);
  EXPECT_DOUBLE_EQ(o.garbage_collection_threshold, 0.6);
  EXPECT_EQ(parsed("").max_split_size, kUnlimitedSplitSize);
  EXPECT_FALSE(CachingAllocatorOptions::parse("max_split_size_mb:19").ok());
  EXPECT_FALSE(CachingAllocatorOptions::parse("roundup_power2_divisions:3").ok());
  EXPECT_FALSE(CachingAllocatorOptions::parse("roundup_power2_divisions:[48:2]").ok());
  EXPECT_FALSE(CachingAllocatorOptions::parse("garbage_collection_threshold:1.5").ok());
  EXPECT_FALSE(CachingAllocatorOptions::parse("expandable_segments:yes").ok());
  EXPECT_FALSE(CachingAllocatorOptions::parse("no_such_option:1").ok());
  // Written back, the options parse to the same thing.
  CachingAllocatorOptions lists = parsed("roundup_power2_divisions:[64:8,>:1],max_split_size_mb:200");
  CachingAllocatorOptions again = parsed(lists.to_string());
  EXPECT_EQ(again.roundup_power2_divisions, lists.roundup_power2_divisions);
  EXPECT_EQ(again.max_split_size, 200 * MiB);
}

TEST(CachingAllocatorSizes, SegmentSizeOnACacheMiss) {
  EXPECT_EQ(CachingAllocator::allocation_size(512), 2 * MiB);
  EXPECT_EQ(CachingAllocator::allocation_size(MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocator::allocation_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingAllocator::allocation_size(9 * MiB + MiB / 2), 20 * MiB);
  EXPECT_EQ(CachingAllocator::allocation_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingAllocator::allocation_size(11 * MiB + 512), 12 * MiB);
}

TEST(CachingAllocatorSizes, FormatSizeLikePyTorch) {
  EXPECT_EQ(format_size(1024), "1024 bytes");
  EXPECT_EQ(format_size(1025), "1.00 KiB");
  EXPECT_EQ(format_size(MiB), "1024.00 KiB");
  EXPECT_EQ(format_size(MiB + MiB / 2), "1.50 MiB");
  EXPECT_EQ(format_size(GiB), "1024.00 MiB");
  EXPECT_EQ(format_size(GiB + GiB / 2), "1.50 GiB");
}

// ---- Pools, segments, splitting -------------------------------------------------------------

TEST(CachingAllocator, OneByteGetsA512ByteBlockInA2MiBSmallSegment) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p = must_allocate(a, 1);
  EXPECT_EQ(a.block_size(p), 512);
  const AllocatorStats& s = a.stats();
  EXPECT_EQ(s.segment[kSmall].current, 1);
  EXPECT_EQ(s.segment[kLarge].current, 0);
  EXPECT_EQ(s.reserved_bytes[kSmall].current, 2 * MiB);
  EXPECT_EQ(s.allocated_bytes[kAll].current, 512);
  EXPECT_EQ(s.requested_bytes[kAll].current, 1);
  EXPECT_EQ(s.inactive_split[kSmall].current, 1);
  EXPECT_EQ(s.inactive_split_bytes[kSmall].current, 2 * MiB - 512);
  EXPECT_EQ(s.num_device_alloc, 1);
  EXPECT_EQ(device.stats().allocations, 1);
  EXPECT_EQ(a.allocate(0).value(), nullptr);  // zero bytes never reach the pools
  EXPECT_EQ(s.allocation[kAll].current, 1);
}

TEST(CachingAllocator, JustOver1MiBGoesToTheLargePoolAndSplitsA20MiBSegment) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p = must_allocate(a, MiB + 1);
  EXPECT_EQ(a.block_size(p), MiB + 512);
  EXPECT_EQ(a.stats().reserved_bytes[kLarge].current, 20 * MiB);
  EXPECT_EQ(a.stats().inactive_split_bytes[kLarge].current, 20 * MiB - (MiB + 512));
  // The remainder serves the next request: no second segment.
  void* q = must_allocate(a, 5 * MiB);
  EXPECT_EQ(addr(q), addr(p) + static_cast<DeviceAddress>(MiB + 512));
  EXPECT_EQ(a.stats().num_device_alloc, 1);
}

TEST(CachingAllocator, RemainderOfExactly1MiBIsNotSplitInTheLargePool) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p = must_allocate(a, 19 * MiB);
  EXPECT_EQ(a.block_size(p), 20 * MiB);  // remainder 1 MiB is not > 1 MiB
  EXPECT_EQ(allocated(a), 20 * MiB);
  EXPECT_EQ(a.stats().requested_bytes[kAll].current, 19 * MiB);
  EXPECT_EQ(a.stats().inactive_split[kAll].current, 0);
  void* q = must_allocate(a, 10 * MiB);
  EXPECT_EQ(a.block_size(q), 10 * MiB);
  EXPECT_EQ(reserved(a), 30 * MiB);
  void* r = must_allocate(a, 11 * MiB + 1);
  EXPECT_EQ(a.block_size(r), 12 * MiB);  // 12 MiB segment, remainder < 1 MiB
  EXPECT_EQ(reserved(a), 42 * MiB);
  void* t = must_allocate(a, 9 * MiB + MiB / 2);  // 20 MiB segment, remainder 10.5 MiB: split
  EXPECT_EQ(a.block_size(t), 9 * MiB + MiB / 2);
  EXPECT_EQ(reserved(a), 62 * MiB);
}

TEST(CachingAllocator, LargeSplitNeedsARemainderAbove1MiB) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p = must_allocate(a, 12 * MiB);
  a.free(p);
  void* q = must_allocate(a, 11 * MiB);  // remainder exactly 1 MiB: whole block
  EXPECT_EQ(a.block_size(q), 12 * MiB);
  a.free(q);
  void* r = must_allocate(a, 11 * MiB - 512);  // remainder 1 MiB + 512: split
  EXPECT_EQ(a.block_size(r), 11 * MiB - 512);
  EXPECT_EQ(a.stats().inactive_split_bytes[kLarge].current, MiB + 512);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
}

TEST(CachingAllocator, SmallPoolSplitsAnyRemainderOf512OrMore) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p = must_allocate(a, MiB);  // small pool, 2 MiB segment, remainder 1 MiB: split
  void* q = must_allocate(a, MiB);  // takes the remainder whole
  EXPECT_EQ(addr(q), addr(p) + static_cast<DeviceAddress>(MiB));
  EXPECT_EQ(a.stats().segment[kSmall].current, 1);
  EXPECT_EQ(a.stats().inactive_split[kSmall].current, 0);  // fully used again
  void* r = must_allocate(a, MiB - 512);                  // nothing left: a second segment
  EXPECT_EQ(a.stats().segment[kSmall].current, 2);
  EXPECT_EQ(a.block_size(r), MiB - 512);
}

TEST(CachingAllocator, SmallPoolSplitsARemainderOfExactly512) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p = must_allocate(a, MiB);
  void* q = must_allocate(a, MiB - 512);  // leaves exactly 512 bytes: still split
  EXPECT_EQ(a.block_size(q), MiB - 512);
  EXPECT_EQ(a.stats().inactive_split_bytes[kSmall].current, 512);
  void* r = must_allocate(a, 1);  // the 512-byte tail, no new segment
  EXPECT_EQ(addr(r), addr(p) + static_cast<DeviceAddress>(2 * MiB - 512));
  EXPECT_EQ(a.stats().num_device_alloc, 1);
}

TEST(CachingAllocator, PoolsNeverShareMemory) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  a.free(must_allocate(a, 2 * MiB));  // 20 MiB large segment, now all free
  must_allocate(a, MiB / 2);          // small request: its own 2 MiB segment
  EXPECT_EQ(reserved(a), 22 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes[kSmall].current, 2 * MiB);
  EXPECT_EQ(a.stats().reserved_bytes[kLarge].current, 20 * MiB);
}

TEST(CachingAllocator, BestFitTakesTheSmallestFreeBlockThenTheLowestAddress) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* s12 = must_allocate(a, 12 * MiB);
  void* s16 = must_allocate(a, 16 * MiB);
  void* s14 = must_allocate(a, 14 * MiB);
  a.free(s12);
  a.free(s16);
  a.free(s14);
  void* p = must_allocate(a, 13 * MiB);  // 14 MiB is the tightest fit
  EXPECT_EQ(p, s14);
  EXPECT_EQ(a.block_size(p), 14 * MiB);  // remainder 1 MiB: not split
  EXPECT_EQ(a.stats().num_device_alloc, 3);

  void* x = must_allocate(a, 30 * MiB);
  void* y = must_allocate(a, 30 * MiB);
  a.free(y);
  a.free(x);
  EXPECT_EQ(must_allocate(a, 29 * MiB), std::min(x, y, [](void* l, void* r) { return addr(l) < addr(r); }));
}

TEST(CachingAllocator, FreeCoalescesWithFreeNeighboursOnly) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p0 = must_allocate(a, 2 * MiB);
  void* p1 = must_allocate(a, 2 * MiB);
  void* p2 = must_allocate(a, 2 * MiB);
  ASSERT_EQ(addr(p1), addr(p0) + 2 * MiB);
  ASSERT_EQ(addr(p2), addr(p0) + 4 * MiB);
  const AllocatorStats& s = a.stats();
  EXPECT_EQ(s.inactive_split[kLarge].current, 1);  // the 14 MiB tail
  a.free(p0);
  EXPECT_EQ(s.inactive_split[kLarge].current, 2);  // p1 keeps p0 from merging
  EXPECT_EQ(s.inactive_split_bytes[kLarge].current, 16 * MiB);
  a.free(p2);  // merges with the tail
  EXPECT_EQ(s.inactive_split[kLarge].current, 2);
  EXPECT_EQ(s.inactive_split_bytes[kLarge].current, 18 * MiB);
  // 17 MiB fits in neither free piece (2 MiB and 16 MiB): a new 18 MiB segment.
  void* big = must_allocate(a, 17 * MiB);
  EXPECT_EQ(s.num_device_alloc, 2);
  a.free(big);
  a.free(p1);  // now the first segment is one 20 MiB free block again
  EXPECT_EQ(s.inactive_split[kLarge].current, 0);
  EXPECT_EQ(s.inactive_split_bytes[kLarge].current, 0);
  void* whole = must_allocate(a, 19 * MiB);
  EXPECT_EQ(a.block_size(whole), 20 * MiB);
  EXPECT_EQ(s.num_device_alloc, 2);
}

TEST(CachingAllocator, ReusesCachedBlocksWithoutDeviceAllocations) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  const Bytes sizes[] = {1, 700, 300 * 1024, 3 * MiB, 25 * MiB, 64 * MiB};
  for (int step = 0; step < 50; ++step) {
    std::vector<void*> live;
    for (Bytes n : sizes) live.push_back(must_allocate(a, n));
    for (void* p : live) a.free(p);
  }
  // Small: 1 segment; large: 3 MiB -> 20 MiB segment, 25 and 64 MiB -> own segments.
  EXPECT_EQ(a.stats().num_device_alloc, 4);
  EXPECT_EQ(device.stats().allocations, 4);
  EXPECT_EQ(a.stats().num_device_free, 0);
  EXPECT_EQ(a.stats().allocation[kAll].allocated, 300);
  EXPECT_EQ(a.stats().allocation[kAll].freed, 300);
  EXPECT_EQ(allocated(a), 0);
  EXPECT_EQ(reserved(a), 2 * MiB + 20 * MiB + 26 * MiB + 64 * MiB);
}

// ---- Memory pressure ------------------------------------------------------------------------

TEST(CachingAllocator, OutOfDeviceMemoryFreesTheCacheAndRetries) {
  SimulatedDevice device(40 * MiB);
  CachingAllocator a(device);
  a.free(must_allocate(a, 5 * MiB));  // caches a 20 MiB segment
  void* p = must_allocate(a, 30 * MiB);
  EXPECT_EQ(a.block_size(p), 30 * MiB);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(a.stats().num_sync_all_streams, 1);
  EXPECT_EQ(a.stats().num_ooms, 0);
  EXPECT_EQ(reserved(a), 30 * MiB);
}

TEST(CachingAllocator, OutOfMemoryMessageHasPyTorchsFields) {
  SimulatedDevice device(100 * MiB);
  CachingAllocator a(device);
  must_allocate(a, 30 * MiB);  // 30 MiB segment
  must_allocate(a, 5 * MiB);   // 20 MiB segment: 5 live, 15 free but pinned by the split
  Result<void*> r = a.allocate(60 * MiB);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "CUDA out of memory. Tried to allocate 60.00 MiB. GPU 0 has a total capacity of 100.00 MiB of which "
            "50.00 MiB is free. Including non-PyTorch memory, this process has 50.00 MiB memory in use. Of the "
            "allocated memory 35.00 MiB is allocated by PyTorch, and 15.00 MiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)");
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(reserved(a), 50 * MiB);  // nothing was releasable
}

TEST(CachingAllocator, OutOfMemoryReportsTheSegmentSizeNotTheRequest) {
  SimulatedDevice device(20 * MiB);
  CachingAllocator a(device);
  must_allocate(a, 19 * MiB);  // the whole device
  Result<void*> large = a.allocate(2 * MiB);
  ASSERT_FALSE(large.ok());
  EXPECT_NE(large.error().message.find("Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 20.00 MiB of "
                                       "which 0 bytes is free."),
            std::string::npos)
      << large.error().message;
  Result<void*> small = a.allocate(100);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().message.find("Tried to allocate 2.00 MiB."), std::string::npos);
  EXPECT_NE(small.error().message.find("Of the allocated memory 20.00 MiB is allocated by PyTorch, and 0 bytes is "
                                       "reserved by PyTorch but unallocated."),
            std::string::npos);
  EXPECT_EQ(a.stats().num_ooms, 2);
  EXPECT_EQ(a.stats().num_alloc_retries, 2);
}

TEST(CachingAllocator, EmptyCacheReleasesOnlyFullyFreeSegments) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* pin = must_allocate(a, 5 * MiB);  // splits a 20 MiB segment: 15 MiB free beside it
  a.free(must_allocate(a, 16 * MiB));     // 15 MiB is too small: a whole 16 MiB segment, freed
  a.free(must_allocate(a, 1000));         // a whole small segment, freed
  ASSERT_EQ(reserved(a), 38 * MiB);
  a.empty_cache();
  EXPECT_EQ(reserved(a), 20 * MiB);
  EXPECT_EQ(a.stats().segment[kAll].current, 1);
  EXPECT_EQ(a.stats().num_device_free, 2);
  EXPECT_EQ(a.stats().inactive_split_bytes[kAll].current, 15 * MiB);  // non-releasable
  EXPECT_EQ(device.memory_info().free_bytes, GiB - 20 * MiB);
  a.free(pin);
  a.empty_cache();
  EXPECT_EQ(reserved(a), 0);
  EXPECT_EQ(device.memory_info().free_bytes, GiB);
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizeBlocksWholeWithin20MiBSlack) {
  SimulatedDevice device(4 * GiB);
  CachingAllocator a(device, parsed("max_split_size_mb:100"));
  EXPECT_EQ(a.stats().max_split_size, 100 * MiB);
  a.free(must_allocate(a, 200 * MiB));  // cached oversize segment
  void* small = must_allocate(a, 50 * MiB);  // may not carve the oversize block
  EXPECT_EQ(a.block_size(small), 50 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
  a.free(small);
  void* near = must_allocate(a, 190 * MiB);  // 200 < 190 + 20: reused whole, not split
  EXPECT_EQ(a.block_size(near), 200 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
  EXPECT_EQ(a.stats().oversize_allocations.current, 1);
  a.free(near);
  void* far = must_allocate(a, 170 * MiB);  // 200 >= 170 + 20: a new segment
  EXPECT_EQ(a.block_size(far), 170 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 3);
  EXPECT_EQ(a.stats().oversize_segments.current, 2);  // 200 and 170; not 50
  EXPECT_EQ(a.memory_stats().at("max_split_size"), 100 * MiB);
}

TEST(CachingAllocator, MaxSplitSizeReleasesOneOversizeSegmentBeforeFlushingEverything) {
  SimulatedDevice device(300 * MiB);
  CachingAllocator a(device, parsed("max_split_size_mb:100"));
  a.free(must_allocate(a, 200 * MiB));
  a.free(must_allocate(a, 5 * MiB));  // a cached 20 MiB segment that must survive
  void* p = must_allocate(a, 150 * MiB);  // 200 >= 170: no reuse; device has 80 MiB free
  EXPECT_EQ(a.block_size(p), 150 * MiB);
  EXPECT_EQ(a.stats().num_alloc_retries, 0);  // freed the 200 MiB segment only
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(reserved(a), 170 * MiB);
}

TEST(CachingAllocator, WithoutMaxSplitSizeSmallRequestsCarveTheCachedBigBlock) {
  SimulatedDevice device(300 * MiB);
  CachingAllocator a(device);
  void* big = must_allocate(a, 200 * MiB);
  a.free(big);
  void* pin = must_allocate(a, 5 * MiB);  // carved out of the cached 200 MiB block
  EXPECT_EQ(pin, big);
  void* p = must_allocate(a, 150 * MiB);  // and so is this: 45 MiB stay free, pinned
  EXPECT_EQ(addr(p), addr(big) + 5 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  Result<void*> q = a.allocate(120 * MiB);  // 100 MiB left on the device
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find("155.00 MiB is allocated by PyTorch, and 45.00 MiB is reserved"), std::string::npos)
      << q.error().message;
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_device_free, 0);
}

TEST(CachingAllocator, GarbageCollectionFreesTheOldestCachedBlocksFirst) {
  SimulatedDevice device(200 * MiB);
  CachingAllocatorOptions o = parsed("per_process_memory_fraction:0.5,garbage_collection_threshold:0.5");
  CachingAllocator a(device, o);  // 100 MiB allowed; collect above 50 MiB reserved
  a.free(must_allocate(a, 30 * MiB));  // free at search 1
  a.free(must_allocate(a, 40 * MiB));  // free at search 2
  void* p = must_allocate(a, 60 * MiB);  // search 3: ages 2 and 1, mean 1.5: only the 30 goes
  EXPECT_EQ(a.block_size(p), 60 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 0);
  EXPECT_EQ(reserved(a), 100 * MiB);
  // Collection frees the cached 40 MiB too, but 60 + 50 MiB is over the 100 MiB allowed.
  Result<void*> over = a.allocate(50 * MiB);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message.find("100.00 MiB allowed; Of the allocated memory"), std::string::npos)
      << over.error().message;
}

TEST(CachingAllocator, MemoryFractionWithoutCollectionFlushesOnTheRetry) {
  SimulatedDevice device(200 * MiB);
  CachingAllocator a(device, parsed("per_process_memory_fraction:0.5"));
  a.free(must_allocate(a, 30 * MiB));
  a.free(must_allocate(a, 40 * MiB));
  must_allocate(a, 60 * MiB);  // 70 + 60 > 100 allowed: flush both, retry
  EXPECT_EQ(a.stats().num_device_free, 2);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(reserved(a), 60 * MiB);
}

// ---- Stats ----------------------------------------------------------------------------------

TEST(CachingAllocator, PeaksFollowTheHighWaterMarkUntilReset) {
  SimulatedDevice device(GiB);
  CachingAllocator a(device);
  void* p = must_allocate(a, 30 * MiB);
  void* q = must_allocate(a, 40 * MiB);
  a.free(p);
  a.free(q);
  void* r = must_allocate(a, 10 * MiB);  // splits the cached 30 MiB block
  EXPECT_EQ(a.block_size(r), 10 * MiB);
  const AllocatorStats& s = a.stats();
  EXPECT_EQ(s.allocated_bytes[kAll].peak, 70 * MiB);
  EXPECT_EQ(s.allocated_bytes[kAll].current, 10 * MiB);
  EXPECT_EQ(s.allocated_bytes[kAll].allocated, 80 * MiB);
  EXPECT_EQ(s.allocated_bytes[kAll].freed, 70 * MiB);
  EXPECT_EQ(s.reserved_bytes[kAll].peak, 70 * MiB);
  EXPECT_EQ(s.allocation[kAll].peak, 2);
  a.reset_peak_stats();
  EXPECT_EQ(s.allocated_bytes[kAll].peak, 10 * MiB);
  EXPECT_EQ(s.reserved_bytes[kAll].peak, 70 * MiB);
  const auto m = a.memory_stats();
  EXPECT_EQ(m.at("allocated_bytes.all.current"), 10 * MiB);
  EXPECT_EQ(m.at("allocated_bytes.large_pool.peak"), 10 * MiB);
  EXPECT_EQ(m.at("reserved_bytes.small_pool.current"), 0);
  EXPECT_EQ(m.at("segment.all.current"), 2);
  EXPECT_EQ(m.at("inactive_split_bytes.all.current"), 20 * MiB);
  EXPECT_EQ(m.at("num_device_alloc"), 2);
  EXPECT_EQ(m.count("requested_bytes.all.freed"), 1u);
  EXPECT_EQ(a.memory_stats().size(), 9u * 3u * 4u + 2u * 4u + 6u);
}

// ---- Fragmentation: the failure a static plan avoids ----------------------------------------

TEST(CachingAllocator, SmallThenLargeNeedsNewSegmentsLargeThenSmallDoesNot) {
  SimulatedDevice device(GiB);
  CachingAllocator small_first(device);
  std::vector<void*> live;
  for (int i = 0; i < 8; ++i) live.push_back(must_allocate(small_first, 16 * MiB));
  for (void* p : live) small_first.free(p);
  live.clear();
  for (int i = 0; i < 4; ++i) live.push_back(must_allocate(small_first, 32 * MiB));
  EXPECT_EQ(reserved(small_first), 256 * MiB);  // eight 16 MiB segments never merge
  EXPECT_EQ(allocated(small_first), 128 * MiB);
  EXPECT_EQ(small_first.stats().num_device_alloc, 12);
  for (void* p : live) small_first.free(p);

  CachingAllocator large_first(device);
  live.clear();
  for (int i = 0; i < 4; ++i) live.push_back(must_allocate(large_first, 32 * MiB));
  for (void* p : live) large_first.free(p);
  for (int i = 0; i < 8; ++i) must_allocate(large_first, 16 * MiB);
  EXPECT_EQ(reserved(large_first), 128 * MiB);
  EXPECT_EQ(large_first.stats().num_device_alloc, 4);
}

TEST(CachingAllocator, PinnedSplitSegmentForcesANewSegmentAndRunsOutOfMemory) {
  // Step 1 leaves a cached 100 MiB segment; step 2 carves small tensors out of it and one
  // survives; step 3 needs 100 MiB again. 98 MiB sit free but pinned: a second segment is
  // needed, and on a 150 MiB device there is no room for it even after flushing the cache.
  SimulatedDevice device(150 * MiB);
  CachingAllocator a(device);
  a.free(must_allocate(a, 100 * MiB));
  std::vector<void*> temps;
  for (int i = 0; i < 5; ++i) temps.push_back(must_allocate(a, 2 * MiB));
  for (int i = 1; i < 5; ++i) a.free(temps[static_cast<std::size_t>(i)]);
  EXPECT_EQ(reserved(a), 100 * MiB);
  EXPECT_EQ(allocated(a), 2 * MiB);
  EXPECT_EQ(a.stats().inactive_split_bytes[kAll].current, 98 * MiB);
  Result<void*> big = a.allocate(100 * MiB);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("2.00 MiB is allocated by PyTorch, and 98.00 MiB is reserved by PyTorch but "
                                     "unallocated"),
            std::string::npos)
      << big.error().message;
  EXPECT_EQ(a.stats().num_ooms, 1);
}

// ---- Randomized properties ------------------------------------------------------------------

struct Live {
  void* ptr;
  Bytes requested;
};

// Checks every invariant that must hold between any two calls.
void check_invariants(const CachingAllocator& a, const SimulatedDevice& device, const std::vector<Live>& live) {
  const AllocatorSnapshot snap = a.snapshot();
  const AllocatorStats& s = a.stats();
  Bytes total = 0;
  Bytes allocated_sum = 0;
  Bytes requested_sum = 0;
  Bytes inactive_split_bytes = 0;
  std::int64_t inactive_split = 0;
  std::int64_t allocated_blocks = 0;
  DeviceAddress previous_end = 0;
  for (const SegmentSnapshot& seg : snap.segments) {
    ASSERT_GE(seg.address, previous_end) << "segments overlap";
    previous_end = seg.address + static_cast<DeviceAddress>(seg.total_size);
    DeviceAddress cursor = seg.address;
    for (const BlockSnapshot& b : seg.blocks) {
      ASSERT_EQ(b.address, cursor) << "blocks do not tile their segment";
      ASSERT_GT(b.size, 0);
      ASSERT_EQ(b.size % kMinBlockSize, 0);
      cursor += static_cast<DeviceAddress>(b.size);
      if (b.state == BlockState::active_allocated) {
        allocated_sum += b.size;
        requested_sum += b.requested_size;
        ++allocated_blocks;
      } else if (seg.blocks.size() > 1 && !seg.is_expandable) {
        inactive_split_bytes += b.size;
        ++inactive_split;
      }
    }
    ASSERT_EQ(cursor, previous_end);
    total += seg.total_size;
  }
  Bytes live_requested = 0;
  for (const Live& l : live) live_requested += l.requested;
  EXPECT_EQ(total, s.reserved_bytes[kAll].current);
  EXPECT_EQ(device.simulated_stats().physical_bytes_in_use, s.reserved_bytes[kAll].current);
  EXPECT_EQ(allocated_sum, s.allocated_bytes[kAll].current);
  EXPECT_EQ(requested_sum, s.requested_bytes[kAll].current);
  EXPECT_EQ(requested_sum, live_requested);
  EXPECT_EQ(allocated_blocks, static_cast<std::int64_t>(live.size()));
  EXPECT_EQ(allocated_blocks, s.allocation[kAll].current);
  EXPECT_EQ(inactive_split_bytes, s.inactive_split_bytes[kAll].current);
  EXPECT_EQ(inactive_split, s.inactive_split[kAll].current);
  EXPECT_LE(s.allocated_bytes[kAll].current, s.reserved_bytes[kAll].current);
  EXPECT_EQ(s.active_bytes[kAll].current, s.allocated_bytes[kAll].current);  // one stream
  for (const StatArray* stat : {&s.allocation, &s.segment, &s.allocated_bytes, &s.reserved_bytes,
                                &s.requested_bytes, &s.inactive_split, &s.inactive_split_bytes}) {
    EXPECT_EQ((*stat)[kAll].current, (*stat)[kSmall].current + (*stat)[kLarge].current);
    EXPECT_LE((*stat)[kAll].current, (*stat)[kAll].peak);
  }
  // Every live pointer is a distinct allocated block of at least the requested size.
  for (const Live& l : live) EXPECT_GE(a.block_size(l.ptr), l.requested);
}

class CachingAllocatorProperty : public ::testing::TestWithParam<std::string> {};

TEST_P(CachingAllocatorProperty, RandomSequencesKeepBlocksDisjointAndStatsConsistent) {
  Rng rng(12345);
  std::int64_t ooms = 0;
  for (int sequence = 0; sequence < 1000; ++sequence) {
    SimulatedDevice device(256 * MiB);
    CachingAllocator a(device, parsed(GetParam()));
    std::vector<Live> live;
    for (int op = 0; op < 60; ++op) {
      if (!live.empty() && rng.below(100) < 45) {
        const std::size_t i = static_cast<std::size_t>(rng.below(live.size()));
        a.free(live[i].ptr);
        live[i] = live.back();
        live.pop_back();
      } else {
        // Log-uniform from 1 B to 128 MiB: both pools, every segment-size rule, some OOMs.
        const Bytes n = std::max<Bytes>(1, static_cast<Bytes>(std::exp2(rng.uniform(0.0f, 27.0f))));
        Result<void*> p = a.allocate(n);
        if (p.ok()) {
          live.push_back({p.value(), n});
        } else {
          ++ooms;
        }
      }
      if (sequence % 50 == 0 || op == 59) check_invariants(a, device, live);
      if (rng.below(200) == 0) a.empty_cache();
    }
    for (const Live& l : live) a.free(l.ptr);
    live.clear();
    check_invariants(a, device, live);
    a.empty_cache();
    EXPECT_EQ(reserved(a), 0);
    EXPECT_EQ(a.stats().segment[kAll].current, 0);
    EXPECT_EQ(a.stats().inactive_split[kAll].current, 0);
    EXPECT_EQ(device.simulated_stats().physical_bytes_in_use, 0);
    EXPECT_EQ(device.simulated_stats().reservations, 0);
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(ooms, 0);  // the device is small enough to exercise the pressure paths
}

const char* const kPropertyConfigs[] = {
    "",
    "max_split_size_mb:40",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:2,64:8,>:1],max_split_size_mb:64",
    "expandable_segments:True",
    "per_process_memory_fraction:0.75,garbage_collection_threshold:0.5",
};

std::string property_name(const ::testing::TestParamInfo<std::string>& param) {
  const char* const names[] = {"defaults", "max_split", "divisions", "divisions_list", "expandable", "gc"};
  return names[param.index];
}

INSTANTIATE_TEST_SUITE_P(CachingAllocatorOptions, CachingAllocatorProperty,
                         ::testing::ValuesIn(std::vector<std::string>(std::begin(kPropertyConfigs), std::end(kPropertyConfigs))),
                         property_name);

// Speed is measured by bench/caching_allocator_bench.cpp; this checks what the cache does over
// many requests.
TEST(CachingAllocatorChurn, CacheAbsorbsNearlyAllOfManyRandomRequests) {
  SimulatedDevice device(64 * GiB);
  CachingAllocator a(device);
  Rng rng(7);
  std::vector<void*> live(256, nullptr);
  for (int i = 0; i < 200000; ++i) {
    const std::size_t slot = static_cast<std::size_t>(rng.below(live.size()));
    if (live[slot] != nullptr) a.free(live[slot]);
    const Bytes n = Bytes{512} << rng.below(16);  // 512 B .. 16 MiB
    live[slot] = a.allocate(n).value();
  }
  EXPECT_EQ(a.stats().allocation[kAll].allocated, 200000);
  EXPECT_LT(a.stats().num_device_alloc, 2000);  // the cache absorbs over 99% of requests
}

}  // namespace
}  // namespace memplan::runtime
