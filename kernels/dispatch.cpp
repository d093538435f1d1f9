#include <array>
#include <vector>

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/kernel.h"
#ifdef MEMPLAN_HAVE_CUDA
#include "memplan/kernels/cuda/cuda_kernels.h"
#endif

namespace memplan::kernels {

std::string_view device_kind_name(DeviceKind kind) { return enum_name(kDeviceKindNames, kind); }

Result<DeviceKind> parse_device_kind(std::string_view name) { return parse_enum(kDeviceKindNames, name, "device"); }

namespace {

constexpr int kDeviceKinds = 2;
using Table = std::array<std::array<KernelFn, kDeviceKinds>, graph::kOpKindCount>;

const Table& table() {
  static const Table instance = [] {
    Table t{};
    for (const auto& [kind, fn] : cpu::kernel_entries()) {
      t[static_cast<std::size_t>(kind)][static_cast<std::size_t>(DeviceKind::cpu)] = fn;
    }
#ifdef MEMPLAN_HAVE_CUDA
    for (const auto& [kind, fn] : cuda::kernel_entries()) {
      t[static_cast<std::size_t>(kind)][static_cast<std::size_t>(DeviceKind::cuda)] = fn;
    }
#endif
    return t;
  }();
  return instance;
}

}  // namespace

bool built_with_cuda() {
#ifdef MEMPLAN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

KernelFn find_kernel(graph::OpKind kind, DeviceKind device) {
  return table()[static_cast<std::size_t>(kind)][static_cast<std::size_t>(device)];
}

FusedKernelFn find_fused_kernel(graph::OpKind first, graph::OpKind second, DeviceKind device) {
  if (device != DeviceKind::cpu) return nullptr;
  static const std::vector<cpu::FusedKernelEntry> entries = cpu::nn_fused_kernel_entries();
  for (const cpu::FusedKernelEntry& e : entries) {
    if (e.first == first && e.second == second) return e.fn;
  }
  return nullptr;
}

}  // namespace memplan::kernels
