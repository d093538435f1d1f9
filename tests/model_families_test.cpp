// The decoder families read from config.json beyond the first ones (models/hf_config.h): Gemma 3's
// local and global layers, Granite's multipliers, StarCoder2's plain GELU MLP with biases and its
// dropout; the families memplan does not plan are refused naming what is missing.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include <cmath>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/zoo.h"
#include "tests/test_util.h"

namespace memplan::model_families_test {
namespace {

using models::HfConfig;
using testing::count_ops;
using testing::op_named;
using testing::parameter_count;
using testing::parameter_shapes;

HfConfig parse(const nlohmann::json& j) {
  auto c = models::parse_hf_config(j.dump(), "config.json");
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? c.value() : HfConfig{};
}

graph::Graph build(const HfConfig& c, bool training = true, std::int64_t seq = 16) {
  models::ZooOptions o;
  o.seq = seq;
  return models::build_hf_forward(c, 1, o, training);
}

// A small decoder config of each family (sizes only; the family's own keys added by each test).
nlohmann::json small(const std::string& model_type) {
  return {{"model_type", model_type}, {"hidden_size", 64},      {"num_hidden_layers", 7}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"intermediate_size", 96}, {"vocab_size", 50},       {"max_position_embeddings", 128}};
}

// Gemma 3: layers 5 and 11 of 12 global (sliding_window_pattern 6), the rest windowed and rotating
// with rope_local_base_freq; Gemma-2's four norms a layer with per-head query and key norms, a
// head size of its own, no soft-capping unless asked.
TEST(ModelFamilies, Gemma3AlternatesFiveLocalLayersWithOneGlobal) {
  nlohmann::json j = small("gemma3_text");
  j["num_hidden_layers"] = 12;
  j["head_dim"] = 32;
  j["sliding_window"] = 8;
  j["rope_theta"] = 1000000.0;
  j["rope_local_base_freq"] = 10000.0;
  const HfConfig c = parse(j);
  for (std::int64_t l = 0; l < 12; ++l) {
    EXPECT_EQ(c.llama.windowed(l), l != 5 && l != 11) << "layer " << l;
  }
  const graph::Graph g = build(c);
  for (std::int64_t l : {0, 4, 5, 11}) {
    const std::string a = "layers." + std::to_string(l) + ".self_attn.q.rope";
    const graph::Op* rope = op_named(g, graph::OpKind::rotary, a);
    ASSERT_NE(rope, nullptr) << a;
    EXPECT_FLOAT_EQ(rope->attrs.rope_base, l == 5 || l == 11 ? 1e6f : 1e4f) << a;
  }
  const std::map<std::string, graph::Shape> shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.weight"), (graph::Shape{4 * 32, 64}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_norm.weight"), (graph::Shape{32}));
  EXPECT_EQ(shapes.at("layers.0.post_feedforward_layernorm.weight"), (graph::Shape{64}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "tied by default";
  EXPECT_EQ(count_ops(g, graph::OpKind::tanh), 0) << "no soft-capping by default";
  EXPECT_FLOAT_EQ(op_named(g, graph::OpKind::attention, "layers.0.self_attn.fused")->attrs.alpha, 1.0f / 16.0f);
  // layer_types, where given, decide instead of the pattern.
  j["layer_types"] = nlohmann::json::array();
  for (int l = 0; l < 12; ++l) j["layer_types"].push_back(l % 2 ? "full_attention" : "sliding_attention");
  const HfConfig typed = parse(j);
  for (std::int64_t l = 0; l < 12; ++l) EXPECT_EQ(typed.llama.windowed(l), l % 2 == 0) << "layer " << l;
  j["layer_types"][3] = "chunked_attention";
  auto refused = models::parse_hf_config(j.dump(), "gemma3.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("layer_types: 'chunked_attention' is not sliding_attention or full_attention"),
            std::string::npos)
      << refused.error().message;
  j["layer_types"].erase(3);
  refused = models::parse_hf_config(j.dump(), "gemma3.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("lists 11 layers; num_hidden_layers is 12"), std::string::npos) << refused.error().message;
}

// Granite: llama's parameters, with the embeddings, each sublayer's output, the scores and the
// logits scaled by the config's multipliers.
TEST(ModelFamilies, GraniteScalesEmbeddingsResidualsScoresAndLogits) {
  nlohmann::json j = small("granite");
  j["embedding_multiplier"] = 12.0;
  j["residual_multiplier"] = 0.22;
  j["attention_multiplier"] = 0.015625;
  j["logits_scaling"] = 8.0;
  const HfConfig c = parse(j);
  const graph::Graph g = build(c);
  const graph::Op* emb = op_named(g, graph::OpKind::scale, "residual0.multiplied");
  ASSERT_NE(emb, nullptr);
  EXPECT_FLOAT_EQ(emb->attrs.alpha, 12.0f);
  const graph::Op* res = op_named(g, graph::OpKind::scale, "layers.3.mlp_out.multiplied");
  ASSERT_NE(res, nullptr);
  EXPECT_FLOAT_EQ(res->attrs.alpha, 0.22f);
  EXPECT_EQ(count_ops(g, graph::OpKind::scale), 1 + 2 * 7 + 1);
  EXPECT_FLOAT_EQ(op_named(g, graph::OpKind::attention, "layers.0.self_attn.fused")->attrs.alpha, 0.015625f);
  EXPECT_FLOAT_EQ(op_named(g, graph::OpKind::scale, "logits")->attrs.alpha, 0.125f);
  // The multipliers hold no parameters: the same config as llama has the same count.
  nlohmann::json as_llama = small("llama");
  EXPECT_EQ(parameter_count(g), parameter_count(build(parse(as_llama))));
  // GraniteConfig's defaults: every multiplier 1, so scores are scaled by 1, not head_size^-1/2.
  const graph::Graph plain = build(parse(small("granite")));
  EXPECT_FLOAT_EQ(op_named(plain, graph::OpKind::attention, "layers.0.self_attn.fused")->attrs.alpha, 1.0f);
  EXPECT_EQ(count_ops(plain, graph::OpKind::scale), 0);
}

// StarCoder2: LayerNorms with biases, biases on q, k, v, o and the plain MLP's c_fc and c_proj,
// tied embeddings, a window on every layer; its dropout rates put masks in the training graph only.
TEST(ModelFamilies, Starcoder2IsAPlainGeluDecoderWithBiasesAndDropout) {
  nlohmann::json j = small("starcoder2");
  j["sliding_window"] = 8;
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["embedding_dropout"] = 0.1;
  j["residual_dropout"] = 0.1;
  j["attention_dropout"] = 0.1;
  const HfConfig c = parse(j);
  for (std::int64_t l = 0; l < 7; ++l) EXPECT_TRUE(c.llama.windowed(l));
  const graph::Graph g = build(c);
  const std::map<std::string, graph::Shape> shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.mlp.c_fc.weight"), (graph::Shape{96, 64}));
  EXPECT_EQ(shapes.at("layers.0.mlp.c_fc.bias"), (graph::Shape{96}));
  EXPECT_EQ(shapes.at("layers.0.mlp.c_proj.weight"), (graph::Shape{64, 96}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.o_proj.bias"), (graph::Shape{64}));
  EXPECT_EQ(shapes.at("layers.0.input_layernorm.bias"), (graph::Shape{64}));
  EXPECT_EQ(shapes.count("layers.0.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "Starcoder2Config ties by default";
  EXPECT_EQ(count_ops(g, graph::OpKind::gelu), 7);
  // One mask for the embeddings and two a layer; the attention drops its probabilities inside.
  EXPECT_EQ(count_ops(g, graph::OpKind::dropout_mask), 1 + 2 * 7);
  EXPECT_FLOAT_EQ(op_named(g, graph::OpKind::attention, "layers.0.self_attn.fused")->attrs.dropout, 0.1f);
  const graph::Graph eval = build(c, /*training=*/false);
  EXPECT_EQ(count_ops(eval, graph::OpKind::dropout_mask), 0);
  EXPECT_FLOAT_EQ(op_named(eval, graph::OpKind::attention, "layers.0.self_attn.fused")->attrs.dropout, 0.0f);
  EXPECT_EQ(parameter_count(eval), parameter_count(g));
  // use_bias false drops every bias (the norms keep theirs).
  j["use_bias"] = false;
  const graph::Graph unbiased = build(parse(j));
  const std::int64_t biases = 7 * (64 + 32 + 32 + 64 + 96 + 64);
  EXPECT_EQ(parameter_count(g) - parameter_count(unbiased), biases);
}

// StableLM: LayerNorms, a quarter of each head rotating, q/k/v biases.
TEST(ModelFamilies, StablelmRotatesAQuarterOfEachHeadUnderLayerNorms) {
  nlohmann::json j = small("stablelm");
  j["use_qkv_bias"] = true;
  const HfConfig c = parse(j);
  EXPECT_EQ(c.llama.rotary_dims, 4) << "a quarter of 16 channels";
  const graph::Graph g = build(c);
  const std::map<std::string, graph::Shape> shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.0.self_attn.q_proj.bias"), (graph::Shape{64}));
  EXPECT_EQ(shapes.count("layers.0.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(shapes.at("norm.bias"), (graph::Shape{64}));
  EXPECT_EQ(count_ops(g, graph::OpKind::layer_norm), 2 * 7 + 1);
  j["qk_layernorm"] = true;
  auto refused = models::parse_hf_config(j.dump(), "stablelm.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("qk_layernorm: true is not supported"), std::string::npos) << refused.error().message;
}

// OLMoE: 64 experts of intermediate_size in every layer, 8 per token, not renormalised, with
// whole-projection q/k norms.
TEST(ModelFamilies, OlmoeRoutesEveryLayerThroughExpertsOfIntermediateSize) {
  nlohmann::json j = small("olmoe");
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  const HfConfig c = parse(j);
  EXPECT_EQ(c.llama.moe.experts, 8);
  EXPECT_EQ(c.llama.moe.expert_ffn, 96);
  EXPECT_FALSE(c.llama.moe.normalize_top_k);
  EXPECT_EQ(c.llama.qk_norm, models::LlamaConfig::QkNorm::whole);
  const graph::Graph g = build(c);
  const std::map<std::string, graph::Shape> shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("layers.6.mlp.experts.up_proj.weight"), (graph::Shape{8, 96, 64}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.k_norm.weight"), (graph::Shape{32}));
  EXPECT_EQ(shapes.count("layers.0.mlp.up_proj.weight"), 0u) << "no dense MLP";
  j["clip_qkv"] = 8.0;
  EXPECT_FALSE(models::parse_hf_config(j.dump(), "olmoe.json").ok());
}

// A Gemma 3 image-and-text config: its text_config is planned, and the description says what is
// not counted.
TEST(ModelFamilies, MultimodalGemma3PlansItsTextDecoderAndSaysTheVisionTowerIsNotCounted) {
  nlohmann::json text = small("gemma3_text");
  text.erase("model_type");  // as the 4B+ configs leave it to the wrapper
  text["head_dim"] = 16;
  const nlohmann::json j = {{"model_type", "gemma3"}, {"text_config", text}, {"vision_config", {{"hidden_size", 1152}}}};
  const HfConfig c = parse(j);
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_NE(c.describe().find("not counted: the vision tower (vision_config) and the multimodal projector"), std::string::npos)
      << c.describe();
  nlohmann::json alone = small("gemma3_text");
  alone["head_dim"] = 16;
  EXPECT_EQ(parameter_count(build(c)), parameter_count(build(parse(alone))));
  auto refused = models::parse_hf_config(R"({"model_type": "gemma3"})", "gemma3.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("text_config: missing"), std::string::npos) << refused.error().message;
}

// DeepSeek-V3 as its config.json describes it (its layers cut to 5): latent attention's
// projections, three dense layers, then 256 experts of 2048 with a shared expert, routed by
// sigmoid scores in 8 groups of which 4 are used (scored by their two best), with the choice bias.
TEST(ModelFamilies, DeepseekV3HasLatentAttentionAndGroupRoutedExperts) {
  nlohmann::json j = nlohmann::json::parse(models::shipped_configs().front().text);  // replaced below
  for (const models::ShippedConfig& c : models::shipped_configs()) {
    if (c.file == "deepseek-v3.json") j = nlohmann::json::parse(c.text);
  }
  ASSERT_EQ(j["model_type"], "deepseek_v3");
  j["num_hidden_layers"] = 5;
  const HfConfig c = parse(j);
  EXPECT_NE(c.describe().find("latent attention (kv_lora_rank 512, q_lora_rank 1536)"), std::string::npos) << c.describe();
  EXPECT_NE(c.describe().find("not counted: the multi-token prediction module"), std::string::npos) << c.describe();
  const graph::Graph g = build(c, /*training=*/true, 8);
  const std::map<std::string, graph::Shape> shapes = parameter_shapes(g);
  const std::map<std::string, graph::Shape> expected = {
      {"layers.0.self_attn.q_a_proj.weight", {1536, 7168}},
      {"layers.0.self_attn.q_a_layernorm.weight", {1536}},
      {"layers.0.self_attn.q_b_proj.weight", {128 * 192, 1536}},
      {"layers.0.self_attn.kv_a_proj_with_mqa.weight", {512 + 64, 7168}},
      {"layers.0.self_attn.kv_a_layernorm.weight", {512}},
      {"layers.0.self_attn.kv_b_proj.weight", {128 * (128 + 128), 512}},
      {"layers.0.self_attn.o_proj.weight", {7168, 128 * 128}},
      {"layers.2.mlp.gate_proj.weight", {18432, 7168}},
      {"layers.3.mlp.gate.weight", {256, 7168}},
      {"layers.3.mlp.gate.e_score_correction_bias", {256}},
      {"layers.3.mlp.experts.down_proj.weight", {256, 7168, 2048}},
      {"layers.3.mlp.shared_experts.up_proj.weight", {2048, 7168}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_EQ(shapes.count(name), 1u) << name;
    EXPECT_EQ(shapes.at(name), shape) << name;
  }
  EXPECT_EQ(shapes.count("layers.3.mlp.gate_proj.weight"), 0u) << "layer 3 is a mixture";
  EXPECT_TRUE(g.tensor(g.find("layers.3.mlp.gate.e_score_correction_bias")).frozen);
  const graph::Op* route = op_named(g, graph::OpKind::moe_top_k, "layers.3.mlp.gates.chosen");
  ASSERT_NE(route, nullptr);
  EXPECT_EQ(route->inputs.size(), 2u) << "the choice bias";
  EXPECT_EQ(route->attrs.expert_groups, 8);
  EXPECT_EQ(route->attrs.top_groups, 4);
  EXPECT_TRUE(route->attrs.group_top2);
  EXPECT_TRUE(route->attrs.normalize);
  EXPECT_FLOAT_EQ(op_named(g, graph::OpKind::scale, "layers.3.mlp.gates")->attrs.alpha, 2.5f);
  EXPECT_EQ(count_ops(g, graph::OpKind::sigmoid), 2);
  // Scores scaled by qk_head_dim^-1/2 times YaRN's mscale squared: (0.1 ln 40 + 1)^2 / sqrt(192).
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(op_named(g, graph::OpKind::attention, "layers.0.self_attn.fused")->attrs.alpha,
              mscale * mscale / std::sqrt(192.0), 1e-6);
  // Serving caches the latent and the rotary key (tests/serve_plan_test.cpp has the bytes); its
  // 671B parameters in bf16 leave no room on one 80 GiB device.
  const auto serve = testing::run_cli("fit --model deepseek-v3 --serve --seq 4096 --dtype bf16 --device-memory 80GiB", true);
  EXPECT_EQ(serve.exit_code, 1) << serve.output;
  EXPECT_NE(serve.output.find("kv_lora_rank 512 + qk_rope 64"), std::string::npos) << serve.output;
}

// OPT-125M and SantaCoder as shipped: learned position tables (OPT's with its offset of 2 rows),
// no rotary, their own module names; GPT-BigCode's one K/V head.
TEST(ModelFamilies, OptAndGptBigCodeLearnPositionsWithoutRotary) {
  auto shipped = [](const std::string& file) {
    for (const models::ShippedConfig& c : models::shipped_configs()) {
      if (c.file == file) return parse(nlohmann::json::parse(c.text));
    }
    ADD_FAILURE() << file;
    return HfConfig{};
  };
  const HfConfig opt = shipped("opt-125m.json");
  const graph::Graph g = build(opt, true, 32);
  const std::map<std::string, graph::Shape> shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("embed_positions.weight"), (graph::Shape{2050, 768}));
  EXPECT_EQ(shapes.at("layers.0.mlp.fc1.weight"), (graph::Shape{3072, 768}));
  EXPECT_EQ(shapes.at("layers.0.self_attn.out_proj.bias"), (graph::Shape{768}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);
  EXPECT_EQ(count_ops(g, graph::OpKind::rotary), 0);
  EXPECT_EQ(count_ops(g, graph::OpKind::relu), 12);
  const graph::Op* used = op_named(g, graph::OpKind::slice, "embed_positions.used");
  ASSERT_NE(used, nullptr);
  EXPECT_EQ(used->attrs.start, 2) << "OPT's positions start at row 2";
  EXPECT_EQ(count_ops(g, graph::OpKind::dropout_mask), 2 * 12) << "dropout 0.1 on each sublayer's output";
  const HfConfig santa = shipped("santacoder.json");
  EXPECT_EQ(santa.llama.kv_heads, 1);
  const graph::Graph s = build(santa, true, 32);
  const std::map<std::string, graph::Shape> santa_shapes = parameter_shapes(s);
  EXPECT_EQ(santa_shapes.at("embed_positions.weight"), (graph::Shape{2048, 2048}));
  EXPECT_EQ(santa_shapes.at("layers.0.self_attn.k_proj.weight"), (graph::Shape{128, 2048}));
  EXPECT_EQ(santa_shapes.at("layers.0.self_attn.c_proj.weight"), (graph::Shape{2048, 2048}));
  EXPECT_EQ(santa_shapes.at("layers.0.mlp.c_fc.weight"), (graph::Shape{8192, 2048}));
  // A sequence past the learned table is refused by name.
  const auto long_seq = testing::run_cli("fit --model opt-125m --seq 4096 --device-memory 80GiB", true);
  EXPECT_EQ(long_seq.exit_code, 2);
  auto refused = models::parse_hf_config(R"({"model_type": "opt", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "ffn_dim": 96, "vocab_size": 50, "word_embed_proj_dim": 32})", "opt-350m.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("word_embed_proj_dim: differs from hidden_size"), std::string::npos) << refused.error().message;
}

// DeepSeek's choice of experts on one token of 8 experts in 4 groups of 2, worked by hand:
// probabilities 0.9 0.1 | 0.5 0.45 | 0.3 0.3 | 0.8 0.05, two experts a token.
TEST(ModelFamilies, DeepseekRoutingChoosesWithinTheBestGroupsAndByTheBias) {
  const std::vector<float> probs = {0.9f, 0.1f, 0.5f, 0.45f, 0.3f, 0.3f, 0.8f, 0.05f};
  auto route = [&](std::int64_t groups, std::int64_t top_groups, bool top2, const std::vector<float>& bias) {
    const graph::Shape shape{1, 8}, bias_shape{8};
    std::vector<float> p = probs, b = bias, gates(8, -1.0f);
    std::vector<kernels::TensorRef> in{{p.data(), &shape, graph::DType::f32}};
    if (!b.empty()) in.push_back({b.data(), &bias_shape, graph::DType::f32});
    const std::vector<kernels::TensorRef> out{{gates.data(), &shape, graph::DType::f32}};
    graph::OpAttrs a;
    a.top_k = 2;
    a.expert_groups = groups;
    a.top_groups = top_groups;
    a.group_top2 = top2;
    kernels::find_kernel(graph::OpKind::moe_top_k, kernels::DeviceKind::cpu)(kernels::KernelCall{graph::OpKind::moe_top_k, &a, in, out, {}});
    return gates;
  };
  using V = std::vector<float>;
  // Plain top 2: experts 0 and 6.
  EXPECT_EQ(route(0, 0, false, {}), (V{0.9f, 0, 0, 0, 0, 0, 0.8f, 0}));
  // Groups scored by their two best (1.0, 0.95, 0.6, 0.85): groups 0 and 1 kept, so experts 0 and 2.
  EXPECT_EQ(route(4, 2, true, {}), (V{0.9f, 0, 0.5f, 0, 0, 0, 0, 0}));
  // Groups scored by their best (0.9, 0.5, 0.3, 0.8): groups 0 and 3, so experts 0 and 6.
  EXPECT_EQ(route(4, 2, false, {}), (V{0.9f, 0, 0, 0, 0, 0, 0.8f, 0}));
  // A bias of -1 on expert 6 moves the choice to expert 2; the gates stay the probabilities.
  EXPECT_EQ(route(0, 0, false, {0, 0, 0, 0, 0, 0, -1.0f, 0}), (V{0.9f, 0, 0.5f, 0, 0, 0, 0, 0}));
}

// Families memplan does not plan are refused naming what they need, never planned as something
// else: Mamba's state-space layers (state-spaces/mamba-130m-hf's keys), gpt-oss's attention sinks.
TEST(ModelFamilies, UnplannedFamiliesAreRefusedNamingWhatIsMissing) {
  const nlohmann::json mamba = {{"model_type", "mamba"}, {"hidden_size", 768}, {"num_hidden_layers", 24},
                                {"state_size", 16},      {"expand", 2},        {"conv_kernel", 4},
                                {"vocab_size", 50280}};
  auto refused = models::parse_hf_config(mamba.dump(), "mamba-130m-hf.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("model_type 'mamba' is not planned: memplan does not model state-space (Mamba) layers"),
            std::string::npos)
      << refused.error().message;
  refused = models::parse_hf_config(R"({"model_type": "gpt_oss", "hidden_size": 2880})", "gpt-oss-20b.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("attention sinks"), std::string::npos) << refused.error().message;
  refused = models::parse_hf_config(R"({"model_type": "no_such_family"})", "x.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("'no_such_family' is not supported (supported: gpt2, llama"), std::string::npos)
      << refused.error().message;
}

}  // namespace
}  // namespace memplan::model_families_test
