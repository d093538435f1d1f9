// The rotary decoder's settings (models/llama.h), family by family, as a whole model: the
// backward graph's gradients of every parameter match central finite differences of the loss, so
// the settings compose (norm kinds and places, plain and gated MLPs, biases, parallel residuals,
// partial rotary, query/key norms, mixtures of experts with their router's loss) and not only the
// ops one by one (tests/op_harness_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "memplan/graph/autograd.h"
#include "memplan/models/llama.h"
#include "tests/golden_util.h"
#include "tests/test_util.h"

namespace memplan {
namespace {

using Config = models::LlamaConfig;

struct Family {
  std::string name;
  Config config;
};

std::vector<Family> families() {
  Config base;
  base.vocab = 7;
  base.context = 4;
  base.layers = 1;
  base.width = 8;
  base.heads = 2;
  base.kv_heads = 2;
  base.ffn = 12;
  std::vector<Family> out;
  out.push_back({"llama", base});
  Config qwen3 = base;  // a head size apart from the width, per-head query/key norms, q/k/v biases
  qwen3.head_dim = 6;
  qwen3.kv_heads = 1;
  qwen3.qk_norm = Config::QkNorm::per_head;
  qwen3.qkv_bias = true;
  out.push_back({"qwen3", qwen3});
  Config neox = base;  // LayerNorm, plain GELU MLP with biases, parallel residual, half of each head rotating
  neox.norm = Config::Norm::layer;
  neox.gated_mlp = false;
  neox.mlp_bias = neox.qkv_bias = neox.o_bias = true;
  neox.gate = Config::Gate::gelu;
  neox.parallel_residual = true;
  neox.rotary_dims = 2;
  out.push_back({"gpt_neox", neox});
  Config falcon = neox;  // one norm for both branches, one K/V head
  falcon.shared_norm = true;
  falcon.kv_heads = 1;
  falcon.mlp_bias = falcon.qkv_bias = falcon.o_bias = false;
  falcon.rotary_dims = 0;
  out.push_back({"falcon", falcon});
  Config olmo2 = base;  // norms after the sublayers only, whole-projection query/key norms
  olmo2.pre_norm = false;
  olmo2.post_norm = true;
  olmo2.qk_norm = Config::QkNorm::whole;
  out.push_back({"olmo2", olmo2});
  Config gemma = base;  // norms before and after, GELU gate, scaled tied embeddings
  gemma.post_norm = true;
  gemma.gate = Config::Gate::gelu;
  gemma.scale_embeddings = true;
  gemma.tied_head = true;
  out.push_back({"pre and post norms", gemma});
  Config gemma2 = gemma;  // Gemma-2: scores scaled by 3^-1/2 (not the head size's), soft-capped
  gemma2.query_scale = 3.0f;  // scores and logits (caps small enough to bend them)
  gemma2.attn_softcap = 0.8f;
  gemma2.final_softcap = 1.5f;
  out.push_back({"gemma2", gemma2});
  Config gemma2_materialized = gemma2;  // the same through [B, H, T, T] scores
  gemma2_materialized.attention = models::AttentionKind::materialized;
  out.push_back({"gemma2 materialized", gemma2_materialized});
  // Mixtures of experts: 2 sequences of 4 tokens, so 8 tokens route per layer.
  Config mixtral = base;  // 4 experts, top 2 renormalised, a balanced capacity of 4 slots (some
  mixtral.moe.experts = 4;  // tokens dropped), the load-balancing loss over two layers
  mixtral.moe.top_k = 2;
  mixtral.moe.aux_loss_coef = 0.5;
  mixtral.layers = 2;
  out.push_back({"mixtral", mixtral});
  Config qwen2_moe = base;  // a dense first layer, experts of their own width, top 2 not
  qwen2_moe.layers = 2;     // renormalised, a sigmoid-gated shared expert, roomy capacity
  qwen2_moe.qkv_bias = true;
  qwen2_moe.moe.experts = 3;
  qwen2_moe.moe.top_k = 2;
  qwen2_moe.moe.expert_ffn = 6;
  qwen2_moe.moe.normalize_top_k = false;
  qwen2_moe.moe.shared_ffn = 10;
  qwen2_moe.moe.dense_layers = {0};
  qwen2_moe.moe.capacity_factor = 1.5;
  qwen2_moe.moe.aux_loss_coef = 0.25;
  out.push_back({"qwen2_moe", qwen2_moe});
  Config dropless = base;  // every expert a slot for every token; plain GELU experts; Switch's top 1
  dropless.moe.experts = 4;  // weighted by its probability (renormalised, one gate would be 1)
  dropless.moe.top_k = 1;
  dropless.moe.normalize_top_k = false;
  dropless.moe.capacity_factor = 0.0;
  dropless.gated_mlp = false;
  dropless.gate = Config::Gate::gelu;
  out.push_back({"dropless plain experts", dropless});
  Config granite = base;  // Granite's multipliers on the embeddings, sublayer outputs, scores, logits
  granite.embedding_multiplier = 1.5f;
  granite.residual_multiplier = 0.6f;
  granite.attention_multiplier = 0.3f;
  granite.logit_scale = 0.7f;
  out.push_back({"granite", granite});
  Config gemma3 = gemma2;  // Gemma 3: per-head q/k norms, a global layer between local ones with
  gemma3.layers = 3;       // their own rotary base, no caps
  gemma3.attn_softcap = gemma3.final_softcap = 0.0f;
  gemma3.qk_norm = Config::QkNorm::per_head;
  gemma3.sliding_window = 4;
  gemma3.windowed_layers = {true, false, true};
  gemma3.rope_base = 1e6f;
  gemma3.local_rope_base = 10.0f;
  out.push_back({"gemma3", gemma3});
  Config mistral = base;  // a sliding window of 2 over the 4 positions: scores outside it masked
  mistral.sliding_window = 2;
  out.push_back({"sliding window", mistral});
  Config mistral_materialized = mistral;  // the same through [B, H, T, T] scores
  mistral_materialized.attention = models::AttentionKind::materialized;
  out.push_back({"sliding window materialized", mistral_materialized});
  Config starcoder2 = neox;  // StarCoder2's plain MLP under its own names, sequential residual
  starcoder2.parallel_residual = false;
  starcoder2.rotary_dims = 0;
  starcoder2.kv_heads = 1;
  starcoder2.mlp_up_name = "c_fc";
  starcoder2.mlp_down_name = "c_proj";
  out.push_back({"starcoder2", starcoder2});
  Config deepseek = base;  // latent attention (a query bottleneck, a latent of 6, rotary keys of 2
  deepseek.layers = 2;     // shared by the heads, values of 3) over a dense layer, then DeepSeek's
  deepseek.mla = {5, 6, 4, 2, 3};  // experts: sigmoid scores, groups, a shared MLP, scaled gates
  deepseek.head_dim = 6;
  deepseek.moe.experts = 4;
  deepseek.moe.top_k = 2;
  deepseek.moe.expert_ffn = 6;
  deepseek.moe.shared_ffn = 6;
  deepseek.moe.shared_gate = false;
  deepseek.moe.dense_layers = {0};
  deepseek.moe.sigmoid_scores = true;
  deepseek.moe.choice_bias = true;
  deepseek.moe.expert_groups = 2;
  deepseek.moe.top_groups = 1;
  deepseek.moe.group_top2 = true;
  deepseek.moe.routed_scale = 2.5f;
  deepseek.moe.capacity_factor = 0.0;
  out.push_back({"deepseek", deepseek});
  Config deepseek_materialized = deepseek;  // values of their own width through [B, H, T, T] scores
  deepseek_materialized.attention = models::AttentionKind::materialized;
  deepseek_materialized.mla.q_lora_rank = 0;  // and one q_proj
  out.push_back({"deepseek materialized", deepseek_materialized});
  Config opt = neox;  // learned positions from row 2 of the table, no rotary (GELU kept: a
  opt.parallel_residual = false;  // difference quotient across ReLU's kink measures the kink)
  opt.rotary_dims = 0;
  opt.positions = Config::Positions::learned;
  opt.position_offset = 2;
  opt.position_table = base.context + 3;
  out.push_back({"opt", opt});
  return out;
}

std::vector<float> read(const runtime::Executor& e, TensorId id) {
  std::vector<float> v(static_cast<std::size_t>(e.graph().tensor(id).shape.numel()));
  e.read_values(id, v.data());
  return v;
}

TEST(DecoderFamilies, EveryParametersGradientMatchesCentralFiniteDifferences) {
  for (const Family& family : families()) {
    SCOPED_TRACE(family.name);
    graph::Graph g = models::build_llama(family.config, 2);
    graph::append_backward(g, g.loss);
    for (TensorId p : g.parameters()) {  // readable after the step
      if (g.tensor(p).grad != kNoTensor) g.retained.push_back(g.tensor(p).grad);
    }
    // A mixture's routing (which experts each token goes to, which it is dropped from) is a step
    // function of the weights: a difference quotient across a change of routing measures the step,
    // not the gradient. Such elements are counted and skipped; the rest must match.
    std::vector<TensorId> gates;
    for (const graph::Op& op : g.ops()) {
      if (op.kind == graph::OpKind::moe_top_k && op.phase == graph::Phase::forward) gates.push_back(op.outputs[0]);
    }
    for (TensorId t : gates) g.retained.push_back(t);
    testing::CpuRun run(g);
    run.executor.initialize_persistent(1);
    // Every parameter random (norm weights and biases too, which start at one and zero), so each
    // setting's path carries a gradient of its own.
    std::uint64_t seed = 5;
    for (TensorId p : g.parameters()) {
      auto values = testing::random_values(static_cast<std::size_t>(g.tensor(p).shape.numel()), seed++, 0.5f);
      run.executor.write_values(p, values.data());
    }
    const std::int64_t tokens = 2 * family.config.context;
    std::vector<std::int32_t> x(static_cast<std::size_t>(tokens)), labels(static_cast<std::size_t>(tokens));
    for (std::int64_t i = 0; i < tokens; ++i) {
      x[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 3 + 1) % family.config.vocab);
      labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 5 + 2) % family.config.vocab);
    }
    auto loss_now = [&] {
      run.executor.set_input(g.find("x"), x.data(), tokens * 4);
      run.executor.set_input(g.find("labels"), labels.data(), tokens * 4);
      EXPECT_TRUE(run.executor.run_step().ok());
      return double(read(run.executor, g.loss)[0]);
    };
    auto routing_now = [&] {
      std::vector<bool> routed;
      for (TensorId t : gates) {
        for (float v : read(run.executor, t)) routed.push_back(v != 0.0f);
      }
      return routed;
    };
    const double first = loss_now();
    const std::vector<bool> routing = routing_now();
    EXPECT_EQ(loss_now(), first) << "a step must not change what the next one computes";
    const testing::FiniteDifferences fd = testing::expect_gradients_match_central_differences(
        run.executor, loss_now, 1e-2f, 2e-3, [&] { return routing_now() == routing; });
    const int checked = fd.checked, rerouted = fd.skipped;
    if (!gates.empty()) std::printf("%s: %d elements checked, %d skipped (the routing changed)\n", family.name.c_str(), checked, rerouted);
    EXPECT_GT(checked, 20);
    EXPECT_LE(rerouted * 10, checked) << rerouted << " elements changed the routing, " << checked << " did not";
  }
}

