#include "memplan/runtime/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <string>

namespace memplan::runtime {

double LrSchedule::factor(std::int64_t step, std::int64_t steps) const {
  if (step < warmup_steps) return double(step + 1) / double(warmup_steps);
  if (kind == LrScheduleKind::constant) return 1.0;
  const std::int64_t span = steps - warmup_steps;
  if (span <= 0) return 1.0;
  return 0.5 * (1.0 + std::cos(std::numbers::pi * double(step - warmup_steps) / double(span)));
}

Status check_lr_schedule(const LrSchedule& schedule, std::int64_t steps) {
  if (schedule.warmup_steps < 0) return Error{"--warmup must be 0 or more steps"};
  if (schedule.warmup_steps >= steps && schedule.warmup_steps > 0) {
    return Error{"--warmup " + std::to_string(schedule.warmup_steps) + " leaves no step of the " +
                 std::to_string(steps) + " this run trains after warm-up; use fewer warm-up steps or train longer"};
  }
  return Status::success();
}

}  // namespace memplan::runtime
