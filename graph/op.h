// Ops of the static training graph: kind, operands, attributes, and one table of rows keyed by
// kind (name, shape rule, dtype rule, FLOPs, in-place inputs, gradient rule), each row written in
// its family's file (graph/op_*.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/graph/tensor.h"

namespace memplan::graph {

enum class OpKind : std::uint8_t {
  // forward
  matmul,                 // C[M,N] = op(A) op(B), op = optional transpose; 2-D operands
  bias_add,               // y[..., N] = x[..., N] + b[N]
  add,                    // y = a + b (same shape)
  mul,                    // y = a * b (same shape)
  scale,                  // y = alpha * x
  relu,                   // y = max(x, 0)
  gelu,                   // y = x * Phi(x)  (exact, erf-based, as PyTorch's default)
  reshape,                // a view of x with another shape (no copy)
  sum,                    // scalar = sum(x)
  mean,                   // scalar = mean(x)
  softmax_cross_entropy,  // scalar = mean_i(-log softmax(logits_i)[label_i]); labels i32
  // The output projection and its cross-entropy fused (graph/fusions.h): logits = h w^T are
  // never stored whole, only `chunk_rows` rows of them at a time in the op's scratch (0: all rows)
  linear_cross_entropy_lse,  // lse[N] (f32) = log sum_v exp(h_n . w_v)   inputs: h[N, C], w[V, C]
  linear_cross_entropy,      // loss (f32) = mean_n(lse[n] - h_n . w_{label n})   inputs: h, w, labels[N] i32, lse
  // A frozen linear layer whose weight is stored quantized (graph/quantize.h): trans_b: y[N, out] =
  // x[N, in] deq(W)^T, else y[N, in] = x[N, out] deq(W); W dequantized a tile of rows at a time in
  // the op's scratch. inputs: x, then the weight's storage tensors in its layout's order
  quant_matmul,
  // convolutional nets (NCHW; square kernels; `kernel`, `stride`, `padding`, `dilation` in attrs)
  im2col,                 // cols[N, C*K*K, OH*OW] from x[N, C, H, W]; tap (kh, kw) reads x at
                          // (oh*S + kh*D - P, ow*S + kw*D - P)
  conv2d,                 // y[N, Cout, OH, OW] = w[Cout, Cin*K*K] cols[n]  inputs: cols, w[Cout,Cin,K,K]; shape = {OH, OW}
  max_pool2d,             // y[N, C, OH, OW] = max over each window (padding counts as -inf)
  avg_pool2d,             // y[N, C, OH, OW] = mean over each K*K window (no padding)
  global_avg_pool,        // y[N, C] = mean over H, W of x[N, C, H, W]
  batch_norm_stats,       // stats[2, C] = (mean, biased variance) over all dims but 1 of x[N, C, ...]
  batch_norm_centered_stats,  // stats[2, C] = (m, mean of (x - m)^2) with m = row 0 of inputs[1]   inputs: x, stats
  batch_norm,             // y = (x - mean) / sqrt(var + eps) * gamma + beta   inputs: x, stats, gamma, beta
  batch_norm_inference,   // the same with running statistics   inputs: x, running_mean, running_var, gamma, beta
  running_stats_update,   // updates: running_mean, running_var;  inputs: stats (momentum; alpha = M/(M-1))
  layer_norm_stats,       // stats[rows, 2] = (mean, 1/sqrt(var + eps)) over the last dim
  layer_norm,             // y = (x - mean) * rstd * gamma + beta   inputs: x, stats, gamma[D], beta[D]
  embedding,              // y[..., D] = table[ids[...]]          inputs: ids (i32), table[V, D]; with `world` > 1
                          // (vocabulary-parallel) the table holds ids [start, start + V), others give 0
  batched_matmul,         // C[..., M, N] = op(A) op(B) per leading index; rank >= 3, equal leading dims
  softmax,                // y = softmax over the last dim; `causal`: row i of each [T, T] block sees j <= i
                          // (and j > i - `window` when window > 0)
  permute,                // y = x with dims reordered by `perm` (a copy)
  dropout_mask,           // mask[shape] in {0, 1/(1-p)}, from (seed, step, index); no inputs
  rms_norm,               // y = x / sqrt(mean(x^2) + eps) * gamma over the last dim   inputs: x, gamma[D]
  silu,                   // y = x * sigmoid(x)
  rotary,                 // rotary position embedding of x[..., T, HD] (pairs i, i + HD/2; position = index
                          // along T; theta = rope_base); `inverse` rotates by the negative angle
  repeat_heads,           // y[B, H*R, ...] = x[B, H, ...] with head h of y = head h/R of x (R = `repeats`)
  concat,                 // y = a and b joined along `axis` (other dims equal)
  slice,                  // y = x[start, start + length) along `axis` (a copy)
  // fused attention (FlashAttention's algorithm; q [B, H, T, D], k and v [B, KH, T, D] with H a
  // multiple of KH: query head h reads K/V head h / (H/KH)); `alpha` scales the scores, `causal`
  // masks j > i (and j <= i - `window` when window > 0), `dropout` (with `seed`) drops probabilities as dropout_mask over [B, H, T, T] would
  attention_lse,          // lse[B, H, T] (f32) = log sum_j exp(alpha q_i.k_j), key tile by tile   inputs: q, k
  attention,              // y[B, H, T, D] = dropout(exp(alpha q k^T - lse)) v   inputs: q, k, v, lse
  // generation with a KV cache (runtime/serve): one token per sequence slot; a slot whose first
  // block-table entry is -1 is empty. Caches are [blocks, block_size, NKV*HD], external storage.
  kv_cache_write,         // updates: k_cache, v_cache;  inputs: k[B, NKV*HD], v, block_table[B, MB] i32, positions[B] i32
                          // slot b's k, v stored at position positions[b] through its block table;
                          // shape = {HD} rotates the key's heads by the position first (rotary)
  decode_attention,       // y[B, NH*HD]  inputs: q[B, NH*HD], k, v, k_cache, v_cache, block_table, positions;
                          // causal attention of each slot's query over cached positions < positions[b] and
                          // its own k, v (the step's kv_cache_write, an update, runs after it);
                          // shape = {NH, NKV}, or {NH, NKV, 1} to rotate q and k by the position (rotary);
                          // `alpha` scales the scores (0: 1 / sqrt(HD)), `softcap` caps them
  // multi-head latent attention's cache (DeepSeek-V2/V3): one row a position, [rotary key, latent],
  // read by every query head as its key and (the latent, channels from `start`) as its value
  latent_cache_write,     // updates: cache[blocks, block_size, HD];  inputs: key[B, HD], block_table, positions;
                          // shape = {HD} rotates the key's first rotary_dims channels by the position first
  latent_decode_attention,  // y[B, NH*(HD - start)]  inputs: q[B, NH*HD], key[B, HD], cache, block_table, positions;
                            // decode_attention with one K/V head whose values are the keys' channels [start, HD);
                            // shape = {NH}, or {NH, 1} to rotate q and the key (rotary_dims <= start)
  // activations and convolutions of imported mobile nets (import/onnx_import.cpp)
  sigmoid,                // y = 1 / (1 + exp(-x))
  tanh,                   // y = tanh(x)
  clip,                   // y = min(max(x, clip_min), clip_max)  (ReLU6: 0, 6)
  cast,                   // y = x converted to attrs.dtype (f32 <-> bf16/f16, rounded to nearest even; a copy
                          // at the same dtype): LoRA adapters kept in f32 beside a 16-bit model, as PEFT keeps them
  grouped_conv2d,         // y[N, Cout, OH, OW]  inputs: x[N, C, H, W], w[Cout, C/groups, K, K]; output channel
                          // co reads the input channels of its group (groups = C: depthwise)
  channel_scale,          // y[n, c, ...] = x[n, c, ...] * g[n, c]   inputs: x[N, C, ...], g[N, C] or [N, C, 1, ..., 1]
                          // (a squeeze-and-excitation gate; the gate is never broadcast into memory)
  swiglu,                 // y = silu(gate) * up   inputs: gate, up (same shape): the gated MLP's activation
  // mixtures of experts (models/llama.h): gates[N, E] hold each token's weight for the experts it
  // is routed to and 0 elsewhere (a token is routed to expert e where gates[n, e] != 0). Expert e
  // takes its routed tokens in token order into `capacity` slots; tokens beyond are dropped for e.
  moe_top_k,              // gates[N, E] = the `top_k` largest of probs[N, E] in each row (ties: the lower
                          // index), 0 elsewhere; `normalize` divides them by their sum   inputs: probs
                          // [, bias[E]: added to probs for the choice only (DeepSeek-V3's correction
                          // bias)]; expert_groups > 1: only experts of the top_groups best groups of
                          // E / expert_groups are chosen, a group scored by its largest choice value
                          // or, group_top2, by its two largest summed (DeepSeek's group-limited routing)
  moe_dispatch,           // xe[E, capacity, C]: slot s of expert e = w x[n] for its s-th kept token n,
                          // w = gates[n, e] if `weighted` else 1; unfilled slots 0   inputs: x[N, C], gates
  moe_combine,            // y[N, C] = sum over e (ascending) of w ye[e, slot of n in e] for the experts that
                          // kept n, w as moe_dispatch's   inputs: ye[E, capacity, C], gates[N, E]
  moe_router_stats,       // stats[2, E] (f32): row 0 the tokens routed to each expert (capacity aside), row 1
                          // the sum of probs over tokens (the load-balancing loss's terms)   inputs: probs, gates
  relative_position_bias,  // bias[H, Tq, Tk] = table[bucket(j - i), h] (T5's relative attention bias; query i,
                           // key j; buckets as relative_position_bucket below)   inputs: table[buckets, H];
                           // shape = {Tq, Tk}, `buckets`, `max_distance`, `bidirectional`
  // backward-only helpers
  relu_backward,                   // dx = dy * (y > 0)              inputs: dy, y
  gelu_backward,                   // dx = dy * gelu'(x)             inputs: dy, x
  broadcast_scalar,                // y[shape] = alpha * g           inputs: g (scalar)
  reduce_rows,                     // y[N] = sum over rows of x[..., N]
  softmax_cross_entropy_backward,  // dlogits                        inputs: dloss, logits, labels
  linear_cross_entropy_backward,   // [N + V, C] = dh then dw, with dlogits = (exp(h w^T - lse) - onehot) * dloss / N
                                   // recomputed chunk by chunk   inputs: dloss, h, w, labels, lse (chunk_rows)
  fill,                            // y[shape] = alpha               no inputs
  conv2d_backward_weight,          // dw[Cout, Cin, K, K]            inputs: dy, cols; shape = w dims
  conv2d_backward_cols,            // dcols[N, Cin*K*K, OH*OW]       inputs: dy, w
  col2im,                          // dx[shape] (scatter-add)        inputs: dcols; shape = x dims
  max_pool2d_backward,             // dx to each window's first max  inputs: dy, x
  avg_pool2d_backward,             // dx                             inputs: dy; shape = x dims
  global_avg_pool_backward,        // dx[N, C, H, W] = dy / (H*W)    inputs: dy; shape = x dims
  batch_norm_backward,             // dx   inputs: dy, x, stats, gamma, dgamma, dbeta (eps)
  batch_norm_dgamma,               // [C] = sum dy * xhat            inputs: dy, x, stats (eps)
  channel_sum,                     // [C] = sum over all dims but 1  inputs: x[N, C, ...]
  layer_norm_backward,             // dx                             inputs: dy, x, stats, gamma
  layer_norm_dgamma,               // [D] = sum over rows dy * xhat  inputs: dy, x, stats
  embedding_backward,              // dtable[V, D], rows summed in position order  inputs: dy, ids; shape = {V, D}
                                   // (embedding's `world` and `start`)
  softmax_backward,                // dx = y * (dy - sum(dy * y))    inputs: dy, y
  rms_norm_backward,               // dx                             inputs: dy, x, gamma (norm_eps)
  rms_norm_dgamma,                 // [D] = sum over rows dy * xhat  inputs: dy, x (norm_eps)
  silu_backward,                   // dx = dy * silu'(x)             inputs: dy, x
  repeat_heads_backward,           // dx[B, H, ...] = sum of the R copies' dy   inputs: dy
  attention_backward_dot,          // delta[B, H, T] (f32) = rowwise dot(dy, y)  inputs: dy, y (attention's)
  attention_backward,              // [B, H + 2KH, T, D] = dq, dk, dv along dim 1, probabilities recomputed
                                   // tile by tile      inputs: dy, q, k, v, lse, delta (attention's attrs)
  sigmoid_backward,                // dx = dy * y * (1 - y)          inputs: dy, y
  tanh_backward,                   // dx = dy * (1 - y * y)          inputs: dy, y
  clip_backward,                   // dx = dy where clip_min < x < clip_max, else 0   inputs: dy, x
  grouped_conv2d_backward_input,   // dx[N, C, H, W]                 inputs: dy, w; shape = x dims
  grouped_conv2d_backward_weight,  // dw[Cout, C/groups, K, K]       inputs: dy, x; shape = w dims
  channel_scale_backward,          // dg[n, c] = sum over ... of dy * x   inputs: dy, x; shape = g dims
  moe_top_k_backward,              // dprobs[N, E]   inputs: dgates, gates, probs (moe_top_k's attrs)
  moe_combine_backward_gates,      // dgates[n, e] = dot(dy[n], ye[e, slot]) where e kept n, else 0
                                   //   inputs: dy[N, C], ye[E, capacity, C], gates[N, E]
  moe_router_stats_backward,       // dprobs[n, e] = dstats[1, e]    inputs: dstats[2, E]; shape = probs dims, dtype
  relative_position_bias_backward,  // dtable[buckets, H]: dbias summed into each bucket by ascending distance
                                    //   j - i, each distance over ascending i   inputs: dbias[H, Tq, Tk]
                                    //   (relative_position_bias's attrs)
  // optimizer updates: modify their `updates` operands in place
  sgd_update,           // updates: param;                   inputs: grad
  sgd_momentum_update,  // updates: param, momentum buffer;  inputs: grad
  adamw_update,  // updates: param, m, v;             inputs: grad
  // mixed precision: a 16-bit param and grad, an f32 master copy the update applies to (then
  // rounded into the param)
  sgd_update_mixed,           // updates: param, master;                  inputs: grad
  sgd_momentum_update_mixed,  // updates: param, master, momentum buffer; inputs: grad
  adamw_update_mixed,         // updates: param, master, m, v;            inputs: grad
  // 8-bit AdamW (bitsandbytes' block-wise states, graph/optimizer.h): m and v as u8 codes of the
  // signed and unsigned dynamic maps, each block of 256 scaled by its f32 absmax
  adamw8bit_update,        // updates: param, m codes, v codes, m absmax, v absmax;          inputs: grad
  adamw8bit_update_mixed,  // updates: param, master, m codes, v codes, m absmax, v absmax;  inputs: grad
  // fp16 loss scaling: y = 1 when every input (the gradients the updates read) is finite, else
  // 0; the executor skips the step's updates on 0 (graph/mixed_precision.h: add_loss_scaling)
  grads_finite,
  // optimizer offload (graph/optimizer.h: offload_optimizer): y = x, in host memory (a gradient
  // copied out for the update the CPU runs on state kept there)
  to_host,
  // data parallel (graph/data_parallel.h): collectives over the `world` ranks through the
  // executor's communicator, and the flat layout they move. Shards follow dist/shard.h.
  pack,             // flat[world * S] from inputs x_i (any number): chunk r holds rank r's shard of each x_i
                    // in input order (S = sum of ceil(numel_i / world)), padding zeroed
  all_reduce,       // y = alpha * sum over ranks of x, in place (a view of x)
  reduce_scatter,   // y[S] = alpha * sum over ranks of chunk `rank` of x[world * S]
  all_gather,       // y[shape] = the flat tensor whose shards the ranks hold in x[ceil(numel / world)]
  all_gather_into,  // updates: x; x = the flat tensor whose shards the ranks hold in place in their x (ZeRO-1/2)
  // expert parallel (graph/expert_parallel.h): chunk r of x (x[0] split into `world` equal parts)
  // goes to rank r, and chunk r of y is what rank r sent this rank (MPI_Alltoall); its gradient is
  // the same exchange of dy
  all_to_all,
  // tensor parallel (graph/tensor_parallel.h; Megatron-LM's layers): the collectives above with
  // `group` tensor run over the ranks that split each layer, these around them
  tp_copy,                // y = x (a view): the input of column-parallel layers; its gradient is summed over the
                          // tensor-parallel ranks (Megatron's f)
  vocab_parallel_stats,   // stats[N, 2] (f32) = (log-sum-exp of the row's logits this rank holds, the label's
                          // logit when this rank holds it, else 0)   inputs: logits[N, Vr] (columns
                          // [start, start + Vr) of the vocabulary, the first `length` real), labels[N] i32
  vocab_parallel_loss,    // loss (f32) = mean over rows of (log-sum-exp over ranks of their lse) - sum over ranks
                          // of their label logit   inputs: every rank's stats [world, N, 2], logits, labels
                          // (read by the gradient rule only)
  vocab_parallel_cross_entropy_backward,  // dlogits[N, Vr] = (softmax over the whole vocabulary - onehot) * dloss / N
                                          // inputs: dloss, logits, labels, gathered stats (vocab_parallel_stats's attrs)
  count_
};

inline constexpr int kOpKindCount = static_cast<int>(OpKind::count_);
// The most experts moe_top_k routes among (its CPU kernel keeps a flag per expert on the stack).
inline constexpr std::int64_t kMaxExperts = 4096;

enum class Phase : std::uint8_t { forward, backward, optimizer, recompute };
std::string_view phase_name(Phase phase);

// RankGroup (graph/tensor.h): the ranks a collective runs over.
std::string_view rank_group_name(RankGroup group);

// How a quantized weight is stored (graph/quantize.h gives each layout).
enum class QuantFormat : std::uint8_t { none, nf4, fp4, int8, fp8, gptq, awq };
// The names --quant takes.
inline constexpr EnumName<QuantFormat> kQuantFormatNames[] = {
    {"none", QuantFormat::none}, {"nf4", QuantFormat::nf4},   {"fp4", QuantFormat::fp4}, {"int8", QuantFormat::int8},
    {"fp8", QuantFormat::fp8},   {"gptq", QuantFormat::gptq}, {"awq", QuantFormat::awq}};


struct OpAttrs {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;              // scale, fill, broadcast_scalar, running_stats_update, attention* and
                                   // decode_attention (score scale)
  std::vector<std::int64_t> shape; // reshape, fill, broadcast_scalar, dropout_mask, backward ops: an
                                   // output shape; conv2d: {OH, OW}
  // convolution and pooling (square windows)
  std::int64_t kernel = 1;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t groups = 1;         // grouped_conv2d*: channel groups (C and Cout divide by it)
  // im2col, col2im, conv2d*: a kernel of another width than its height (Inception's 1x7 and 7x1),
  // with a padding of its own for the width; 0 and -1: as kernel and padding (square)
  std::int64_t kernel_w = 0;
  std::int64_t padding_w = -1;
  std::int64_t dilation = 1;       // im2col, col2im, conv2d*, grouped_conv2d*: spacing of the kernel's taps
                                   // (the window spans D*(K-1)+1); pooling takes 1 only
  float clip_min = 0.0f;           // clip, clip_backward: the range (infinite for an open side)
  float clip_max = 0.0f;
  std::vector<std::int64_t> perm;  // permute: output dim i is input dim perm[i]
  bool causal = false;             // softmax, attention*
  // softmax and attention* with `causal`: a sliding window, query i sees keys i - window < j <= i
  // (Mistral's and Gemma's local layers); 0: every j <= i
  std::int64_t window = 0;
  // attention*, decode_attention: scores soft-capped to softcap * tanh(score / softcap) before the
  // softmax (Gemma-2's attn_logit_softcapping); 0: none
  float softcap = 0.0f;
  float dropout = 0.0f;            // dropout_mask, attention*: the probability of zeroing an element
  std::uint64_t seed = 0;          // dropout_mask, attention*: fixed per op (from its name), mixed with the step
  float norm_eps = 1e-5f;          // batch_norm*, layer_norm_stats, rms_norm*
  DType dtype = DType::f32;        // fill, broadcast_scalar, dropout_mask: the output dtype; swiglu: the
                                   // dtype its SiLU is rounded to before the product (graph::fuse_swiglu)
  std::int64_t axis = 0;           // concat, slice
  std::int64_t start = 0;          // slice; latent_decode_attention: the value's first channel
  std::int64_t length = 0;         // slice
  std::int64_t repeats = 1;        // repeat_heads*
  std::int64_t chunk_rows = 0;     // linear_cross_entropy*: logits rows computed at a time (0: all)
  // quant_matmul: the weight's storage, whether its block scales are quantized again (nf4, fp4),
  // and its group size (gptq, awq); `shape` holds the weight's [out, in] and trans_b whether the
  // product is x W^T (forward) or dy W (the input's gradient).
  QuantFormat quant = QuantFormat::none;
  bool double_quant = false;
  std::int64_t group_size = 0;
  std::int64_t world = 1;          // pack, collectives: the number of ranks
  // collectives: the ranks they run over: the data-parallel group (every rank without tensor
  // parallelism) or the tensor-parallel group (graph/tensor_parallel.h)
  RankGroup group = RankGroup::data;
  // Optimizer updates of one rank's shard (ZeRO-1/2): the update reads a gradient and state of
  // the shard's size and updates elements [shard_offset, + shard_count) of the full parameter;
  // shard_count < 0: the whole tensor (the default).
  std::int64_t shard_offset = 0;
  std::int64_t shard_count = -1;
  float rope_base = 10000.0f;      // rotary, kv_cache_write, decode_attention, latent_*
  // rotary, kv_cache_write, decode_attention, latent_*: the channels of each head that rotate, the first
  // ones (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor); the rest pass through. 0: all.
  std::int64_t rotary_dims = 0;
  bool inverse = false;            // rotary
  std::int64_t top_k = 1;          // moe_top_k*: experts per token
  bool normalize = false;          // moe_top_k*: gates divided by their sum
  std::int64_t expert_groups = 0;  // moe_top_k: groups of experts the choice is limited to (0, 1: none)
  std::int64_t top_groups = 0;     // moe_top_k: the groups a token may use
  bool group_top2 = false;         // moe_top_k: a group's score is its two largest values summed, else its largest
  std::int64_t capacity = 1;       // moe_dispatch: slots per expert
  bool weighted = true;            // moe_dispatch, moe_combine: rows scaled by their gates
  // relative_position_bias*: T5's buckets of key-minus-query distances, and whether keys after the
  // query get buckets of their own (the encoder) or share bucket 0 (the causal decoder)
  std::int64_t buckets = 32;
  std::int64_t max_distance = 128;
  bool bidirectional = true;
  // optimizer hyper-parameters
  float lr = 0.0f;
  float momentum = 0.0f;  // also running_stats_update: new = (1 - m) * old + m * batch
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // fill: the loss gradient's seed, multiplied by the step's loss scale (fp16 loss scaling; 1
  // otherwise), which the mixed updates divide out of the gradients again
  bool loss_scaled = false;
};

struct Op {
  OpKind kind = OpKind::add;
  std::string name;
  std::vector<TensorId> inputs;   // read
  std::vector<TensorId> outputs;  // written, produced by this op
  std::vector<TensorId> updates;  // read and written in place (persistent tensors)
  OpAttrs attrs;
  Phase phase = Phase::forward;
};

struct OutputSpec {
  Shape shape;
  DType dtype = DType::f32;
};

// OpInfo::num_inputs of an op taking one or more inputs (pack).
inline constexpr int kVariadic = -1;

class GradContext;  // graph/grad_context_internal.h
// Appends the backward ops of `op` given dy, the gradient of its output (graph/autograd.h).
using GradRule = void (*)(GradContext& context, const Op& op, TensorId dy);

// A set of dtypes (one bit per DType).
struct DTypeSet {
  std::uint8_t bits = 0;
  constexpr bool contains(DType d) const { return (bits >> static_cast<int>(d)) & 1u; }
  static constexpr DTypeSet of(std::initializer_list<DType> dtypes) {
    DTypeSet s;
    for (DType d : dtypes) s.bits = static_cast<std::uint8_t>(s.bits | (1u << static_cast<int>(d)));
    return s;
  }
};
inline constexpr DTypeSet kFloatingDTypes = DTypeSet::of({DType::f32, DType::f16, DType::bf16});

// One op: everything the graph, autograd, the planner and the profiler know of it. Rows live with
// their family (graph/op_elementwise.cpp, op_normalization.cpp, ...); adding an op is adding its
// kind to OpKind and its row there (and kernels, which register beside themselves).
struct OpInfo {
  OpKind kind = OpKind::count_;  // the row's key: op_info(kind).kind == kind
  std::string_view name;
  int num_inputs = 0;   // exact count, or kVariadic
  int num_updates = 0;  // exact count
  int num_outputs = 1;  // 1, or 0 for in-place updates
  bool output_is_view = false;  // the output aliases inputs[0] (no storage of its own)
  // Shape inference; throws GraphError naming the op and the mismatch.
  OutputSpec (*infer)(std::span<const TensorDesc* const> inputs, const OpAttrs& attrs) = nullptr;
  // Floating-point operations for one execution, from shapes: multiply-adds count 2,
  // transcendental functions 1 each; ops that only move data count 0. The one formula:
  // checkpointing's recompute cost and the step profile both read it (op_flops in graph.h).
  double (*flops)(std::span<const TensorDesc* const> inputs, const TensorDesc* output) = nullptr;
  // Bit i: the output may take input i's storage when that input dies here (the elementwise
  // kernels read each element before writing it); liveness reads this.
  std::uint8_t in_place_inputs = 0;
  // The floating dtypes the op takes for its floating inputs (Graph::add_op refuses others): every
  // floating dtype unless the row says otherwise (an f32 optimizer update takes an f32 gradient;
  // a 16-bit gradient takes the mixed update, whose master copy is f32).
  DTypeSet accepts = kFloatingDTypes;
  // nullptr where the op is never differentiated: backward helpers and optimizer updates (not on
  // a path from parameters to the loss), running_stats_update (no output), the statistics ops
  // (their gradient paths are inside batch_norm_backward, layer_norm_backward and
  // attention_backward), dropout_mask (no inputs), batch_norm_inference (inference graphs have no
  // backward).
  GradRule grad = nullptr;
  // Splitting by rows, which lets a device without 16-bit arithmetic (the CPU) compute a 16-bit op
  // in f32 copies of a slice of rows at a time (graph/mixed_precision.h): each output row (index
  // along dimension 0) depends only on the same rows of the inputs in `row_inputs` (a bitmask)
  // and on the whole of the other inputs. `split_rows_when`, where set, says for which attributes
  // that holds (an untransposed matmul operand; attention without dropout, whose mask follows
  // absolute positions).
  bool split_rows = false;
  std::uint8_t row_inputs = 0;
  bool (*split_rows_when)(const OpAttrs& attrs) = nullptr;
  // With split_rows: the op sums its row inputs over their rows into whole outputs (a bias
  // gradient, a convolution's weight gradient over the samples). A slice of rows then adds into
  // the output the earlier slices wrote (KernelCall::accumulate), so the outputs are not split.
  bool sums_rows = false;
  // The output is the input itself under another shape (reshape): nothing is computed, so no copy.
  bool pure_view = false;
  // Every update op of the step is scheduled after this op (grads_finite: the executor skips the
  // updates when it reports an overflow).
  bool gates_updates = false;
  // A collective: every rank runs it, and all ranks must run the step's collectives in the same
  // order (an order search keeps theirs; the executor checks the op's world against its communicator).
  bool communicates = false;
  // Bytes of scratch the kernels need beyond the operands (on every device, at f32), planned in
  // the step's workspace (graph::kernel_scratch_bytes): a chunk of logits for the fused loss.
  // nullptr: none.
  std::int64_t (*scratch)(std::span<const TensorDesc* const> inputs, const OpAttrs& attrs) = nullptr;

