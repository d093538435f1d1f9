// Whether the step a user asks for can be represented at all, found before any planning: every
// tensor within graph::kMaxTensorBytes (2^60, the planner's limit on one buffer), the training
// step's tensors together within kMaxStepBytes, and its ops within kMaxStepOps. Sizes multiply
// (batch x sequence x width, image side squared, ...), so a size a user can type overflows long
// before memory runs out; this check turns that into an answer naming the size and the largest
// value of it that works, instead of an overflow deep in the planner. It knows a model only by
// the size knobs its source declares (graph/model_source.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/model_source.h"
#include "memplan/planner/plan_step.h"

namespace memplan::planner {

// The training step's tensors together; half the planner's limit on an arena (2^62), leaving
// room for alignment, guard bytes, workspace and recomputed activations.
inline constexpr Bytes kMaxStepBytes = Bytes{1} << 61;
// Ops in the training step. Schedules index ops with 32 bits; past a million ops the planner's
// quadratic steps would take hours.
inline constexpr std::int64_t kMaxStepOps = std::int64_t{1} << 20;

// The batch as a knob of the step (key "batch"), so problems name it like any other size.
graph::SizeKnob batch_knob(const StepDescription& step);

// Why a step cannot be represented, as data: callers name the sizes their own way (describe).
struct StepSizeProblem {
  enum class Kind : std::uint8_t {
    too_large,       // `knob` at its value: `largest` is the largest that works, the others as given
    too_many_ops,    // `knob` (a layer count): more ops than kMaxStepOps; `largest` works
    reduce_several,  // no single knob of `tried` brought down alone helps
    // `knob` (the batch) is a data-parallel step's global batch and does not divide among
    // `ranks` ranks; `largest` is the largest multiple of `ranks` below it (0: none)
    indivisible_batch,
  };
  Kind kind = Kind::too_large;
  graph::SizeKnob knob;
  std::int64_t largest = 0;
  std::string why;                    // too_large, reduce_several: what could not be represented
  std::vector<graph::SizeKnob> tried;  // reduce_several
  int ranks = 0;                       // indivisible_batch
};

// How messages name a size: with its value ("the sequence length 4096") or alone.
struct SizeNaming {
  std::function<std::string(const graph::SizeKnob& knob, std::optional<std::int64_t> value)> name;
  std::string others = "sizes";  // "... with the other sizes as given"
};
SizeNaming quantity_naming();  // the knobs' own quantities
std::string describe(const StepSizeProblem& problem, const SizeNaming& naming = quantity_naming());

// nullopt when `step` (a source's; a prebuilt graph always passes) can be represented, or when it
// fails for another reason (an inconsistent option, which plan_step reports). Otherwise the size
// that is too large and the largest value of it that works with the others as given. Layer counts
// are checked from two tiny builds before anything large is built, so no input makes this
// allocate more than the step it accepts.
// A data-parallel step's global batch that does not divide among its ranks is a problem too
// (checked first: global_batch_problem).
std::optional<StepSizeProblem> find_step_size_problem(const StepDescription& step);
// The one check of a data-parallel step's global batch against its world (plan_step, fit and
// train all read it): nullopt when the step is not data parallel or its batch divides.
std::optional<StepSizeProblem> global_batch_problem(const StepDescription& step);
// The same as a Status whose message names quantities (describe with quantity_naming()).
Status check_step_size(const StepDescription& step);

// The largest batch in [1, limit] at which `step` can be represented; 0 when not even batch 1.
std::int64_t largest_representable_batch(const StepDescription& step, std::int64_t limit);

}  // namespace memplan::planner
