// Data parallelism in one process: the shard arithmetic, the pack layout, the ZeRO rewrite of a
// training step (its collectives, shard shapes and bucket counts), and the errors a user sees.
// Runs across processes are checked under mpirun in data_parallel_mpi_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "memplan/dist/communicator.h"
#include "memplan/dist/shard.h"
#include "memplan/graph/data_parallel.h"
#include "memplan/kernels/kernel.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/validator.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace memplan {
namespace {

using graph::OpKind;

TEST(Shard, RangesCoverTheTensorOnceWithCeilSizedShards) {
  // 10 elements over 4 ranks: shards of 3, the last holding 1 (and 2 padding).
  const std::vector<std::pair<std::int64_t, std::int64_t>> expected = {{0, 3}, {3, 3}, {6, 3}, {9, 1}};
  for (int r = 0; r < 4; ++r) {
    const dist::ShardRange range = dist::shard_range(10, 4, r);
    EXPECT_EQ(range.offset, expected[static_cast<std::size_t>(r)].first) << r;
    EXPECT_EQ(range.count, expected[static_cast<std::size_t>(r)].second) << r;
  }
  EXPECT_EQ(dist::shard_size(10, 4), 3);
  // Fewer elements than ranks: the last ranks own nothing.
  EXPECT_EQ(dist::shard_range(2, 4, 1).count, 1);
  EXPECT_EQ(dist::shard_range(2, 4, 2).count, 0);
  EXPECT_EQ(dist::shard_range(2, 4, 3).count, 0);
}

TEST(Collectives, TheSingleProcessCommunicatorIsTheIdentity) {
  dist::SingleProcessCommunicator comm;
  std::vector<float> x = {1, 2, 3}, y(3, 0.0f);
  comm.all_reduce_sum(x.data(), 3, dist::ElementType::f32);
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  comm.reduce_scatter_sum(x.data(), y.data(), 3, dist::ElementType::f32);
  EXPECT_EQ(y, x);
  std::fill(y.begin(), y.end(), 0.0f);
  comm.all_gather_shards(x.data(), y.data(), 3, dist::ElementType::f32);
  EXPECT_EQ(y, x);
}

TEST(Collectives, ALauncherIsRecognisedFromTheEnvironmentAlone) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) unsetenv(name);
  EXPECT_EQ(dist::launched_world_size(), 0);
  auto alone = dist::make_cpu_communicator();
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone.value()->backend(), "single");
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  EXPECT_EQ(dist::launched_world_size(), 3);
  setenv("OMPI_COMM_WORLD_SIZE", "x3", 1);
  EXPECT_EQ(dist::launched_world_size(), 0);
  unsetenv("OMPI_COMM_WORLD_SIZE");
}

TEST(Collectives, PackLaysShardsOutRankMajorWithZeroPadding) {
  // x[5] and y[2] over 2 ranks: shards of 3 and 1; chunk r = x's shard r then y's shard r.
  graph::Graph g;
  graph::TensorDesc x{"x", graph::Shape{5}}, y{"y", graph::Shape{2}};
  x.role = y.role = graph::Role::input;
  const TensorId xi = g.add_tensor(x), yi = g.add_tensor(y);
  graph::OpAttrs attrs;
  attrs.world = 2;
  const TensorId packed = g.add_op(OpKind::pack, {xi, yi}, attrs, "packed", graph::Role::activation, graph::Phase::forward);
  g.retained.push_back(packed);
  EXPECT_EQ(g.tensor(packed).shape, (graph::Shape{8}));
  runtime::CpuDevice device;
  auto planned = runtime::plan_step_for(planner::StepDescription::of_graph(g), device);
  ASSERT_TRUE(planned) << planned.error().message;
  runtime::Executor exec(planned.value(), device);
  ASSERT_TRUE(exec.setup());
  const std::vector<float> xv = {1, 2, 3, 4, 5}, yv = {6, 7};
  exec.set_input(xi, xv.data(), 20);
  exec.set_input(yi, yv.data(), 8);
  ASSERT_TRUE(exec.run_step());
  std::vector<float> out(8);
  exec.read_tensor(packed, out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 6, 4, 5, 0, 7}));
}

int count_ops(const graph::Graph& g, OpKind kind) {
  return static_cast<int>(std::count_if(g.ops().begin(), g.ops().end(), [&](const graph::Op& op) { return op.kind == kind; }));
}

planner::StepDescription mlp_step(int world, int zero, Bytes bucket_bytes = Bytes{25} << 20) {
  models::ModelOptions model;
  model.name = "mlp";
  model.mlp.hidden = {64, 32};
  planner::StepDescription step = planner::StepDescription::of_model(model, 16);
  step.parallel.world = world;
  step.parallel.rank = world - 1;
  step.parallel.zero = zero;
  step.parallel.bucket_bytes = bucket_bytes;
  return step;
}

Bytes persistent_bytes(const graph::Graph& g, graph::Role role) {
  Bytes total = 0;
  for (const graph::TensorDesc& t : g.tensors()) total += t.role == role ? t.size_bytes() : 0;
  return total;
}

