#include "memplan/planner/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <set>
#include <thread>

#include "memplan/common/check.h"
#include "memplan/planner/order_free_bound.h"

namespace memplan::planner {

using graph::Graph;
using graph::Op;
using graph::Phase;

Result<CheckpointStrategy> parse_checkpoint_strategy(std::string_view name) {
  return parse_enum(kCheckpointStrategyNames, name, "checkpoint strategy");
}

std::string_view checkpoint_strategy_name(CheckpointStrategy s) { return enum_name(kCheckpointStrategyNames, s); }

namespace {

// Inputs and persistent state (and views of them) are alive for the whole step anyway.
bool is_free(const Graph& g, TensorId t) {
  const graph::Role role = g.tensor(g.storage_root(t)).role;
  return graph::is_persistent(role) || role == graph::Role::input;
}

// A ZeRO-3 parameter gathered from this rank's persistent shard: a recompute run gathers it again
// (a collective in the backward, at the same place on every rank), so it neither blocks a cut
// between stages nor stays alive for one.
bool regatherable(const Graph& g, TensorId t) {
  const int p = g.producer(t);
  if (p < 0) return false;
  const Op& op = g.ops()[static_cast<std::size_t>(p)];
  return op.kind == graph::OpKind::all_gather && op.inputs.size() == 1 && graph::is_persistent(g.tensor(op.inputs[0]).role);
}

std::vector<bool> read_by_backward(const Graph& g) {
  std::vector<bool> read(static_cast<std::size_t>(g.num_tensors()), false);
  for (const Op& op : g.ops()) {
    if (op.phase != Phase::backward) continue;
    for (TensorId t : op.inputs) read[static_cast<std::size_t>(t)] = true;
  }
  return read;
}

std::vector<bool> step_result_roots(const Graph& g) {
  std::vector<bool> result(static_cast<std::size_t>(g.num_tensors()), false);
  for (TensorId t : g.retained) result[static_cast<std::size_t>(g.storage_root(t))] = true;
  for (TensorId t : {g.loss, g.output}) {
    if (t != kNoTensor) result[static_cast<std::size_t>(g.storage_root(t))] = true;
  }
  return result;
}


}  // namespace

double graph_flops(const Graph& graph) {
  double total = 0.0;
  for (const Op& op : graph.ops()) total += graph::op_flops(graph, op);
  return total;
}

CheckpointChain find_checkpoint_chain(const Graph& g) {
  const auto nt = static_cast<std::size_t>(g.num_tensors());
  std::vector<int> forward;  // op indices in program order
  for (int i = 0; i < g.num_ops(); ++i) {
    if (g.ops()[static_cast<std::size_t>(i)].phase == Phase::forward) forward.push_back(i);
  }
  std::vector<int> last_read(nt, -1);  // position in `forward`
  for (int p = 0; p < static_cast<int>(forward.size()); ++p) {
    for (TensorId t : g.ops()[static_cast<std::size_t>(forward[static_cast<std::size_t>(p)])].inputs) {
      last_read[static_cast<std::size_t>(t)] = p;
    }
  }
  // A cut after position p: the only activation produced so far that a later forward op reads
  // is the output of op p.
  std::vector<int> cut_positions;
  std::vector<TensorId> cut_tensors;
  std::vector<bool> open(nt, false);
  int num_open = 0;
  for (int p = 0; p < static_cast<int>(forward.size()); ++p) {
    const Op& op = g.ops()[static_cast<std::size_t>(forward[static_cast<std::size_t>(p)])];
    for (TensorId t : op.inputs) {
      if (open[static_cast<std::size_t>(t)] && last_read[static_cast<std::size_t>(t)] == p) {
        open[static_cast<std::size_t>(t)] = false;
        --num_open;
      }
    }
    for (TensorId t : op.outputs) {
      if (!is_free(g, t) && !regatherable(g, t) && last_read[static_cast<std::size_t>(t)] > p) {
        open[static_cast<std::size_t>(t)] = true;
        ++num_open;
      }
    }
    if (p + 1 < static_cast<int>(forward.size()) && num_open == 1 && op.outputs.size() == 1 &&
        open[static_cast<std::size_t>(op.outputs[0])]) {
      cut_positions.push_back(p);
      cut_tensors.push_back(op.outputs[0]);
    }
  }

  const std::vector<bool> backward_reads = read_by_backward(g);
  CheckpointChain chain;
  int first = 0;
  const int num_stages = static_cast<int>(cut_positions.size()) + 1;
  for (int s = 0; s < num_stages; ++s) {
    const bool last_stage = s + 1 == num_stages;
    const int end = last_stage ? static_cast<int>(forward.size()) - 1 : cut_positions[static_cast<std::size_t>(s)];
    const TensorId boundary = last_stage ? kNoTensor : cut_tensors[static_cast<std::size_t>(s)];
    ChainStage stage;
    std::set<TensorId> produced, saved_roots;
    for (int p = first; p <= end; ++p) {
      const Op& op = g.ops()[static_cast<std::size_t>(forward[static_cast<std::size_t>(p)])];
      stage.forward_flops += graph::op_flops(g, op);
      for (TensorId t : op.outputs) produced.insert(t);
    }
    for (TensorId t : produced) {
      if (!backward_reads[static_cast<std::size_t>(t)] || is_free(g, t)) continue;
      const TensorId root = g.storage_root(t);
      if (produced.count(root) == 0) continue;  // a view of an earlier stage's storage
      if (boundary != kNoTensor && root == g.storage_root(boundary)) continue;
      saved_roots.insert(root);
    }
    for (TensorId root : saved_roots) stage.internal_bytes += g.tensor(root).size_bytes();
    if (boundary != kNoTensor) stage.boundary_bytes = g.tensor(g.storage_root(boundary)).size_bytes();
    chain.stages.push_back(stage);
    chain.last_op.push_back(forward.empty() ? -1 : forward[static_cast<std::size_t>(end)]);
    first = end + 1;
  }
  if (forward.empty()) return {};
  return chain;
}

namespace {

// What rematerialize adds to a step for a list of actions, decided before anything is built:
// the recompute ops (clones of forward ops), the program order, and the backward inputs that read
// a run's version. Applied to the step's graph (rematerialize) or to its skeleton (a checkpoint
// frontier's cheap bounds), which then describe the same step.
struct RecomputeEdit {
  struct Clone {
    int op = 0;                    // the forward op it runs again
    std::vector<TensorId> inputs;  // in the edited step: clone k writes tensor num_tensors + k
    int copy = 1;                  // the how-manieth time `op` runs again (its name's suffix)
  };
  std::vector<Clone> clones;  // clone k is op num_ops + k of the edited step
  std::vector<int> order;     // the edited step's program order
  struct Replacement {
    int op = 0;
    int slot = 0;
    TensorId tensor = kNoTensor;
  };
  std::vector<Replacement> replacements;  // by op, then slot
};

// The decisions, with what they read of the step and chain computed once.
class Rematerializer {
 public:
  Rematerializer(const Graph& g, const CheckpointChain& chain);
  RecomputeEdit edit(const std::vector<ChainAction>& actions) const;

