#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "memplan/common/check.h"
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

FusedKernel find_fused_kernel(graph::OpKind first, graph::OpKind second, DeviceKind device) {
  if (device != DeviceKind::cpu) return {};
  static const std::vector<cpu::FusedKernelEntry> entries = [] {
    std::vector<cpu::FusedKernelEntry> list = cpu::nn_fused_kernel_entries();
    // The schedule keeps only graph::fusable_pair's pairs adjacent.
    for (const cpu::FusedKernelEntry& e : list) {
      MEMPLAN_CHECK(graph::fusable_pair(e.first, e.second),
                    "fused kernel for " << graph::op_name(e.first) << " then " << graph::op_name(e.second)
                                        << " is not a graph::fusable_pair");
    }
    return list;
  }();
  for (const cpu::FusedKernelEntry& e : entries) {
    if (e.first == first && e.second == second) return e.kernel;
  }
  return {};
}

SampleOrder sample_wave_order(const void* out, std::int64_t out_bytes, const void* in, std::int64_t in_bytes,
                              std::int64_t samples) {
  const auto o = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(out));
  const auto r = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(in));
  if (o + out_bytes <= r || r + in_bytes <= o) return SampleOrder::ascending;  // apart
  if (samples <= 0 || out_bytes % samples != 0 || in_bytes % samples != 0) return SampleOrder::none;
  const std::int64_t so = out_bytes / samples, si = in_bytes / samples;
  bool ascending = true, descending = true;
  for (std::int64_t i = 0; i < samples; ++i) {
    const std::int64_t lo = std::max(o + i * so, r), hi = std::min(o + (i + 1) * so, r + in_bytes);  // [lo, hi)
    if (lo >= hi) continue;
    ascending = ascending && (hi - 1 - r) / si <= i;
    descending = descending && (lo - r) / si >= i;
  }
  return ascending ? SampleOrder::ascending : descending ? SampleOrder::descending : SampleOrder::none;
}

}  // namespace memplan::kernels
