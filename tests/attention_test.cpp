// Fused attention against the unfused composition (batched matmul, scale, softmax, dropout,
// batched matmul, with K/V heads repeated): outputs and gradients of q, k and v agree within float
// tolerance, causal or not, grouped-query or not, with and without dropout, at sizes that are not
// multiples of the kernel's tile. Also what the plan keeps: the log-sum-exp, never [T, T] scores.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "memplan/graph/autograd.h"
#include "memplan/graph/builder.h"
#include "memplan/models/attention.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"
#include "memplan/planner/liveness.h"
#include "cli_util.h"
#include "golden_util.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::Builder;
using models::AttentionKind;

struct Case {
  const char* name;
  std::int64_t batch, heads, kv_heads, t, head_dim;
  bool causal;
  float dropout;
};

struct AttentionRun {
  std::vector<float> y, dq, dk, dv;
};

// y = attention(q, k, v); loss = sum(y * R); returns y and the gradients of q, k, v.
AttentionRun run(const Case& c, AttentionKind kind) {
  graph::Graph g;
  Builder b(g);
  const graph::InitSpec none{};
  const TensorId q = b.parameter("q", {c.batch, c.heads, c.t, c.head_dim}, none);
  const TensorId k = b.parameter("k", {c.batch, c.kv_heads, c.t, c.head_dim}, none);
  const TensorId v = b.parameter("v", {c.batch, c.kv_heads, c.t, c.head_dim}, none);
  const TensorId y = models::attention_block(b, kind, q, k, v, c.causal, c.dropout, "attn");
  const TensorId r = b.input("R", g.tensor(y).shape);
  g.loss = b.sum(b.mul(y, r, "yR"), "loss");
  graph::append_backward(g, g.loss);
  g.retained = {y, g.tensor(q).grad, g.tensor(k).grad, g.tensor(v).grad};

  testing::CpuRun run(g);
  std::uint64_t seed = 5;
  for (TensorId p : {q, k, v}) {
    const auto values = testing::random_values(static_cast<std::size_t>(g.tensor(p).shape.numel()), seed++);
    run.executor.write_tensor(p, values.data());
  }
  const auto weights = testing::random_values(static_cast<std::size_t>(g.tensor(r).shape.numel()), 99);
  run.executor.set_input(r, weights.data(), g.tensor(r).size_bytes());
  EXPECT_TRUE(run.executor.run_step().ok());
  return {testing::read_floats(run.executor, y), testing::read_floats(run.executor, g.tensor(q).grad),
          testing::read_floats(run.executor, g.tensor(k).grad), testing::read_floats(run.executor, g.tensor(v).grad)};
}

