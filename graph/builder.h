// The builder API models are written in: each call appends one op to the forward graph and
// returns its output tensor, so model code reads like the math (see models/mlp.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "memplan/graph/graph.h"

namespace memplan::graph {

// The seed of the dropout stream named `name` (FNV-1a of the name): the mask belongs to the op
// whatever the graph order.
std::uint64_t dropout_seed(const std::string& name);

// How moe_top_k chooses experts beyond the top_k largest probabilities (graph/op.h): a bias [E]
// added for the choice only, and group-limited routing.
struct MoeChoice {
  TensorId bias = kNoTensor;
  std::int64_t groups = 0;
  std::int64_t top_groups = 0;
  bool group_top2 = false;
};

class Builder {
 public:
  explicit Builder(Graph& graph, Phase phase = Phase::forward) : graph_(graph), phase_(phase) {}

  TensorId input(const std::string& name, Shape shape, DType dtype = DType::f32);
  TensorId parameter(const std::string& name, Shape shape, InitSpec init, DType dtype = DType::f32);
  // Persistent state that is not trained (batch-norm running statistics): role optimizer_state,
  // so it survives steps and is saved with the optimizer state, but params_sha256 skips it.
  // An i32 buffer holds constant indices (an imported Gather's, written once from the file).
  TensorId buffer(const std::string& name, Shape shape, InitSpec init, DType dtype = DType::f32);

