// The fused projection and cross-entropy (graph/fusions.h): the rewrite finds a language
// model's head and loss and leaves other graphs alone, saying why; the fused step trains like the
// stored-logits one within float tolerance, gives the same bits for every chunk size and in
// planned and naive execution, never holds the logits, and the planner's auto mode takes it
// where it lowers the arena. The op's kernels against references and finite differences are
// the op harness's (tests/op_cases.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "memplan/graph/fusions.h"
#include "memplan/graph/training_step.h"
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"
#include "memplan/models/mlp.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/plan_step.h"
#include "test_util.h"

namespace memplan {
namespace {

// 4 sequences of 96 tokens: 384 rows, three blocks of kLossRowBlock.
models::GptConfig small_gpt() {
  models::GptConfig c;
  c.vocab = 50;
  c.context = 96;
  c.layers = 1;
  c.heads = 2;
  c.width = 16;
  return c;
}
constexpr std::int64_t kBatch = 4;

bool has_op(const graph::Graph& g, graph::OpKind kind) {
  for (const graph::Op& op : g.ops()) {
    if (op.kind == kind) return true;
  }
  return false;
}

// Plain SGD: an update proportional to the gradient shows any error in its scale (Adam's would not).
graph::Graph training_step(graph::Graph forward) {
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::sgd;
  opt.lr = 0.5f;
  graph::make_training_step(forward, opt);
  return forward;
}

// A fused (chunk_rows >= 0) or stored-logits (chunk_rows < 0) GPT training step.
graph::Graph gpt_step(std::int64_t chunk_rows) {
  graph::Graph g = models::build_gpt(small_gpt(), kBatch);
  if (chunk_rows >= 0) {
    const graph::LossFusion f = graph::fuse_linear_cross_entropy(g, chunk_rows);
    EXPECT_TRUE(f.fused) << f.why_not;
  }
  return training_step(std::move(g));
}

struct Trained {
  std::vector<float> losses;
  std::string sha;
  std::vector<std::vector<float>> params;  // after the last step, in parameters() order
};

Trained train(const graph::Graph& g, runtime::ExecutionMode mode = runtime::ExecutionMode::planned, int steps = 3) {
  testing::CpuRun run(g, mode);
  run.executor.initialize_persistent(5);
  const models::GptConfig c = small_gpt();
  Rng rng(11);
  std::vector<std::int32_t> x(static_cast<std::size_t>(kBatch * c.context)), y(x.size());
  Trained t;
  for (int s = 0; s < steps; ++s) {
    for (auto& v : x) v = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(c.vocab)));
    for (auto& v : y) v = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(c.vocab)));
    run.executor.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
    run.executor.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
    EXPECT_TRUE(run.executor.run_step().ok());
    t.losses.push_back(run.executor.read_scalar(g.loss));
  }
  t.sha = run.executor.params_sha256();
  for (TensorId p : g.parameters()) t.params.push_back(testing::read_floats(run.executor, p));
  return t;
}

TEST(FusedLoss, RewritesTheHeadAndLossOfAGpt) {
  graph::Graph g = models::build_gpt(small_gpt(), kBatch);
  const int ops = g.num_ops();
  const graph::LossFusion f = graph::fuse_linear_cross_entropy(g);
  ASSERT_TRUE(f.fused) << f.why_not;
  EXPECT_EQ(f.logits, "logits");
  EXPECT_EQ(f.rows, kBatch * small_gpt().context);
  EXPECT_EQ(f.vocab, small_gpt().vocab);
  EXPECT_EQ(f.chunk_rows % graph::kLossRowBlock, 0);
  EXPECT_EQ(g.num_ops(), ops);  // the product and the loss replaced by the lse and the fused loss
  EXPECT_EQ(g.find("logits"), kNoTensor);
  EXPECT_EQ(g.output, kNoTensor);
  EXPECT_TRUE(has_op(g, graph::OpKind::linear_cross_entropy_lse));
  EXPECT_FALSE(has_op(g, graph::OpKind::softmax_cross_entropy));
  EXPECT_EQ(g.tensor(g.loss).name, "loss");
  const graph::Graph step = training_step(std::move(g));
  EXPECT_TRUE(has_op(step, graph::OpKind::linear_cross_entropy_backward));
  EXPECT_FALSE(has_op(step, graph::OpKind::softmax_cross_entropy_backward));
  // No tensor of the step has the logits' shape.
  for (const graph::TensorDesc& t : step.tensors()) {
    EXPECT_NE(t.shape, (graph::Shape{f.rows, f.vocab})) << t.name;
  }
}

