// planner/liveness and planner/schedule on hand-built graphs: intervals, views sharing their
// base's buffer, persistent and result buffers, in-place reuse, and the memory-aware order.
#include <gtest/gtest.h>

#include <algorithm>

#include "memplan/graph/builder.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/mlp.h"
#include "memplan/models/registry.h"
#include "memplan/models/zoo.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/schedule.h"
#include "tests/cli_util.h"

namespace memplan::planner {
namespace {

using graph::Builder;
using graph::Graph;

// x -> a = relu(x) -> v = reshape(a) -> s = sum(v) (loss), with a parameter w unused by ops
// except b = mul(a, w) feeding nothing else.
struct Chain {
  Graph g;
  TensorId x, w, a, v, b, s;
  Chain() {
    Builder builder(g);
    x = builder.input("x", {2, 3});
    w = builder.parameter("w", {2, 3}, {});
    a = builder.relu(x, "a");          // op 0
    b = builder.mul(a, w, "b");         // op 1
    v = builder.reshape(b, {6}, "v");   // op 2 (view of b)
    s = builder.sum(v, "s");            // op 3
    g.loss = s;
  }
};

const BufferLifetime& buffer_of(const Lifetimes& l, TensorId t) {
  return l.buffers[static_cast<std::size_t>(l.buffer_of_tensor[static_cast<std::size_t>(t)])];
}

TEST(Liveness, IntervalsViewsPersistentAndResults) {
  Chain c;
  const Lifetimes l = compute_lifetimes(c.g, default_schedule(c.g));
  EXPECT_EQ(buffer_of(l, c.x).first_op, 0);  // inputs are written before op 0
  EXPECT_EQ(buffer_of(l, c.x).last_op, 0);
  EXPECT_EQ(buffer_of(l, c.a).first_op, 0);
  EXPECT_EQ(buffer_of(l, c.a).last_op, 1);
  // The view shares b's buffer, which therefore lives until the view's last reader (op 3).
  EXPECT_EQ(l.buffer_of_tensor[static_cast<std::size_t>(c.v)], l.buffer_of_tensor[static_cast<std::size_t>(c.b)]);
  EXPECT_EQ(buffer_of(l, c.b).first_op, 1);
  EXPECT_EQ(buffer_of(l, c.b).last_op, 3);
  EXPECT_TRUE(buffer_of(l, c.w).persistent);
  EXPECT_EQ(buffer_of(l, c.w).last_op, 3);
  EXPECT_TRUE(buffer_of(l, c.s).step_result);
  EXPECT_EQ(l.buffers.size(), 5u);  // x, w, a, b(+v), s
}

TEST(Liveness, InPlaceSharesABufferOnlyWhenTheInputDiesThere) {
  Chain c;
  const Lifetimes with = compute_lifetimes(c.g, default_schedule(c.g), LivenessOptions{true});
  // relu(x): x dies at op 0 and has a's size, so a is written over x.
  EXPECT_EQ(with.buffer_of_tensor[static_cast<std::size_t>(c.a)], with.buffer_of_tensor[static_cast<std::size_t>(c.x)]);
  // mul(a, w): a dies at op 1 -> b over a (w is persistent and never reused).
  EXPECT_EQ(with.buffer_of_tensor[static_cast<std::size_t>(c.b)], with.buffer_of_tensor[static_cast<std::size_t>(c.a)]);
  EXPECT_NE(with.buffer_of_tensor[static_cast<std::size_t>(c.b)], with.buffer_of_tensor[static_cast<std::size_t>(c.w)]);
  EXPECT_EQ(buffer_of(with, c.b).last_op, 3);

  // If a is read again later, it does not die at op 1, so b needs its own buffer.
  Graph g;
  Builder builder(g);
  auto x = builder.input("x", {4});
  auto w = builder.parameter("w", {4}, {});
  auto a = builder.relu(x, "a");
  auto b = builder.mul(a, w, "b");
  auto c2 = builder.add(b, a, "c");  // a read after b is produced
  g.loss = builder.sum(c2, "loss");
  const Lifetimes l = compute_lifetimes(g, default_schedule(g), LivenessOptions{true});
  EXPECT_NE(l.buffer_of_tensor[static_cast<std::size_t>(b)], l.buffer_of_tensor[static_cast<std::size_t>(a)]);
  // ... but c = add(b, a) may be written over b (b dies there).
  EXPECT_EQ(l.buffer_of_tensor[static_cast<std::size_t>(c2)], l.buffer_of_tensor[static_cast<std::size_t>(b)]);
}

TEST(Schedule, MemoryAwareRunsEachUpdateAsSoonAsItsGradientIsFinal) {
  Graph g = models::build_mlp(models::MlpConfig{16, {8, 8}, 4}, 2);
  graph::make_training_step(g, graph::OptimizerConfig{});
  const Schedule program = make_schedule(g, ScheduleKind::program);
  const Schedule aware = make_schedule(g, ScheduleKind::memory_aware);
  ASSERT_TRUE(check_schedule(g, program).ok());
  ASSERT_TRUE(check_schedule(g, aware).ok());
  // In program order every update comes after the whole backward pass; in memory-aware order
  // the last layer's updates come before the first layer's weight gradient is computed.
  auto position = [](const Schedule& s, int op) {
    return static_cast<int>(std::find(s.begin(), s.end(), op) - s.begin());
  };
  int update_fc3 = -1, grad_fc1 = -1;
  for (int i = 0; i < g.num_ops(); ++i) {
    const auto& op = g.ops()[static_cast<std::size_t>(i)];
    if (op.name == "update(fc3.weight)") update_fc3 = i;
    if (op.name == "d(fc1.weight)") grad_fc1 = i;
  }
  ASSERT_GE(update_fc3, 0);
  ASSERT_GE(grad_fc1, 0);
  EXPECT_GT(position(program, update_fc3), position(program, grad_fc1));
  EXPECT_LT(position(aware, update_fc3), position(aware, grad_fc1));
  // And it never runs an update before an op that still reads the old weight.
  auto plan_program = plan_memory(g, PlanOptions{ScheduleKind::program, false}).value();
  auto plan_aware = plan_memory(g, PlanOptions{ScheduleKind::memory_aware, false}).value();
  EXPECT_LE(plan_aware.arena_bytes, plan_program.arena_bytes);
}

// The memory-aware order stated directly: after each non-update op, scan every update in
// program order and run each whose dependencies have all run (quadratic; the planner counts
// unmet dependencies instead), except right after an im2col whose next op reads its columns or
// a columns' gradient whose next op is its col2im (pairs the CPU runs fused). The two must
// agree op for op.
Schedule memory_aware_by_scanning(const Graph& g) {
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(g.num_tensors()));
  for (int i = 0; i < g.num_ops(); ++i) {
    for (TensorId t : g.ops()[static_cast<std::size_t>(i)].inputs) {
      const TensorId root = g.storage_root(t);
      if (graph::is_persistent(g.tensor(root).role)) readers[static_cast<std::size_t>(root)].push_back(i);
    }
  }
  std::vector<bool> done(static_cast<std::size_t>(g.num_ops()), false);
  Schedule schedule;
  auto ready = [&](int i) {
    const graph::Op& op = g.ops()[static_cast<std::size_t>(i)];
    for (TensorId t : op.inputs) {
      if (g.producer(t) >= 0 && !done[static_cast<std::size_t>(g.producer(t))]) return false;
    }
    for (TensorId t : op.updates) {
      for (int r : readers[static_cast<std::size_t>(g.storage_root(t))]) {
        if (r != i && !done[static_cast<std::size_t>(r)]) return false;
      }
    }
    return true;
  };
  auto is_update = [&](int i) { return !g.ops()[static_cast<std::size_t>(i)].updates.empty(); };
  auto fused_with_next = [&](int i) {
    if (i + 1 >= g.num_ops()) return false;
    const graph::Op& a = g.ops()[static_cast<std::size_t>(i)];
    const graph::Op& b = g.ops()[static_cast<std::size_t>(i + 1)];
    const bool reads = std::count(b.inputs.begin(), b.inputs.end(), a.outputs.empty() ? kNoTensor : a.outputs[0]) > 0;
    return reads && ((a.kind == graph::OpKind::im2col &&
                      (b.kind == graph::OpKind::conv2d || b.kind == graph::OpKind::conv2d_backward_weight)) ||
                     (a.kind == graph::OpKind::conv2d_backward_cols && b.kind == graph::OpKind::col2im));
  };
  for (int i = 0; i < g.num_ops(); ++i) {
    if (is_update(i)) continue;
    schedule.push_back(i);
    done[static_cast<std::size_t>(i)] = true;
    if (fused_with_next(i)) continue;
    for (int u = 0; u < g.num_ops(); ++u) {
      if (is_update(u) && !done[static_cast<std::size_t>(u)] && ready(u)) {
        schedule.push_back(u);
        done[static_cast<std::size_t>(u)] = true;
      }
    }
  }
  for (int u = 0; u < g.num_ops(); ++u) {
    if (is_update(u) && !done[static_cast<std::size_t>(u)]) schedule.push_back(u);
  }
  return schedule;
}

TEST(Schedule, MemoryAwareOrderEqualsTheDirectScanOnEveryModelFamily) {
  std::vector<std::pair<std::string, Graph>> graphs;
  for (const std::string name : {"mlp", "cnn", "gpt"}) {
    models::ModelOptions options;
    options.name = name;
    graphs.emplace_back(name, models::build_forward(options, 4).value());
  }
  models::ZooOptions zoo;
  zoo.seq = 32;
  zoo.image_size = 32;
  for (const std::string name : {"gpt2", "llama-1b", "bert-base", "resnet50"}) {
    graphs.emplace_back(name, models::build_zoo_forward(name, 2, zoo).value());
  }
  for (auto& [name, g] : graphs) {
    for (auto kind : {graph::OptimizerKind::sgd, graph::OptimizerKind::momentum, graph::OptimizerKind::adamw}) {
      // The reference scan is quadratic: under the sanitizers AdamW's step alone (the most ops).
      if (testing::kSanitized && kind != graph::OptimizerKind::adamw) continue;
      Graph step = g;
      graph::OptimizerConfig opt;
      opt.kind = kind;
      graph::make_training_step(step, opt);
      const Schedule fast = make_schedule(step, ScheduleKind::memory_aware);
      EXPECT_EQ(fast, memory_aware_by_scanning(step)) << name;
      EXPECT_TRUE(check_schedule(step, fast).ok()) << name;
      EXPECT_NE(fast, make_schedule(step, ScheduleKind::program)) << name << ": updates should move earlier";
    }
    // Checkpointed steps add recompute ops that read parameters before their updates.
    Graph step = g;
    graph::make_training_step(step, graph::OptimizerConfig{});
    const Graph remat = apply_checkpointing(step, {CheckpointStrategy::kSqrt, std::nullopt}).value().graph;
    EXPECT_EQ(make_schedule(remat, ScheduleKind::memory_aware), memory_aware_by_scanning(remat)) << name << " + sqrt";
  }
}

TEST(Schedule, CheckRejectsAnUpdateBeforeAReaderOfTheOldWeight) {
  Graph g = models::build_mlp(models::MlpConfig{16, {8}, 4}, 2);
  graph::make_training_step(g, graph::OptimizerConfig{});
  Schedule bad = make_schedule(g, ScheduleKind::program);
  // Move the first update to the very front: it runs before the forward pass reads the weight.
  auto first_update = std::find_if(bad.begin(), bad.end(), [&](int i) {
    return !g.ops()[static_cast<std::size_t>(i)].updates.empty();
  });
  std::rotate(bad.begin(), first_update, first_update + 1);
  const Status s = check_schedule(g, bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("update("), std::string::npos) << s.error().message;
}

TEST(MemoryPlan, TrainingGraphsPackToTheLowerBound) {
  for (std::int64_t batch : {1, 7, 64, 300}) {
    Graph g = models::build_mlp(models::MlpConfig{}, batch);
    graph::make_training_step(g, graph::OptimizerConfig{});
    const MemoryPlan plan = plan_memory(g).value();
    ASSERT_TRUE(validate_plan(plan).ok());
    EXPECT_EQ(plan.arena_bytes, plan.lower_bound_bytes) << "batch " << batch;
    EXPECT_EQ(plan.persistent_bytes % kArenaAlignment, 0);
    for (const PlannedBuffer& b : plan.buffers) EXPECT_EQ(b.offset % kArenaAlignment, 0) << b.name;
  }
}

}  // namespace
}  // namespace memplan::planner