 private:
  int stage_of(TensorId t) const {
    const int p = g_.producer(t);
    return p < 0 ? -1 : stage_of_op_[static_cast<std::size_t>(p)];
  }
  // Tensors a run of their stage can produce again (inputs, persistent state and step results
  // are never recomputed: the originals stay).
  bool recomputable(TensorId t) const {
    return stage_of(t) >= 0 && !is_free(g_, t) && !results_[static_cast<std::size_t>(g_.storage_root(t))];
  }
  TensorId boundary(int stage) const {
    const Op& op = g_.ops()[static_cast<std::size_t>(chain_.last_op[static_cast<std::size_t>(stage)])];
    return op.outputs.empty() ? kNoTensor : op.outputs[0];
  }

  const Graph& g_;
  const CheckpointChain& chain_;
  std::vector<int> stage_of_op_;           // per op: its forward stage, or -1
  std::vector<std::vector<int>> stage_ops_;
  std::vector<bool> backward_reads_;
  std::vector<bool> results_;
  std::vector<int> anchor_;                // per stage: where its backward starts
  int first_backward_ = 0;
};

Rematerializer::Rematerializer(const Graph& g, const CheckpointChain& chain)
    : g_(g), chain_(chain), backward_reads_(read_by_backward(g)), results_(step_result_roots(g)) {
  const int num_ops = g.num_ops();
  const int num_stages = static_cast<int>(chain.stages.size());
  // Stage of each forward op.
  stage_of_op_.assign(static_cast<std::size_t>(num_ops), -1);
  stage_ops_.resize(static_cast<std::size_t>(num_stages));
  {
    int stage = 0;
    for (int i = 0; i < num_ops && stage < num_stages; ++i) {
      if (g.ops()[static_cast<std::size_t>(i)].phase != Phase::forward) continue;
      stage_of_op_[static_cast<std::size_t>(i)] = stage;
      stage_ops_[static_cast<std::size_t>(stage)].push_back(i);
      if (i == chain.last_op[static_cast<std::size_t>(stage)]) ++stage;
    }
  }
  // Where each stage's backward starts: its first backward op reading one of the stage's
  // activations other than its output (which the next stage's backward also reads), else its output.
  anchor_.assign(static_cast<std::size_t>(num_stages), -1);
  for (int i = 0; i < num_ops; ++i) {
    const Op& op = g.ops()[static_cast<std::size_t>(i)];
    if (op.phase != Phase::backward) continue;
    for (TensorId t : op.inputs) {
      const int s = stage_of(t);
      if (s < 0 || !recomputable(t) || t == boundary(s)) continue;
      if (anchor_[static_cast<std::size_t>(s)] < 0) anchor_[static_cast<std::size_t>(s)] = i;
    }
  }
  for (int i = 0; i < num_ops; ++i) {
    const Op& op = g.ops()[static_cast<std::size_t>(i)];
    if (op.phase != Phase::backward) continue;
    for (TensorId t : op.inputs) {
      const int s = stage_of(t);
      if (s >= 0 && recomputable(t) && anchor_[static_cast<std::size_t>(s)] < 0) anchor_[static_cast<std::size_t>(s)] = i;
    }
  }
  // Blocks go after the forward pass, at the earliest before the first backward op.
  while (first_backward_ < num_ops && g.ops()[static_cast<std::size_t>(first_backward_)].phase != Phase::backward) ++first_backward_;
}

RecomputeEdit Rematerializer::edit(const std::vector<ChainAction>& actions) const {
  const Graph& g = g_;
  const int num_ops = g.num_ops();
  const auto nt = static_cast<std::size_t>(g.num_tensors());
  const int num_stages = static_cast<int>(chain_.stages.size());
  RecomputeEdit edit;
  std::vector<TensorId> current(nt);  // the latest version of each tensor, as the actions run
  for (std::size_t t = 0; t < nt; ++t) current[t] = static_cast<TensorId>(t);
  std::vector<int> runs(static_cast<std::size_t>(num_stages), 0);
  std::vector<int> clone_count(static_cast<std::size_t>(num_ops), 0);
  struct Block {
    std::vector<int> ops;                              // indices in the edited step
    std::vector<std::pair<TensorId, TensorId>> versions;  // original -> the version this block makes
    int before = 0;                                    // runs just before this op of `g`
  };
  std::vector<Block> blocks;
  Block pending;
  int last_anchor = first_backward_;
  // Whether a run's output feeds a later run of the next stage (before that stage's backward);
  // if not, the backward reads the version that is already there.
  std::vector<bool> output_feeds_a_run(actions.size(), false);
  {
    std::vector<int> open_run(static_cast<std::size_t>(num_stages), -1);  // latest run of each stage
    for (std::size_t a = 0; a < actions.size(); ++a) {
      const int i = actions[a].stage;
      if (actions[a].kind == ChainActionKind::kBackward) continue;
      if (i > 0 && open_run[static_cast<std::size_t>(i - 1)] >= 0) {
        output_feeds_a_run[static_cast<std::size_t>(open_run[static_cast<std::size_t>(i - 1)])] = true;
      }
      open_run[static_cast<std::size_t>(i)] = static_cast<int>(a);
    }
  }
  // Per recompute run: the ops it runs, and the tensors it makes (by the original's id).
  std::vector<int> needed;
  std::vector<bool> is_needed(static_cast<std::size_t>(num_ops), false);
  std::vector<TensorId> made(nt, kNoTensor);
  for (std::size_t a = 0; a < actions.size(); ++a) {
    const ChainAction& action = actions[a];
    const int i = action.stage;
    if (action.kind == ChainActionKind::kBackward) {
      // Recompute runs go just before the backward of the next stage the schedule differentiates.
      int at = anchor_[static_cast<std::size_t>(i)];
      last_anchor = std::max(last_anchor, at);
      if (!pending.ops.empty()) {
        pending.before = last_anchor;
        blocks.push_back(std::move(pending));
        pending = Block{};
      }
      continue;
    }
    if (runs[static_cast<std::size_t>(i)]++ == 0) continue;  // the first run is the forward pass itself
    // What this run must produce: the stage's output, and when it keeps everything, every
    // activation the stage's backward reads; then what those depend on inside the stage.
    std::vector<TensorId> targets;
    if (output_feeds_a_run[a] && boundary(i) != kNoTensor && recomputable(boundary(i))) targets.push_back(boundary(i));
    // The output's previous version was read by the next stage's backward just before; its own
    // backward reads that one too rather than a copy (same bytes live, fewer FLOPs).
    if (action.kind == ChainActionKind::kForwardKeepAll) {
      const TensorId output_root = boundary(i) == kNoTensor ? kNoTensor : g.storage_root(boundary(i));
      for (int p : stage_ops_[static_cast<std::size_t>(i)]) {
        for (TensorId t : g.ops()[static_cast<std::size_t>(p)].outputs) {
          if (backward_reads_[static_cast<std::size_t>(t)] && recomputable(t) && g.storage_root(t) != output_root) {
            targets.push_back(t);
          }
        }
      }
    }
    needed.clear();
    while (!targets.empty()) {
      const TensorId t = targets.back();
      targets.pop_back();
      const int p = g.producer(t);
      if (is_needed[static_cast<std::size_t>(p)]) continue;
      is_needed[static_cast<std::size_t>(p)] = true;
      needed.push_back(p);
      for (TensorId in : g.ops()[static_cast<std::size_t>(p)].inputs) {
        // A parameter gathered in an earlier stage (ZeRO-3 prefetch, a tied embedding) is gathered
        // again rather than kept from the forward pass.
        if ((stage_of(in) == i && recomputable(in)) || regatherable(g, in)) targets.push_back(in);
      }
    }
    std::sort(needed.begin(), needed.end());
    for (int p : needed) {  // ascending: program order is a topological order
      const Op& op = g.ops()[static_cast<std::size_t>(p)];
      MEMPLAN_CHECK(op.outputs.size() == 1 && op.updates.empty(), "cannot recompute '" << op.name << "'");
      std::vector<TensorId> inputs = op.inputs;
      for (TensorId& in : inputs) {
        if (made[static_cast<std::size_t>(in)] != kNoTensor) in = made[static_cast<std::size_t>(in)];
        else if (recomputable(in)) in = current[static_cast<std::size_t>(in)];  // the previous stage's output
      }
      const auto t = static_cast<TensorId>(nt + edit.clones.size());
      pending.ops.push_back(num_ops + static_cast<int>(edit.clones.size()));
      edit.clones.push_back({p, std::move(inputs), ++clone_count[static_cast<std::size_t>(p)]});
      made[static_cast<std::size_t>(op.outputs[0])] = t;
      current[static_cast<std::size_t>(op.outputs[0])] = t;
      pending.versions.emplace_back(op.outputs[0], t);
    }
    for (int p : needed) {  // cleared for the next run (clearing only what was set: runs are small, steps large)
      is_needed[static_cast<std::size_t>(p)] = false;
      made[static_cast<std::size_t>(g.ops()[static_cast<std::size_t>(p)].outputs[0])] = kNoTensor;
    }
  }
  MEMPLAN_CHECK(pending.ops.empty(), "recompute runs after the last backward");

  // Program order: blocks before their ops; backward ops read the versions made before them.
  std::vector<TensorId> version(nt);
  for (std::size_t t = 0; t < nt; ++t) version[t] = static_cast<TensorId>(t);
  std::vector<int>& order = edit.order;
  order.reserve(static_cast<std::size_t>(num_ops) + edit.clones.size());
  std::size_t next_block = 0;
  for (int i = 0; i < num_ops; ++i) {
    for (; next_block < blocks.size() && blocks[next_block].before == i; ++next_block) {
      for (int r : blocks[next_block].ops) order.push_back(r);
      for (const auto& [t, v] : blocks[next_block].versions) version[static_cast<std::size_t>(t)] = v;
    }
    order.push_back(i);
    const Op& op = g.ops()[static_cast<std::size_t>(i)];
    if (op.phase != Phase::backward) continue;
    for (int slot = 0; slot < static_cast<int>(op.inputs.size()); ++slot) {
      const TensorId t = op.inputs[static_cast<std::size_t>(slot)];
      if (version[static_cast<std::size_t>(t)] != t) edit.replacements.push_back({i, slot, version[static_cast<std::size_t>(t)]});
    }
  }
  MEMPLAN_CHECK(next_block == blocks.size(), "a recompute block found no place");
  return edit;
}

Graph apply_edit(const Graph& g, const RecomputeEdit& edit) {
  Graph out = g;
  const auto nt = static_cast<std::size_t>(g.num_tensors());
  for (std::size_t k = 0; k < edit.clones.size(); ++k) {
    const RecomputeEdit::Clone& c = edit.clones[k];
    const Op& op = g.ops()[static_cast<std::size_t>(c.op)];
    const graph::TensorDesc& desc = g.tensor(op.outputs[0]);
    const std::string name = "recompute:" + desc.name + (c.copy > 1 ? "#" + std::to_string(c.copy) : "");
    const TensorId t = out.add_op(op.kind, c.inputs, op.attrs, name, desc.role, Phase::recompute);
    MEMPLAN_CHECK(static_cast<std::size_t>(t) == nt + k, "recompute op '" << name << "' made more than its output");
  }
  for (const RecomputeEdit::Replacement& r : edit.replacements) out.replace_input(r.op, r.slot, r.tensor);
  out.reorder_ops(edit.order);
  return out;
}

// The same edit on the step's skeleton: the clones' outputs as the originals' (a view's storage
// is its clone input's), in the edited program order.
StepSkeleton apply_edit(const StepSkeleton& s, const Graph& g, const RecomputeEdit& edit) {
  StepSkeleton out;
  const std::size_t nt = s.tensors.size();
  const auto num_ops = static_cast<int>(s.ops.size());
  out.tensors.reserve(nt + edit.clones.size());
  out.tensors = s.tensors;
  for (std::size_t k = 0; k < edit.clones.size(); ++k) {
    const RecomputeEdit::Clone& c = edit.clones[k];
    const Op& op = g.ops()[static_cast<std::size_t>(c.op)];
    StepSkeleton::Tensor t = s.tensors[static_cast<std::size_t>(op.outputs[0])];
    t.root = graph::op_info(op.kind).output_is_view ? out.tensors[static_cast<std::size_t>(c.inputs[0])].root
                                                    : static_cast<TensorId>(nt + k);
    t.result = false;
    out.tensors.push_back(t);
  }
  out.ops.reserve(edit.order.size());
  out.refs.reserve(s.refs.size() + edit.clones.size() * 4);
  std::vector<int> replaced_from(static_cast<std::size_t>(num_ops) + 1, 0);  // op i's replacements: [from[i], from[i + 1])
  for (const RecomputeEdit::Replacement& r : edit.replacements) ++replaced_from[static_cast<std::size_t>(r.op) + 1];
  for (int i = 0; i < num_ops; ++i) replaced_from[static_cast<std::size_t>(i) + 1] += replaced_from[static_cast<std::size_t>(i)];
  std::vector<TensorId> inputs;
  for (int i : edit.order) {
    if (i >= num_ops) {
      const RecomputeEdit::Clone& c = edit.clones[static_cast<std::size_t>(i - num_ops)];
      const TensorId output = static_cast<TensorId>(nt) + (i - num_ops);
      out.add_op(g.ops()[static_cast<std::size_t>(c.op)].kind, c.inputs, std::span<const TensorId>(&output, 1), {});
      continue;
    }
    const StepSkeleton::Op& op = s.ops[static_cast<std::size_t>(i)];
    inputs.assign(s.refs.begin() + op.begin, s.refs.begin() + op.outputs);
    for (int e = replaced_from[static_cast<std::size_t>(i)]; e < replaced_from[static_cast<std::size_t>(i) + 1]; ++e) {
      const RecomputeEdit::Replacement& r = edit.replacements[static_cast<std::size_t>(e)];
      inputs[static_cast<std::size_t>(r.slot)] = r.tensor;
    }
    out.add_op(op.kind, inputs, std::span<const TensorId>(s.refs.data() + op.outputs, static_cast<std::size_t>(op.updates - op.outputs)),
               std::span<const TensorId>(s.refs.data() + op.updates, static_cast<std::size_t>(op.end - op.updates)));
  }
  return out;
}

}  // namespace

Graph rematerialize(const Graph& g, const CheckpointChain& chain, const std::vector<ChainAction>& actions) {
  return apply_edit(g, Rematerializer(g, chain).edit(actions));
}

Result<Bytes> rematerialized_order_free_bound(const Graph& g, const CheckpointChain& chain,
                                              const std::vector<ChainAction>& actions, const PlanOptions& options) {
  const RecomputeEdit edit = Rematerializer(g, chain).edit(actions);
  // A rewrite's ops are the step's, some run again on inputs of the same shapes: the same scratch.
  const Bytes scratch = kernel_scratch_bytes(g, options);
  if (auto bound = order_free_lower_bound(apply_edit(StepSkeleton::of(g), g, edit), options, scratch)) return *bound;
  return arena_lower_bound(apply_edit(g, edit), options);
}

Graph rematerialize(const Graph& g, const CheckpointChain& chain, const std::vector<ChainSegment>& segments) {
  return rematerialize(g, chain, segments_to_actions(segments));
}

namespace {

struct Candidate {
  CheckpointStrategy strategy = CheckpointStrategy::kNone;
  Graph graph;
  Bytes arena = 0;
  double extra_flops = 0.0;
  std::optional<MemoryPlan> plan;  // how `arena` was found: planned with the caller's options
};

class Checkpointer {
 public:
  Checkpointer(const Graph& step, const PlanOptions& options)
      : step_(step), chain_(find_checkpoint_chain(step)), remat_(step_, chain_), base_flops_(graph_flops(step)) {
    // Candidates are planned with the caller's options: the greedy packing, and the exact search
    // only where the greedy packing is above the lower bound (a probe's decide_against: only
    // where that decides the answer). Comparing greedy packings alone would rank points by a
    // packer's misses: searched orders can leave it above a bound the exact search reaches.
    options_ = options;
  }
  // remat_ refers to chain_: never copied or moved.
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  Result<Candidate> make(CheckpointStrategy strategy, const std::vector<ChainAction>& actions) {
    Candidate c;
    c.strategy = strategy;
    c.graph = apply_edit(step_, remat_.edit(actions));
    c.extra_flops = graph_flops(c.graph) - base_flops_;
    auto plan = plan_memory(c.graph, options_);
    if (!plan) return plan.error();
    c.arena = plan.value().arena_bytes;
    c.plan = std::move(plan).value();
    return c;
  }