TEST(FusedLoss, LeavesOtherLossesAloneAndSaysWhy) {
  // The MLP's logits carry a bias: not a plain product.
  models::MlpConfig mlp;
  graph::Graph g = models::build_mlp(mlp, 8);
  const int ops = g.num_ops();
  const graph::LossFusion f = graph::fuse_linear_cross_entropy(g);
  EXPECT_FALSE(f.fused);
  EXPECT_NE(f.why_not.find("not a product"), std::string::npos) << f.why_not;
  EXPECT_EQ(g.num_ops(), ops);
  // Logits a caller keeps are not fused away.
  graph::Graph kept = models::build_gpt(small_gpt(), kBatch);
  kept.retained.push_back(kept.find("logits"));
  const graph::LossFusion k = graph::fuse_linear_cross_entropy(kept);
  EXPECT_FALSE(k.fused);
  EXPECT_NE(k.why_not.find("kept"), std::string::npos) << k.why_not;
  // A vocabulary-parallel loss is named as such.
  models::GptConfig split = small_gpt();
  split.tensor_parallel = graph::TensorParallel{2, 0, false};
  graph::Graph tp = models::build_gpt(split, kBatch);
  const graph::LossFusion t = graph::fuse_linear_cross_entropy(tp);
  EXPECT_FALSE(t.fused);
  EXPECT_NE(t.why_not.find("vocabulary-parallel"), std::string::npos) << t.why_not;
  // A chunk that is not whole blocks is refused by the op's row.
  graph::Graph odd = models::build_gpt(small_gpt(), kBatch);
  EXPECT_THROW(graph::fuse_linear_cross_entropy(odd, graph::kLossRowBlock + 1), graph::GraphError);
}

TEST(FusedLoss, TrainsLikeTheStoredLogitsWithinFloatTolerance) {
  const Trained stored = train(gpt_step(-1));
  const Trained fused = train(gpt_step(0));
  ASSERT_EQ(stored.losses.size(), fused.losses.size());
  for (std::size_t s = 0; s < stored.losses.size(); ++s) EXPECT_NEAR(fused.losses[s], stored.losses[s], 1e-5f) << "step " << s;
  ASSERT_EQ(stored.params.size(), fused.params.size());
  for (std::size_t p = 0; p < stored.params.size(); ++p) {
    float worst = 0.0f;
    for (std::size_t i = 0; i < stored.params[p].size(); ++i) worst = std::max(worst, std::fabs(stored.params[p][i] - fused.params[p][i]));
    EXPECT_LT(worst, 1e-4f) << "parameter " << p;
  }
  EXPECT_NE(stored.sha, fused.sha);  // other arithmetic: not the same bits
}

TEST(FusedLoss, EveryChunkSizeGivesTheSameBitsPlannedAndNaive) {
  const Trained whole = train(gpt_step(0));
  const Trained one_block = train(gpt_step(graph::kLossRowBlock));
  const Trained two_blocks = train(gpt_step(2 * graph::kLossRowBlock));
  EXPECT_EQ(one_block.sha, whole.sha);
  EXPECT_EQ(two_blocks.sha, whole.sha);
  EXPECT_EQ(train(gpt_step(graph::kLossRowBlock), runtime::ExecutionMode::naive).sha, one_block.sha);
}

