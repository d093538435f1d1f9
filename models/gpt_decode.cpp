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

namespace {

// Multi-head latent attention's decode step (LlamaConfig::Mla), as DeepSeek serves it: the cache
// row of a position is [rotary key (qk_rope), normalised latent (kv_lora_rank)], nothing per head.
// kv_b_proj's key half is absorbed into the queries (each head's no-rope query times its slice
// W_UK gives a query over the latent) and its value half applied after attention (the heads'
// weighted latents times W_UV), so the step never expands the cache into per-head keys and values.
// The scores equal the training graph's q_nope.k_nope + q_pe.k_pe; parameters are build_llama's.
TensorId latent_decode(graph::Builder& b, const LlamaConfig& config, TensorId a_in, std::int64_t B, std::int64_t l,
                       const DecodeShape& shape) {
  const LlamaConfig::Mla& mla = config.mla;
  const std::int64_t C = config.width, NH = config.heads, R = mla.kv_lora_rank;
  const std::int64_t DN = mla.qk_nope, DR = mla.qk_rope, DV = mla.v_head, DQK = mla.qk_head();
  const graph::DType dt = config.dtype;
  const graph::InitSpec ones{graph::InitSpec::Kind::ones, 0.0f};
  const graph::InitSpec w_init{graph::InitSpec::Kind::normal, 0.02f};
  const std::string a = "layers." + std::to_string(l) + ".self_attn";
  graph::Graph& g = b.graph();
  const TensorId table = g.find("block_table");
  const TensorId positions = g.find("positions");
  if (DR <= 0 || DR % 2 != 0) throw graph::GraphError("serving multi-head latent attention needs an even qk_rope_head_dim > 0");
  TensorId q;
  if (mla.q_lora_rank > 0) {
    const TensorId cq = llama_parts::project(b, config, a_in, a + ".q_a_proj", mla.q_lora_rank, C, false, a + ".q_a");
    const TensorId cq_n = b.rms_norm(cq, b.parameter(a + ".q_a_layernorm.weight", {mla.q_lora_rank}, ones, dt), a + ".q_a_norm");
    q = llama_parts::project(b, config, cq_n, a + ".q_b_proj", graph::checked_mul(NH, DQK), mla.q_lora_rank, false, a + ".q");
  } else {
    q = llama_parts::project(b, config, a_in, a + ".q_proj", graph::checked_mul(NH, DQK), C, false, a + ".q");
  }
  q = b.reshape(q, {B, NH, DQK}, a + ".q.heads");
  // kv_b_proj.weight [NH * (DN + DV), R], head by head: W_UK [NH, DN, R] and W_UV [NH, DV, R].
  const TensorId kv_b = b.reshape(b.parameter(a + ".kv_b_proj.weight", {graph::checked_mul(NH, DN + DV), R}, w_init, dt),
                                  {NH, DN + DV, R}, a + ".kv_b.heads");
  const TensorId w_uk = b.slice(kv_b, 1, 0, DN, a + ".w_uk");
  const TensorId w_uv = b.slice(kv_b, 1, DN, DV, a + ".w_uv");
  const TensorId q_nope = b.permute(b.slice(q, 2, 0, DN, a + ".q_nope"), {1, 0, 2}, a + ".q_nope.by_head");  // [NH, B, DN]
  const TensorId q_latent = b.permute(b.batched_matmul(q_nope, w_uk, false, false, a + ".q_absorbed"), {1, 0, 2},
                                      a + ".q_latent");  // [B, NH, R]
  const TensorId q_row = b.reshape(b.concat(b.slice(q, 2, DN, DR, a + ".q_pe"), q_latent, 2, a + ".q.joined"),
                                   {B, graph::checked_mul(NH, DR + R)}, a + ".q.rows");
  const TensorId ckv = llama_parts::project(b, config, a_in, a + ".kv_a_proj_with_mqa", R + DR, C, false, a + ".kv_a");
  const TensorId latent = b.rms_norm(b.slice(ckv, 1, 0, R, a + ".latent"),
                                     b.parameter(a + ".kv_a_layernorm.weight", {R}, ones, dt), a + ".latent_norm");
  const TensorId key = b.concat(b.slice(ckv, 1, R, DR, a + ".k_pe"), latent, 1, a + ".key");  // [B, DR + R]
  const TensorId cache = b.external(kv_cache_name(l, false), {shape.pool_blocks, shape.block_size, DR + R}, dt);
  // The training graph's score scale is over the DN + DR query channels, not the cache row's width.
  const float scale = config.attention_scale() > 0.0f ? config.attention_scale() : 1.0f / std::sqrt(float(DQK));
  const TensorId y = b.latent_decode_attention(q_row, key, cache, table, positions, NH, DR, a + ".values",
                                               config.rope_base_of(l), DR, scale, config.attn_softcap);  // [B, NH * R]
  b.latent_cache_write(key, table, positions, cache, a + ".cache_write", config.rope_base_of(l), DR);
  const TensorId y_heads = b.permute(b.reshape(y, {B, NH, R}, a + ".values.heads"), {1, 0, 2}, a + ".values.by_head");
  const TensorId o = b.permute(b.batched_matmul(y_heads, w_uv, false, true, a + ".v_absorbed"), {1, 0, 2},
                               a + ".v.heads");  // [B, NH, DV]
  return llama_parts::project(b, config, b.reshape(o, {B, graph::checked_mul(NH, DV)}, a + ".merged"), a + ".o_proj", C,
                              graph::checked_mul(NH, DV), config.o_bias, a + ".o");
}

}  // namespace

graph::Graph build_llama_decode(const LlamaConfig& trained, const DecodeShape& shape) {
  // A mixture of experts drops no token while generating: every expert has a slot for every one
  // of the step's few tokens (a dropped token would change the model's output, not only its cost).
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
      if (config.mla.active()) return latent_decode(b, config, a_in, B, l, shape);
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
