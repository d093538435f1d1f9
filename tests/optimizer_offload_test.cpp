// Optimizer offload (graph::offload_optimizer): optimizer state and master copies in the plan's
// host region, gradients copied there for the CPU's update; the same bits as without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/graph/mixed_precision.h"
#include "memplan/graph/optimizer.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/planner/memory_plan.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"

namespace memplan {
namespace {

using testing::run_cli;

graph::Graph mlp_step(graph::DType dtype, graph::OptimizerKind optimizer) {
  models::ModelOptions model;
  model.name = "mlp";
  graph::Graph g = models::build_forward(model, 8).value();
  if (dtype != graph::DType::f32) g = graph::with_working_dtype(g, dtype);
  graph::OptimizerConfig config;
  config.kind = optimizer;
  graph::make_training_step(g, config);
  return g;
}

bool is_update(const graph::Op& op) { return op.phase == graph::Phase::optimizer && !op.updates.empty(); }

// Every update's state and master copy move to the host; it reads a host copy of its gradient
// made right after the gradient's last writer, so the device's gradient dies there.
TEST(OptimizerOffload, StateMovesToTheHostAndEachGradientIsCopiedAsSoonAsItIsFinal) {
  for (graph::DType dtype : {graph::DType::f32, graph::DType::bf16}) {
    graph::Graph g = mlp_step(dtype, graph::OptimizerKind::adamw);
    const int updates_before = static_cast<int>(std::count_if(g.ops().begin(), g.ops().end(), is_update));
    ASSERT_GT(updates_before, 0);
    EXPECT_EQ(graph::offload_optimizer(g), updates_before);
    int updates = 0;
    for (int i = 0; i < g.num_ops(); ++i) {
      const graph::Op& op = g.ops()[static_cast<std::size_t>(i)];
      if (!is_update(op)) continue;
      ++updates;
      EXPECT_FALSE(g.tensor(op.updates[0]).host) << op.name << ": the parameter stays on the device";
      // AdamW: m and v, and at 16 bits the master copy.
      EXPECT_EQ(op.updates.size(), dtype == graph::DType::f32 ? 3u : 4u) << op.name;
      for (std::size_t u = 1; u < op.updates.size(); ++u) EXPECT_TRUE(g.tensor(op.updates[u]).host) << op.name;
      const TensorId copy = op.inputs[0];
      ASSERT_TRUE(g.tensor(copy).host) << op.name;
      const int copy_op = g.producer(copy);
      ASSERT_GE(copy_op, 0);
      EXPECT_EQ(g.ops()[static_cast<std::size_t>(copy_op)].kind, graph::OpKind::to_host);
      EXPECT_LT(copy_op, i) << op.name;
      // Nothing after the copy writes the gradient, and the op just before it (or a copy placed
      // with it) is the gradient's last writer.
      const TensorId grad = g.ops()[static_cast<std::size_t>(copy_op)].inputs[0];
      EXPECT_FALSE(g.tensor(grad).host);
      const TensorId root = g.storage_root(grad);
      int last_writer = -1;
      for (int j = 0; j < g.num_ops(); ++j) {
        for (const auto* list : {&g.ops()[static_cast<std::size_t>(j)].outputs, &g.ops()[static_cast<std::size_t>(j)].updates}) {
          for (TensorId t : *list) {
            if (g.storage_root(t) == root) last_writer = j;
          }
        }
      }
      EXPECT_LT(last_writer, copy_op) << op.name;
      for (int j = last_writer + 1; j < copy_op; ++j) {
        EXPECT_EQ(g.ops()[static_cast<std::size_t>(j)].kind, graph::OpKind::to_host) << op.name << ": the copy waits";
      }
    }
    EXPECT_EQ(updates, updates_before);
  }
}

// The arena loses the state; the host region holds it (and the gradient copies), back to back,
// and a plan whose host buffers overlap is refused.
TEST(OptimizerOffload, TheHostRegionHoldsWhatTheArenaNoLongerDoes) {
  const graph::Graph on_device = mlp_step(graph::DType::bf16, graph::OptimizerKind::adamw);
  graph::Graph offloaded = on_device;
  graph::offload_optimizer(offloaded);
  const planner::MemoryPlan before = planner::plan_memory(on_device).value();
  const planner::MemoryPlan after = planner::plan_memory(offloaded).value();
  ASSERT_TRUE(planner::validate_plan(after).ok());
  EXPECT_TRUE(before.host_buffers.empty());
  EXPECT_EQ(before.host_bytes, 0);
  Bytes state = 0, params = 0, expected_host = 0;
  for (const planner::PlannedBuffer& b : before.buffers) {
    if (b.role == graph::Role::optimizer_state) state += align_up(b.size_bytes, planner::kArenaAlignment);
  }
  for (TensorId p : on_device.parameters()) {
    params += on_device.tensor(p).size_bytes();
    expected_host += align_up(on_device.tensor(p).size_bytes(), planner::kArenaAlignment);  // its gradient's copy
  }
  expected_host += state;
  EXPECT_EQ(after.host_bytes, expected_host);
  EXPECT_EQ(after.persistent_bytes, before.persistent_bytes - state);
  EXPECT_LT(after.arena_bytes, before.arena_bytes);
  for (const planner::PlannedBuffer& b : after.buffers) {
    EXPECT_FALSE(offloaded.tensor(b.root).host) << b.name << " is a host tensor in the arena";
  }
  ASSERT_GE(after.host_buffers.size(), 2u);
  planner::MemoryPlan broken = after;
  broken.host_buffers[1].offset = broken.host_buffers[0].offset;
  const Status s = planner::validate_plan(broken);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(broken.host_buffers[1].name), std::string::npos) << s.error().message;
  EXPECT_GT(params, 0);
}

nlohmann::json train_json(const std::string& args) {
  const auto r = run_cli("train --json --quiet --threads 1 --device cpu --steps 3 " + args, false);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return nlohmann::json::parse(r.output);
}

// The update runs where the state is, on the same values: the bits of the run without offload in
// every dtype and mode, no allocation during planned steps, and the arena fit plans is the one train
// allocates (fit --device cpu --offload-optimizer). Under the sanitizers bf16 planned only (master
// copies and state in the host region): each run is slow there.
TEST(OptimizerOffload, TrainingGivesTheBitsOfTrainingWithoutIt) {
  const std::string gpt = "--model gpt --batch 4 --seq 16 ";
  const std::vector<const char*> dtypes = testing::kSanitized ? std::vector<const char*>{"bf16"}
                                                               : std::vector<const char*>{"fp32", "bf16", "fp16"};
  const std::vector<const char*> modes = testing::kSanitized ? std::vector<const char*>{"planned"}
                                                              : std::vector<const char*>{"planned", "naive"};
  for (const char* dtype : dtypes) {
    const std::string base = gpt + "--dtype " + dtype;
    const nlohmann::json without = train_json(base);
    for (const char* mode : modes) {
      const nlohmann::json with = train_json(base + " --offload-optimizer --mode " + mode);
      EXPECT_EQ(with["params_sha256"], without["params_sha256"]) << dtype << " " << mode;
      EXPECT_EQ(with["offload_optimizer"], true);
      if (std::string(mode) != "planned") continue;  // naive mode allocates each tensor as it goes
      EXPECT_EQ(with["device_allocations_during_steps"], 0) << dtype;
      EXPECT_LT(with["arena_bytes"].get<Bytes>(), without["arena_bytes"].get<Bytes>()) << dtype;
      EXPECT_GT(with["host_bytes"].get<Bytes>(), 0) << dtype;
      const auto fit = run_cli("fit " + gpt + "--dtype " + dtype + " --offload-optimizer --device cpu --device-memory 1GiB --json", false);
      ASSERT_EQ(fit.exit_code, 0) << fit.output;
      const nlohmann::json f = nlohmann::json::parse(fit.output);
      EXPECT_EQ(f["arena_bytes"], with["arena_bytes"]) << dtype;
      EXPECT_EQ(f["host_bytes"], with["host_bytes"]) << dtype;
    }
  }
}

// At scale: Llama-2-7B's AdamW state cannot share a 24 GiB card with its weights, but offloaded
// it leaves room for a batch under checkpointing; the answer states the host memory, and a
// --host-memory below it is a "no" that says so.
TEST(OptimizerOffload, FitAnswersWithTheHostMemoryItNeeds) {
  const std::string q = "fit --model llama2-7b --dtype bf16 --device-memory 24GiB --max-batch --json";
  const auto on_device = run_cli(q, false);
  ASSERT_EQ(on_device.exit_code, 0) << on_device.output;
  const nlohmann::json d = nlohmann::json::parse(on_device.output);
  const auto offloaded = run_cli(q + " --offload-optimizer", false);
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  const nlohmann::json o = nlohmann::json::parse(offloaded.output);
  EXPECT_EQ(d["max_batch_by_checkpoint"]["optimal"], 0);
  EXPECT_GT(o["max_batch_by_checkpoint"]["optimal"].get<std::int64_t>(), 0) << o.dump();
  const double params = o["parameter_count"].get<double>();
  // fp32 master weights, m and v (12 bytes a parameter) and the bf16 gradient copies (2).
  EXPECT_NEAR(o["host_bytes"].get<double>() / params, 14.0, 0.01);
  EXPECT_EQ(o["breakdown"]["optimizer_state"], 0);
  EXPECT_EQ(o["breakdown"]["master_weights"], 0);
  if (testing::kSanitized) return;  // a third 7B --max-batch search (seconds there); the same code as above
  const auto tight = run_cli(q + " --offload-optimizer --host-memory 64GiB", false);
  ASSERT_EQ(tight.exit_code, 0) << tight.output;
  const nlohmann::json t = nlohmann::json::parse(tight.output);
  EXPECT_FALSE(t["fits"].get<bool>());
  EXPECT_FALSE(t["host_fits"].get<bool>());
  EXPECT_EQ(t["max_batch_by_checkpoint"]["optimal"], 0);
  EXPECT_NE(t["suggestion"]["note"].get<std::string>().find("--host-memory"), std::string::npos) << t.dump();
}

}  // namespace
}  // namespace memplan
