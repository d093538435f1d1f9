// Helpers shared by tests: build and run small graphs on the CPU device, random tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memplan/common/rng.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace memplan::testing {

// What tests ask of a built graph: its parameter count, each parameter's shape by name, how many
// ops of a kind it has, and the op of a kind with a name (nullptr when none).
inline std::int64_t parameter_count(const graph::Graph& g) {
  std::int64_t n = 0;
  for (TensorId p : g.parameters()) n += g.tensor(p).shape.numel();
  return n;
}
inline std::map<std::string, graph::Shape> parameter_shapes(const graph::Graph& g) {
  std::map<std::string, graph::Shape> shapes;
  for (TensorId p : g.parameters()) shapes[g.tensor(p).name] = g.tensor(p).shape;
  return shapes;
}
inline int count_ops(const graph::Graph& g, graph::OpKind kind) {
  int n = 0;
  for (const graph::Op& op : g.ops()) n += op.kind == kind;
  return n;
}
inline const graph::Op* op_named(const graph::Graph& g, graph::OpKind kind, const std::string& name) {
  for (const graph::Op& op : g.ops()) {
    if (op.kind == kind && op.name == name) return &op;
  }
  return nullptr;
}

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

// A whole model's gradients against central differences of its loss: `loss_now` runs the step
// and returns the loss; the analytic gradient of every parameter (retained in the graph) is read
// after a first step, then up to five elements of each parameter, spread over it, are moved by
// +-h and the difference quotient compared with it (within tolerance * (1 + |numeric|)). An
// element for which `still_valid` (when given) says no after either evaluation (a step function
// of the weights changed, e.g. a router's choice) is skipped, not compared.
struct FiniteDifferences {
  int checked = 0;
  int skipped = 0;
};
inline FiniteDifferences expect_gradients_match_central_differences(runtime::Executor& e, const std::function<double()>& loss_now,
                                                                    float h = 1e-2f, double tolerance = 2e-3,
                                                                    const std::function<bool()>& still_valid = {}) {
  const graph::Graph& g = e.graph();
  (void)loss_now();
  // Parameters with a gradient: a frozen one (a router's choice bias) has none to check.
  std::vector<TensorId> trained;
  for (TensorId p : g.parameters()) {
    if (g.tensor(p).grad != kNoTensor) trained.push_back(p);
  }
  std::vector<std::vector<float>> analytic;
  for (TensorId p : trained) analytic.push_back(read_floats(e, g.tensor(p).grad));
  FiniteDifferences result;
  std::size_t index = 0;
  for (TensorId p : trained) {
    std::vector<float> values = read_floats(e, p);
    const std::size_t n = values.size(), stride = std::max<std::size_t>(1, n / 5);
    for (std::size_t i = 0; i < n; i += stride) {
      const float original = values[i];
      auto loss_at = [&](float v, bool& valid) {
        values[i] = v;
        e.write_values(p, values.data());
        const double loss = loss_now();
        valid = valid && (!still_valid || still_valid());
        return loss;
      };
      bool valid = true;
      const double up = loss_at(original + h, valid), down = loss_at(original - h, valid);
      values[i] = original;
      e.write_values(p, values.data());
      if (!valid) {
        ++result.skipped;
        continue;
      }
      const double numeric = (up - down) / (2.0 * h);
      EXPECT_NEAR(analytic[index][i], numeric, tolerance * (1.0 + std::abs(numeric))) << "d loss / d " << g.tensor(p).name << "[" << i << "]";
      ++result.checked;
    }
    ++index;
  }
  return result;
}

}  // namespace memplan::testing
