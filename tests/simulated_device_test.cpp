// runtime/simulated_device: capacity accounting, address ranges that never overlap, and the
// virtual-memory primitives (reserve, map, unmap, release) expandable segments are built on.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "memplan/runtime/caching_allocator.h"  // kMiB
#include "memplan/runtime/simulated_device.h"

namespace memplan::runtime {
namespace {

DeviceAddress address_of(void* p) { return reinterpret_cast<DeviceAddress>(p); }

TEST(SimulatedDevice, AllocatesWithinCapacityAndFailsBeyondIt) {
  SimulatedDevice device(10 * kMiB);
  Result<void*> a = device.allocate(4 * kMiB);
  Result<void*> b = device.allocate(6 * kMiB);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(device.allocate(1).ok());  // rounded to 256 bytes, none left
  EXPECT_EQ(device.memory_info().total_bytes, 10 * kMiB);
  EXPECT_EQ(device.memory_info().free_bytes, 0);
  device.deallocate(a.value(), 4 * kMiB);
  EXPECT_EQ(device.memory_info().free_bytes, 4 * kMiB);
  EXPECT_TRUE(device.allocate(4 * kMiB).ok());
  EXPECT_EQ(device.stats().allocations, 3);
  EXPECT_EQ(device.stats().frees, 1);
  EXPECT_EQ(device.simulated_stats().peak_physical_bytes, 10 * kMiB);
}

TEST(SimulatedDevice, AddressesAreAlignedDistinctAndNeverOverlap) {
  SimulatedDevice device(Bytes{1} << 40);
  std::vector<std::pair<DeviceAddress, Bytes>> ranges;
  for (Bytes size : {Bytes{1}, 3 * kMiB, 2 * kMiB, 5000 * Bytes{1}, 7 * kMiB + 3}) {
    Result<void*> p = device.allocate(size);
    ASSERT_TRUE(p.ok());
    EXPECT_NE(p.value(), nullptr);
    EXPECT_EQ(address_of(p.value()) % SimulatedDevice::kPageGranularity, 0u);
    ranges.emplace_back(address_of(p.value()), size);
  }
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      const bool disjoint = ranges[i].first + static_cast<DeviceAddress>(ranges[i].second) <= ranges[j].first ||
                            ranges[j].first + static_cast<DeviceAddress>(ranges[j].second) <= ranges[i].first;
      EXPECT_TRUE(disjoint) << i << " overlaps " << j;
    }
  }
}

TEST(SimulatedDevice, FreedAddressRangeIsReusedFirstFit) {
  SimulatedDevice device(100 * kMiB);
  void* a = device.allocate(4 * kMiB).value();
  void* b = device.allocate(4 * kMiB).value();
  EXPECT_EQ(address_of(b), address_of(a) + 4 * kMiB);
  device.deallocate(a, 4 * kMiB);
  void* c = device.allocate(2 * kMiB).value();
  EXPECT_EQ(c, a);  // the lowest hole that fits
}

TEST(SimulatedDevice, MappedPagesCountAgainstCapacity) {
  SimulatedDevice device(10 * kMiB);
  Result<DeviceAddress> base = device.reserve_address_range(40 * kMiB);  // reserving costs nothing
  ASSERT_TRUE(base.ok());
  EXPECT_EQ(device.memory_info().free_bytes, 10 * kMiB);
  ASSERT_TRUE(device.map_pages(base.value(), 6 * kMiB).ok());
  EXPECT_EQ(device.memory_info().free_bytes, 4 * kMiB);
  EXPECT_FALSE(device.allocate(6 * kMiB).ok());  // plain and mapped share the capacity
  // All or nothing: 6 MiB more does not fit, so nothing more is mapped.
  EXPECT_FALSE(device.map_pages(base.value() + 6 * kMiB, 6 * kMiB).ok());
  EXPECT_EQ(device.simulated_stats().mapped_bytes, 6 * kMiB);
  ASSERT_TRUE(device.map_pages(base.value() + 6 * kMiB, 4 * kMiB).ok());
  EXPECT_EQ(device.memory_info().free_bytes, 0);
  device.unmap_pages(base.value() + 2 * kMiB, 2 * kMiB);  // a hole in the middle
  EXPECT_EQ(device.memory_info().free_bytes, 2 * kMiB);
  EXPECT_EQ(device.simulated_stats().map_calls, 2);
  EXPECT_EQ(device.simulated_stats().unmap_calls, 1);
}

TEST(SimulatedDevice, ReleaseNeedsEveryPageUnmapped) {
  SimulatedDevice device(10 * kMiB);
  const DeviceAddress base = device.reserve_address_range(8 * kMiB).value();
  ASSERT_TRUE(device.map_pages(base, 4 * kMiB).ok());
  EXPECT_THROW(device.release_address_range(base), InternalError);
  EXPECT_THROW(device.map_pages(base + 2 * kMiB, 2 * kMiB), InternalError);      // already mapped
  EXPECT_THROW(device.map_pages(base + 1 * kMiB, 2 * kMiB), InternalError);      // not aligned
  EXPECT_THROW(device.map_pages(base + 6 * kMiB, 4 * kMiB), InternalError);      // past the end
  device.unmap_pages(base, 4 * kMiB);
  device.release_address_range(base);
  EXPECT_EQ(device.simulated_stats().reservations, 0);
  EXPECT_EQ(device.memory_info().free_bytes, 10 * kMiB);
}

TEST(SimulatedDevice, ReservationsAndAllocationsDoNotOverlap) {
  SimulatedDevice device(100 * kMiB);
  const DeviceAddress base = device.reserve_address_range(20 * kMiB).value();
  const DeviceAddress p = address_of(device.allocate(4 * kMiB).value());
  EXPECT_TRUE(p >= base + 20 * kMiB || p + 4 * kMiB <= base);
}

TEST(SimulatedDevice, CopiesAreProgrammerErrors) {
  SimulatedDevice device(10 * kMiB);
  void* p = device.allocate(1024).value();
  float host[4] = {};
  EXPECT_THROW(device.copy_from_host(p, host, sizeof host), InternalError);
  EXPECT_THROW(device.copy_to_host(host, p, sizeof host), InternalError);
}

}  // namespace
}  // namespace memplan::runtime
