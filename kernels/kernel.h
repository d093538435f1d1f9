// The kernel interface: one function per (op kind, device kind), found in one dispatch table.
// Kernels get raw pointers and shapes that the executor has already validated; they allocate
// nothing and know nothing of graphs or plans.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/graph/op.h"
#include "memplan/graph/tensor.h"

namespace memplan::dist {
class Communicator;
}

namespace memplan::kernels {

enum class DeviceKind : std::uint8_t { cpu, cuda };
// The names --device takes (train also takes "auto", runtime/devices.h) and reports print.
inline constexpr EnumName<DeviceKind> kDeviceKindNames[] = {{"cpu", DeviceKind::cpu}, {"cuda", DeviceKind::cuda}};
std::string_view device_kind_name(DeviceKind kind);
Result<DeviceKind> parse_device_kind(std::string_view name);

struct TensorRef {
  void* data = nullptr;
  const graph::Shape* shape = nullptr;
  graph::DType dtype = graph::DType::f32;

  float* f32() const { return static_cast<float*>(data); }
  std::int32_t* i32() const { return static_cast<std::int32_t*>(data); }
  std::int64_t numel() const { return shape->numel(); }
};

struct KernelCall {
  graph::OpKind kind;
  const graph::OpAttrs* attrs = nullptr;
  std::span<const TensorRef> inputs;
  std::span<const TensorRef> outputs;
  std::span<const TensorRef> updates;
  std::int64_t step = 1;  // 1-based optimizer step (AdamW's bias correction, dropout masks' stream)
  // The ranks collectives (all_reduce, reduce_scatter, all_gather*) run over; the executor checks
  // at setup that a graph with collectives has one of the graph's world size.
  dist::Communicator* communicator = nullptr;
  // The learning-rate schedule's factor for this step (runtime/lr_schedule.h): the optimizer
  // updates use attrs->lr times it, computed in double and rounded once (1 changes no bit).
  double lr_scale = 1.0;
  float lr() const { return static_cast<float>(double(attrs->lr) * lr_scale); }
};

using KernelFn = void (*)(const KernelCall&);

// Two ops adjacent in the schedule, the second reading the first's output, run as one: the
// result is bitwise what the two kernels give one after the other, with the intermediate read
// back while in cache. Only where their tensors do not overlap in memory (the executor checks),
// since the second writes its output while the first still reads its inputs.
using FusedKernelFn = void (*)(const KernelCall& first, const KernelCall& second);

// Whether this build holds the CUDA kernels (the CUDA toolkit was found at configure time).
bool built_with_cuda();

// The kernel for (kind, device), or nullptr when that device has none.
KernelFn find_kernel(graph::OpKind kind, DeviceKind device);
// The fused kernel for `first` then `second` on `device`, or nullptr.
FusedKernelFn find_fused_kernel(graph::OpKind first, graph::OpKind second, DeviceKind device);

// Threads the CPU kernels use (Eigen GEMM and the OpenMP loops, for parallel regions this thread
// starts); 0 = OpenMP's default (OMP_NUM_THREADS, else all cores).
void set_cpu_threads(int threads);
int cpu_threads();

}  // namespace memplan::kernels
