#include "memplan/runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace memplan::runtime {

namespace {

// After a step of an fp16 run: halve the scale when its updates were skipped, double it after
// kLossScaleGrowthInterval clean steps (runtime/trainer.h).
Status update_loss_scale(Executor& executor, std::int64_t step, TrainSummary& summary) {
  if (executor.last_step_skipped()) {
    ++summary.skipped_steps;
    executor.set_loss_scale(executor.loss_scale() * 0.5);
    executor.set_loss_scale_growth_tracker(0);
    if (executor.loss_scale() < kMinLossScale) {
      return Error{"step " + std::to_string(step) + ": the fp16 loss scale fell below 2^-24, so every step's gradients "
                   "overflow fp16 even unscaled; rerun with --debug finite to name the first tensor that overflows, "
                   "or train in bf16 (fp32's range)"};
    }
    return Status::success();
  }
  const std::int64_t clean = executor.loss_scale_growth_tracker() + 1;
  if (clean >= kLossScaleGrowthInterval) {
    executor.set_loss_scale(executor.loss_scale() * 2.0);
    executor.set_loss_scale_growth_tracker(0);
  } else {
    executor.set_loss_scale_growth_tracker(clean);
  }
  return Status::success();
}

}  // namespace

Result<TrainSummary> train(Executor& executor, std::int64_t steps, const FeedFn& feed,
                           const ProgressFn& progress, const LrSchedule& schedule) {
  return train(executor, TrainLoop{0, steps, schedule, {}}, feed, progress);
}

Result<TrainSummary> train(Executor& executor, const TrainLoop& loop, const FeedFn& feed, const ProgressFn& progress) {
  using Clock = std::chrono::steady_clock;
  const TensorId loss = executor.graph().loss;
  MEMPLAN_CHECK(loss != kNoTensor, "training graph without a loss");
  MEMPLAN_CHECK(loop.first >= 0 && loop.first <= loop.total, "steps " << loop.first << " of " << loop.total);
  TrainSummary summary;
  summary.first_step = loop.first;
  std::vector<double> step_ms;
  const auto start = Clock::now();
  for (std::int64_t i = loop.first; i < loop.total; ++i) {
    feed(i, executor);
    executor.set_lr_scale(loop.schedule.factor(i, loop.total));
    const auto t0 = Clock::now();
    Status status = executor.run_step();
    const auto t1 = Clock::now();
    if (!status) return Error{"step " + std::to_string(i + 1) + ": " + status.error().message};
    if (executor.scales_loss()) {
      if (Status s = update_loss_scale(executor, i + 1, summary); !s) return s.error();
    }
    const float value = executor.read_scalar(loss);
    if (!std::isfinite(value)) {
      return Error{"the loss became non-finite (" + std::to_string(value) + ") at step " +
                   std::to_string(i + 1) + "; try a lower learning rate"};
    }
    step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    summary.losses.push_back(value);
    ++summary.steps;
    if (progress) progress(StepReport{i + 1, loop.total, value, step_ms.back()});
    if (loop.after_step && i + 1 < loop.total) {
      auto stop = loop.after_step(i + 1);
      if (!stop) return stop.error();
      if (stop.value()) {
        summary.stopped_early = true;
        break;
      }
    }
  }
  executor.set_lr_scale(1.0);
  summary.loss_scale = executor.loss_scale();
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
