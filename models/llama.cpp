#include "memplan/models/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
  if (config.rotary_dims < 0 || config.rotary_dims % 2 != 0 || config.rotary_dims > config.head_size()) {
    throw graph::GraphError("llama: rotary_dims " + std::to_string(config.rotary_dims) + " must be even and at most the head size " +
                            std::to_string(config.head_size()));
  }
  return config.head_size();
}

TensorId project(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& name, std::int64_t out,
                 std::int64_t in, bool bias, const std::string& op_name, Split split) {
  const graph::InitSpec w_init{graph::InitSpec::Kind::normal, 0.02f};
  const graph::InitSpec zeros{graph::InitSpec::Kind::zeros, 0.0f};
  const graph::TensorParallel& tp = config.tensor_parallel;
  if (split == Split::row && tp.active()) {
    const TensorId w = graph::parameter_slice(b, tp, name + ".weight", {out, in}, 1, w_init, config.dtype);
    // The partial product keeps the projection's name: the sum is in place, so the buffer is it.
    const TensorId summed = graph::row_output(b, tp, b.matmul(x, w, false, true, op_name), op_name + ".sum");
    if (!bias) return summed;
    return b.bias_add(summed, graph::sequence_parallel_parameter(b, tp, b.parameter(name + ".bias", {out}, zeros, config.dtype)),
                      op_name + ".bias");
  }
  const int axis = split == Split::column ? 0 : -1;  // -1: whole on every rank
  auto param = [&](const std::string& param_name, const graph::Shape& shape, graph::InitSpec init) {
    return axis < 0 ? b.parameter(param_name, shape, init, config.dtype)
                    : graph::parameter_slice(b, tp, param_name, shape, axis, init, config.dtype);
  };
  const TensorId w = param(name + ".weight", {out, in}, w_init);
  if (!bias) return b.matmul(x, w, false, true, op_name);
  return b.linear(x, w, param(name + ".bias", {out}, zeros), op_name);
}

namespace {

// The MLP's body as config says, gated (down(act(gate x) * up x)) or plain (down(act(up x))), over
// `in` ("gate_proj", "up_proj" or "down_proj", the input, its output width) that projects: the
// dense MLP's matrices or the experts' batched ones. Activations are named `prefix`.act, .glu.
TensorId mlp_body(graph::Builder& b, const LlamaConfig& config, TensorId x, std::int64_t hidden_width,
                  const std::function<TensorId(const char*, TensorId, std::int64_t)>& in, const std::string& prefix) {
  TensorId hidden;
  if (config.gated_mlp) {
    const TensorId gate = apply_activation(b, config.gate, in("gate_proj", x, hidden_width), prefix + ".act");
    hidden = b.mul(gate, in("up_proj", x, hidden_width), prefix + ".glu");
  } else {
    hidden = apply_activation(b, config.gate, in("up_proj", x, hidden_width), prefix + ".act");
  }
  return in("down_proj", hidden, config.width);
}

}  // namespace

TensorId norm(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& name) {
  // The residual stream's norms: on this rank's rows under sequence parallelism (their parameters'
  // gradients summed over the ranks).
  const graph::TensorParallel& tp = config.tensor_parallel;
  const graph::InitSpec ones{graph::InitSpec::Kind::ones, 0.0f};
  const TensorId weight = graph::sequence_parallel_parameter(b, tp, b.parameter(name + ".weight", {config.width}, ones, config.dtype));
  if (config.norm == LlamaConfig::Norm::rms) return b.rms_norm(x, weight, name);
  const graph::InitSpec zeros{graph::InitSpec::Kind::zeros, 0.0f};
  return b.layer_norm(x, weight, graph::sequence_parallel_parameter(b, tp, b.parameter(name + ".bias", {config.width}, zeros, config.dtype)),
                      name);
}

