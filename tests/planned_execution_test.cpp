// Planned execution: bitwise equal to naive after 100 steps for every reference model, zero
// device allocations per step (and a counter that does count in naive mode), refusal of a wrong
// plan, and poison mode catching a wrong plan when the validator is bypassed.
#include <gtest/gtest.h>

#include "memplan/common/rng.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "test_util.h"

namespace memplan {
namespace {

using runtime::ExecutionMode;

struct ModelCase {
  const char* name;
  models::ModelOptions model;
  std::int64_t batch;
  graph::OptimizerKind optimizer;
};

models::ModelOptions mlp(models::MlpConfig config) {
  models::ModelOptions options;
  options.name = "mlp";
  options.mlp = std::move(config);
  return options;
}

// A ResNet on 8x8 images: stem, two stages (the second strided, with a 1x1 shortcut).
models::ModelOptions small_cnn(std::int64_t blocks) {
  models::ModelOptions options;
  options.name = "cnn";
  options.cnn.image = 8;
  options.cnn.widths = {4, 8};
  options.cnn.blocks_per_stage = blocks;
  options.cnn.classes = 5;
  return options;
}

// A two-layer GPT with dropout on, so the masks' determinism is part of the comparison.
models::ModelOptions small_gpt() {
  models::ModelOptions options;
  options.name = "gpt";
  options.gpt.vocab = 11;
  options.gpt.context = 8;
  options.gpt.layers = 2;
  options.gpt.heads = 2;
  options.gpt.width = 8;
  options.gpt.dropout = 0.1f;
  return options;
}

// Every trainable reference model (and each optimizer) at a small size; synthetic data so the
// test needs no dataset.
const ModelCase kModels[] = {
    {"mlp_adamw", mlp({64, {32, 32}, 10}), 16, graph::OptimizerKind::adamw},
    {"mlp_momentum", mlp({64, {48}, 10}), 8, graph::OptimizerKind::momentum},
    {"mlp_sgd_deep", mlp({32, {16, 16, 16}, 5}), 4, graph::OptimizerKind::sgd},
    {"cnn_adamw", small_cnn(1), 4, graph::OptimizerKind::adamw},
    {"cnn_momentum_two_blocks", small_cnn(2), 3, graph::OptimizerKind::momentum},
    {"gpt_adamw_dropout", small_gpt(), 2, graph::OptimizerKind::adamw},
};

graph::Graph training_graph(const ModelCase& m) {
  graph::Graph g = models::build_forward(m.model, m.batch).value();
  graph::OptimizerConfig opt;
  opt.kind = m.optimizer;
  opt.lr = 1e-2f;
  opt.weight_decay = 0.01f;
  graph::make_training_step(g, opt);
  return g;
}

struct Outcome {
  std::string sha;
  std::vector<float> state;  // every non-parameter persistent tensor (optimizer state, BN running statistics)
  float loss = 0;
  std::int64_t allocations_during_steps = 0;
};

Outcome train(const ModelCase&, const graph::Graph& g, runtime::Executor& exec, int steps) {
  exec.initialize_persistent(123);
  Rng rng(5);
  const graph::TensorDesc& x_desc = g.tensor(g.find("x"));
  std::vector<float> x(static_cast<std::size_t>(x_desc.shape.numel()));
  std::vector<std::int32_t> ids(x.size());  // token ids when x is i32 (gpt)
  std::vector<std::int32_t> y(static_cast<std::size_t>(g.tensor(g.find("labels")).shape.numel()));
  const auto classes = static_cast<std::uint64_t>(g.tensor(g.output).shape[1]);
  Outcome out;
  for (int s = 0; s < steps; ++s) {
    for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
    for (auto& v : ids) v = static_cast<std::int32_t>(rng.below(classes));
    for (auto& v : y) v = static_cast<std::int32_t>(rng.below(classes));
    const bool token_ids = x_desc.dtype == graph::DType::i32;
    exec.set_input(g.find("x"), token_ids ? static_cast<const void*>(ids.data()) : x.data(), x_desc.size_bytes());
    exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
    EXPECT_TRUE(exec.run_step().ok());
    out.loss = exec.read_scalar(g.loss);
  }
  out.sha = exec.params_sha256();
  for (TensorId t : g.tensors_with_role(graph::Role::optimizer_state)) {
    const auto values = testing::read_floats(exec, t);
    out.state.insert(out.state.end(), values.begin(), values.end());
  }
  out.allocations_during_steps = exec.device_allocations_during_steps();
  return out;
}

class PlannedVsNaive : public ::testing::TestWithParam<ModelCase> {};

TEST_P(PlannedVsNaive, IdenticalParametersAfter100StepsAndNoAllocationsWhenPlanned) {
  const ModelCase& m = GetParam();
  const graph::Graph g = training_graph(m);
  testing::CpuRun naive(g, ExecutionMode::naive);
  testing::CpuRun planned(g, ExecutionMode::planned);
  const Outcome a = train(m, g, naive.executor, 100);
  const Outcome b = train(m, g, planned.executor, 100);
  EXPECT_EQ(a.sha, b.sha);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_GT(a.allocations_during_steps, 0) << "the naive run must allocate per step, or the counter is fake";
  EXPECT_EQ(b.allocations_during_steps, 0);
  // The planned run's device memory is exactly its arena, allocated once.
  EXPECT_EQ(planned.device.stats().allocations, 1);
  EXPECT_EQ(planned.executor.device_bytes_at_setup(), align_up(planned.executor.plan()->arena_bytes, runtime::kDeviceAlignment));
}

TEST_P(PlannedVsNaive, BothSchedulesAndInPlaceOffGiveTheSameBits) {
  const ModelCase& m = GetParam();
  const graph::Graph g = training_graph(m);
  std::string reference;
  for (auto schedule : {planner::ScheduleKind::program, planner::ScheduleKind::memory_aware}) {
    for (bool in_place : {false, true}) {
      planner::PlanRequest request;
      request.schedule = schedule;
      request.choose_best_schedule = false;
      request.in_place = in_place;
      runtime::CpuDevice device;
      runtime::Executor exec(g, testing::plan_for(g, device, request), device);
      ASSERT_TRUE(exec.setup().ok());
      const std::string sha = train(m, g, exec, 20).sha;
      if (reference.empty()) reference = sha;
      EXPECT_EQ(sha, reference) << planner::schedule_name(schedule) << " in_place=" << in_place;
    }
  }
}

TEST_P(PlannedVsNaive, DebugChecksPassOnAValidPlan) {
  const ModelCase& m = GetParam();
  const graph::Graph g = training_graph(m);
  runtime::ExecutorOptions options;
  options.debug.poison = true;
  options.debug.guards = true;
  runtime::CpuDevice device;
  planner::PlanRequest request;
  request.guard_bytes = runtime::kGuardBytes;
  runtime::Executor exec(g, testing::plan_for(g, device, request), device, options);
  ASSERT_TRUE(exec.setup().ok());
  testing::CpuRun naive(g, ExecutionMode::naive);
  EXPECT_EQ(train(m, g, exec, 5).sha, train(m, g, naive.executor, 5).sha);
}

INSTANTIATE_TEST_SUITE_P(ReferenceModels, PlannedVsNaive, ::testing::ValuesIn(kModels),
                         [](const auto& p) { return std::string(p.param.name); });

// A plan with two live tensors at the same offset: the first layer's output and the second
// layer's matmul output (both live across the ReLU between them).
planner::MemoryPlan overlapping_plan(const graph::Graph& g) {
  planner::PlanOptions options;
  options.in_place = false;
  planner::MemoryPlan plan = planner::plan_memory(g, options).value();
  const int a = plan.buffer_of_tensor[static_cast<std::size_t>(g.find("fc1"))];
  const int b = plan.buffer_of_tensor[static_cast<std::size_t>(g.find("fc1.relu"))];
  plan.buffers[static_cast<std::size_t>(b)].offset = plan.buffers[static_cast<std::size_t>(a)].offset;
  return plan;
}

TEST(WrongPlan, ValidatorRefusesOverlappingLiveTensorsBeforeExecution) {
  const graph::Graph g = training_graph(kModels[0]);
  runtime::CpuDevice device;
  runtime::Executor exec(g, overlapping_plan(g), device);
  const Status s = exec.setup();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("'fc1'"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("'fc1.relu'"), std::string::npos) << s.error().message;
  EXPECT_EQ(device.stats().allocations, 0) << "nothing may be allocated for a refused plan";
}

TEST(WrongPlan, PoisonModeFailsLoudlyWhenTheValidatorIsBypassed) {
  const graph::Graph g = training_graph(kModels[0]);
  runtime::DebugOptions debug;
  debug.poison = true;
  runtime::CpuDevice device;
  runtime::Executor exec(g, overlapping_plan(g), device, runtime::ExecutorOptions{.debug = debug, .trust_plan = true});
  ASSERT_TRUE(exec.setup().ok());
  exec.initialize_persistent(1);
  std::vector<float> x(16 * 64, 0.5f);
  std::vector<std::int32_t> y(16, 3);
  exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
  const Status s = exec.run_step();
  ASSERT_FALSE(s.ok()) << "poison mode must stop a run whose plan overlaps live tensors";
  EXPECT_NE(s.error().message.find("poison check"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace memplan
