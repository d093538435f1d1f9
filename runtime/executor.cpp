#include "memplan/runtime/executor.h"

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "memplan/common/check.h"
#include "memplan/common/rng.h"
#include "memplan/common/sha256.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/graph/tensor_parallel.h"
#include "memplan/kernels/half.h"

namespace memplan::runtime {

using graph::Graph;
using graph::Op;
using graph::TensorDesc;

namespace {

constexpr std::uint8_t kGuardPattern = 0xA5;
constexpr double kInitialLossScale = 65536.0;  // 2^16, PyTorch's GradScaler's init_scale

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

std::string_view mode_name(ExecutionMode mode) { return enum_name(kExecutionModeNames, mode); }

Result<ExecutionMode> parse_mode(std::string_view name) { return parse_enum(kExecutionModeNames, name, "execution mode"); }

DebugOptions DebugOptions::from_env() {
  DebugOptions d;
  const char* env = std::getenv("MEMPLAN_DEBUG");
  if (env == nullptr) return d;
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item == "poison") d.poison = true;
    if (item == "guards") d.guards = true;
    if (item == "finite") d.finite = true;
  }
  return d;
}

Executor::Executor(const Graph& graph, planner::MemoryPlan plan, Device& device, ExecutorOptions options)
    : graph_(graph),
      device_(device),
      mode_(options.mode),
      debug_(options.debug),
      trust_plan_(options.trust_plan),
      fuse_kernels_(options.fuse_kernels),
      communicator_(options.communicator),
      tensor_communicator_(options.tensor_communicator),
      expert_communicator_(options.expert_communicator),
      expert_data_communicator_(options.expert_data_communicator),
      plan_(std::move(plan)),
      events_(planner::allocation_events(plan_)),
      schedule_(plan_.schedule),
      buffers_(plan_.buffers),
      buffer_of_tensor_(plan_.buffer_of_tensor) {
  MEMPLAN_CHECK(static_cast<int>(buffer_of_tensor_.size()) == graph_.num_tensors(), "plan does not match the graph");
  if (mode_ == ExecutionMode::dynamic) allocator_ = std::make_unique<CachingAllocator>(device_, options.allocator);
  slots_.resize(buffers_.size());
  staged_.resize(static_cast<std::size_t>(graph_.num_tensors()));
  external_.resize(static_cast<std::size_t>(graph_.num_tensors()), nullptr);
  // fp16 loss scaling starts where PyTorch's GradScaler does (runtime/trainer.h).
  scales_loss_ = graph::grads_finite_flag(graph_) != kNoTensor;
  if (scales_loss_) loss_scale_ = kInitialLossScale;
  // 16-bit ops without a kernel of their own compute in f32 copies made in the workspace, after
  // the device's scratch, and ops with scratch of their own keep it there (graph/mixed_precision.h,
  // kernels/shared/widened_call.h).
  const std::vector<graph::OpKind> native = kernels::native_16bit_ops(device_.kind());
  workspace_bytes_ = device_.workspace_bytes() + graph::kernel_scratch_bytes(graph_, /*widen=*/true, native);
}

Executor::Executor(const planner::PlannedStep& step, Device& device, ExecutorOptions options)
    : Executor(step.graph, step.plan, device, options) {
  MEMPLAN_CHECK(step.runnable, "an answer-only plan (one that does not fit) cannot run");
}

Executor::~Executor() {
  if (workspace_ != nullptr) {
    device_.attach_workspace(nullptr, 0);
    if (workspace_owned_) device_.deallocate(workspace_, workspace_bytes());
  }
  for (std::size_t b = 0; b < slots_.size(); ++b) release(static_cast<int>(b));
  if (arena_ != nullptr) device_.deallocate(arena_, plan_.arena_bytes);
  allocator_.reset();  // returns its cached segments to the device
}

Result<void*> Executor::allocate_transient(Bytes size_bytes) {
  if (allocator_) return allocator_->allocate(std::max<Bytes>(size_bytes, 1));
  return device_.allocate(size_bytes);
}

void Executor::release(int buffer_index) {
  Slot& slot = slots_[static_cast<std::size_t>(buffer_index)];
  if (slot.owned && slot.data != nullptr) {
    if (allocator_) allocator_->free(slot.data);
    else device_.deallocate(slot.data, buffers_[static_cast<std::size_t>(buffer_index)].size_bytes);
  }
  if (mode_ != ExecutionMode::planned || slot.owned) slot = Slot{};
}

int Executor::buffer_index(TensorId id) const {
  MEMPLAN_CHECK(id >= 0 && id < graph_.num_tensors(), "no tensor " << id);
  return buffer_of_tensor_[static_cast<std::size_t>(id)];
}

