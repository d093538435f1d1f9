// Lifetimes of a training step's buffers under a schedule: which storage each tensor lives in
// and during which ops that storage must hold its value. Pure function of graph + schedule.
#pragma once

#include <vector>

#include "memplan/common/types.h"
#include "memplan/graph/graph.h"

namespace memplan::planner {

// An op order: schedule[i] is the index (in graph.ops()) of the i-th op to run.
using Schedule = std::vector<int>;

// Program order: the order ops were appended (forward, backward, optimizer).
Schedule default_schedule(const graph::Graph& graph);

// One storage buffer: a root tensor and every view of it.
struct BufferLifetime {
  TensorId root = kNoTensor;
  Bytes size_bytes = 0;
  // Inclusive schedule positions: written first at first_op, read last at last_op.
  OpIndex first_op = 0;
  OpIndex last_op = 0;
  bool persistent = false;  // parameters and optimizer state: alive across steps
  bool step_result = false; // loss, output or retained: kept until the step ends, to be read
};

struct Lifetimes {
  std::vector<BufferLifetime> buffers;
  std::vector<int> buffer_of_tensor;  // per tensor: index into buffers (views share their base's); -1 unused or external
};

struct LivenessOptions {
  // Let an elementwise op write its output over an input that dies at that op (activation
  // backward, gradient accumulation, bias add, ReLU): the two tensors then share one buffer.
  // Kernels of these ops read element i before writing element i, so this is always safe.
  bool in_place = false;
};

// Inputs are written before the first op (first_op = 0); the loss, output and retained tensors
// live to the end of the step; persistent buffers span the whole schedule. A buffer nothing
// reads dies where it is written.
Lifetimes compute_lifetimes(const graph::Graph& graph, const Schedule& schedule,
                            const LivenessOptions& options = {});

}  // namespace memplan::planner