TensorId head_norm(graph::Builder& b, const LlamaConfig& config, TensorId x, std::int64_t rows, std::int64_t heads,
                   const std::string& name) {
  const std::int64_t HD = config.head_size();
  const graph::InitSpec ones{graph::InitSpec::Kind::ones, 0.0f};
  switch (config.qk_norm) {
    case LlamaConfig::QkNorm::none: return x;
    case LlamaConfig::QkNorm::whole:
      return b.rms_norm(x, b.parameter(name + ".weight", {graph::checked_mul(heads, HD)}, ones, config.dtype), name);
    case LlamaConfig::QkNorm::per_head: break;
  }
  const TensorId per_head = b.reshape(x, {graph::checked_mul(rows, heads), HD}, name + ".rows");
  const TensorId normed = b.rms_norm(per_head, b.parameter(name + ".weight", {HD}, ones, config.dtype), name);
  return b.reshape(normed, {rows, graph::checked_mul(heads, HD)}, name + ".flat");
}

TensorId logits(graph::Builder& b, const LlamaConfig& config, TensorId x, TensorId head) {
  const bool scaled = config.logit_scale != 1.0f, capped = config.final_softcap > 0.0f;
  TensorId y = b.matmul(x, head, false, true, scaled || capped ? "logits.raw" : "logits");
  if (scaled) y = b.scale(y, config.logit_scale, capped ? "logits.scaled" : "logits");
  return capped ? soft_cap(b, y, config.final_softcap, "logits") : y;
}

TensorId embeddings(graph::Builder& b, const LlamaConfig& config, TensorId h, bool training) {
  if (config.scale_embeddings) h = b.scale(h, std::sqrt(static_cast<float>(config.width)), "residual0.scaled");
  if (config.embedding_multiplier > 0.0f && config.embedding_multiplier != 1.0f) {
    h = b.scale(h, config.embedding_multiplier, "residual0.multiplied");
  }
  if (training && config.embedding_dropout > 0.0f) h = b.dropout(h, config.embedding_dropout, "residual0.drop");
  return h;
}

TensorId mlp(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& m) {
  // Parameters m.{gate,up,down}_proj; the projections' outputs m.gate, m.up, m.down. Under tensor
  // parallelism gate and up are column-parallel, down row-parallel.
  config.tensor_parallel.split(config.ffn, "the MLP's hidden width (ffn)");
  auto in = [&](const char* which, TensorId input, std::int64_t out) {
    const std::string role(which);  // gate_proj, up_proj or down_proj: the op names gate, up, down
    const bool down = role == "down_proj";
    const std::string& param = down ? config.mlp_down_name : role == "up_proj" ? config.mlp_up_name : config.mlp_gate_name;
    const std::int64_t width = down ? config.ffn : b.graph().tensor(input).shape.cols();
    return project(b, config, input, m + "." + param, out, width, config.mlp_bias, m + "." + role.substr(0, role.find('_')),
                   down ? Split::row : Split::column);
  };
  return mlp_body(b, config, graph::column_input(b, config.tensor_parallel, x, m + ".in"), config.ffn, in, m);
}