  // y = x W^T + b with W [out, in] and b [out] (PyTorch's layout).
  TensorId linear(TensorId x, TensorId weight, TensorId bias, const std::string& name);
  TensorId matmul(TensorId a, TensorId b, bool trans_a, bool trans_b, const std::string& name);
  TensorId bias_add(TensorId x, TensorId bias, const std::string& name);
  TensorId add(TensorId a, TensorId b, const std::string& name);
  TensorId mul(TensorId a, TensorId b, const std::string& name);
  TensorId scale(TensorId x, float alpha, const std::string& name);
  // x at another floating dtype (f32 <-> bf16/f16); x itself when it has that dtype already.
  TensorId cast(TensorId x, DType dtype, const std::string& name);
  TensorId relu(TensorId x, const std::string& name);
  TensorId gelu(TensorId x, const std::string& name);
  TensorId reshape(TensorId x, Shape shape, const std::string& name);
  TensorId sum(TensorId x, const std::string& name);
  TensorId mean(TensorId x, const std::string& name);
  // Convolution of x [N, Cin, H, W] with w [Cout, Cin, K, K] (no bias): an im2col op whose
  // columns [N, Cin*K*K, OH*OW] are a graph tensor (kept for the weight gradient), then a GEMM.
  // `dilation` spaces the kernel's taps (OH = (H + 2P - D*(K-1) - 1) / S + 1). w may be
  // [Cout, Cin, K, K_W] with K_W != K (Inception's 1x7), and `padding_w` >= 0 pads the width by
  // its own amount (-1: `padding`).
  TensorId conv2d(TensorId x, TensorId w, std::int64_t stride, std::int64_t padding, const std::string& name,
                  std::int64_t dilation = 1, std::int64_t padding_w = -1);
  TensorId max_pool2d(TensorId x, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
                      const std::string& name);
  TensorId avg_pool2d(TensorId x, std::int64_t kernel, std::int64_t stride, const std::string& name);
  TensorId global_avg_pool(TensorId x, const std::string& name);  // [N, C, H, W] -> [N, C]
  // Batch norm over all dims but 1 of x [N, C, ...]. Training: batch statistics (a graph tensor
  // kept for backward) normalise x, and the running statistics are updated in place with
  // `momentum` (PyTorch's convention, unbiased variance). Inference: running statistics.
  TensorId batch_norm(TensorId x, TensorId gamma, TensorId beta, TensorId running_mean, TensorId running_var,
                      bool training, const std::string& name, float momentum = 0.1f, float eps = 1e-5f);
  // Layer norm over the last dim with gamma, beta [D]; the per-row statistics are a graph tensor.
  TensorId layer_norm(TensorId x, TensorId gamma, TensorId beta, const std::string& name, float eps = 1e-5f);
  // Rows of table [V, D] picked by i32 ids [...] -> [..., D].
  TensorId embedding(TensorId ids, TensorId table, const std::string& name);
  // op(A) op(B) for every leading index: [..., M, K] x [..., K, N] -> [..., M, N].
  TensorId batched_matmul(TensorId a, TensorId b, bool trans_a, bool trans_b, const std::string& name);
  // Softmax over the last dim; `causal` masks j > i in each trailing [T, T] block, and with
  // `window` > 0 also j <= i - window (a sliding window).
  TensorId softmax(TensorId x, bool causal, const std::string& name, std::int64_t window = 0);
  TensorId permute(TensorId x, std::vector<std::int64_t> perm, const std::string& name);
  // x * mask with mask in {0, 1/(1-p)} drawn from (op name, step): deterministic per run, new
  // each step; the mask is a graph tensor. Returns x itself when p == 0.
  TensorId dropout(TensorId x, float p, const std::string& name);
  // RMSNorm over the last dim with gamma [D] (LLaMA); no statistics tensor: backward recomputes them.
  TensorId rms_norm(TensorId x, TensorId gamma, const std::string& name, float eps = 1e-5f);
  TensorId silu(TensorId x, const std::string& name);
  // silu(gate) * up (same shapes): the gated MLP's activation as one op.
  TensorId swiglu(TensorId gate, TensorId up, const std::string& name);
  TensorId sigmoid(TensorId x, const std::string& name);
  TensorId tanh(TensorId x, const std::string& name);
  // min(max(x, lo), hi); an infinite bound leaves that side open (ReLU6: 0, 6).
  TensorId clip(TensorId x, float lo, float hi, const std::string& name);
  // Convolution of x [N, C, H, W] with w [Cout, C / groups, K, K] in `groups` channel groups
  // (groups == C == Cout: depthwise); no im2col columns are stored.
  TensorId grouped_conv2d(TensorId x, TensorId w, std::int64_t stride, std::int64_t padding, std::int64_t groups,
                          const std::string& name, std::int64_t dilation = 1);
  // x [N, C, ...] times a per-(sample, channel) gate g [N, C] or [N, C, 1, ..., 1] (squeeze and
  // excitation), without broadcasting the gate into memory.
  TensorId channel_scale(TensorId x, TensorId g, const std::string& name);
  // Mixtures of experts (graph/op.h: moe_*): each token's gates[N, E] for the `top_k` largest
  // router probabilities (renormalised to sum 1 when `normalize`), 0 elsewhere.
  TensorId moe_top_k(TensorId probs, std::int64_t top_k, bool normalize, const std::string& name, const MoeChoice& choice = {});
  // x [N, C] into [E, capacity, C]: each expert's tokens in token order, the first `capacity` kept.
  TensorId moe_dispatch(TensorId x, TensorId gates, std::int64_t capacity, const std::string& name);
  // ye [E, capacity, C] back to [N, C]: each token's kept experts' rows weighted by its gates, summed.
  TensorId moe_combine(TensorId ye, TensorId gates, const std::string& name);
  // [2, E] (f32): the tokens routed to each expert and the sum of their router probabilities.
  TensorId moe_router_stats(TensorId probs, TensorId gates, const std::string& name);
  // T5's relative attention bias [H, Tq, Tk] from table [buckets, H]: query i and key j take the
  // row of the bucket of j - i (graph/op.h: relative_position_bucket).
  TensorId relative_position_bias(TensorId table, std::int64_t queries, std::int64_t keys, bool bidirectional,
                                  std::int64_t max_distance, const std::string& name);
  // Rotary position embedding of x [..., T, HD] (positions 0..T-1 along dim -2).
  // rotary_dims > 0 rotates only each head's first rotary_dims channels (partial rotary).
  TensorId rotary(TensorId x, float base, const std::string& name, std::int64_t rotary_dims = 0);
  // [B, H, ...] -> [B, H*repeats, ...] (grouped-query attention's shared K/V heads); x when 1.
  TensorId repeat_heads(TensorId x, std::int64_t repeats, const std::string& name);
  TensorId concat(TensorId a, TensorId b, std::int64_t axis, const std::string& name);
  // A tensor of `shape` holding `value` everywhere (no inputs; written when the step runs).
  TensorId fill(Shape shape, float value, DType dtype, const std::string& name);
  TensorId slice(TensorId x, std::int64_t axis, std::int64_t start, std::int64_t length, const std::string& name);
  // Fused attention: softmax(scale q k^T) v with q [B, H, T, D], k and v [B, KH, T, D] (KH divides
  // H; K/V heads are shared, never repeated in memory). Two ops: `name`.lse [B, H, T] (f32, the
  // per-row log-sum-exp, saved for backward) and `name` [B, H, T, D]. Dropout p > 0 drops
  // probabilities with the mask dropout(probs, p, dropout_name) would draw over [B, H, T, T]
  // (dropout_name defaults to name + ".drop"), recomputed in backward rather than stored.
  // softcap > 0 caps each scaled score s to softcap * tanh(s / softcap) (Gemma-2).
  // `window` > 0 (with `causal`): query i sees keys i - window < j <= i only.
  TensorId attention(TensorId q, TensorId k, TensorId v, bool causal, float scale, float p, const std::string& name,
                     const std::string& dropout_name = "", float softcap = 0.0f, std::int64_t window = 0);
  // Generation with a KV cache (graph/op.h: kv_cache_write, decode_attention). external(): a
  // persistent tensor the caller binds outside the arena (a cache [blocks, block_size, NKV*HD]).
  TensorId external(const std::string& name, Shape shape, DType dtype = DType::f32);
  // With rope_base > 0 keys (heads of rotary_head_size) and queries are rotated by their
  // position first (rotary embedding, as Builder::rotary, over each head's first rotary_dims
  // channels, 0: all), and the cache holds rotated keys.
  void kv_cache_write(TensorId k, TensorId v, TensorId block_table, TensorId positions, TensorId k_cache,
                      TensorId v_cache, const std::string& name, std::int64_t rotary_head_size = 0,
                      float rope_base = 0.0f, std::int64_t rotary_dims = 0);
  TensorId decode_attention(TensorId q, TensorId k, TensorId v, TensorId k_cache, TensorId v_cache,
                            TensorId block_table, TensorId positions, std::int64_t heads, std::int64_t kv_heads,
                            const std::string& name, float rope_base = 0.0f, std::int64_t rotary_dims = 0,
                            float scale = 0.0f, float softcap = 0.0f);
  // Multi-head latent attention's decode step (graph/op.h: latent_*): one cache row a position
  // holding [rotary key, latent], every query head's key, and from channel value_start on its value.
  // With rope_base > 0 the first rotary_dims channels of the key and of each query head rotate by the position.
  void latent_cache_write(TensorId key, TensorId block_table, TensorId positions, TensorId cache, const std::string& name,
                          float rope_base = 0.0f, std::int64_t rotary_dims = 0);
  TensorId latent_decode_attention(TensorId q, TensorId key, TensorId cache, TensorId block_table, TensorId positions,
                                   std::int64_t heads, std::int64_t value_start, const std::string& name,
                                   float rope_base = 0.0f, std::int64_t rotary_dims = 0, float scale = 0.0f,
                                   float softcap = 0.0f);
  // Mean softmax cross-entropy of logits [B, C] against i32 labels [B].
  TensorId cross_entropy(TensorId logits, TensorId labels, const std::string& name);
  // The same loss of logits h w^T (h [B, C], w [V, C]) without storing them: `chunk_rows` rows
  // at a time (0: every row; else a multiple of graph::kLossRowBlock), recomputed in the backward
  // pass (graph/fused_loss.h). The per-row log-sum-exp is `name`.lse.
  TensorId linear_cross_entropy(TensorId h, TensorId w, TensorId labels, std::int64_t chunk_rows, const std::string& name);

  Graph& graph() { return graph_; }

 private:
  TensorId unary(OpKind kind, TensorId x, const std::string& name, OpAttrs attrs = {});
  TensorId binary(OpKind kind, TensorId a, TensorId b, const std::string& name, OpAttrs attrs = {});
  Graph& graph_;
  Phase phase_;
};

}  // namespace memplan::graph
