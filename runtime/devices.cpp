#include "memplan/runtime/devices.h"

#ifdef MEMPLAN_HAVE_CUDA
#include "memplan/kernels/cuda/context.h"
#include "memplan/kernels/cuda/device_query.h"
#include "memplan/runtime/cuda_device.h"
#endif

namespace memplan::runtime {

bool cuda_device_present() {
#ifdef MEMPLAN_HAVE_CUDA
  return kernels::cuda::device_count() > 0;
#else
  return false;
#endif
}

kernels::DeviceKind auto_device_kind() {
  return cuda_device_present() ? kernels::DeviceKind::cuda : kernels::DeviceKind::cpu;
}

Result<kernels::DeviceKind> resolve_device_kind(std::string_view name) {
  if (name == "auto") return auto_device_kind();
  if (auto kind = kernels::parse_device_kind(name)) return kind;
  std::string names;
  for (const auto& row : kernels::kDeviceKindNames) names += std::string(row.name) + ", ";
  return Error{"unknown device '" + std::string(name) + "' (expected " + names.substr(0, names.size() - 2) + " or auto)"};
}

Result<std::unique_ptr<Device>> make_device(kernels::DeviceKind kind, Bytes capacity_bytes) {
  if (kind == kernels::DeviceKind::cpu) return std::unique_ptr<Device>(std::make_unique<CpuDevice>(capacity_bytes));
#ifdef MEMPLAN_HAVE_CUDA
  if (!cuda_device_present()) {
    return Error{"no CUDA device is available (the driver reports no GPU); use --device cpu"};
  }
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(capacity_bytes));
#else
  return Error{"this memplan was built without CUDA (no nvcc at configure time); use --device cpu"};
#endif
}

bool allow_tf32(Device& device, bool allowed) {
  if (device.kind() != kernels::DeviceKind::cuda) return false;
#ifdef MEMPLAN_HAVE_CUDA
  kernels::cuda::set_tf32(allowed);
  return true;
#else
  (void)allowed;
  return false;
#endif
}

planner::DeviceProfile device_profile(const Device& device) {
  const bool cuda = device.kind() == kernels::DeviceKind::cuda;
  planner::DeviceProfile profile = planner::documented_device_profile(cuda ? "cuda" : "cpu").value();
  profile.name = device.name();
  profile.alignment = kDeviceAlignment;
  profile.workspace_bytes = device.workspace_bytes();
  profile.native_16bit_ops = kernels::native_16bit_ops(device.kind());  // what this build's kernels do
  return profile;
}

Result<planner::PlannedStep> plan_step_for(const planner::StepDescription& step, const Device& device,
                                           planner::PlanRequest request) {
  request.device = device_profile(device);
  return planner::plan_step(step, request);
}

}  // namespace memplan::runtime
