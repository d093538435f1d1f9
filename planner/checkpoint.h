// Activation checkpointing (rematerialisation) of a training step: when the planned arena is too
// large, drop some forward activations after their forward use and recompute them just before
// the backward ops that read them, choosing what to keep by cost. The result is a new training
// step graph with "recompute:NAME" ops (phase recompute); memory is always measured by planning
// that graph with plan_memory, never by summing sizes.
//
// The forward pass is cut into a chain of stages at every tensor that is the only activation
// crossing from earlier ops to later ones (a residual stream between transformer half-blocks,
// a ResNet block's output, an MLP layer's output). Strategies choose a schedule of the chain
// (chain_dp.h): which stage runs forward when, keeping what, before each stage's backward:
//   none     nothing is recomputed;
//   sqrt     Chen et al. 2016: segments of about sqrt(n) stages, each recomputed from the kept
//            boundary before it, except the last;
//   optimal  the nested chain DP (Beaumont et al. 2019; exact for its family under its memory
//            model) over every memory limit, then the least recomputation whose planned arena
//            fits (without a budget: the smallest planned arena);
//   auto     the strategy with the least recomputation whose planned arena fits the budget.
// Inside a stage that runs again keeping everything, every activation its backward reads is
// recomputed with whatever of the stage it depends on (a sound choice: a stage's internals are
// read by its own backward only, so they are needed together); a run that keeps only its output
// recomputes just what that output needs.
//
// Recompute ops are clones (same kind, attributes and parameters) of forward ops, so they compute
// the same bits: dropout masks derive from the op's seed attribute and the step, not from the
// op's position. Ops that update state in place (batch-norm running statistics) are never cloned.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/chain_dp.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::planner {

enum class CheckpointStrategy { kNone, kSqrt, kOptimal, kAuto };

// The names --checkpoint takes and reports print (common/enum_names.h).
inline constexpr EnumName<CheckpointStrategy> kCheckpointStrategyNames[] = {{"none", CheckpointStrategy::kNone},
                                                                            {"sqrt", CheckpointStrategy::kSqrt},
                                                                            {"optimal", CheckpointStrategy::kOptimal},
                                                                            {"auto", CheckpointStrategy::kAuto}};

Result<CheckpointStrategy> parse_checkpoint_strategy(std::string_view name);  // error lists the valid names
std::string_view checkpoint_strategy_name(CheckpointStrategy s);

// The least arena any strategy reaches for a step, and the strategy that reaches it.
struct MinimumArena {
  CheckpointStrategy strategy = CheckpointStrategy::kNone;
  Bytes arena_bytes = 0;
  double extra_flops_fraction = 0.0;
};

struct CheckpointOutcome {
  graph::Graph graph;  // the training step with recompute ops ("recompute:NAME") inserted
  CheckpointStrategy chosen = CheckpointStrategy::kNone;  // for kAuto: the strategy it picked
  Bytes arena_bytes_without = 0;     // planned arena of the step without checkpointing
  Bytes arena_bytes_with = 0;        // planned arena of `graph`
  MemoryPlan plan;                   // `graph` planned with the caller's options
  double extra_flops_fraction = 0.0;  // recompute FLOPs / FLOPs of the un-checkpointed step
  // Whether arena_bytes_with meets the budget (true without one). A budget that cannot be met is
  // an answer, not an error: `graph` is then the strategy's smallest arena (kAuto: the least of
  // all strategies with find_minimum, else optimal's), and `minimum` says what any strategy
  // reaches (with find_minimum).
  bool fits = true;
  std::optional<MinimumArena> minimum;
  // With stop_when_unmet and a budget, for optimal (and auto once it checkpoints): about the
  // smallest arena the strategy's frontier reaches (Checkpointer's estimate: the least of the
  // points' packed arenas and lower bounds known, the least-memory end's included). A batch-size
  // search aims with it, since a fitting answer's arena says nothing of the room left.
  std::optional<Bytes> least_arena_estimate;
};

struct CheckpointRequest {
  CheckpointStrategy strategy = CheckpointStrategy::kNone;
  std::optional<Bytes> budget;  // arena bytes; nullopt: sqrt/optimal minimise memory, auto = none
  // When the budget is not met, also search the least arena of every strategy (`minimum`).
  bool find_minimum = true;
  // A batch-size search only needs "fits or not": an unmet budget then returns as soon as it is
  // known, with `graph` and `plan` those of the candidate that did not fit (or of the step itself).
  bool stop_when_unmet = false;
  // Only "fits or not" is wanted, also when it fits: optimal (and auto) may choose any frontier
  // point whose arena meets the budget, searched from the least-memory end, instead of the one
  // with the least recomputation. Whether some point fits does not depend on the order.
  bool any_fitting = false;
};

Result<CheckpointOutcome> apply_checkpointing(const graph::Graph& training_step, const CheckpointRequest& request,
                                              const PlanOptions& options = {});

// The FLOPs of one execution of every op of a graph (op.h documents each op's count).
double graph_flops(const graph::Graph& graph);

// The chain checkpointing works on, for inspection and benchmarks: one entry per stage.
struct CheckpointChain {
  std::vector<ChainStage> stages;
  std::vector<int> last_op;  // per stage: index in graph.ops() of its last forward op
};
CheckpointChain find_checkpoint_chain(const graph::Graph& training_step);

// The training step rewritten to follow a schedule of the chain (chain_dp.h): a stage's first
// forward run is the forward pass itself; every later run adds recompute ops (a kForward run only
// those its output needs), placed just before the backward of the next stage the schedule
// differentiates; each backward op reads the latest run's version of its forward inputs.
graph::Graph rematerialize(const graph::Graph& training_step, const CheckpointChain& chain,
                           const std::vector<ChainAction>& actions);
// The same for a single-level segmentation.
graph::Graph rematerialize(const graph::Graph& training_step, const CheckpointChain& chain,
                           const std::vector<ChainSegment>& segments);

// order_free_lower_bound (order_free_bound.h) of rematerialize(training_step, chain, actions),
// computed on the step's skeleton without building the rewritten graph, as a checkpoint
// frontier's search computes it for each point: the same bytes.
Result<Bytes> rematerialized_order_free_bound(const graph::Graph& training_step, const CheckpointChain& chain,
                                              const std::vector<ChainAction>& actions, const PlanOptions& options);

}  // namespace memplan::planner
