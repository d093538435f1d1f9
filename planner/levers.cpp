#include "memplan/planner/levers.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace memplan::planner {

std::string describe(const Levers& levers, std::int64_t accumulation_steps) {
  std::string out;
  if (levers.tensor_parallel > 1) out = "--tensor-parallel " + std::to_string(levers.tensor_parallel) + " ";
  out += "--zero " + std::to_string(levers.zero);
  if (levers.offload_optimizer) out += " --offload-optimizer";
  out += " --checkpoint " + std::string(checkpoint_strategy_name(levers.checkpoint));
  if (levers.micro_batch > 0) {
    out += ", micro-batch " + std::to_string(levers.micro_batch) + " x " + std::to_string(accumulation_steps) +
           " accumulation steps";
  }
  return out;
}

double StepCost::seconds(const CostModel& model, int devices) const {
  return flops / model.flops_per_s + tensor_parallel_bytes / model.nvlink_bytes_per_s +
         data_parallel_bytes / model.data_parallel_bytes_per_s(devices) + host_bytes / model.host_bytes_per_s;
}

StepCost StepCost::times(std::int64_t n) const {
  const double k = double(n);
  return {flops * k, tensor_parallel_bytes * k, data_parallel_bytes * k, host_bytes * k};
}

StepCost step_cost(const graph::Graph& step) {
  using graph::OpKind;
  StepCost cost;
  for (const graph::Op& op : step.ops()) {
    cost.flops += graph::op_flops(step, op);
    // Bytes a rank sends under ring algorithms: an all-reduce of n bytes 2(w-1)/w n, a
    // reduce-scatter of n bytes or an all-gather into n bytes (w-1)/w n.
    double moved = 0;
    const double w = double(op.attrs.world), share = w > 1 ? (w - 1) / w : 0.0;
    switch (op.kind) {
      case OpKind::all_reduce: moved = 2.0 * share * double(step.tensor(op.inputs[0]).size_bytes()); break;
      case OpKind::reduce_scatter: moved = share * double(step.tensor(op.inputs[0]).size_bytes()); break;
      case OpKind::all_gather: moved = share * double(step.tensor(op.outputs[0]).size_bytes()); break;
      case OpKind::all_gather_into: moved = share * double(step.tensor(op.updates[0]).size_bytes()); break;
      case OpKind::all_to_all: moved = share * double(step.tensor(op.inputs[0]).size_bytes()); break;
      case OpKind::to_host:
        // The gradient copied out, and as many bytes of updated weights copied back.
        cost.host_bytes += 2.0 * double(step.tensor(op.outputs[0]).size_bytes());
        break;
      default: break;
    }
    // Expert parallelism's exchanges and gradient sums cross the data-parallel ranks' links too.
    (op.attrs.group == graph::RankGroup::tensor ? cost.tensor_parallel_bytes : cost.data_parallel_bytes) += moved;
  }
  return cost;
}

namespace {

struct Planned {
  bool fits = false;
  Bytes total = 0;
  Bytes host = 0;
  double recompute = 0;
  StepCost cost;
};

// One rank's step with `levers` at `batch`, planned against the device's memory (checkpointing
// with it as the budget); answer_only: "fits or not" the fast way (planner::PlanRequest).
Result<Planned> plan_with(const StepWithLevers& make, const Levers& levers, std::int64_t batch, const PlanRequest& base,
                          Bytes device_memory, std::optional<Bytes> host_memory, bool answer_only,
                          std::int64_t& plans) {
  auto step = make(levers, batch);
  if (!step) return step.error();
  PlanRequest request = base;
  request.checkpoint = levers.checkpoint;
  request.budget = base.device.arena_budget(device_memory);
  request.answer_only = answer_only;
  request.find_minimum_arena = false;
  auto planned = plan_step(step.value(), request);
  if (!planned) return planned.error();
  ++plans;
  const PlannedStep& p = planned.value();
  Planned out;
  out.total = base.device.total_bytes(p.plan.arena_bytes);
  out.host = p.plan.host_bytes;
  out.fits = p.fits && base.device.fits(p.plan.arena_bytes, device_memory) && (!host_memory || out.host <= *host_memory);
  out.recompute = p.checkpoint ? p.checkpoint->extra_flops_fraction : 0.0;
  out.cost = step_cost(p.graph);
  return out;
}

std::vector<std::int64_t> divisors_below(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d < n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

}  // namespace

Result<SuggestAnswer> suggest_levers(const SuggestQuestion& q) {
  SuggestAnswer answer;
  auto plan = [&](const Levers& levers, std::int64_t batch, bool answer_only) {
    return plan_with(q.step, levers, batch, q.request, q.device_memory, q.host_memory, answer_only, answer.steps_planned);
  };
  auto note = [&](const Levers& levers) {
    if (q.progress) q.progress("planning " + describe(levers, 1));
  };
  auto seconds = [&](const StepCost& cost) { return cost.seconds(q.costs, q.devices); };

  // 1. Every combination without recomputation, on the whole batch: whether it fits, and its cost,
  // which is a lower bound of the same combination's with recomputation or accumulation.
  struct Pending {
    LeverCandidate plain;
    std::int64_t replicas = 1;
  };
  std::vector<Pending> pending;
  for (int t : q.tensor_parallel_degrees) {
    if (t < 1 || q.devices % t != 0) continue;
    const int replicas = q.devices / t;
    if (q.batch % replicas != 0) {
      LeverCandidate c;
      c.levers.tensor_parallel = t;
      c.why_not = "the batch " + std::to_string(q.batch) + " does not divide among " + std::to_string(replicas) + " replicas";
      answer.candidates.push_back(c);
      continue;
    }
    const std::vector<int> stages = replicas > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0};
    bool model_refuses = false;
    for (int zero : stages) {
      for (bool offload : {false, true}) {
        LeverCandidate c;
        c.levers.tensor_parallel = t;
        c.levers.zero = zero;
        c.levers.offload_optimizer = offload;
        note(c.levers);
        auto plain = plan(c.levers, q.batch, /*answer_only=*/true);
        if (!plain) {  // the model cannot take this degree (heads that do not split): no stage can
          c.why_not = plain.error().message;
          answer.candidates.push_back(c);
          model_refuses = true;
          break;
        }
        c.fits = plain.value().fits;
        c.total_bytes = plain.value().total;
        c.host_bytes = plain.value().host;
        c.cost = plain.value().cost;
        c.seconds = seconds(c.cost);
        pending.push_back({c, replicas});
        if (c.fits) break;  // offload only adds host traffic to a step that fits without it
      }
      if (model_refuses) break;
    }
  }

