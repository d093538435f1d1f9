// Data parallelism in one process: the shard arithmetic, the pack layout, the ZeRO rewrite of a
// training step (its collectives, shard shapes and bucket counts), and the errors a user sees.
// Runs across processes are checked under mpirun in data_parallel_mpi_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "memplan/dist/communicator.h"
#include "memplan/dist/shard.h"
#include "memplan/graph/data_parallel.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_source.h"
#include "memplan/planner/fit.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/validator.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"
#include "tests/test_util.h"

namespace memplan {
namespace {

using graph::OpKind;
using testing::count_ops;

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

// Synchronised batch norm's second pass: about the true mean it gives batch_norm_stats' variance;
// about a mean off by d, the variance plus d^2 (sum (x - m - d)^2 / M = var + d^2).
TEST(SynchronisedBatchNorm, CentredStatisticsAreTheVarianceAboutTheGivenMean) {
  graph::Graph g;
  graph::TensorDesc x{"x", graph::Shape{3, 2, 4}}, centre{"centre", graph::Shape{2, 2}};
  x.role = centre.role = graph::Role::input;
  const TensorId xi = g.add_tensor(x), ci = g.add_tensor(centre);
  const TensorId plain = g.add_op(OpKind::batch_norm_stats, {xi}, {}, "plain", graph::Role::activation, graph::Phase::forward);
  const TensorId about = g.add_op(OpKind::batch_norm_centered_stats, {xi, ci}, {}, "about", graph::Role::activation,
                                  graph::Phase::forward);
  g.retained = {plain, about};
  runtime::CpuDevice device;
  auto planned = runtime::plan_step_for(planner::StepDescription::of_graph(g), device);
  ASSERT_TRUE(planned) << planned.error().message;
  runtime::Executor exec(planned.value(), device);
  ASSERT_TRUE(exec.setup());
  std::vector<float> xv(24);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = float((i * 7) % 11) - 3.0f;
  // Channel means by hand: channel c holds x[n, c, 0..3] for n = 0..2.
  double sum[2] = {0, 0}, sq[2] = {0, 0};
  for (int n = 0; n < 3; ++n) {
    for (int c = 0; c < 2; ++c) {
      for (int s = 0; s < 4; ++s) sum[c] += xv[std::size_t(n * 8 + c * 4 + s)];
    }
  }
  const double mean[2] = {sum[0] / 12, sum[1] / 12};
  for (int n = 0; n < 3; ++n) {
    for (int c = 0; c < 2; ++c) {
      for (int s = 0; s < 4; ++s) sq[c] += std::pow(xv[std::size_t(n * 8 + c * 4 + s)] - mean[c], 2);
    }
  }
  const float d = 0.5f;
  const std::vector<float> cv = {float(mean[0]) + d, float(mean[1]) - d, 123.0f, -7.0f};  // row 1 is ignored
  exec.set_input(xi, xv.data(), 96);
  exec.set_input(ci, cv.data(), 16);
  ASSERT_TRUE(exec.run_step());
  std::vector<float> p(4), a(4);
  exec.read_tensor(plain, p.data());
  exec.read_tensor(about, a.data());
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(p[std::size_t(c)], mean[c], 1e-6);
    EXPECT_NEAR(p[std::size_t(2 + c)], sq[c] / 12, 1e-5);
    EXPECT_EQ(a[std::size_t(c)], cv[std::size_t(c)]) << "row 0 is the given mean";
    EXPECT_NEAR(a[std::size_t(2 + c)], sq[c] / 12 + double(d) * d, 1e-5);
  }
}

TEST(SynchronisedBatchNorm, EveryBatchNormOfARankGraphReadsStatisticsOverAllRanks) {
  models::ModelOptions model;
  model.name = "cnn";
  planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(model), 8);
  step.parallel.world = 2;
  step.parallel.rank = 1;
  auto planned = planner::plan_step(step, planner::PlanRequest{});
  ASSERT_TRUE(planned) << planned.error().message;
  const graph::Graph& g = planned.value().graph;
  int norms = 0, backwards = 0;
  for (const graph::Op& op : g.ops()) {
    if (op.kind == OpKind::batch_norm || op.kind == OpKind::batch_norm_dgamma || op.kind == OpKind::batch_norm_backward ||
        op.kind == OpKind::running_stats_update) {
      const TensorId stats = op.inputs[op.kind == OpKind::batch_norm ? 1 : op.kind == OpKind::running_stats_update ? 0 : 2];
      const graph::Op& producer = g.ops()[std::size_t(g.producer(stats))];
      EXPECT_EQ(producer.kind, OpKind::all_reduce) << op.name << " reads " << g.tensor(stats).name;
      norms += op.kind == OpKind::batch_norm;
    }
    if (op.kind == OpKind::batch_norm_backward) {
      ++backwards;
      for (int slot : {4, 5}) {
        const graph::Op& sum = g.ops()[std::size_t(g.producer(op.inputs[std::size_t(slot)]))];
        ASSERT_EQ(sum.kind, OpKind::slice) << op.name;
        EXPECT_EQ(g.ops()[std::size_t(g.producer(sum.inputs[0]))].kind, OpKind::all_reduce) << op.name;
      }
    }
  }
  EXPECT_GT(norms, 2);
  EXPECT_GT(backwards, 2);
  EXPECT_TRUE(planner::validate_plan(planned.value().plan));
}

planner::StepDescription mlp_step(int world, int zero, Bytes bucket_bytes = Bytes{25} << 20) {
  models::ModelOptions model;
  model.name = "mlp";
  model.mlp.hidden = {64, 32};
  planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(model), 16);
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

// fit's named list of activations adds up to its activations line: gathered parameters and
// buckets are on the communication line only.
TEST_P(ZeroStage, TheNamedActivationsAddUpToTheActivationLine) {
  auto planned = planner::plan_step(mlp_step(4, GetParam()), planner::PlanRequest{});
  ASSERT_TRUE(planned) << planned.error().message;
  const planner::MemoryPlan& plan = planned.value().plan;
  const planner::FitBreakdown b = planner::fit_breakdown(plan, planner::PlanRequest{}.device);
  Bytes named = 0;
  for (const planner::NamedBytes& n : planner::activations_at_peak_by_name(plan)) {
    named += n.bytes;
    EXPECT_EQ(n.name.find("gathered"), std::string::npos) << n.name;
    EXPECT_EQ(n.name.find("bucket"), std::string::npos) << n.name;
  }
  EXPECT_EQ(named, b.activations_at_peak);
}

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
