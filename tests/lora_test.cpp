// graph/lora.h: frozen parameters train nothing and keep nothing for their own gradient; LoRA
// adapters go where the targets say, as PEFT names and shapes them, with every other parameter
// frozen; bad targets, ranks and patterns are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "memplan/graph/builder.h"
#include "memplan/graph/lora.h"
#include "memplan/graph/autograd.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"
#include "memplan/models/model_source.h"
#include "memplan/planner/plan_step.h"
#include "golden_util.h"
#include "test_util.h"

namespace memplan::graph {
namespace {

// x [4, 6] -> fc1 (W1 [5, 6]) -> relu -> fc2 (W2 [3, 5]) -> mean.
Graph two_linears() {
  Graph g;
  Builder b(g);
  const TensorId x = b.input("x", {4, 6});
  const TensorId w1 = b.parameter("fc1.weight", {5, 6}, {InitSpec::Kind::normal, 0.1f});
  const TensorId w2 = b.parameter("fc2.weight", {3, 5}, {InitSpec::Kind::normal, 0.1f});
  const TensorId h = b.relu(b.matmul(x, w1, false, true, "fc1"), "act");
  g.output = b.matmul(h, w2, false, true, "fc2");
  g.loss = b.mean(g.output, "loss");
  return g;
}

bool some_op_reads(const Graph& g, TensorId t, Phase phase) {
  return std::any_of(g.ops().begin(), g.ops().end(), [&](const Op& op) {
    return op.phase == phase && std::find(op.inputs.begin(), op.inputs.end(), t) != op.inputs.end();
  });
}

TEST(Lora, AFrozenLinearHasNoGradientNoStateAndKeepsNoInputForItsWeight) {
  Graph g = two_linears();
  LoraConfig freeze;
  freeze.rank = 0;
  freeze.freeze = {"fc1.*"};
  const LoraReport report = apply_lora(g, freeze);
  EXPECT_EQ(report.frozen_params, 30);
  EXPECT_EQ(report.trainable_params, 15);
  const TensorId x = g.find("x"), w1 = g.find("fc1.weight"), w2 = g.find("fc2.weight");
  make_training_step(g, OptimizerConfig{});
  EXPECT_EQ(g.tensor(w1).grad, kNoTensor);
  EXPECT_NE(g.tensor(w2).grad, kNoTensor);
  // AdamW's two states for fc2 only.
  int states = 0;
  for (const TensorDesc& t : g.tensors()) states += t.role == Role::optimizer_state;
  EXPECT_EQ(states, 2);
  // fc1's input is read by nothing in the backward pass: only fc1's weight gradient would.
  EXPECT_FALSE(some_op_reads(g, x, Phase::backward));
  // Unfrozen, the same step reads x for fc1's weight gradient: the check above can fail.
  Graph unfrozen = two_linears();
  make_training_step(unfrozen, OptimizerConfig{});
  EXPECT_TRUE(some_op_reads(unfrozen, unfrozen.find("x"), Phase::backward));
}

models::GptConfig small_gpt() {
  models::GptConfig c;
  c.vocab = 32;
  c.context = 16;
  return c;  // 2 layers of width 128
}

TEST(Lora, AdaptersGoOnTheTargetsAsPeftNamesThemAndEverythingElseFreezes) {
  Graph g = models::build_gpt(small_gpt(), 2);
  LoraConfig config;
  config.rank = 8;
  config.targets = {"q", "v"};
  const LoraReport report = apply_lora(g, config);
  EXPECT_EQ(report.adapted_layers, 4);
  EXPECT_EQ(report.adapter_params, 4 * 8 * (128 + 128));  // r (in + out) per target
  EXPECT_EQ(report.trainable_params, report.adapter_params);
  EXPECT_EQ(report.adapter_bytes, report.adapter_params * 4);  // f32
  EXPECT_EQ(report.modules, (std::vector<std::string>{"h.0.attn.q", "h.0.attn.v", "h.1.attn.q", "h.1.attn.v"}));
  for (TensorId p : g.parameters()) {
    const TensorDesc& d = g.tensor(p);
    const bool adapter = d.name.find(".lora_") != std::string::npos;
    EXPECT_EQ(d.frozen, !adapter) << d.name;
  }
  const TensorDesc& a = g.tensor(g.find("h.0.attn.q.lora_A.weight"));
  const TensorDesc& b = g.tensor(g.find("h.0.attn.q.lora_B.weight"));
  EXPECT_EQ(a.shape, Shape({8, 128}));
  EXPECT_EQ(b.shape, Shape({128, 8}));
  EXPECT_EQ(b.init.kind, InitSpec::Kind::zeros) << "training starts from the base model's outputs";
  make_training_step(g, OptimizerConfig{});
  int states = 0;
  for (const TensorDesc& t : g.tensors()) states += t.role == Role::optimizer_state;
  EXPECT_EQ(states, 2 * 8) << "AdamW's m and v for each of the 8 adapter matrices, nothing for the base";
}

TEST(Lora, AllLinearLeavesOutTheOutputHead) {
  Graph g = models::build_gpt(small_gpt(), 2);
  LoraConfig config;
  config.rank = 4;
  config.targets = {"all-linear"};
  const LoraReport report = apply_lora(g, config);
  // q, k, v, attn.proj, mlp.fc, mlp.proj in each of 2 layers; the tied head (wte) is not one.
  EXPECT_EQ(report.adapted_layers, 12);
  EXPECT_EQ(std::count_if(report.modules.begin(), report.modules.end(), [](const std::string& m) { return m.find("wte") != std::string::npos; }), 0);
}

TEST(Lora, Sixteen_bitStepsCastToF32AdaptersAndBack) {
  planner::StepDescription step = planner::StepDescription::of_source(
      models::registry_source([] {
        models::ModelOptions m;
        m.name = "gpt";
        m.gpt = small_gpt();
        return m;
      }()),
      2);
  step.dtype = DType::bf16;
  step.lora.rank = 4;
  auto planned = planner::plan_step(step, planner::PlanRequest{});
  ASSERT_TRUE(planned.ok()) << planned.error().message;
  const Graph& g = planned.value().graph;
  EXPECT_EQ(g.tensor(g.find("h.0.attn.q.lora_A.weight")).dtype, DType::f32);
  EXPECT_EQ(g.tensor(g.find("h.0.attn.q.weight")).dtype, DType::bf16);
  int casts = 0, masters = 0;
  for (const Op& op : g.ops()) casts += op.kind == OpKind::cast;
  for (const TensorDesc& t : g.tensors()) masters += t.master_of != kNoTensor;
  EXPECT_GE(casts, 4 * 2) << "each adapter's input up and its output down";
  EXPECT_EQ(masters, 0) << "f32 adapters need no master copy, and the frozen base has none";
  EXPECT_EQ(planned.value().rewrites.lora.adapted_layers, 4);
}

// One LoRA linear against PyTorch computing it as PEFT does (tests/golden/make_lora_linear.py):
// the graph apply_lora makes, run on the CPU, gives y = x W^T + (alpha / r) x A^T B^T and the
// adapters' gradients; the frozen W gets none.
TEST(Lora, ALoraLinearMatchesPyTorch) {
  const nlohmann::json golden = testing::load_golden("lora_linear_golden.json");
  const std::int64_t n = golden["n"], in = golden["in"], out = golden["out"];
  Graph g;
  Builder b(g);
  const TensorId x = b.input("x", {n, in});
  const TensorId w = b.parameter("fc.weight", {out, in}, {});
  const TensorId weights = b.input("weights", {n, out});
  // The weighted product is the output, so fc is not the output head (which targets leave out).
  g.output = b.mul(b.matmul(x, w, false, true, "fc"), weights, "yR");
  g.loss = b.sum(g.output, "loss");
  LoraConfig config;
  config.rank = golden["rank"];
  config.alpha = golden["alpha"];
  config.targets = {"fc"};
  apply_lora(g, config);
  append_backward(g, g.loss);
  const TensorId a = g.find("fc.lora_A.weight"), bw = g.find("fc.lora_B.weight");
  ASSERT_NE(a, kNoTensor);
  EXPECT_EQ(g.tensor(w).grad, kNoTensor);
  const TensorId y = g.find("fc.lora.sum");
  ASSERT_NE(y, kNoTensor);
  g.retained = {y, g.tensor(a).grad, g.tensor(bw).grad};
  testing::CpuRun run(g);
  auto floats = [](const nlohmann::json& v) { return v.get<std::vector<float>>(); };
  run.executor.initialize_persistent(0);
  run.executor.write_tensor(w, floats(golden["w"]).data());
  run.executor.write_tensor(a, floats(golden["a"]).data());
  run.executor.write_tensor(bw, floats(golden["b"]).data());
  run.executor.set_input_values(x, floats(golden["x"]));
  run.executor.set_input_values(weights, floats(golden["weights"]));
  ASSERT_TRUE(run.executor.run_step().ok());
  auto read = [&](TensorId t) {
    std::vector<float> v(static_cast<std::size_t>(g.tensor(t).shape.numel()));
    run.executor.read_tensor(t, v.data());
    return v;
  };
  testing::expect_close(read(y), floats(golden["y"]), "y", 1e-5f, 1e-5f);
  testing::expect_close(read(g.tensor(a).grad), floats(golden["grad_a"]), "grad A", 1e-5f, 1e-5f);
  testing::expect_close(read(g.tensor(bw).grad), floats(golden["grad_b"]), "grad B", 1e-5f, 1e-5f);
}

// Every view op's output views what the op reads: where an adapted product feeds a reshape (the
// bias-free q, k and v of the rotary decoders, split into heads), the reshape must view the
// adapted sum, or the model reads the base product and the adapters do nothing.
TEST(Lora, ViewsOfAnAdaptedProductViewTheAdaptedSum) {
  models::LlamaConfig c;
  c.vocab = 32;
  c.context = 8;
  c.layers = 2;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 64;
  Graph g = models::build_llama(c, 2);
  LoraConfig config;
  config.rank = 4;
  config.targets = {"all-linear"};
  const LoraReport report = apply_lora(g, config);
  EXPECT_EQ(report.adapted_layers, 2 * 7);
  int views = 0;
  for (const Op& op : g.ops()) {
    if (!op_info(op.kind).output_is_view || op.outputs.empty()) continue;
    ++views;
    EXPECT_EQ(g.tensor(op.outputs[0]).view_of, op.inputs[0]) << op.name;
  }
  EXPECT_GT(views, 0);
  // The q product's readers read the adapted sum only.
  const TensorId q = g.find("layers.0.self_attn.q_proj.lora.sum");
  ASSERT_NE(q, kNoTensor);
  bool read = false;
  for (const Op& op : g.ops()) read = read || std::find(op.inputs.begin(), op.inputs.end(), q) != op.inputs.end();
  EXPECT_TRUE(read);
}

// all-linear leaves out a layer narrower than the rank (a shared-expert gate [1, C]), and says so;
// naming that layer is refused.
TEST(Lora, AllLinearLeavesOutLayersNarrowerThanTheRank) {
  Graph g;
  Builder b(g);
  const TensorId x = b.input("x", {4, 16});
  const TensorId gate = b.matmul(x, b.parameter("gate.weight", {1, 16}, {InitSpec::Kind::normal, 0.1f}), false, true, "gate");
  const TensorId fc = b.matmul(x, b.parameter("fc.weight", {16, 16}, {InitSpec::Kind::normal, 0.1f}), false, true, "fc");
  const TensorId scaled = b.mul(fc, b.reshape(b.matmul(gate, b.parameter("ones.weight", {16, 1}, {}), false, true, "spread"), {4, 16}, "g"), "y");
  g.output = b.mul(scaled, b.input("w", {4, 16}), "out");
  g.loss = b.sum(g.output, "loss");
  LoraConfig config;
  config.rank = 8;
  config.targets = {"all-linear"};
  Graph all = g;
  const LoraReport report = apply_lora(all, config);
  EXPECT_EQ(report.skipped_narrow, (std::vector<std::string>{"gate", "ones"}));
  EXPECT_EQ(report.modules, (std::vector<std::string>{"fc"}));
  config.targets = {"gate"};
  Graph named = g;
  EXPECT_THROW(apply_lora(named, config), GraphError);
}

TEST(Lora, BadTargetsRanksAndPatternsAreRefusedByName) {
  auto error_of = [](LoraConfig config) {
    Graph g = models::build_gpt(small_gpt(), 2);
    try {
      apply_lora(g, config);
    } catch (const GraphError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  LoraConfig unknown;
  unknown.rank = 8;
  unknown.targets = {"q", "gate"};
  EXPECT_EQ(error_of(unknown), "LoRA target 'gate' names no linear layer of this model; its linear layers are fc, k, proj, q, v (or all-linear)");
  LoraConfig wide;
  wide.rank = 200;
  EXPECT_EQ(error_of(wide), "LoRA rank 200 exceeds the width of 'h.0.attn.q' [128, 128]: give a rank of at most 128");
  LoraConfig pattern;
  pattern.freeze = {"nothing.*"};
  EXPECT_NE(error_of(pattern).find("--freeze pattern 'nothing.*' matches no parameter"), std::string::npos);
  LoraConfig everything;
  everything.freeze = {"*"};
  EXPECT_NE(error_of(everything).find("every parameter is frozen"), std::string::npos);
}

}  // namespace
}  // namespace memplan::graph
