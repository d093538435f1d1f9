// Helpers shared by tests: build and run small graphs on the CPU device, random tensors.
#pragma once

#include <memory>
#include <vector>

#include "memplan/common/rng.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace memplan::testing {

// `graph` planned for `device` through the one pipeline (plan_step); a test's executor runs it.
inline planner::MemoryPlan plan_for(const graph::Graph& graph, const runtime::Device& device,
                                    planner::PlanRequest request = {}) {
  auto planned = runtime::plan_step_for(planner::StepDescription::of_graph(graph), device, request);
  MEMPLAN_CHECK(planned.ok(), (planned.ok() ? "" : planned.error().message));
  return std::move(planned).value().plan;
}

// Owns a CPU device and an executor over `graph`, set up and ready.
struct CpuRun {
  explicit CpuRun(const graph::Graph& graph, runtime::ExecutionMode mode = runtime::ExecutionMode::planned)
      : executor(graph, plan_for(graph, device), device, runtime::ExecutorOptions{mode}) {
    Status s = executor.setup();
    MEMPLAN_CHECK(s.ok(), (s.ok() ? "" : s.error().message));
  }
  runtime::CpuDevice device;
  runtime::Executor executor;
};

inline std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

inline std::vector<float> read_floats(const runtime::Executor& e, TensorId id) {
  std::vector<float> v(static_cast<std::size_t>(e.graph().tensor(id).shape.numel()));
  e.read_tensor(id, v.data());
  return v;
}

}  // namespace memplan::testing
