// LLaMA-style decoder for planning at real scale: token embedding, L pre-norm blocks of causal
// self-attention (rotary positions, grouped-query K/V heads) and a SwiGLU MLP, RMSNorm, no
// biases, a head tied to the embedding or its own. Shapes as the published checkpoints have them.
#pragma once

#include <cstdint>
#include <string>

#include "memplan/graph/builder.h"
#include "memplan/graph/graph.h"
#include "memplan/models/attention.h"

namespace memplan::models {

struct LlamaConfig {
  std::int64_t vocab = 32000;   // V
  std::int64_t context = 4096;  // T: tokens per sequence
  std::int64_t layers = 32;     // L
  std::int64_t width = 4096;    // C
  std::int64_t heads = 32;      // NH (query heads)
  std::int64_t kv_heads = 32;   // NKV: K/V heads, each shared by NH/NKV query heads
  std::int64_t ffn = 11008;     // F: SwiGLU hidden width
  float rope_base = 10000.0f;
  bool tied_head = false;
  graph::DType dtype = graph::DType::f32;
  AttentionKind attention = AttentionKind::fused;  // models/attention.h
  bool qkv_bias = false;  // biases on the q, k and v projections (Qwen2; Llama's attention_bias)
  bool o_bias = false;    // a bias on the output projection (Llama's attention_bias)
  std::int64_t head_dim = 0;  // channels per head; 0: width / heads (Qwen3 sets it apart from the width)
  bool qk_norm = false;       // RMSNorm over each head's queries and keys before rotary (Qwen3's q_norm, k_norm)
  // The gated MLP's activation (SiLU: SwiGLU; Gemma's GELU: GeGLU). Gemma also scales the embeddings by
  // sqrt(width) before the first layer. (Gemma's RMSNorm multiplies by 1 + weight, its weights
  // starting at zero; memplan keeps 1 + weight as the one parameter, starting at one: the same
  // memory and, without weight decay on it, the same training.)
  enum class Gate : std::uint8_t { silu, gelu, relu };
  Gate gate = Gate::silu;
  bool scale_embeddings = false;

  // Channels per head: head_dim, or width / heads.
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : width / heads; }
};

// The pieces the training graph (build_llama) and the decode step (models/gpt_decode.h) build
// alike, so both follow the config the same way.
namespace llama_parts {
// The head size, after checking that the heads split the width (or head_dim is given), group
// into the K/V heads, and have an even size (rotary); a graph::GraphError otherwise.
std::int64_t checked_head_size(const LlamaConfig& config);
// The gated MLP's activation of `gate_in`, as config.gate says.
TensorId gate(graph::Builder& b, const LlamaConfig& config, TensorId gate_in, const std::string& name);
// Qwen3's q_norm/k_norm on `x` [rows, heads * head_size]: RMSNorm over each head's channels, one
// weight shared by the heads; `x` itself without config.qk_norm.
TensorId head_norm(graph::Builder& b, const LlamaConfig& config, TensorId x, std::int64_t rows, std::int64_t heads,
                   const std::string& name);
}  // namespace llama_parts

// Forward graph for `batch` sequences: inputs "x" [B, T] i32 and "labels" [B*T] i32; output
// "logits" [B*T, V]; loss "loss". Parameter names follow Hugging Face's LlamaForCausalLM
// (embed_tokens, layers.N.self_attn.{q,k,v,o}_proj, layers.N.mlp.{gate,up,down}_proj,
// layers.N.{input,post_attention}_layernorm, norm, lm_head). Attention per config.attention
// (fused keeps K/V at NKV heads; materialized repeats them and stores [B, NH, T, T] scores).
graph::Graph build_llama(const LlamaConfig& config, std::int64_t batch);

}  // namespace memplan::models