planner::StepDescription gpt_description(graph::FusedLoss mode, models::GptConfig c, std::int64_t batch,
                                         std::int64_t chunk_rows = 0) {
  models::ModelOptions m;
  m.name = "gpt";
  m.gpt = c;
  planner::StepDescription d = planner::StepDescription::of_source(models::registry_source(m), batch);
  d.fused_loss = mode;
  d.loss_chunk_rows = chunk_rows;
  return d;
}

TEST(FusedLoss, AutoFusesWhereTheArenaIsLowerAndReportsBothBounds) {
  // A vocabulary of 4096 at 384 rows: the logits (6 MiB) and their gradient dwarf the layer;
  // 128 rows at a time keep a third of them as scratch.
  models::GptConfig wide = small_gpt();
  wide.vocab = 4096;
  auto fused = planner::plan_step(gpt_description(graph::FusedLoss::auto_, wide, kBatch, graph::kLossRowBlock), {});
  ASSERT_TRUE(fused.ok()) << fused.error().message;
  const planner::LossFusionReport& r = fused.value().rewrites.loss_fusion;
  EXPECT_TRUE(r.fusion.fused);
  EXPECT_TRUE(r.used);
  EXPECT_LT(r.fused_lower_bound, r.unfused_lower_bound);
  auto stored = planner::plan_step(gpt_description(graph::FusedLoss::off, wide, kBatch), {});
  ASSERT_TRUE(stored.ok());
  EXPECT_FALSE(stored.value().rewrites.loss_fusion.used);
  EXPECT_EQ(stored.value().plan.lower_bound_bytes, r.unfused_lower_bound);
  EXPECT_EQ(fused.value().plan.lower_bound_bytes, r.fused_lower_bound);
  EXPECT_LT(fused.value().plan.arena_bytes, stored.value().plan.arena_bytes);
  // The logits' bytes, twice, are what the fused step saves, less its chunk of scratch.
  const Bytes logits = kBatch * wide.context * wide.vocab * 4;
  EXPECT_GE(r.unfused_lower_bound - r.fused_lower_bound, logits);

  // One sequence of 96 tokens, a vocabulary of 50 and an MLP 2048 wide: the step peaks in the
  // MLP's backward pass, where the logits are long gone and the fused loss's scratch (the whole
  // logits, at 96 rows) would only add; auto keeps them stored, on fuses all the same.
  models::GptConfig narrow = small_gpt();
  narrow.mlp = 2048;
  auto small = planner::plan_step(gpt_description(graph::FusedLoss::auto_, narrow, 1), {});
  ASSERT_TRUE(small.ok());
  const planner::LossFusionReport& s = small.value().rewrites.loss_fusion;
  EXPECT_TRUE(s.fusion.fused);
  EXPECT_GE(s.fused_lower_bound, s.unfused_lower_bound);
  EXPECT_FALSE(s.used);
  auto forced = planner::plan_step(gpt_description(graph::FusedLoss::on, narrow, 1), {});
  ASSERT_TRUE(forced.ok());
  EXPECT_TRUE(forced.value().rewrites.loss_fusion.used);
  EXPECT_TRUE(has_op(forced.value().graph, graph::OpKind::linear_cross_entropy));
}

// --- SwiGLU and layout copies: the same bits, less stored ---

models::LlamaConfig tiny_llama() {
  models::LlamaConfig c;
  c.vocab = 50;
  c.context = 16;
  c.layers = 2;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 48;
  return c;
}

// A tiny Llama's training step at `dtype`, its forward rewritten by `rewrite` (before autograd)
// or, with `copies`, its step by recompute_layout_copies.
graph::Graph llama_step(graph::DType dtype, bool swiglu, bool copies) {
  graph::Graph g = models::build_llama(tiny_llama(), 2);
  if (dtype != graph::DType::f32) g = graph::with_working_dtype(g, dtype);
  if (swiglu) {
    const graph::SwigluFusion f = graph::fuse_swiglu(g);
    EXPECT_EQ(f.pairs, tiny_llama().layers);
  }
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::sgd;
  opt.lr = 0.5f;
  graph::make_training_step(g, opt);
  if (copies) {
    const graph::CopyRecompute r = graph::recompute_layout_copies(g);
    EXPECT_GT(r.copies, 0);
  }
  return g;
}