  // `c` planned again with the exact search asked to go below its arena, where its plan is above
  // its lower bound (a searched order's greedy packing, kept where it answered the budget): what
  // the least arena of all strategies reports.
  Status polish(Candidate& c) {
    if (!c.plan || c.plan->arena_bytes <= c.plan->lower_bound_bytes) return Status::success();
    PlanOptions lower = options_;
    lower.decide_against.reset();
    lower.fits_budget = c.plan->arena_bytes - 1;
    auto plan = plan_memory(c.graph, lower);
    if (!plan) return plan.error();
    if (plan.value().arena_bytes < c.arena) {
      c.arena = plan.value().arena_bytes;
      c.plan = std::move(plan).value();
    }
    return Status::success();
  }

  Result<Candidate> none() {
    return make(CheckpointStrategy::kNone, segments_to_actions({{0, static_cast<int>(chain_.stages.size()) - 1, false}}));
  }

  Result<Candidate> sqrt() {
    return make(CheckpointStrategy::kSqrt, segments_to_actions(sqrt_segments(static_cast<int>(chain_.stages.size()))));
  }

  // The least recomputation on the DP's frontier whose planned arena fits `budget`; without a
  // budget, the smallest planned arena (ties: less recomputation). A point is packed only when
  // its arena lower bound (no packing, cheap) leaves it a chance; the answer is the same as
  // packing every point, since an arena never falls below its lower bound.
  Result<std::optional<Candidate>> optimal(std::optional<Bytes> budget) {
    find_frontier();
    const std::size_t n = frontier_->size();
    std::optional<std::size_t> best;
    if (budget) {
      auto first = first_fitting(*budget, /*from_least_memory=*/false);
      if (!first) return first.error();
      best = first.value();
    } else {
      // Points by increasing cheap bound: once one exceeds the best arena found (or equals it at
      // more recomputation), no later point can win. A point the cheap bound leaves a chance is
      // skipped when its searched bound says so, else packed.
      std::vector<std::pair<Bytes, std::size_t>> order;
      if (Status s = prefetch_lower_bounds(0, n); !s) return s.error();
      for (std::size_t i = 0; i < n; ++i) {
        auto bound = cheap_bound(i);
        if (!bound) return bound.error();
        order.emplace_back(bound.value(), i);
      }
      std::sort(order.begin(), order.end());
      Bytes best_arena = 0;
      auto loses = [&](Bytes bound, std::size_t i) { return best && (bound > best_arena || (bound == best_arena && i > *best)); };
      for (const auto& [cheap, i] : order) {
        if (loses(cheap, i)) break;
        auto bound = lower_bound(i);
        if (!bound) return bound.error();
        if (loses(bound.value(), i)) continue;
        auto arena = measure(i);
        if (!arena) return arena.error();
        if (!best || arena.value() < best_arena || (arena.value() == best_arena && i < *best)) {
          best = i;
          best_arena = arena.value();
        }
      }
    }
    return candidate_at(best);
  }