void Executor::bind_external(TensorId id, void* device_storage) {
  MEMPLAN_CHECK(!setup_done_, "bind_external after setup");
  MEMPLAN_CHECK(graph::is_persistent(graph_.tensor(id).role),
                "only persistent tensors can be bound, not '" << graph_.tensor(id).name << "'");
  if (graph_.tensor(id).external) {
    MEMPLAN_CHECK(device_storage != nullptr, "binding external tensor '" << graph_.tensor(id).name << "' to nothing");
    external_[static_cast<std::size_t>(id)] = device_storage;
    return;
  }
  const int b = buffer_index(id);
  MEMPLAN_CHECK(b >= 0, "tensor '" << graph_.tensor(id).name << "' is not used by any op");
  slots_[static_cast<std::size_t>(b)] = Slot{device_storage, false};
}

Status Executor::setup_host_region() {
  if (plan_.host_buffers.empty()) return Status::success();
  // The update of offloaded state runs where the state is: kernels of this device read it.
  if (device_.kind() != kernels::DeviceKind::cpu) {
    bool offloaded = false;
    for (const Op& op : graph_.ops()) offloaded = offloaded || op.kind == graph::OpKind::to_host;
    if (!offloaded) {
      return Error{"paged_adamw8bit keeps the 8-bit states of large parameters in host-visible memory, which this "
                   "executor runs on the CPU device only: train with --optimizer adamw8bit (the same update, states on "
                   "the device) or --device cpu (fit and plan answer for " + device_.name() + ")"};
    }
    return Error{"optimizer offload keeps optimizer state in host memory and updates it there, which this executor "
                 "runs on the CPU device only: train with --device cpu (fit and plan answer for " + device_.name() + ")"};
  }
  const Bytes bytes = std::max<Bytes>(plan_.host_bytes, planner::kArenaAlignment);
  host_region_.reset(static_cast<std::byte*>(std::aligned_alloc(planner::kArenaAlignment, static_cast<std::size_t>(bytes))));
  if (host_region_ == nullptr) return Error{"cannot allocate the host region of " + std::to_string(bytes) + " bytes"};
  host_storage_.assign(static_cast<std::size_t>(graph_.num_tensors()), nullptr);
  for (const planner::PlannedBuffer& b : plan_.host_buffers) host_storage_[static_cast<std::size_t>(b.root)] = host_region_.get() + b.offset;
  for (TensorId id = 0; id < graph_.num_tensors(); ++id) {
    const TensorId root = graph_.storage_root(id);
    if (root != id) host_storage_[static_cast<std::size_t>(id)] = host_storage_[static_cast<std::size_t>(root)];
  }
  return Status::success();
}

