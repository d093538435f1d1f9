#include "memplan/planner/order_free_bound.h"

#include <algorithm>


namespace memplan::planner {

StepSkeleton StepSkeleton::of(const graph::Graph& graph) {
  StepSkeleton s;
  const auto n_tensors = static_cast<std::size_t>(graph.num_tensors());
  s.tensors.resize(n_tensors);
  for (std::size_t t = 0; t < n_tensors; ++t) {
    const graph::TensorDesc& desc = graph.tensor(static_cast<TensorId>(t));
    s.tensors[t] = Tensor{graph.storage_root(static_cast<TensorId>(t)), desc.size_bytes(), desc.role,
                          !desc.external && !desc.host, false};
  }
  for (TensorId t : graph.retained) s.tensors[static_cast<std::size_t>(graph.storage_root(t))].result = true;
  for (TensorId t : {graph.loss, graph.output}) {
    if (t != kNoTensor) s.tensors[static_cast<std::size_t>(graph.storage_root(t))].result = true;
  }
  s.ops.reserve(static_cast<std::size_t>(graph.num_ops()));
  for (const graph::Op& op : graph.ops()) s.add_op(op.kind, op.inputs, op.outputs, op.updates);
  return s;
}

void StepSkeleton::add_op(graph::OpKind kind, std::span<const TensorId> inputs, std::span<const TensorId> outputs,
                          std::span<const TensorId> updates) {
  Op op;
  op.kind = kind;
  op.begin = static_cast<int>(refs.size());
  refs.insert(refs.end(), inputs.begin(), inputs.end());
  op.outputs = static_cast<int>(refs.size());
  refs.insert(refs.end(), outputs.begin(), outputs.end());
  op.updates = static_cast<int>(refs.size());
  refs.insert(refs.end(), updates.begin(), updates.end());
  op.end = static_cast<int>(refs.size());
  ops.push_back(op);
}

std::optional<Bytes> order_free_lower_bound(const StepSkeleton& step, const PlanOptions& options, Bytes scratch_bytes) {
  constexpr Bytes kLargest = Bytes{1} << 56;  // as memory_plan.cpp: larger sizes take the full path
  const std::size_t n_ops = step.ops.size();
  const std::size_t n_tensors = step.tensors.size();
  auto root_of = [&](int ref) { return static_cast<std::size_t>(step.tensors[static_cast<std::size_t>(step.refs[static_cast<std::size_t>(ref)])].root); };

  // Per storage root (liveness.h's buffers, each root on its own: see `shared` below): the first
  // and last op touching it in program order; and each tensor's producer.
  std::vector<int> first(n_tensors, -1), last(n_tensors, -1), producer(n_tensors, -1);
  for (std::size_t i = 0; i < n_ops; ++i) {
    const StepSkeleton::Op& op = step.ops[i];
    for (int e = op.begin; e < op.end; ++e) {
      const std::size_t r = root_of(e);
      if (first[r] < 0) first[r] = static_cast<int>(i);
      last[r] = static_cast<int>(i);
    }
    for (int e = op.outputs; e < op.updates; ++e) producer[static_cast<std::size_t>(step.refs[static_cast<std::size_t>(e)])] = static_cast<int>(i);
  }
  Bytes persistent = 0;
  struct Transient {
    std::size_t root;
    Bytes footprint;
    bool input;   // live from the step's start
    bool result;  // live to its end
  };
  std::vector<Transient> transients;
  std::vector<Bytes> change(n_ops + 1, 0);  // program order's live transient bytes, as differences
  for (std::size_t r = 0; r < n_tensors; ++r) {
    const StepSkeleton::Tensor& t = step.tensors[r];
    if (first[r] < 0 || t.root != static_cast<TensorId>(r) || !t.in_arena) continue;
    if (t.size_bytes > kLargest || persistent > kLargest) return std::nullopt;
    const Bytes bytes = buffer_footprint(t.size_bytes, options.guard_bytes);
    if (graph::is_persistent(t.role)) {
      persistent += bytes;
      continue;
    }
    const bool input = t.role == graph::Role::input;
    transients.push_back({r, bytes, input, t.result});
    change[input ? 0 : static_cast<std::size_t>(first[r])] += bytes;
    change[(t.result ? n_ops - 1 : static_cast<std::size_t>(last[r])) + 1] -= bytes;
  }
  const Bytes workspace = options.workspace_bytes + scratch_bytes;
  if (workspace > 0) persistent += align_up(workspace, kArenaAlignment);
  if (n_ops == 0) return persistent;

  // The probes: the ops where program order holds the most live bytes.
  std::vector<std::pair<Bytes, std::size_t>> live_at(n_ops);
  Bytes live = 0;
  for (std::size_t i = 0; i < n_ops; ++i) {
    live += change[i];
    live_at[i] = {live, i};
  }
  constexpr std::size_t kProbes = 8;
  const std::size_t probes = std::min(kProbes, n_ops);
  std::partial_sort(live_at.begin(), live_at.begin() + static_cast<std::ptrdiff_t>(probes), live_at.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });

  // Producer-to-reader dependences: every order plan_memory considers keeps them (check_schedule),
  // so an op reachable backward from X runs before X in all of them, one reachable forward after.
  // Both directions as flat adjacency arrays (offsets, then neighbours).
  std::vector<int> producer_start(n_ops + 1, 0), reader_start(n_ops + 1, 0);
  auto each_dependence = [&](auto&& visit) {
    for (std::size_t i = 0; i < n_ops; ++i) {
      for (int e = step.ops[i].begin; e < step.ops[i].outputs; ++e) {
        const int p = producer[static_cast<std::size_t>(step.refs[static_cast<std::size_t>(e)])];
        if (p >= 0 && static_cast<std::size_t>(p) != i) visit(static_cast<std::size_t>(p), i);
      }
    }
  };
  each_dependence([&](std::size_t p, std::size_t i) {
    ++producer_start[i + 1];
    ++reader_start[p + 1];
  });
  for (std::size_t i = 0; i < n_ops; ++i) {
    producer_start[i + 1] += producer_start[i];
    reader_start[i + 1] += reader_start[i];
  }
  std::vector<int> producer_of(static_cast<std::size_t>(producer_start[n_ops]));
  std::vector<int> reader_of(static_cast<std::size_t>(reader_start[n_ops]));
  {
    std::vector<int> next_producer(producer_start.begin(), producer_start.end() - 1);
    std::vector<int> next_reader(reader_start.begin(), reader_start.end() - 1);
    each_dependence([&](std::size_t p, std::size_t i) {
      producer_of[static_cast<std::size_t>(next_producer[i]++)] = static_cast<int>(p);
      reader_of[static_cast<std::size_t>(next_reader[p]++)] = static_cast<int>(i);
    });
  }
  std::vector<std::size_t> stack;
  auto reach = [&](std::size_t from, const std::vector<int>& start, const std::vector<int>& edges, std::vector<char>& seen) {
    seen.assign(n_ops, 0);
    stack.assign(1, from);
    seen[from] = 1;
    while (!stack.empty()) {
      const std::size_t i = stack.back();
      stack.pop_back();
      for (int e = start[i]; e < start[i + 1]; ++e) {
        const auto j = static_cast<std::size_t>(edges[static_cast<std::size_t>(e)]);
        if (seen[j] != 0) continue;
        seen[j] = 1;
        stack.push_back(j);
      }
    }
  };

  Bytes peak = 0;
  std::vector<char> before, after, touched_before, touched_after;
  for (std::size_t k = 0; k < probes; ++k) {
    const std::size_t x = live_at[k].second;
    reach(x, producer_start, producer_of, before);
    reach(x, reader_start, reader_of, after);
    // Per root: touched by an op that runs no later than X in every order, and by one no earlier.
    touched_before.assign(n_tensors, 0);
    touched_after.assign(n_tensors, 0);
    for (std::size_t i = 0; i < n_ops; ++i) {
      if (before[i] == 0 && after[i] == 0) continue;
      for (int e = step.ops[i].begin; e < step.ops[i].end; ++e) {
        const std::size_t r = root_of(e);
        touched_before[r] = static_cast<char>(touched_before[r] | before[i]);
        touched_after[r] = static_cast<char>(touched_after[r] | after[i]);
      }
    }
    // Roots merged in place (liveness.h) share a buffer, and two of them are live at once only at
    // the op that writes one over the other: an output X may write over an input is counted
    // through the input alone.
    std::size_t shared = n_tensors;
    const StepSkeleton::Op& op_x = step.ops[x];
    if (options.in_place && op_x.updates - op_x.outputs == 1) {
      const auto out = static_cast<std::size_t>(step.refs[static_cast<std::size_t>(op_x.outputs)]);
      for (int e = op_x.begin; e < op_x.outputs; ++e) {
        const auto in = static_cast<std::size_t>(step.refs[static_cast<std::size_t>(e)]);
        if (graph::op_info(op_x.kind).may_run_in_place(e - op_x.begin) &&
            step.tensors[in].size_bytes == step.tensors[out].size_bytes) {
          shared = static_cast<std::size_t>(step.tensors[out].root);
        }
      }
    }
    Bytes forced = 0;
    for (const Transient& b : transients) {
      // Lifetimes: an input is live from the start, a step result to the end.
      if ((b.input || touched_before[b.root] != 0) && (b.result || touched_after[b.root] != 0) && b.root != shared) {
        forced += b.footprint;
      }
    }
    peak = std::max(peak, forced);
  }
  return persistent + peak;
}

Result<Bytes> order_free_lower_bound(const graph::Graph& graph, const PlanOptions& options) {
  const Bytes scratch = kernel_scratch_bytes(graph, options);
  if (auto bound = order_free_lower_bound(StepSkeleton::of(graph), options, scratch)) return *bound;
  return arena_lower_bound(graph, options);
}

}  // namespace memplan::planner