  // Some frontier point whose planned arena fits `budget`, or none when no point does: the same
  // yes or no as optimal(budget), since "no" comes only once every point is ruled out.
  // Points are tried cheapest first: graphs grow steeply toward the least-memory end (a large
  // model's last point recomputes ten times the step's ops, and costs a hundred times another's
  // bound to plan), so the search aims at the least recomputation whose lower bound, raised by
  // the gap seen between an arena and its bound, fits: bisecting as if bounds fell along the
  // frontier (they nearly do; where they do not, the search only aims worse).
  Result<std::optional<Candidate>> any_fitting(Bytes budget) {
    find_frontier();
    const std::size_t n = frontier_->size();
    Bytes gap = 0;  // the largest arena-over-cheap-bound seen so far
    std::vector<bool> aimed(n, false);
    for (;;) {
      std::size_t lo = 0, hi = n;  // the first point in [lo, hi) whose cheap bound + gap fits
      while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        auto bound = cheap_bound(mid);
        if (!bound) return bound.error();
        if (bound.value() + gap <= budget) hi = mid;
        else lo = mid + 1;
      }
      if (lo == n || aimed[lo]) break;
      aimed[lo] = true;
      const Bytes bound = cheap_bound(lo).value();  // computed by the bisection
      auto searched = lower_bound(lo);
      if (!searched) return searched.error();
      if (searched.value() > budget) {  // aim again, past every point this far above its cheap bound
        gap = std::max(gap, searched.value() - bound);
        continue;
      }
      auto arena = measure(lo);
      if (!arena) return arena.error();
      if (arena.value() <= budget) return candidate_at(lo);
      gap = std::max(gap, arena.value() - bound);
    }
    auto first = first_fitting(budget, /*from_least_memory=*/true);
    if (!first) return first.error();
    return candidate_at(first.value());
  }