Status Executor::setup() {
  MEMPLAN_CHECK(!setup_done_, "setup called twice");
  for (TensorId id = 0; id < graph_.num_tensors(); ++id) {
    if (graph_.tensor(id).external && external_[static_cast<std::size_t>(id)] == nullptr) {
      return Error{"external tensor '" + graph_.tensor(id).name + "' was not bound (Executor::bind_external)"};
    }
  }
  if (Status s = setup_host_region(); !s) return s;
  kernels_.resize(static_cast<std::size_t>(graph_.num_ops()));
  for (int i = 0; i < graph_.num_ops(); ++i) {
    const Op& op = graph_.ops()[static_cast<std::size_t>(i)];
    const graph::DType dtype = graph::op_dtype(graph_, op);
    kernels::KernelFn fn = kernels::find_kernel(op.kind, device_.kind(), dtype);
    if (fn == nullptr) return kernels::check_kernels_for(graph_, device_.kind()).error();
    kernels_[static_cast<std::size_t>(i)] = fn;
    if (graph::op_info(op.kind).communicates) {
      const dist::Communicator* comm = communicator_for(op);
      const int world = comm == nullptr ? 1 : comm->world_size();
      if (comm == nullptr || world != op.attrs.world) {
        return Error{"op '" + op.name + "' is a collective over " + std::to_string(op.attrs.world) + " " +
                     std::string(graph::rank_group_name(op.attrs.group)) + " ranks but this process runs " +
                     std::to_string(world) + (comm == nullptr ? " without a communicator" : "") +
                     ": launch one process per rank (mpirun -np " + std::to_string(op.attrs.world) + ")"};
      }
    }
  }
  const Bytes before = device_.stats().bytes_in_use;
  if (mode_ == ExecutionMode::planned) {
    if (!trust_plan_) {
      if (Status s = planner::validate_plan(plan_); !s) return Error{"refusing an invalid memory plan: " + s.error().message};
    }
    // The plan must be the one this device runs: its workspace inside the arena, and guard
    // gaps when guards are checked. Planning is plan_step's; the executor only refuses.
    if (plan_.workspace_bytes < workspace_bytes()) {
      return Error{"the plan has " + std::to_string(plan_.workspace_bytes) + " bytes of kernel workspace but device " +
                   device_.name() + " needs " + std::to_string(workspace_bytes()) +
                   ": plan the step with this device's profile (runtime::device_profile)"};
    }
    if (debug_.guards && plan_.guard_bytes <= 0) {
      return Error{"--debug guards needs a plan made with guard bytes (PlanRequest::guard_bytes)"};
    }
    Result<void*> arena = device_.allocate(plan_.arena_bytes);
    if (!arena) {
      return Error{"cannot allocate the arena of " + std::to_string(plan_.arena_bytes) + " bytes: " + arena.error().message};
    }
    arena_ = arena.value();
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      if (slots_[b].data != nullptr) continue;  // bound externally
      slots_[b] = Slot{static_cast<std::byte*>(arena_) + buffers_[b].offset, false};
    }
    if (debug_.guards) {
      for (std::size_t b = 0; b < buffers_.size(); ++b) {
        if (buffers_[b].persistent) write_guard(static_cast<int>(b));
      }
    }
  } else {
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      if (!buffers_[b].persistent || slots_[b].data != nullptr) continue;
      Result<void*> ptr = allocate_transient(buffers_[b].size_bytes);
      if (!ptr) return Error{"allocating '" + buffers_[b].name + "': " + ptr.error().message};
      slots_[b] = Slot{ptr.value(), true};
    }
  }
  if (const Bytes wanted = workspace_bytes(); wanted > 0) {
    if (mode_ == ExecutionMode::planned) {
      workspace_ = static_cast<std::byte*>(arena_) + plan_.workspace_offset;
    } else {
      // Naive and dynamic modes: the workspace is its own allocation, made at setup.
      Result<void*> ws = device_.allocate(wanted);
      if (!ws) return Error{"allocating the kernel workspace: " + ws.error().message};
      workspace_ = ws.value();
      workspace_owned_ = true;
    }
    device_.attach_workspace(workspace_, wanted);
  }
  device_bytes_at_setup_ = device_.stats().bytes_in_use - before;
  find_fused_pairs();
  setup_done_ = true;
  return Status::success();
}

namespace {

// A persistent tensor's starting values as f32, from its InitSpec: each tensor's stream depends
// on the seed and its name only, not on graph order. A rank's shard of a tensor holds that
// tensor's values over its range (padding zero), so sharded and whole runs start from the same
// weights; a master copy holds its parameter's values (before the parameter rounds them).
std::vector<float> initial_values(const Graph& graph, const TensorDesc& desc, std::uint64_t seed) {
  if (desc.master_of != kNoTensor) {
    const std::vector<float> param = initial_values(graph, graph.tensor(desc.master_of), seed);
    std::vector<float> values(static_cast<std::size_t>(desc.shape.numel()), 0.0f);
    const auto offset = static_cast<std::size_t>(desc.master_offset);
    for (std::size_t i = 0; i < values.size() && offset + i < param.size(); ++i) values[i] = param[offset + i];
    return values;
  }
  const TensorDesc& source = desc.shard_of == kNoTensor ? desc : graph.tensor(desc.shard_of);
  Rng rng(seed ^ name_hash(source.name));
  // A tensor-parallel slice draws the whole tensor's values (padded: the padding's rows come
  // last, so the real ones are those of the unsplit tensor) and keeps its slice.
  std::vector<float> values(static_cast<std::size_t>(graph::padded_whole_shape(source).numel()));
  for (float& v : values) {
    switch (source.init.kind) {
      case graph::InitSpec::Kind::zeros: v = 0.0f; break;
      case graph::InitSpec::Kind::ones: v = 1.0f; break;
      case graph::InitSpec::Kind::uniform: v = rng.uniform(-source.init.scale, source.init.scale); break;
      case graph::InitSpec::Kind::normal: v = source.init.scale * rng.normal(); break;
    }
  }
  if (source.tp_axis >= 0 || source.ep_parts > 1) {
    TensorDesc as_f32 = source;
    as_f32.dtype = graph::DType::f32;
    const std::vector<std::byte> slice = graph::local_part(as_f32, std::as_bytes(std::span<const float>(values)));
    values.assign(reinterpret_cast<const float*>(slice.data()), reinterpret_cast<const float*>(slice.data()) + source.shape.numel());
  }
  if (desc.shard_of != kNoTensor) {
    std::vector<float> shard(static_cast<std::size_t>(desc.shape.numel()), 0.0f);
    std::copy_n(values.begin() + desc.shard_offset, desc.shard_count, shard.begin());
    values = std::move(shard);
  }
  return values;
}

}  // namespace

