// The rotary decoder the decoder-only families are settings of: token embedding, L blocks of
// causal self-attention (rotary positions, whole or partial; multi-head, grouped-query or
// multi-query K/V heads) and an MLP, a final norm, a head tied to the embedding or its own.
// LLaMA's defaults (pre-norm RMSNorm, SwiGLU, no biases); LlamaConfig's settings give Mistral,
// Qwen2/3, Gemma, Phi-3, GPT-NeoX, Falcon and OLMo-2 (models/hf_config.h reads them from
// config.json). Shapes as the published checkpoints have them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memplan/graph/builder.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/expert_parallel.h"
#include "memplan/graph/tensor_parallel.h"
#include "memplan/models/activation.h"
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
  // RMSNorm of the queries and keys before rotary: over each head's channels, one weight shared by
  // the heads (Qwen3's q_norm, k_norm), or over the whole projection (OLMo-2's).
  enum class QkNorm : std::uint8_t { none, per_head, whole };
  QkNorm qk_norm = QkNorm::none;
  // The gated MLP's activation (SiLU: SwiGLU; Gemma's GELU: GeGLU). Gemma also scales the embeddings by
  // sqrt(width) before the first layer. (Gemma's RMSNorm multiplies by 1 + weight, its weights
  // starting at zero; memplan keeps 1 + weight as the one parameter, starting at one: the same
  // memory and, without weight decay on it, the same training.)
  using Gate = Activation;  // models/activation.h
  Gate gate = Gate::silu;
  bool scale_embeddings = false;
  // The decoder's other settings, llama's by default: the families are settings of one layer.
  // Norms: RMSNorm (a weight) or LayerNorm (weight and bias; GPT-NeoX, Falcon).
  enum class Norm : std::uint8_t { rms, layer };
  Norm norm = Norm::rms;
  // The MLP: gated (down(act(gate x) * up x)) or plain (down(act(up x)); GPT-NeoX and Falcon,
  // with gate's activation), with biases on its projections or not.
  bool gated_mlp = true;
  bool mlp_bias = false;
  // Where the norms sit: before each sublayer (pre_norm; llama), on each sublayer's output before
  // the residual add (post_norm; OLMo-2), or both (Gemma-2).
  bool pre_norm = true;
  bool post_norm = false;
  // Attention and MLP side by side on the same residual (GPT-NeoX's use_parallel_residual,
  // Falcon's parallel_attn): h + attn(norm1 h) + mlp(norm2 h); with shared_norm one norm feeds
  // both (Falcon-7B).
  bool parallel_residual = false;
  bool shared_norm = false;
  // Rotary over each head's first rotary_dims channels (GPT-NeoX's rotary_pct); 0: all of them.
  std::int64_t rotary_dims = 0;
  // Gemma-2: attention scores scaled by query_scale^-1/2 (query_pre_attn_scalar) rather than
  // head_size^-1/2 when query_scale > 0; scores soft-capped to attn_softcap * tanh(s / attn_softcap)
  // and the logits to final_softcap * tanh(l / final_softcap) when those are > 0.
  float query_scale = 0.0f;
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // Granite's multipliers: scores scaled by attention_multiplier (> 0; in place of head_size^-1/2),
  // the embeddings by embedding_multiplier (> 0), each sublayer's output by residual_multiplier
  // before its residual add; the logits by logit_scale (Granite's 1 / logits_scaling, Cohere's
  // logit_scale). 1 (0 for the first two) changes nothing.
  float attention_multiplier = 0.0f;
  float embedding_multiplier = 0.0f;
  float residual_multiplier = 1.0f;
  float logit_scale = 1.0f;
  float attention_scale() const {
    if (attention_multiplier > 0.0f) return attention_multiplier;
    return query_scale > 0.0f ? 1.0f / std::sqrt(query_scale) : 0.0f;
  }
  // Dropout in training (StarCoder2's embedding_dropout, residual_dropout and attention_dropout):
  // on the embeddings, on each sublayer's output before its residual add, and on the attention
  // probabilities. 0: none (and none in evaluation or serving graphs).
  float embedding_dropout = 0.0f;
  float residual_dropout = 0.0f;
  float attention_dropout = 0.0f;
  // Positions: rotary (the default), or learned, a table embed_positions [position_table, width]
  // whose rows from position_offset on are added to the embeddings (OPT's offset of 2; GPT-BigCode
  // 0), with no rotary in the attention.
  enum class Positions : std::uint8_t { rotary, learned };
  Positions positions = Positions::rotary;
  std::int64_t position_table = 0;
  std::int64_t position_offset = 0;
  // The attention's output projection's name (under layers.N.self_attn): o_proj; OPT's out_proj.
  std::string attn_out_name = "o_proj";
  // The MLP's parameter names (under layers.N.mlp): llama's gate_proj, up_proj, down_proj;
  // StarCoder2's plain MLP has c_fc and c_proj. LoRA targets name them as they are.
  std::string mlp_gate_name = "gate_proj";
  std::string mlp_up_name = "up_proj";
  std::string mlp_down_name = "down_proj";

  // Sliding-window attention: a windowed layer attends to the last `sliding_window` positions only
  // (Mistral and Phi-3: every layer; Gemma-2: every other layer from the first; Qwen2 with
  // use_sliding_window: the layers from max_window_layers on). Memory changes in serving only, where
  // a windowed layer keeps at most the window's keys and values; the training step masks scores
  // outside the window (graph::OpAttrs::window) and stores the same tensors.
  std::int64_t sliding_window = 0;       // 0: every layer attends to the whole sequence
  std::int64_t window_first_layer = 0;   // the first windowed layer
  std::int64_t window_layer_period = 1;  // then every this many layers
  // Or, when not empty, which layers are windowed, one entry a layer (Gemma 3's five local layers
  // to one global: its sliding_window_pattern or layer_types).
  std::vector<bool> windowed_layers;
  // The rotary base of the windowed layers (Gemma 3's rope_local_base_freq); 0: rope_base.
  float local_rope_base = 0.0f;
  bool windowed(std::int64_t layer) const {
    if (sliding_window <= 0) return false;
    if (!windowed_layers.empty()) {
      return layer >= 0 && layer < static_cast<std::int64_t>(windowed_layers.size()) && windowed_layers[static_cast<std::size_t>(layer)];
    }
    return layer >= window_first_layer && (layer - window_first_layer) % window_layer_period == 0;
  }
  // The window layer `layer`'s attention masks to (0: none).
  std::int64_t window_of(std::int64_t layer) const { return windowed(layer) ? sliding_window : 0; }
  float rope_base_of(std::int64_t layer) const { return local_rope_base > 0.0f && windowed(layer) ? local_rope_base : rope_base; }
  // The positions whose keys and values layer `layer` keeps for a sequence of `seq`.
  std::int64_t kv_positions(std::int64_t layer, std::int64_t seq) const {
    return windowed(layer) ? std::min(seq, sliding_window) : seq;
  }

  // A mixture of experts in place of the MLP (Mixtral, Qwen2-MoE, Qwen3-MoE): a router [E, width]
  // whose softmax picks top_k experts per token (their probabilities renormalised to sum 1 when
  // normalize_top_k), each expert an MLP as the dense one (gated or plain) of expert_ffn, its
  // weights stacked over the experts ([E, out, in]). Activations are planned for `capacity`
  // slots per expert, and tokens routed beyond an expert's slots are dropped for that expert (the
  // residual carries them), as GShard and Switch do.
  struct Moe {
    std::int64_t experts = 0;     // E; 0: a dense MLP in every layer
    std::int64_t top_k = 2;       // experts per token
    std::int64_t expert_ffn = 0;  // each expert's hidden width; 0: ffn
    bool normalize_top_k = true;
    // A shared expert every token also goes through, a gated MLP of shared_ffn scaled by
    // sigmoid(x w) with w [1, width] (Qwen2-MoE); 0: none.
    std::int64_t shared_ffn = 0;
    // Slots per expert: ceil(capacity_factor * tokens * top_k / experts), at least 1 and at most
    // the tokens. 1 plans a balanced load (every expert its share); 0: the tokens, nothing dropped.
    double capacity_factor = 1.0;
    // > 0: the router's load-balancing loss (Switch's, over the tokens of every mixture layer, as
    // transformers' load_balancing_loss_func) times this, added to the loss.
    double aux_loss_coef = 0.0;
    // DeepSeek's router: sigmoid scores (else softmax), a choice bias [E] added to them for the
    // choice only (DeepSeek-V3's e_score_correction_bias, held at its initial zeros: memplan does
    // not run DeepSeek's bias updates), the choice limited to top_groups of expert_groups groups
    // (scored by their two best experts summed when group_top2, else their best), the gates
    // times routed_scale; and its shared experts ungated (Qwen2-MoE's are sigmoid-gated).
    bool sigmoid_scores = false;
    bool choice_bias = false;
    std::int64_t expert_groups = 0;
    std::int64_t top_groups = 0;
    bool group_top2 = false;
    float routed_scale = 1.0f;
    bool shared_gate = true;
    // Layer l (0-based) is a mixture when (l + 1) % sparse_step == 0 and l is not among
    // dense_layers (Qwen's decoder_sparse_step and mlp_only_layers); the others keep the dense MLP.
    std::int64_t sparse_step = 1;
    std::vector<std::int64_t> dense_layers;

    bool sparse(std::int64_t layer) const;
    std::int64_t capacity(std::int64_t tokens) const;
  };
  Moe moe;

  // Multi-head latent attention (DeepSeek-V2/V3, Kimi K2), in place of q/k/v projections when
  // kv_lora_rank > 0: queries through a rank-q_lora_rank bottleneck (q_a_proj, its RMSNorm,
  // q_b_proj; or one q_proj when q_lora_rank is 0); keys and values from a shared latent of
  // kv_lora_rank (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj), each head's key qk_nope channels
  // from the latent and qk_rope rotary channels shared by every head (the decoupled key); values of
  // v_head channels. A serving cache would hold the latent and the rotary key, kv_lora_rank +
  // qk_rope values a token a layer.
  struct Mla {
    std::int64_t q_lora_rank = 0;
    std::int64_t kv_lora_rank = 0;
    std::int64_t qk_nope = 0;
    std::int64_t qk_rope = 0;
    std::int64_t v_head = 0;
    bool active() const { return kv_lora_rank > 0; }
    std::int64_t qk_head() const { return qk_nope + qk_rope; }
  };
  Mla mla;

  // Build rank `rank` of `degree` tensor-parallel ranks' slice (graph/tensor_parallel.h): query
  // and K/V heads, the MLP's hidden width and the vocabulary split between them (a dense MLP;
  // q/k norms per head or none).
  graph::TensorParallel tensor_parallel;
  // Build rank `rank` of `degree` expert-parallel ranks' share of every mixture layer's experts
  // (graph/expert_parallel.h): experts / degree of them, fed every rank's tokens by an all-to-all.
  graph::ExpertParallel expert_parallel;

  // Channels per head: head_dim, or width / heads.
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : width / heads; }
};

