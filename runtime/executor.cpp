#include "runtime/executor.h"

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/rng.h"
#include "common/sha256.h"

namespace memplan::runtime {

using graph::Graph;
using graph::Op;
using graph::TensorDesc;

Executor::Executor(const Graph& graph, Device& device, planner::Schedule schedule)
    : graph_(graph), device_(device), schedule_(std::move(schedule)) {
  lifetimes_ = planner::compute_lifetimes(graph_, schedule_);
  buffers_.resize(lifetimes_.buffers.size());
  alloc_at_.resize(schedule_.size());
  free_after_.resize(schedule_.size());
  for (std::size_t b = 0; b < lifetimes_.buffers.size(); ++b) {
    const planner::BufferLifetime& life = lifetimes_.buffers[b];
    if (life.persistent) continue;
    const bool is_input = graph_.tensor(life.root).role == graph::Role::input;
    if (!is_input) alloc_at_[static_cast<std::size_t>(life.first_op)].push_back(static_cast<int>(b));
    // Step results stay readable until the next step begins.
    if (!life.step_result) free_after_[static_cast<std::size_t>(life.last_op)].push_back(static_cast<int>(b));
  }
  staged_.resize(static_cast<std::size_t>(graph_.num_tensors()));
}

Executor::~Executor() {
  for (std::size_t b = 0; b < buffers_.size(); ++b) release(static_cast<int>(b));
}

void Executor::release(int buffer_index) {
  Buffer& buf = buffers_[static_cast<std::size_t>(buffer_index)];
  if (buf.owned && buf.data != nullptr) {
    device_.deallocate(buf.data, lifetimes_.buffers[static_cast<std::size_t>(buffer_index)].size_bytes);
  }
  buf = Buffer{};
}

Executor::Buffer& Executor::buffer_of(TensorId id) {
  const int b = lifetimes_.buffer_of_tensor[static_cast<std::size_t>(id)];
  MEMPLAN_CHECK(b >= 0, "tensor '" << graph_.tensor(id).name << "' is not used by any op");
  return buffers_[static_cast<std::size_t>(b)];
}

const Executor::Buffer& Executor::buffer_of(TensorId id) const {
  const int b = lifetimes_.buffer_of_tensor[static_cast<std::size_t>(id)];
  MEMPLAN_CHECK(b >= 0, "tensor '" << graph_.tensor(id).name << "' is not used by any op");
  return buffers_[static_cast<std::size_t>(b)];
}

void Executor::bind_external(TensorId id, void* device_storage) {
  MEMPLAN_CHECK(!setup_done_, "bind_external after setup");
  MEMPLAN_CHECK(graph::is_persistent(graph_.tensor(id).role),
                "only persistent tensors can be bound, not '" << graph_.tensor(id).name << "'");
  Buffer& buf = buffer_of(id);
  buf.data = device_storage;
  buf.owned = false;
}

Status Executor::setup() {
  MEMPLAN_CHECK(!setup_done_, "setup called twice");
  kernels_.resize(static_cast<std::size_t>(graph_.num_ops()));
  for (int i = 0; i < graph_.num_ops(); ++i) {
    const Op& op = graph_.ops()[static_cast<std::size_t>(i)];
    kernels::KernelFn fn = kernels::find_kernel(op.kind, device_.kind());
    if (fn == nullptr) {
      return Error{"op '" + std::string(graph::op_name(op.kind)) + "' has no kernel on device " +
                   device_.name()};
    }
    kernels_[static_cast<std::size_t>(i)] = fn;
  }
  for (std::size_t b = 0; b < lifetimes_.buffers.size(); ++b) {
    const planner::BufferLifetime& life = lifetimes_.buffers[b];
    if (!life.persistent || buffers_[b].data != nullptr) continue;
    Result<void*> ptr = device_.allocate(life.size_bytes);
    if (!ptr) return Error{"allocating '" + graph_.tensor(life.root).name + "': " + ptr.error().message};
    buffers_[b] = Buffer{ptr.value(), true};
  }
  setup_done_ = true;
  return Status::success();
}

namespace {

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

void Executor::initialize_persistent(std::uint64_t seed) {
  MEMPLAN_CHECK(setup_done_, "initialize_persistent before setup");
  for (TensorId id = 0; id < graph_.num_tensors(); ++id) {
    const TensorDesc& desc = graph_.tensor(id);
    if (!graph::is_persistent(desc.role) || lifetimes_.buffer_of_tensor[static_cast<std::size_t>(id)] < 0) {
      continue;
    }
    if (!buffer_of(id).owned) continue;  // someone else initialises bound storage
    // Each tensor's stream depends on the seed and its name only, not on graph order.
    Rng rng(seed ^ name_hash(desc.name));
    std::vector<float> values(static_cast<std::size_t>(desc.shape.numel()));
    for (float& v : values) {
      switch (desc.init.kind) {
        case graph::InitSpec::Kind::zeros: v = 0.0f; break;
        case graph::InitSpec::Kind::ones: v = 1.0f; break;
        case graph::InitSpec::Kind::uniform: v = rng.uniform(-desc.init.scale, desc.init.scale); break;
        case graph::InitSpec::Kind::normal: v = desc.init.scale * rng.normal(); break;
      }
    }
    device_.copy_from_host(buffer_of(id).data, values.data(), desc.size_bytes());
  }
}

void Executor::set_input(TensorId id, const void* host_data, Bytes size_bytes) {
  const TensorDesc& desc = graph_.tensor(id);
  MEMPLAN_CHECK(desc.role == graph::Role::input, "'" << desc.name << "' is not an input");
  MEMPLAN_CHECK(size_bytes == desc.size_bytes(), "input '" << desc.name << "' takes "
                                                           << desc.size_bytes() << " bytes, got " << size_bytes);
  auto& staged = staged_[static_cast<std::size_t>(id)];
  staged.resize(static_cast<std::size_t>(size_bytes));
  std::memcpy(staged.data(), host_data, static_cast<std::size_t>(size_bytes));
}

Status Executor::run_step() {
  MEMPLAN_CHECK(setup_done_, "run_step before setup");
  const std::int64_t allocations_before = device_.stats().allocations;
  // Last step's results are released now that the caller had the chance to read them.
  for (std::size_t b = 0; b < lifetimes_.buffers.size(); ++b) {
    if (lifetimes_.buffers[b].step_result) release(static_cast<int>(b));
  }
  // Inputs: one buffer each, filled from the staged host data.
  for (std::size_t b = 0; b < lifetimes_.buffers.size(); ++b) {
    const TensorId root = lifetimes_.buffers[b].root;
    if (graph_.tensor(root).role != graph::Role::input) continue;
    const auto& staged = staged_[static_cast<std::size_t>(root)];
    if (staged.empty()) return Error{"input '" + graph_.tensor(root).name + "' was not set"};
    release(static_cast<int>(b));
    Result<void*> ptr = device_.allocate(lifetimes_.buffers[b].size_bytes);
    if (!ptr) return Error{ptr.error().message};
    buffers_[b] = Buffer{ptr.value(), true};
    device_.copy_from_host(ptr.value(), staged.data(), static_cast<Bytes>(staged.size()));
  }

  std::vector<kernels::TensorRef> refs;
  for (std::size_t pos = 0; pos < schedule_.size(); ++pos) {
    for (int b : alloc_at_[pos]) {
      Result<void*> ptr = device_.allocate(lifetimes_.buffers[static_cast<std::size_t>(b)].size_bytes);
      if (!ptr) return Error{ptr.error().message};
      buffers_[static_cast<std::size_t>(b)] = Buffer{ptr.value(), true};
    }
    const int op_index = schedule_[pos];
    const Op& op = graph_.ops()[static_cast<std::size_t>(op_index)];
    refs.clear();
    auto push = [&](TensorId id) {
      const TensorDesc& desc = graph_.tensor(id);
      refs.push_back(kernels::TensorRef{buffer_of(id).data, &desc.shape, desc.dtype});
    };
    for (TensorId id : op.inputs) push(id);
    for (TensorId id : op.outputs) push(id);
    for (TensorId id : op.updates) push(id);
    const std::span<const kernels::TensorRef> all(refs);
    kernels::KernelCall call{op.kind, &op.attrs, all.subspan(0, op.inputs.size()),
                             all.subspan(op.inputs.size(), op.outputs.size()),
                             all.subspan(op.inputs.size() + op.outputs.size()), steps_completed_ + 1};
    kernels_[static_cast<std::size_t>(op_index)](call);
    for (int b : free_after_[pos]) release(b);
  }
  ++steps_completed_;
  allocations_during_steps_ += device_.stats().allocations - allocations_before;
  return Status::success();
}

void* Executor::storage(TensorId id) const {
  const int b = lifetimes_.buffer_of_tensor[static_cast<std::size_t>(id)];
  return b < 0 ? nullptr : buffers_[static_cast<std::size_t>(b)].data;
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