void Executor::initialize_persistent(std::uint64_t seed) {
  MEMPLAN_CHECK(setup_done_, "initialize_persistent before setup");
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    const planner::PlannedBuffer& buf = buffers_[b];
    if (!buf.persistent) continue;
    // Bound storage belongs to whoever bound it (slots inside our own arena are not "owned" but
    // are ours to fill).
    const bool ours = slots_[b].owned || (arena_ != nullptr && slots_[b].data >= arena_ &&
                                          slots_[b].data < static_cast<std::byte*>(arena_) + plan_.arena_bytes);
    if (!ours) continue;
    const TensorDesc& desc = graph_.tensor(buf.root);
    write_values(slots_[b].data, desc, initial_values(graph_, desc, seed).data());
  }
  for (const planner::PlannedBuffer& buf : plan_.host_buffers) {
    const TensorDesc& desc = graph_.tensor(buf.root);
    write_values(host_storage_[static_cast<std::size_t>(buf.root)], desc, initial_values(graph_, desc, seed).data());
  }
}

void Executor::write_values(void* device_dst, const TensorDesc& desc, const float* values) {
  if (desc.dtype == graph::DType::f32) {
    device_.copy_from_host(device_dst, values, desc.size_bytes());
    return;
  }
  if (desc.dtype == graph::DType::i32) {
    // Constant indices (an imported Gather's), integers that f32 holds exactly.
    std::vector<std::int32_t> ints(static_cast<std::size_t>(desc.shape.numel()));
    for (std::size_t i = 0; i < ints.size(); ++i) {
      MEMPLAN_CHECK(values[i] == std::nearbyint(values[i]) && std::fabs(values[i]) < 16777216.0f,
                    "'" << desc.name << "' is i32; " << values[i] << " is not an integer f32 holds exactly");
      ints[i] = static_cast<std::int32_t>(values[i]);
    }
    device_.copy_from_host(device_dst, ints.data(), desc.size_bytes());
    return;
  }
  if (desc.dtype == graph::DType::u8) {
    // Quantized storage (graph/quantize.h): each value's integer part, modulo 256, so a uniform
    // initialisation over [-128, 128) draws every code.
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(desc.shape.numel()));
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<std::uint8_t>(static_cast<std::int64_t>(std::floor(values[i])) & 0xFF);
    }
    device_.copy_from_host(device_dst, bytes.data(), desc.size_bytes());
    return;
  }
  MEMPLAN_CHECK(graph::is_16bit_float(desc.dtype), "'" << desc.name << "' is " << graph::dtype_name(desc.dtype)
                                                       << ", not a floating tensor to write f32 values into");
  std::vector<std::uint16_t> narrow(static_cast<std::size_t>(desc.shape.numel()));
  kernels::narrow_from_f32(desc.dtype, values, narrow.data(), desc.shape.numel());
  device_.copy_from_host(device_dst, narrow.data(), desc.size_bytes());
}

void Executor::set_input_values(TensorId id, std::span<const float> values) {
  const TensorDesc& desc = graph_.tensor(id);
  MEMPLAN_CHECK(static_cast<std::int64_t>(values.size()) == desc.shape.numel(),
                "input '" << desc.name << "' takes " << desc.shape.numel() << " values, got " << values.size());
  if (desc.dtype == graph::DType::f32) {
    set_input(id, values.data(), desc.size_bytes());
    return;
  }
  MEMPLAN_CHECK(graph::is_16bit_float(desc.dtype), "input '" << desc.name << "' is not floating");
  std::vector<std::uint16_t> narrow(values.size());
  kernels::narrow_from_f32(desc.dtype, values.data(), narrow.data(), desc.shape.numel());
  set_input(id, narrow.data(), desc.size_bytes());
}

void Executor::read_values(TensorId id, float* host_dst) const {
  const TensorDesc& desc = graph_.tensor(id);
  if (desc.dtype == graph::DType::f32) {
    read_tensor(id, host_dst);
    return;
  }
  MEMPLAN_CHECK(graph::is_16bit_float(desc.dtype), "'" << desc.name << "' is not floating");
  std::vector<std::uint16_t> narrow(static_cast<std::size_t>(desc.shape.numel()));
  read_tensor(id, narrow.data());
  kernels::widen_to_f32(desc.dtype, narrow.data(), host_dst, desc.shape.numel());
}

