#include "memplan/planner/liveness.h"

#include <algorithm>

#include "memplan/common/check.h"

namespace memplan::planner {

using graph::Graph;
using graph::Op;
using graph::OpKind;

Schedule default_schedule(const Graph& graph) {
  Schedule schedule(static_cast<std::size_t>(graph.num_ops()));
  for (int i = 0; i < graph.num_ops(); ++i) schedule[static_cast<std::size_t>(i)] = i;
  return schedule;
}

namespace {

// Storage roots merged by in-place decisions, with path compression.
struct Merges {
  std::vector<TensorId> parent;
  TensorId find(TensorId t) {
    while (parent[static_cast<std::size_t>(t)] != t) {
      parent[static_cast<std::size_t>(t)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(t)])];
      t = parent[static_cast<std::size_t>(t)];
    }
    return t;
  }
};

}  // namespace

Lifetimes compute_lifetimes(const Graph& graph, const Schedule& schedule, const LivenessOptions& options) {
  MEMPLAN_CHECK(static_cast<int>(schedule.size()) == graph.num_ops(),
                "schedule has " << schedule.size() << " ops, graph " << graph.num_ops());
  const auto n_tensors = static_cast<std::size_t>(graph.num_tensors());
  const OpIndex end = std::max(0, graph.num_ops() - 1);
  auto op_at = [&](OpIndex pos) -> const Op& {
    return graph.ops()[static_cast<std::size_t>(schedule[static_cast<std::size_t>(pos)])];
  };

  std::vector<bool> is_result(n_tensors, false);
  for (TensorId t : graph.retained) is_result[static_cast<std::size_t>(graph.storage_root(t))] = true;
  for (TensorId t : {graph.loss, graph.output}) {
    if (t != kNoTensor) is_result[static_cast<std::size_t>(graph.storage_root(t))] = true;
  }

  // Last position each storage root is touched (through itself or any view of it).
  std::vector<OpIndex> last_use(n_tensors, -1);
  for (OpIndex pos = 0; pos < static_cast<OpIndex>(schedule.size()); ++pos) {
    const Op& op = op_at(pos);
    for (const auto* list : {&op.inputs, &op.outputs, &op.updates}) {
      for (TensorId t : *list) last_use[static_cast<std::size_t>(graph.storage_root(t))] = pos;
    }
  }

  // In-place decisions: an output root joins an input's merged buffer when that buffer is
  // last touched at this op, has the output's size, and is transient and not a step result.
  Merges merges{std::vector<TensorId>(n_tensors)};
  for (std::size_t t = 0; t < n_tensors; ++t) merges.parent[t] = static_cast<TensorId>(t);
  std::vector<OpIndex> merged_last(last_use);  // per merged root
  std::vector<bool> merged_result(is_result);  // per merged root
  if (options.in_place) {
    for (OpIndex pos = 0; pos < static_cast<OpIndex>(schedule.size()); ++pos) {
      const Op& op = op_at(pos);
      if (op.outputs.size() != 1 || graph.tensor(op.outputs[0]).is_view()) continue;
      const TensorId out = op.outputs[0];
      for (int i = 0; i < static_cast<int>(op.inputs.size()); ++i) {
        if (!graph::op_info(op.kind).may_run_in_place(i)) continue;
        const TensorId in_root = merges.find(graph.storage_root(op.inputs[static_cast<std::size_t>(i)]));
        const graph::TensorDesc& in_desc = graph.tensor(in_root);
        if (graph::is_persistent(in_desc.role) || merged_result[static_cast<std::size_t>(in_root)]) continue;
        if (merged_last[static_cast<std::size_t>(in_root)] != pos) continue;
        if (in_desc.size_bytes() != graph.tensor(out).size_bytes()) continue;
        merges.parent[static_cast<std::size_t>(out)] = in_root;
        merged_last[static_cast<std::size_t>(in_root)] = last_use[static_cast<std::size_t>(out)];
        merged_result[static_cast<std::size_t>(in_root)] = is_result[static_cast<std::size_t>(out)];
        break;
      }
    }
  }

  Lifetimes lifetimes;
  lifetimes.buffer_of_tensor.assign(n_tensors, -1);
  std::vector<int> buffer_of_root(n_tensors, -1);
  for (TensorId t = 0; t < graph.num_tensors(); ++t) {
    const TensorId root = graph.storage_root(t);
    if (last_use[static_cast<std::size_t>(root)] < 0) continue;  // nothing touches it
    if (graph.tensor(root).external) continue;  // the caller's storage (a KV cache), not the arena's
    if (graph.tensor(root).host) continue;      // host memory (MemoryPlan::host_buffers), not the arena's
    const TensorId merged = merges.find(root);
    int& b = buffer_of_root[static_cast<std::size_t>(merged)];
    if (b < 0) {
      const graph::TensorDesc& desc = graph.tensor(merged);
      BufferLifetime life;
      life.root = merged;
      life.size_bytes = desc.size_bytes();
      life.persistent = graph::is_persistent(desc.role);
      life.first_op = life.persistent || desc.role == graph::Role::input ? 0 : -1;
      life.last_op = life.persistent ? end : std::max<OpIndex>(0, life.first_op);
      b = static_cast<int>(lifetimes.buffers.size());
      lifetimes.buffers.push_back(life);
    }
    lifetimes.buffer_of_tensor[static_cast<std::size_t>(t)] = b;
  }

  for (OpIndex pos = 0; pos < static_cast<OpIndex>(schedule.size()); ++pos) {
    const Op& op = op_at(pos);
    auto touch = [&](TensorId t, bool writes) {
      const int b = lifetimes.buffer_of_tensor[static_cast<std::size_t>(t)];
      if (b < 0) return;  // external storage
      BufferLifetime& buf = lifetimes.buffers[static_cast<std::size_t>(b)];
      if (buf.persistent) return;
      if (buf.first_op < 0) {
        MEMPLAN_CHECK(writes, "'" << graph.tensor(t).name << "' is read at position " << pos
                                  << " before any op writes it");
        buf.first_op = pos;
      }
      buf.last_op = std::max(buf.last_op, pos);
    };
    for (TensorId t : op.inputs) touch(t, false);
    // A view's producer only aliases its base, which must already hold data.
    for (TensorId t : op.outputs) touch(t, !graph.tensor(t).is_view());
    for (TensorId t : op.updates) touch(t, false);
  }
  for (BufferLifetime& buf : lifetimes.buffers) {
    if (is_result[static_cast<std::size_t>(buf.root)] || merged_result[static_cast<std::size_t>(buf.root)]) {
      buf.step_result = true;
      buf.last_op = end;
    }
    MEMPLAN_CHECK(buf.first_op >= 0, "buffer of '" << graph.tensor(buf.root).name << "' is never written");
  }
  return lifetimes;
}

}  // namespace memplan::planner
