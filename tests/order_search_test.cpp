// planner/order_search: the searched op order on a graph whose best order is counted by hand, the
// orderings it keeps on real training steps (valid schedules, collectives in their order, peaks
// as the plan counts them), the same parameters as program order after training, and --schedule
// as commands take it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/graph/builder.h"
#include "memplan/graph/data_parallel.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/order_search.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/schedule.h"
#include "test_util.h"

namespace memplan::planner {
namespace {

using graph::Builder;
using testing::run_cli;
using graph::Graph;

// Two branches from x, each a large product reduced to a scalar, added into the loss. Built
// branch by branch's first op, then the reductions: the program order holds both products at
// once; running each reduction right after its product holds one.
//   0: A = x W1 [64, 256]   1: B = x W2 [64, 256]   2: a = sum(A)   3: b = sum(B)   4: s = a + b
struct TwoBranches {
  Graph g;
  TwoBranches() {
    Builder b(g);
    const TensorId x = b.input("x", {64, 64});
    const TensorId w1 = b.parameter("w1", {64, 256}, {});
    const TensorId w2 = b.parameter("w2", {64, 256}, {});
    const TensorId big_a = b.matmul(x, w1, false, false, "A");
    const TensorId big_b = b.matmul(x, w2, false, false, "B");
    const TensorId a = b.sum(big_a, "a");
    const TensorId s_b = b.sum(big_b, "b");
    g.loss = b.add(a, s_b, "s");
  }
};

TEST(OrderSearch, FindsTheOrderAHandCountShows) {
  TwoBranches t;
  // Program order: x (16 KiB, an input, live until B reads it), A and B (64 KiB each) at op 1.
  const Schedule program = default_schedule(t.g);
  EXPECT_EQ(transient_peak(t.g, program), 16384 + 65536 + 65536);
  EXPECT_EQ(make_schedule(t.g, ScheduleKind::memory_aware), program) << "no updates: nothing for it to move";
  // A, a, B, b, s: at most x, one product and a scalar (a 256-byte footprint) at once, which no
  // order avoids (x is live until the second product, which is live alongside the first's sum).
  const OrderSearchResult found = search_order(t.g, program);
  EXPECT_TRUE(check_schedule(t.g, found.schedule).ok());
  EXPECT_EQ(found.start_peak, 16384 + 65536 + 65536);
  EXPECT_EQ(found.peak, 16384 + 65536 + 256);
  EXPECT_EQ(transient_peak(t.g, found.schedule), found.peak);
  EXPECT_GE(found.moves, 1);
  // The plan of --schedule auto is the searched one, and packs to that peak.
  const MemoryPlan plan = plan_memory(t.g).value();
  EXPECT_EQ(plan.schedule_kind, ScheduleKind::searched);
  EXPECT_EQ(plan.transient_bytes, 16384 + 65536 + 256);
  EXPECT_EQ(plan.memory_aware_arena_bytes, plan.persistent_bytes + 16384 + 65536 + 65536);
  // A budget of evaluations is kept: none, none moved.
  OrderSearchOptions none;
  none.max_evaluations = 1;
  EXPECT_LE(search_order(t.g, program, none).evaluations, 1);
}

std::vector<int> collectives_in_order(const Graph& g, const Schedule& s) {
  std::vector<int> out;
  for (const int op : s) {
    if (graph::op_info(g.ops()[static_cast<std::size_t>(op)].kind).communicates) out.push_back(op);
  }
  return out;
}

// Two parameters gathered from their shards (as ZeRO-3 does) and each reduced to a scalar, the
// reductions in reverse order: the first gather's output is live across the second. The search
// runs the first reduction before the second gather (one gathered tensor at a time), and keeps
// the gathers in the order every rank runs them.
TEST(OrderSearch, KeepsTheCollectivesInTheirOrder) {
  Graph g;
  Builder b(g);
  graph::OpAttrs gather;
  gather.world = 2;
  gather.shape = {64, 256};
  const TensorId shard1 = b.input("shard1", {64 * 256 / 2});
  const TensorId shard2 = b.input("shard2", {64 * 256 / 2});
  const TensorId full1 = g.add_op(graph::OpKind::all_gather, {shard1}, gather, "full1", graph::Role::activation, graph::Phase::forward);
  const TensorId full2 = g.add_op(graph::OpKind::all_gather, {shard2}, gather, "full2", graph::Role::activation, graph::Phase::forward);
  const TensorId u2 = b.sum(full2, "u2");
  const TensorId u1 = b.sum(full1, "u1");
  g.loss = b.add(u1, u2, "s");
  const Schedule program = default_schedule(g);
  ASSERT_EQ(transient_peak(g, program), 32768 + 2 * 65536);  // at the second gather: its shard, both gathered
  const OrderSearchResult found = search_order(g, program);
  ASSERT_TRUE(check_schedule(g, found.schedule).ok());
  EXPECT_EQ(collectives_in_order(g, found.schedule), collectives_in_order(g, program));
  // At the first gather both shards are live (inputs, until their gathers) beside its output.
  EXPECT_EQ(found.peak, 2 * 32768 + 65536);
}

struct Step {
  std::string label;
  Graph graph;
};

Graph training_step(const std::string& model, std::int64_t batch, graph::DType dtype = graph::DType::f32) {
  models::ModelOptions options;
  options.name = model;
  Graph g = models::build_forward(options, batch).value();
  if (dtype != graph::DType::f32) g = graph::with_working_dtype(g, dtype);
  graph::make_training_step(g, graph::OptimizerConfig{});
  if (dtype == graph::DType::f16) graph::add_loss_scaling(g);
  return g;
}

std::vector<Step> steps_to_search() {
  std::vector<Step> steps;
  steps.push_back({"gpt", training_step("gpt", 4)});
  steps.push_back({"cnn", training_step("cnn", 8)});
  steps.push_back({"gpt fp16 (updates gated on finite gradients)", training_step("gpt", 2, graph::DType::f16)});
  // A data-parallel rank's step: all-reduces and, with ZeRO-3, gathers and reduce-scatters.
  for (int zero : {0, 3}) {
    models::ModelOptions options;
    options.name = "gpt";
    Graph g = models::build_forward(options, 2).value();
    graph::DataParallelConfig dp;
    dp.world = 2;
    dp.zero = zero;
    dp.bucket_bytes = 64 << 10;
    graph::make_data_parallel_training_step(g, graph::OptimizerConfig{}, dp);
    steps.push_back({"gpt data parallel zero " + std::to_string(zero), std::move(g)});
  }
  // A checkpointed step: recompute ops in the backward pass.
  PlanRequest sqrt;
  sqrt.checkpoint = CheckpointStrategy::kSqrt;
  sqrt.choose_best_schedule = false;
  steps.push_back({"gpt sqrt checkpointing", plan_step(StepDescription::of_graph(training_step("gpt", 4)), sqrt).value().graph});
  return steps;
}


TEST(OrderSearch, KeepsTheOrderingsResultsDependOnAndCountsPeaksAsThePlanDoes) {
  int lowered = 0;
  for (const Step& step : steps_to_search()) {
    SCOPED_TRACE(step.label);
    const Graph& g = step.graph;
    const Schedule aware = make_schedule(g, ScheduleKind::memory_aware);
    const OrderSearchResult found = search_order(g, aware);
    ASSERT_TRUE(check_schedule(g, found.schedule).ok()) << check_schedule(g, found.schedule).error().message;
    EXPECT_LE(found.peak, transient_peak(g, aware));
    lowered += found.peak < found.start_peak ? 1 : 0;
    // Every rank runs the same collectives in the same order.
    EXPECT_EQ(collectives_in_order(g, found.schedule), collectives_in_order(g, aware));
    // Fused pairs stay adjacent (graph::fusable_pair).
    for (std::size_t pos = 0; pos + 1 < aware.size(); ++pos) {
      if (!keep_next_adjacent(g, aware[pos], aware[pos + 1])) continue;
      const auto at = std::find(found.schedule.begin(), found.schedule.end(), aware[pos]);
      ASSERT_NE(at + 1, found.schedule.end());
      EXPECT_EQ(*(at + 1), aware[pos + 1]);
    }
    // The search's peak is the plan's transient lower bound, for every order and both in-place settings.
    for (bool in_place : {true, false}) {
      for (ScheduleKind kind : {ScheduleKind::program, ScheduleKind::memory_aware, ScheduleKind::searched}) {
        PlanOptions options;
        options.choose_best_schedule = false;
        options.schedule = kind;
        options.in_place = in_place;
        options.guard_bytes = 64;
        options.solver = SolverBudget::greedy_only();
        const MemoryPlan plan = plan_memory(g, options).value();
        EXPECT_EQ(transient_peak(g, plan.schedule, options.order_search()), plan.transient_lower_bound_bytes)
            << schedule_name(kind) << " in place " << in_place;
      }
    }
  }
  EXPECT_GE(lowered, 3) << "the search should find something on most of these steps";
}

// Three AdamW steps of the GPT on the same tokens, planned with `kind`; the parameters' digest.
std::string train_gpt(ScheduleKind kind, CheckpointStrategy checkpoint, std::int64_t* moves) {
  models::ModelOptions options;
  options.name = "gpt";
  runtime::CpuDevice device;
  PlanRequest request;
  request.choose_best_schedule = false;
  request.schedule = kind;
  request.checkpoint = checkpoint;
  auto planned = runtime::plan_step_for(StepDescription::of_source(models::registry_source(options), 4), device, request);
  EXPECT_TRUE(planned.ok());
  *moves = planned.value().plan.order_moves;
  runtime::Executor executor(planned.value(), device);
  EXPECT_TRUE(executor.setup().ok());
  executor.initialize_persistent(11);
  const Graph& g = planned.value().graph;
  const graph::TensorDesc& x = g.tensor(g.find("x"));
  std::vector<std::int32_t> ids(static_cast<std::size_t>(x.shape.numel()));
  Rng rng(5);
  for (int s = 0; s < 3; ++s) {
    for (auto& v : ids) v = static_cast<std::int32_t>(rng.below(60));
    executor.set_input(g.find("x"), ids.data(), static_cast<Bytes>(ids.size() * 4));
    executor.set_input(g.find("labels"), ids.data(), static_cast<Bytes>(ids.size() * 4));
    EXPECT_TRUE(executor.run_step().ok());
  }
  return executor.params_sha256();
}

TEST(OrderSearch, TrainingWithTheSearchedOrderGivesProgramOrdersParameters) {
  for (CheckpointStrategy checkpoint : {CheckpointStrategy::kNone, CheckpointStrategy::kSqrt}) {
    std::int64_t moves = 0, none = 0;
    const std::string searched = train_gpt(ScheduleKind::searched, checkpoint, &moves);
    EXPECT_GT(moves, 0) << "the searched order must differ, or this compares an order with itself";
    EXPECT_EQ(searched, train_gpt(ScheduleKind::program, checkpoint, &none)) << checkpoint_strategy_name(checkpoint);
  }
}

TEST(OrderSearchCli, ScheduleFlagOnPlanFitCompareAndTrain) {
  const std::string model = "--model gpt --batch 4";
  const auto searched = nlohmann::json::parse(run_cli("plan " + model + " --schedule searched --json", false).output);
  EXPECT_EQ(searched["schedule"], "searched");
  EXPECT_GT(searched["op_order"]["moves"].get<int>(), 0);
  const auto aware = nlohmann::json::parse(run_cli("plan " + model + " --schedule memory_aware --json", false).output);
  EXPECT_LT(searched["arena_bytes"].get<Bytes>(), aware["arena_bytes"].get<Bytes>());
  // auto: every order planned, the lowest kept, and each one's arena reported.
  const auto fit = nlohmann::json::parse(run_cli("fit " + model + " --device cpu --device-memory 1GiB --json", false).output);
  EXPECT_EQ(fit["op_order"]["used"], "searched");
  EXPECT_EQ(fit["op_order"]["searched_arena_bytes"], searched["arena_bytes"]);
  EXPECT_EQ(fit["op_order"]["memory_aware_arena_bytes"], aware["arena_bytes"]);
  const std::string text = run_cli("fit " + model + " --device cpu --device-memory 1GiB").output;
  EXPECT_NE(text.find("op order: searched ("), std::string::npos) << text;
  const auto compare = nlohmann::json::parse(run_cli("compare " + model + " --schedule program --steps 1 --json", false).output);
  EXPECT_EQ(compare["op_order"]["used"], "program");
  const auto train = nlohmann::json::parse(
      run_cli("train --model gpt --steps 2 --batch 4 --eval-samples 4 --schedule searched --quiet --json", false).output);
  EXPECT_EQ(train["schedule"], "searched");
  const auto bad = run_cli("fit " + model + " --device-memory 1GiB --schedule sideways");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("searched"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace memplan::planner