  double base_flops() const { return base_flops_; }

  // What is known of the smallest arena on the frontier, cheaply: the known arena (else lower
  // bound) of the point nearest the least-memory end, moved by how far the chain model puts that
  // point's peak above the least-memory point's. Arenas and bounds sit a nearly constant
  // distance above the model's peaks along the frontier's least-memory end (activations the
  // model does not count), so the nearest known point aims best. Not exact: a batch search aims
  // with it, it never decides with it.
  Result<Bytes> least_arena_estimate() {
    find_frontier();
    const std::size_t n = frontier_->size();
    for (std::size_t i = n; i-- > 0;) {
      if (!measured_[i] && !lower_bound_[i]) continue;
      const Bytes known = measured_[i] ? measured_[i]->arena : *lower_bound_[i];
      return known - ((*frontier_)[i].peak_bytes - frontier_->back().peak_bytes);
    }
    return lower_bound(n - 1);
  }

 private:
  void find_frontier() {
    if (frontier_) return;
    frontier_ = chain_frontier_nested(chain_.stages);
    unnamed_step_ = step_.without_names();
    skeleton_ = StepSkeleton::of(step_);
    // A rewrite's ops are the step's, some run again on inputs of the same shapes: the same scratch.
    scratch_bytes_ = kernel_scratch_bytes(step_, options_);
    MEMPLAN_CHECK(!frontier_->empty(), "a checkpoint chain with an empty frontier");
    measured_.assign(frontier_->size(), std::nullopt);
    lower_bound_.assign(frontier_->size(), std::nullopt);
    cheap_bound_.assign(frontier_->size(), std::nullopt);
  }

