// Devices own memory and count every allocation they make, so "zero allocations during steps"
// is a measured number. Out of memory is an expected failure (a Result), not a crash.
#pragma once

#include <cstdint>
#include <string>

#include "memplan/common/result.h"
#include "memplan/common/types.h"
#include "memplan/kernels/kernel.h"

namespace memplan::runtime {

struct DeviceStats {
  std::int64_t allocations = 0;
  std::int64_t frees = 0;
  Bytes bytes_in_use = 0;
  Bytes peak_bytes_in_use = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual kernels::DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // Every byte the runtime uses comes through here. Alignment is at least 256 bytes.
  Result<void*> allocate(Bytes size_bytes);
  void deallocate(void* ptr, Bytes size_bytes);

  virtual void copy_from_host(void* device_dst, const void* host_src, Bytes size_bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, Bytes size_bytes) = 0;

  const DeviceStats& stats() const { return stats_; }

  // Kernel scratch this device wants inside the plan (the CUDA device: its cuBLAS workspace).
  virtual Bytes workspace_bytes() const { return 0; }
  // Where that scratch lives from now on; nullptr detaches it (before its memory is freed).
  virtual void attach_workspace(void* /*ptr*/, Bytes /*size_bytes*/) {}
  // Waits until queued work has finished (timing); CPU kernels run synchronously.
  virtual void synchronize() {}

 protected:
  virtual void* raw_allocate(Bytes size_bytes) = 0;  // nullptr when out of memory
  virtual void raw_deallocate(void* ptr) = 0;

 private:
  DeviceStats stats_;
};

// Host memory. An optional capacity makes out-of-memory testable.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(Bytes capacity_bytes = 0) : capacity_bytes_(capacity_bytes) {}
  kernels::DeviceKind kind() const override { return kernels::DeviceKind::cpu; }
  std::string name() const override { return "cpu"; }
  void copy_from_host(void* device_dst, const void* host_src, Bytes size_bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, Bytes size_bytes) override;

 protected:
  void* raw_allocate(Bytes size_bytes) override;
  void raw_deallocate(void* ptr) override;

 private:
  Bytes capacity_bytes_;  // 0 = unlimited
};

inline constexpr Bytes kDeviceAlignment = 256;

}  // namespace memplan::runtime