std::string train_tokens(const graph::Graph& g, runtime::ExecutionMode mode = runtime::ExecutionMode::planned) {
  testing::CpuRun run(g, mode);
  run.executor.initialize_persistent(7);
  Rng rng(3);
  const graph::TensorDesc& x = g.tensor(g.find("x"));
  std::vector<std::int32_t> ids(static_cast<std::size_t>(x.shape.numel()));
  for (int s = 0; s < 3; ++s) {
    for (auto& v : ids) v = static_cast<std::int32_t>(rng.below(50));
    run.executor.set_input(g.find("x"), ids.data(), static_cast<Bytes>(ids.size() * 4));
    run.executor.set_input(g.find("labels"), ids.data(), static_cast<Bytes>(ids.size() * 4));
    EXPECT_TRUE(run.executor.run_step().ok());
  }
  return run.executor.params_sha256();
}

Bytes lower_bound(const graph::Graph& g) {
  auto planned = planner::plan_step(planner::StepDescription::of_graph(g), {});
  EXPECT_TRUE(planned.ok());
  return planned.value().plan.lower_bound_bytes;
}

TEST(StepRewrites, SwigluGivesTheBitsOfSiluThenProductAtEveryDtype) {
  for (const graph::DType dtype : {graph::DType::f32, graph::DType::bf16, graph::DType::f16}) {
    const graph::Graph plain = llama_step(dtype, false, false);
    const graph::Graph fused = llama_step(dtype, true, false);
    EXPECT_TRUE(has_op(fused, graph::OpKind::swiglu));
    for (const graph::Op& op : fused.ops()) {
      EXPECT_FALSE(op.kind == graph::OpKind::silu && op.phase == graph::Phase::forward) << op.name;  // recomputed, not kept
    }
    EXPECT_EQ(train_tokens(fused), train_tokens(plain)) << graph::dtype_name(dtype);
    EXPECT_LT(lower_bound(fused), lower_bound(plain)) << graph::dtype_name(dtype);
  }
  // A SiLU something else reads too (before the product) stays as it is.
  graph::Graph g;
  graph::Builder b(g);
  const TensorId gate = b.parameter("gate", {4, 6}, {}, graph::DType::f32);
  const TensorId up = b.parameter("up", {4, 6}, {}, graph::DType::f32);
  const TensorId act = b.silu(gate, "act");
  const TensorId twice = b.add(act, act, "twice");
  g.loss = b.sum(b.add(b.mul(act, up, "glu"), twice, "both"), "loss");
  EXPECT_EQ(graph::fuse_swiglu(g).pairs, 0);
}

TEST(StepRewrites, LayoutCopiesMadeAgainInTheBackwardGiveTheSameBits) {
  const graph::Graph plain = llama_step(graph::DType::f32, true, false);
  const graph::Graph again = llama_step(graph::DType::f32, true, true);
  const std::string sha = train_tokens(plain);
  EXPECT_EQ(train_tokens(again), sha);
  EXPECT_EQ(train_tokens(again, runtime::ExecutionMode::naive), sha);
  EXPECT_LT(lower_bound(again), lower_bound(plain));
  // Every copy runs in the backward pass, after the forward's last op, and no backward op reads
  // the forward's tensor it copies.
  int last_forward = -1;
  for (int i = 0; i < again.num_ops(); ++i) {
    if (again.ops()[static_cast<std::size_t>(i)].phase == graph::Phase::forward) last_forward = i;
  }
  int copies = 0;
  const std::string suffix = ".again";
  for (int i = 0; i < again.num_ops(); ++i) {
    const graph::Op& op = again.ops()[static_cast<std::size_t>(i)];
    if (op.outputs.empty()) continue;
    const std::string& name = again.tensor(op.outputs[0]).name;
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    ++copies;
    EXPECT_GT(i, last_forward) << name;
    EXPECT_EQ(op.phase, graph::Phase::backward) << name;
    const TensorId original = again.storage_root(again.find(name.substr(0, name.size() - suffix.size())));
    ASSERT_NE(original, kNoTensor) << name;
    for (const graph::Op& reader : again.ops()) {
      if (reader.phase != graph::Phase::backward) continue;
      for (TensorId t : reader.inputs) EXPECT_NE(again.storage_root(t), original) << reader.name << " reads " << name;
    }
  }
  EXPECT_GE(copies, tiny_llama().layers);
}