  const Graph& step_;
  Graph unnamed_step_;  // step_ without names, once the frontier is searched (lower bounds)
  StepSkeleton skeleton_;  // step_'s, once the frontier is searched (cheap bounds)
  Bytes scratch_bytes_ = 0;
  PlanOptions options_;  // the caller's, for every candidate
  CheckpointChain chain_;
  Rematerializer remat_;
  double base_flops_;
  // The frontier and each point's planned arena, computed once per step.
  struct Measured {
    Bytes arena = 0;
    double extra_flops = 0.0;
  };
  std::optional<std::vector<ChainSchedule>> frontier_;
  std::vector<std::optional<Measured>> measured_;
  std::vector<std::optional<Bytes>> lower_bound_;  // searched (arena_lower_bound)
  std::vector<std::optional<Bytes>> cheap_bound_;  // order-free (order_free_lower_bound), no higher
  // The candidate measure() made last, kept for candidate_at (a graph and its plan made once).
  std::optional<std::pair<std::size_t, Candidate>> last_measured_;

  // The first frontier point whose planned arena fits `budget`, visiting them by increasing
  // recomputation or from the least-memory end. A point is packed only when its lower bounds fit;
  // cheap bounds are computed a machine's worth of threads at a time, in visiting order.
  Result<std::optional<std::size_t>> first_fitting(Bytes budget, bool from_least_memory) {
    const std::size_t n = frontier_->size();
    const std::size_t batch = std::max(1u, std::thread::hardware_concurrency());
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = from_least_memory ? n - 1 - k : k;
      if (k % batch == 0) {
        const std::size_t from = from_least_memory ? (i + 1 >= batch ? i + 1 - batch : 0) : i;
        if (Status s = prefetch_lower_bounds(from, from_least_memory ? i + 1 : i + batch); !s) return s.error();
      }
      auto ruled = ruled_out(i, budget);
      if (!ruled) return ruled.error();
      if (ruled.value()) continue;
      auto arena = measure(i);
      if (!arena) return arena.error();
      if (arena.value() <= budget) return std::optional<std::size_t>(i);
    }
    return std::optional<std::size_t>();
  }