void Executor::write_values(TensorId id, const float* host_src) {
  MEMPLAN_CHECK(graph::is_persistent(graph_.tensor(id).role), "only persistent tensors can be written");
  void* dst = storage(id);
  MEMPLAN_CHECK(dst != nullptr, "tensor '" << graph_.tensor(id).name << "' has no storage");
  write_values(dst, graph_.tensor(id), host_src);
}

void Executor::set_input(TensorId id, const void* host_data, Bytes size_bytes) {
  const TensorDesc& desc = graph_.tensor(id);
  MEMPLAN_CHECK(desc.role == graph::Role::input, "'" << desc.name << "' is not an input");
  MEMPLAN_CHECK(size_bytes == desc.size_bytes(),
                "input '" << desc.name << "' takes " << desc.size_bytes() << " bytes, got " << size_bytes);
  auto& staged = staged_[static_cast<std::size_t>(id)];
  staged.resize(static_cast<std::size_t>(size_bytes));
  std::memcpy(staged.data(), host_data, static_cast<std::size_t>(size_bytes));
}

void Executor::write_guard(int b) {
  const planner::PlannedBuffer& buf = buffers_[static_cast<std::size_t>(b)];
  const Bytes guard = mode_ == ExecutionMode::planned ? plan_.guard_bytes : 0;
  if (guard <= 0) return;
  std::vector<std::uint8_t> pattern(static_cast<std::size_t>(guard), kGuardPattern);
  device_.copy_from_host(static_cast<std::byte*>(slots_[static_cast<std::size_t>(b)].data) + buf.size_bytes,
                         pattern.data(), guard);
}

Status Executor::check_guard(int b, const Op& op) const {
  const planner::PlannedBuffer& buf = buffers_[static_cast<std::size_t>(b)];
  const Bytes guard = mode_ == ExecutionMode::planned ? plan_.guard_bytes : 0;
  if (guard <= 0) return Status::success();
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(guard));
  device_.copy_to_host(bytes.data(), static_cast<std::byte*>(slots_[static_cast<std::size_t>(b)].data) + buf.size_bytes,
                       guard);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != kGuardPattern) {
      return Error{"guard bytes after '" + buf.name + "' were overwritten (byte " + std::to_string(i) +
                   " past its end) by op '" + op.name + "'"};
    }
  }
  return Status::success();
}

Status Executor::check_inputs_finite(const Op& op) const {
  for (TensorId id : op.inputs) {
    const TensorDesc& desc = graph_.tensor(id);
    // An external KV cache holds stale rows beyond each sequence's length by design.
    if (desc.dtype != graph::DType::f32 || desc.external) continue;
    std::vector<float> values(static_cast<std::size_t>(desc.shape.numel()));
    read_tensor(id, values.data());
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (std::isnan(values[i])) {
        return Error{"poison check: op '" + op.name + "' reads NaN from '" + desc.name + "'[" + std::to_string(i) +
                     "]: its storage was released or overwritten by another tensor while still live"};
      }
    }
  }
  return Status::success();
}

Status Executor::check_finite(const Op& op, std::size_t position, bool inputs) const {
  const std::vector<const std::vector<TensorId>*> lists =
      inputs ? std::vector<const std::vector<TensorId>*>{&op.inputs}
             : std::vector<const std::vector<TensorId>*>{&op.outputs, &op.updates};
  std::vector<float> values;
  for (const std::vector<TensorId>* list : lists) {
    for (TensorId id : *list) {
      const TensorDesc& desc = graph_.tensor(id);
      if (desc.dtype != graph::DType::f32 || desc.external) continue;  // stale cache rows are expected
      values.resize(static_cast<std::size_t>(desc.shape.numel()));
      read_tensor(id, values.data());
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (std::isfinite(values[i])) continue;
        std::ostringstream msg;
        msg << "first non-finite tensor: op '" << op.name << "' (" << graph::op_name(op.kind) << ", position "
            << position + 1 << " of " << schedule_.size() << " in the step) " << (inputs ? "reads " : "wrote ")
            << values[i] << (inputs ? " from '" : " to '") << desc.name << "'[" << i << "] ("
            << graph::role_name(desc.role) << ")";
        return Error{msg.str()};
      }
    }
  }
  return Status::success();
}

