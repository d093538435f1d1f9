#include "planner/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/check.h"

namespace memplan::planner {

using graph::Graph;
using graph::Op;
using graph::Phase;

Result<CheckpointStrategy> parse_checkpoint_strategy(std::string_view name) {
  if (name == "none") return CheckpointStrategy::kNone;
  if (name == "sqrt") return CheckpointStrategy::kSqrt;
  if (name == "optimal") return CheckpointStrategy::kOptimal;
  if (name == "auto") return CheckpointStrategy::kAuto;
  return Error{"unknown checkpoint strategy '" + std::string(name) + "' (expected none, sqrt, optimal or auto)"};
}

std::string_view checkpoint_strategy_name(CheckpointStrategy s) {
  switch (s) {
    case CheckpointStrategy::kNone: return "none";
    case CheckpointStrategy::kSqrt: return "sqrt";
    case CheckpointStrategy::kOptimal: return "optimal";
    case CheckpointStrategy::kAuto: return "auto";
  }
  return "?";
}

namespace {

double op_flops(const Graph& g, const Op& op) {
  std::vector<const graph::TensorDesc*> in;
  for (TensorId t : op.inputs) in.push_back(&g.tensor(t));
  const graph::TensorDesc* out = op.outputs.empty() ? nullptr : &g.tensor(op.outputs[0]);
  return graph::op_info(op.kind).flops(in, out);
}

// Inputs and persistent state (and views of them) are alive for the whole step anyway.
bool is_free(const Graph& g, TensorId t) {
  const graph::Role role = g.tensor(g.storage_root(t)).role;
  return graph::is_persistent(role) || role == graph::Role::input;
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

std::string format_mib(Bytes bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f MiB (%lld B)", static_cast<double>(bytes) / (1024.0 * 1024.0),
                static_cast<long long>(bytes));
  return text;
}

}  // namespace

double graph_flops(const Graph& graph) {
  double total = 0.0;
  for (const Op& op : graph.ops()) total += op_flops(graph, op);
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
      if (!is_free(g, t) && last_read[static_cast<std::size_t>(t)] > p) {
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
      stage.forward_flops += op_flops(g, op);
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

Graph rematerialize(const Graph& g, const CheckpointChain& chain, const std::vector<ChainSegment>& segments) {
  const int num_ops = g.num_ops();
  const auto nt = static_cast<std::size_t>(g.num_tensors());
  // Stage of each forward op.
  std::vector<int> stage_of_op(static_cast<std::size_t>(num_ops), -1);
  {
    int stage = 0;
    for (int i = 0; i < num_ops && stage < static_cast<int>(chain.last_op.size()); ++i) {
      if (g.ops()[static_cast<std::size_t>(i)].phase != Phase::forward) continue;
      stage_of_op[static_cast<std::size_t>(i)] = stage;
      if (i == chain.last_op[static_cast<std::size_t>(stage)]) ++stage;
    }
  }
  const std::vector<bool> backward_reads = read_by_backward(g);
  const std::vector<bool> results = step_result_roots(g);

  Graph out = g;
  std::vector<TensorId> clone(nt, kNoTensor);
  std::vector<std::vector<int>> blocks_before(static_cast<std::size_t>(num_ops));  // recompute ops to run before op i
  for (const ChainSegment& seg : segments) {
    if (!seg.recompute) continue;
    const Op& end_op = g.ops()[static_cast<std::size_t>(chain.last_op[static_cast<std::size_t>(seg.last)])];
    const TensorId end_root = end_op.outputs.empty() ? kNoTensor : g.storage_root(end_op.outputs[0]);
    // Produced inside the segment and gone by the time the backward pass arrives.
    auto inside = [&](TensorId t) {
      const int p = g.producer(t);
      if (p < 0) return false;
      const int s = stage_of_op[static_cast<std::size_t>(p)];
      const TensorId root = g.storage_root(t);
      return s >= seg.first && s <= seg.last && !is_free(g, t) && root != end_root &&
             !results[static_cast<std::size_t>(root)];
    };
    std::vector<TensorId> dropped;
    for (TensorId t = 0; t < g.num_tensors(); ++t) {
      if (backward_reads[static_cast<std::size_t>(t)] && inside(t)) dropped.push_back(t);
    }
    if (dropped.empty()) continue;
    // The forward ops that recompute them, with whatever inside the segment those depend on.
    std::set<int> needed;
    std::vector<TensorId> stack = dropped;
    while (!stack.empty()) {
      const TensorId t = stack.back();
      stack.pop_back();
      const int p = g.producer(t);
      if (!needed.insert(p).second) continue;
      for (TensorId in : g.ops()[static_cast<std::size_t>(p)].inputs) {
        if (inside(in)) stack.push_back(in);
      }
    }
    std::vector<int> block;
    for (int p : needed) {  // ascending: program order is a topological order
      const Op& op = g.ops()[static_cast<std::size_t>(p)];
      MEMPLAN_CHECK(op.outputs.size() == 1 && op.updates.empty(), "cannot recompute '" << op.name << "'");
      std::vector<TensorId> inputs = op.inputs;
      for (TensorId& in : inputs) {
        if (clone[static_cast<std::size_t>(in)] != kNoTensor) in = clone[static_cast<std::size_t>(in)];
      }
      const graph::TensorDesc& desc = g.tensor(op.outputs[0]);
      clone[static_cast<std::size_t>(op.outputs[0])] =
          out.add_op(op.kind, std::move(inputs), op.attrs, "recompute:" + desc.name, desc.role, Phase::recompute);
      block.push_back(out.num_ops() - 1);
    }
    // Backward readers switch to the recomputed tensors; the block runs just before the first.
    int first_reader = num_ops;
    for (int i = 0; i < num_ops; ++i) {
      const Op& op = g.ops()[static_cast<std::size_t>(i)];
      if (op.phase != Phase::backward) continue;
      for (int slot = 0; slot < static_cast<int>(op.inputs.size()); ++slot) {
        const TensorId t = op.inputs[static_cast<std::size_t>(slot)];
        if (clone[static_cast<std::size_t>(t)] == kNoTensor || !inside(t)) continue;
        out.replace_input(i, slot, clone[static_cast<std::size_t>(t)]);
        first_reader = std::min(first_reader, i);
      }
    }
    MEMPLAN_CHECK(first_reader < num_ops, "recomputed tensors without a backward reader");
    auto& before = blocks_before[static_cast<std::size_t>(first_reader)];
    before.insert(before.end(), block.begin(), block.end());
  }
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(out.num_ops()));
  for (int i = 0; i < num_ops; ++i) {
    for (int r : blocks_before[static_cast<std::size_t>(i)]) order.push_back(r);
    order.push_back(i);
  }
  out.reorder_ops(order);
  return out;
}

namespace {

struct Candidate {
  CheckpointStrategy strategy = CheckpointStrategy::kNone;
  Graph graph;
  Bytes arena = 0;
  double extra_flops = 0.0;
};

Result<Bytes> planned_arena(const Graph& g, const PlanOptions& options) {
  auto plan = plan_memory(g, options);
  if (!plan) return plan.error();
  return plan.value().arena_bytes;
}

class Checkpointer {
 public:
  Checkpointer(const Graph& step, const PlanOptions& options)
      : step_(step), options_(options), chain_(find_checkpoint_chain(step)), base_flops_(graph_flops(step)) {
    // Candidates are compared with the greedy packer alone (fast, and never below the final
    // plan's arena); the chosen one is then planned with the caller's options.
    search_options_ = options;
    search_options_.solver_time_limit_s = 0.0;
  }

  Result<Candidate> make(CheckpointStrategy strategy, const std::vector<ChainSegment>& segments) {
    Candidate c;
    c.strategy = strategy;
    c.graph = rematerialize(step_, chain_, segments);
    c.extra_flops = graph_flops(c.graph) - base_flops_;
    auto arena = planned_arena(c.graph, search_options_);
    if (!arena) return arena.error();
    c.arena = arena.value();
    return c;
  }

  Result<Candidate> none() {
    return make(CheckpointStrategy::kNone, {});
  }

  Result<Candidate> sqrt() {
    return make(CheckpointStrategy::kSqrt, sqrt_segments(static_cast<int>(chain_.stages.size())));
  }

  // The least recomputation on the DP's frontier whose planned arena fits `budget`; without a
  // budget, the smallest planned arena (ties: less recomputation).
  Result<std::optional<Candidate>> optimal(std::optional<Bytes> budget) {
    if (!frontier_) {
      frontier_ = chain_frontier(chain_.stages);
      measured_.assign(frontier_->size(), std::nullopt);
    }
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < frontier_->size(); ++i) {  // increasing recomputation
      if (!measured_[i]) {
        auto c = make(CheckpointStrategy::kOptimal, (*frontier_)[i].segments);
        if (!c) return c.error();
        measured_[i] = Measured{c.value().arena, c.value().extra_flops};
      }
      if (budget) {
        if (measured_[i]->arena <= *budget) {
          best = i;
          break;
        }
      } else if (!best || measured_[i]->arena < measured_[*best]->arena) {
        best = i;
      }
    }
    if (!best) return std::optional<Candidate>();
    auto c = make(CheckpointStrategy::kOptimal, (*frontier_)[*best].segments);
    if (!c) return c.error();
    return std::optional<Candidate>(std::move(c).value());
  }

  double base_flops() const { return base_flops_; }

 private:
  const Graph& step_;
  PlanOptions options_;
  PlanOptions search_options_;
  CheckpointChain chain_;
  double base_flops_;
  // The frontier and each point's planned arena, computed once per step.
  struct Measured {
    Bytes arena = 0;
    double extra_flops = 0.0;
  };
  std::optional<std::vector<ChainSolution>> frontier_;
  std::vector<std::optional<Measured>> measured_;
};

// The budget cannot be met: say the least any strategy reaches and which one.
Error budget_error(Checkpointer& cp, Bytes budget, CheckpointStrategy asked) {
  std::vector<Candidate> options;
  if (auto c = cp.none()) options.push_back(std::move(c).value());
  if (auto c = cp.sqrt()) options.push_back(std::move(c).value());
  if (auto c = cp.optimal(std::nullopt); c && c.value()) options.push_back(std::move(*c.value()));
  std::string message = "budget " + format_mib(budget) + " is below what checkpoint " +
                        std::string(checkpoint_strategy_name(asked)) + " can reach";
  const Candidate* least = nullptr;
  for (const Candidate& c : options) {
    if (!least || c.arena < least->arena || (c.arena == least->arena && c.extra_flops < least->extra_flops)) least = &c;
  }
  if (least) {
    char overhead[64];
    std::snprintf(overhead, sizeof overhead, "%.1f", 100.0 * least->extra_flops / std::max(cp.base_flops(), 1.0));
    message += "; the minimum feasible arena is " + format_mib(least->arena) + ", reached with --checkpoint " +
               std::string(checkpoint_strategy_name(least->strategy)) + " (recompute +" + overhead +
               "% FLOPs); use a budget of at least that, a smaller batch or a smaller model";
  }
  return Error{message};
}

}  // namespace

Result<CheckpointOutcome> apply_checkpointing(const Graph& training_step, CheckpointStrategy strategy,
                                              std::optional<Bytes> budget, const PlanOptions& options) {
  auto before = planned_arena(training_step, options);
  if (!before) return before.error();
  Checkpointer cp(training_step, options);

  std::optional<Candidate> chosen;
  auto take = [&](Result<Candidate> c) -> Status {
    if (!c) return c.error();
    chosen = std::move(c).value();
    return Status::success();
  };
  switch (strategy) {
    case CheckpointStrategy::kNone:
      if (Status s = take(cp.none()); !s) return s.error();
      break;
    case CheckpointStrategy::kSqrt:
      if (Status s = take(cp.sqrt()); !s) return s.error();
      break;
    case CheckpointStrategy::kOptimal: {
      auto c = cp.optimal(budget);
      if (!c) return c.error();
      chosen = std::move(c).value();
      break;
    }
    case CheckpointStrategy::kAuto: {
      if (!budget || before.value() <= *budget) {
        if (Status s = take(cp.none()); !s) return s.error();
        break;
      }
      auto opt = cp.optimal(budget);
      if (!opt) return opt.error();
      if (opt.value()) chosen = std::move(*opt.value());
      auto sq = cp.sqrt();
      if (!sq) return sq.error();
      if (sq.value().arena <= *budget && (!chosen || sq.value().extra_flops < chosen->extra_flops)) {
        chosen = std::move(sq).value();
      }
      break;
    }
  }
  if (!chosen || (budget && chosen->arena > *budget)) return budget_error(cp, budget.value_or(0), strategy);

  CheckpointOutcome outcome{std::move(chosen->graph), chosen->strategy, before.value(), 0, 0.0};
  auto after = planned_arena(outcome.graph, options);
  if (!after) return after.error();
  outcome.peak_after = after.value();
  outcome.extra_flops_fraction = chosen->extra_flops / std::max(cp.base_flops(), 1.0);
  return outcome;
}

}  // namespace memplan::planner
