// The training loop: feed a batch, run the step, watch the loss. Data loading is the caller's
// (a feed callback), so the loop knows nothing of datasets.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/lr_schedule.h"

namespace memplan::runtime {

struct StepReport {
  std::int64_t step = 0;  // 1-based
  std::int64_t total_steps = 0;
  float loss = 0.0f;
  double step_ms = 0.0;
};

struct TrainSummary {
  std::int64_t first_step = 0;  // steps done before this run (a resumed run)
  std::int64_t steps = 0;       // steps this run made
  // Set when TrainLoop::after_step asked to stop before the last step (a signal): the run
  // stopped cleanly after first_step + steps.
  bool stopped_early = false;
  float final_loss = 0.0f;
  double step_time_ms_median = 0.0;
  double total_seconds = 0.0;
  std::vector<float> losses;  // one per step
  // fp16 loss scaling: steps whose updates were skipped for an overflowed gradient (of this
  // run), and the scale after the last step.
  std::int64_t skipped_steps = 0;
  double loss_scale = 1.0;
};

// fp16 loss scaling as PyTorch's GradScaler does it: the scale starts at 2^16 (the executor's),
// doubles after kLossScaleGrowthInterval clean steps in a row, halves on a step whose gradients
// overflowed (that step changes no weight). Below kMinLossScale every step overflows: the run
// stops, naming the step.
inline constexpr std::int64_t kLossScaleGrowthInterval = 2000;
inline constexpr double kMinLossScale = 5.9604644775390625e-8;  // 2^-24

using FeedFn = std::function<void(std::int64_t step_index, Executor& executor)>;  // 0-based
using ProgressFn = std::function<void(const StepReport&)>;

// Steps [first, total) of a run of `total` steps: the feed and the schedule see the run's own
// step indices, so a run resumed at `first` continues as the run that was never stopped.
struct TrainLoop {
  std::int64_t first = 0;
  std::int64_t total = 0;
  LrSchedule schedule;
  // Between steps, after step `done` (1-based, of the run) and its loss check: an Error stops
  // the run with it; true stops it cleanly (a checkpoint saved on a signal). Not called after
  // the last step.
  std::function<Result<bool>(std::int64_t done)> after_step;
};

Result<TrainSummary> train(Executor& executor, const TrainLoop& loop, const FeedFn& feed, const ProgressFn& progress);

// Runs `steps` steps, the learning rate following `schedule` over them. Stops with an Error
// naming the step if the loss becomes NaN or infinite.
Result<TrainSummary> train(Executor& executor, std::int64_t steps, const FeedFn& feed,
                           const ProgressFn& progress, const LrSchedule& schedule = {});

}  // namespace memplan::runtime
