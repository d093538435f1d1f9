#include "memplan/planner/step_size.h"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "memplan/graph/training_step.h"

namespace memplan::planner {
namespace {

enum class Fit { ok, too_large, inconsistent };

struct Outcome {
  Fit fit = Fit::ok;
  std::string why;  // too_large: what could not be represented
  std::int64_t ops = 0;
};

// The step at values[0] (the batch) with the source's knobs at values[1...].
Outcome evaluate(const StepDescription& step, std::span<const std::int64_t> values) {
  const graph::ModelSource& source = *step.source;
  try {
    graph::Graph g = source.build(values.front(), values.subspan(1));
    if (source.training) graph::make_training_step(g, step.optimizer);
    if (g.num_ops() > kMaxStepOps) {
      return {Fit::too_large, "the step would have " + std::to_string(g.num_ops()) + " ops, more than the planner's " +
                                  std::to_string(kMaxStepOps)};
    }
    Bytes total = 0;
    for (TensorId id = 0; id < g.num_tensors(); ++id) {
      const graph::TensorDesc& t = g.tensor(id);
      if (t.is_view()) continue;
      total += t.size_bytes();  // each at most 2^60 and the sum so far at most 2^61: no overflow
      if (total > kMaxStepBytes) {
        return {Fit::too_large, "the step's tensors would add up to more than 2^61 bytes"};
      }
    }
    return {Fit::ok, {}, g.num_ops()};
  } catch (const graph::SizeError& e) {
    return {Fit::too_large, e.what()};
  } catch (const graph::GraphError&) {
    return {Fit::inconsistent, {}};
  }
}

// The batch, then the source's knobs: the sizes `evaluate` takes, in its order.
std::vector<graph::SizeKnob> knobs_of(const StepDescription& step) {
  std::vector<graph::SizeKnob> knobs = {batch_knob(step)};
  knobs.insert(knobs.end(), step.source->knobs.begin(), step.source->knobs.end());
  return knobs;
}

std::vector<std::int64_t> values_of(const std::vector<graph::SizeKnob>& knobs) {
  std::vector<std::int64_t> values;
  for (const graph::SizeKnob& k : knobs) values.push_back(k.value);
  return values;
}

// Layer counts decide how large the graph itself is: checked by extrapolating the op count at one
// and two layers with every other size at its smallest (ops grow linearly with layers), before
// building any more.
std::optional<StepSizeProblem> check_layer_counts(const StepDescription& step) {
  const std::vector<graph::SizeKnob> knobs = knobs_of(step);
  for (std::size_t i = 1; i < knobs.size(); ++i) {
    if (!knobs[i].layers) continue;
    std::vector<std::int64_t> tiny(knobs.size());
    for (std::size_t j = 0; j < knobs.size(); ++j) tiny[j] = std::max<std::int64_t>(knobs[j].granule, 1);
    tiny[i] = 1;
    const Outcome one = evaluate(step, tiny);
    tiny[i] = 2;
    const Outcome two = evaluate(step, tiny);
    if (one.fit != Fit::ok || two.fit != Fit::ok) continue;  // plan_step names the problem
    const std::int64_t per_layer = two.ops - one.ops;
    const std::int64_t fixed = one.ops - per_layer;
    if (per_layer <= 0 || knobs[i].value <= (kMaxStepOps - fixed) / per_layer) continue;
    StepSizeProblem p;
    p.kind = StepSizeProblem::Kind::too_many_ops;
    p.knob = knobs[i];
    p.largest = (kMaxStepOps - fixed) / per_layer;
    return p;
  }
  return std::nullopt;
}

}  // namespace

graph::SizeKnob batch_knob(const StepDescription& step) {
  graph::SizeKnob k;
  k.key = "batch";
  k.quantity = "the batch";
  k.value = step.batch;
  k.usual = step.source ? std::max<std::int64_t>(step.source->default_batch, 1) : 1;
  return k;
}

SizeNaming quantity_naming() {
  return {[](const graph::SizeKnob& k, std::optional<std::int64_t> value) {
            return value ? k.quantity + " " + std::to_string(*value) : k.quantity;
          },
          "sizes"};
}

std::string describe(const StepSizeProblem& p, const SizeNaming& naming) {
  switch (p.kind) {
    case StepSizeProblem::Kind::too_large:
      return naming.name(p.knob, p.knob.value) + ": the step cannot be represented (" + p.why +
             "); the largest value that works with the other " + naming.others + " as given is " + std::to_string(p.largest);
    case StepSizeProblem::Kind::too_many_ops:
      return naming.name(p.knob, p.knob.value) + ": the step would have more than " + std::to_string(kMaxStepOps) +
             " ops, the most the planner takes; the largest that works is " + std::to_string(p.largest) +
             (p.knob.unit.empty() ? "" : " " + p.knob.unit);
    case StepSizeProblem::Kind::indivisible_batch:
      return naming.name(p.knob, p.knob.value) + " is the global batch and must divide among the " +
             std::to_string(p.ranks) + " ranks: use a multiple of " + std::to_string(p.ranks) +
             (p.largest > 0 ? " (e.g. " + std::to_string(p.largest) + " or " + std::to_string(p.largest + p.ranks) + ")"
                            : " (e.g. " + std::to_string(p.ranks) + ")");
    case StepSizeProblem::Kind::reduce_several: {
      if (p.tried.size() == 1) {
        return naming.name(p.tried.front(), p.tried.front().value) + ": the step cannot be represented (" + p.why +
               "), and bringing " + naming.name(p.tried.front(), std::nullopt) + " down alone does not change that";
      }
      std::string names;
      for (const graph::SizeKnob& k : p.tried) names += (names.empty() ? "" : ", ") + naming.name(k, std::nullopt);
      return "the step cannot be represented at these sizes (" + p.why + "), and no single one of " + names +
             " brought down alone changes that: reduce several of them";
    }
  }
  return p.why;
}

std::optional<StepSizeProblem> global_batch_problem(const StepDescription& step) {
  const graph::DataParallelConfig& dp = step.parallel;
  if (step.graph || step.batch <= 0 || !dp.active() || step.batch % dp.world == 0) return std::nullopt;
  StepSizeProblem p;
  p.kind = StepSizeProblem::Kind::indivisible_batch;
  p.knob = batch_knob(step);
  p.largest = step.batch / dp.world * dp.world;
  p.ranks = dp.world;
  return p;
}

std::optional<StepSizeProblem> find_step_size_problem(const StepDescription& step) {
  if (step.graph || !step.source || step.batch <= 0) return std::nullopt;
  if (auto batch = global_batch_problem(step)) return batch;
  if (auto layers = check_layer_counts(step)) return layers;
  const std::vector<graph::SizeKnob> knobs = knobs_of(step);
  std::vector<std::int64_t> work = values_of(knobs);
  const Outcome given = evaluate(step, work);
  if (given.fit != Fit::too_large) return std::nullopt;
  // The knob pushed furthest past its usual value first: the one to name when bringing it down
  // alone makes the step representable.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < knobs.size(); ++i) {
    if (knobs[i].searched) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return static_cast<double>(knobs[a].value) / static_cast<double>(knobs[a].usual) >
           static_cast<double>(knobs[b].value) / static_cast<double>(knobs[b].usual);
  });
  for (std::size_t i : order) {
    const graph::SizeKnob& knob = knobs[i];
    const std::int64_t asked = knob.value;
    const std::int64_t g = std::max<std::int64_t>(knob.granule, 1);
    const std::int64_t floor = std::max(g, std::min(asked, knob.usual) / g * g);  // a valid value to start from
    if (asked <= floor) continue;
    work[i] = floor;
    if (evaluate(step, work).fit != Fit::ok) {
      work[i] = asked;
      continue;
    }
    // Sizes only grow with the value: bisection between a value that works and one that does not.
    std::int64_t lo = floor / g, hi = asked / g + (asked % g != 0);  // in granules
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      work[i] = mid * g;
      (evaluate(step, work).fit == Fit::ok ? lo : hi) = mid;
    }
    return StepSizeProblem{StepSizeProblem::Kind::too_large, knob, lo * g, given.why, {}};
  }
  StepSizeProblem p{StepSizeProblem::Kind::reduce_several, {}, 0, given.why, {}};
  for (std::size_t i : order) p.tried.push_back(knobs[i]);
  return p;
}

Status check_step_size(const StepDescription& step) {
  if (auto problem = find_step_size_problem(step)) return Error{describe(*problem)};
  return Status::success();
}

std::int64_t largest_representable_batch(const StepDescription& step, std::int64_t limit) {
  if (step.graph || !step.source) return limit;
  std::vector<std::int64_t> work = values_of(knobs_of(step));
  work[0] = limit;
  if (evaluate(step, work).fit != Fit::too_large) return limit;
  work[0] = 1;
  if (evaluate(step, work).fit == Fit::too_large) return 0;
  std::int64_t lo = 1, hi = limit;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    work[0] = mid;
    (evaluate(step, work).fit == Fit::too_large ? hi : lo) = mid;
  }
  return lo;
}

}  // namespace memplan::planner
