// The kernel interface: one function per (op kind, device kind), found in one dispatch table.
// Kernels get raw pointers and shapes that the executor has already validated; they allocate
// nothing and know nothing of graphs or plans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string_view>
#include <vector>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
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
  std::uint8_t* u8() const { return static_cast<std::uint8_t*>(data); }
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
  // Scratch the plan set aside for kernels (its workspace, inside the arena when planned), past
  // the device's own part (cuBLAS's): 16-bit ops widened to f32 copy their operands here
  // (graph/mixed_precision.h), and an op with scratch of its own (OpInfo::scratch) finds it at
  // the start, after the copies.
  std::span<std::byte> workspace;
  // fp16 loss scaling (graph/mixed_precision.h): the loss gradient's seed is multiplied by it and
  // the mixed updates divide it out of their gradients (a power of two: exact); 1 otherwise.
  double loss_scale = 1.0;
  // The first row of the op's outputs this call writes: an op the widening adapter computes a
  // slice of rows at a time whose inputs are not sliced with it (embedding_backward: every
  // position is read, those whose id falls in the slice are summed). 0 otherwise.
  std::int64_t first_row = 0;
  // The op adds into its outputs rather than writing them (an op with OpInfo::sums_rows computed
  // a slice of rows at a time: every slice after the first); false otherwise.
  bool accumulate = false;
  float lr() const { return static_cast<float>(double(attrs->lr) * lr_scale); }
};

using KernelFn = void (*)(const KernelCall&);

// One kernel under its key: each kernel file lists the kernels it defines beside them (its
// `..._kernel_entries()`), and the dispatch table takes every file's list. A key registered
// twice is an error when the table is built (the first kernel lookup), not a silent overwrite.
struct KernelEntry {
  graph::OpKind kind = graph::OpKind::count_;
  KernelFn fn = nullptr;
  graph::DType dtype = graph::DType::f32;  // the dtype of the op's floating operands
};
using KernelEntries = std::vector<KernelEntry>;

// Two ops adjacent in the schedule, the second reading the first's output, run as one: the
// result is bitwise what the two kernels give one after the other, with the intermediate read
// back while in cache. Only where their tensors do not overlap in memory (the executor checks),
// since the second writes its output while the first still reads its inputs.
using FusedKernelFn = void (*)(const KernelCall& first, const KernelCall& second);
struct FusedKernel {
  FusedKernelFn fn = nullptr;
  // The first op's output serves as the kernel's scratch and holds no defined values after it:
  // the executor fuses such a pair only where the second op is that output's one reader.
  bool first_output_is_scratch = false;
  // The kernel works through the samples (dimension 0) in waves, writing the second op's
  // output for a wave only once the first op has read its first input for that wave's samples:
  // the output may overlap that input wherever sample_wave_order finds an order (e.g. a
  // gradient planned where the incoming gradient was).
  bool sample_waves = false;
};

// The order of samples in which writing `out` never overwrites an `in` sample still to be read,
// when sample i of each is its i-th slice of equal bytes: ascending where every out sample
// overlaps only in samples at or before its index (or nothing at all), descending where only
// those at or after it, none otherwise.
enum class SampleOrder { none, ascending, descending };
SampleOrder sample_wave_order(const void* out, std::int64_t out_bytes, const void* in, std::int64_t in_bytes,
                              std::int64_t samples);

// Whether this build holds the CUDA kernels (the CUDA toolkit was found at configure time).
bool built_with_cuda();

// The kernel for (kind, device, dtype), or nullptr when that device has none.
KernelFn find_kernel(graph::OpKind kind, DeviceKind device, graph::DType dtype = graph::DType::f32);
// Every op `device` has no kernel for at `dtype`, in OpKind order (what an executor on that
// device would refuse; the CUDA coverage test reads it).
std::vector<graph::OpKind> missing_kernels(DeviceKind device, graph::DType dtype = graph::DType::f32);
// The op kinds `device` computes at 16 bits in kernels of its own; its other 16-bit kernels
// compute in f32 copies of their operands (kernels/shared/widened_call.h), which the plan's
// workspace holds (planner::DeviceProfile::native_16bit_ops documents the same lists).
std::vector<graph::OpKind> native_16bit_ops(DeviceKind device);
// Whether `device` has a kernel for every op of `graph` at the op's dtype (graph::op_dtype). The
// error names the first op without one, its kind and dtype, every kind lacking one, and what
// would run instead (the CPU, or fp32), so a step is refused when it is planned, not at setup.
Status check_kernels_for(const graph::Graph& graph, DeviceKind device);

// The dispatch table of the given entries, one list per device kind: throws (InternalError,
// naming the op, device and dtype) when a key is registered twice. Exposed for tests.
class KernelTable {
 public:
  explicit KernelTable(std::span<const KernelEntries> per_device);
  KernelFn find(graph::OpKind kind, DeviceKind device, graph::DType dtype) const;

 private:
  static constexpr int kDeviceKinds = static_cast<int>(std::size(kDeviceKindNames));
  static constexpr int kDTypes = static_cast<int>(graph::DType::i64) + 1;  // graph::DType's values
  std::vector<KernelFn> fns_;        // [kind][device][dtype]
  static std::size_t index(graph::OpKind kind, DeviceKind device, graph::DType dtype);
};
// The fused kernel for `first` then `second` on `device` (fn nullptr where there is none).
FusedKernel find_fused_kernel(graph::OpKind first, graph::OpKind second, DeviceKind device);

// Threads the CPU kernels use (memplan's thread pool, kernels/cpu/parallel.h, which every CPU
// kernel's loops run on); 0 = the default: OMP_NUM_THREADS when set, else every core this process
// may run on.
void set_cpu_threads(int threads);
int cpu_threads();

}  // namespace memplan::kernels
