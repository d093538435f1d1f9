// Runs a planned training step (planner::plan_step) on a device in schedule order. The executor
// never plans: every mode walks the plan's one list of allocation events
// (planner/allocation_events.h) and differs only in where a buffer is placed:
//   planned: one device allocation at setup for the whole arena of a MemoryPlan; every tensor
//            is a view at its planned offset; zero device allocations during steps;
//   naive:   every buffer gets its own device allocation when first written, freed after its
//            last use (the reference the plan must match bit for bit);
//   dynamic: the same allocations and frees go through a PyTorch-style caching allocator, as
//            eager frameworks run today.
// All modes run the same schedule and give bitwise-identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/dist/communicator.h"
#include "memplan/graph/graph.h"
#include "memplan/kernels/kernel.h"
#include "memplan/planner/allocation_events.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/step_profile.h"

namespace memplan::runtime {

enum class ExecutionMode { naive, planned, dynamic };

// The names --mode takes and reports print (common/enum_names.h).
inline constexpr EnumName<ExecutionMode> kExecutionModeNames[] = {
    {"planned", ExecutionMode::planned}, {"naive", ExecutionMode::naive}, {"dynamic", ExecutionMode::dynamic}};

std::string_view mode_name(ExecutionMode mode);
Result<ExecutionMode> parse_mode(std::string_view name);

// Debug switches, free when off. Also read from MEMPLAN_DEBUG (comma-separated: poison,guards,finite).
struct DebugOptions {
  bool poison = false;  // fill a buffer with NaN when its lifetime ends; stop at the first op reading NaN
  bool guards = false;  // guard bytes after every buffer, checked after every op
  bool finite = false;  // stop at the first op (schedule order) that reads or writes NaN or infinity
  static DebugOptions from_env();
};

// The gap planned after every buffer when --debug guards checks for overruns.
inline constexpr Bytes kGuardBytes = 64;

struct ExecutorOptions {
  ExecutionMode mode = ExecutionMode::planned;
  DebugOptions debug;  // guards need a plan made with guard bytes (PlanRequest::guard_bytes)
  CachingAllocatorOptions allocator;  // dynamic mode
  // The ranks a data-parallel step's collectives run over (dist/communicator.h); a graph with
  // collectives needs one of its world size. Not owned.
  dist::Communicator* communicator = nullptr;
  // The ranks a tensor-parallel step's collectives with group tensor run over
  // (graph/tensor_parallel.h); needed by a graph that has any. Not owned.
  dist::Communicator* tensor_communicator = nullptr;
  // The ranks an expert-parallel step's token exchanges run over (group expert) and those holding
  // the same experts, whose expert gradients are summed (group expert_data;
  // graph/expert_parallel.h). Not owned.
  dist::Communicator* expert_communicator = nullptr;
  dist::Communicator* expert_data_communicator = nullptr;
  // A test hook: setup() skips validating the plan, so a deliberately wrong plan runs and poison
  // mode can be shown to catch it.
  bool trust_plan = false;
  // Run the pairs of adjacent ops that have a fused kernel as one (kernels/kernel.h:
  // find_fused_kernel; the same bits, better use of the cache). Planned mode without debug
  // checks only, and only where the pair's tensors do not overlap in the arena.
  bool fuse_kernels = true;
};

class Executor {
 public:
  // Prepares to run `plan` of `graph` (which must outlive the executor); nothing is allocated
  // until setup(). In planned mode the plan must have been made for this device (its kernel
  // workspace inside the arena: PlanRequest::device = runtime::device_profile(device)).
  Executor(const graph::Graph& graph, planner::MemoryPlan plan, Device& device, ExecutorOptions options = {});
  // The same for a planned step (which must outlive the executor).
  Executor(const planner::PlannedStep& step, Device& device, ExecutorOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // A persistent tensor whose storage another executor owns (an evaluation graph reading the
  // training graph's weights), or an external tensor (graph::TensorDesc::external: a KV cache
  // pool, which has no place in the arena and must be bound). Call before setup().
  void bind_external(TensorId id, void* device_storage);

  // Validates the plan, allocates (the arena, or persistent buffers in naive mode) and checks
  // every op has a kernel on this device.
  Status setup();
  // Initialises parameters and optimizer state from their InitSpec; same seed, same bytes.
  void initialize_persistent(std::uint64_t seed);

  // Stages host data for an input tensor; it is copied in when the next step starts.
  void set_input(TensorId id, const void* host_data, Bytes size_bytes);
  // The same from f32 values, rounded to the tensor's dtype (a 16-bit input of mixed precision).
  void set_input_values(TensorId id, std::span<const float> values);
  Status run_step();

  // Reading results: persistent tensors always; the loss, output and retained tensors after a step.
  void read_tensor(TensorId id, void* host_dst) const;
  float read_scalar(TensorId id) const;
  void* storage(TensorId id) const;  // device pointer, or nullptr if not live
  void write_tensor(TensorId id, const void* host_src);  // persistent tensors only
  // A floating tensor's values as f32 whatever its dtype (16-bit ones widened exactly), and a
  // persistent one's written from f32 (rounded to nearest even where it is 16-bit).
  void read_values(TensorId id, float* host_dst) const;
  void write_values(TensorId id, const float* host_src);

  // SHA-256 of every parameter's bytes in graph order: equal digests mean identical weights.
  std::string params_sha256() const;

  std::int64_t steps_completed() const { return steps_completed_; }
  // Resuming from a checkpoint: step-dependent ops (Adam's bias correction, dropout masks)
  // continue from step n + 1.
  void set_steps_completed(std::int64_t n) { steps_completed_ = n; }
  // The learning-rate schedule's factor for the next steps (runtime/lr_schedule.h); 1 by default.
  void set_lr_scale(double factor) { lr_scale_ = factor; }
  double lr_scale() const { return lr_scale_; }
  // fp16 loss scaling (graph/mixed_precision.h): the scale of the next steps' loss gradient, and
  // whether the last step's updates were skipped for an overflowed gradient; skipped steps do not
  // count for the optimizer (Adam's bias correction), and resuming restores their number.
  void set_loss_scale(double scale) { loss_scale_ = scale; }
  double loss_scale() const { return loss_scale_; }
  bool last_step_skipped() const { return last_step_skipped_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }
  void set_skipped_steps(std::int64_t n) { skipped_steps_ = n; }
  // Clean steps since the scale last changed (GradScaler's growth tracker), kept for resuming.
  std::int64_t loss_scale_growth_tracker() const { return growth_tracker_; }
  void set_loss_scale_growth_tracker(std::int64_t n) { growth_tracker_ = n; }
  // Whether the step scales its loss (it has a grads_finite op: fp16).
  bool scales_loss() const { return scales_loss_; }
  std::int64_t device_allocations_during_steps() const { return allocations_during_steps_; }
  // Pairs of adjacent ops that run as one fused kernel (ExecutorOptions::fuse_kernels), after setup.
  int fused_pairs() const {
    int n = 0;
    for (kernels::FusedKernelFn f : fused_with_next_) n += f != nullptr;
    return n;
  }
  Bytes device_bytes_at_setup() const { return device_bytes_at_setup_; }
  const graph::Graph& graph() const { return graph_; }
  ExecutionMode mode() const { return mode_; }
  // Where storage() points: host memory for the CPU, device memory for CUDA.
  kernels::DeviceKind device_kind() const { return device_.kind(); }
  // The plan whose offsets are in use (planned mode), or nullptr.
  const planner::MemoryPlan* plan() const { return mode_ == ExecutionMode::planned ? &plan_ : nullptr; }
  const CachingAllocator* allocator() const { return allocator_.get(); }

  // Per-op timing: off by default (then it costs nothing). Turning it on (or off and on again)
  // starts a fresh record; every later step adds a clock read per op, and a device synchronise per
  // op on asynchronous devices so each op's time is its own.
  void set_profiling(bool on);
  bool profiling() const { return profiling_; }
  // Mean per step over the steps run while profiling (steps == 0 before any).
  StepProfile profile() const;

 private:
  // The communicator of the ranks `op`'s collective runs over (its attrs.group).
  // A collective over one rank needs no launcher: it runs on the single-process communicator.
  dist::Communicator* communicator_for(const graph::Op& op) const {
    dist::Communicator* c = communicator_;
    switch (op.attrs.group) {
      case graph::RankGroup::tensor: c = tensor_communicator_; break;
      case graph::RankGroup::expert: c = expert_communicator_; break;
      case graph::RankGroup::expert_data: c = expert_data_communicator_; break;
      case graph::RankGroup::data: break;
    }
    return c == nullptr && op.attrs.world == 1 ? &single_process_ : c;
  }
  struct Slot {
    void* data = nullptr;
    bool owned = false;  // a separate device allocation (naive mode); false inside the arena or bound
  };
  Result<void*> allocate_transient(Bytes size_bytes);
  int buffer_index(TensorId id) const;
  void release(int buffer_index);
  Status setup_host_region();  // optimizer offload: the plan's host region
  Status check_inputs_finite(const graph::Op& op) const;
  Status check_finite(const graph::Op& op, std::size_t position, bool inputs) const;
  void write_guard(int buffer_index);
  void find_fused_pairs();
  void write_values(void* device_dst, const graph::TensorDesc& desc, const float* values);
  Bytes workspace_bytes() const { return workspace_bytes_; }
  // The kernels' part of the workspace: what follows the device's own (cuBLAS's workspace and
  // its kernels' scratch), where 16-bit operands are widened and ops keep their scratch
  // (graph::kernel_scratch_bytes).
  std::span<std::byte> kernel_workspace() const {
    if (workspace_ == nullptr) return {};
    const Bytes own = std::min(device_.workspace_bytes(), workspace_bytes_);
    return std::span<std::byte>(static_cast<std::byte*>(workspace_) + own, static_cast<std::size_t>(workspace_bytes_ - own));
  }
  std::span<const kernels::TensorRef> tensor_refs(const graph::Op& op, std::vector<kernels::TensorRef>& refs) const;
  Status check_guard(int buffer_index, const graph::Op& op) const;

  const graph::Graph& graph_;
  Device& device_;
  ExecutionMode mode_;
  DebugOptions debug_;
  bool trust_plan_ = false;
  bool fuse_kernels_ = true;
  dist::Communicator* communicator_ = nullptr;
  dist::Communicator* tensor_communicator_ = nullptr;
  dist::Communicator* expert_communicator_ = nullptr;
  dist::Communicator* expert_data_communicator_ = nullptr;
  mutable dist::SingleProcessCommunicator single_process_;
  planner::MemoryPlan plan_;  // offsets used in planned mode only
  planner::AllocationEvents events_;
  const planner::Schedule& schedule_;
  const std::vector<planner::PlannedBuffer>& buffers_;
  const std::vector<int>& buffer_of_tensor_;
  std::vector<Slot> slots_;                     // per buffer
  std::vector<void*> external_;                 // per tensor: bound storage of external tensors
  // Optimizer offload: the plan's host region (host memory, allocated at setup, whatever the
  // mode), and each tensor's address in it (null for tensors that are not host tensors).
  std::unique_ptr<std::byte[], void (*)(std::byte*)> host_region_{nullptr, [](std::byte* p) { std::free(p); }};
  std::vector<std::byte*> host_storage_;
  std::vector<kernels::KernelFn> kernels_;      // per graph op
  // Per schedule position: the fused kernel running it with the next position's op, or nullptr.
  std::vector<kernels::FusedKernelFn> fused_with_next_;
  std::vector<std::vector<std::byte>> staged_;  // per tensor: host data for the next step
  void* arena_ = nullptr;
  void* workspace_ = nullptr;     // the device's kernel workspace, when it wants one
  bool workspace_owned_ = false;  // allocated on its own (not inside the arena)
  Bytes workspace_bytes_ = 0;     // the device's, or the most a 16-bit op widens on the CPU
  std::unique_ptr<CachingAllocator> allocator_;  // dynamic mode
  bool setup_done_ = false;
  std::int64_t steps_completed_ = 0;
  double lr_scale_ = 1.0;
  double loss_scale_ = 1.0;
  std::int64_t growth_tracker_ = 0;
  bool scales_loss_ = false;
  bool last_step_skipped_ = false;
  std::int64_t skipped_steps_ = 0;
  std::int64_t allocations_during_steps_ = 0;
  Bytes device_bytes_at_setup_ = 0;
  bool profiling_ = false;
  ProfileRecord profile_record_;
};

}  // namespace memplan::runtime
