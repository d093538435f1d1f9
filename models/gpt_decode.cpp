// build_gpt_decode: build_gpt's blocks for one token per slot, attention through the KV cache.
#include "memplan/models/gpt_decode.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"

namespace memplan::models {

std::string kv_cache_name(std::int64_t layer, bool value) {
  return "h." + std::to_string(layer) + (value ? ".attn.v_cache" : ".attn.k_cache");
}

graph::Graph build_gpt_decode(const GptConfig& config, const DecodeShape& shape) {
  const std::int64_t B = shape.slots, T = config.context, C = config.width, NH = config.heads, V = config.vocab;
  const std::int64_t BS = shape.block_size, NB = shape.pool_blocks;
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || V <= 0 || config.layers <= 0 || BS <= 0 || NB <= 0) {
    throw graph::GraphError("gpt decode: slots, block size, pool blocks, context, width, heads, vocab and layers must be positive");
  }
  if (C % NH != 0) {
    throw graph::GraphError("gpt: width " + std::to_string(C) + " is not divisible by " + std::to_string(NH) + " heads");
  }
  const std::int64_t P = config.max_positions > 0 ? config.max_positions : T;
  if (T > P) {
    throw graph::GraphError("gpt: sequence length " + std::to_string(T) + " exceeds the " + std::to_string(P) +
                            " learned positions");
  }
  const std::int64_t MB = shape.table_width(T);
  const graph::DType dt = config.dtype;
  graph::Graph g;
  graph::Builder b(g);
  const graph::InitSpec w_init{graph::InitSpec::Kind::normal, 0.02f};
  const graph::InitSpec proj_init{graph::InitSpec::Kind::normal,
                                  0.02f / std::sqrt(2.0f * static_cast<float>(config.layers))};
  const graph::InitSpec zeros{graph::InitSpec::Kind::zeros, 0.0f};
  const graph::InitSpec ones{graph::InitSpec::Kind::ones, 0.0f};
  struct Linear {
    TensorId weight, bias;
  };
  auto linear_params = [&](const std::string& name, std::int64_t out, std::int64_t in, graph::InitSpec init) {
    return Linear{b.parameter(name + ".weight", {out, in}, init, dt), b.parameter(name + ".bias", {out}, zeros, dt)};
  };
  auto layer_norm = [&](TensorId x, const std::string& name) {
    return b.layer_norm(x, b.parameter(name + ".weight", {C}, ones, dt), b.parameter(name + ".bias", {C}, zeros, dt),
                        name);
  };

  const TensorId tokens = b.input("tokens", {B}, graph::DType::i32);
  const TensorId positions = b.input("positions", {B}, graph::DType::i32);
  const TensorId table = b.input("block_table", {B, MB}, graph::DType::i32);
  const TensorId wte = b.parameter("wte.weight", {V, C}, w_init, dt);
  const TensorId wpe = b.parameter("wpe.weight", {P, C}, w_init, dt);
  // The residual stream [B, C]: token plus position embedding, as build_gpt adds them.
  TensorId h = b.add(b.embedding(tokens, wte, "tok_emb"), b.embedding(positions, wpe, "pos_emb"), "residual0");
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string n = "h." + std::to_string(l);
    const TensorId a_in = layer_norm(h, n + ".ln_1");
    const Linear q = linear_params(n + ".attn.q", C, C, w_init);
    const Linear k = linear_params(n + ".attn.k", C, C, w_init);
    const Linear v = linear_params(n + ".attn.v", C, C, w_init);
    const TensorId qx = b.linear(a_in, q.weight, q.bias, n + ".attn.q");
    const TensorId kx = b.linear(a_in, k.weight, k.bias, n + ".attn.k");
    const TensorId vx = b.linear(a_in, v.weight, v.bias, n + ".attn.v");
    const TensorId k_cache = b.external(kv_cache_name(l, false), {NB, BS, C}, dt);
    const TensorId v_cache = b.external(kv_cache_name(l, true), {NB, BS, C}, dt);
    // Attention reads the cache as the step found it (positions before this one) and takes this
    // position's key and value from kx, vx; the write comes after every read (an update op).
    TensorId y = b.decode_attention(qx, kx, vx, k_cache, v_cache, table, positions, NH, NH, n + ".attn.values");
    b.kv_cache_write(kx, vx, table, positions, k_cache, v_cache, n + ".attn.cache_write");
    const Linear proj = linear_params(n + ".attn.proj", C, C, proj_init);
    h = b.add(h, b.linear(y, proj.weight, proj.bias, n + ".attn.proj"), n + ".residual1");
    const Linear fc = linear_params(n + ".mlp.fc", graph::checked_mul(4, C), C, w_init);
    const Linear out = linear_params(n + ".mlp.proj", C, graph::checked_mul(4, C), proj_init);
    TensorId m = b.gelu(b.linear(layer_norm(h, n + ".ln_2"), fc.weight, fc.bias, n + ".mlp.fc"), n + ".mlp.gelu");
    h = b.add(h, b.linear(m, out.weight, out.bias, n + ".mlp.proj"), n + ".residual2");
  }
  h = layer_norm(h, "ln_f");
  const TensorId head = config.tied_head ? wte : b.parameter("lm_head.weight", {V, C}, w_init, dt);
  g.output = b.matmul(h, head, false, true, "logits");  // [B, V]
  return g;
}