void expect_close(const std::vector<float>& fused, const std::vector<float>& reference, const std::string& what) {
  ASSERT_EQ(fused.size(), reference.size()) << what;
  double max_ref = 0.0;
  for (float x : reference) max_ref = std::max(max_ref, double(std::abs(x)));
  ASSERT_GT(max_ref, 0.0) << what << " is all zeros: the comparison would prove nothing";
  int bad = 0;
  for (std::size_t i = 0; i < fused.size(); ++i) {
    const double tol = 2e-5 * max_ref + 1e-4 * std::abs(double(reference[i]));
    if (std::abs(double(fused[i]) - double(reference[i])) > tol && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: fused " << fused[i] << " vs unfused " << reference[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << fused.size() << " elements differ";
}

// A sliding window (Mistral's, Gemma's local layers) against PyTorch
// (tests/golden/make_window_golden.py: transformers' eager attention with its sliding-window causal
// mask): the output, the loss and the gradients of q, k and v, fused and materialized, grouped
// queries, and 300 positions under a window of 60 (whole key tiles outside later windows).
TEST(SlidingWindowAttention, FusedAndMaterializedMatchPyTorch) {
  const nlohmann::json golden = testing::load_golden("window_golden.json");
  ASSERT_EQ(golden["cases"].size(), 2u);
  for (const auto& c : golden["cases"]) {
    for (AttentionKind kind : {AttentionKind::fused, AttentionKind::materialized}) {
      SCOPED_TRACE(c["name"].get<std::string>() + (kind == AttentionKind::fused ? ", fused" : ", materialized"));
      const std::int64_t B = c["batch"], H = c["heads"], KH = c["kv_heads"], T = c["seq"], D = c["head_dim"];
      graph::Graph g;
      Builder b(g);
      const TensorId q = b.parameter("q", {B, H, T, D}, {});
      const TensorId k = b.parameter("k", {B, KH, T, D}, {});
      const TensorId v = b.parameter("v", {B, KH, T, D}, {});
      const TensorId y = models::attention_block(b, kind, q, k, v, /*causal=*/true, 0.0f, "attn", 0.0f, 0.0f, kNoTensor,
                                                 c["window"].get<std::int64_t>());
      const TensorId r = b.input("R", g.tensor(y).shape);
      g.loss = b.sum(b.mul(y, r, "yR"), "loss");
      graph::append_backward(g, g.loss);
      g.retained = {y, g.tensor(q).grad, g.tensor(k).grad, g.tensor(v).grad};
      testing::CpuRun run(g);
      for (const auto& [t, name] : {std::pair{q, "q"}, std::pair{k, "k"}, std::pair{v, "v"}}) {
        run.executor.write_tensor(t, c[name].get<std::vector<float>>().data());
      }
      const std::vector<float> R = c["R"].get<std::vector<float>>();
      run.executor.set_input(r, R.data(), g.tensor(r).size_bytes());
      ASSERT_TRUE(run.executor.run_step().ok());
      testing::expect_close(testing::read_floats(run.executor, y), c["y"].get<std::vector<float>>(), "y", 1e-5f, 1e-4f);
      EXPECT_NEAR(testing::read_floats(run.executor, g.loss)[0], c["loss"].get<double>(), 1e-4 * (1.0 + std::abs(c["loss"].get<double>())));
      for (const auto& [t, name] : {std::pair{q, "q"}, std::pair{k, "k"}, std::pair{v, "v"}}) {
        testing::expect_close(testing::read_floats(run.executor, g.tensor(t).grad), c["grads"][name].get<std::vector<float>>(),
                              std::string("d loss / d ") + name, 1e-5f, 1e-4f);
      }
    }
  }
}

// A window needs a causal mask and a count of keys: anything else is refused by name.
TEST(SlidingWindowAttention, NeedsACausalMask) {
  graph::Graph g;
  Builder b(g);
  const TensorId x = b.parameter("x", {1, 2, 8, 8}, {});
  EXPECT_THROW(b.softmax(x, /*causal=*/false, "probs", 4), graph::GraphError);
  EXPECT_THROW(b.softmax(x, /*causal=*/true, "probs", -1), graph::GraphError);
  EXPECT_NO_THROW(b.softmax(x, /*causal=*/true, "probs.ok", 4));
}

class FusedAttention : public ::testing::TestWithParam<Case> {};

std::string case_name(const ::testing::TestParamInfo<Case>& param) { return param.param.name; }

TEST_P(FusedAttention, EqualsTheUnfusedCompositionForwardAndBackward) {
  const Case& c = GetParam();
  const AttentionRun fused = run(c, AttentionKind::fused);
  const AttentionRun reference = run(c, AttentionKind::materialized);
  expect_close(fused.y, reference.y, "y");
  expect_close(fused.dq, reference.dq, "dq");
  expect_close(fused.dk, reference.dk, "dk");
  expect_close(fused.dv, reference.dv, "dv");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedAttention,
    ::testing::Values(Case{"causal_one_tile", 2, 2, 2, 7, 4, true, 0.0f},
                      Case{"causal_odd_tiles", 1, 2, 2, 131, 8, true, 0.0f},
                      Case{"bidirectional_odd_tiles", 2, 3, 3, 70, 5, false, 0.0f},
                      Case{"gqa_causal", 1, 4, 2, 67, 8, true, 0.0f},
                      Case{"multi_query_bidirectional", 2, 4, 1, 65, 6, false, 0.0f},
                      Case{"dropout_causal", 2, 2, 2, 77, 8, true, 0.3f},
                      Case{"dropout_gqa_bidirectional", 1, 6, 3, 129, 4, false, 0.2f}),
    case_name);

// Dropout really drops: the fused output with p > 0 differs from the one without.
TEST(FusedAttentionDropout, ChangesTheOutput) {
  const Case c{"d", 1, 2, 2, 20, 4, true, 0.5f};
  Case no_drop = c;
  no_drop.dropout = 0.0f;
  const AttentionRun with = run(c, AttentionKind::fused), without = run(no_drop, AttentionKind::fused);
  double diff = 0.0;
  for (std::size_t i = 0; i < with.y.size(); ++i) diff += std::abs(with.y[i] - without.y[i]);
  EXPECT_GT(diff, 1.0);
}

bool has_square_attention_tensor(const graph::Graph& g, std::int64_t t) {
  for (const graph::TensorDesc& d : g.tensors()) {
    const auto& s = d.shape;
    if (s.rank() == 4 && s[2] == t && s[3] == t) return true;
  }
  return false;
}

// The fused GPT's step keeps one f32 log-sum-exp per (sequence, head, position) from the forward
// into the backward, and no tensor anywhere has the [T, T] shape of scores; the materialized one
// does.
TEST(FusedAttentionPlan, TheLogSumExpIsASavedActivationAndNoScoresExist) {
  models::GptConfig config;
  config.context = 48;
  config.width = 64;
  config.heads = 4;
  graph::Graph g = models::build_gpt(config, 3);
  graph::append_backward(g, g.loss);
  EXPECT_FALSE(has_square_attention_tensor(g, 48));
  const TensorId lse = g.find("h.0.attn.fused.lse");
  ASSERT_NE(lse, kNoTensor);
  EXPECT_EQ(g.tensor(lse).shape, (graph::Shape{3, 4, 48}));
  EXPECT_EQ(g.tensor(lse).dtype, graph::DType::f32);
  EXPECT_EQ(g.tensor(lse).role, graph::Role::activation);
  bool read_in_backward = false;
  for (const graph::Op& op : g.ops()) {
    if (op.kind != graph::OpKind::attention_backward) continue;
    for (TensorId in : op.inputs) read_in_backward = read_in_backward || in == lse;
  }
  EXPECT_TRUE(read_in_backward) << "the backward must read the saved log-sum-exp";
  // Planned: its buffer lives from its forward op into the backward.
  const planner::Lifetimes lifetimes = planner::compute_lifetimes(g, planner::default_schedule(g));
  const int buffer = lifetimes.buffer_of_tensor[static_cast<std::size_t>(lse)];
  ASSERT_GE(buffer, 0);
  const auto& interval = lifetimes.buffers[static_cast<std::size_t>(buffer)];
  EXPECT_EQ(g.ops()[static_cast<std::size_t>(interval.first_op)].phase, graph::Phase::forward);
  EXPECT_EQ(g.ops()[static_cast<std::size_t>(interval.last_op)].phase, graph::Phase::backward);

  config.attention = AttentionKind::materialized;
  graph::Graph m = models::build_gpt(config, 3);
  EXPECT_TRUE(has_square_attention_tensor(m, 48));
  EXPECT_EQ(m.find("h.0.attn.fused.lse"), kNoTensor);
}

// Grouped-query attention fused reads K/V at their own head count: nothing is repeated.
TEST(FusedAttentionPlan, GroupedQueryAttentionRepeatsNoHeads) {
  models::LlamaConfig c;
  c.vocab = 50;
  c.context = 16;
  c.layers = 1;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 48;
  const graph::Graph fused = models::build_llama(c, 2);
  c.attention = AttentionKind::materialized;
  const graph::Graph materialized = models::build_llama(c, 2);
  auto repeats = [](const graph::Graph& g) {
    int n = 0;
    for (const graph::Op& op : g.ops()) n += op.kind == graph::OpKind::repeat_heads;
    return n;
  };
  EXPECT_EQ(repeats(fused), 0);
  EXPECT_EQ(repeats(materialized), 2);
}

TEST(FusedAttentionOp, RejectsHeadsThatDoNotGroup) {
  graph::Graph g;
  Builder b(g);
  const TensorId q = b.input("q", {1, 3, 4, 2});
  const TensorId k = b.input("k", {1, 2, 4, 2});
  try {
    b.attention(q, k, k, true, 1.0f, 0.0f, "attn");
    FAIL() << "3 query heads over 2 K/V heads must be refused";
  } catch (const graph::GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple"), std::string::npos) << e.what();
  }
}

// --attention on the CLI: fit names the log-sum-exp among the activations at the peak and plans
// far fewer activation bytes fused than materialized; the flag is refused where it cannot apply.
TEST(AttentionFlag, FitPlansLessFusedAndNamesTheLogSumExp) {
  const std::string args = "fit --model llama2-7b --dtype bf16 --seq 2048 --batch 1 --device-memory 80GiB --json";
  const auto fused = testing::run_cli(args, /*merge_stderr=*/false);
  const auto materialized = testing::run_cli(args + " --attention materialized", /*merge_stderr=*/false);
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  ASSERT_EQ(materialized.exit_code, 0) << materialized.output;
  const auto f = nlohmann::json::parse(fused.output), m = nlohmann::json::parse(materialized.output);
  const auto fused_act = f["breakdown"]["activations"].get<std::int64_t>();
  const auto mat_act = m["breakdown"]["activations"].get<std::int64_t>();
  // At 2048 tokens the [B, 32, T, T] probabilities are 8 GiB of the materialized 17.5 GiB.
  EXPECT_LT(3 * fused_act, 2 * mat_act) << "fused " << fused_act << " B, materialized " << mat_act << " B";
  bool lse = false, probs = false;
  for (const auto& g : f["activations_at_peak_by_tensor"]) lse = lse || g["tensor"] == "layers.*.self_attn.fused.lse";
  for (const auto& g : m["activations_at_peak_by_tensor"]) probs = probs || g["tensor"] == "layers.*.self_attn.probs";
  EXPECT_TRUE(lse) << f["activations_at_peak_by_tensor"].dump();
  EXPECT_TRUE(probs) << m["activations_at_peak_by_tensor"].dump();
}

TEST(AttentionFlag, RefusedWhereItCannotApply) {
  const auto mlp = testing::run_cli("plan --model mlp --attention fused");
  EXPECT_EQ(mlp.exit_code, 2) << mlp.output;
  EXPECT_NE(mlp.output.find("--attention applies to transformers"), std::string::npos) << mlp.output;
  const auto bogus = testing::run_cli("plan --model gpt --attention flash");
  EXPECT_EQ(bogus.exit_code, 2) << bogus.output;
  EXPECT_NE(bogus.output.find("materialized"), std::string::npos) << bogus.output;
  const auto ok = testing::run_cli("plan --model gpt --batch 2 --attention materialized --time-limit 0");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

}  // namespace
}  // namespace memplan