void Executor::find_fused_pairs() {
  fused_with_next_.assign(schedule_.size(), nullptr);
  // Naive and dynamic modes allocate and free around each op, and the debug checks run between
  // ops: both need the ops one at a time.
  if (!fuse_kernels_ || mode_ != ExecutionMode::planned || debug_.poison || debug_.guards || debug_.finite) return;
  struct Range {
    const std::byte* begin;
    const std::byte* end;
  };
  auto range = [&](TensorId id) {
    const auto* p = static_cast<const std::byte*>(storage(id));
    return Range{p, p + graph_.tensor(id).size_bytes()};
  };
  auto overlap = [](const Range& a, const Range& b) { return a.begin < b.end && b.begin < a.end; };
  auto touches = [&](TensorId t, const std::vector<TensorId>& list) {
    for (TensorId u : list) {
      if (overlap(range(t), range(u))) return true;
    }
    return false;
  };
  // Whether a sample_waves kernel has an order of samples writing `out` over `in`.
  auto waves_allow = [&](TensorId out, TensorId in) {
    const graph::Shape& os = graph_.tensor(out).shape;
    const graph::Shape& is = graph_.tensor(in).shape;
    if (os.rank() == 0 || is.rank() == 0 || os[0] != is[0]) return false;
    return kernels::sample_wave_order(storage(out), graph_.tensor(out).size_bytes(), storage(in),
                                      graph_.tensor(in).size_bytes(), os[0]) != kernels::SampleOrder::none;
  };
  // Whether an op other than `reader`, or the step's caller, reads the storage of `t`.
  auto read_elsewhere = [&](TensorId t, const Op& reader) {
    const int buffer = buffer_index(t);
    if (buffer < 0) return true;  // not in the arena
    for (const Op& op : graph_.ops()) {
      if (&op == &reader) continue;
      for (const auto* list : {&op.inputs, &op.updates}) {
        for (TensorId u : *list) {
          if (buffer_index(u) == buffer) return true;
        }
      }
    }
    for (TensorId u : graph_.retained) {
      if (buffer_index(u) == buffer) return true;
    }
    for (TensorId u : {graph_.loss, graph_.output}) {
      if (u != kNoTensor && buffer_index(u) == buffer) return true;
    }
    return false;
  };
  for (std::size_t pos = 0; pos + 1 < schedule_.size(); ++pos) {
    const Op& a = graph_.ops()[static_cast<std::size_t>(schedule_[pos])];
    const Op& b = graph_.ops()[static_cast<std::size_t>(schedule_[pos + 1])];
    // Fused kernels compute in f32 on f32 operands.
    if (graph::op_dtype(graph_, a) != graph::DType::f32 || graph::op_dtype(graph_, b) != graph::DType::f32) continue;
    const kernels::FusedKernel kernel = kernels::find_fused_kernel(a.kind, b.kind, device_.kind());
    if (kernel.fn == nullptr || a.outputs.size() != 1) continue;
    const TensorId mid = a.outputs[0];
    if (std::find(b.inputs.begin(), b.inputs.end(), mid) == b.inputs.end()) continue;
    // The second op writes its outputs while the first still reads (and writes) later samples:
    // they must not share a byte with anything the first touches (but for samples of its first
    // input already read, in waves), and the first's output must not share one with the
    // second's other inputs. A first output used as scratch must have no other reader.
    bool ok = a.updates.empty() && b.updates.empty() && !(kernel.first_output_is_scratch && read_elsewhere(mid, b));
    for (TensorId out : b.outputs) {
      ok = ok && !touches(out, a.outputs);
      for (std::size_t k = 0; k < a.inputs.size(); ++k) {
        const TensorId in = a.inputs[k];
        ok = ok && (!overlap(range(out), range(in)) || (k == 0 && kernel.sample_waves && waves_allow(out, in)));
      }
    }
    for (TensorId in : b.inputs) ok = ok && (in == mid || !overlap(range(mid), range(in)));
    if (ok) {
      fused_with_next_[pos] = kernel.fn;
      ++pos;  // an op runs in one pair at most
    }
  }
}

std::span<const kernels::TensorRef> Executor::tensor_refs(const Op& op, std::vector<kernels::TensorRef>& refs) const {
  refs.clear();
  auto push = [&](TensorId id) {
    const TensorDesc& desc = graph_.tensor(id);
    refs.push_back(kernels::TensorRef{storage(id), &desc.shape, desc.dtype});
  };
  for (TensorId id : op.inputs) push(id);
  for (TensorId id : op.outputs) push(id);
  for (TensorId id : op.updates) push(id);
  return std::span<const kernels::TensorRef>(refs);
}

