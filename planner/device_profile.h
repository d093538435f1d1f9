// What a device adds to a plan: the granularity it allocates in, the kernel scratch it wants
// inside the arena, and the memory its runtime uses outside the arena. A real device supplies
// its own (runtime::device_profile); planning for a device that is not here (`memplan fit
// --device cuda` on a laptop) uses the documented table below. "Does it fit?" is one predicate
// over a profile: the arena plus the overheads within the device's memory.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"
#include "memplan/graph/op.h"

namespace memplan::planner {

struct Overhead {
  std::string what;
  Bytes bytes = 0;
};

struct DeviceProfile {
  std::string name = "cpu";
  Bytes alignment = 256;       // the device rounds an allocation up to this
  Bytes workspace_bytes = 0;   // kernel scratch placed inside the arena (cuBLAS workspace)
  // 16-bit ops run on f32 copies of their operands, made in the workspace after the device's own
  // scratch: the plan's workspace grows by the most any op of the step widens, leaving out the
  // op kinds the device computes at 16 bits itself (kernels::native_16bit_ops lists a backend's).
  bool widens_16bit = true;
  std::vector<graph::OpKind> native_16bit_ops;
  std::vector<Overhead> overheads;  // runtime memory outside the arena (CUDA context, handles)

  Bytes overhead_bytes() const;
  // What the device holds for an arena: the arena as the device allocates it, plus overheads.
  Bytes total_bytes(Bytes arena_bytes) const;
  // The one "fits" predicate: total_bytes(arena) <= device_memory.
  bool fits(Bytes arena_bytes, Bytes device_memory) const { return total_bytes(arena_bytes) <= device_memory; }
  // The largest arena that fits in device_memory (0 when the overheads alone do not).
  Bytes arena_budget(Bytes device_memory) const;
};

// The kernel workspace the CUDA backend places in the arena: cuBLAS's recommended workspace
// for Hopper (32 MiB), which also covers the kernels' own scratch. The CUDA device reports this
// value (runtime/cuda_device.cpp checks it against the kernels' constant at compile time).
inline constexpr Bytes kCudaWorkspaceBytes = Bytes{32} << 20;

// The documented profile of a device kind, for planning without the device: "cpu" (no
// workspace, no overheads) or "cuda": the workspace above inside the arena and, outside it, a
// CUDA context of 586 MiB, the cuBLAS handle 8 MiB and the cuDNN handle 16 MiB: 610 MiB in all,
// as measured with memplan's kernels loaded on an H200 (driver 580, CUDA 13). It varies with
// the driver, the card and the modules loaded: `--overhead` overrides it.
Result<DeviceProfile> documented_device_profile(std::string_view kind);

}  // namespace memplan::planner
