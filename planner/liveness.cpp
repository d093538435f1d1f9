#include "planner/liveness.h"

#include <algorithm>

#include "common/check.h"

namespace memplan::planner {

using graph::Graph;
using graph::Op;

Schedule default_schedule(const Graph& graph) {
  Schedule schedule(static_cast<std::size_t>(graph.num_ops()));
  for (int i = 0; i < graph.num_ops(); ++i) schedule[static_cast<std::size_t>(i)] = i;
  return schedule;
}

Lifetimes compute_lifetimes(const Graph& graph, const Schedule& schedule) {
  MEMPLAN_CHECK(static_cast<int>(schedule.size()) == graph.num_ops(),
                "schedule has " << schedule.size() << " ops, graph " << graph.num_ops());
  Lifetimes out;
  out.num_steps_ops = graph.num_ops();
  const OpIndex end = std::max(0, graph.num_ops() - 1);
  out.buffer_of_tensor.assign(static_cast<std::size_t>(graph.num_tensors()), -1);

  // One buffer per storage root that is used at all.
  std::vector<bool> used(static_cast<std::size_t>(graph.num_tensors()), false);
  for (const Op& op : graph.ops()) {
    for (const auto* list : {&op.inputs, &op.outputs, &op.updates}) {
      for (TensorId t : *list) used[static_cast<std::size_t>(graph.storage_root(t))] = true;
    }
  }
  for (TensorId t = 0; t < graph.num_tensors(); ++t) {
    const graph::TensorDesc& desc = graph.tensor(t);
    if (desc.is_view() || !used[static_cast<std::size_t>(t)]) continue;
    BufferLifetime b;
    b.root = t;
    b.size_bytes = desc.size_bytes();
    b.persistent = graph::is_persistent(desc.role);
    b.first_op = b.persistent || desc.role == graph::Role::input ? 0 : -1;
    b.last_op = b.persistent ? end : b.first_op;
    out.buffer_of_tensor[static_cast<std::size_t>(t)] = static_cast<int>(out.buffers.size());
    out.buffers.push_back(b);
  }
  for (TensorId t = 0; t < graph.num_tensors(); ++t) {
    const TensorId root = graph.storage_root(t);
    out.buffer_of_tensor[static_cast<std::size_t>(t)] =
        out.buffer_of_tensor[static_cast<std::size_t>(root)];
  }

  auto touch = [&](TensorId t, OpIndex position, bool writes) {
    const int b = out.buffer_of_tensor[static_cast<std::size_t>(t)];
    MEMPLAN_CHECK(b >= 0, "tensor '" << graph.tensor(t).name << "' has no buffer");
    BufferLifetime& buf = out.buffers[static_cast<std::size_t>(b)];
    if (buf.persistent) return;
    if (buf.first_op < 0) {
      MEMPLAN_CHECK(writes, "'" << graph.tensor(t).name << "' is read at position " << position
                                << " before any op writes it");
      buf.first_op = position;
    }
    buf.last_op = std::max(buf.last_op, position);
  };
  for (OpIndex pos = 0; pos < static_cast<OpIndex>(schedule.size()); ++pos) {
    const Op& op = graph.ops()[static_cast<std::size_t>(schedule[static_cast<std::size_t>(pos)])];
    // Outputs first: a view's producer "writes" its base only in the sense of aliasing it; the
    // base must already exist, which the read check below enforces through the view's input.
    for (TensorId t : op.inputs) touch(t, pos, false);
    for (TensorId t : op.outputs) touch(t, pos, !graph.tensor(t).is_view());
  }
  std::vector<TensorId> results = graph.retained;
  results.push_back(graph.loss);
  results.push_back(graph.output);
  for (TensorId result : results) {
    if (result == kNoTensor) continue;
    const int b = out.buffer_of_tensor[static_cast<std::size_t>(result)];
    if (b < 0) continue;
    BufferLifetime& buf = out.buffers[static_cast<std::size_t>(b)];
    buf.last_op = end;
    buf.step_result = true;
  }
  for (const BufferLifetime& b : out.buffers) {
    MEMPLAN_CHECK(b.first_op >= 0, "buffer of '" << graph.tensor(b.root).name << "' is never written");
  }
  return out;
}

}  // namespace memplan::planner