// The mixture-of-experts layer against PyTorch (tests/golden/make_moe_golden.py: transformers'
// Mixtral and Qwen2-MoE blocks, with GShard's capacity added): its output, the loss and every
// weight's and the input's gradient, for renormalised and plain top-k, a shared expert, dropped
// tokens and the load-balancing loss.
TEST(MixtureOfExperts, LayerMatchesPyTorch) {
  const nlohmann::json golden = testing::load_golden("moe_golden.json");
  ASSERT_EQ(golden["cases"].size(), 3u);
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    Config config;
    config.layers = 1;
    config.width = c["width"].get<std::int64_t>();
    config.moe.experts = c["experts"].get<std::int64_t>();
    config.moe.top_k = c["top_k"].get<std::int64_t>();
    config.moe.expert_ffn = c["expert_ffn"].get<std::int64_t>();
    config.moe.normalize_top_k = c["normalize"].get<bool>();
    config.moe.shared_ffn = c["shared_ffn"].get<std::int64_t>();
    config.moe.aux_loss_coef = c["aux_loss_coef"].get<double>();
    const std::int64_t N = c["tokens"].get<std::int64_t>(), capacity = c["capacity"].get<std::int64_t>();
    // The capacity factor giving the case's slots (nothing dropped when they are all the tokens).
    config.moe.capacity_factor = capacity == N ? 0.0 : double(capacity) * double(config.moe.experts) / double(N * config.moe.top_k);
    ASSERT_EQ(config.moe.capacity(N), capacity);
    config.ffn = config.moe.shared_ffn > 0 ? config.moe.shared_ffn : 1;  // the shared expert's width

    graph::Graph g;
    graph::Builder b(g);
    const TensorId x = b.parameter("x", {N, config.width}, {}, graph::DType::f32);
    TensorId stats = kNoTensor;
    const TensorId y = models::llama_parts::moe(b, config, x, "mlp", &stats);
    const TensorId r = b.input("R", {N, config.width}, graph::DType::f32);
    g.loss = b.sum(b.mul(y, r, "yR"), "loss");
    if (stats != kNoTensor) g.loss = b.add(g.loss, models::llama_parts::load_balancing_loss(b, config, stats, N), "loss.aux");
    graph::append_backward(g, g.loss);
    g.retained.push_back(y);
    for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);
    testing::CpuRun run(g);
    run.executor.initialize_persistent(1);
    std::map<std::string, std::vector<float>> weights = c["weights"].get<std::map<std::string, std::vector<float>>>();
    weights["x"] = c["x"].get<std::vector<float>>();
    ASSERT_EQ(weights.size(), g.parameters().size());
    for (TensorId p : g.parameters()) {
      ASSERT_TRUE(weights.count(g.tensor(p).name)) << g.tensor(p).name;
      run.executor.write_values(p, weights.at(g.tensor(p).name).data());
    }
    const std::vector<float> R = c["R"].get<std::vector<float>>();
    run.executor.set_input(r, R.data(), static_cast<Bytes>(R.size() * 4));
    ASSERT_TRUE(run.executor.run_step().ok());
    testing::expect_close(read(run.executor, y), c["y"].get<std::vector<float>>(), "y", 1e-5f, 1e-4f);
    EXPECT_NEAR(read(run.executor, g.loss)[0], c["loss"].get<double>(), 1e-4 * (1.0 + std::abs(c["loss"].get<double>())));
    for (TensorId p : g.parameters()) {
      const std::string& n = g.tensor(p).name;
      testing::expect_close(read(run.executor, g.tensor(p).grad), c["grads"][n].get<std::vector<float>>(), "d loss / d " + n,
                            1e-5f, 1e-4f);
    }
  }
}

}  // namespace
}  // namespace memplan
