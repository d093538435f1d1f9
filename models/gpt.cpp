#include "memplan/models/gpt.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"
#include "memplan/models/attention.h"

namespace memplan::models {
namespace {

using graph::InitSpec;

struct Linear {
  TensorId weight, bias;
};

}  // namespace

graph::Graph build_gpt(const GptConfig& config, std::int64_t batch, bool training) {
  const std::int64_t B = batch, T = config.context, C = config.width, NH = config.heads, V = config.vocab;
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || V <= 0 || config.layers <= 0) {
    throw graph::GraphError("gpt: batch, context, width, heads, vocab and layers must be positive");
  }
  if (C % NH != 0) {
    throw graph::GraphError("gpt: width " + std::to_string(C) + " is not divisible by " + std::to_string(NH) + " heads");
  }
  const std::int64_t HD = C / NH;  // head size
  const std::int64_t P = config.max_positions > 0 ? config.max_positions : T;
  if (T > P) {
    throw graph::GraphError("gpt: sequence length " + std::to_string(T) + " exceeds the " + std::to_string(P) +
                            " learned positions");
  }
  const graph::DType dt = config.dtype;
  const graph::TensorParallel& tp = config.tensor_parallel;
  graph::check_tensor_parallel(tp);
  const std::int64_t NHr = tp.split(NH, "gpt: the heads");  // this rank's heads
  const float p = training ? config.dropout : 0.0f;
  graph::Graph g;
  graph::Builder b(g);
  const InitSpec w_init{InitSpec::Kind::normal, 0.02f};
  const InitSpec proj_init{InitSpec::Kind::normal, 0.02f / std::sqrt(2.0f * static_cast<float>(config.layers))};
  const InitSpec zeros{InitSpec::Kind::zeros, 0.0f};
  const InitSpec ones{InitSpec::Kind::ones, 0.0f};
  // Column-parallel (out split: this rank's output features) and row-parallel (in split: its
  // partial sums, added over the ranks before the bias) linear layers; plain ones without
  // tensor parallelism.
  auto column_params = [&](const std::string& name, std::int64_t out, std::int64_t in, InitSpec init) {
    return Linear{graph::parameter_slice(b, tp, name + ".weight", {out, in}, 0, init, dt),
                  graph::parameter_slice(b, tp, name + ".bias", {out}, 0, zeros, dt)};
  };
  auto row_params = [&](const std::string& name, std::int64_t out, std::int64_t in, InitSpec init) {
    return Linear{graph::parameter_slice(b, tp, name + ".weight", {out, in}, 1, init, dt),
                  b.parameter(name + ".bias", {out}, zeros, dt)};
  };
  auto row = [&](TensorId x, const Linear& l, const std::string& name) {
    if (!tp.active()) return b.linear(x, l.weight, l.bias, name);
    // The partial product keeps the layer's name: the sum is in place, so the buffer is it.
    return b.bias_add(graph::row_output(b, tp, b.matmul(x, l.weight, false, true, name), name + ".sum"),
                      graph::sequence_parallel_parameter(b, tp, l.bias), name + ".bias");
  };
  auto layer_norm = [&](TensorId x, const std::string& name) {
    // Norms run on this rank's rows under sequence parallelism: their parameters' gradients are summed.
    return b.layer_norm(x, graph::sequence_parallel_parameter(b, tp, b.parameter(name + ".weight", {C}, ones, dt)),
                        graph::sequence_parallel_parameter(b, tp, b.parameter(name + ".bias", {C}, zeros, dt)), name);
  };
  // [B*T, NHr*HD] -> [B, NHr, T, HD]
  auto split_heads = [&](TensorId x, const std::string& name) {
    return b.permute(b.reshape(x, {B, T, NHr, HD}, name + ".view"), {0, 2, 1, 3}, name + ".heads");
  };

