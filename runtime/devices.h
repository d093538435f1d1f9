// Choosing a device without including any CUDA header: whether a GPU is usable, and a device
// of a given kind. In builds without CUDA, cuda_device_present() is false.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "memplan/common/result.h"
#include "memplan/planner/device_profile.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/device.h"

namespace memplan::runtime {

// True when this build has the CUDA backend and the driver reports at least one GPU.
bool cuda_device_present();

// What --device auto picks: cuda when present, else cpu.
kernels::DeviceKind auto_device_kind();
// A device kind by name (kernels::kDeviceKindNames), or "auto" (auto_device_kind()).
Result<kernels::DeviceKind> resolve_device_kind(std::string_view name);

// A device of that kind; an Error (naming what is missing) when CUDA is asked for but absent.
// A capacity > 0 caps what the device hands out (out-of-memory becomes testable).
Result<std::unique_ptr<Device>> make_device(kernels::DeviceKind kind, Bytes capacity_bytes = 0);
// Lets the device's fp32 GEMMs use TF32 tensor cores (a CUDA GPU; off until allowed). false on
// a device without TF32 (the CPU), which changes nothing.
bool allow_tf32(Device& device, bool allowed);

// The profile plan_step plans for this device: its alignment and kernel workspace (inside the
// arena), and the documented runtime overheads of its kind (outside the arena).
planner::DeviceProfile device_profile(const Device& device);

// plan_step for this device: the request with its device profile set to device_profile(device).
Result<planner::PlannedStep> plan_step_for(const planner::StepDescription& step, const Device& device,
                                           planner::PlanRequest request = {});

}  // namespace memplan::runtime
