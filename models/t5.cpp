#include "memplan/models/t5.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"
#include "memplan/models/attention.h"

namespace memplan::models {
namespace {

using graph::InitSpec;
using graph::Shape;

const InitSpec kWeightInit{InitSpec::Kind::normal, 0.02f};
const InitSpec kOnes{InitSpec::Kind::ones, 0.0f};

void check_t5(const T5Config& c, std::int64_t batch) {
  auto positive = [](std::int64_t v) { return v > 0; };
  if (!positive(batch) || !positive(c.seq) || !positive(c.target_seq) || !positive(c.vocab) || !positive(c.width) ||
      !positive(c.heads) || !positive(c.head_size) || !positive(c.ffn) || !positive(c.layers) ||
      !positive(c.decoder_layers)) {
    throw graph::GraphError("t5: batch, sequence lengths, vocab, width, heads, head size, ffn and layer counts must be positive");
  }
}

// The two stacks over residual streams [rows, width], with transformers' parameter names.
class T5Builder {
 public:
  T5Builder(graph::Builder& b, const T5Config& c, std::int64_t batch)
      : b_(b), c_(c), B(batch), inner_(graph::checked_mul(c.heads, c.head_size)) {}

  TensorId param(const std::string& name, Shape shape, InitSpec init = kWeightInit) {
    return b_.parameter(name, std::move(shape), init, c_.dtype);
  }
  TensorId project(TensorId x, const std::string& name, std::int64_t out, std::int64_t in) {
    return b_.matmul(x, param(name + ".weight", {out, in}), false, true, name);
  }
  TensorId norm(TensorId x, const std::string& name) {
    return b_.rms_norm(x, param(name + ".weight", {c_.width}, kOnes), name, c_.norm_eps);
  }
  TensorId drop(TensorId x, const std::string& name) { return b_.dropout(x, c_.dropout, name); }

  // [B*T, H*D] -> [B, H, T, D]
  TensorId heads(TensorId x, std::int64_t tokens, const std::string& name) {
    return b_.permute(b_.reshape(x, {B, tokens, c_.heads, c_.head_size}, name + ".view"), {0, 2, 1, 3}, name + ".heads");
  }

  // Attention of queries from `x` [B*Tq, C] over keys and values from `kv` [B*Tk, C] (x itself
  // for self-attention), unscaled scores plus `bias` [H, Tq, Tk] (kNoTensor: none).
  TensorId attention(TensorId x, std::int64_t tq, TensorId kv, std::int64_t tk, bool causal, TensorId bias,
                     const std::string& n) {
    const TensorId q = heads(project(x, n + ".q", inner_, c_.width), tq, n + ".q");
    const TensorId k = heads(project(kv, n + ".k", inner_, c_.width), tk, n + ".k");
    const TensorId v = heads(project(kv, n + ".v", inner_, c_.width), tk, n + ".v");
    TensorId y = attention_block(b_, AttentionKind::materialized, q, k, v, causal, c_.dropout, n, /*scale=*/1.0f,
                                 /*softcap=*/0.0f, bias);
    y = b_.reshape(b_.permute(y, {0, 2, 1, 3}, n + ".merge"), {graph::checked_mul(B, tq), inner_}, n + ".merged");
    return project(y, n + ".o", c_.width, inner_);
  }

  // DenseReluDense / DenseGatedActDense: wo(dropout(act(wi x))) or wo(dropout(act(wi_0 x) * wi_1 x)).
  TensorId mlp(TensorId x, const std::string& n) {
    TensorId hidden;
    if (c_.gated) {
      const TensorId gate = project(x, n + ".wi_0", c_.ffn, c_.width);
      const TensorId up = project(x, n + ".wi_1", c_.ffn, c_.width);
      hidden = c_.act == Activation::silu ? b_.swiglu(gate, up, n + ".act")
                                           : b_.mul(apply_activation(b_, c_.act, gate, n + ".gate_act"), up, n + ".act");
    } else {
      hidden = apply_activation(b_, c_.act, project(x, n + ".wi", c_.ffn, c_.width), n + ".act");
    }
    return project(drop(hidden, n + ".dropout"), n + ".wo", c_.width, c_.ffn);
  }

