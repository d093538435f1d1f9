// Whether the step a user asks for can be represented at all, found before any planning: every
// tensor within graph::kMaxTensorBytes (2^60, the planner's limit on one buffer), the training
// step's tensors together within kMaxStepBytes, and its ops within kMaxStepOps. Sizes multiply
// (batch x sequence x width, image side squared, ...), so a flag a user can type overflows long
// before memory runs out; this check turns that into an answer naming the flag and the largest
// value of it that works, instead of an overflow deep in the planner.
#pragma once

#include <cstdint>

#include "memplan/common/result.h"
#include "memplan/planner/plan_step.h"

namespace memplan::planner {

// The training step's tensors together; half the planner's limit on an arena (2^62), leaving
// room for alignment, guard bytes, workspace and recomputed activations.
inline constexpr Bytes kMaxStepBytes = Bytes{1} << 61;
// Ops in the training step. Schedules index ops with 32 bits; past a million ops the planner's
// quadratic steps would take hours.
inline constexpr std::int64_t kMaxStepOps = std::int64_t{1} << 20;

// Success when `step` (a model from the registry; a prebuilt graph always passes) can be
// represented, or when it fails for another reason (an inconsistent option, which plan_step
// reports). Otherwise an Error naming the flag that is too large, as the CLI spells it (--batch,
// --seq, --image-size, --hidden, --width, --layers), and the largest value of it that works with
// the other flags as given. Layer counts are checked from two tiny builds before anything large
// is built, so no input makes this allocate more than the step it accepts.
Status check_step_size(const StepDescription& step);

// The largest batch in [1, limit] at which `step` can be represented; 0 when not even batch 1.
std::int64_t largest_representable_batch(const StepDescription& step, std::int64_t limit);

}  // namespace memplan::planner
