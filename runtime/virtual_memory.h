// Optional device capabilities the caching allocator uses beyond Device::allocate: the driver's
// memory query (cudaMemGetInfo) and virtual-memory management (reserve an address range, back
// pages of it with physical memory, release them), which expandable segments are built on.
// SimulatedDevice implements both; a CUDA device would map them onto cuMemAddressReserve,
// cuMemCreate + cuMemMap + cuMemSetAccess, cuMemUnmap + cuMemRelease and cuMemAddressFree.
#pragma once

#include <cstdint>

#include "memplan/common/result.h"
#include "memplan/common/types.h"

namespace memplan::runtime {

// An address in device memory. Plain integer: it may have no memory behind it (simulation).
using DeviceAddress = std::uint64_t;

struct DeviceMemoryInfo {
  Bytes total_bytes = 0;  // capacity of the device
  Bytes free_bytes = 0;   // capacity not backed by any allocation or mapping
};

class DeviceMemoryQuery {
 public:
  virtual ~DeviceMemoryQuery() = default;
  virtual DeviceMemoryInfo memory_info() const = 0;
};

class VirtualMemoryDevice : public DeviceMemoryQuery {
 public:
  // Physical pages are mapped in multiples of this many bytes (2 MiB on current GPUs).
  virtual Bytes page_granularity() const = 0;

  // Reserves `size_bytes` (a multiple of the granularity) of address space with nothing mapped.
  // Fails only when the address space itself is exhausted.
  virtual Result<DeviceAddress> reserve_address_range(Bytes size_bytes) = 0;
  // Releases a whole reservation; every page in it must already be unmapped.
  virtual void release_address_range(DeviceAddress base) = 0;

  // Backs [address, address + size_bytes) of a reservation with physical memory. Both are
  // multiples of the granularity and the range must be unmapped. All or nothing: out of memory
  // maps nothing and returns an error.
  virtual Status map_pages(DeviceAddress address, Bytes size_bytes) = 0;
  // Returns the physical memory behind a mapped, granularity-aligned range.
  virtual void unmap_pages(DeviceAddress address, Bytes size_bytes) = 0;
};

}  // namespace memplan::runtime