  bool may_run_in_place(int input_index) const {
    return input_index >= 0 && input_index < 8 && ((in_place_inputs >> input_index) & 1u) != 0;
  }
};

// The row of `kind`. The table is assembled from the families' rows on first use; a kind with no
// row or with two fails there (MEMPLAN_CHECK) rather than returning another op's metadata.
const OpInfo& op_info(OpKind kind);
// Every row, in OpKind order: row i states kind i (tests/op_table_test.cpp checks this).
std::span<const OpInfo> op_table();
inline std::string_view op_name(OpKind kind) { return op_info(kind).name; }
// Pairs of ops a backend may run as one kernel when the second directly follows the first and
// reads its output (kernels/kernel.h: find_fused_kernel): an im2col and the product reading its
// columns, the columns' gradient and its col2im. The memory-aware schedule keeps them adjacent.
bool fusable_pair(OpKind first, OpKind second);

// A convolution window's width and left/right padding (OpAttrs::kernel_w, padding_w): its own, or
// the height's for a square window.
inline std::int64_t kernel_width(const OpAttrs& a) { return a.kernel_w > 0 ? a.kernel_w : a.kernel; }
inline std::int64_t padding_width(const OpAttrs& a) { return a.padding_w >= 0 ? a.padding_w : a.padding; }

// T5's bucket of a key-minus-query distance (relative_position_bias): with `bidirectional`, half
// the buckets for keys after the query; exact for distances below half the (half) buckets, then
// logarithmic up to max_distance, the last bucket beyond. transformers' float32 arithmetic, so the
// buckets are PyTorch's.
std::int64_t relative_position_bucket(std::int64_t relative, bool bidirectional, std::int64_t buckets,
                                      std::int64_t max_distance);

}  // namespace memplan::graph