void Executor::set_profiling(bool on) {
  profiling_ = on;
  profile_record_ = ProfileRecord{};
  profile_record_.op_ns.assign(schedule_.size(), 0.0);
  profile_record_.timed_in.assign(schedule_.size(), -1);
  // A fused pair is timed as one, under the op with the multiply-adds (im2col moves data and
  // col2im only adds what it scatters, a few FLOPs beside the product's), the other op marked as
  // timed there.
  for (std::size_t pos = 0; pos < fused_with_next_.size(); ++pos) {
    if (fused_with_next_[pos] == nullptr) continue;
    const bool second_counts = graph::op_flops(graph_, graph_.ops()[static_cast<std::size_t>(schedule_[pos + 1])]) > 0.0 &&
                               graph::op_flops(graph_, graph_.ops()[static_cast<std::size_t>(schedule_[pos])]) <= 0.0;
    profile_record_.timed_in[second_counts ? pos : pos + 1] = static_cast<int>(second_counts ? pos + 1 : pos);
  }
}

StepProfile Executor::profile() const {
  if (profile_record_.op_ns.size() != schedule_.size()) return StepProfile{};
  return make_step_profile(graph_, schedule_, profile_record_);
}

Status Executor::run_step() {
  MEMPLAN_CHECK(setup_done_, "run_step before setup");
  using Clock = std::chrono::steady_clock;
  const bool profiling = profiling_;
  const Clock::time_point step_start = profiling ? Clock::now() : Clock::time_point{};
  const std::int64_t allocations_before = device_.stats().allocations;
  // Another executor on this device (an evaluation graph) may have attached its own workspace.
  if (workspace_ != nullptr) device_.attach_workspace(workspace_, workspace_bytes());
  // Last step's results are released now that the caller had the chance to read them.
  if (mode_ != ExecutionMode::planned) {
    for (int b : events_.step_results) release(b);
  }
  // Inputs: copied into their slot (planned) or into a fresh allocation (naive).
  for (int input : events_.inputs) {
    const auto b = static_cast<std::size_t>(input);
    const TensorId root = buffers_[b].root;
    const auto& staged = staged_[static_cast<std::size_t>(root)];
    if (staged.empty()) return Error{"input '" + graph_.tensor(root).name + "' was not set"};
    if (mode_ != ExecutionMode::planned) {
      release(static_cast<int>(b));
      Result<void*> ptr = allocate_transient(buffers_[b].size_bytes);
      if (!ptr) return Error{ptr.error().message};
      slots_[b] = Slot{ptr.value(), true};
    } else if (debug_.guards) {
      write_guard(static_cast<int>(b));
    }
    device_.copy_from_host(slots_[b].data, staged.data(), static_cast<Bytes>(staged.size()));
  }

  std::vector<kernels::TensorRef> refs, next_refs;
  std::vector<float> nans;
  bool skip_updates = false;  // set by an op that gates the updates (grads_finite)
  for (std::size_t pos = 0; pos < schedule_.size(); ++pos) {
    // An op's time runs from its allocations to its frees: the ops' times and the input copies
    // above add up to the step.
    const Clock::time_point op_start = profiling ? Clock::now() : Clock::time_point{};
    for (int b : events_.alloc_before[pos]) {
      if (mode_ != ExecutionMode::planned) {
        Result<void*> ptr = allocate_transient(buffers_[static_cast<std::size_t>(b)].size_bytes);
        if (!ptr) return Error{ptr.error().message};
        slots_[static_cast<std::size_t>(b)] = Slot{ptr.value(), true};
      } else if (debug_.guards) {
        write_guard(b);
      }
    }
    const int op_index = schedule_[pos];
    const Op& op = graph_.ops()[static_cast<std::size_t>(op_index)];
    if (debug_.poison) {
      if (Status s = check_inputs_finite(op); !s) return s;
    }
    // Inputs before the kernel runs: an in-place op overwrites them. A non-finite input no
    // earlier op reported came from outside the step's ops (the data fed in, or loaded weights).
    if (debug_.finite) {
      if (Status s = check_finite(op, pos, /*inputs=*/true); !s) return s;
    }
    auto make_call = [&](const Op& o, std::span<const kernels::TensorRef> all) {
      // The optimizer counts the updates it applied (Adam's bias correction): skipped steps not.
      const std::int64_t step = o.phase == graph::Phase::optimizer ? steps_completed_ - skipped_steps_ + 1 : steps_completed_ + 1;
      return kernels::KernelCall{o.kind, &o.attrs, all.subspan(0, o.inputs.size()),
                                 all.subspan(o.inputs.size(), o.outputs.size()),
                                 all.subspan(o.inputs.size() + o.outputs.size()), step, communicator_for(o),
                                 lr_scale_, kernel_workspace(), loss_scale_};
    };
    const kernels::KernelCall call = make_call(op, tensor_refs(op, refs));
    if (skip_updates && op.phase == graph::Phase::optimizer) {
      // fp16 loss scaling found an overflowed gradient: this step changes no weight.
    } else if (kernels::FusedKernelFn fused = fused_with_next_[pos]; fused != nullptr) {
      // The pair runs as one at this position (timed as one: set_profiling); the next
      // position has nothing of its own to allocate or free before this op's frees (planned
      // mode, no guards), so it is skipped below.
      const Op& next = graph_.ops()[static_cast<std::size_t>(schedule_[pos + 1])];
      fused(call, make_call(next, tensor_refs(next, next_refs)));
    } else {
      kernels_[static_cast<std::size_t>(op_index)](call);
    }
    if (profiling) device_.synchronize();
    if (graph::op_info(op.kind).gates_updates) {
      float finite = 0.0f;
      device_.copy_to_host(&finite, storage(op.outputs[0]), sizeof finite);
      skip_updates = finite == 0.0f;
    }
    if (debug_.finite && !graph::op_info(op.kind).gates_updates) {
      if (Status s = check_finite(op, pos, /*inputs=*/false); !s) return s;
    }
    if (debug_.guards && mode_ == ExecutionMode::planned) {
      for (const auto* list : {&op.outputs, &op.updates}) {
        for (TensorId id : *list) {
          if (graph_.tensor(id).external) continue;  // not in the arena
          if (Status s = check_guard(buffer_index(id), op); !s) return s;
        }
      }
    }
    for (int b : events_.free_after[pos]) {
      if (debug_.poison && mode_ == ExecutionMode::planned) {
        const planner::PlannedBuffer& buf = buffers_[static_cast<std::size_t>(b)];
        nans.assign(static_cast<std::size_t>(buf.size_bytes / 4), std::numeric_limits<float>::quiet_NaN());
        device_.copy_from_host(slots_[static_cast<std::size_t>(b)].data, nans.data(), buf.size_bytes / 4 * 4);
      }
      release(b);
    }
    if (profiling) {
      const std::size_t timed = profile_record_.timed_in[pos] >= 0 ? static_cast<std::size_t>(profile_record_.timed_in[pos]) : pos;
      profile_record_.op_ns[timed] += std::chrono::duration<double, std::nano>(Clock::now() - op_start).count();
    }
    if (fused_with_next_[pos] != nullptr) {
      ++pos;  // ran with this one
      for (int b : events_.free_after[pos]) release(b);
    }
  }
  device_.synchronize();  // the step is over when its kernels are (step times, host reads)
  if (profiling) {
    profile_record_.step_ns += std::chrono::duration<double, std::nano>(Clock::now() - step_start).count();
    ++profile_record_.steps;
  }
  ++steps_completed_;
  last_step_skipped_ = skip_updates;
  skipped_steps_ += skip_updates ? 1 : 0;
  allocations_during_steps_ += device_.stats().allocations - allocations_before;
  return Status::success();
}

