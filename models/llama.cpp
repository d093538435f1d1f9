#include "memplan/models/llama.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"
#include "memplan/models/attention.h"

namespace memplan::models {

namespace llama_parts {

std::int64_t checked_head_size(const LlamaConfig& config) {
  const std::int64_t C = config.width, NH = config.heads, NKV = config.kv_heads;
  if (config.head_dim < 0 || (config.head_dim == 0 && C % NH != 0) || NH % NKV != 0) {
    throw graph::GraphError("llama: width must split into heads (or head_dim be given) and heads into kv_heads groups");
  }
  if (config.head_size() % 2 != 0) throw graph::GraphError("llama: rotary positions need an even head size");
  return config.head_size();
}

TensorId gate(graph::Builder& b, const LlamaConfig& config, TensorId gate_in, const std::string& name) {
  switch (config.gate) {
    case LlamaConfig::Gate::gelu: return b.gelu(gate_in, name);
    case LlamaConfig::Gate::relu: return b.relu(gate_in, name);
    case LlamaConfig::Gate::silu: break;
  }
  return b.silu(gate_in, name);
}

TensorId head_norm(graph::Builder& b, const LlamaConfig& config, TensorId x, std::int64_t rows, std::int64_t heads,
                   const std::string& name) {
  if (!config.qk_norm) return x;
  const std::int64_t HD = config.head_size();
  const graph::InitSpec ones{graph::InitSpec::Kind::ones, 0.0f};
  const TensorId per_head = b.reshape(x, {graph::checked_mul(rows, heads), HD}, name + ".rows");
  const TensorId normed = b.rms_norm(per_head, b.parameter(name + ".weight", {HD}, ones, config.dtype), name);
  return b.reshape(normed, {rows, graph::checked_mul(heads, HD)}, name + ".flat");
}

}  // namespace llama_parts

graph::Graph build_llama(const LlamaConfig& config, std::int64_t batch) {
  const std::int64_t B = batch, T = config.context, C = config.width, NH = config.heads, NKV = config.kv_heads;
  const std::int64_t V = config.vocab, F = config.ffn;
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || NKV <= 0 || V <= 0 || F <= 0 || config.layers <= 0) {
    throw graph::GraphError("llama: batch, context, width, heads, kv_heads, ffn, vocab and layers must be positive");
  }
  const std::int64_t HD = llama_parts::checked_head_size(config);  // head size
  const std::int64_t QC = graph::checked_mul(NH, HD);  // query (and attention output) channels
  const graph::DType dt = config.dtype;
  graph::Graph g;
  graph::Builder b(g);
  const graph::InitSpec w_init{graph::InitSpec::Kind::normal, 0.02f};
  const graph::InitSpec ones{graph::InitSpec::Kind::ones, 0.0f};
  auto weight = [&](const std::string& name, std::int64_t out, std::int64_t in) {
    return b.parameter(name + ".weight", {out, in}, w_init, dt);
  };
  const graph::InitSpec zeros{graph::InitSpec::Kind::zeros, 0.0f};
  // x W^T (+ b when `bias`): a projection named as Hugging Face names it.
  auto project = [&](TensorId x, const std::string& name, std::int64_t out, std::int64_t in, bool bias,
                     const std::string& op_name) {
    const TensorId w = weight(name, out, in);
    if (!bias) return b.matmul(x, w, false, true, op_name);
    return b.linear(x, w, b.parameter(name + ".bias", {out}, zeros, dt), op_name);
  };
  auto norm = [&](TensorId x, const std::string& name) {
    return b.rms_norm(x, b.parameter(name + ".weight", {C}, ones, dt), name);
  };
  // [B*T, heads*HD] -> [B, heads, T, HD]
  auto split_heads = [&](TensorId x, std::int64_t heads, const std::string& name) {
    return b.permute(b.reshape(x, {B, T, heads, HD}, name + ".view"), {0, 2, 1, 3}, name + ".heads");
  };
  auto head_norm = [&](TensorId x, std::int64_t heads, const std::string& name) {
    return llama_parts::head_norm(b, config, x, graph::checked_mul(B, T), heads, name);
  };

  const TensorId x = b.input("x", {B, T}, graph::DType::i32);
  const TensorId labels = b.input("labels", {graph::checked_mul(B, T)}, graph::DType::i32);
  const TensorId embed = b.parameter("embed_tokens.weight", {V, C}, w_init, dt);
  TensorId h = b.reshape(b.embedding(x, embed, "embed"), {graph::checked_mul(B, T), C}, "residual0");  // [B*T, C]
  if (config.scale_embeddings) h = b.scale(h, std::sqrt(static_cast<float>(C)), "residual0.scaled");

  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string n = "layers." + std::to_string(l);
    const std::string a = n + ".self_attn";
    const TensorId a_in = norm(h, n + ".input_layernorm");
    TensorId q = split_heads(head_norm(project(a_in, a + ".q_proj", QC, C, config.qkv_bias, a + ".q"), NH, a + ".q_norm"), NH, a + ".q");
    TensorId k = split_heads(
        head_norm(project(a_in, a + ".k_proj", graph::checked_mul(NKV, HD), C, config.qkv_bias, a + ".k"), NKV, a + ".k_norm"), NKV,
        a + ".k");
    TensorId v = split_heads(project(a_in, a + ".v_proj", graph::checked_mul(NKV, HD), C, config.qkv_bias, a + ".v"), NKV, a + ".v");
    q = b.rotary(q, config.rope_base, a + ".q.rope");
    k = b.rotary(k, config.rope_base, a + ".k.rope");
    TensorId y = attention_block(b, config.attention, q, k, v, /*causal=*/true, 0.0f, a);  // [B, NH, T, HD]
    y = b.reshape(b.permute(y, {0, 2, 1, 3}, a + ".merge"), {graph::checked_mul(B, T), QC}, a + ".merged");
    y = project(y, a + ".o_proj", C, QC, config.o_bias, a + ".o");
    h = b.add(h, y, n + ".residual1");
    // SwiGLU MLP: down(silu(gate(x)) * up(x))
    const std::string m = n + ".mlp";
    const TensorId m_in = norm(h, n + ".post_attention_layernorm");
    const TensorId gate_in = b.matmul(m_in, weight(m + ".gate_proj", F, C), false, true, m + ".gate");
    const TensorId gate = llama_parts::gate(b, config, gate_in, m + ".act");
    const TensorId up = b.matmul(m_in, weight(m + ".up_proj", F, C), false, true, m + ".up");
    const TensorId down = b.matmul(b.mul(gate, up, m + ".glu"), weight(m + ".down_proj", C, F), false, true, m + ".down");
    h = b.add(h, down, n + ".residual2");
  }
  h = norm(h, "norm");
  const TensorId head = config.tied_head ? embed : b.parameter("lm_head.weight", {V, C}, w_init, dt);
  g.output = b.matmul(h, head, false, true, "logits");  // [B*T, V]
  g.loss = b.cross_entropy(g.output, labels, "loss");
  return g;
}

}  // namespace memplan::models
