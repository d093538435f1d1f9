// Learning-rate schedules: the factor the optimizer updates multiply their learning rate by at
// each step of a run (the executor passes it to the update kernels; the graph keeps the base
// rate). A factor of exactly 1 leaves every update's bits unchanged.
#pragma once

#include <cstdint>
#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"

namespace memplan::runtime {

enum class LrScheduleKind { constant, cosine };

inline constexpr EnumName<LrScheduleKind> kLrScheduleNames[] = {{"constant", LrScheduleKind::constant},
                                                                {"cosine", LrScheduleKind::cosine}};

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  std::int64_t warmup_steps = 0;  // linear warm-up: (s + 1) / warmup for the first steps

  // The factor for 0-based step `step` of a run of `steps` steps (PyTorch's LambdaLR of the
  // same function): warm-up first, then 1 (constant) or 0.5 (1 + cos(pi (s - w) / (S - w)))
  // (cosine, from 1 down towards 0 at the last step).
  double factor(std::int64_t step, std::int64_t steps) const;
};

// Checks a schedule against a run of `steps` steps: warm-up must leave at least one step.
Status check_lr_schedule(const LrSchedule& schedule, std::int64_t steps);

}  // namespace memplan::runtime