TensorId moe(graph::Builder& b, const LlamaConfig& config, TensorId x, const std::string& m, TensorId* router_stats) {
  const LlamaConfig::Moe& moe = config.moe;
  const std::int64_t C = config.width, E = moe.experts, F = moe.expert_ffn > 0 ? moe.expert_ffn : config.ffn;
  const std::int64_t tokens = b.graph().tensor(x).shape[0];
  const TensorId logits = project(b, config, x, m + ".gate", E, C, false, m + ".router");
  const TensorId probs = moe.sigmoid_scores ? b.sigmoid(logits, m + ".router.probs") : b.softmax(logits, false, m + ".router.probs");
  graph::MoeChoice choice;
  if (moe.choice_bias) {
    choice.bias = b.parameter(m + ".gate.e_score_correction_bias", {E}, graph::InitSpec{}, config.dtype);
    b.graph().mutable_tensor(choice.bias).frozen = true;  // moved by DeepSeek's balancing updates, not by gradients
  }
  choice.groups = moe.expert_groups;
  choice.top_groups = moe.top_groups;
  choice.group_top2 = moe.group_top2;
  TensorId gates = b.moe_top_k(probs, moe.top_k, moe.normalize_top_k, m + (moe.routed_scale != 1.0f ? ".gates.chosen" : ".gates"), choice);
  if (moe.routed_scale != 1.0f) gates = b.scale(gates, moe.routed_scale, m + ".gates");
  if (router_stats != nullptr && moe.aux_loss_coef > 0.0) {
    const TensorId stats = b.moe_router_stats(probs, gates, m + ".router.stats");
    *router_stats = *router_stats == kNoTensor ? stats : b.add(*router_stats, stats, m + ".router.stats_sum");
  }
  // Under tensor parallelism the router is whole on every rank and each expert's hidden width is
  // split as the dense MLP's is: each rank runs every token through its slice of the experts and
  // the combined partial outputs are summed over the ranks. The tokens and gates enter the split
  // experts through tp_copy, whose gradient sums the ranks' partial gradients (the gates' too:
  // the combine's gradient for a gate reads this rank's partial output).
  const graph::TensorParallel& tp = config.tensor_parallel;
  const std::int64_t Fr = tp.split(F, "the experts' hidden width (moe_intermediate_size)");
  const TensorId x_in = graph::column_input(b, tp, x, m + ".experts.in");
  const TensorId g_in = graph::tp_copy(b, tp, gates, m + ".gates.shared");
  const TensorId xe = b.moe_dispatch(x_in, g_in, moe.capacity(tokens), m + ".dispatch");  // [E, slots, C]
  // Every expert's weights stacked, [E, out, in]: one batched product over the experts' slots.
  // With expert parallelism this rank holds a share of the experts and runs them on every
  // rank's tokens (each expert's hidden width still split by tensor parallelism).
  const graph::InitSpec w_init{graph::InitSpec::Kind::normal, 0.02f};
  const graph::ExpertParallel& ep = config.expert_parallel;
  auto expert_project = [&](const char* which, TensorId input, std::int64_t out) {
    const std::string name = m + ".experts." + which;
    const bool down = std::string(which) == "down_proj";
    const std::int64_t width = down ? F : C;
    const graph::Shape whole{E, down ? out : F, width};
    const TensorId w = graph::expert_weights(b, ep, tp, name + ".weight", whole, down ? 2 : 1, w_init, config.dtype);
    return b.batched_matmul(input, w, false, true, name);
  };
  const TensorId local = graph::exchange_to_experts(b, ep, xe, m + ".to_experts");
  const TensorId ye = graph::exchange_from_experts(b, ep, mlp_body(b, config, local, Fr, expert_project, m + ".experts"),
                                                   m + ".from_experts");
  TensorId y = graph::tp_sum(b, tp, b.moe_combine(ye, g_in, m + ".combine"), m + ".combine.sum");
  if (moe.shared_ffn > 0 && !moe.shared_gate) {  // DeepSeek's shared experts: one MLP of their summed width
    LlamaConfig shared = config;
    shared.ffn = moe.shared_ffn;
    y = b.add(y, mlp(b, shared, x, m + ".shared_experts"), m + ".with_shared");
  } else if (moe.shared_ffn > 0) {
    LlamaConfig shared = config;
    shared.ffn = moe.shared_ffn;
    const TensorId s = mlp(b, shared, x, m + ".shared_expert");
    const TensorId s_gate = b.sigmoid(project(b, config, x, m + ".shared_expert_gate", 1, C, false, m + ".shared_gate"),
                                      m + ".shared_gate.sigmoid");  // [N, 1]
    const TensorId gated = b.channel_scale(b.reshape(s, {tokens, 1, C}, m + ".shared_rows"), s_gate, m + ".shared_scaled");
    y = b.add(y, b.reshape(gated, {tokens, C}, m + ".shared_out"), m + ".with_shared");
  }
  return y;
}

TensorId load_balancing_loss(graph::Builder& b, const LlamaConfig& config, TensorId stats, std::int64_t tokens_per_layer) {
  std::int64_t layers = 0;
  for (std::int64_t l = 0; l < config.layers; ++l) layers += config.moe.sparse(l) ? 1 : 0;
  const double tokens = double(tokens_per_layer) * double(layers);
  const double alpha = config.moe.aux_loss_coef * double(config.moe.experts) / (tokens * tokens);
  const TensorId routed = b.slice(stats, 0, 0, 1, "router.routed");
  const TensorId probs = b.slice(stats, 0, 1, 1, "router.probs_sum");
  return b.scale(b.sum(b.mul(routed, probs, "router.balance_terms"), "router.balance_sum"), static_cast<float>(alpha),
                 "router.aux_loss");
}

