// planner/levers.h: the cost of a step from its graph, the search for the cheapest combination of
// levers that fits (fit --suggest), and what each lever saves, on the GPT at small sizes where
// each answer can be checked against plans made here directly.
#include <gtest/gtest.h>

#include <string>

#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/levers.h"
#include "memplan/planner/step_size.h"

namespace memplan {
namespace {

using planner::CheckpointStrategy;
using planner::Levers;

models::ModelOptions small_gpt() {
  models::ModelOptions options;
  options.name = "gpt";
  options.gpt.vocab = 96;
  options.gpt.context = 64;
  options.gpt.layers = 4;
  options.gpt.heads = 4;
  options.gpt.width = 64;
  return options;
}

// The GPT's step with `levers` at global `batch` on `devices` devices (what tools/ builds from its
// flags for fit --suggest).
planner::StepWithLevers gpt_steps(int devices) {
  return [devices](const Levers& levers, std::int64_t batch) -> Result<planner::StepDescription> {
    models::ModelOptions options = small_gpt();
    models::set_tensor_parallel(options, {levers.tensor_parallel, 0});
    planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(options), batch);
    step.offload_optimizer = levers.offload_optimizer;
    const int replicas = devices / levers.tensor_parallel;
    if (replicas > 1) {
      step.parallel.world = replicas;
      step.parallel.zero = levers.zero;
    }
    if (auto problem = planner::global_batch_problem(step)) return Error{"the batch does not divide"};
    return step;
  };
}

planner::PlanRequest cpu_request() {
  planner::PlanRequest request;
  request.device = planner::documented_device_profile("cpu").value();
  return request;
}

// The device memory one rank needs for `levers` at `batch`, planned here (checkpointing with
// `memory` as its budget).
Bytes total_of(const Levers& levers, std::int64_t batch, int devices, Bytes memory) {
  auto step = gpt_steps(devices)(levers, batch);
  EXPECT_TRUE(step) << step.error().message;
  planner::PlanRequest request = cpu_request();
  request.checkpoint = levers.checkpoint;
  request.budget = request.device.arena_budget(memory);
  auto planned = planner::plan_step(step.value(), request);
  EXPECT_TRUE(planned) << planned.error().message;
  return request.device.total_bytes(planned.value().plan.arena_bytes);
}

TEST(StepCost, CountsTheBytesEachCollectiveSendsAndEveryFlop) {
  const std::int64_t batch = 2, T = 64, C = 64, L = 4;
  Levers levers;
  levers.tensor_parallel = 2;
  auto planned = planner::plan_step(gpt_steps(2)(levers, batch).value(), cpu_request());
  ASSERT_TRUE(planned) << planned.error().message;
  const planner::StepCost cost = planner::step_cost(planned.value().graph);
  // Two ranks: an all-reduce sends half its bytes twice (reduce-scatter, all-gather), an
  // all-gather half its output. Forward: a sum after each layer's attention and MLP and after the
  // embedding; backward: one per tp_copy (attention's, the MLP's input, the head's). Each [B*T, C]
  // f32. The loss's statistics: [2, B*T, 2] f32 gathered.
  const double activation = double(batch * T * C * 4);
  const double expected = (2 * L + 1 + 2 * L + 1) * activation + 0.5 * double(2 * batch * T * 2 * 4);
  EXPECT_DOUBLE_EQ(cost.tensor_parallel_bytes, expected);
  EXPECT_DOUBLE_EQ(cost.data_parallel_bytes, 0.0);
  EXPECT_DOUBLE_EQ(cost.host_bytes, 0.0);
  double flops = 0;
  for (const graph::Op& op : planned.value().graph.ops()) flops += graph::op_flops(planned.value().graph, op);
  EXPECT_DOUBLE_EQ(cost.flops, flops);
  // The estimate adds each part at its rate; two passes cost twice one.
  const planner::CostModel model;
  EXPECT_DOUBLE_EQ(cost.seconds(model, 2), flops / model.flops_per_s + expected / model.nvlink_bytes_per_s);
  EXPECT_DOUBLE_EQ(cost.times(2).seconds(model, 2), 2 * cost.seconds(model, 2));
  // Replicas beyond one node move their bytes over the network.
  EXPECT_LT(model.data_parallel_bytes_per_s(16), model.data_parallel_bytes_per_s(8));
}

// Two devices in one node where every combination fits: ZeRO-2 moves the all-reduce's bytes as a
// reduce-scatter and an all-gather and its estimate is within a fraction of a percent of ZeRO-0's,
// so the combination that pulls no lever is the suggestion.
TEST(SuggestLevers, WhenEverythingFitsNoLeverIsPulled) {
  planner::SuggestQuestion q;
  q.step = gpt_steps(2);
  q.batch = 4;
  q.devices = 2;
  q.tensor_parallel_degrees = {1, 2};
  q.device_memory = Bytes{1} << 40;
  q.request = cpu_request();
  auto a = planner::suggest_levers(q);
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_TRUE(a.value().best);
  EXPECT_EQ(planner::levers_pulled(a.value().best->levers), 0) << planner::describe(a.value().best->levers, 1);
}

// One device whose memory holds the step only with recomputation: the suggestion checkpoints,
// and its plan is one that fits while the step without recomputation does not.
TEST(SuggestLevers, OneDeviceTooSmallForTheActivationsGetsTheLeastRecomputationThatFits) {
  const std::int64_t batch = 16;
  const Bytes plain = total_of({}, batch, 1, Bytes{1} << 40);
  Levers least_memory;
  least_memory.checkpoint = CheckpointStrategy::kOptimal;
  const Bytes smallest = total_of(least_memory, batch, 1, 0);  // no budget: the least arena
  ASSERT_LT(smallest, plain);
  planner::SuggestQuestion q;
  q.step = gpt_steps(1);
  q.batch = batch;
  q.device_memory = (plain + smallest) / 2;
  q.request = cpu_request();
  auto a = planner::suggest_levers(q);
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_TRUE(a.value().best);
  const planner::LeverCandidate& best = *a.value().best;
  EXPECT_EQ(best.levers.checkpoint, CheckpointStrategy::kOptimal);
  EXPECT_EQ(best.levers.micro_batch, 0);
  EXPECT_LE(best.total_bytes, q.device_memory);
  EXPECT_GT(best.recompute_fraction, 0.0);
  EXPECT_EQ(total_of(best.levers, batch, 1, q.device_memory), best.total_bytes);
}

// Memory below what any recomputation reaches at the whole batch: the largest micro-batch that
// fits, with the accumulation steps that make up the batch, and the next larger divisor does not.
TEST(SuggestLevers, BelowTheLeastArenaTheLargestMicroBatchThatFitsAccumulates) {
  const std::int64_t batch = 16;
  Levers least_memory;
  least_memory.checkpoint = CheckpointStrategy::kOptimal;
  const Bytes at_4 = total_of(least_memory, 4, 1, 0), at_8 = total_of(least_memory, 8, 1, 0);
  ASSERT_LT(at_4, at_8);
  planner::SuggestQuestion q;
  q.step = gpt_steps(1);
  q.batch = batch;
  q.device_memory = (at_4 + at_8) / 2;
  q.request = cpu_request();
  auto a = planner::suggest_levers(q);
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_TRUE(a.value().best);
  const planner::LeverCandidate& best = *a.value().best;
  EXPECT_EQ(best.levers.micro_batch, 4) << planner::describe(best.levers, best.accumulation_steps);
  EXPECT_EQ(best.accumulation_steps, 4);
  EXPECT_LE(best.total_bytes, q.device_memory);
}

// Two devices too small for one replica's persistent state at ZeRO-0: sharding or splitting the
// layers is what fits, and each lever's saving is the difference of two plans made here.
TEST(SuggestLevers, TwoDevicesTooSmallForTheStateShardOrSplitAndSayWhatEachLeverSaves) {
  const std::int64_t batch = 2;
  const Bytes replicated = total_of({}, batch, 2, Bytes{1} << 40);
  Levers sharded;
  sharded.zero = 3;
  const Bytes zero3 = total_of(sharded, batch, 2, Bytes{1} << 40);
  ASSERT_LT(zero3, replicated);
  planner::SuggestQuestion q;
  q.step = gpt_steps(2);
  q.batch = batch;
  q.devices = 2;
  q.tensor_parallel_degrees = {1, 2};
  q.device_memory = (replicated + zero3) / 2;
  q.request = cpu_request();
  auto a = planner::suggest_levers(q);
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_TRUE(a.value().best);
  const planner::LeverCandidate& best = *a.value().best;
  EXPECT_GE(planner::levers_pulled(best.levers), 1);
  EXPECT_TRUE(best.levers.zero > 0 || best.levers.tensor_parallel > 1 || best.levers.offload_optimizer ||
              best.levers.checkpoint != CheckpointStrategy::kNone);
  EXPECT_LE(best.total_bytes, q.device_memory);
  // The suggestion is the least estimate among the fitting ones, or within kSimplerWithin of it.
  for (const planner::LeverCandidate& c : a.value().candidates) {
    if (c.fits) {
      EXPECT_LE(best.seconds, c.seconds * (1.0 + planner::kSimplerWithin)) << planner::describe(c.levers, 1);
    }
  }

  Levers chosen;
  chosen.zero = 2;
  auto savings = planner::lever_savings(q.step, chosen, batch, 2, cpu_request(), Bytes{1} << 40);
  ASSERT_TRUE(savings) << savings.error().message;
  ASSERT_EQ(savings.value().size(), 1u);
  const Bytes with = total_of(chosen, batch, 2, Bytes{1} << 40);
  EXPECT_EQ(savings.value()[0].total_without, replicated);
  EXPECT_EQ(savings.value()[0].saved, replicated - with);
  EXPECT_GT(savings.value()[0].saved, 0);
}

}  // namespace
}  // namespace memplan