  // Frontier point i's candidate (its graph rematerialized and planned), or none.
  Result<std::optional<Candidate>> candidate_at(std::optional<std::size_t> i) {
    if (!i) return std::optional<Candidate>();
    if (last_measured_ && last_measured_->first == *i) {  // made by measure(i) just before
      std::optional<Candidate> c(std::move(last_measured_->second));
      last_measured_.reset();
      return c;
    }
    auto c = make(CheckpointStrategy::kOptimal, (*frontier_)[*i].actions);
    if (!c) return c.error();
    return std::optional<Candidate>(std::move(c).value());
  }

  // Frontier point i's planned arena, cached.
  Result<Bytes> measure(std::size_t i) {
    if (!measured_[i]) {
      auto c = make(CheckpointStrategy::kOptimal, (*frontier_)[i].actions);
      if (!c) return c.error();
      measured_[i] = Measured{c.value().arena, c.value().extra_flops};
      last_measured_.emplace(i, std::move(c).value());
    }
    return measured_[i]->arena;
  }

  // Computes the cheap bounds of frontier points [from, to) that are not known yet, on as many
  // threads as the machine has: each is independent (a rematerialized graph and a few
  // reachability walks), so the answers do not depend on the thread count.
  Status prefetch_lower_bounds(std::size_t from, std::size_t to) {
    std::vector<std::size_t> todo;
    for (std::size_t i = from; i < std::min(to, frontier_->size()); ++i) {
      if (!measured_[i] && !lower_bound_[i] && !cheap_bound_[i]) todo.push_back(i);
    }
    const std::size_t threads = std::min<std::size_t>(todo.size(), std::max(1u, std::thread::hardware_concurrency()));
    if (threads <= 1) return Status::success();
    std::vector<std::optional<Error>> errors(todo.size());
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      for (std::size_t k = next++; k < todo.size(); k = next++) {
        const std::size_t i = todo[k];
        auto bound = cheap_of(i);
        if (bound) cheap_bound_[i] = bound.value();
        else errors[k] = bound.error();
      }
    };
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    for (const auto& e : errors) {
      if (e) return *e;
    }
    return Status::success();
  }

  // Whether frontier point i's planned arena is certainly over `budget`: its arena once measured,
  // else its cheap bound, else (only where the cheap bound fits) its searched bound, is over it.
  Result<bool> ruled_out(std::size_t i, Bytes budget) {
    if (measured_[i]) return measured_[i]->arena > budget;
    auto cheap = cheap_bound(i);
    if (!cheap) return cheap.error();
    if (cheap.value() > budget) return true;
    auto bound = lower_bound(i);
    if (!bound) return bound.error();
    return bound.value() > budget;
  }

  // A lower bound on frontier point i's planned arena that holds for every op order (its
  // searched bound, or its arena, where known), cached.
  Result<Bytes> cheap_bound(std::size_t i) {
    if (measured_[i]) return measured_[i]->arena;
    if (lower_bound_[i]) return *lower_bound_[i];
    if (!cheap_bound_[i]) {
      auto bound = cheap_of(i);
      if (!bound) return bound.error();
      cheap_bound_[i] = bound.value();
    }
    return *cheap_bound_[i];
  }

  // A lower bound on frontier point i's planned arena (its exact arena once measured), cached.
  Result<Bytes> lower_bound(std::size_t i) {
    if (measured_[i]) return measured_[i]->arena;
    if (!lower_bound_[i]) {
      auto bound = bound_of(i);
      if (!bound) return bound.error();
      lower_bound_[i] = bound.value();
    }
    return *lower_bound_[i];
  }

  // Frontier point i's arena lower bound, from the step without names (the bound reads none;
  // each point copies the step once). A failure is computed again with names, for the message.
  Result<Bytes> bound_of(std::size_t i) const {
    const RecomputeEdit edit = remat_.edit((*frontier_)[i].actions);
    auto bound = arena_lower_bound(apply_edit(unnamed_step_, edit), options_);
    if (bound) return bound;
    return arena_lower_bound(apply_edit(step_, edit), options_);
  }
  // Frontier point i's order-free bound, from the step's skeleton (no graph built); where a size
  // is too large for it, the searched bound, which says what is wrong.
  Result<Bytes> cheap_of(std::size_t i) const {
    const RecomputeEdit edit = remat_.edit((*frontier_)[i].actions);
    if (auto bound = order_free_lower_bound(apply_edit(skeleton_, step_, edit), options_, scratch_bytes_)) return *bound;
    return bound_of(i);
  }
};

// The least arena any strategy reaches (ties: less recomputation), with its graph.
Result<Candidate> least_arena(Checkpointer& cp) {
  std::vector<Candidate> options;
  auto none = cp.none();
  if (!none) return none.error();
  options.push_back(std::move(none).value());
  auto sq = cp.sqrt();
  if (!sq) return sq.error();
  options.push_back(std::move(sq).value());
  auto opt = cp.optimal(std::nullopt);
  if (!opt) return opt.error();
  if (opt.value()) options.push_back(std::move(*opt.value()));
  for (Candidate& c : options) {
    if (Status s = cp.polish(c); !s) return s.error();
  }
  std::size_t least = 0;
  for (std::size_t i = 1; i < options.size(); ++i) {
    const Candidate& c = options[i];
    if (c.arena < options[least].arena || (c.arena == options[least].arena && c.extra_flops < options[least].extra_flops)) least = i;
  }
  return std::move(options[least]);
}

}  // namespace

