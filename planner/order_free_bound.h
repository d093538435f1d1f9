// A lower bound on a step's planned arena that holds for every op order, found without searching
// one: at a few ops (program order's peaks), the buffers every dependence-respecting order keeps
// live there, written by an op that must run before it and touched by one that must run after.
// It is below the searched order's bound (memory_plan.h, arena_lower_bound), usually by well
// under 1%, and costs a few reachability walks instead of an order search. A checkpoint
// frontier's search rules most candidates out with it and searches an order only where it
// cannot.
#pragma once

#include <optional>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::planner {

// A step reduced to what the bound reads, in flat arrays: per op (program order) the tensors it
// reads, writes and updates; per tensor its storage root and bytes. Cheap to copy and to extend,
// so a search over rewrites of one step (checkpoint.h's rematerialize) builds one per candidate
// without building the candidate's graph.
struct StepSkeleton {
  struct Tensor {
    TensorId root = kNoTensor;  // its storage (liveness.h's buffers are per root)
    Bytes size_bytes = 0;
    graph::Role role = graph::Role::activation;
    bool in_arena = true;  // not external storage or host memory
    bool result = false;   // a root the step returns (loss, output, retained): live to the end
  };
  struct Op {
    graph::OpKind kind{};
    // Ranges of `refs`: inputs [begin, outputs), outputs [outputs, updates), updates [updates, end).
    int begin = 0, outputs = 0, updates = 0, end = 0;
  };
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  std::vector<TensorId> refs;

  static StepSkeleton of(const graph::Graph& graph);
  // Appends an op; its ranges follow the current end of `refs`.
  void add_op(graph::OpKind kind, std::span<const TensorId> inputs, std::span<const TensorId> outputs,
              std::span<const TensorId> updates);
};

// The bound for `step` with its kernel scratch (graph::kernel_scratch_bytes) beside
// options.workspace_bytes; nothing when a size is too large for an arena (the graph overload
// then takes arena_lower_bound's path, which says what is wrong).
std::optional<Bytes> order_free_lower_bound(const StepSkeleton& step, const PlanOptions& options, Bytes scratch_bytes);
Result<Bytes> order_free_lower_bound(const graph::Graph& graph, const PlanOptions& options = {});

}  // namespace memplan::planner