graph::Graph build_llama_decode(const LlamaConfig& trained, const DecodeShape& shape) {
  // A mixture of experts drops no token while generating: every expert has a slot for every one
  // of the step's few tokens (a dropped token would change the model's output, not only its cost).
  if (trained.mla.active()) {
    throw graph::GraphError("serving multi-head latent attention is not planned yet: its cache holds the latent and the "
                            "rotary key (kv_lora_rank + qk_rope_head_dim values a token a layer), which memplan's decode step "
                            "does not build");
  }
  if (trained.positions != LlamaConfig::Positions::rotary) {
    throw graph::GraphError("serving learned positions in the rotary decoder (OPT, GPT-BigCode) is not planned yet");
  }
  LlamaConfig config = trained;
  config.moe.capacity_factor = 0.0;
  config.embedding_dropout = config.residual_dropout = config.attention_dropout = 0.0f;  // generating drops nothing
  const std::int64_t B = shape.slots, T = config.context, C = config.width, NH = config.heads, NKV = config.kv_heads;
  const std::int64_t V = config.vocab, BS = shape.block_size, NB = shape.pool_blocks;
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || NKV <= 0 || V <= 0 || config.ffn <= 0 || config.layers <= 0 || BS <= 0 || NB <= 0) {
    throw graph::GraphError("llama decode: slots, block size, pool blocks, context, width, heads, kv_heads, ffn, vocab and layers must be positive");
  }
  const std::int64_t HD = llama_parts::checked_head_size(config);
  const std::int64_t QC = graph::checked_mul(NH, HD), KW = graph::checked_mul(NKV, HD), MB = shape.table_width(T);
  const graph::DType dt = config.dtype;
  graph::Graph g;
  graph::Builder b(g);
  const graph::InitSpec w_init{graph::InitSpec::Kind::normal, 0.02f};
  auto project = [&](TensorId x, const std::string& name, std::int64_t out, const std::string& op_name) {
    return llama_parts::project(b, config, x, name, out, C, config.qkv_bias, op_name);
  };
  auto head_norm = [&](TensorId x, std::int64_t heads, const std::string& name) {
    return llama_parts::head_norm(b, config, x, B, heads, name);
  };
  const TensorId tokens = b.input("tokens", {B}, graph::DType::i32);
  const TensorId positions = b.input("positions", {B}, graph::DType::i32);
  const TensorId table = b.input("block_table", {B, MB}, graph::DType::i32);
  const TensorId embed = b.parameter("embed_tokens.weight", {V, C}, w_init, dt);
  TensorId h = b.embedding(tokens, embed, "residual0");  // [B, C]
  h = llama_parts::embeddings(b, config, h, /*training=*/false);
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string a = "layers." + std::to_string(l) + ".self_attn";
    h = llama_parts::layer(b, config, h, l, [&](TensorId a_in) {
      const TensorId q = head_norm(project(a_in, a + ".q_proj", QC, a + ".q"), NH, a + ".q_norm");
      const TensorId k = head_norm(project(a_in, a + ".k_proj", KW, a + ".k"), NKV, a + ".k_norm");
      const TensorId v = project(a_in, a + ".v_proj", KW, a + ".v");
      const TensorId k_cache = b.external(kv_cache_name(l, false), {NB, BS, KW}, dt);
      const TensorId v_cache = b.external(kv_cache_name(l, true), {NB, BS, KW}, dt);
      const TensorId y = b.decode_attention(q, k, v, k_cache, v_cache, table, positions, NH, NKV, a + ".values",
                                            config.rope_base_of(l), config.rotary_dims, config.attention_scale(),
                                            config.attn_softcap);
      b.kv_cache_write(k, v, table, positions, k_cache, v_cache, a + ".cache_write", HD, config.rope_base_of(l),
                       config.rotary_dims);
      return llama_parts::project(b, config, y, a + "." + config.attn_out_name, C, QC, config.o_bias, a + ".o");
    });
  }
  h = llama_parts::norm(b, config, h, "norm");
  const TensorId head = config.tied_head ? embed : b.parameter("lm_head.weight", {V, C}, w_init, dt);
  g.output = llama_parts::logits(b, config, h, head);  // [B, V]
  return g;
}

}  // namespace memplan::models
