#include "memplan/runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace memplan::runtime {

Result<TrainSummary> train(Executor& executor, std::int64_t steps, const FeedFn& feed,
                           const ProgressFn& progress, const LrSchedule& schedule) {
  using Clock = std::chrono::steady_clock;
  const TensorId loss = executor.graph().loss;
  MEMPLAN_CHECK(loss != kNoTensor, "training graph without a loss");
  TrainSummary summary;
  std::vector<double> step_ms;
  const auto start = Clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    feed(i, executor);
    executor.set_lr_scale(schedule.factor(i, steps));
    const auto t0 = Clock::now();
    Status status = executor.run_step();
    const auto t1 = Clock::now();
    if (!status) return Error{"step " + std::to_string(i + 1) + ": " + status.error().message};
    const float value = executor.read_scalar(loss);
    if (!std::isfinite(value)) {
      return Error{"the loss became non-finite (" + std::to_string(value) + ") at step " +
                   std::to_string(i + 1) + "; try a lower learning rate"};
    }
    step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    summary.losses.push_back(value);
    if (progress) progress(StepReport{i + 1, steps, value, step_ms.back()});
  }
  executor.set_lr_scale(1.0);
  summary.steps = steps;
  summary.final_loss = summary.losses.empty() ? 0.0f : summary.losses.back();
  summary.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!step_ms.empty()) {
    std::nth_element(step_ms.begin(), step_ms.begin() + static_cast<std::ptrdiff_t>(step_ms.size() / 2),
                     step_ms.end());
    summary.step_time_ms_median = step_ms[step_ms.size() / 2];
  }
  return summary;
}

}  // namespace memplan::runtime
