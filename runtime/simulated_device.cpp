#include "memplan/runtime/simulated_device.h"

#include <algorithm>
#include <utility>

namespace memplan::runtime {
namespace {

// Addresses start at 1 TiB so that no simulated pointer is ever null or looks like a small
// integer, and end at 64 PiB: far more than any reservation pattern needs.
constexpr DeviceAddress kAddressSpaceBegin = DeviceAddress{1} << 40;
constexpr DeviceAddress kAddressSpaceEnd = DeviceAddress{1} << 56;

void* to_pointer(DeviceAddress address) { return reinterpret_cast<void*>(address); }
DeviceAddress to_address(const void* ptr) { return reinterpret_cast<DeviceAddress>(ptr); }

}  // namespace

SimulatedDevice::SimulatedDevice(Bytes capacity_bytes, std::string name)
    : capacity_bytes_(capacity_bytes), name_(std::move(name)) {
  MEMPLAN_CHECK(capacity_bytes > 0, "a simulated device needs a positive capacity");
  holes_.emplace(kAddressSpaceBegin, static_cast<Bytes>(kAddressSpaceEnd - kAddressSpaceBegin));
}

void SimulatedDevice::copy_from_host(void*, const void*, Bytes) {
  MEMPLAN_CHECK(false, "the simulated device has no memory to copy into");
}

void SimulatedDevice::copy_to_host(void*, const void*, Bytes) {
  MEMPLAN_CHECK(false, "the simulated device has no memory to copy from");
}

DeviceMemoryInfo SimulatedDevice::memory_info() const {
  return DeviceMemoryInfo{capacity_bytes_, capacity_bytes_ - sim_stats_.physical_bytes_in_use};
}

DeviceAddress SimulatedDevice::take_address_range(Bytes size_bytes) {
  const Bytes span = align_up(std::max<Bytes>(size_bytes, 1), kPageGranularity);
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    if (it->second < span) continue;
    const DeviceAddress start = it->first;
    const Bytes rest = it->second - span;
    holes_.erase(it);
    if (rest > 0) holes_.emplace(start + static_cast<DeviceAddress>(span), rest);
    return start;
  }
  return 0;
}

void SimulatedDevice::give_back_address_range(DeviceAddress base, Bytes size_bytes) {
  Bytes span = align_up(std::max<Bytes>(size_bytes, 1), kPageGranularity);
  DeviceAddress start = base;
  auto next = holes_.lower_bound(base);
  if (next != holes_.end() && base + static_cast<DeviceAddress>(span) == next->first) {
    span += next->second;
    next = holes_.erase(next);
  }
  if (next != holes_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + static_cast<DeviceAddress>(prev->second) == base) {
      start = prev->first;
      span += prev->second;
      holes_.erase(prev);
    }
  }
  holes_.emplace(start, span);
}

void SimulatedDevice::add_physical(Bytes size_bytes) {
  sim_stats_.physical_bytes_in_use += size_bytes;
  sim_stats_.peak_physical_bytes =
      std::max(sim_stats_.peak_physical_bytes, sim_stats_.physical_bytes_in_use);
}

void* SimulatedDevice::raw_allocate(Bytes size_bytes) {
  if (sim_stats_.physical_bytes_in_use + size_bytes > capacity_bytes_) return nullptr;
  const DeviceAddress start = take_address_range(size_bytes);
  if (start == 0) return nullptr;
  allocations_.emplace(start, size_bytes);
  add_physical(size_bytes);
  return to_pointer(start);
}

void SimulatedDevice::raw_deallocate(void* ptr) {
  auto it = allocations_.find(to_address(ptr));
  MEMPLAN_CHECK(it != allocations_.end(), "deallocate of an address the simulated device did not hand out");
  sim_stats_.physical_bytes_in_use -= it->second;
  give_back_address_range(it->first, it->second);
  allocations_.erase(it);
}

