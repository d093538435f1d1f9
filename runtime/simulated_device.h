// A device that hands out addresses with no memory behind them, so allocators can be replayed
// for models of any size in seconds. It models a GPU's capacity (plain allocations and mapped
// pages both count against it) and its address space (first fit, granularity-aligned), and
// implements the virtual-memory primitives expandable segments need. Its addresses must never
// be dereferenced: copies to or from it are programmer errors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "memplan/runtime/device.h"
#include "memplan/runtime/virtual_memory.h"

namespace memplan::runtime {

struct SimulatedDeviceStats {
  Bytes physical_bytes_in_use = 0;  // plain allocations + mapped pages
  Bytes peak_physical_bytes = 0;
  Bytes mapped_bytes = 0;           // the part of physical_bytes_in_use that is mapped pages
  std::int64_t map_calls = 0;
  std::int64_t unmap_calls = 0;
  std::int64_t reservations = 0;    // address ranges currently reserved
};

class SimulatedDevice final : public Device, public VirtualMemoryDevice {
 public:
  static constexpr Bytes kPageGranularity = Bytes{2} << 20;  // 2 MiB, as on current GPUs

  explicit SimulatedDevice(Bytes capacity_bytes, std::string name = "simulated");

  kernels::DeviceKind kind() const override { return kernels::DeviceKind::cuda; }
  std::string name() const override { return name_; }
  void copy_from_host(void* device_dst, const void* host_src, Bytes size_bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, Bytes size_bytes) override;

  DeviceMemoryInfo memory_info() const override;
  Bytes page_granularity() const override { return kPageGranularity; }
  Result<DeviceAddress> reserve_address_range(Bytes size_bytes) override;
  void release_address_range(DeviceAddress base) override;
  Status map_pages(DeviceAddress address, Bytes size_bytes) override;
  void unmap_pages(DeviceAddress address, Bytes size_bytes) override;

  Bytes capacity_bytes() const { return capacity_bytes_; }
  const SimulatedDeviceStats& simulated_stats() const { return sim_stats_; }

 protected:
  void* raw_allocate(Bytes size_bytes) override;
  void raw_deallocate(void* ptr) override;

 private:
  struct Reservation {
    Bytes size_bytes = 0;
    std::vector<bool> page_mapped;  // one flag per granule
  };

  // Address space: first fit over the holes, every range granularity-aligned.
  DeviceAddress take_address_range(Bytes size_bytes);  // 0 when exhausted
  void give_back_address_range(DeviceAddress base, Bytes size_bytes);
  Reservation& reservation_containing(DeviceAddress address, Bytes size_bytes, DeviceAddress* base);
  void add_physical(Bytes size_bytes);

  Bytes capacity_bytes_;
  std::string name_;
  std::map<DeviceAddress, Bytes> holes_;                    // start -> size, disjoint, coalesced
  std::unordered_map<DeviceAddress, Bytes> allocations_;    // plain allocations: start -> size
  std::map<DeviceAddress, Reservation> reservations_;       // base -> reservation
  SimulatedDeviceStats sim_stats_;
};

}  // namespace memplan::runtime