  // h + dropout(sublayer(norm(h))): T5's residual around each pre-normed sublayer.
  template <typename F>
  TensorId residual(TensorId h, const std::string& n, F&& sublayer) {
    return b_.add(h, drop(sublayer(norm(h, n + ".layer_norm")), n + ".dropout"), n + ".residual");
  }

  TensorId embed(TensorId ids, TensorId table, std::int64_t tokens, const std::string& n) {
    const TensorId e = b_.embedding(ids, table, n + ".embed_tokens");  // [B, T, C]
    return drop(b_.reshape(e, {graph::checked_mul(B, tokens), c_.width}, n + ".rows"), n + ".embed_dropout");
  }

  TensorId encoder(TensorId ids, TensorId shared) {
    const std::int64_t T = c_.seq;
    TensorId h = embed(ids, shared, T, "encoder");
    const TensorId table = param("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", {c_.buckets, c_.heads});
    const TensorId bias = b_.relative_position_bias(table, T, T, /*bidirectional=*/true, c_.max_distance, "encoder.position_bias");
    for (std::int64_t l = 0; l < c_.layers; ++l) {
      const std::string n = "encoder.block." + std::to_string(l) + ".layer.";
      h = residual(h, n + "0", [&](TensorId x) { return attention(x, T, x, T, false, bias, n + "0.SelfAttention"); });
      h = residual(h, n + "1", [&](TensorId x) { return mlp(x, n + "1.DenseReluDense"); });
    }
    return drop(norm(h, "encoder.final_layer_norm"), "encoder.dropout");
  }

  TensorId decoder(TensorId ids, TensorId shared, TensorId encoded) {
    const std::int64_t T = c_.target_seq, S = c_.seq;
    TensorId h = embed(ids, shared, T, "decoder");
    const TensorId table = param("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", {c_.buckets, c_.heads});
    const TensorId bias = b_.relative_position_bias(table, T, T, /*bidirectional=*/false, c_.max_distance, "decoder.position_bias");
    for (std::int64_t l = 0; l < c_.decoder_layers; ++l) {
      const std::string n = "decoder.block." + std::to_string(l) + ".layer.";
      h = residual(h, n + "0", [&](TensorId x) { return attention(x, T, x, T, true, bias, n + "0.SelfAttention"); });
      h = residual(h, n + "1", [&](TensorId x) {
        return attention(x, T, encoded, S, false, kNoTensor, n + "1.EncDecAttention");
      });
      h = residual(h, n + "2", [&](TensorId x) { return mlp(x, n + "2.DenseReluDense"); });
    }
    return drop(norm(h, "decoder.final_layer_norm"), "decoder.dropout");
  }

 private:
  graph::Builder& b_;
  const T5Config& c_;
  const std::int64_t B;
  const std::int64_t inner_;  // heads * head_size
};

}  // namespace

graph::Graph build_t5(const T5Config& config, std::int64_t batch) {
  check_t5(config, batch);
  graph::Graph g;
  graph::Builder b(g);
  T5Builder t5(b, config, batch);
  const std::int64_t B = batch, C = config.width;
  const TensorId x = b.input("x", {B, config.seq}, graph::DType::i32);
  const TensorId decoder_x = b.input("decoder_x", {B, config.target_seq}, graph::DType::i32);
  const TensorId labels = b.input("labels", {graph::checked_mul(B, config.target_seq)}, graph::DType::i32);
  const TensorId shared = t5.param("shared.weight", {config.vocab, C}, InitSpec{InitSpec::Kind::normal, 1.0f});
  const TensorId encoded = t5.encoder(x, shared);
  TensorId h = t5.decoder(decoder_x, shared, encoded);
  TensorId head = shared;
  if (config.tied_head) {
    h = b.scale(h, 1.0f / std::sqrt(static_cast<float>(C)), "lm_head.rescale");  // transformers' d_model^-0.5
  } else {
    head = t5.param("lm_head.weight", {config.vocab, C});
  }
  g.output = b.matmul(h, head, false, true, "logits");  // [B*Tt, V]
  g.loss = b.cross_entropy(g.output, labels, "loss");
  return g;
}

}  // namespace memplan::models
