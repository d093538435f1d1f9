// The CUDA device: every byte of GPU memory memplan uses comes through here. cudaMalloc and
// cudaFree are called from this file only, and counted (DeviceStats), so planned execution's
// "zero allocations during steps" is measured. It also offers the driver's virtual-memory
// primitives (cuMemAddressReserve, cuMemCreate + cuMemMap, ...) for the caching allocator's
// expandable segments, and cudaMemGetInfo. Built only when CUDA is; see devices.h.
#pragma once

#include <map>
#include <string>

#include "memplan/runtime/device.h"
#include "memplan/runtime/virtual_memory.h"

namespace memplan::runtime {

class CudaDevice final : public Device, public VirtualMemoryDevice {
 public:
  // Device 0; creates the CUDA context, stream and library handles. Check cuda_device_present()
  // (devices.h) first: without a device this is a programmer error.
  // A capacity > 0 caps the bytes cudaMalloc'd through allocate() (like CpuDevice's).
  explicit CudaDevice(Bytes capacity_bytes = 0);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  kernels::DeviceKind kind() const override { return kernels::DeviceKind::cuda; }
  std::string name() const override { return name_; }
  void copy_from_host(void* device_dst, const void* host_src, Bytes size_bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, Bytes size_bytes) override;
  Bytes workspace_bytes() const override;
  void attach_workspace(void* ptr, Bytes size_bytes) override;
  void synchronize() override;

  DeviceMemoryInfo memory_info() const override;  // cudaMemGetInfo
  Bytes page_granularity() const override { return granularity_; }
  Result<DeviceAddress> reserve_address_range(Bytes size_bytes) override;
  void release_address_range(DeviceAddress base) override;
  Status map_pages(DeviceAddress address, Bytes size_bytes) override;
  void unmap_pages(DeviceAddress address, Bytes size_bytes) override;

  // Physical pages created and released through map_pages/unmap_pages (cuMemCreate/cuMemRelease).
  std::int64_t pages_created() const { return pages_created_; }
  std::int64_t pages_released() const { return pages_released_; }

 protected:
  void* raw_allocate(Bytes size_bytes) override;  // cudaMalloc; nullptr when out of memory
  void raw_deallocate(void* ptr) override;        // cudaFree

 private:
  std::string name_;
  Bytes capacity_bytes_ = 0;
  Bytes granularity_ = 0;
  std::map<DeviceAddress, Bytes> reservations_;                // base -> size
  std::map<DeviceAddress, unsigned long long> page_handles_;  // page address -> physical handle
  std::int64_t pages_created_ = 0;
  std::int64_t pages_released_ = 0;
};

}  // namespace memplan::runtime
