// One timed training step of a planned step, on made-up data: what `memplan plan --profile` runs
// to show where a step's time goes without a dataset. Parameters come from their initialisers,
// f32 inputs are uniform in [0, 1), integer inputs (token ids, labels) uniform over the range
// their consumers accept (an embedding's rows, a loss's classes).
#pragma once

#include <cstdint>

#include "memplan/common/result.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/step_profile.h"

namespace memplan::runtime {

// Sets up a planned executor for `step` on `device`, runs `warmup` untimed steps and then
// `steps` profiled ones; the profile is their mean.
Result<StepProfile> time_steps(const planner::PlannedStep& step, Device& device, std::uint64_t seed = 0,
                               int warmup = 1, int steps = 1);

}  // namespace memplan::runtime