class ZeroStage : public ::testing::TestWithParam<int> {};

TEST_P(ZeroStage, EveryStagePlansAValidArenaWithItsCollectives) {
  const int zero = GetParam();
  auto planned = planner::plan_step(mlp_step(4, zero), planner::PlanRequest{});
  ASSERT_TRUE(planned) << planned.error().message;
  const graph::Graph& g = planned.value().graph;
  EXPECT_TRUE(planner::validate_plan(planned.value().plan));
  // One bucket (the MLP's gradients are far below 25 MiB) plus the loss's mean over ranks.
  EXPECT_EQ(count_ops(g, OpKind::all_reduce), zero <= 1 ? 2 : 1);
  EXPECT_EQ(count_ops(g, OpKind::reduce_scatter), zero >= 2 ? 1 : 0);
  const int params = 6;  // 3 linear layers: weight and bias
  EXPECT_EQ(count_ops(g, OpKind::all_gather_into), zero == 1 || zero == 2 ? params : 0);
  // Stage 3 gathers each parameter before the forward and again before the backward ops that read
  // it (counted on the single-process step).
  auto whole = planner::plan_step(mlp_step(1, 0), planner::PlanRequest{});
  ASSERT_TRUE(whole);
  const graph::Graph& w = whole.value().graph;
  int reads = 0;
  for (graph::Phase phase : {graph::Phase::forward, graph::Phase::backward}) {
    for (TensorId p : w.parameters()) {
      reads += std::any_of(w.ops().begin(), w.ops().end(), [&](const graph::Op& op) {
        return op.phase == phase && std::find(op.inputs.begin(), op.inputs.end(), p) != op.inputs.end();
      });
    }
  }
  EXPECT_GT(reads, params);
  EXPECT_EQ(count_ops(g, OpKind::all_gather), zero == 3 ? reads : 0);
}

TEST_P(ZeroStage, ShardedStagesHoldAQuarterOfTheStateOnFourRanks) {
  const int zero = GetParam();
  auto whole = planner::plan_step(mlp_step(1, 0), planner::PlanRequest{});
  auto sharded = planner::plan_step(mlp_step(4, zero), planner::PlanRequest{});
  ASSERT_TRUE(whole && sharded);
  const Bytes params = persistent_bytes(whole.value().graph, graph::Role::parameter);
  const Bytes state = persistent_bytes(whole.value().graph, graph::Role::optimizer_state);
  const Bytes dp_params = persistent_bytes(sharded.value().graph, graph::Role::parameter);
  const Bytes dp_state = persistent_bytes(sharded.value().graph, graph::Role::optimizer_state);
  // Shards round up: at most (world - 1) padding elements per tensor.
  const Bytes padding = 6 * 3 * 4 * 2;
  if (zero == 0) {
    EXPECT_EQ(dp_state, state);
  } else {
    EXPECT_GE(dp_state, state / 4);
    EXPECT_LE(dp_state, state / 4 + padding);
  }
  if (zero == 3) {
    EXPECT_GE(dp_params, params / 4);
    EXPECT_LE(dp_params, params / 4 + padding / 2);
  } else {
    EXPECT_EQ(dp_params, params);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroStage, ::testing::Values(0, 1, 2, 3));

TEST(DataParallel, SmallBucketsMeanMoreCollectives) {
  auto one = planner::plan_step(mlp_step(2, 0), planner::PlanRequest{});
  auto many = planner::plan_step(mlp_step(2, 0, 1), planner::PlanRequest{});  // 1 byte: a bucket per gradient
  ASSERT_TRUE(one && many);
  EXPECT_EQ(count_ops(one.value().graph, OpKind::all_reduce), 2);
  EXPECT_EQ(count_ops(many.value().graph, OpKind::all_reduce), 7);
}

TEST(DataParallel, ABatchThatDoesNotDivideAmongTheRanksIsRefused) {
  planner::StepDescription step = mlp_step(3, 1);  // global batch 16 over 3 ranks
  auto planned = planner::plan_step(step, planner::PlanRequest{});
  ASSERT_FALSE(planned);
  EXPECT_NE(planned.error().message.find("multiple of 3"), std::string::npos) << planned.error().message;
}

TEST(DataParallel, ARankGraphWithoutItsRanksRefusesToRun) {
  runtime::CpuDevice device;
  planner::PlanRequest request;
  request.device = runtime::device_profile(device);
  auto planned = planner::plan_step(mlp_step(2, 2), request);
  ASSERT_TRUE(planned) << planned.error().message;
  runtime::Executor alone(planned.value(), device);
  const Status s = alone.setup();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("mpirun -np 2"), std::string::npos) << s.error().message;
  dist::SingleProcessCommunicator single;
  runtime::ExecutorOptions options;
  options.communicator = &single;
  runtime::Executor wrong_world(planned.value(), device, options);
  EXPECT_FALSE(wrong_world.setup());
}

}  // namespace
}  // namespace memplan
