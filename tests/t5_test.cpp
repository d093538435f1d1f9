// T5, the encoder-decoder (models/t5.h) and its config reader (models/hf_config.h): the relative
// position buckets and a whole small model's loss, logits and gradients against PyTorch
// (tests/golden/make_t5_golden.py), the gradients against central finite differences, the shapes
// transformers gives its parameters, and the configs it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/graph/autograd.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/t5.h"
#include "tests/golden_util.h"
#include "tests/test_util.h"

namespace memplan {
namespace {

using models::T5Config;
using testing::count_ops;
using testing::parameter_shapes;

std::vector<float> read(const runtime::Executor& e, TensorId id) {
  std::vector<float> v(static_cast<std::size_t>(e.graph().tensor(id).shape.numel()));
  e.read_values(id, v.data());
  return v;
}

void set_ids(runtime::Executor& e, const graph::Graph& g, const std::string& name, const std::vector<std::int32_t>& ids) {
  e.set_input(g.find(name), ids.data(), static_cast<Bytes>(ids.size() * sizeof(std::int32_t)));
}

// transformers' buckets (torch's float32 log) for every distance within 600 either way, at T5's
// settings and the small cases': the exact, logarithmic and last buckets, both directions.
TEST(T5, RelativePositionBucketsAreTransformers) {
  const nlohmann::json golden = testing::load_golden("t5_golden.json");
  ASSERT_EQ(golden["buckets"].size(), 4u);
  for (const auto& table : golden["buckets"]) {
    const std::int64_t buckets = table["buckets"].get<std::int64_t>(), max_distance = table["max_distance"].get<std::int64_t>();
    const bool bidirectional = table["bidirectional"].get<bool>();
    const std::vector<std::int64_t> values = table["values"].get<std::vector<std::int64_t>>();
    std::int64_t distance = table["first"].get<std::int64_t>();
    for (std::int64_t expected : values) {
      ASSERT_EQ(graph::relative_position_bucket(distance, bidirectional, buckets, max_distance), expected)
          << "distance " << distance << ", " << buckets << " buckets up to " << max_distance
          << (bidirectional ? " (bidirectional)" : " (causal)");
      ++distance;
    }
  }
}

T5Config config_of(const nlohmann::json& c) {
  T5Config t;
  t.vocab = c["vocab"].get<std::int64_t>();
  t.width = c["width"].get<std::int64_t>();
  t.head_size = c["head_size"].get<std::int64_t>();
  t.heads = c["heads"].get<std::int64_t>();
  t.ffn = c["ffn"].get<std::int64_t>();
  t.layers = c["layers"].get<std::int64_t>();
  t.decoder_layers = c["decoder_layers"].get<std::int64_t>();
  t.buckets = c["buckets"].get<std::int64_t>();
  t.max_distance = c["max_distance"].get<std::int64_t>();
  t.seq = c["seq"].get<std::int64_t>();
  t.target_seq = c["target_seq"].get<std::int64_t>();
  const std::string act = c["act"].get<std::string>();
  t.act = act == "relu" ? models::Activation::relu : act == "gelu" ? models::Activation::gelu : models::Activation::silu;
  t.gated = c["gated"].get<bool>();
  t.tied_head = c["tied"].get<bool>();
  t.dropout = 0.0f;
  return t;
}

// A whole T5ForConditionalGeneration step: a tied ReLU model (distances past max_distance, more
// encoder than decoder blocks) and an untied gated-SiLU one; loss, logits and every gradient.
TEST(T5, WholeModelMatchesPyTorch) {
  const nlohmann::json golden = testing::load_golden("t5_golden.json");
  ASSERT_EQ(golden["cases"].size(), 2u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    graph::Graph g = models::build_t5(config_of(c), c["batch"].get<std::int64_t>());
    graph::append_backward(g, g.loss);
    g.retained.push_back(g.output);
    for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);
    testing::CpuRun run(g);
    run.executor.initialize_persistent(1);
    const auto weights = c["weights"].get<std::map<std::string, std::vector<float>>>();
    ASSERT_EQ(weights.size(), g.parameters().size());
    for (TensorId p : g.parameters()) {
      ASSERT_TRUE(weights.count(g.tensor(p).name)) << g.tensor(p).name;
      run.executor.write_values(p, weights.at(g.tensor(p).name).data());
    }
    set_ids(run.executor, g, "x", c["x"].get<std::vector<std::int32_t>>());
    set_ids(run.executor, g, "decoder_x", c["decoder_x"].get<std::vector<std::int32_t>>());
    set_ids(run.executor, g, "labels", c["labels"].get<std::vector<std::int32_t>>());
    ASSERT_TRUE(run.executor.run_step().ok());
    EXPECT_NEAR(read(run.executor, g.loss)[0], c["loss"].get<double>(), 1e-5 * (1.0 + std::abs(c["loss"].get<double>())));
    testing::expect_close(read(run.executor, g.output), c["logits"].get<std::vector<float>>(), "logits", 1e-5f, 1e-4f);
    for (TensorId p : g.parameters()) {
      const std::string& n = g.tensor(p).name;
      testing::expect_close(read(run.executor, g.tensor(p).grad), c["grads"][n].get<std::vector<float>>(), "d loss / d " + n,
                            1e-5f, 1e-4f);
    }
  }
}

// The gradients of a T5 with a gated GELU (not in the golden file) against central differences of
// the loss, up to five elements of every parameter.
TEST(T5, EveryParametersGradientMatchesCentralFiniteDifferences) {
  T5Config c;
  c.vocab = 9;
  c.width = 8;
  c.heads = 2;
  c.head_size = 3;
  c.ffn = 10;
  c.layers = 1;
  c.decoder_layers = 1;
  c.buckets = 6;
  c.max_distance = 4;
  c.seq = 6;
  c.target_seq = 5;
  c.act = models::Activation::gelu;
  c.gated = true;
  c.dropout = 0.0f;
  graph::Graph g = models::build_t5(c, 2);
  graph::append_backward(g, g.loss);
  for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);
  testing::CpuRun run(g);
  run.executor.initialize_persistent(1);
  std::uint64_t seed = 21;
  for (TensorId p : g.parameters()) {
    auto values = testing::random_values(static_cast<std::size_t>(g.tensor(p).shape.numel()), seed++, 0.5f);
    run.executor.write_values(p, values.data());
  }
  std::vector<std::int32_t> x(12), y(10), labels(10);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int32_t>((3 * i + 1) % 9);
  for (std::size_t i = 0; i < y.size(); ++i) {
    y[i] = static_cast<std::int32_t>((5 * i + 2) % 9);
    labels[i] = static_cast<std::int32_t>((7 * i + 4) % 9);
  }
  auto loss_now = [&] {
    set_ids(run.executor, g, "x", x);
    set_ids(run.executor, g, "decoder_x", y);
    set_ids(run.executor, g, "labels", labels);
    EXPECT_TRUE(run.executor.run_step().ok());
    return double(read(run.executor, g.loss)[0]);
  };
  EXPECT_GT(testing::expect_gradients_match_central_differences(run.executor, loss_now).checked, 100);
}

