#include "memplan/runtime/cuda_device.h"

#include <cuda.h>

#include <algorithm>

#include "memplan/kernels/cuda/context.h"
#include "memplan/planner/device_profile.h"

namespace memplan::runtime {

namespace kc = kernels::cuda;

namespace {

// The driver's virtual-memory entry points, looked up through the runtime so that memplan does
// not link libcuda (machines without a driver can still run the CPU path).
struct DriverVm {
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
};

template <typename Fn>
void lookup(const char* symbol, Fn& fn) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found{};
  MEMPLAN_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &ptr, 12000, cudaEnableDefault, &found));
  MEMPLAN_CHECK(found == cudaDriverEntryPointSuccess && ptr != nullptr, "the CUDA driver lacks " << symbol);
  fn = reinterpret_cast<Fn>(ptr);
}

const DriverVm& driver_vm() {
  static const DriverVm vm = [] {
    DriverVm v;
    lookup("cuMemAddressReserve", v.reserve);
    lookup("cuMemAddressFree", v.address_free);
    lookup("cuMemCreate", v.create);
    lookup("cuMemRelease", v.release);
    lookup("cuMemMap", v.map);
    lookup("cuMemUnmap", v.unmap);
    lookup("cuMemSetAccess", v.set_access);
    lookup("cuMemGetAllocationGranularity", v.granularity);
    return v;
  }();
  return vm;
}

CUmemAllocationProp page_properties(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

#define MEMPLAN_CU_CHECK(expr)                                                   \
  do {                                                                           \
    const CUresult memplan_cu_status_ = (expr);                                  \
    MEMPLAN_CHECK(memplan_cu_status_ == CUDA_SUCCESS, "CUDA driver error " << int(memplan_cu_status_)); \
  } while (0)

}  // namespace

CudaDevice::CudaDevice(Bytes capacity_bytes) : capacity_bytes_(capacity_bytes) {
  kc::Context& ctx = kc::context();
  cudaDeviceProp prop{};
  MEMPLAN_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx.device));
  name_ = "cuda:" + std::to_string(ctx.device) + " (" + prop.name + ")";
  const CUmemAllocationProp page = page_properties(ctx.device);
  std::size_t g = 0;
  MEMPLAN_CU_CHECK(driver_vm().granularity(&g, &page, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  granularity_ = static_cast<Bytes>(g);
}

CudaDevice::~CudaDevice() {
  // Pages or reservations still held belong to an allocator that outlived its device: a bug,
  // but the memory is returned rather than leaked.
  for (const auto& [address, handle] : page_handles_) {
    driver_vm().unmap(address, static_cast<std::size_t>(granularity_));
    driver_vm().release(handle);
  }
  for (const auto& [base, size] : reservations_) driver_vm().address_free(base, static_cast<std::size_t>(size));
}

void* CudaDevice::raw_allocate(Bytes size_bytes) {
  if (capacity_bytes_ > 0 && stats().bytes_in_use + size_bytes > capacity_bytes_) return nullptr;
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, static_cast<std::size_t>(size_bytes));
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
    return nullptr;
  }
  MEMPLAN_CUDA_CHECK(status);
  return ptr;
}

void CudaDevice::raw_deallocate(void* ptr) { MEMPLAN_CUDA_CHECK(cudaFree(ptr)); }

void CudaDevice::copy_from_host(void* device_dst, const void* host_src, Bytes size_bytes) {
  const cudaStream_t s = kc::context().stream;
  MEMPLAN_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, static_cast<std::size_t>(size_bytes), cudaMemcpyHostToDevice, s));
  MEMPLAN_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer may be reused at once
}

void CudaDevice::copy_to_host(void* host_dst, const void* device_src, Bytes size_bytes) {
  const cudaStream_t s = kc::context().stream;
  MEMPLAN_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, static_cast<std::size_t>(size_bytes), cudaMemcpyDeviceToHost, s));
  MEMPLAN_CUDA_CHECK(cudaStreamSynchronize(s));
}