TensorId layer(graph::Builder& b, const LlamaConfig& config, TensorId h, std::int64_t layer,
               const std::function<TensorId(TensorId)>& attention, TensorId* router_stats) {
  const std::string n = "layers." + std::to_string(layer);
  // Names as the Hugging Face checkpoints have them: a pre-norm layer's second norm is its
  // post_attention_layernorm; with norms on the outputs too, that name is the attention output's
  // and the MLP's input norm is pre_feedforward_layernorm.
  const std::string mlp_in_norm = config.post_norm ? ".pre_feedforward_layernorm" : ".post_attention_layernorm";
  auto pre = [&](TensorId x, const std::string& name) { return config.pre_norm ? norm(b, config, x, n + name) : x; };
  auto post = [&](TensorId x, const std::string& name) { return config.post_norm ? norm(b, config, x, n + name) : x; };
  auto ffn = [&](TensorId x) {
    return config.moe.sparse(layer) ? moe(b, config, x, n + ".mlp", router_stats) : mlp(b, config, x, n + ".mlp");
  };
  // A sublayer's output on its way to the residual add: dropped out (training) and multiplied as
  // the config says.
  auto out = [&](TensorId x, const std::string& name) {
    if (config.residual_dropout > 0.0f) x = b.dropout(x, config.residual_dropout, n + name + ".drop");
    if (config.residual_multiplier != 1.0f) x = b.scale(x, config.residual_multiplier, n + name + ".multiplied");
    return x;
  };
  if (config.parallel_residual) {
    const TensorId a_in = pre(h, ".input_layernorm");
    const TensorId m_in = config.shared_norm ? a_in : pre(h, ".post_attention_layernorm");
    const TensorId a = out(post(attention(a_in), ".post_attention_layernorm"), ".attn_out");
    const TensorId m = out(post(ffn(m_in), ".post_feedforward_layernorm"), ".mlp_out");
    return b.add(b.add(h, a, n + ".residual1"), m, n + ".residual2");
  }
  h = b.add(h, out(post(attention(pre(h, ".input_layernorm")), ".post_attention_layernorm"), ".attn_out"), n + ".residual1");
  return b.add(h, out(post(ffn(pre(h, mlp_in_norm)), ".post_feedforward_layernorm"), ".mlp_out"), n + ".residual2");
}

}  // namespace llama_parts

bool LlamaConfig::Moe::sparse(std::int64_t layer) const {
  if (experts <= 0 || sparse_step <= 0 || (layer + 1) % sparse_step != 0) return false;
  return std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end();
}

std::int64_t LlamaConfig::Moe::capacity(std::int64_t tokens) const {
  if (capacity_factor <= 0.0 || experts <= 0) return tokens;
  const double slots = std::ceil(capacity_factor * double(tokens) * double(top_k) / double(experts));
  return std::clamp(static_cast<std::int64_t>(std::min(slots, double(tokens))), std::int64_t{1}, tokens);
}

std::string describe_moe_capacity(const LlamaConfig& config, std::int64_t tokens) {
  const LlamaConfig::Moe& m = config.moe;
  if (m.experts <= 0 || tokens <= 0) return "";
  const std::string head = "mixture of experts: " + std::to_string(m.experts) + " experts, " + std::to_string(m.top_k) +
                           " per token; ";
  const std::int64_t slots = m.capacity(tokens);
  if (slots >= tokens) {
    return head + "each expert has a slot for every one of the " + std::to_string(tokens) +
           " tokens of a step: no token is dropped";
  }
  char factor[32];
  std::snprintf(factor, sizeof factor, "%g", m.capacity_factor);
  LlamaConfig::Moe balanced = m;
  balanced.capacity_factor = 1.0;
  return head + "each expert takes " + std::to_string(slots) + " of the " + std::to_string(tokens) +
         " tokens of a step (capacity factor " + factor + " of a balanced " + std::to_string(balanced.capacity(tokens)) +
         "); token copies routed past an expert's slots are dropped for it (--moe-capacity-factor 0: none dropped)";
}

