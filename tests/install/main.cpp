// Plans one training step of a small MLP with an installed memplan, checks the plan, prints the
// arena size.
#include <cstdio>

#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/runtime/devices.h"

int main() {
  using namespace memplan;
  models::ModelOptions model;  // the MLP
  model.mlp.hidden = {64, 32};
  Result<graph::Graph> step = models::build_forward(model, 16);
  if (!step.ok()) {
    std::fprintf(stderr, "build_forward: %s\n", step.error().message.c_str());
    return 1;
  }
  graph::make_training_step(step.value(), graph::OptimizerConfig{});

  Result<planner::MemoryPlan> plan = planner::plan_memory(step.value());
  if (!plan.ok()) {
    std::fprintf(stderr, "plan_memory: %s\n", plan.error().message.c_str());
    return 1;
  }
  const Status valid = planner::validate_plan(plan.value());
  if (!valid.ok()) {
    std::fprintf(stderr, "validate_plan: %s\n", valid.error().message.c_str());
    return 1;
  }
  std::printf("arena_bytes %lld\n", static_cast<long long>(plan.value().arena_bytes));
  // Links the runtime and the kernels (CUDA ones included when built) the way running the
  // plan would.
  std::printf("cuda_device_present %d\n", runtime::cuda_device_present() ? 1 : 0);
  return 0;
}
