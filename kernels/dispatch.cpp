#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
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

std::size_t KernelTable::index(graph::OpKind kind, DeviceKind device, graph::DType dtype) {
  return (static_cast<std::size_t>(kind) * kDeviceKinds + static_cast<std::size_t>(device)) * kDTypes +
         static_cast<std::size_t>(dtype);
}

KernelTable::KernelTable(std::span<const KernelEntries> per_device)
    : fns_(static_cast<std::size_t>(graph::kOpKindCount) * kDeviceKinds * kDTypes, nullptr) {
  MEMPLAN_CHECK(per_device.size() <= kDeviceKinds, "kernel lists for " << per_device.size() << " device kinds");
  for (std::size_t d = 0; d < per_device.size(); ++d) {
    const auto device = static_cast<DeviceKind>(d);
    for (const KernelEntry& e : per_device[d]) {
      MEMPLAN_CHECK(static_cast<int>(e.kind) < graph::kOpKindCount && e.fn != nullptr, "a kernel entry without an op or a function");
      KernelFn& slot = fns_[index(e.kind, device, e.dtype)];
      MEMPLAN_CHECK(slot == nullptr, "two kernels registered for op " << graph::op_name(e.kind) << " on "
                                                                     << device_kind_name(device) << " at "
                                                                     << graph::dtype_name(e.dtype));
      slot = e.fn;
    }
  }
}

KernelFn KernelTable::find(graph::OpKind kind, DeviceKind device, graph::DType dtype) const {
  return fns_[index(kind, device, dtype)];
}

namespace {

const KernelTable& table() {
  static const KernelTable instance = [] {
    std::vector<KernelEntries> lists{cpu::kernel_entries()};
#ifdef MEMPLAN_HAVE_CUDA
    lists.push_back(cuda::kernel_entries());
#endif
    return KernelTable(lists);
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

KernelFn find_kernel(graph::OpKind kind, DeviceKind device, graph::DType dtype) {
  return table().find(kind, device, dtype);
}

std::vector<graph::OpKind> native_16bit_ops(DeviceKind device) {
  KernelEntries entries;
  if (device == DeviceKind::cpu) entries = cpu::native_16bit_kernel_entries();
#ifdef MEMPLAN_HAVE_CUDA
  if (device == DeviceKind::cuda) entries = cuda::native_16bit_kernel_entries();
#endif
  std::vector<graph::OpKind> kinds;
  for (const KernelEntry& e : entries) {
    if (graph::is_16bit_float(e.dtype) && std::find(kinds.begin(), kinds.end(), e.kind) == kinds.end()) kinds.push_back(e.kind);
  }
  return kinds;
}

std::vector<graph::OpKind> missing_kernels(DeviceKind device, graph::DType dtype) {
  std::vector<graph::OpKind> missing;
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    if (find_kernel(static_cast<graph::OpKind>(k), device, dtype) == nullptr) missing.push_back(static_cast<graph::OpKind>(k));
  }
  return missing;
}

namespace {

// Whether every op of `graph` has a kernel on `device`, each at `dtype` or, unset, at its own.
bool runs_every_op(const graph::Graph& graph, DeviceKind device, std::optional<graph::DType> dtype) {
  for (const graph::Op& op : graph.ops()) {
    if (find_kernel(op.kind, device, dtype.value_or(graph::op_dtype(graph, op))) == nullptr) return false;
  }
  return true;
}

}  // namespace

Status check_kernels_for(const graph::Graph& graph, DeviceKind device) {
  const graph::Op* first = nullptr;
  graph::DType first_dtype = graph::DType::f32;
  std::set<std::string> kinds;
  for (const graph::Op& op : graph.ops()) {
    const graph::DType dtype = graph::op_dtype(graph, op);
    if (find_kernel(op.kind, device, dtype) != nullptr) continue;
    if (first == nullptr) first = &op, first_dtype = dtype;
    kinds.insert(std::string(graph::op_name(op.kind)) + " (" + std::string(graph::dtype_name(dtype)) + ")");
  }
  if (first == nullptr) return Status::success();
  std::string message = "op '" + first->name + "' (" + std::string(graph::op_name(first->kind)) + ") has no " +
                        std::string(graph::dtype_name(first_dtype)) + " kernel on " + std::string(device_kind_name(device));
  if (kinds.size() > 1) {
    message += "; the kinds " + std::string(device_kind_name(device)) + " lacks for this step:";
    for (const std::string& k : kinds) message += " " + k;
  }
  std::string instead;
  if (device != DeviceKind::cpu && runs_every_op(graph, DeviceKind::cpu, std::nullopt)) instead = "--device cpu";
  if (first_dtype != graph::DType::f32 && runs_every_op(graph, device, graph::DType::f32)) {
    instead += (instead.empty() ? "" : " or ") + std::string("--dtype fp32");
  }
  return Error{message + (instead.empty() ? "" : ": use " + instead)};
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
