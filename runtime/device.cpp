#include "memplan/runtime/device.h"

#include <cstdlib>
#include <cstring>

namespace memplan::runtime {

Result<void*> Device::allocate(Bytes size_bytes) {
  MEMPLAN_CHECK(size_bytes >= 0, "negative allocation");
  const Bytes rounded = align_up(std::max<Bytes>(size_bytes, 1), kDeviceAlignment);
  void* ptr = raw_allocate(rounded);
  if (ptr == nullptr) {
    return Error{"out of memory on " + name() + ": tried to allocate " + std::to_string(rounded) +
                 " bytes with " + std::to_string(stats_.bytes_in_use) + " bytes in use"};
  }
  ++stats_.allocations;
  stats_.bytes_in_use += rounded;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return ptr;
}

void Device::deallocate(void* ptr, Bytes size_bytes) {
  if (ptr == nullptr) return;
  raw_deallocate(ptr);
  ++stats_.frees;
  stats_.bytes_in_use -= align_up(std::max<Bytes>(size_bytes, 1), kDeviceAlignment);
}

void* CpuDevice::raw_allocate(Bytes size_bytes) {
  if (capacity_bytes_ > 0 && stats().bytes_in_use + size_bytes > capacity_bytes_) return nullptr;
  return std::aligned_alloc(static_cast<std::size_t>(kDeviceAlignment),
                            static_cast<std::size_t>(size_bytes));
}

void CpuDevice::raw_deallocate(void* ptr) { std::free(ptr); }

void CpuDevice::copy_from_host(void* device_dst, const void* host_src, Bytes size_bytes) {
  std::memcpy(device_dst, host_src, static_cast<std::size_t>(size_bytes));
}

void CpuDevice::copy_to_host(void* host_dst, const void* device_src, Bytes size_bytes) {
  std::memcpy(host_dst, device_src, static_cast<std::size_t>(size_bytes));
}

}  // namespace memplan::runtime
