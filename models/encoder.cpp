#include "memplan/models/encoder.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"
#include "memplan/models/attention.h"

namespace memplan::models {
namespace {

using graph::InitSpec;

const InitSpec kWeightInit{InitSpec::Kind::normal, 0.02f};
const InitSpec kZeros{InitSpec::Kind::zeros, 0.0f};
const InitSpec kOnes{InitSpec::Kind::ones, 0.0f};

void check_encoder(const EncoderConfig& e, std::int64_t batch, std::int64_t tokens) {
  if (batch <= 0 || tokens <= 0 || e.layers <= 0 || e.width <= 0 || e.heads <= 0 || e.mlp <= 0) {
    throw graph::GraphError("encoder: batch, tokens, layers, width, heads and mlp must be positive");
  }
  if (e.width % e.heads != 0) throw graph::GraphError("encoder: width is not divisible by heads");
}

// The encoder stack over a residual stream [B*T, C]; `pre_norm` picks ViT's order (LN inside
// each branch) over BERT's (LN after each residual add).
class Encoder {
 public:
  Encoder(graph::Builder& b, const EncoderConfig& e, std::int64_t batch, std::int64_t tokens)
      : b_(b), e_(e), B(batch), T(tokens), C(e.width), NH(e.heads), HD(e.width / e.heads) {}

  TensorId param(const std::string& name, graph::Shape shape, InitSpec init) {
    return b_.parameter(name, std::move(shape), init, e_.dtype);
  }
  TensorId linear(TensorId x, const std::string& name, std::int64_t out, std::int64_t in) {
    return b_.linear(x, param(name + ".weight", {out, in}, kWeightInit), param(name + ".bias", {out}, kZeros), name);
  }
  TensorId layer_norm(TensorId x, const std::string& name, float eps) {
    return b_.layer_norm(x, param(name + ".weight", {C}, kOnes), param(name + ".bias", {C}, kZeros), name, eps);
  }

  TensorId attention(TensorId x, const std::string& n) {
    auto heads = [&](TensorId t, const std::string& name) {
      return b_.permute(b_.reshape(t, {B, T, NH, HD}, name + ".view"), {0, 2, 1, 3}, name + ".heads");
    };
    const TensorId q = heads(linear(x, n + ".query", C, C), n + ".query");
    const TensorId k = heads(linear(x, n + ".key", C, C), n + ".key");
    const TensorId v = heads(linear(x, n + ".value", C, C), n + ".value");
    TensorId y = attention_block(b_, e_.attention, q, k, v, /*causal=*/false, e_.dropout, n);
    y = b_.reshape(b_.permute(y, {0, 2, 1, 3}, n + ".merge"), {graph::checked_mul(B, T), C}, n + ".merged");
    return b_.dropout(linear(y, n + ".output", C, C), e_.dropout, n + ".output.drop");
  }

  TensorId mlp(TensorId x, const std::string& n) {
    const TensorId hidden = b_.gelu(linear(x, n + ".fc1", e_.mlp, C), n + ".gelu");
    return b_.dropout(linear(hidden, n + ".fc2", C, e_.mlp), e_.dropout, n + ".drop");
  }

  TensorId stack(TensorId h, bool pre_norm, float eps) {
    for (std::int64_t l = 0; l < e_.layers; ++l) {
      const std::string n = "layer." + std::to_string(l);
      if (pre_norm) {
        h = b_.add(h, attention(layer_norm(h, n + ".norm1", eps), n + ".attn"), n + ".residual1");
        h = b_.add(h, mlp(layer_norm(h, n + ".norm2", eps), n + ".mlp"), n + ".residual2");
      } else {
        h = layer_norm(b_.add(h, attention(h, n + ".attn"), n + ".residual1"), n + ".norm1", eps);
        h = layer_norm(b_.add(h, mlp(h, n + ".mlp"), n + ".residual2"), n + ".norm2", eps);
      }
    }
    return h;
  }

  // x [B, T*C] + table[rows, C] (its first T rows), broadcast over the batch.
  TensorId add_positions(TensorId x, TensorId table, std::int64_t rows, const std::string& name) {
    const TensorId used = rows == T ? table : b_.slice(table, 0, 0, T, name + ".used");
    return b_.bias_add(x, b_.reshape(used, {graph::checked_mul(T, C)}, name + ".flat"), name);
  }

 private:
  graph::Builder& b_;
  const EncoderConfig& e_;