Result<CheckpointOutcome> apply_checkpointing(const Graph& training_step, const CheckpointRequest& request,
                                              const PlanOptions& options) {
  const std::optional<Bytes> budget = request.budget;
  const CheckpointStrategy strategy = request.strategy;
  // The step without checkpointing, planned with the caller's options: the report's "before",
  // strategy none's plan, and auto's first choice. A batch-size probe of sqrt or optimal needs
  // none of these, so it skips this plan.
  const bool need_before = !request.stop_when_unmet || strategy == CheckpointStrategy::kNone ||
                           strategy == CheckpointStrategy::kAuto;
  Result<MemoryPlan> before_plan = MemoryPlan{};
  if (need_before) before_plan = plan_memory(training_step, options);
  if (!before_plan) return before_plan.error();
  const Result<Bytes> before = before_plan.value().arena_bytes;
  // The chain and its frontier are found only when a strategy needs them: strategy none (and
  // auto when the step already fits) is the step itself, planned once.
  std::optional<Checkpointer> checkpointer;
  auto chain = [&]() -> Checkpointer& {
    if (!checkpointer) checkpointer.emplace(training_step, options);
    return *checkpointer;
  };
  auto unchanged = [&]() -> Result<Candidate> {
    return Candidate{CheckpointStrategy::kNone, training_step, before.value(), 0.0};
  };

  std::optional<Candidate> chosen;
  auto take = [&](Result<Candidate> c) -> Status {
    if (!c) return c.error();
    chosen = std::move(c).value();
    return Status::success();
  };
  switch (strategy) {
    case CheckpointStrategy::kNone:
      if (Status s = take(unchanged()); !s) return s.error();
      break;
    case CheckpointStrategy::kSqrt:
      if (Status s = take(chain().sqrt()); !s) return s.error();
      break;
    case CheckpointStrategy::kOptimal: {
      auto c = request.any_fitting && budget ? chain().any_fitting(*budget) : chain().optimal(budget);
      if (!c) return c.error();
      chosen = std::move(c).value();
      break;
    }
    case CheckpointStrategy::kAuto: {
      if (!budget || before.value() <= *budget) {
        if (Status s = take(unchanged()); !s) return s.error();
        break;
      }
      auto opt = request.any_fitting ? chain().any_fitting(*budget) : chain().optimal(budget);
      if (!opt) return opt.error();
      if (opt.value()) chosen = std::move(*opt.value());
      auto sq = chain().sqrt();
      if (!sq) return sq.error();
      if (sq.value().arena <= *budget && (!chosen || sq.value().extra_flops < chosen->extra_flops)) {
        chosen = std::move(sq).value();
      }
      break;
    }
  }
  const double base_flops = std::max(checkpointer ? checkpointer->base_flops() : graph_flops(training_step), 1.0);
  // The chosen candidate's plan is the one it runs with (planned with the caller's options).
  std::optional<MemoryPlan> after_plan;
  auto final_arena = [&]() -> Result<Bytes> {
    if (chosen->strategy == CheckpointStrategy::kNone) {
      after_plan = before_plan.value();
    } else if (chosen->plan) {
      after_plan = std::move(*chosen->plan);
    } else {
      auto p = plan_memory(chosen->graph, options);
      if (!p) return p.error();
      after_plan = std::move(p).value();
    }
    return after_plan->arena_bytes;
  };
  std::optional<Bytes> after;
  if (chosen) {
    auto a = final_arena();
    if (!a) return a.error();
    after = a.value();
  }
  const bool fits = after && (!budget || *after <= *budget);
  // A batch search's aim for the strategies that adapt to the budget (below).
  std::optional<Bytes> least_estimate;
  if (request.stop_when_unmet && budget && checkpointer &&
      (strategy == CheckpointStrategy::kOptimal || strategy == CheckpointStrategy::kAuto)) {
    auto e = checkpointer->least_arena_estimate();
    if (!e) return e.error();
    least_estimate = e.value();
  }
  if (!fits && request.stop_when_unmet) {
    CheckpointOutcome outcome{chosen ? chosen->graph : training_step, strategy, before.value(),
                              after.value_or(before.value()), after_plan ? *after_plan : before_plan.value(), 0.0, false,
                              std::nullopt};
    outcome.least_arena_estimate = least_estimate;
    return outcome;
  }
  std::optional<MinimumArena> minimum;
  if (!fits) {
    // The answer is "no": keep the asked strategy's smallest arena as the graph (auto: the least
    // of all strategies when searched, else optimal's), and say what any strategy reaches.
    std::optional<Candidate> least;
    if (request.find_minimum) {
      auto l = least_arena(chain());
      if (!l) return l.error();
      minimum = MinimumArena{l.value().strategy, l.value().arena, l.value().extra_flops / base_flops};
      least = std::move(l).value();
    }
    if (strategy == CheckpointStrategy::kAuto && least) {
      chosen = std::move(*least);
    } else if (strategy == CheckpointStrategy::kOptimal || strategy == CheckpointStrategy::kAuto) {
      auto c = chain().optimal(std::nullopt);
      if (!c) return c.error();
      if (c.value()) chosen = std::move(*c.value());
    }
    if (!chosen) return Error{"no checkpoint schedule could be planned"};
    auto a = final_arena();
    if (!a) return a.error();
    after = a.value();
  }

  CheckpointOutcome outcome{std::move(chosen->graph), chosen->strategy, before.value(), *after, std::move(*after_plan),
                            0.0, false, minimum};
  outcome.fits = !budget || outcome.arena_bytes_with <= *budget;
  outcome.extra_flops_fraction = chosen->extra_flops / base_flops;
  outcome.least_arena_estimate = least_estimate;
  return outcome;
}

}  // namespace memplan::planner