  // 2. In order of that lower bound: a combination that fits as it is is a candidate; one that
  // does not gets the least recomputation that fits, else the largest micro-batch that fits. Once
  // the bound reaches the least fitting estimate found, nothing later can beat it.
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.plain.seconds < b.plain.seconds; });
  double least = std::numeric_limits<double>::infinity();
  for (Pending& p : pending) {
    LeverCandidate c = p.plain;
    if (c.fits) {
      least = std::min(least, c.seconds);
      answer.candidates.push_back(c);
      continue;
    }
    if (c.seconds >= least) {
      c.why_not = "not planned further: costs no less, before any recomputation, than a combination that fits";
      answer.candidates.push_back(c);
      continue;
    }
    if (p.replicas > 1 && c.levers.zero < 2) {
      // ZeRO-2 moves the bytes of stages 0 and 1 or fewer (a reduce-scatter and an all-gather for
      // an all-reduce) and holds less: whatever recomputation or micro-batch fits these, fits it.
      c.why_not = "not planned further: --zero 2 holds less for no more traffic";
      answer.candidates.push_back(c);
      continue;
    }
    Levers levers = c.levers;
    levers.checkpoint = CheckpointStrategy::kOptimal;
    note(levers);
    auto least_recompute = plan(levers, q.batch, /*answer_only=*/false);
    if (!least_recompute) return least_recompute.error();
    const Planned& whole = least_recompute.value();
    if (whole.fits) {
      c.levers = levers;
      c.fits = true;
      c.total_bytes = whole.total;
      c.host_bytes = whole.host;
      c.recompute_fraction = whole.recompute;
      c.cost = whole.cost;
      c.seconds = seconds(c.cost);
      least = std::min(least, c.seconds);
      answer.candidates.push_back(c);
      continue;
    }
    // The largest micro-batch (dividing the replica's batch) that fits, by bisection over the
    // divisors: memory grows with the batch.
    const std::int64_t per_replica = q.batch / p.replicas;
    const std::vector<std::int64_t> micro = divisors_below(per_replica);
    std::int64_t lo = -1, hi = static_cast<std::int64_t>(micro.size());  // micro[lo] fits, micro[hi] does not
    while (hi - lo > 1) {
      const std::int64_t mid = (lo + hi) / 2;
      levers.micro_batch = micro[static_cast<std::size_t>(mid)];
      note(levers);
      auto probe = plan(levers, levers.micro_batch * p.replicas, /*answer_only=*/true);
      if (!probe) return probe.error();
      (probe.value().fits ? lo : hi) = mid;
    }
    c.levers.checkpoint = CheckpointStrategy::kOptimal;
    c.total_bytes = whole.total;
    if (lo < 0) {
      c.why_not = per_replica == 1 ? "one sample per replica does not fit, even with the least arena recomputation reaches"
                                   : "not even a micro-batch of 1 fits";
      answer.candidates.push_back(c);
      continue;
    }
    levers.micro_batch = micro[static_cast<std::size_t>(lo)];
    auto chosen = plan(levers, levers.micro_batch * p.replicas, /*answer_only=*/false);
    if (!chosen) return chosen.error();
    c.levers = levers;
    c.accumulation_steps = per_replica / levers.micro_batch;
    c.fits = chosen.value().fits;
    c.total_bytes = chosen.value().total;
    c.host_bytes = chosen.value().host;
    c.recompute_fraction = chosen.value().recompute;
    c.cost = chosen.value().cost.times(c.accumulation_steps);
    c.seconds = seconds(c.cost);
    if (c.fits) least = std::min(least, c.seconds);
    answer.candidates.push_back(c);
  }

  // The least estimate, unless a combination within kSimplerWithin of it pulls fewer levers: an
  // estimate is not precise enough to prefer a lever for a few percent.
  const LeverCandidate* best = nullptr;
  for (const LeverCandidate& c : answer.candidates) {
    if (!c.fits || c.seconds > least * (1.0 + kSimplerWithin)) continue;
    if (best == nullptr) {
      best = &c;
      continue;
    }
    const int pulled = levers_pulled(c.levers), best_pulled = levers_pulled(best->levers);
    if (pulled < best_pulled || (pulled == best_pulled && c.seconds < best->seconds)) best = &c;
  }
  if (best == nullptr) return answer;
  answer.best = *best;
  if (best->levers.checkpoint == CheckpointStrategy::kNone && best->levers.micro_batch == 0) {
    // Its plan answered "fits" the fast way (possibly a greedy packing): the bytes to report are
    // the exact plan's.
    auto exact = plan(best->levers, q.batch, /*answer_only=*/false);
    if (!exact) return exact.error();
    answer.best->total_bytes = exact.value().total;
  }
  return answer;
}