TEST(StepRewrites, PlanStepAppliesThemAndCanLeaveTheStepAsWritten) {
  auto description = [](bool rewrite) {
    models::ModelOptions m;
    m.name = "gpt";
    m.gpt = small_gpt();
    planner::StepDescription d = planner::StepDescription::of_source(models::registry_source(m), kBatch);
    d.fused_loss = graph::FusedLoss::off;
    d.rewrite_step = rewrite;
    return d;
  };
  auto rewritten = planner::plan_step(description(true), {});
  auto written = planner::plan_step(description(false), {});
  ASSERT_TRUE(rewritten.ok() && written.ok());
  EXPECT_EQ(rewritten.value().rewrites.copies.copies, small_gpt().layers);  // attention's merged output, per layer
  EXPECT_EQ(written.value().rewrites.copies.copies, 0);
  EXPECT_LT(rewritten.value().plan.arena_bytes, written.value().plan.arena_bytes);
  EXPECT_EQ(train(rewritten.value().graph).sha, train(written.value().graph).sha);
}

// What a user sees: --fused-loss on plan, compare's row for PyTorch's step, each rewrite in the
// JSON, and a bad value refused naming the values that work.
TEST(StepRewritesCli, FlagsAndReports) {
  using testing::run_cli;
  const std::string model = "--model gpt --seq 128 --batch 8 --vocab 8192";  // 32 MiB of logits
  const auto fused = run_cli("plan " + model + " --json", false);
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  const auto p = nlohmann::json::parse(fused.output);
  EXPECT_TRUE(p["fused_loss"]["used"].get<bool>());
  EXPECT_EQ(p["fused_loss"]["mode"], "auto");
  EXPECT_EQ(p["fused_loss"]["logits"], "logits");
  EXPECT_GT(p["fused_loss"]["unfused_lower_bound_bytes"].get<Bytes>(), p["fused_loss"]["fused_lower_bound_bytes"].get<Bytes>());
  EXPECT_EQ(p["copies_recomputed"]["copies"].get<int>(), 2);  // the default GPT's two layers
  const auto off = nlohmann::json::parse(run_cli("plan " + model + " --fused-loss off --json", false).output);
  EXPECT_FALSE(off["fused_loss"]["used"].get<bool>());
  EXPECT_LT(p["arena_bytes"].get<Bytes>(), off["arena_bytes"].get<Bytes>());
  const auto text = run_cli("plan " + model);
  EXPECT_NE(text.output.find("fused loss: used (--fused-loss auto): the logits 'logits' [1024, 8192] are never stored"), std::string::npos)
      << text.output;
  // compare: the caching allocator on PyTorch's step holds more than on the rewritten one.
  if (!testing::kSanitized) {
    const auto c = nlohmann::json::parse(run_cli("compare " + model + " --steps 2 --json", false).output);
    ASSERT_TRUE(c.contains("caching_pytorch_step"));
    EXPECT_GT(c["caching_pytorch_step"]["reserved_peak_bytes"].get<Bytes>(), c["caching"]["reserved_peak_bytes"].get<Bytes>());
    EXPECT_LT(c["planned_arena_bytes"].get<Bytes>(), c["caching_pytorch_step"]["reserved_peak_bytes"].get<Bytes>());
  }
  const auto bad = run_cli("plan " + model + " --fused-loss sometimes");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("--fused-loss"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("auto"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace memplan