// Flan-T5-base as transformers lays it out: the gated GELU's two input projections, the untied
// head, one relative bias table per stack, cross-attention over the encoder's length.
TEST(T5, FlanT5BaseHasTransformersShapes) {
  auto c = models::shipped_config("flan-t5-base.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c.value().describe(),
            "t5 (encoder-decoder): 12 encoder and 12 decoder layers, width 768, 12 heads of 64, GELU-gated MLP 2048, "
            "vocab 32128, relative position buckets 32 up to 128, untied lm_head, materialized attention");
  models::ZooOptions o;
  o.seq = 64;
  o.target_seq = 16;
  const graph::Graph g = models::build_hf_forward(c.value(), 2, o);
  const auto shapes = parameter_shapes(g);
  EXPECT_EQ(shapes.at("shared.weight"), (graph::Shape{32128, 768}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (graph::Shape{32128, 768}));
  EXPECT_EQ(shapes.at("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"), (graph::Shape{32, 12}));
  EXPECT_EQ(shapes.at("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"), (graph::Shape{32, 12}));
  EXPECT_EQ(shapes.count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"), 0u);
  EXPECT_EQ(shapes.at("decoder.block.11.layer.2.DenseReluDense.wi_0.weight"), (graph::Shape{2048, 768}));
  EXPECT_EQ(shapes.at("decoder.block.11.layer.2.DenseReluDense.wi_1.weight"), (graph::Shape{2048, 768}));
  EXPECT_EQ(shapes.at("decoder.block.11.layer.1.EncDecAttention.k.weight"), (graph::Shape{768, 768}));
  EXPECT_EQ(shapes.at("decoder.final_layer_norm.weight"), (graph::Shape{768}));
  EXPECT_EQ(count_ops(g, graph::OpKind::relative_position_bias), 2);
  EXPECT_EQ(count_ops(g, graph::OpKind::attention), 0) << "T5's attention is materialized";
  EXPECT_EQ(g.tensor(g.find("x")).shape, (graph::Shape{2, 64}));
  EXPECT_EQ(g.tensor(g.find("decoder_x")).shape, (graph::Shape{2, 16}));
  EXPECT_EQ(g.tensor(g.output).shape, (graph::Shape{32, 32128}));
  // The cross-attention's scores are [B, H, target, source].
  EXPECT_EQ(g.tensor(g.find("decoder.block.0.layer.1.EncDecAttention.scores")).shape, (graph::Shape{2, 12, 16, 64}));
  // T5 v1.0 (t5-base): a ReLU MLP of one input projection and the head tied to the embedding.
  const graph::Graph base = models::build_hf_forward(models::shipped_config("t5-base.json").value(), 2, o);
  const auto base_shapes = parameter_shapes(base);
  EXPECT_EQ(base_shapes.at("encoder.block.0.layer.1.DenseReluDense.wi.weight"), (graph::Shape{3072, 768}));
  EXPECT_EQ(base_shapes.count("lm_head.weight"), 0u);
  EXPECT_GT(count_ops(base, graph::OpKind::relu), 0);
}

// Bad configs exit with the key named.
TEST(T5, BadConfigsAreRefusedNamingTheKey) {
  const nlohmann::json good = nlohmann::json::parse(R"({"model_type":"t5","vocab_size":100,"d_model":32,"d_kv":8,
      "d_ff":64,"num_heads":4,"num_layers":2})");
  ASSERT_TRUE(models::parse_hf_config(good.dump(), "t5.json").ok());
  auto refused = [&](const char* key, const nlohmann::json& value, const std::string& expected) {
    nlohmann::json j = good;
    if (value.is_null()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    auto r = models::parse_hf_config(j.dump(), "t5.json");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.error().message.find(expected), std::string::npos) << r.error().message;
  };
  refused("d_model", nullptr, "d_model");
  refused("num_heads", 0, "num_heads");
  refused("d_kv", -8, "d_kv");
  refused("feed_forward_proj", "gated-tanh", "feed_forward_proj");
  refused("feed_forward_proj", "fast-relu", "feed_forward_proj");
  refused("is_gated_act", true, "is_gated_act");
  refused("dense_act_fn", "silu", "dense_act_fn");
  refused("relative_attention_num_buckets", 3, "relative_attention_num_buckets");
  refused("relative_attention_max_distance", 8, "relative_attention_max_distance");
  refused("is_encoder_decoder", false, "is_encoder_decoder");
  refused("dropout_rate", 1.0, "dropout_rate");
  // A gated-gelu config carries dense_act_fn gelu_new, as transformers writes it.
  nlohmann::json gated = good;
  gated["feed_forward_proj"] = "gated-gelu";
  gated["dense_act_fn"] = "gelu_new";
  gated["is_gated_act"] = true;
  auto r = models::parse_hf_config(gated.dump(), "t5.json");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r.value().t5.gated);
}

}  // namespace
}  // namespace memplan