 public:
  const std::int64_t B, T, C, NH, HD;
};

}  // namespace

graph::Graph build_bert(const BertConfig& config, std::int64_t batch) {
  const EncoderConfig& e = config.encoder;
  check_encoder(e, batch, config.seq);
  if (config.seq > config.max_positions) {
    throw graph::GraphError("bert: sequence length " + std::to_string(config.seq) + " exceeds the " +
                            std::to_string(config.max_positions) + " learned positions");
  }
  graph::Graph g;
  graph::Builder b(g);
  Encoder enc(b, e, batch, config.seq);
  const std::int64_t B = batch, T = config.seq, C = e.width, V = config.vocab;
  const float eps = 1e-12f;
  const TensorId x = b.input("x", {B, T}, graph::DType::i32);
  const TensorId types = b.input("token_type", {B, T}, graph::DType::i32);
  const TensorId labels = b.input("labels", {graph::checked_mul(B, T)}, graph::DType::i32);
  const TensorId words = enc.param("embeddings.word_embeddings.weight", {V, C}, kWeightInit);
  const TensorId positions = enc.param("embeddings.position_embeddings.weight", {config.max_positions, C}, kWeightInit);
  const TensorId type_table = enc.param("embeddings.token_type_embeddings.weight", {config.token_types, C}, kWeightInit);
  TensorId h = b.add(b.embedding(x, words, "embeddings.words"), b.embedding(types, type_table, "embeddings.types"),
                     "embeddings.sum");  // [B, T, C]
  h = enc.add_positions(b.reshape(h, {B, graph::checked_mul(T, C)}, "embeddings.flat"), positions, config.max_positions,
                        "embeddings.positions");
  h = enc.layer_norm(b.reshape(h, {graph::checked_mul(B, T), C}, "embeddings.rows"), "embeddings.LayerNorm", eps);
  h = b.dropout(h, e.dropout, "embeddings.drop");
  h = enc.stack(h, /*pre_norm=*/false, eps);
  // MLM head: dense + GELU + LN, then the decoder tied to the word embeddings, with its own bias.
  h = enc.layer_norm(b.gelu(enc.linear(h, "cls.predictions.transform.dense", C, C), "cls.gelu"),
                     "cls.predictions.transform.LayerNorm", eps);
  const TensorId decoder_bias = enc.param("cls.predictions.bias", {V}, kZeros);
  g.output = b.bias_add(b.matmul(h, words, false, true, "cls.decoder"), decoder_bias, "logits");  // [B*T, V]
  g.loss = b.cross_entropy(g.output, labels, "loss");
  return g;
}

graph::Graph build_vit(const VitConfig& config, std::int64_t batch) {
  const EncoderConfig& e = config.encoder;
  const std::int64_t S = config.image, P = config.patch;
  if (S <= 0 || P <= 0 || S % P != 0) {
    throw graph::GraphError("vit: image size " + std::to_string(S) + " is not a positive multiple of the patch " +
                            std::to_string(P));
  }
  const std::int64_t N = graph::checked_mul(S / P, S / P);  // patches
  const std::int64_t T = N + 1;              // plus the class token
  check_encoder(e, batch, T);
  graph::Graph g;
  graph::Builder b(g);
  Encoder enc(b, e, batch, T);
  const std::int64_t B = batch, C = e.width, CH = config.channels;
  const TensorId x = b.input("x", {B, graph::checked_mul(graph::checked_mul(CH, S), S)}, e.dtype);
  const TensorId labels = b.input("labels", {B}, graph::DType::i32);
  // Patch embedding: a PxP convolution with stride P, then bias per channel.
  const TensorId w = enc.param("patch_embed.proj.weight", {C, CH, P, P}, kWeightInit);
  TensorId h = b.conv2d(b.reshape(x, {B, CH, S, S}, "x.image"), w, P, 0, "patch_embed.proj");  // [B, C, S/P, S/P]
  h = b.permute(b.reshape(h, {B, C, N}, "patch_embed.flat"), {0, 2, 1}, "patch_embed.tokens");    // [B, N, C]
  h = b.bias_add(b.reshape(h, {graph::checked_mul(B, N), C}, "patch_embed.rows"), enc.param("patch_embed.proj.bias", {C}, kZeros),
                 "patch_embed");
  // The class token, broadcast over the batch (zeros + cls), in front of the patches.
  graph::OpAttrs zeros;
  zeros.shape = {B, C};
  zeros.alpha = 0.0f;
  zeros.dtype = e.dtype;
  const TensorId base = g.add_op(graph::OpKind::fill, {}, zeros, "cls_token.base", graph::Role::activation,
                                 graph::Phase::forward);
  const TensorId cls = b.bias_add(base, enc.param("cls_token", {C}, kWeightInit), "cls_token.batch");
  h = b.concat(b.reshape(cls, {B, 1, C}, "cls_token.view"), b.reshape(h, {B, N, C}, "patch_embed.view"), 1,
               "tokens");  // [B, T, C]
  h = enc.add_positions(b.reshape(h, {B, graph::checked_mul(T, C)}, "tokens.flat"), enc.param("pos_embed", {T, C}, kWeightInit), T,
                        "pos_embed.add");
  h = b.dropout(h, e.dropout, "pos_drop");
  h = enc.stack(b.reshape(h, {graph::checked_mul(B, T), C}, "tokens.rows"), /*pre_norm=*/true, 1e-6f);
  h = enc.layer_norm(h, "norm", 1e-6f);
  h = b.reshape(b.slice(b.reshape(h, {B, T, C}, "norm.view"), 1, 0, 1, "cls_out"), {B, C}, "cls_out.rows");
  g.output = enc.linear(h, "head", config.classes, C);  // [B, classes]
  g.loss = b.cross_entropy(g.output, labels, "loss");
  return g;
}

}  // namespace memplan::models