// `memplan fit --device cuda` plans with the documented profile; it must ask for exactly the
// workspace this device places in the arena.
static_assert(static_cast<Bytes>(kc::kWorkspaceBytes) == planner::kCudaWorkspaceBytes,
              "the documented CUDA profile's workspace differs from the CUDA device's");
Bytes CudaDevice::workspace_bytes() const { return static_cast<Bytes>(kc::kWorkspaceBytes); }

void CudaDevice::attach_workspace(void* ptr, Bytes size_bytes) {
  // cuBLAS and the kernels' scratch take the first kWorkspaceBytes; what follows holds the f32
  // copies of 16-bit ops computed by widening (kernels/cuda/mixed_precision.cu).
  kc::set_workspace(ptr, static_cast<std::size_t>(std::min(size_bytes, workspace_bytes())));
}

void CudaDevice::synchronize() { MEMPLAN_CUDA_CHECK(cudaStreamSynchronize(kc::context().stream)); }

DeviceMemoryInfo CudaDevice::memory_info() const {
  std::size_t free_bytes = 0, total_bytes = 0;
  MEMPLAN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return DeviceMemoryInfo{static_cast<Bytes>(total_bytes), static_cast<Bytes>(free_bytes)};
}

Result<DeviceAddress> CudaDevice::reserve_address_range(Bytes size_bytes) {
  CUdeviceptr base = 0;
  if (driver_vm().reserve(&base, static_cast<std::size_t>(size_bytes), 0, 0, 0) != CUDA_SUCCESS) {
    return Error{"cannot reserve " + std::to_string(size_bytes) + " bytes of device address space"};
  }
  reservations_[base] = size_bytes;
  return static_cast<DeviceAddress>(base);
}

void CudaDevice::release_address_range(DeviceAddress base) {
  auto it = reservations_.find(base);
  MEMPLAN_CHECK(it != reservations_.end(), "no reservation at " << base);
  MEMPLAN_CU_CHECK(driver_vm().address_free(base, static_cast<std::size_t>(it->second)));
  reservations_.erase(it);
}

// One physical allocation per granularity page, so any page-aligned range can be unmapped later
// regardless of how it was mapped.
Status CudaDevice::map_pages(DeviceAddress address, Bytes size_bytes) {
  MEMPLAN_CHECK(granularity_ > 0 && address % static_cast<DeviceAddress>(granularity_) == 0 && size_bytes % granularity_ == 0,
                "map_pages needs granularity-aligned ranges");
  const int device = kc::context().device;
  const CUmemAllocationProp prop = page_properties(device);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const auto page = static_cast<std::size_t>(granularity_);
  for (Bytes done = 0; done < size_bytes; done += granularity_) {
    CUmemGenericAllocationHandle handle = 0;
    if (driver_vm().create(&handle, page, &prop, 0) != CUDA_SUCCESS) {
      if (done > 0) unmap_pages(address, done);  // all or nothing
      return Error{"out of memory on " + name_ + ": cannot back " + std::to_string(size_bytes) + " bytes with pages"};
    }
    const DeviceAddress at = address + static_cast<DeviceAddress>(done);
    MEMPLAN_CU_CHECK(driver_vm().map(at, page, 0, handle, 0));
    MEMPLAN_CU_CHECK(driver_vm().set_access(at, page, &access, 1));
    page_handles_[at] = handle;
    ++pages_created_;
  }
  return Status::success();
}

void CudaDevice::unmap_pages(DeviceAddress address, Bytes size_bytes) {
  MEMPLAN_CUDA_CHECK(cudaStreamSynchronize(kc::context().stream));  // no kernel may still use them
  for (Bytes done = 0; done < size_bytes; done += granularity_) {
    const DeviceAddress at = address + static_cast<DeviceAddress>(done);
    auto it = page_handles_.find(at);
    MEMPLAN_CHECK(it != page_handles_.end(), "unmapping a page that is not mapped at " << at);
    MEMPLAN_CU_CHECK(driver_vm().unmap(at, static_cast<std::size_t>(granularity_)));
    MEMPLAN_CU_CHECK(driver_vm().release(it->second));
    page_handles_.erase(it);
    ++pages_released_;
  }
}

}  // namespace memplan::runtime
