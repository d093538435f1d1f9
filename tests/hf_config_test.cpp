// Hugging Face config.json reading (models/hf_config.h): the shipped configs against the published
// parameter counts, how each family's fields map onto the builders (GQA, qwen2's biases,
// untied heads, GPT-2's n_inner, aliases), `--config` through fit/plan/compare, and the errors
// a defective config gets (each naming the field).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/model_source.h"
#include "memplan/models/zoo.h"
#include "memplan/planner/plan_step.h"
#include "memplan/train/session.h"
#include "tests/test_util.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;
using models::HfConfig;
using testing::run_cli;
using testing::count_ops;
using testing::op_named;
using testing::parameter_count;
using testing::parameter_shapes;

graph::Graph build(const HfConfig& c, std::int64_t seq = 16) {
  models::ZooOptions o;
  if (!c.vision()) o.seq = seq;
  return models::build_hf_forward(c, 1, o);
}

HfConfig parse(const std::string& text) {
  auto c = models::parse_hf_config(text, "config.json");
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? c.value() : HfConfig{};
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string shipped_text(const std::string& file) {
  for (const models::ShippedConfig& s : models::shipped_configs()) {
    if (s.file == file) return std::string(s.text);
  }
  ADD_FAILURE() << "no shipped " << file;
  return "{}";
}

TEST(HfConfig, EveryFileInModelsConfigsIsEmbeddedVerbatim) {
  std::set<std::string> on_disk;
  for (const auto& entry : fs::directory_iterator(MEMPLAN_CONFIG_DIR)) {
    if (entry.path().extension() == ".json") on_disk.insert(entry.path().filename().string());
  }
  std::set<std::string> embedded;
  for (const models::ShippedConfig& s : models::shipped_configs()) {
    embedded.insert(std::string(s.file));
    EXPECT_EQ(std::string(s.text), read_text(fs::path(MEMPLAN_CONFIG_DIR) / std::string(s.file))) << s.file;
  }
  EXPECT_EQ(embedded, on_disk);
  EXPECT_GE(embedded.size(), 13u);
}

// The published parameter counts. Sources: Hugging Face model cards / `model.num_parameters()`
// of the reference checkpoints (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, BertForMaskedLM, ViTForImageClassification), which count a tied lm_head
// once (it is the embedding): GPT-2 124,439,808 / 354,823,168 / 774,030,080 / 1,557,611,200
// (Radford et al. round these to 117M/345M/762M/1542M, counting differently); Llama-3.2-1B
// 1,235,814,400 (tied); Llama-3.1-8B 8,030,261,248; Llama-2 7B 6,738,415,616, 13B
// 13,015,864,320, 70B 68,976,648,192; Mistral-7B-v0.1 7,241,732,096; Qwen2.5-7B 7,615,616,512
// (its card: "7.61B"); bert-base-uncased with the MLM head 109,514,298 (BertModel with its pooler:
// 109,482,240); google/vit-base-patch16-224 86,567,656 (timm's vit_base_patch16_224: the same);
// Phi-3-mini-4k-instruct 3,821,079,552 (its card: "3.8B"); OLMo-2-1124-7B 7,298,617,344;
// Pythia-160M 162,322,944 and Pythia-6.9B 6,857,302,016 (the Pythia suite's "total params",
// untied embed_out included); Falcon-7B 6,921,720,704 (tied); Mixtral-8x7B-v0.1 46,702,792,704
// (its card: "46.7B"); Qwen1.5-MoE-A2.7B 14,315,784,192 ("14.3B", 60 experts and a shared one);
// Qwen3-30B-A3B 30,532,122,624 ("30.5B", 128 experts); Gemma-2-9B 9,241,705,984 ("9.24B", tied);
// T5ForConditionalGeneration: t5-small 60,506,624 and t5-base 222,903,552 (tied; the "60M" and
// "220M" of the T5 paper), google/flan-t5-base 247,577,856 and flan-t5-xl 2,849,757,184 (untied
// lm_head); each the sum of its safetensors' shapes.
const std::map<std::string, std::int64_t>& published_counts() {
  static const std::map<std::string, std::int64_t> counts = {
      {"gpt2.json", 124'439'808},
      {"gpt2-medium.json", 354'823'168},
      {"gpt2-large.json", 774'030'080},
      {"gpt2-xl.json", 1'557'611'200},
      {"llama-3.2-1b.json", 1'235'814'400},
      {"llama-3.1-8b.json", 8'030'261'248},
      {"llama-2-7b.json", 6'738'415'616},
      {"llama-2-13b.json", 13'015'864'320},
      {"llama-2-70b.json", 68'976'648'192},
      {"mistral-7b-v0.1.json", 7'241'732'096},
      {"qwen2.5-7b.json", 7'615'616'512},
      {"qwen3-0.6b.json", 596'049'920},
      {"qwen3-8b.json", 8'190'735'360},
      {"gemma-2b.json", 2'506'172'416},
      {"gemma-7b.json", 8'537'680'896},
      {"gemma-2-9b.json", 9'241'705'984},
      // Gemma 3's technical report: 302M embedding and 698M non-embedding parameters (the model
      // card says 1B); exact from the config's shapes: 262144 x 1152 + 26 layers x 26,842,112 + 1152.
      {"gemma-3-1b-it.json", 999'885'952},
      // DeepSeek-V3's model card: 671B of main-model weights (685B with the multi-token prediction
      // module, which transformers does not build); exact from the config's shapes, the routers'
      // correction biases included.
      {"deepseek-v3.json", 671'026'419'200},
      // OPT-125M (model card: 125M) and SantaCoder (1.1B): exact from the configs' shapes, OPT's
      // position table of 2048 + 2 rows included.
      {"opt-125m.json", 125'239'296},
      {"santacoder.json", 1'124'886'528},
      {"phi-3-mini-4k.json", 3'821'079'552},
      {"olmo-2-7b.json", 7'298'617'344},
      {"pythia-160m.json", 162'322'944},
      {"pythia-6.9b.json", 6'857'302'016},
      {"falcon-7b.json", 6'921'720'704},
      {"mixtral-8x7b.json", 46'702'792'704},
      {"qwen1.5-moe-a2.7b.json", 14'315'784'192},
      {"qwen3-30b-a3b.json", 30'532'122'624},
      {"t5-small.json", 60'506'624},
      {"t5-base.json", 222'903'552},
      {"flan-t5-base.json", 247'577'856},
      {"flan-t5-xl.json", 2'849'757'184},
      {"bert-base-uncased.json", 109'514'298},
      {"vit-base-patch16-224.json", 86'567'656},
  };
  return counts;
}

TEST(HfConfig, ShippedConfigsHaveThePublishedParameterCounts) {
  ASSERT_EQ(published_counts().size(), models::shipped_configs().size()) << "a shipped config without a published count";
  for (const auto& [file, count] : published_counts()) {
    auto c = models::shipped_config(file);
    ASSERT_TRUE(c.ok()) << file << ": " << c.error().message;
    EXPECT_EQ(parameter_count(build(c.value())), count) << file;
  }
}

TEST(HfConfig, EveryShippedConfigIsReachableByAZooName) {
  std::set<std::string> reachable;
  for (const models::ZooModel& m : models::zoo_models()) {
    if (!m.config_file.empty()) reachable.insert(m.config_file);
  }
  for (const models::ShippedConfig& s : models::shipped_configs()) EXPECT_TRUE(reachable.count(std::string(s.file))) << s.file;
}

TEST(HfConfig, GroupedQueryAttentionKeepsKvProjectionsSmall) {
  const HfConfig c = models::shipped_config("llama-2-70b.json").value();
  EXPECT_EQ(c.llama.heads, 64);
  EXPECT_EQ(c.llama.kv_heads, 8);
  const graph::Graph g = build(c);
  const auto shapes = parameter_shapes(g);
  // head size 128: q 64 heads x 128, k and v 8 heads x 128.
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.weight"), (graph::Shape{8192, 8192}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_proj.weight"), (graph::Shape{1024, 8192}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.v_proj.weight"), (graph::Shape{1024, 8192}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (graph::Shape{32000, 8192}));
}

// Qwen3: a head size of its own (0.6B: 16 heads of 128 over a width of 1024) and an RMSNorm over
// each head's queries and keys.
TEST(HfConfig, Qwen3HasItsOwnHeadSizeAndPerHeadQueryKeyNorms) {
  const graph::Graph g = build(models::shipped_config("qwen3-0.6b.json").value());
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.weight"), (graph::Shape{2048, 1024}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_proj.weight"), (graph::Shape{1024, 1024}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.o_proj.weight"), (graph::Shape{1024, 2048}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_norm.weight"), (graph::Shape{128}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_norm.weight"), (graph::Shape{128}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "tied to the embeddings";
  // Read as qwen2 (no norms, but q/k/v biases): 28 layers x (2 x 128 norm weights) fewer, 28 x
  // (2048 + 2 x 1024) bias entries more.
  auto j = nlohmann::json::parse(shipped_text("qwen3-0.6b.json"));
  j["model_type"] = "qwen2";
  EXPECT_EQ(parameter_count(g) - parameter_count(build(parse(j.dump()))), 28 * (2 * 128) - 28 * (2048 + 2 * 1024));
  // An odd head size cannot carry rotary positions.
  j["model_type"] = "qwen3";
  j["head_dim"] = 127;
  EXPECT_FALSE(models::parse_hf_config(j.dump(), "odd.json").ok());
}

// Mixtral: every layer's MLP is 8 experts of Llama's SwiGLU shape, 2 per token renormalised, the
// router a [8, 4096] linear; the load-balancing loss joins the loss only when output_router_logits.
TEST(HfConfig, MixtralRoutesEachTokenToTwoOfEightSwiGluExperts) {
  const HfConfig c = models::shipped_config("mixtral-8x7b.json").value();
  EXPECT_EQ(c.describe(), "mixtral: 32 layers, width 4096, 32 heads (8 K/V), SwiGLU 14336, vocab 32000, rotary, 8 experts (top 2)");
  const graph::Graph g = build(c);  // 16 tokens: a balanced share of 16 x 2 / 8 = 4 slots per expert
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.mlp.gate.weight"), (graph::Shape{8, 4096}));
  EXPECT_EQ(shapes.at("layers.0.mlp.experts.gate_proj.weight"), (graph::Shape{8, 14336, 4096}));
  EXPECT_EQ(shapes.at("layers.31.mlp.experts.down_proj.weight"), (graph::Shape{8, 4096, 14336}));
  EXPECT_EQ(shapes.count("layers.0.mlp.gate_proj.weight"), 0u) << "no dense MLP beside the experts";
  EXPECT_EQ(count_ops(g, graph::OpKind::moe_dispatch), 32);
  EXPECT_EQ(count_ops(g, graph::OpKind::moe_router_stats), 0) << "output_router_logits is false";
  const graph::Op* top_k = op_named(g, graph::OpKind::moe_top_k, "layers.0.mlp.gates");
  ASSERT_NE(top_k, nullptr);
  EXPECT_EQ(top_k->attrs.top_k, 2);
  EXPECT_TRUE(top_k->attrs.normalize);
  EXPECT_EQ(g.tensor(g.find("layers.0.mlp.dispatch")).shape, (graph::Shape{8, 4, 4096}));
  // A capacity factor of 1.25 rounds 5 slots up from 4 x 1.25; 0 gives every expert all 16 tokens.
  HfConfig roomy = c;
  roomy.llama.moe.capacity_factor = 1.25;
  EXPECT_EQ(build(roomy).tensor(build(roomy).find("layers.0.mlp.dispatch")).shape, (graph::Shape{8, 5, 4096}));
  roomy.llama.moe.capacity_factor = 0.0;
  EXPECT_EQ(build(roomy).tensor(build(roomy).find("layers.0.mlp.dispatch")).shape, (graph::Shape{8, 16, 4096}));
  // With output_router_logits, one statistics op per layer feeds the loss.
  auto j = nlohmann::json::parse(shipped_text("mixtral-8x7b.json"));
  j["output_router_logits"] = true;
  const HfConfig with_aux = parse(j.dump());
  EXPECT_DOUBLE_EQ(with_aux.llama.moe.aux_loss_coef, 0.02);
  const graph::Graph aux = build(with_aux);
  EXPECT_EQ(count_ops(aux, graph::OpKind::moe_router_stats), 32);
  EXPECT_EQ(aux.tensor(aux.loss).name, "loss.with_aux");
  EXPECT_EQ(parameter_count(aux), parameter_count(g));
}

// Qwen2-MoE: 60 experts of their own width (moe_intermediate_size), 4 per token without
// renormalising, a shared expert gated by sigmoid(x w), q/k/v biases; decoder_sparse_step and
// mlp_only_layers keep dense MLPs of intermediate_size where they say.
TEST(HfConfig, Qwen2MoeHasAGatedSharedExpertAndDenseLayersWhereAsked) {
  const HfConfig c = models::shipped_config("qwen1.5-moe-a2.7b.json").value();
  const graph::Graph g = build(c);
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.mlp.experts.up_proj.weight"), (graph::Shape{60, 1408, 2048}));
  EXPECT_EQ(shapes.at("layers.0.mlp.shared_expert.gate_proj.weight"), (graph::Shape{5632, 2048}));
  EXPECT_EQ(shapes.at("layers.0.mlp.shared_expert_gate.weight"), (graph::Shape{1, 2048}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.bias"), (graph::Shape{2048}));
  EXPECT_FALSE(op_named(g, graph::OpKind::moe_top_k, "layers.0.mlp.gates")->attrs.normalize);
  auto j = nlohmann::json::parse(shipped_text("qwen1.5-moe-a2.7b.json"));
  j["decoder_sparse_step"] = 2;  // layers 1, 3, ... are mixtures
  j["mlp_only_layers"] = {3};    // but 3 is dense
  const graph::Graph sparse = build(parse(j.dump()));
  const auto sparse_shapes = parameter_shapes(sparse);
  EXPECT_EQ(sparse_shapes.at("layers.0.mlp.gate_proj.weight"), (graph::Shape{5632, 2048}));
  EXPECT_EQ(sparse_shapes.count("layers.1.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(sparse_shapes.at("layers.1.mlp.experts.gate_proj.weight"), (graph::Shape{60, 1408, 2048}));
  EXPECT_EQ(sparse_shapes.at("layers.3.mlp.gate_proj.weight"), (graph::Shape{5632, 2048}));
  EXPECT_EQ(count_ops(sparse, graph::OpKind::moe_combine), 11);  // 1, 5, 7, ..., 23
}

// Qwen3-MoE: Qwen3's attention (heads of 128, per-head q/k norms, no biases) over 128 experts, 8
// per token renormalised (norm_topk_prob), no shared expert.
TEST(HfConfig, Qwen3MoeIsQwen3AttentionOverOneHundredAndTwentyEightExperts) {
  const HfConfig c = models::shipped_config("qwen3-30b-a3b.json").value();
  const graph::Graph g = build(c);
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_norm.weight"), (graph::Shape{128}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.weight"), (graph::Shape{4096, 2048}));
  EXPECT_EQ(shapes.at("layers.47.mlp.experts.down_proj.weight"), (graph::Shape{128, 2048, 768}));
  EXPECT_EQ(shapes.count("layers.0.mlp.shared_expert_gate.weight"), 0u);
  EXPECT_EQ(shapes.count("layers.0.self_attn.q_proj.bias"), 0u);
  const graph::Op* top_k = op_named(g, graph::OpKind::moe_top_k, "layers.0.mlp.gates");
  EXPECT_EQ(top_k->attrs.top_k, 8);
  EXPECT_TRUE(top_k->attrs.normalize);
}

// Gemma: heads of 256 channels apart from the width, multi-query attention (2B), tied embeddings
// by default, a GeGLU MLP and embeddings scaled by sqrt(hidden_size).
TEST(HfConfig, GemmaIsAGeGluDecoderWithScaledTiedEmbeddings) {
  const graph::Graph g = build(models::shipped_config("gemma-2b.json").value());
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.weight"), (graph::Shape{2048, 2048}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_proj.weight"), (graph::Shape{256, 2048}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "tied to the embeddings";
  EXPECT_EQ(count_ops(g, graph::OpKind::gelu), 18);
  EXPECT_EQ(count_ops(g, graph::OpKind::silu), 0);
  const TensorId scaled = g.find("residual0.scaled");
  ASSERT_NE(scaled, kNoTensor);
  // The same file read as llama: SiLU, no scaling, and an lm_head of its own (llama does not tie
  // by default): 256000 x 2048 more parameters.
  auto j = nlohmann::json::parse(shipped_text("gemma-2b.json"));
  j["model_type"] = "llama";
  j.erase("hidden_act");
  const graph::Graph as_llama = build(parse(j.dump()));
  EXPECT_EQ(count_ops(as_llama, graph::OpKind::silu), 18);
  EXPECT_EQ(as_llama.find("residual0.scaled"), kNoTensor);
  EXPECT_EQ(parameter_count(as_llama) - parameter_count(g), std::int64_t{256000} * 2048);
  // An activation memplan has no kernel for is refused, naming the key.
  j["model_type"] = "gemma";
  j["hidden_activation"] = "mish";
  auto refused = models::parse_hf_config(j.dump(), "mish.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("hidden_activation"), std::string::npos) << refused.error().message;
}

// Gemma-2: Gemma's layout with norms before and after each sublayer, scores scaled by
// query_pre_attn_scalar^-1/2 and soft-capped, logits soft-capped; null switches a cap off.
TEST(HfConfig, Gemma2CapsScoresAndLogitsAndNormsBothSidesOfEachSublayer) {
  const HfConfig c = models::shipped_config("gemma-2-9b.json").value();
  EXPECT_EQ(c.describe(), "gemma2: 42 layers, width 3584, 16 heads (8 K/V), GELU-gated MLP 14336, vocab 256000, rotary, "
                          "norms before and after each sublayer, tied embeddings, soft-capped scores, soft-capped logits");
  EXPECT_FLOAT_EQ(c.llama.query_scale, 256.0f);
  EXPECT_FLOAT_EQ(c.llama.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(c.llama.final_softcap, 30.0f);
  const graph::Graph g = build(c);
  const auto shapes = parameter_shapes(g);
  for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"}) {
    EXPECT_EQ(shapes.at("layers.41." + std::string(norm) + ".weight"), (graph::Shape{3584})) << norm;
  }
  const graph::Op* attention = op_named(g, graph::OpKind::attention, "layers.0.self_attn.fused");
  ASSERT_NE(attention, nullptr);
  EXPECT_FLOAT_EQ(attention->attrs.softcap, 50.0f);
  EXPECT_FLOAT_EQ(attention->attrs.alpha, 1.0f / 16.0f);  // 256^-1/2
  EXPECT_EQ(count_ops(g, graph::OpKind::tanh), 1) << "the logits' cap";
  auto j = nlohmann::json::parse(shipped_text("gemma-2-9b.json"));
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  j["query_pre_attn_scalar"] = 144;
  const HfConfig uncapped = parse(j.dump());
  EXPECT_EQ(uncapped.llama.attn_softcap, 0.0f);
  EXPECT_EQ(uncapped.llama.final_softcap, 0.0f);
  const graph::Graph plain = build(uncapped);
  EXPECT_EQ(count_ops(plain, graph::OpKind::tanh), 0);
  EXPECT_FLOAT_EQ(op_named(plain, graph::OpKind::attention, "layers.0.self_attn.fused")->attrs.alpha, 1.0f / 12.0f);
  EXPECT_EQ(parameter_count(plain), parameter_count(g));
}

// GPT-NeoX (Pythia): LayerNorms with biases, biases on every projection, a plain GELU MLP, the
// attention and the MLP side by side, rotary over a quarter of each head.
TEST(HfConfig, GptNeoxIsAParallelLayerNormDecoderWithPartialRotary) {
  const HfConfig c = models::shipped_config("pythia-160m.json").value();
  EXPECT_EQ(c.llama.rotary_dims, 16);  // 0.25 of 64
  const graph::Graph g = build(c);
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.input_layernorm.bias"), (graph::Shape{768}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.bias"), (graph::Shape{768}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.o_proj.bias"), (graph::Shape{768}));
  EXPECT_EQ(shapes.at("layers.0.mlp.up_proj.bias"), (graph::Shape{3072}));
  EXPECT_EQ(shapes.at("layers.0.mlp.down_proj.bias"), (graph::Shape{768}));
  EXPECT_EQ(shapes.count("layers.0.mlp.gate_proj.weight"), 0u) << "a plain MLP";
  EXPECT_EQ(count_ops(g, graph::OpKind::gelu), 12);
  EXPECT_EQ(count_ops(g, graph::OpKind::layer_norm), 2 * 12 + 1);
  EXPECT_EQ(count_ops(g, graph::OpKind::rms_norm), 0);
  for (const graph::Op& op : g.ops()) {
    if (op.kind == graph::OpKind::rotary) {
      EXPECT_EQ(op.attrs.rotary_dims, 16) << op.name;
    }
  }
  // Parallel: the MLP reads the layer's input, not the attention's sum; its norm's input is the
  // residual stream the attention also reads.
  const graph::Op* mlp_norm = nullptr;
  for (const graph::Op& op : g.ops()) {
    if (op.name == "layers.1.post_attention_layernorm") mlp_norm = &op;
  }
  ASSERT_NE(mlp_norm, nullptr);
  EXPECT_EQ(g.tensor(mlp_norm->inputs[0]).name, "layers.0.residual2");
  // Sequential (use_parallel_residual false): the MLP's norm reads the attention's sum.
  auto j = nlohmann::json::parse(shipped_text("pythia-160m.json"));
  j["use_parallel_residual"] = false;
  const graph::Graph sequential = build(parse(j.dump()));
  for (const graph::Op& op : sequential.ops()) {
    if (op.name == "layers.1.post_attention_layernorm") {
      EXPECT_EQ(sequential.tensor(op.inputs[0]).name, "layers.1.residual1");
    }
  }
  // A rotary fraction that leaves an odd count is refused, naming the key; dropout too.
  j["rotary_pct"] = 0.3;  // 19.2 -> 19 channels
  auto odd = models::parse_hf_config(j.dump(), "odd.json");
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("rotary_pct"), std::string::npos) << odd.error().message;
  j["rotary_pct"] = 0.25;
  j["hidden_dropout"] = 0.1;
  auto dropout = models::parse_hf_config(j.dump(), "dropout.json");
  ASSERT_FALSE(dropout.ok());
  EXPECT_NE(dropout.error().message.find("hidden_dropout"), std::string::npos) << dropout.error().message;
}

// Falcon-7B: one K/V head (multi_query), one LayerNorm feeding attention and MLP, no biases, tied
// embeddings; the new architecture's grouped K/V heads and two norms from num_kv_heads.
TEST(HfConfig, FalconIsAMultiQueryParallelDecoderWithOneNorm) {
  const HfConfig c = models::shipped_config("falcon-7b.json").value();
  EXPECT_EQ(c.llama.kv_heads, 1);
  EXPECT_TRUE(c.llama.shared_norm);
  const graph::Graph g = build(c);
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_proj.weight"), (graph::Shape{64, 4544}));
  EXPECT_EQ(shapes.count("layers.0.post_attention_layernorm.weight"), 0u) << "one norm per layer";
  EXPECT_EQ(shapes.count("layers.0.self_attn.q_proj.bias"), 0u);
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "tied";
  EXPECT_EQ(shapes.at("layers.0.mlp.up_proj.weight"), (graph::Shape{4 * 4544, 4544}));
  auto j = nlohmann::json::parse(shipped_text("falcon-7b.json"));
  j["new_decoder_architecture"] = true;
  j["num_kv_heads"] = 1;
  // Two norms (ln_attn, ln_mlp): 32 layers x 2 x 4544 parameters more.
  EXPECT_EQ(parameter_count(build(parse(j.dump()))) - parameter_count(g), 32 * 2 * 4544);
  // Without multi_query the old architecture takes num_kv_heads too (all heads when absent).
  auto mha = j;
  mha["new_decoder_architecture"] = false;
  mha["multi_query"] = false;
  mha.erase("num_kv_heads");
  EXPECT_EQ(parse(mha.dump()).llama.kv_heads, 71);
  mha["num_kv_heads"] = 1;
  EXPECT_EQ(parse(mha.dump()).llama.kv_heads, 1);
  mha["num_kv_heads"] = 2;  // 71 heads do not split into 2 groups
  auto groups = models::parse_hf_config(mha.dump(), "groups.json");
  ASSERT_FALSE(groups.ok());
  EXPECT_NE(groups.error().message.find("num_kv_heads 2 does not divide num_attention_heads 71"), std::string::npos)
      << groups.error().message;
  j["alibi"] = true;
  auto alibi = models::parse_hf_config(j.dump(), "alibi.json");
  ASSERT_FALSE(alibi.ok());
  EXPECT_NE(alibi.error().message.find("alibi"), std::string::npos) << alibi.error().message;
}

// OLMo-2: RMSNorms on the outputs of attention and MLP (none before them), queries and keys
// normalised over the whole projection.
TEST(HfConfig, Olmo2NormalisesSublayerOutputsAndWholeQueriesAndKeys) {
  const graph::Graph g = build(models::shipped_config("olmo-2-7b.json").value());
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.count("layers.0.input_layernorm.weight"), 0u);
  EXPECT_EQ(shapes.at("layers.0.post_attention_layernorm.weight"), (graph::Shape{4096}));
  EXPECT_EQ(shapes.at("layers.0.post_feedforward_layernorm.weight"), (graph::Shape{4096}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_norm.weight"), (graph::Shape{4096}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_norm.weight"), (graph::Shape{4096}));
  // The attention's output norm feeds the residual add.
  for (const graph::Op& op : g.ops()) {
    if (op.name == "layers.0.residual1") {
      EXPECT_EQ(g.tensor(op.inputs[1]).name, "layers.0.post_attention_layernorm");
    }
  }
}

// Phi-3: llama's layout (fused projections hold the same tensors); its dropout keys drop each
// sublayer's output (resid_pdrop) and the embeddings (embd_pdrop) in training, and a partial rotary
// factor applies.
TEST(HfConfig, Phi3IsLlamasLayoutWithItsOwnDropoutKeys) {
  auto j = nlohmann::json::parse(shipped_text("phi-3-mini-4k.json"));
  const HfConfig c = parse(j.dump());
  EXPECT_EQ(c.llama.rotary_dims, 0);
  EXPECT_TRUE(c.llama.gated_mlp);
  j["resid_pdrop"] = 0.1;
  j["embd_pdrop"] = 0.2;
  j["num_hidden_layers"] = 2;
  const HfConfig dropped = parse(j.dump());
  EXPECT_FLOAT_EQ(dropped.llama.residual_dropout, 0.1f);
  EXPECT_FLOAT_EQ(dropped.llama.embedding_dropout, 0.2f);
  EXPECT_EQ(count_ops(build(dropped), graph::OpKind::dropout_mask), 1 + 2 * 2);
  models::ZooOptions o;
  o.seq = 16;
  EXPECT_EQ(count_ops(models::build_hf_forward(dropped, 1, o, /*training=*/false), graph::OpKind::dropout_mask), 0);
  j["resid_pdrop"] = 1.0;
  auto refused = models::parse_hf_config(j.dump(), "phi3.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("resid_pdrop: dropout probabilities must be below 1"), std::string::npos)
      << refused.error().message;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["num_hidden_layers"] = 32;
  j["partial_rotary_factor"] = 0.75;  // Phi-4-mini's: 72 of 96 channels
  EXPECT_EQ(parse(j.dump()).llama.rotary_dims, 72);
}

// The keys a reader does not read are kept, sorted; the ones it reads (even at their default) are
// not among them. A key that would change memory is refused rather than left unread.
TEST(HfConfig, KeysTheReaderDoesNotReadAreListed) {
  auto j = nlohmann::json::parse(shipped_text("llama-3.2-1b.json"));
  j["zz_custom"] = 1;
  j["attention_dropout"] = 0.0;
  const HfConfig c = parse(j.dump());
  EXPECT_EQ(c.unread_keys, (std::vector<std::string>{"architectures", "bos_token_id", "eos_token_id", "initializer_range",
                                                     "zz_custom"}));
  auto gpt2 = nlohmann::json::parse(shipped_text("gpt2.json"));
  gpt2["add_cross_attention"] = true;
  auto refused = models::parse_hf_config(gpt2.dump(), "gpt2.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("add_cross_attention"), std::string::npos) << refused.error().message;
}

TEST(HfConfig, Qwen2HasQkvBiasesAndNoOutputBias) {
  const graph::Graph g = build(models::shipped_config("qwen2.5-7b.json").value());
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.bias"), (graph::Shape{3584}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_proj.bias"), (graph::Shape{512}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.v_proj.bias"), (graph::Shape{512}));
  EXPECT_EQ(shapes.count("layers.0.self_attn.o_proj.bias"), 0u);
  // The same layout read as llama: no biases, 28 layers x (3584 + 2 x 512) fewer parameters.
  auto j = nlohmann::json::parse(shipped_text("qwen2.5-7b.json"));
  j["model_type"] = "llama";
  EXPECT_EQ(parameter_count(g) - parameter_count(build(parse(j.dump()))), 28 * (3584 + 2 * 512));
  // Llama's attention_bias puts a bias on all four projections.
  j["attention_bias"] = true;
  EXPECT_EQ(parameter_count(g) - parameter_count(build(parse(j.dump()))), -28 * 3584);
}

planner::MemoryPlan plan_of(const HfConfig& c, std::int64_t batch, std::int64_t seq) {
  models::ModelOptions m;
  m.name = "config";
  m.config = c;
  m.zoo.seq = seq;
  auto planned = planner::plan_step(planner::StepDescription::of_source(models::registry_source(m), batch), planner::PlanRequest{});
  EXPECT_TRUE(planned.ok()) << (planned.ok() ? "" : planned.error().message);
  return planned.ok() ? planned.value().plan : planner::MemoryPlan{};
}

TEST(HfConfig, MistralsSlidingWindowIsAMaskNotMemory) {
  // A small mistral: the same step with and without its sliding window, and read as llama.
  const std::string base = R"({"model_type":"mistral","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,
    "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"max_position_embeddings":256)";
  const auto with_window = plan_of(parse(base + R"(,"sliding_window":8})"), 2, 32);
  const auto without = plan_of(parse(base + R"(,"sliding_window":null})"), 2, 32);
  auto as_llama = nlohmann::json::parse(base + "}");
  as_llama["model_type"] = "llama";
  const auto llama = plan_of(parse(as_llama.dump()), 2, 32);
  EXPECT_GT(with_window.arena_bytes, 0);
  EXPECT_EQ(with_window.arena_bytes, without.arena_bytes);
  EXPECT_EQ(with_window.arena_bytes, llama.arena_bytes);
}

// Which layers a sliding window covers, family by family (serving keeps only their window's keys
// and values: tests/serve_plan_test.cpp), and training takes sequences past it.
TEST(HfConfig, SlidingWindowsCoverTheLayersEachFamilySays) {
  auto windowed = [](const HfConfig& c) {
    std::vector<std::int64_t> layers;
    for (std::int64_t l = 0; l < c.llama.layers; ++l) {
      if (c.llama.windowed(l)) layers.push_back(l);
    }
    return layers;
  };
  const std::string base = R"({"hidden_size":64,"intermediate_size":160,"num_hidden_layers":4,
    "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"max_position_embeddings":256)";
  const HfConfig mistral = parse(R"({"model_type":"mistral","sliding_window":8,)" + base.substr(1) + "}");
  EXPECT_EQ(windowed(mistral), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(mistral.llama.kv_positions(0, 32), 8);
  EXPECT_EQ(mistral.llama.kv_positions(0, 5), 5);
  EXPECT_TRUE(windowed(parse(R"({"model_type":"mistral","sliding_window":null,)" + base.substr(1) + "}")).empty());
  EXPECT_EQ(windowed(parse(R"({"model_type":"gemma2","sliding_window":8,)" + base.substr(1) + "}")), (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(windowed(parse(R"({"model_type":"qwen2","sliding_window":8,"use_sliding_window":true,"max_window_layers":1,)" + base.substr(1) + "}")),
            (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_TRUE(windowed(parse(R"({"model_type":"qwen2","sliding_window":8,"use_sliding_window":false,"max_window_layers":1,)" + base.substr(1) + "}")).empty());
  EXPECT_EQ(windowed(models::shipped_config("phi-3-mini-4k.json").value()).size(), 32u);
  EXPECT_EQ(models::shipped_config("phi-3-mini-4k.json").value().llama.sliding_window, 2047);
  EXPECT_TRUE(windowed(models::shipped_config("qwen2.5-7b.json").value()).empty());
  EXPECT_EQ(windowed(models::shipped_config("gemma-2-9b.json").value()).size(), 21u);

  // Training masks the window (tests/attention_test.cpp): a --seq past it trains the config's model.
  EXPECT_EQ(train::config_train_seq(mistral, 8).value(), 8);
  EXPECT_EQ(train::config_train_seq(mistral, 32).value(), 32);
}

TEST(HfConfig, Gpt2FieldsAliasesAndDefaults) {
  const std::string small = R"({"model_type":"gpt2","n_embd":32,"n_layer":2,"n_head":4,"vocab_size":50,"n_positions":64)";
  const HfConfig c = parse(small + "}");
  EXPECT_EQ(c.gpt.mlp, 0);  // 4 * n_embd
  EXPECT_TRUE(c.gpt.tied_head);
  EXPECT_FLOAT_EQ(c.gpt.dropout, 0.1f);  // GPT2Config's defaults
  EXPECT_EQ(c.positions, 64);
  const std::int64_t base = parameter_count(build(c));
  // n_inner 64 instead of 128: two 32x64 fewer in each of two layers, and 64 fewer biases.
  EXPECT_EQ(base - parameter_count(build(parse(small + R"(,"n_inner":64})"))), 2 * (2 * 32 * 64 + 64));
  // An untied head adds vocab x n_embd.
  EXPECT_EQ(parameter_count(build(parse(small + R"(,"tie_word_embeddings":false})"))) - base, 50 * 32);
  // GPT2Config's attribute_map: hidden_size is n_embd; the same value twice is fine.
  EXPECT_EQ(parameter_count(build(parse(small + R"(,"hidden_size":32})"))), base);
  auto clash = models::parse_hf_config(small + R"(,"hidden_size":48})", "c.json");
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.error().message.find("n_embd 32 and hidden_size 48"), std::string::npos) << clash.error().message;
  // Zero dropout everywhere: no dropout ops.
  const graph::Graph no_drop =
      build(parse(small + R"(,"resid_pdrop":0.0,"embd_pdrop":0,"attn_pdrop":0.0})"));
  for (const graph::Op& op : no_drop.ops()) EXPECT_NE(op.kind, graph::OpKind::dropout_mask) << op.name;
}

TEST(HfConfig, TorchDtypeIsReadButPlanningUsesTheAskedDtype) {
  const HfConfig c = models::shipped_config("llama-2-7b.json").value();
  EXPECT_EQ(c.torch_dtype, "float16");
  const graph::Graph g = build(c);
  EXPECT_EQ(g.tensor(g.parameters().front()).dtype, graph::DType::f32);
  models::ZooOptions o{8, 0, graph::DType::bf16};
  const graph::Graph b = models::build_hf_forward(c, 1, o);
  EXPECT_EQ(b.tensor(b.parameters().front()).dtype, graph::DType::bf16);
}

struct BadConfig {
  std::string name;
  std::string json;
  std::string expect;  // in the message
};

std::vector<BadConfig> bad_configs() {
  const std::string llama = R"("model_type":"llama","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256)";
  const std::string gpt2 = R"("model_type":"gpt2","n_embd":32,"n_layer":2,"n_head":4,"vocab_size":50,"n_positions":64)";
  const std::string mixtral = R"("model_type":"mixtral","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256)";
  const std::string qwen_moe = R"("model_type":"qwen2_moe","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256,"moe_intermediate_size":32,"shared_expert_intermediate_size":48)";
  const std::string vit = R"("model_type":"vit","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"patch_size":16)";
  return {
      {"not JSON", "{\"model_type\": \"llama\",", "not a JSON config"},
      {"empty", "", "not a JSON config"},
      {"an array", "[1, 2]", "a JSON object"},
      {"binary", std::string("\x89PNG\r\n\x1a\n\0\0", 10), "not a JSON config"},
      {"no model_type", R"({"hidden_size": 64})", "model_type: missing (supported: gpt2, llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, granite, starcoder2, stablelm, olmoe, deepseek_v2, deepseek_v3, kimi_k2, opt, gpt_bigcode, phi3, olmo2, gpt_neox, falcon, mixtral, qwen2_moe, qwen3_moe, bert, vit, t5)"},
      {"unknown model_type", R"({"model_type": "gptj"})", "model_type 'gptj' is not supported (supported: gpt2, llama"},
      {"model_type a number", R"({"model_type": 7})", "model_type: expected a string"},
      {"missing hidden_size", R"({"model_type":"llama","num_hidden_layers":2})", "hidden_size: missing"},
      {"missing n_positions", R"({"model_type":"gpt2","n_embd":32,"n_layer":2,"n_head":4,"vocab_size":50})",
       "n_positions or max_position_embeddings or n_ctx: missing"},
      {"string size", "{" + llama + R"(,"num_key_value_heads":"2"})", "num_key_value_heads: expected a positive integer, got a string"},
      {"fractional size", R"({"model_type":"gpt2","n_embd":32.5,"n_layer":2,"n_head":4,"vocab_size":50,"n_positions":64})",
       "n_embd: expected a positive integer, got a fractional number"},
      {"bool size", R"({"model_type":"bert","hidden_size":true})", "hidden_size: expected a positive integer, got a boolean"},
      {"negative size", R"({"model_type":"llama","hidden_size":-4096})", "hidden_size: must be a positive integer, got -4096"},
      {"zero layers", R"({"model_type":"gpt2","n_embd":32,"n_layer":0,"n_head":4,"vocab_size":50,"n_positions":64})",
       "n_layer: must be a positive integer, got 0"},
      {"size past int64", R"({"model_type":"llama","hidden_size":18446744073709551615})", "hidden_size: 18446744073709551615 is too large"},
      {"size as 1e30", R"({"model_type":"llama","hidden_size":1e30})", "hidden_size: expected a positive integer, got a fractional number"},
      {"heads do not divide", R"({"model_type":"gpt2","n_embd":30,"n_layer":2,"n_head":4,"vocab_size":50,"n_positions":64})",
       "num_attention_heads 4 does not divide n_embd 30"},
      {"kv heads do not divide", "{" + llama + R"(,"num_key_value_heads":3})", "num_key_value_heads 3 does not divide num_attention_heads 4"},
      {"odd head size", R"({"model_type":"llama","hidden_size":60,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256})",
       "rotary positions need an even head size"},
      {"odd head_dim", "{" + llama + R"(,"head_dim":33})", "head_dim 33 is odd; rotary positions need an even head size"},
      {"bytes overflow", R"({"model_type":"llama","hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":2,"num_attention_heads":32,"vocab_size":4000000000000000,"max_position_embeddings":4096})",
       "vocab_size x hidden_size (4000000000000000 x 4096): the weight would hold more than 2^60 bytes"},
      {"square overflow", R"({"model_type":"bert","hidden_size":3000000000,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":1,"vocab_size":2,"max_position_embeddings":2})",
       "hidden_size x hidden_size (3000000000 x 3000000000)"},
      {"image overflow", "{" + vit + R"(,"image_size":1600000000})", "num_channels x image_size^2 (one image)"},
      {"image not a multiple of the patch", "{" + vit + R"(,"image_size":100})", "image_size 100 is not a multiple of patch_size 16"},
      {"id2label not an object", "{" + vit + R"(,"image_size":32,"id2label":[1,2]})", "id2label: expected a non-empty object"},
      {"num_labels vs id2label", "{" + vit + R"(,"image_size":32,"num_labels":3,"id2label":{"0":"a","1":"b"}})",
       "num_labels 3 differs from the 2 classes id2label names"},
      {"dropout NaN-like", "{" + gpt2 + R"(,"resid_pdrop":"0.1"})", "resid_pdrop: expected a number, got a string"},
      {"dropout of 1", "{" + gpt2 + R"(,"attn_pdrop":1.0})", "dropout probabilities must be below 1"},
      {"negative dropout", "{" + gpt2 + R"(,"embd_pdrop":-0.5})", "embd_pdrop: must be a number in [0, 1]"},
      {"tie not a bool", "{" + llama + R"(,"tie_word_embeddings":"yes"})", "tie_word_embeddings: expected true or false, got a string"},
      {"bad torch_dtype", "{" + llama + R"(,"torch_dtype":"float8"})", "torch_dtype: 'float8' is not one of float32, float16, bfloat16"},
      {"rope_theta negative", "{" + llama + R"(,"rope_theta":-1})", "rope_theta: must be a number in"},
      {"rope_scaling a string", "{" + llama + R"(,"rope_scaling":"linear"})", "rope_scaling: expected an object"},
      {"mlp_bias", "{" + llama + R"(,"mlp_bias":true})", "mlp_bias: true is not supported"},
      {"experts per token above the experts", "{" + mixtral + R"(,"num_experts_per_tok":9})",
       "num_experts_per_tok: 9 exceeds the 8 experts of num_local_experts"},
      {"zero experts", "{" + mixtral + R"(,"num_local_experts":0})", "num_local_experts: must be a positive integer, got 0"},
      {"router noise", "{" + mixtral + R"(,"router_jitter_noise":0.1})", "router_jitter_noise: is not supported"},
      {"no expert width", R"({"model_type":"qwen3_moe","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256})",
       "moe_intermediate_size: missing"},
      {"dense layer past the last", "{" + qwen_moe + R"(,"mlp_only_layers":[0, 2]})", "mlp_only_layers: layer 2 is not among the 2 layers"},
      {"dense layers not a list", "{" + qwen_moe + R"(,"mlp_only_layers":3})", "mlp_only_layers: expected a list of layer indices"},
      {"negative dense layer", "{" + qwen_moe + R"(,"mlp_only_layers":[-1]})", "mlp_only_layers: expected non-negative integers"},
      {"softcap a string", R"({"model_type":"gemma2","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256,"attn_logit_softcapping":"50"})",
       "attn_logit_softcapping: expected a number, got a string"},
      {"query scalar zero", R"({"model_type":"gemma2","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256,"query_pre_attn_scalar":0})",
       "query_pre_attn_scalar: must be a number in"},
      {"negative aux coefficient", "{" + mixtral + R"(,"router_aux_loss_coef":-0.02})", "router_aux_loss_coef: must be a number in"},
      {"sliding window negative", R"({"model_type":"mistral","sliding_window":-1,"hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256})",
       "sliding_window: must be a positive integer, got -1"},
  };
}

TEST(HfConfig, DefectiveConfigsAreErrorsNamingTheField) {
  for (const BadConfig& c : bad_configs()) {
    auto parsed = models::parse_hf_config(c.json, "dir/config.json");
    ASSERT_FALSE(parsed.ok()) << c.name;
    const std::string& m = parsed.error().message;
    EXPECT_EQ(m.rfind("dir/config.json: ", 0), 0u) << c.name << ": " << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.name << ": " << m;
  }
}

// --- through the CLI ---------------------------------------------------------------------

std::string config_path(const std::string& file) { return (fs::path(MEMPLAN_CONFIG_DIR) / file).string(); }

nlohmann::json json_of(const std::string& args) {
  const auto r = run_cli(args + " --json", false);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json{};
}

TEST(HfConfigCli, ConfigAndZooNameGiveTheSameAnswer) {
  for (const auto& [config, name] : {std::pair{"gpt2.json", "gpt2"}, std::pair{"llama-2-7b.json", "llama2-7b"},
                                     std::pair{"vit-base-patch16-224.json", "vit-b16"}}) {
    const bool vision = std::string(name) == "vit-b16";
    const std::string shape = vision ? "" : " --seq 128";  // ViT at its 224 pixels: the published count
    const auto by_config = json_of("fit --config " + config_path(config) + shape + " --batch 2 --budget 80GiB");
    const auto by_name = json_of("fit --model " + std::string(name) + shape + " --batch 2 --budget 80GiB");
    ASSERT_TRUE(by_config.contains("arena_bytes")) << config;
    EXPECT_EQ(by_config["arena_bytes"], by_name["arena_bytes"]) << config;
    EXPECT_EQ(by_config["parameter_count"], by_name["parameter_count"]) << config;
    EXPECT_EQ(by_config["parameter_count"].get<std::int64_t>(), published_counts().at(config)) << config;
    EXPECT_EQ(by_config["model"].get<std::string>(), config_path(config));
  }
}

TEST(HfConfigCli, PlanAndCompareTakeAConfig) {
  const std::string small = config_path("gpt2.json") + " --seq 32 --batch 1";
  const auto plan = json_of("plan --config " + small);
  ASSERT_TRUE(plan.contains("arena_bytes"));
  const auto compare = json_of("compare --steps 1 --config " + small);
  ASSERT_TRUE(compare.contains("planned_arena_bytes"));
  EXPECT_EQ(plan["arena_bytes"], compare["planned_arena_bytes"]);
  EXPECT_GT(compare["caching"]["reserved_peak_bytes"].get<Bytes>(), 0);
  // The same replay as the zoo name's (a second GPT-2 compare: the normal build only, as it takes
  // seconds under the sanitizers and runs the same code).
  if (testing::kSanitized) return;
  const auto by_name = json_of("compare --steps 1 --model gpt2 --seq 32 --batch 1");
  EXPECT_EQ(compare["caching"]["reserved_peak_bytes"], by_name["caching"]["reserved_peak_bytes"]);
  EXPECT_EQ(compare["expandable"]["reserved_peak_bytes"], by_name["expandable"]["reserved_peak_bytes"]);
}

// --moe-capacity-factor sets the slots each expert plans for: more slots, more activation bytes;
// 0 (every token a slot in every expert) the most. The same factor reaches plan, fit and compare.
TEST(HfConfigCli, MoeCapacityFactorSetsTheExpertSlotsPlanned) {
  const std::string model = "--config " + config_path("mixtral-8x7b.json") + " --seq 32 --batch 1 --dtype bf16";
  auto arena = [&](const std::string& factor) {
    return json_of("plan " + model + factor)["arena_bytes"].get<Bytes>();
  };
  const Bytes balanced = arena(""), roomy = arena(" --moe-capacity-factor 1.25"), dropless = arena(" --moe-capacity-factor 0");
  EXPECT_EQ(balanced, arena(" --moe-capacity-factor 1"));
  EXPECT_LT(balanced, roomy);
  EXPECT_LT(roomy, dropless);
  // The plan says what it assumes of the routing (on stderr).
  const auto said = run_cli("plan " + model + " --moe-capacity-factor 1.25");
  EXPECT_NE(said.output.find("note: mixture of experts: 8 experts, 2 per token; each expert takes 10 of the 32 tokens of a "
                             "step (capacity factor 1.25 of a balanced 8); token copies routed past an expert's slots are "
                             "dropped for it"),
            std::string::npos)
      << said.output;
  EXPECT_NE(run_cli("plan " + model + " --moe-capacity-factor 0").output.find("each expert has a slot for every one of the 32 tokens"),
            std::string::npos);
  if (testing::kSanitized) return;  // the same flag function; a 47B model's replay takes seconds there
  EXPECT_EQ(json_of("compare --steps 1 " + model + " --moe-capacity-factor 1.25")["planned_arena_bytes"].get<Bytes>(), roomy);
}

// docs/mixture_of_experts.md's hand calculation, against the plan: Mixtral-8x7B, one sequence of
// 4096 tokens, bf16 with AdamW, capacity factor 1.25 (1280 slots per expert). The figures are the
// document's, worked out from the shapes by hand, not read from memplan.
TEST(HfConfigCli, MoePlanHoldsTheHandCalculatedBytes) {
  const auto plan = json_of("plan --config " + config_path("mixtral-8x7b.json") +
                            " --dtype bf16 --batch 1 --seq 4096 --moe-capacity-factor 1.25 --device cuda");
  ASSERT_TRUE(plan.contains("buffers"));
  const std::map<std::string, Bytes> per_layer = {
      {"router", 65'536},           {"router.probs", 65'536},          {"gates", 65'536},
      {"dispatch", 83'886'080},     {"experts.gate_proj", 293'601'280},
      {"experts.up_proj", 293'601'280}, {"experts.glu", 293'601'280},  {"experts.down_proj", 83'886'080},
      {"combine", 33'554'432},
  };
  for (int layer : {0, 31}) {
    const std::string prefix = "layers." + std::to_string(layer) + ".mlp.";
    std::map<std::string, Bytes> planned;
    Bytes total = 0;
    for (const auto& b : plan["buffers"]) {
      const std::string name = b["tensor"].get<std::string>();
      if (name.rfind(prefix, 0) != 0 || b["persistent"].get<bool>()) continue;
      planned[name.substr(prefix.size())] = b["size_bytes"].get<Bytes>();
      total += b["size_bytes"].get<Bytes>();
    }
    EXPECT_EQ(planned, per_layer) << "layer " << layer;
    EXPECT_EQ(total, Bytes{1'082'327'040}) << "layer " << layer;
  }
  EXPECT_EQ(plan["bytes_by_role_at_peak"]["parameter"].get<Bytes>(), Bytes{93'405'585'408});  // 2 bytes each
  EXPECT_EQ(plan["bytes_by_role_at_peak"]["optimizer_state"].get<Bytes>(), Bytes{560'433'512'448});  // 4 + 4 + 4
}

// --verbose names the keys the reader left (on stderr: --json stays one document); without it
// nothing is said. Every plan command and train take it.
TEST(HfConfigCli, VerboseListsTheKeysMemplanDoesNotRead) {
  const std::string config = config_path("pythia-160m.json");
  const std::string expected = config + ": 5 keys memplan does not read (for model_type gpt_neox none changes what it plans): "
                               "architectures, bos_token_id, eos_token_id, initializer_range, use_cache";
  for (const std::string command : {"plan", "fit --device-memory 80GiB", "compare --steps 1"}) {
    if (testing::kSanitized && command != "plan") continue;  // the same function; replays take seconds there
    const auto quiet = run_cli(command + " --config " + config + " --seq 16 --batch 1 --json");
    EXPECT_EQ(quiet.output.find("does not read"), std::string::npos) << quiet.output;
    const auto verbose = run_cli(command + " --config " + config + " --seq 16 --batch 1 --json --verbose", false);
    EXPECT_EQ(verbose.exit_code, 0) << verbose.output;
    EXPECT_TRUE(nlohmann::json::accept(verbose.output)) << command << ": stdout is not one JSON document\n" << verbose.output;
    const auto both = run_cli(command + " --config " + config + " --seq 16 --batch 1 --json --verbose");
    EXPECT_NE(both.output.find(expected), std::string::npos) << command << "\n" << both.output;
  }
}

TEST(HfConfigCli, FlagsThatDoNotFitTheConfigAreUsageErrors) {
  struct Case {
    std::string args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"fit --budget 1GiB --config " + config_path("gpt2.json") + " --model gpt2", "excludes"},
      {"fit --budget 1GiB --config " + config_path("gpt2.json") + " --seq 2048", "exceeds the 1024 learned positions"},
      {"fit --budget 1GiB --config " + config_path("gpt2.json") + " --image-size 224", "--image-size applies to vision models"},
      {"plan --config " + config_path("vit-base-patch16-224.json") + " --seq 16", "--seq applies to language models"},
      {"plan --config " + config_path("vit-base-patch16-224.json") + " --image-size 100", "not a multiple of the patch size 16"},
      {"plan --config " + config_path("llama-2-7b.json") + " --dtype i32", "--dtype"},
      {"compare --config /nonexistent/config.json", "/nonexistent/config.json"},
      {"plan --config " + config_path("llama-2-7b.json") + " --moe-capacity-factor 1.25",
       "--moe-capacity-factor applies to mixtures of experts (mixtral, qwen2_moe, qwen3_moe); " + config_path("llama-2-7b.json") +
           " is a llama without experts"},
      {"plan --config " + config_path("mixtral-8x7b.json") + " --moe-capacity-factor -1", "--moe-capacity-factor"},
  };
  for (const Case& c : cases) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace memplan