Result<DeviceAddress> SimulatedDevice::reserve_address_range(Bytes size_bytes) {
  MEMPLAN_CHECK(size_bytes > 0 && size_bytes % kPageGranularity == 0,
                "reservation size " << size_bytes << " is not a positive multiple of the granularity");
  const DeviceAddress base = take_address_range(size_bytes);
  if (base == 0) {
    return Error{"simulated device " + name_ + ": address space exhausted reserving " +
                 std::to_string(size_bytes) + " bytes"};
  }
  Reservation r;
  r.size_bytes = size_bytes;
  r.page_mapped.assign(static_cast<std::size_t>(size_bytes / kPageGranularity), false);
  reservations_.emplace(base, std::move(r));
  ++sim_stats_.reservations;
  return base;
}

void SimulatedDevice::release_address_range(DeviceAddress base) {
  auto it = reservations_.find(base);
  MEMPLAN_CHECK(it != reservations_.end(), "release of an address range that was not reserved");
  MEMPLAN_CHECK(std::none_of(it->second.page_mapped.begin(), it->second.page_mapped.end(),
                             [](bool mapped) { return mapped; }),
                "release of an address range with pages still mapped");
  give_back_address_range(base, it->second.size_bytes);
  reservations_.erase(it);
  --sim_stats_.reservations;
}

SimulatedDevice::Reservation& SimulatedDevice::reservation_containing(DeviceAddress address, Bytes size_bytes,
                                                                      DeviceAddress* base) {
  MEMPLAN_CHECK(size_bytes > 0 && size_bytes % kPageGranularity == 0 && address % kPageGranularity == 0,
                "map/unmap range is not granularity-aligned");
  auto it = reservations_.upper_bound(address);
  MEMPLAN_CHECK(it != reservations_.begin(), "map/unmap outside any reservation");
  --it;
  MEMPLAN_CHECK(address + static_cast<DeviceAddress>(size_bytes) <=
                    it->first + static_cast<DeviceAddress>(it->second.size_bytes),
                "map/unmap range runs past its reservation");
  *base = it->first;
  return it->second;
}

Status SimulatedDevice::map_pages(DeviceAddress address, Bytes size_bytes) {
  DeviceAddress base = 0;
  Reservation& r = reservation_containing(address, size_bytes, &base);
  const std::size_t first = static_cast<std::size_t>((address - base) / kPageGranularity);
  const std::size_t count = static_cast<std::size_t>(size_bytes / kPageGranularity);
  for (std::size_t i = first; i < first + count; ++i) {
    MEMPLAN_CHECK(!r.page_mapped[i], "map of a page that is already mapped");
  }
  if (sim_stats_.physical_bytes_in_use + size_bytes > capacity_bytes_) {
    return Error{"simulated device " + name_ + ": out of memory mapping " + std::to_string(size_bytes) +
                 " bytes with " + std::to_string(sim_stats_.physical_bytes_in_use) + " of " +
                 std::to_string(capacity_bytes_) + " in use"};
  }
  for (std::size_t i = first; i < first + count; ++i) r.page_mapped[i] = true;
  add_physical(size_bytes);
  sim_stats_.mapped_bytes += size_bytes;
  ++sim_stats_.map_calls;
  return Status::success();
}

void SimulatedDevice::unmap_pages(DeviceAddress address, Bytes size_bytes) {
  DeviceAddress base = 0;
  Reservation& r = reservation_containing(address, size_bytes, &base);
  const std::size_t first = static_cast<std::size_t>((address - base) / kPageGranularity);
  const std::size_t count = static_cast<std::size_t>(size_bytes / kPageGranularity);
  for (std::size_t i = first; i < first + count; ++i) {
    MEMPLAN_CHECK(r.page_mapped[i], "unmap of a page that is not mapped");
    r.page_mapped[i] = false;
  }
  sim_stats_.physical_bytes_in_use -= size_bytes;
  sim_stats_.mapped_bytes -= size_bytes;
  ++sim_stats_.unmap_calls;
}

}  // namespace memplan::runtime