int levers_pulled(const Levers& l) {
  return (l.checkpoint != CheckpointStrategy::kNone ? 1 : 0) + (l.zero > 0 ? 1 : 0) + (l.tensor_parallel > 1 ? 1 : 0) +
         (l.offload_optimizer ? 1 : 0) + (l.micro_batch > 0 ? 1 : 0);
}

Result<std::vector<LeverSaving>> lever_savings(const StepWithLevers& step, const Levers& chosen, std::int64_t batch,
                                               int devices, const PlanRequest& request, Bytes device_memory) {
  std::int64_t plans = 0;
  // One pass's global batch: the micro-batch times the replicas when accumulating.
  auto pass_batch = [&](const Levers& l) {
    return l.micro_batch > 0 ? l.micro_batch * (devices / std::max(l.tensor_parallel, 1)) : batch;
  };
  auto total = [&](const Levers& l) -> Result<Bytes> {
    auto planned = plan_with(step, l, pass_batch(l), request, device_memory, std::nullopt, false, plans);
    if (!planned) return planned.error();
    return planned.value().total;
  };
  auto with = total(chosen);
  if (!with) return with.error();
  std::vector<LeverSaving> out;
  // The other levers are compared without checkpointing: a budget would adjust the recomputation
  // around a released lever and hide what it saves.
  Levers plain = chosen;
  plain.checkpoint = CheckpointStrategy::kNone;
  Bytes plain_total = with.value();
  if (chosen.checkpoint != CheckpointStrategy::kNone) {
    auto t = total(plain);
    if (!t) return t.error();
    plain_total = t.value();
    out.push_back({"--checkpoint " + std::string(checkpoint_strategy_name(chosen.checkpoint)), "--checkpoint none",
                   plain_total, plain_total - with.value(), ""});
  }
  auto release = [&](const std::string& lever, const std::string& released, const std::function<void(Levers&)>& change) {
    Levers without = plain;
    change(without);
    LeverSaving s{lever, released, 0, 0, ""};
    auto t = total(without);
    if (t) {
      s.total_without = t.value();
      s.saved = t.value() - plain_total;
    } else {
      s.why_not = t.error().message;
    }
    out.push_back(s);
  };
  const std::string at_none = chosen.checkpoint == CheckpointStrategy::kNone ? "" : ", both without checkpointing";
  if (chosen.zero > 0) release("--zero " + std::to_string(chosen.zero), "--zero 0" + at_none, [](Levers& l) { l.zero = 0; });
  if (chosen.tensor_parallel > 1) {
    release("--tensor-parallel " + std::to_string(chosen.tensor_parallel),
            "--tensor-parallel 1 (" + std::to_string(devices) + " replicas)" + at_none, [](Levers& l) { l.tensor_parallel = 1; });
  }
  if (chosen.offload_optimizer) {
    release("--offload-optimizer", "the optimizer state on the device" + at_none, [](Levers& l) { l.offload_optimizer = false; });
  }
  if (chosen.micro_batch > 0) {
    release("micro-batch " + std::to_string(chosen.micro_batch), "the whole batch in one pass" + at_none,
            [](Levers& l) { l.micro_batch = 0; });
  }
  return out;
}

}  // namespace memplan::planner
