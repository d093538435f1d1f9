// The step profile: FLOP counts for shapes worked by hand, every op timed once per step, the
// ops' times adding up to the step's, profiling leaving the results unchanged, and the CLI's
// --profile output (train and plan).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/graph/builder.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/timed_step.h"
#include "test_util.h"

namespace memplan {
namespace {

TEST(StepProfile, MatmulFlopsAreTwoMnk) {
  graph::Graph g;
  graph::Builder b(g);
  // A^T stored [K=7, M=5], B [K=7, N=3]: C [5, 3] = 2 * 5 * 3 * 7 FLOPs.
  const TensorId a = b.input("a", graph::Shape{7, 5});
  const TensorId w = b.input("w", graph::Shape{7, 3});
  b.matmul(a, w, /*trans_a=*/true, /*trans_b=*/false, "c");
  ASSERT_EQ(g.num_ops(), 1);
  EXPECT_DOUBLE_EQ(graph::op_flops(g, g.ops()[0]), 2.0 * 5 * 3 * 7);
}

TEST(StepProfile, ConvolutionFlopsCountEveryMultiplyAdd) {
  // Every output element of a convolution takes Cin * K * K multiply-adds.
  models::ModelOptions cnn;
  cnn.name = "cnn";
  cnn.cnn.image = 8;
  cnn.cnn.widths = {4, 8};
  cnn.cnn.blocks_per_stage = 1;
  cnn.cnn.classes = 5;
  graph::Graph g = models::build_forward(cnn, 2).value();
  bool found = false;
  for (const graph::Op& op : g.ops()) {
    if (op.kind != graph::OpKind::conv2d) continue;
    const graph::Shape& y = g.tensor(op.outputs[0]).shape;   // [N, Cout, OH, OW]
    const graph::Shape& w = g.tensor(op.inputs[1]).shape;    // [Cout, Cin, K, K]
    EXPECT_DOUBLE_EQ(graph::op_flops(g, op), 2.0 * double(y.numel()) * double(w[1] * w[2] * w[3])) << op.name;
    found = true;
  }
  EXPECT_TRUE(found);
}

planner::PlannedStep profiled_mlp_step(std::int64_t batch) {
  models::ModelOptions mlp;
  mlp.name = "mlp";
  mlp.mlp = {784, {256, 256}, 10};
  runtime::CpuDevice device;
  return runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(mlp), batch, graph::OptimizerConfig{}), device).value();
}

TEST(StepProfile, EveryOpTimedAndTheOpsAddUpToTheStep) {
  const planner::PlannedStep step = profiled_mlp_step(64);
  runtime::CpuDevice device;
  // Twenty steps: one preemption while the inputs are copied in cannot tip the ratio below.
  auto timed = runtime::time_steps(step, device, /*seed=*/3, /*warmup=*/1, /*steps=*/20);
  ASSERT_TRUE(timed.ok()) << timed.error().message;
  const runtime::StepProfile& p = timed.value();
  EXPECT_EQ(p.steps, 20);
  ASSERT_EQ(p.ops.size(), step.plan.schedule.size());
  std::vector<int> seen(static_cast<std::size_t>(step.graph.num_ops()), 0);
  double sum = 0.0, share = 0.0;
  for (const runtime::OpTime& t : p.ops) {
    ++seen[static_cast<std::size_t>(t.op_index)];
    EXPECT_GE(t.ms, 0.0) << t.name;
    sum += t.ms;
    share += t.share;
  }
  for (int count : seen) EXPECT_EQ(count, 1);
  EXPECT_NEAR(sum, p.ops_ms, 1e-9);
  EXPECT_NEAR(p.ops_ms + p.other_ms, p.step_ms, 1e-9);
  // The ops are inside the step; only copying the inputs in lies outside them.
  EXPECT_LE(p.ops_ms, p.step_ms);
  EXPECT_GE(p.ops_ms, 0.9 * p.step_ms) << "ops " << p.ops_ms << " ms of a " << p.step_ms << " ms step";
  EXPECT_NEAR(share, p.ops_ms / p.step_ms, 1e-9);
  // Per kind: the same time, split by kind, slowest first.
  double kinds = 0.0;
  for (std::size_t i = 0; i < p.kinds.size(); ++i) {
    kinds += p.kinds[i].ms;
    if (i > 0) {
      EXPECT_GE(p.kinds[i - 1].ms, p.kinds[i].ms);
    }
  }
  EXPECT_NEAR(kinds, p.ops_ms, 1e-9);
  ASSERT_EQ(p.slowest.size(), 5u);
  for (const runtime::OpTime& t : p.ops) {
    EXPECT_LE(t.ms, p.ops[static_cast<std::size_t>(p.slowest[0])].ms);
  }
  // The products' FLOPs: forward 64x784x256 + 64x256x256 + 64x256x10 GEMMs, and twice that
  // backward but for the first layer's input gradient (x needs none).
  const double fwd = 2.0 * 64 * (784 * 256 + 256 * 256 + 256 * 10);
  const double first_dx = 2.0 * 64 * 784 * 256;
  double matmul_flops = -1.0;
  for (const runtime::KindTime& k : p.kinds) {
    if (k.kind == graph::OpKind::matmul) matmul_flops = k.flops;
  }
  EXPECT_DOUBLE_EQ(matmul_flops, 3 * fwd - first_dx);
  // The step's FLOPs are every op's by its row's formula (the one checkpointing reads), so the
  // elementwise ops and the update count too.
  double rows = 0.0;
  for (const graph::Op& op : step.graph.ops()) rows += graph::op_flops(step.graph, op);
  EXPECT_DOUBLE_EQ(p.flops, rows);
  EXPECT_GT(p.flops, 3 * fwd - first_dx);
}

