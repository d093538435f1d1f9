// Plans one training step of a small MLP with an installed memplan through the one pipeline
// (planner::plan_step), checks the plan, prints the arena size; checks a training spec.
#include <cstdio>

#include "memplan/models/model_source.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/devices.h"
#include "memplan/train/run.h"

int main() {
  using namespace memplan;
  models::ModelOptions model;  // the MLP
  model.mlp.hidden = {64, 32};
  const auto step = planner::StepDescription::of_source(models::registry_source(model), 16);
  Result<planner::PlannedStep> planned = planner::plan_step(step, planner::PlanRequest{});
  if (!planned.ok()) {
    std::fprintf(stderr, "plan_step: %s\n", planned.error().message.c_str());
    return 1;
  }
  const Status valid = planner::validate_plan(planned.value().plan);
  if (!valid.ok()) {
    std::fprintf(stderr, "validate_plan: %s\n", valid.error().message.c_str());
    return 1;
  }
  std::printf("arena_bytes %lld\n", static_cast<long long>(planned.value().plan.arena_bytes));
  // Links the runtime and the kernels (CUDA ones included when built) the way running the
  // plan would.
  std::printf("cuda_device_present %d\n", runtime::cuda_device_present() ? 1 : 0);
  // The training library links as well: a spec whose global batch cannot divide among 4 ranks
  // is refused before anything is read.
  train::TrainSpec spec;
  spec.batch = 10;
  std::printf("train_spec_refused %d\n", train::check_train_spec(spec, 4).ok() ? 0 : 1);
  return 0;
}