graph::Graph build_llama(const LlamaConfig& config, std::int64_t batch) {
  const std::int64_t B = batch, T = config.context, C = config.width, NH = config.heads, NKV = config.kv_heads;
  const std::int64_t V = config.vocab;
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || NKV <= 0 || V <= 0 || config.ffn <= 0 || config.layers <= 0) {
    throw graph::GraphError("llama: batch, context, width, heads, kv_heads, ffn, vocab and layers must be positive");
  }
  const std::int64_t HD = llama_parts::checked_head_size(config);  // head size
  const std::int64_t QC = graph::checked_mul(NH, HD);  // query (and attention output) channels
  const std::int64_t KW = graph::checked_mul(NKV, HD);  // key and value channels
  const std::int64_t rows = graph::checked_mul(B, T);
  const graph::DType dt = config.dtype;
  const graph::TensorParallel& tp = config.tensor_parallel;
  graph::check_tensor_parallel(tp);
  graph::check_expert_parallel(config.expert_parallel);
  if (config.expert_parallel.active()) {
    if (config.moe.experts <= 0) {
      throw graph::GraphError("llama: --expert-parallel splits the experts of a mixture of experts, and this model has none");
    }
    config.expert_parallel.local_experts(config.moe.experts);  // a GraphError when the degree does not divide them
  }
  if (tp.active()) {
    if (tp.sequence_parallel && (config.moe.experts > 0 || config.mla.active())) {
      throw graph::GraphError(std::string("llama: ") + (config.mla.active() ? "multi-head latent attention" : "a mixture of experts") +
                              " under --sequence-parallel is not planned (its shared down projections and router would "
                              "run on each rank's rows only); leave out --sequence-parallel");
    }
    if (config.qk_norm == LlamaConfig::QkNorm::whole) {
      throw graph::GraphError("llama: a q/k norm over the whole projection (OLMo-2's) needs every head's channels on "
                              "one rank; leave out --tensor-parallel");
    }
  }
  const std::int64_t NHr = tp.split(NH, "llama: the attention heads");  // this rank's heads
  const std::int64_t NKVr = tp.split(NKV, "llama: the key/value heads (kv_heads)");
  graph::Graph g;
  graph::Builder b(g);
  const graph::InitSpec w_init{graph::InitSpec::Kind::normal, 0.02f};
  auto project = [&](TensorId x, const std::string& name, std::int64_t out, bool bias, const std::string& op_name) {
    return llama_parts::project(b, config, x, name, out, C, bias, op_name, llama_parts::Split::column);
  };
  // [B*T, heads*HD] -> [B, heads, T, HD]
  auto split_heads = [&](TensorId x, std::int64_t heads, const std::string& name) {
    return b.permute(b.reshape(x, {B, T, heads, HD}, name + ".view"), {0, 2, 1, 3}, name + ".heads");
  };
  auto head_norm = [&](TensorId x, std::int64_t heads, const std::string& name) {
    return llama_parts::head_norm(b, config, x, rows, heads, name);
  };

  const TensorId x = b.input("x", {B, T}, graph::DType::i32);
  const TensorId labels = b.input("labels", {rows}, graph::DType::i32);
  const TensorId embed = graph::parameter_slice(b, tp, "embed_tokens.weight", {V, C}, 0, w_init, dt);
  TensorId h = b.reshape(graph::vocab_parallel_embedding(b, tp, x, embed, V, "embed"), {rows, C}, "residual0");  // [B*T, C]
  if (config.positions == LlamaConfig::Positions::learned) {
    // Learned positions broadcast over the batch: [B, T*C] + [T*C] (rows offset.. offset + T).
    const std::int64_t P = config.position_table;
    if (config.position_offset < 0 || config.position_offset + T > P) {
      throw graph::GraphError("llama: " + std::to_string(T) + " positions from row " + std::to_string(config.position_offset) +
                              " do not fit the learned table of " + std::to_string(P) + " rows: a shorter --seq");
    }
    const TensorId table = b.parameter("embed_positions.weight", {P, C}, w_init, dt);
    const TensorId used = P == T ? table : b.slice(table, 0, config.position_offset, T, "embed_positions.used");
    h = b.reshape(b.bias_add(b.reshape(h, {B, graph::checked_mul(T, C)}, "residual0.flat"),
                             b.reshape(used, {graph::checked_mul(T, C)}, "embed_positions.flat"), "residual0.positioned"),
                  {rows, C}, "residual0.rows");
  }
  h = llama_parts::embeddings(b, config, h, /*training=*/true);
  h = graph::sequence_shard(b, tp, h, "residual0.shard");  // sequence parallelism: this rank's rows to the head

  TensorId router_stats = kNoTensor;  // summed over the mixture layers (the load-balancing loss)
  // Multi-head latent attention (LlamaConfig::Mla): [B*T, C] -> o_proj's output [B*T, C].
  const LlamaConfig::Mla& mla = config.mla;
  auto latent_attention = [&](TensorId a_in, const std::string& a, std::int64_t l) {
    const std::int64_t DN = mla.qk_nope, DR = mla.qk_rope, DV = mla.v_head, DQK = mla.qk_head();
    const graph::InitSpec ones{graph::InitSpec::Kind::ones, 0.0f};
    auto heads_of = [&](TensorId flat, std::int64_t heads, std::int64_t width, const std::string& name) {
      return b.permute(b.reshape(flat, {B, T, heads, width}, name + ".view"), {0, 2, 1, 3}, name + ".heads");
    };
    // Under tensor parallelism each rank holds NH / T heads: q_b_proj (or q_proj) and kv_b_proj
    // split their output heads, o_proj its input heads; the down projections (q_a_proj,
    // kv_a_proj_with_mqa) and their norms are whole on every rank, their outputs entering the
    // split layers through tp_copy, whose gradient sums the ranks' heads' shares.
    using llama_parts::Split;
    TensorId q;
    if (mla.q_lora_rank > 0) {
      const TensorId cq = llama_parts::project(b, config, a_in, a + ".q_a_proj", mla.q_lora_rank, C, false, a + ".q_a");
      const TensorId cq_n = b.rms_norm(cq, b.parameter(a + ".q_a_layernorm.weight", {mla.q_lora_rank}, ones, dt), a + ".q_a_norm");
      q = llama_parts::project(b, config, graph::column_input(b, tp, cq_n, a + ".q_a.shared"), a + ".q_b_proj",
                               graph::checked_mul(NH, DQK), mla.q_lora_rank, false, a + ".q", Split::column);
    } else {
      q = llama_parts::project(b, config, graph::column_input(b, tp, a_in, a + ".in"), a + ".q_proj", graph::checked_mul(NH, DQK),
                               C, false, a + ".q", Split::column);
    }
    q = heads_of(q, NHr, DQK, a + ".q");  // [B, NH / T, T, DN + DR]
    const TensorId q_pe = b.rotary(b.slice(q, 3, DN, DR, a + ".q_pe"), config.rope_base_of(l), a + ".q.rope");
    q = b.concat(b.slice(q, 3, 0, DN, a + ".q_nope"), q_pe, 3, a + ".q.joined");
    const TensorId ckv =
        llama_parts::project(b, config, a_in, a + ".kv_a_proj_with_mqa", mla.kv_lora_rank + DR, C, false, a + ".kv_a");
    const TensorId latent = b.rms_norm(b.slice(ckv, 1, 0, mla.kv_lora_rank, a + ".latent"),
                                       b.parameter(a + ".kv_a_layernorm.weight", {mla.kv_lora_rank}, ones, dt), a + ".latent_norm");
    // The decoupled rotary key: one head, shared by every query head.
    const TensorId k_pe_in = graph::column_input(b, tp, b.slice(ckv, 1, mla.kv_lora_rank, DR, a + ".k_pe"), a + ".k_pe.shared");
    const TensorId k_pe = b.rotary(heads_of(k_pe_in, 1, DR, a + ".k_pe"), config.rope_base_of(l), a + ".k.rope");
    const TensorId kv = heads_of(llama_parts::project(b, config, graph::column_input(b, tp, latent, a + ".latent.shared"),
                                                      a + ".kv_b_proj", graph::checked_mul(NH, DN + DV), mla.kv_lora_rank,
                                                      false, a + ".kv_b", Split::column),
                                 NHr, DN + DV, a + ".kv");  // [B, NH, T, DN + DV]
    const TensorId k = b.concat(b.slice(kv, 3, 0, DN, a + ".k_nope"), b.repeat_heads(k_pe, NHr, a + ".k_pe.repeat"), 3,
                                a + ".k.joined");
    TensorId v = b.slice(kv, 3, DN, DV, a + ".v");
    // The fused kernel takes values as wide as the keys: zeros pad them (as flash attention's
    // callers do for MLA), and the output's padding is dropped.
    const bool pad = config.attention == AttentionKind::fused && DV < DQK;
    if (pad) v = b.concat(v, b.fill({B, NHr, T, DQK - DV}, 0.0f, dt, a + ".v.pad_zeros"), 3, a + ".v.padded");
    TensorId y = attention_block(b, config.attention, q, k, v, /*causal=*/true, config.attention_dropout, a,
                                 config.attention_scale(), config.attn_softcap, kNoTensor,
                                 config.window_of(l));  // [B, NH, T, DQK or DV]
    if (pad) y = b.slice(y, 3, 0, DV, a + ".values");
    y = b.reshape(b.permute(y, {0, 2, 1, 3}, a + ".merge"), {rows, graph::checked_mul(NHr, DV)}, a + ".merged");
    return llama_parts::project(b, config, y, a + ".o_proj", C, graph::checked_mul(NH, DV), config.o_bias, a + ".o", Split::row);
  };
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string a = "layers." + std::to_string(l) + ".self_attn";
    h = llama_parts::layer(b, config, h, l, [&](TensorId a_norm) {
      if (mla.active()) return latent_attention(a_norm, a, l);
      const TensorId a_in = graph::column_input(b, tp, a_norm, a + ".in");
      TensorId q = split_heads(head_norm(project(a_in, a + ".q_proj", QC, config.qkv_bias, a + ".q"), NHr, a + ".q_norm"), NHr, a + ".q");
      TensorId k = split_heads(head_norm(project(a_in, a + ".k_proj", KW, config.qkv_bias, a + ".k"), NKVr, a + ".k_norm"), NKVr, a + ".k");
      TensorId v = split_heads(project(a_in, a + ".v_proj", KW, config.qkv_bias, a + ".v"), NKVr, a + ".v");
      if (config.positions == LlamaConfig::Positions::rotary) {
        q = b.rotary(q, config.rope_base_of(l), a + ".q.rope", config.rotary_dims);
        k = b.rotary(k, config.rope_base_of(l), a + ".k.rope", config.rotary_dims);
      }
      TensorId y = attention_block(b, config.attention, q, k, v, /*causal=*/true, config.attention_dropout, a,
                                   config.attention_scale(), config.attn_softcap, kNoTensor,
                                   config.window_of(l));  // [B, NH, T, HD]
      y = b.reshape(b.permute(y, {0, 2, 1, 3}, a + ".merge"), {rows, QC / tp.degree}, a + ".merged");
      return llama_parts::project(b, config, y, a + "." + config.attn_out_name, C, QC, config.o_bias, a + ".o",
                                  llama_parts::Split::row);
    }, &router_stats);
  }
  h = llama_parts::norm(b, config, h, "norm");
  const TensorId head = config.tied_head ? embed : graph::parameter_slice(b, tp, "lm_head.weight", {V, C}, 0, w_init, dt);
  g.output = llama_parts::logits(b, config, graph::column_input(b, tp, h, "head.in"), head);  // [B*T, V (/ ranks)]
  g.loss = graph::vocab_parallel_cross_entropy(b, tp, g.output, labels, V, "loss");
  if (router_stats != kNoTensor) {
    g.loss = b.add(g.loss, llama_parts::load_balancing_loss(b, config, router_stats, rows), "loss.with_aux");
  }
  return g;
}

}  // namespace memplan::models