// A small CNN's fused pairs: each im2col timed within the product reading its columns (the
// convolution in the forward, the weight gradient in the backward), each col2im within the
// input gradient's product, and the kind lists both partners of im2col.
TEST(StepProfile, FusedOpsAreTimedWithinTheirPartnersAndTheKindNamesEach) {
  models::ModelOptions cnn;
  cnn.name = "cnn";
  cnn.cnn.image = 12;
  cnn.cnn.widths = {4, 8};
  cnn.cnn.classes = 5;
  runtime::CpuDevice device;
  const planner::PlannedStep step =
      runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(cnn), 4, graph::OptimizerConfig{}), device).value();
  auto timed = runtime::time_steps(step, device, /*seed=*/3, /*warmup=*/1, /*steps=*/2);
  ASSERT_TRUE(timed.ok()) << timed.error().message;
  const runtime::StepProfile& p = timed.value();
  bool saw_im2col = false;
  for (const runtime::KindTime& k : p.kinds) {
    if (k.kind == graph::OpKind::im2col) {
      saw_im2col = true;
      EXPECT_GT(k.timed_elsewhere, 0);
      EXPECT_EQ(k.timed_in, (std::vector<graph::OpKind>{graph::OpKind::conv2d, graph::OpKind::conv2d_backward_weight}));
    }
    if (k.kind == graph::OpKind::col2im) {
      EXPECT_EQ(k.timed_elsewhere, k.ops);
      EXPECT_EQ(k.timed_in, std::vector<graph::OpKind>{graph::OpKind::conv2d_backward_cols});
    }
  }
  EXPECT_TRUE(saw_im2col);
}

TEST(StepProfile, OffByDefaultAndProfilingChangesNoResult) {
  const planner::PlannedStep step = profiled_mlp_step(16);
  auto run = [&](bool profile) {
    runtime::CpuDevice device;
    runtime::Executor exec(step, device);
    EXPECT_TRUE(exec.setup().ok());
    exec.initialize_persistent(1);
    const graph::Graph& g = step.graph;
    std::vector<float> x(16 * 784, 0.5f);
    std::vector<std::int32_t> y(16, 3);
    exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
    exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
    if (profile) exec.set_profiling(true);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(exec.run_step().ok());
    EXPECT_EQ(exec.profile().steps, profile ? 3 : 0);
    return exec.params_sha256();
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(StepProfile, TimedStepFeedsIdsInRangeForTheGpt) {
  models::ModelOptions gpt;
  gpt.name = "gpt";
  gpt.gpt.vocab = 11;
  gpt.gpt.context = 8;
  gpt.gpt.layers = 1;
  gpt.gpt.heads = 2;
  gpt.gpt.width = 8;
  runtime::CpuDevice device;
  const planner::PlannedStep step =
      runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(gpt), 2, graph::OptimizerConfig{}), device).value();
  auto timed = runtime::time_steps(step, device);
  ASSERT_TRUE(timed.ok()) << timed.error().message;
  EXPECT_EQ(timed.value().ops.size(), step.plan.schedule.size());
}

TEST(StepProfile, PlanProfileJsonListsEveryOp) {
  const auto r = testing::run_cli("plan --model mlp --batch 32 --profile --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.contains("profile"));
  const auto& p = j["profile"];
  EXPECT_EQ(p["steps"].get<int>(), 1);
  EXPECT_EQ(p["ops"].size(), j["ops"].get<std::size_t>());
  EXPECT_EQ(p["slowest"].size(), 5u);
  EXPECT_GT(p["gflop_per_step"].get<double>(), 0.0);
  const auto text = testing::run_cli("plan --model mlp --batch 32 --profile");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("slowest ops"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("| matmul |"), std::string::npos) << text.output;
}

TEST(StepProfile, ProfileOnAMissingDeviceIsAUsageError) {
  const auto r = testing::run_cli("plan --model mlp --device cuda --profile");
  if (runtime::cuda_device_present()) GTEST_SKIP() << "a GPU is present: the profile runs there";
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--profile"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace memplan
