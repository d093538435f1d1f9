// Runs a training step's graph on a device in schedule order. Naive mode gives every buffer its
// own device allocation, made when the buffer is first written and freed after its last use;
// planned and dynamic modes share this interface and the same schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "graph/graph.h"
#include "kernels/kernel.h"
#include "planner/liveness.h"
#include "runtime/device.h"

namespace memplan::runtime {

enum class ExecutionMode { naive };

class Executor {
 public:
  Executor(const graph::Graph& graph, Device& device, planner::Schedule schedule);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // A persistent tensor whose storage another executor owns (an evaluation graph reading the
  // training graph's weights). Call before setup().
  void bind_external(TensorId id, void* device_storage);

  // Allocates persistent storage and checks every op has a kernel on this device.
  Status setup();
  // Initialises parameters and optimizer state from their InitSpec; same seed, same bytes.
  void initialize_persistent(std::uint64_t seed);

  // Stages host data for an input tensor; it is copied in when the next step starts.
  void set_input(TensorId id, const void* host_data, Bytes size_bytes);
  Status run_step();

  // Reading results: persistent tensors always, the loss and output after a step.
  void read_tensor(TensorId id, void* host_dst) const;
  float read_scalar(TensorId id) const;
  void* storage(TensorId id) const;  // device pointer, or nullptr if not live
  void write_tensor(TensorId id, const void* host_src);  // persistent tensors only

  // SHA-256 of every parameter's bytes in graph order: equal digests mean identical weights.
  std::string params_sha256() const;

  std::int64_t steps_completed() const { return steps_completed_; }
  std::int64_t device_allocations_during_steps() const { return allocations_during_steps_; }
  const planner::Lifetimes& lifetimes() const { return lifetimes_; }
  const graph::Graph& graph() const { return graph_; }
  ExecutionMode mode() const { return ExecutionMode::naive; }

 private:
  struct Buffer {
    void* data = nullptr;
    bool owned = false;  // false for externally bound storage
  };
  Buffer& buffer_of(TensorId id);
  const Buffer& buffer_of(TensorId id) const;
  void release(int buffer_index);

  const graph::Graph& graph_;
  Device& device_;
  planner::Schedule schedule_;
  planner::Lifetimes lifetimes_;
  std::vector<Buffer> buffers_;                 // per lifetime buffer
  std::vector<std::vector<int>> alloc_at_;      // per schedule position: buffers first written there
  std::vector<std::vector<int>> free_after_;    // per schedule position: buffers dead after it
  std::vector<kernels::KernelFn> kernels_;      // per graph op
  std::vector<std::vector<std::byte>> staged_;  // per tensor: host data for the next step
  bool setup_done_ = false;
  std::int64_t steps_completed_ = 0;
  std::int64_t allocations_during_steps_ = 0;
};

}  // namespace memplan::runtime