void* Executor::storage(TensorId id) const {
  if (graph_.tensor(id).external) return external_[static_cast<std::size_t>(id)];
  if (!host_storage_.empty() && host_storage_[static_cast<std::size_t>(id)] != nullptr) return host_storage_[static_cast<std::size_t>(id)];
  const int b = buffer_index(id);
  return b < 0 ? nullptr : slots_[static_cast<std::size_t>(b)].data;
}

void Executor::read_tensor(TensorId id, void* host_dst) const {
  void* src = storage(id);
  MEMPLAN_CHECK(src != nullptr, "tensor '" << graph_.tensor(id).name << "' is not live");
  device_.copy_to_host(host_dst, src, graph_.tensor(id).size_bytes());
}

void Executor::write_tensor(TensorId id, const void* host_src) {
  MEMPLAN_CHECK(graph::is_persistent(graph_.tensor(id).role), "only persistent tensors can be written");
  void* dst = storage(id);
  MEMPLAN_CHECK(dst != nullptr, "tensor '" << graph_.tensor(id).name << "' has no storage");
  device_.copy_from_host(dst, host_src, graph_.tensor(id).size_bytes());
}

float Executor::read_scalar(TensorId id) const {
  MEMPLAN_CHECK(graph_.tensor(id).shape.numel() == 1 && graph_.tensor(id).dtype == graph::DType::f32,
                "'" << graph_.tensor(id).name << "' is not an f32 scalar");
  float value = 0.0f;
  read_tensor(id, &value);
  return value;
}

std::string Executor::params_sha256() const {
  Sha256 hash;
  std::vector<std::byte> host;
  for (TensorId id : graph_.parameters()) {
    if (storage(id) == nullptr) continue;
    host.resize(static_cast<std::size_t>(graph_.tensor(id).size_bytes()));
    read_tensor(id, host.data());
    hash.update(host);
  }
  return hash.finish_hex();
}

}  // namespace memplan::runtime