// The pieces the training graph (build_llama) and the decode step (models/gpt_decode.h) build
// alike, so both follow the config the same way.
namespace llama_parts {
// The head size, after checking that the heads split the width (or head_dim is given), group
// into the K/V heads, have an even size (rotary) and take the rotary_dims; a graph::GraphError
// otherwise.
std::int64_t checked_head_size(const LlamaConfig& config);
// How a projection splits under tensor parallelism (graph/tensor_parallel.h): not at all, by its
// output features (column-parallel: x is the same on every rank) or by its input features
// (row-parallel: x is this rank's slice; the partial products are summed over the ranks, then the
// bias added).
enum class Split : std::uint8_t { none, column, row };
// `x` W^T (+ bias) with W = `name`.weight [out, in] (and `name`.bias [out]): this rank's slice of
// it as `split` says when config.tensor_parallel is active (`out` and `in` are the whole sizes).
TensorId project(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& name, std::int64_t out,
                 std::int64_t in, bool bias, const std::string& op_name, Split split = Split::none);
// The config's norm of `x` [rows, width] (RMSNorm or LayerNorm), parameters `name`.weight/.bias.
TensorId norm(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& name);
// The q_norm/k_norm on `x` [rows, heads * head_size] as config.qk_norm says; `x` itself for none.
TensorId head_norm(graph::Builder& b, const LlamaConfig& config, TensorId x, std::int64_t rows, std::int64_t heads,
                   const std::string& name);
// The logits `x` W_head^T of the final norm's output, times config.logit_scale, soft-capped when
// config.final_softcap says.
TensorId logits(graph::Builder& b, const LlamaConfig& config, TensorId x, TensorId head);
// The token embeddings `h` [rows, width] as the first layer takes them: scaled by sqrt(width)
// (scale_embeddings) and embedding_multiplier, dropped out when `training`.
TensorId embeddings(graph::Builder& b, const LlamaConfig& config, TensorId h, bool training);
// The MLP of `x` [rows, width] (gated or plain), parameters under `prefix`.{gate,up,down}_proj.
TensorId mlp(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& prefix);
// The mixture of experts of `x` [rows, width] (config.moe), parameters under `prefix`: the router
// `prefix`.gate, the experts' stacked `prefix`.experts.{gate,up,down}_proj and the shared expert's
// `prefix`.shared_expert.* and `prefix`.shared_expert_gate. With `router_stats` and an auxiliary
// loss, the layer's router statistics [2, E] are added into *router_stats (kNoTensor at first).
TensorId moe(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& prefix, TensorId* router_stats);
// Decoder layer `layer` on the residual stream `h` [rows, width]: its norms, residual adds and MLP
// (or mixture of experts) as the config says; `attention` maps the attention's input [rows, width]
// to its output projection's result [rows, width] (the training graph's full attention, or a
// decode step's). `router_stats` as moe's.
TensorId layer(graph::Builder& b, const LlamaConfig& config, TensorId h, std::int64_t layer,
               const std::function<TensorId(TensorId)>& attention, TensorId* router_stats = nullptr);
// The load-balancing loss from the router statistics summed over the mixture layers (moe's):
// aux_loss_coef * E * sum_e (routed_e / tokens) (probs_e / tokens), tokens counted over layers.
TensorId load_balancing_loss(graph::Builder& b, const LlamaConfig& config, TensorId router_stats,
                             std::int64_t tokens_per_layer);
}  // namespace llama_parts

// What a plan of a mixture of experts assumes of the routing, for `tokens` tokens a step: "mixture
// of experts: 8 experts, 2 per token; each expert takes 1280 of the 4096 tokens (capacity factor
// 1.25 of a balanced 1024); token copies routed past an expert's slots are dropped for it
// (--moe-capacity-factor 0: none)". "" for a dense MLP.
std::string describe_moe_capacity(const LlamaConfig& config, std::int64_t tokens);

// Forward graph for `batch` sequences: inputs "x" [B, T] i32 and "labels" [B*T] i32; output
// "logits" [B*T, V]; loss "loss". Parameter names follow Hugging Face's LlamaForCausalLM
// (embed_tokens, layers.N.self_attn.{q,k,v,o}_proj, layers.N.mlp.{gate,up,down}_proj,
// layers.N.{input,post_attention}_layernorm, norm, lm_head). Attention per config.attention
// (fused keeps K/V at NKV heads; materialized repeats them and stores [B, NH, T, T] scores).
graph::Graph build_llama(const LlamaConfig& config, std::int64_t batch);

}  // namespace memplan::models
