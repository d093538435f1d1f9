// Timed steps on made-up inputs (see timed_step.h).
#include "memplan/runtime/timed_step.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "memplan/common/rng.h"
#include "memplan/runtime/executor.h"

namespace memplan::runtime {
namespace {

// The exclusive upper bound of the values an integer input may hold: the smallest range any op
// reading it accepts.
std::int64_t index_range(const graph::Graph& g, TensorId id) {
  std::int64_t range = std::numeric_limits<std::int64_t>::max();
  for (const graph::Op& op : g.ops()) {
    for (std::size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i] != id) continue;
      if (op.kind == graph::OpKind::embedding && i == 0) range = std::min(range, g.tensor(op.inputs[1]).shape[0]);
      if (op.kind == graph::OpKind::softmax_cross_entropy && i == 1) {
        range = std::min(range, g.tensor(op.inputs[0]).shape.cols());
      }
      if (op.kind == graph::OpKind::softmax_cross_entropy_backward && i == 2) {
        range = std::min(range, g.tensor(op.inputs[1]).shape.cols());
      }
    }
  }
  return range == std::numeric_limits<std::int64_t>::max() ? 1 : range;
}

}  // namespace

Result<StepProfile> time_steps(const planner::PlannedStep& step, Device& device, std::uint64_t seed, int warmup,
                               int steps) {
  if (!step.runnable) return Error{"this plan is an answer only (the step does not fit) and cannot run"};
  Executor executor(step, device);
  if (Status s = executor.setup(); !s) return Error{s.error().message};
  executor.initialize_persistent(seed);
  const graph::Graph& g = step.graph;
  Rng rng(seed + 1);
  for (TensorId id : g.tensors_with_role(graph::Role::input)) {
    const graph::TensorDesc& desc = g.tensor(id);
    const auto n = static_cast<std::size_t>(desc.shape.numel());
    if (desc.dtype == graph::DType::i32) {
      const std::int64_t range = index_range(g, id);
      std::vector<std::int32_t> values(n);
      for (auto& v : values) v = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(range)));
      executor.set_input(id, values.data(), desc.size_bytes());
    } else {
      std::vector<float> values(n);
      for (float& v : values) v = rng.uniform01();
      executor.set_input_values(id, values);
    }
  }
  for (int i = 0; i < warmup; ++i) {
    if (Status s = executor.run_step(); !s) return Error{s.error().message};
  }
  executor.set_profiling(true);
  for (int i = 0; i < steps; ++i) {
    if (Status s = executor.run_step(); !s) return Error{s.error().message};
  }
  return executor.profile();
}

}  // namespace memplan::runtime