  const TensorId x = b.input("x", {B, T}, graph::DType::i32);
  const TensorId labels = b.input("labels", {graph::checked_mul(B, T)}, graph::DType::i32);
  const TensorId wte = graph::parameter_slice(b, tp, "wte.weight", {V, C}, 0, w_init, dt);
  const TensorId wpe_table = b.parameter("wpe.weight", {P, C}, w_init, dt);
  const TensorId wpe = P == T ? wpe_table : b.slice(wpe_table, 0, 0, T, "wpe.used");

  // Position embeddings broadcast over the batch: [B, T*C] + [T*C].
  const TensorId tok = graph::vocab_parallel_embedding(b, tp, x, wte, V, "tok_emb");  // [B, T, C]
  TensorId h = b.bias_add(b.reshape(tok, {B, graph::checked_mul(T, C)}, "tok_emb.flat"), b.reshape(wpe, {graph::checked_mul(T, C)}, "wpe.flat"), "emb");
  h = b.reshape(b.dropout(h, p, "emb.drop"), {graph::checked_mul(B, T), C}, "residual0");  // the residual stream [B*T, C]
  // Sequence parallelism: from here to the head each rank holds its own rows of the stream.
  h = graph::sequence_shard(b, tp, h, "residual0.shard");
  // Dropout on a rank's own rows draws its own mask (the rows differ between the ranks); on rows
  // every rank holds, the same mask everywhere.
  const std::string own_rows = tp.active() && tp.sequence_parallel ? ".rank" + std::to_string(tp.rank) : "";

  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string n = "h." + std::to_string(l);
    // causal self-attention
    const TensorId a_in = graph::column_input(b, tp, layer_norm(h, n + ".ln_1"), n + ".attn.in");
    const Linear q = column_params(n + ".attn.q", C, C, w_init);
    const Linear k = column_params(n + ".attn.k", C, C, w_init);
    const Linear v = column_params(n + ".attn.v", C, C, w_init);
    const TensorId qh = split_heads(b.linear(a_in, q.weight, q.bias, n + ".attn.q"), n + ".attn.q");
    const TensorId kh = split_heads(b.linear(a_in, k.weight, k.bias, n + ".attn.k"), n + ".attn.k");
    const TensorId vh = split_heads(b.linear(a_in, v.weight, v.bias, n + ".attn.v"), n + ".attn.v");
    TensorId y = attention_block(b, config.attention, qh, kh, vh, /*causal=*/true, p, n + ".attn");  // [B, NHr, T, HD]
    y = b.reshape(b.permute(y, {0, 2, 1, 3}, n + ".attn.merge"), {graph::checked_mul(B, T), NHr * HD}, n + ".attn.merged");
    const Linear proj = row_params(n + ".attn.proj", C, C, proj_init);
    y = b.dropout(row(y, proj, n + ".attn.proj"), p, n + ".attn.proj.drop" + own_rows);
    h = b.add(h, y, n + ".residual1");
    // MLP
    const std::int64_t F = config.mlp > 0 ? config.mlp : graph::checked_mul(4, C);
    tp.split(F, "gpt: the MLP's hidden width");
    const Linear fc = column_params(n + ".mlp.fc", F, C, w_init);
    const Linear out = row_params(n + ".mlp.proj", C, F, proj_init);
    const TensorId m_in = graph::column_input(b, tp, layer_norm(h, n + ".ln_2"), n + ".mlp.in");
    TensorId m = b.gelu(b.linear(m_in, fc.weight, fc.bias, n + ".mlp.fc"), n + ".mlp.gelu");
    m = b.dropout(row(m, out, n + ".mlp.proj"), p, n + ".mlp.drop" + own_rows);
    h = b.add(h, m, n + ".residual2");
  }
  h = layer_norm(h, "ln_f");
  const TensorId head = config.tied_head ? wte : graph::parameter_slice(b, tp, "lm_head.weight", {V, C}, 0, w_init, dt);
  g.output = b.matmul(graph::column_input(b, tp, h, "head.in"), head, false, true, "logits");  // [B*T, V (/ ranks)]
  g.loss = graph::vocab_parallel_cross_entropy(b, tp, g.output, labels, V, "loss");
  return g;
}

}  // namespace memplan::models
