// The op harness's cases (tests/op_cases.h) and the references of the ops' forward results.
#include "op_cases.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "memplan/common/check.h"
#include "memplan/common/splitmix64.h"
#include "memplan/graph/autograd.h"
#include "memplan/graph/quantize.h"

namespace memplan::testing {
namespace {

using graph::Builder;
using graph::DType;
using graph::OpKind;
using graph::Shape;

TensorId with_attrs(Builder& b, OpKind kind, std::vector<TensorId> inputs, graph::OpAttrs attrs) {
  return b.graph().add_op(kind, std::move(inputs), std::move(attrs), "y", graph::Role::activation, graph::Phase::forward);
}
TensorId with_attrs(Builder& b, OpKind kind, TensorId x, graph::OpAttrs attrs) {
  return with_attrs(b, kind, std::vector<TensorId>{x}, std::move(attrs));
}
// y = x deq(W)^T with W [d[1], d[2]] stored as `config` lays it out.
TensorId quant_case(Builder& b, const Dims& d, DType t, const graph::QuantConfig& config) {
  const TensorId x = b.parameter("x", {d[0], d[2]}, {}, t);
  const auto storage = graph::add_quantized_weight(b.graph(), "fc.weight", d[1], d[2], config);
  return graph::add_quant_matmul(b.graph(), x, storage, d[1], d[2], config, "y");
}
// A cast op even where the dtype does not change (a copy), which Builder::cast leaves out.
TensorId cast_op(Builder& b, TensorId x, DType dtype, const std::string& name) {
  graph::OpAttrs attrs;
  attrs.dtype = dtype;
  return b.graph().add_op(OpKind::cast, {x}, std::move(attrs), name, graph::Role::activation, graph::Phase::forward);
}
// The attributes of a collective over `world` tensor-parallel ranks.
graph::OpAttrs tensor_group(std::int64_t world) {
  graph::OpAttrs a;
  a.world = world;
  a.group = graph::RankGroup::tensor;
  return a;
}

// x [N, C] dispatched by the gates of softmax(p) over all E experts into `capacity` slots each,
// scaled per slot by w [E, capacity, C] (experts that differ) and combined back: [N, C].
TensorId moe_round_trip(Builder& b, const Dims& d, DType t) {
  const std::int64_t N = d[0], E = d[1], C = d[2], capacity = d[3];
  auto x = b.parameter("x", {N, C}, {}, t);
  auto gates = b.moe_top_k(b.softmax(b.parameter("p", {N, E}, {}, t), false, "probs"), E, true, "gates");
  auto xe = b.moe_dispatch(x, gates, capacity, "xe");
  return b.moe_combine(b.mul(xe, b.parameter("w", {E, capacity, C}, {}, t), "ye"), gates, "y");
}

graph::OpAttrs window(std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  graph::OpAttrs attrs;
  attrs.kernel = kernel;
  attrs.stride = stride;
  attrs.padding = padding;
  return attrs;
}

// Persistent state that is not trained (running statistics) at `dtype`.
TensorId state(Builder& b, const std::string& name, Shape shape, graph::InitSpec init, DType dtype) {
  graph::TensorDesc desc;
  desc.name = name;
  desc.shape = std::move(shape);
  desc.dtype = dtype;
  desc.role = graph::Role::optimizer_state;
  desc.init = init;
  return b.graph().add_tensor(std::move(desc));
}

// An optimizer update (kind) of p with `states` state tensors; returns g, which the loss reads.
TensorId update(Builder& b, const Dims& d, DType t, OpKind kind, int states) {
  const TensorId p = b.parameter("p", Shape(d), {}, t);
  const TensorId g = b.parameter("g", Shape(d), {}, t);
  std::vector<TensorId> updated = {p};
  for (int i = 0; i < states; ++i) {
    const graph::InitSpec init{i == 1 ? graph::InitSpec::Kind::ones : graph::InitSpec::Kind::uniform, 1.0f};
    updated.push_back(state(b, "state" + std::to_string(i), Shape(d), init, t));
  }
  graph::OpAttrs attrs;
  attrs.lr = 0.1f;
  attrs.momentum = 0.9f;
  attrs.weight_decay = 0.05f;
  b.graph().add_op(kind, {g}, attrs, "update", graph::Role::temporary, graph::Phase::optimizer, updated);
  return g;
}

TensorId product(Builder& b, const Dims& d, DType t, bool ta, bool tb) {
  // d = {M, K, N}
  auto a = b.parameter("a", ta ? Shape{d[1], d[0]} : Shape{d[0], d[1]}, {}, t);
  auto w = b.parameter("w", tb ? Shape{d[2], d[1]} : Shape{d[1], d[2]}, {}, t);
  return b.matmul(a, w, ta, tb, "y");
}

TensorId batched(Builder& b, const Dims& d, DType t, bool ta, bool tb) {
  // d = {B, M, K, N}
  auto a = b.parameter("a", ta ? Shape{d[0], d[2], d[1]} : Shape{d[0], d[1], d[2]}, {}, t);
  auto w = b.parameter("w", tb ? Shape{d[0], d[3], d[2]} : Shape{d[0], d[2], d[3]}, {}, t);
  return b.batched_matmul(a, w, ta, tb, "y");
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> kCases = {
      {"matmul", OpKind::matmul,
       [](Builder& b, const Dims& d, DType t) { return product(b, d, t, false, false); }, {{1, 1, 1}, {3, 4, 5}, {7, 2, 3}}},
      {"matmul_trans_b", OpKind::matmul,
       [](Builder& b, const Dims& d, DType t) { return product(b, d, t, false, true); }, {{3, 4, 5}, {2, 6, 1}}},
      {"matmul_trans_a", OpKind::matmul,
       [](Builder& b, const Dims& d, DType t) { return product(b, d, t, true, false); }, {{3, 4, 5}, {1, 3, 2}}},
      {"matmul_trans_both", OpKind::matmul,
       [](Builder& b, const Dims& d, DType t) { return product(b, d, t, true, true); }, {{3, 4, 5}, {4, 1, 2}}},
      {"bias_add", OpKind::bias_add,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1]}, {}, t);
         auto bias = b.parameter("b", {d[1]}, {}, t);
         return b.bias_add(x, bias, "y");
       },
       {{1, 3}, {4, 5}}},
      {"add", OpKind::add,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto y = b.parameter("y", Shape(d), {}, t);
         return b.add(x, y, "z");
       },
       {{5}, {2, 3}}},
      {"add_same_operand_twice", OpKind::add,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         return b.add(x, x, "z");  // gradient must accumulate both uses
       },
       {{4}, {2, 3}}},
      {"mul", OpKind::mul,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto y = b.parameter("y", Shape(d), {}, t);
         return b.mul(x, y, "z");
       },
       {{5}, {3, 2}}},
      {"scale", OpKind::scale,
       [](Builder& b, const Dims& d, DType t) { return b.scale(b.parameter("x", Shape(d), {}, t), -1.5f, "y"); },
       {{4}, {2, 2}}},
      {"relu", OpKind::relu,
       [](Builder& b, const Dims& d, DType t) { return b.relu(b.parameter("x", Shape(d), {}, t), "y"); },
       {{7}, {3, 4}}, 2e-2f, true},
      {"gelu", OpKind::gelu,
       [](Builder& b, const Dims& d, DType t) { return b.gelu(b.parameter("x", Shape(d), {}, t), "y"); },
       {{7}, {3, 4}}},
      {"sigmoid", OpKind::sigmoid,
       [](Builder& b, const Dims& d, DType t) { return b.sigmoid(b.parameter("x", Shape(d), {}, t), "y"); },
       {{7}, {3, 4}}},
      {"tanh", OpKind::tanh,
       [](Builder& b, const Dims& d, DType t) { return b.tanh(b.parameter("x", Shape(d), {}, t), "y"); },
       {{7}, {3, 4}}},
      // Both bounds inside the inputs' range, so both the passing and the clipped sides are checked.
      {"clip", OpKind::clip,
       [](Builder& b, const Dims& d, DType t) { return b.clip(b.parameter("x", Shape(d), {}, t), 0.0f, 0.5f, "y"); },
       {{7}, {3, 4}}, 2e-2f, true},
      // d = {N, C, H, W, Cout, K, stride, padding, groups}: depthwise, grouped with a stride, 1x1
      {"grouped_conv2d", OpKind::grouped_conv2d,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         auto w = b.parameter("w", {d[4], d[1] / d[8], d[5], d[5]}, {}, t);
         return b.grouped_conv2d(x, w, d[6], d[7], d[8], "y");
       },
       {{2, 4, 5, 5, 4, 3, 1, 1, 4}, {1, 4, 6, 6, 6, 3, 2, 1, 2}, {2, 2, 4, 4, 4, 1, 1, 0, 2}}, 3e-2f},
      // dilated: d = {N, C, H, W, Cout, K, stride, padding, groups, dilation}; taps reach into the
      // padding, and with stride 2 some input pixels are read by no tap
      {"grouped_conv2d_dilated", OpKind::grouped_conv2d,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         auto w = b.parameter("w", {d[4], d[1] / d[8], d[5], d[5]}, {}, t);
         return b.grouped_conv2d(x, w, d[6], d[7], d[8], "y", d[9]);
       },
       {{2, 4, 6, 6, 4, 3, 1, 2, 4, 2}, {1, 4, 7, 7, 6, 3, 2, 1, 2, 3}}, 3e-2f},
      // d = {N, C, H, W, gate rank}: a gate of [N, C] or [N, C, 1, 1]
      {"channel_scale", OpKind::channel_scale,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         auto g = b.parameter("g", d[4] == 2 ? Shape{d[0], d[1]} : Shape{d[0], d[1], 1, 1}, {}, t);
         return b.channel_scale(x, g, "y");
       },
       {{2, 3, 4, 5, 2}, {1, 4, 3, 3, 4}}},
      {"reshape", OpKind::reshape,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1]}, {}, t);
         return b.reshape(x, {d[0] * d[1]}, "y");
       },
       {{2, 3}, {4, 1}}},
      {"sum", OpKind::sum,
       [](Builder& b, const Dims& d, DType t) { return b.sum(b.parameter("x", Shape(d), {}, t), "y"); },
       {{5}, {2, 3}}},
      {"mean", OpKind::mean,
       [](Builder& b, const Dims& d, DType t) { return b.mean(b.parameter("x", Shape(d), {}, t), "y"); },
       {{5}, {2, 3}}},
      {"broadcast_scalar", OpKind::broadcast_scalar,
       [](Builder& b, const Dims& d, DType t) {
         auto s = b.parameter("s", {1}, {}, t);
         graph::OpAttrs attrs;
         attrs.shape = d;
         attrs.alpha = 0.5f;
         return with_attrs(b, OpKind::broadcast_scalar, s, attrs);
       },
       {{3}, {2, 2}}},
      {"im2col", OpKind::im2col,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         return with_attrs(b, OpKind::im2col, x, window(d[4], d[5], d[6]));
       },
       {{2, 2, 5, 5, 3, 2, 1}, {1, 3, 4, 4, 2, 1, 0}}},
      // d = {N, C, H, W, K, stride, padding, dilation}
      {"im2col_dilated", OpKind::im2col,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         graph::OpAttrs attrs = window(d[4], d[5], d[6]);
         attrs.dilation = d[7];
         return with_attrs(b, OpKind::im2col, x, attrs);
       },
       {{2, 2, 6, 6, 3, 1, 2, 2}, {1, 2, 7, 5, 2, 2, 1, 3}}},
      // d = {N, Cin, H, W, Cout, K, stride, padding}
      {"conv2d", OpKind::conv2d,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         auto w = b.parameter("w", {d[4], d[1], d[5], d[5]}, {}, t);
         return b.conv2d(x, w, d[6], d[7], "y");
       },
       {{2, 2, 5, 5, 3, 3, 1, 1}, {1, 3, 6, 6, 2, 3, 2, 1}, {2, 1, 4, 4, 2, 1, 2, 0}}, 3e-2f},
      // d = {N, Cin, H, W, Cout, K, stride, padding, dilation}: DeepLab's (3x3, dilation 2,
      // padding 2: the size kept) and a stride with a dilation of 3
      {"conv2d_dilated", OpKind::conv2d,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         auto w = b.parameter("w", {d[4], d[1], d[5], d[5]}, {}, t);
         return b.conv2d(x, w, d[6], d[7], "y", d[8]);
       },
       {{2, 2, 6, 6, 3, 3, 1, 2, 2}, {1, 2, 8, 8, 2, 3, 2, 1, 3}}, 3e-2f},
      // d = {N, Cin, H, W, Cout, K, K_W, stride, padding, padding_w}: Inception-v3's 1x7 and 7x1
      // (the size kept), a strided 3x1 padded along the height only
      {"conv2d_rectangular", OpKind::conv2d,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         auto w = b.parameter("w", {d[4], d[1], d[5], d[6]}, {}, t);
         return b.conv2d(x, w, d[7], d[8], "y", 1, d[9]);
       },
       {{2, 2, 5, 9, 3, 1, 7, 1, 0, 3}, {1, 2, 9, 4, 2, 7, 1, 1, 3, 0}, {2, 2, 7, 6, 2, 3, 1, 2, 1, 0}}, 3e-2f},
      {"max_pool2d", OpKind::max_pool2d,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         return b.max_pool2d(x, d[4], d[5], d[6], "y");
       },
       {{2, 2, 4, 4, 2, 2, 0}, {1, 2, 5, 5, 3, 2, 1}}, 2e-2f, false, true},
      {"avg_pool2d", OpKind::avg_pool2d,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         return b.avg_pool2d(x, d[4], d[5], "y");
       },
       {{2, 2, 4, 4, 2, 2}, {1, 1, 5, 5, 3, 1}}},
      {"global_avg_pool", OpKind::global_avg_pool,
       [](Builder& b, const Dims& d, DType t) {
         return b.global_avg_pool(b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t), "y");
       },
       {{2, 3, 2, 2}, {1, 1, 3, 1}}},
      {"batch_norm", OpKind::batch_norm,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto gamma = b.parameter("gamma", {d[1]}, {}, t);
         auto beta = b.parameter("beta", {d[1]}, {}, t);
         auto mean = state(b, "running_mean", {d[1]}, {graph::InitSpec::Kind::zeros, 0.0f}, t);
         auto var = state(b, "running_var", {d[1]}, {graph::InitSpec::Kind::ones, 0.0f}, t);
         return b.batch_norm(x, gamma, beta, mean, var, /*training=*/true, "y");
       },
       {{3, 2, 2, 2}, {4, 3}}, 5e-2f},
      {"layer_norm", OpKind::layer_norm,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto gamma = b.parameter("gamma", {d.back()}, {}, t);
         auto beta = b.parameter("beta", {d.back()}, {}, t);
         return b.layer_norm(x, gamma, beta, "y");
       },
       {{3, 5}, {2, 2, 4}}, 5e-2f},
      {"embedding", OpKind::embedding,
       [](Builder& b, const Dims& d, DType t) {
         auto ids = b.input("ids", {d[0]}, graph::DType::i32);
         auto table = b.parameter("table", {d[1], d[2]}, {}, t);
         return b.embedding(ids, table, "y");  // 5 ids over 3 rows: repeats accumulate
       },
       {{5, 3, 4}, {2, 6, 1}}},
      {"batched_matmul", OpKind::batched_matmul,
       [](Builder& b, const Dims& d, DType t) { return batched(b, d, t, false, false); }, {{2, 3, 4, 5}, {1, 1, 2, 1}}},
      {"batched_matmul_trans_a", OpKind::batched_matmul,
       [](Builder& b, const Dims& d, DType t) { return batched(b, d, t, true, false); }, {{2, 3, 4, 2}}},
      {"batched_matmul_trans_b", OpKind::batched_matmul,
       [](Builder& b, const Dims& d, DType t) { return batched(b, d, t, false, true); }, {{3, 2, 4, 3}}},
      {"batched_matmul_trans_both", OpKind::batched_matmul,
       [](Builder& b, const Dims& d, DType t) { return batched(b, d, t, true, true); }, {{2, 2, 3, 4}}},
      {"batched_matmul_rank4", OpKind::batched_matmul,
       [](Builder& b, const Dims& d, DType t) {
         auto q = b.parameter("q", {d[0], d[1], d[2], d[3]}, {}, t);
         auto k = b.parameter("k", {d[0], d[1], d[2], d[3]}, {}, t);
         return b.batched_matmul(q, k, false, true, "y");  // attention scores [B, H, T, T]
       },
       {{2, 2, 3, 2}}},
      {"softmax", OpKind::softmax,
       [](Builder& b, const Dims& d, DType t) { return b.softmax(b.parameter("x", Shape(d), {}, t), false, "y"); },
       {{3, 5}, {2, 1, 4}}},
      {"softmax_causal", OpKind::softmax,
       [](Builder& b, const Dims& d, DType t) { return b.softmax(b.parameter("x", Shape(d), {}, t), true, "y"); },
       {{2, 3, 3}, {1, 2, 4, 4}}},
      // a sliding window of 2 keys under the causal mask
      {"softmax_window", OpKind::softmax,
       [](Builder& b, const Dims& d, DType t) { return b.softmax(b.parameter("x", Shape(d), {}, t), true, "y", 2); },
       {{1, 2, 5, 5}}},
      {"permute", OpKind::permute,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t);
         return b.permute(x, {d[4], d[5], d[6], d[7]}, "y");
       },
       {{2, 3, 4, 1, 0, 2, 1, 3}, {2, 3, 2, 2, 3, 0, 2, 1}}},
      {"rms_norm", OpKind::rms_norm,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto gamma = b.parameter("gamma", {d.back()}, {}, t);
         return b.rms_norm(x, gamma, "y");
       },
       {{3, 5}, {2, 2, 4}}, 5e-2f},
      {"silu", OpKind::silu,
       [](Builder& b, const Dims& d, DType t) { return b.silu(b.parameter("x", Shape(d), {}, t), "y"); },
       {{7}, {3, 4}}},
      {"swiglu", OpKind::swiglu,
       [](Builder& b, const Dims& d, DType t) {
         return b.swiglu(b.parameter("gate", Shape(d), {}, t), b.parameter("up", Shape(d), {}, t), "y");
       },
       {{7}, {3, 4}}},
      // quant_matmul: x [N, in] times a quantized [out, in] weight; d = {N, out, in}. The weight's
      // storage is frozen (no gradient to check); x's gradient is dy deq(W).
      {"quant_matmul_nf4", OpKind::quant_matmul,
       [](Builder& b, const Dims& d, DType t) { return quant_case(b, d, t, {graph::QuantFormat::nf4, false, 0}); },
       {{3, 4, 32}, {2, 3, 80}}},
      {"quant_matmul_nf4_double_quant", OpKind::quant_matmul,
       [](Builder& b, const Dims& d, DType t) { return quant_case(b, d, t, {graph::QuantFormat::nf4, true, 0}); },
       {{2, 5, 64}}},
      {"quant_matmul_fp4", OpKind::quant_matmul,
       [](Builder& b, const Dims& d, DType t) { return quant_case(b, d, t, {graph::QuantFormat::fp4, false, 0}); },
       {{3, 4, 32}}},
      {"quant_matmul_int8", OpKind::quant_matmul,
       [](Builder& b, const Dims& d, DType t) { return quant_case(b, d, t, {graph::QuantFormat::int8, false, 0}); },
       {{3, 4, 6}}},
      // cast: to f32 (a widening at 16 bits, a copy at f32), and back (a rounding at 16 bits).
      {"cast_to_f32", OpKind::cast,
       [](Builder& b, const Dims& d, DType t) { return cast_op(b, b.parameter("x", Shape(d), {}, t), DType::f32, "y"); },
       {{7}, {3, 4}}},
      {"cast_round_trip", OpKind::cast,
       [](Builder& b, const Dims& d, DType t) {
         return cast_op(b, cast_op(b, b.parameter("x", Shape(d), {}, t), DType::f32, "wide"), t, "y");
       },
       {{7}, {3, 4}}},
      {"swiglu_same_operand_twice", OpKind::swiglu,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         return b.swiglu(x, x, "y");  // both gradient paths accumulate into x
       },
       {{5}}},
      // Mixtures of experts. d = {N, E, k, normalize}: the gates of softmax(p)'s k largest per row
      {"moe_top_k", OpKind::moe_top_k,
       [](Builder& b, const Dims& d, DType t) {
         auto probs = b.softmax(b.parameter("p", {d[0], d[1]}, {}, t), false, "probs");
         return b.moe_top_k(probs, d[2], d[3] != 0, "y");
       },
       {{5, 4, 2, 1}, {3, 6, 3, 0}, {4, 3, 1, 1}}, 2e-2f, false, true},
      // d = {N, E, C, capacity}: every token routed to every expert (top_k = E, so no choice flips
      // under the finite differences), experts that keep the first `capacity` tokens and drop the
      // rest; the round trip x -> dispatch -> times w -> combine reaches x, w and the gates' p.
      {"moe_dispatch", OpKind::moe_dispatch,
       [](Builder& b, const Dims& d, DType t) { return moe_round_trip(b, d, t); },
       {{6, 3, 4, 4}, {5, 2, 3, 5}, {4, 4, 2, 1}}},
      {"moe_combine", OpKind::moe_combine,
       [](Builder& b, const Dims& d, DType t) { return moe_round_trip(b, d, t); },
       {{6, 3, 4, 4}, {3, 2, 5, 2}}},
      // d = {N, E, k}: the routed counts and probability sums of softmax(p)'s top k
      {"moe_router_stats", OpKind::moe_router_stats,
       [](Builder& b, const Dims& d, DType t) {
         auto probs = b.softmax(b.parameter("p", {d[0], d[1]}, {}, t), false, "probs");
         return b.moe_router_stats(probs, b.moe_top_k(probs, d[2], true, "gates"), "y");
       },
       {{5, 4, 2}, {3, 3, 1}}, 2e-2f, false, true},
      // d = {H, Tq, Tk, buckets, max_distance, bidirectional}: distances in the exact, the
      // logarithmic and the last bucket, several pairs per bucket (their gradients sum)
      {"relative_position_bias", OpKind::relative_position_bias,
       [](Builder& b, const Dims& d, DType t) {
         auto table = b.parameter("table", {d[3], d[0]}, {}, t);
         return b.relative_position_bias(table, d[1], d[2], d[5] != 0, d[4], "y");
       },
       {{2, 5, 7, 8, 6, 1}, {3, 9, 9, 6, 5, 0}, {1, 1, 1, 4, 3, 1}}},
      {"rotary", OpKind::rotary,
       [](Builder& b, const Dims& d, DType t) { return b.rotary(b.parameter("x", Shape(d), {}, t), 10.0f, "y"); },
       {{2, 3, 4}, {1, 2, 5, 6}}},
      {"rotary_partial", OpKind::rotary,  // the last two channels of each head pass through
       [](Builder& b, const Dims& d, DType t) {
         return b.rotary(b.parameter("x", Shape(d), {}, t), 10.0f, "y", d.back() - 2);
       },
       {{2, 3, 6}, {1, 2, 5, 4}}},
      {"repeat_heads", OpKind::repeat_heads,
       [](Builder& b, const Dims& d, DType t) {
         return b.repeat_heads(b.parameter("x", {d[0], d[1], d[2], d[3]}, {}, t), d[4], "y");
       },
       {{2, 2, 3, 2, 3}, {1, 1, 2, 2, 2}}},
      {"concat", OpKind::concat,
       [](Builder& b, const Dims& d, DType t) {
         // d = {outer, extent of a, extent of b, inner}
         auto a = b.parameter("a", {d[0], d[1], d[3]}, {}, t);
         auto c = b.parameter("c", {d[0], d[2], d[3]}, {}, t);
         return b.concat(a, c, 1, "y");
       },
       {{2, 1, 3, 2}, {3, 2, 2, 1}}},
      {"slice", OpKind::slice,
       [](Builder& b, const Dims& d, DType t) {
         // d = {outer, extent, inner, start, length}
         auto x = b.parameter("x", {d[0], d[1], d[2]}, {}, t);
         return b.slice(x, 1, d[3], d[4], "y");
       },
       {{2, 4, 3, 0, 1}, {2, 5, 2, 1, 3}, {1, 3, 2, 1, 2}}},
      // d = {B, H, KH, T, D, causal}: grouped-query when KH < H; T = 66 spans two key tiles
      {"attention", OpKind::attention,
       [](Builder& b, const Dims& d, DType t) {
         auto q = b.parameter("q", {d[0], d[1], d[3], d[4]}, {}, t);
         auto k = b.parameter("k", {d[0], d[2], d[3], d[4]}, {}, t);
         auto v = b.parameter("v", {d[0], d[2], d[3], d[4]}, {}, t);
         return b.attention(q, k, v, d[5] != 0, 0.7f, 0.0f, "y");
       },
       {{2, 2, 2, 5, 3, 1}, {1, 2, 2, 4, 3, 0}, {1, 4, 2, 5, 2, 1}, {2, 3, 1, 3, 2, 0}, {1, 1, 1, 66, 2, 1}}},
      // Gemma-2's soft-capped scores: cap * tanh(0.7 q.k / cap), a cap of 0.5 bending most of them;
      // T = 130 spans two key tiles and two query tiles
      {"attention_softcap", OpKind::attention,
       [](Builder& b, const Dims& d, DType t) {
         auto q = b.parameter("q", {d[0], d[1], d[3], d[4]}, {}, t);
         auto k = b.parameter("k", {d[0], d[2], d[3], d[4]}, {}, t);
         auto v = b.parameter("v", {d[0], d[2], d[3], d[4]}, {}, t);
         return b.attention(q, k, v, d[5] != 0, 0.7f, 0.0f, "y", "", 0.5f);
       },
       {{2, 2, 1, 5, 3, 1}, {1, 2, 2, 4, 3, 0}, {1, 1, 1, 130, 2, 1}}},
      // d = {B, H, KH, T, D, window}: causal with a sliding window; T = 70 (and 300 for the
      // log-sum-exp) leave whole key tiles (32 on CUDA, 128 on the CPU) outside later queries' windows
      {"attention_window", OpKind::attention,
       [](Builder& b, const Dims& d, DType t) {
         auto q = b.parameter("q", {d[0], d[1], d[3], d[4]}, {}, t);
         auto k = b.parameter("k", {d[0], d[2], d[3], d[4]}, {}, t);
         auto v = b.parameter("v", {d[0], d[2], d[3], d[4]}, {}, t);
         return b.attention(q, k, v, true, 0.7f, 0.0f, "y", "", 0.0f, d[5]);
       },
       {{2, 2, 1, 5, 3, 2}, {1, 1, 1, 70, 2, 33}}},
      {"softmax_cross_entropy", OpKind::softmax_cross_entropy,
       [](Builder& b, const Dims& d, DType t) {
         auto logits = b.parameter("logits", {d[0], d[1]}, {}, t);
         auto labels = b.input("labels", {d[0]}, graph::DType::i32);
         return b.cross_entropy(logits, labels, "loss");
       },
       {{1, 2}, {4, 5}, {6, 3}}},
      // the fused projection and cross-entropy (graph/fusions.h): dims {N, V, C, chunk_rows}; 130
      // rows in chunks of 128 take two chunks, the second of 2 rows
      {"linear_cross_entropy", OpKind::linear_cross_entropy,
       [](Builder& b, const Dims& d, DType t) {
         auto h = b.parameter("h", {d[0], d[2]}, {}, t);
         auto w = b.parameter("w", {d[1], d[2]}, {}, t);
         auto labels = b.input("labels", {d[0]}, graph::DType::i32);
         return b.linear_cross_entropy(h, w, labels, d[3], "loss");
       },
       {{1, 2, 3, 0}, {4, 5, 3, 0}, {6, 7, 2, 128}, {130, 5, 3, 128}}},
      {"linear_cross_entropy_lse", OpKind::linear_cross_entropy_lse,
       [](Builder& b, const Dims& d, DType t) {
         auto h = b.parameter("h", {d[0], d[2]}, {}, t);
         auto w = b.parameter("w", {d[1], d[2]}, {}, t);
         auto labels = b.input("labels", {d[0]}, graph::DType::i32);
         return b.linear_cross_entropy(h, w, labels, d[3], "loss");
       },
       {{4, 5, 3, 0}, {130, 5, 3, 128}}},
      // --- tensor parallelism over one rank (graph/tensor_parallel.h): the ops and their gradient
      // rules as a rank runs them; several ranks against one process: tests/tensor_parallel_mpi_test.cpp
      {"tp_copy", OpKind::tp_copy,
       [](Builder& b, const Dims& d, DType t) {
         return with_attrs(b, OpKind::tp_copy, b.parameter("x", Shape(d), {}, t), tensor_group(1));
       },
       {{3, 4}, {2, 1, 5}}},
      {"all_reduce_tensor_parallel", OpKind::all_reduce,
       [](Builder& b, const Dims& d, DType t) {
         // In place on its input (a view): the sum of a row-parallel layer's partial outputs.
         return with_attrs(b, OpKind::all_reduce, b.scale(b.parameter("x", Shape(d), {}, t), 1.5f, "partial"), tensor_group(1));
       },
       {{3, 4}}},
      // Sequence parallelism's row gather and reduce-scatter (graph/tensor_parallel.h: column_input,
      // row_output): over one rank a copy and a sum of one, with their gradient rules.
      {"all_gather_rows", OpKind::all_gather,
       [](Builder& b, const Dims& d, DType t) {
         graph::OpAttrs gather = tensor_group(1);
         gather.shape = {d[0], d[1]};
         return with_attrs(b, OpKind::all_gather, b.reshape(b.parameter("x", Shape(d), {}, t), {d[0] * d[1]}, "x.flat"), gather);
       },
       {{3, 4}, {1, 5}}},
      {"reduce_scatter_rows", OpKind::reduce_scatter,
       [](Builder& b, const Dims& d, DType t) {
         const TensorId partial = b.scale(b.parameter("x", Shape(d), {}, t), 1.5f, "partial");
         return with_attrs(b, OpKind::reduce_scatter, b.reshape(partial, {d[0] * d[1]}, "partial.flat"), tensor_group(1));
       },
       {{3, 4}, {2, 1}}},
      // Expert parallelism's exchange (graph/expert_parallel.h) over one rank: a copy, whose
      // gradient is the same exchange; several ranks: tests/expert_parallel_mpi_test.cpp
      {"all_to_all_experts", OpKind::all_to_all,
       [](Builder& b, const Dims& d, DType t) {
         graph::OpAttrs exchange;
         exchange.world = 1;
         exchange.group = graph::RankGroup::expert;
         return with_attrs(b, OpKind::all_to_all, b.scale(b.parameter("x", Shape(d), {}, t), 1.5f, "slots"), exchange);
       },
       {{2, 3, 4}, {4, 1, 2}}},
      {"embedding_vocab_slice", OpKind::embedding,
       [](Builder& b, const Dims& d, DType t) {
         // Rows [2, 2 + d[1]) of the vocabulary: the other ids give zero rows (and no gradient).
         graph::OpAttrs slice = tensor_group(2);
         slice.start = 2;
         auto ids = b.input("ids", {d[0]}, graph::DType::i32);
         return with_attrs(b, OpKind::embedding, {ids, b.parameter("table", {d[1], d[2]}, {}, t)}, slice);
       },
       {{6, 3, 2}}, 2e-2f, false, false, /*id_range=*/6},
      {"vocab_parallel_loss", OpKind::vocab_parallel_loss,
       [](Builder& b, const Dims& d, DType t) {
         // Columns [0, d[1] - 1) real, the last padding (labels stay below it: id_range).
         graph::OpAttrs slice = tensor_group(1);
         slice.length = d[1] - 1;
         auto logits = b.parameter("logits", {d[0], d[1]}, {}, t);
         auto labels = b.input("labels", {d[0]}, graph::DType::i32);
         const TensorId stats = with_attrs(b, OpKind::vocab_parallel_stats, {logits, labels}, slice);
         graph::OpAttrs gather = tensor_group(1);
         gather.shape = {1, d[0], 2};
         const TensorId all = with_attrs(b, OpKind::all_gather, b.reshape(stats, {d[0] * 2}, "stats.flat"), gather);
         return with_attrs(b, OpKind::vocab_parallel_loss, {all, logits, labels}, slice);
       },
       {{4, 5}, {1, 3}}, 2e-2f, false, false, /*id_range=*/2},
      // --- forward ops without a gradient rule ---
      {"batch_norm_stats", OpKind::batch_norm_stats,
       [](Builder& b, const Dims& d, DType t) { return with_attrs(b, OpKind::batch_norm_stats, b.parameter("x", Shape(d), {}, t), {}); },
       {{3, 2, 2, 2}, {4, 3}}},
      {"batch_norm_centered_stats", OpKind::batch_norm_centered_stats,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto about = b.parameter("about", {2, d[1]}, {}, t);  // row 0: the mean the variance is about
         return with_attrs(b, OpKind::batch_norm_centered_stats, {x, about}, {});
       },
       {{3, 2, 2, 2}, {4, 3}}},
      // running statistics as parameters, so they take random (positive) values
      {"batch_norm_inference", OpKind::batch_norm_inference,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto gamma = b.parameter("gamma", {d[1]}, {}, t);
         auto beta = b.parameter("beta", {d[1]}, {}, t);
         auto mean = b.parameter("running_mean", {d[1]}, {}, t);
         auto var = b.parameter("running_var", {d[1]}, {}, t);
         return b.batch_norm(x, gamma, beta, mean, var, /*training=*/false, "y");
       },
       {{3, 2, 2, 2}, {4, 3}}, 2e-2f, false, false, 0, true},
      {"layer_norm_stats", OpKind::layer_norm_stats,
       [](Builder& b, const Dims& d, DType t) { return with_attrs(b, OpKind::layer_norm_stats, b.parameter("x", Shape(d), {}, t), {}); },
       {{3, 5}, {2, 2, 4}}},
      {"dropout_mask", OpKind::dropout_mask,
       [](Builder& b, const Dims& d, DType t) {
         graph::OpAttrs attrs;
         attrs.shape = d;
         attrs.dropout = 0.3f;
         attrs.seed = graph::dropout_seed("drop");
         attrs.dtype = t;
         return with_attrs(b, OpKind::dropout_mask, std::vector<TensorId>{}, attrs);
       },
       {{7}, {3, 40}}},
      // batch norm in training, whose update of the running statistics (random before it) is under test
      {"running_stats_update", OpKind::running_stats_update,
       [](Builder& b, const Dims& d, DType t) {
         auto x = b.parameter("x", Shape(d), {}, t);
         auto gamma = b.parameter("gamma", {d[1]}, {}, t);
         auto beta = b.parameter("beta", {d[1]}, {}, t);
         auto mean = state(b, "running_mean", {d[1]}, {graph::InitSpec::Kind::uniform, 1.0f}, t);
         auto var = state(b, "running_var", {d[1]}, {graph::InitSpec::Kind::uniform, 1.0f}, t);
         return b.batch_norm(x, gamma, beta, mean, var, /*training=*/true, "y", /*momentum=*/0.3f);
       },
       {{3, 2, 2, 2}, {4, 3}}},
      // the optimizer updates of a parameter p from a gradient g (a parameter here, so it takes
      // random values), state randomly initialised (Adam's second moment positive)
      {"sgd_update", OpKind::sgd_update,
       [](Builder& b, const Dims& d, DType t) { return update(b, d, t, OpKind::sgd_update, 0); }, {{7}, {3, 4}}},
      {"sgd_momentum_update", OpKind::sgd_momentum_update,
       [](Builder& b, const Dims& d, DType t) { return update(b, d, t, OpKind::sgd_momentum_update, 1); }, {{7}, {3, 4}}},
      {"adamw_update", OpKind::adamw_update,
       [](Builder& b, const Dims& d, DType t) { return update(b, d, t, OpKind::adamw_update, 2); }, {{7}, {3, 4}}},
      // the row log-sum-exp fused attention saves (the case's graph is attention's)
      {"attention_lse", OpKind::attention_lse,
       [](Builder& b, const Dims& d, DType t) {
         auto q = b.parameter("q", {d[0], d[1], d[3], d[4]}, {}, t);
         auto k = b.parameter("k", {d[0], d[2], d[3], d[4]}, {}, t);
         auto v = b.parameter("v", {d[0], d[2], d[3], d[4]}, {}, t);
         return b.attention(q, k, v, d[5] != 0, 0.7f, 0.0f, "y");
       },
       {{2, 2, 2, 5, 3, 1}, {1, 4, 2, 5, 2, 0}, {1, 1, 1, 66, 2, 1}}},
      {"attention_lse_softcap", OpKind::attention_lse,
       [](Builder& b, const Dims& d, DType t) {
         auto q = b.parameter("q", {d[0], d[1], d[3], d[4]}, {}, t);
         auto k = b.parameter("k", {d[0], d[2], d[3], d[4]}, {}, t);
         auto v = b.parameter("v", {d[0], d[2], d[3], d[4]}, {}, t);
         return b.attention(q, k, v, d[5] != 0, 0.7f, 0.0f, "y", "", 0.5f);
       },
       {{2, 2, 2, 5, 3, 1}, {1, 1, 1, 130, 2, 1}}},
      {"attention_lse_window", OpKind::attention_lse,
       [](Builder& b, const Dims& d, DType t) {
         auto q = b.parameter("q", {d[0], d[1], d[3], d[4]}, {}, t);
         auto k = b.parameter("k", {d[0], d[2], d[3], d[4]}, {}, t);
         auto v = b.parameter("v", {d[0], d[2], d[3], d[4]}, {}, t);
         return b.attention(q, k, v, true, 0.7f, 0.0f, "y", "", 0.0f, d[5]);
       },
       {{2, 2, 1, 5, 3, 2}, {1, 1, 1, 300, 2, 40}}},
  };
  return kCases;
}

// --- references: each op's output from its operands, in double, from its contract in graph/op.h ---
namespace {

using V = std::vector<double>;

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s.dims) n *= d;
  return n;
}
std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

V unary(const RefOperands& o, double (*f)(double, const graph::OpAttrs&)) {
  V y(o.in[0].size());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = f(o.in[0][i], o.op.attrs);
  return y;
}
V binary(const RefOperands& o, double (*f)(double, double)) {
  V y(o.in[0].size());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = f(o.in[0][i], o.in[1][i]);
  return y;
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// C[M, N] = op(A) op(B) for `batches` consecutive pairs.
V matmul_of(const V& a, const V& b, std::int64_t batches, std::int64_t m, std::int64_t k, std::int64_t n, bool ta,
            bool tb) {
  V c(at(batches * m * n));
  for (std::int64_t p = 0; p < batches; ++p)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t l = 0; l < k; ++l) {
          s += a[at(p * m * k + (ta ? l * m + i : i * k + l))] * b[at(p * k * n + (tb ? j * k + l : l * n + j))];
        }
        c[at((p * m + i) * n + j)] = s;
      }
  return c;
}

V ref_matmul(const RefOperands& o) {
  const auto& at_ = o.op.attrs;
  const std::int64_t m = o.out[0], n = o.out[1], k = at_.trans_a ? o.shape[0][0] : o.shape[0][1];
  return matmul_of(o.in[0], o.in[1], 1, m, k, n, at_.trans_a, at_.trans_b);
}
// quant_matmul from its layouts' definitions (graph/quantize.h), in double: the weight rebuilt
// element by element, then multiplied. The tables are the published ones, written out here.
const double kNf4Table[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                              -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                              0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                              0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};
const double kFp4Table[16] = {0, 0.0625, 8, 12, 4, 6, 2, 3, -0.0, -0.0625, -8, -12, -4, -6, -2, -3};  // divided by 12
// bitsandbytes' create_dynamic_map(signed=True) as its Python builds it: per decade i = 0..6 the
// midpoints of linspace(0.1, 1, 2^i + 1) times +-10^(i-6), then 0 and 1, sorted.
std::vector<double> dynamic_map() {
  std::vector<double> data;
  for (int i = 0; i < 7; ++i) {
    const int points = (1 << i) + 1;
    for (int j = 0; j + 1 < points; ++j) {
      const double a = 0.1 + 0.9 * j / (points - 1), b = 0.1 + 0.9 * (j + 1) / (points - 1);
      data.push_back(std::pow(10.0, i - 6) * (a + b) / 2);
      data.push_back(-std::pow(10.0, i - 6) * (a + b) / 2);
    }
  }
  data.push_back(0);
  data.push_back(1);
  std::sort(data.begin(), data.end());
  return data;
}
V ref_quant_matmul(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const std::int64_t out = a.shape[0], in = a.shape[1];
  V w(static_cast<std::size_t>(out * in));
  const std::vector<double> dyn = dynamic_map();
  for (std::int64_t i = 0; i < out * in; ++i) {
    double v = 0;
    if (a.quant == graph::QuantFormat::int8) {
      const double code = o.in[1][static_cast<std::size_t>(i)];
      v = (code >= 128 ? code - 256 : code) * o.in[2][static_cast<std::size_t>(i / in)] / 127.0;
    } else {
      const auto byte = static_cast<int>(o.in[1][static_cast<std::size_t>(i / 2)]);
      const int code = i % 2 == 0 ? byte >> 4 : byte & 15;
      const std::size_t block = static_cast<std::size_t>(i / 64);
      const double absmax = a.double_quant ? dyn[static_cast<std::size_t>(o.in[2][block])] * o.in[3][block / 256] + o.in[4][0]
                                           : o.in[2][block];
      v = (a.quant == graph::QuantFormat::nf4 ? kNf4Table[code] : kFp4Table[code] / 12.0) * absmax;
    }
    w[static_cast<std::size_t>(i)] = v;
  }
  const std::int64_t n = o.shape[0][0];
  return a.trans_b ? matmul_of(o.in[0], w, 1, n, in, out, false, true) : matmul_of(o.in[0], w, 1, n, out, in, false, false);
}
V ref_batched_matmul(const RefOperands& o) {
  const int r = o.out.rank();
  const std::int64_t m = o.out[r - 2], n = o.out[r - 1];
  const std::int64_t k = o.op.attrs.trans_a ? o.shape[0][r - 2] : o.shape[0][r - 1];
  return matmul_of(o.in[0], o.in[1], numel(o.out) / (m * n), m, k, n, o.op.attrs.trans_a, o.op.attrs.trans_b);
}
V ref_bias_add(const RefOperands& o) {
  V y = o.in[0];
  const std::size_t n = o.in[1].size();
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += o.in[1][i % n];
  return y;
}
V ref_sum(const RefOperands& o) {
  double s = 0;
  for (double v : o.in[0]) s += v;
  return {s};
}
V ref_mean(const RefOperands& o) { return {ref_sum(o)[0] / double(o.in[0].size())}; }

V ref_softmax_cross_entropy(const RefOperands& o) {
  const std::int64_t rows = o.shape[0][0], classes = o.shape[0][1];
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, z = 0;
    for (std::int64_t c = 0; c < classes; ++c) mx = std::max(mx, o.in[0][at(r * classes + c)]);
    for (std::int64_t c = 0; c < classes; ++c) z += std::exp(o.in[0][at(r * classes + c)] - mx);
    const auto label = static_cast<std::int64_t>(o.in[1][at(r)]);
    total += -(o.in[0][at(r * classes + label)] - mx - std::log(z));
  }
  return {total / double(rows)};
}

// lse[n] = log sum_v exp(h_n . w_v)   (inputs: h [N, C], w [V, C])
V ref_linear_cross_entropy_lse(const RefOperands& o) {
  const std::int64_t rows = o.shape[0][0], width = o.shape[0][1], vocab = o.shape[1][0];
  V lse;
  for (std::int64_t r = 0; r < rows; ++r) {
    V logits;
    for (std::int64_t v = 0; v < vocab; ++v) {
      double dot = 0;
      for (std::int64_t k = 0; k < width; ++k) dot += o.in[0][at(r * width + k)] * o.in[1][at(v * width + k)];
      logits.push_back(dot);
    }
    const double mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (double l : logits) z += std::exp(l - mx);
    lse.push_back(mx + std::log(z));
  }
  return lse;
}
// mean_n(lse[n] - h_n . w_label)   (inputs: h, w, labels, lse)
V ref_linear_cross_entropy(const RefOperands& o) {
  const std::int64_t rows = o.shape[0][0], width = o.shape[0][1];
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto label = static_cast<std::int64_t>(o.in[2][at(r)]);
    double dot = 0;
    for (std::int64_t k = 0; k < width; ++k) dot += o.in[0][at(r * width + k)] * o.in[1][at(label * width + k)];
    total += o.in[3][at(r)] - dot;
  }
  return {total / double(rows)};
}

// im2col: cols[n, (c*K + kh)*KW + kw, oh*OW + ow] = x[n, c, oh*S + kh*D - P, ow*S + kw*D - PW] (0
// outside); KW and PW are kernel_w and padding_w when set, else K and P.
V ref_im2col(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const Shape& x = o.shape[0];
  const std::int64_t N = x[0], C = x[1], H = x[2], W = x[3], K = a.kernel;
  const std::int64_t KW = a.kernel_w > 0 ? a.kernel_w : K, PW = a.padding_w >= 0 ? a.padding_w : a.padding;
  const std::int64_t OH = (H + 2 * a.padding - a.dilation * (K - 1) - 1) / a.stride + 1;
  const std::int64_t OW = (W + 2 * PW - a.dilation * (KW - 1) - 1) / a.stride + 1;
  V y(at(N * C * K * KW * OH * OW));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t kh = 0; kh < K; ++kh)
        for (std::int64_t kw = 0; kw < KW; ++kw)
          for (std::int64_t oh = 0; oh < OH; ++oh)
            for (std::int64_t ow = 0; ow < OW; ++ow) {
              const std::int64_t ih = oh * a.stride + kh * a.dilation - a.padding;
              const std::int64_t iw = ow * a.stride + kw * a.dilation - PW;
              const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
              y[at((((n * C + c) * K + kh) * KW + kw) * OH * OW + oh * OW + ow)] =
                  inside ? o.in[0][at(((n * C + c) * H + ih) * W + iw)] : 0.0;
            }
  return y;
}
// conv2d: y[n] = w[Cout, Cin*K*K] cols[n]   inputs: cols, w.
V ref_conv2d(const RefOperands& o) {
  const Shape& cols = o.shape[0];
  const std::int64_t N = cols[0], CKK = cols[1], P = cols[2], Cout = o.shape[1][0];
  V y(at(N * Cout * P));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t co = 0; co < Cout; ++co)
      for (std::int64_t p = 0; p < P; ++p) {
        double s = 0;
        for (std::int64_t r = 0; r < CKK; ++r) s += o.in[1][at(co * CKK + r)] * o.in[0][at((n * CKK + r) * P + p)];
        y[at((n * Cout + co) * P + p)] = s;
      }
  return y;
}
// grouped_conv2d: output channel co reads input channels (co / (Cout/groups)) * (C/groups) + ci.
V ref_grouped_conv2d(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const Shape& x = o.shape[0];
  const std::int64_t N = x[0], C = x[1], H = x[2], W = x[3], Cout = o.out[1], OH = o.out[2], OW = o.out[3];
  const std::int64_t K = o.shape[1][2], cin = C / a.groups, cout = Cout / a.groups;
  V y(at(numel(o.out)));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t co = 0; co < Cout; ++co)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double s = 0;
          for (std::int64_t ci = 0; ci < cin; ++ci)
            for (std::int64_t kh = 0; kh < K; ++kh)
              for (std::int64_t kw = 0; kw < K; ++kw) {
                const std::int64_t ih = oh * a.stride + kh * a.dilation - a.padding;
                const std::int64_t iw = ow * a.stride + kw * a.dilation - a.padding;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const std::int64_t channel = (co / cout) * cin + ci;
                s += o.in[0][at(((n * C + channel) * H + ih) * W + iw)] * o.in[1][at(((co * cin + ci) * K + kh) * K + kw)];
              }
          y[at(((n * Cout + co) * OH + oh) * OW + ow)] = s;
        }
  return y;
}
// Pooling windows (square, no dilation); padding is never a maximum and avg_pool2d has none.
V pool(const RefOperands& o, bool max) {
  const auto& a = o.op.attrs;
  const Shape& x = o.shape[0];
  const std::int64_t NC = x[0] * x[1], H = x[2], W = x[3], OH = o.out[2], OW = o.out[3], K = a.kernel;
  V y(at(NC * OH * OW));
  for (std::int64_t nc = 0; nc < NC; ++nc)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        double acc = max ? -INFINITY : 0.0;
        for (std::int64_t kh = 0; kh < K; ++kh)
          for (std::int64_t kw = 0; kw < K; ++kw) {
            const std::int64_t ih = oh * a.stride + kh - (max ? a.padding : 0), iw = ow * a.stride + kw - (max ? a.padding : 0);
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double v = o.in[0][at((nc * H + ih) * W + iw)];
            acc = max ? std::max(acc, v) : acc + v;
          }
        y[at((nc * OH + oh) * OW + ow)] = max ? acc : acc / double(K * K);
      }
  return y;
}
V ref_max_pool2d(const RefOperands& o) { return pool(o, true); }
V ref_avg_pool2d(const RefOperands& o) { return pool(o, false); }
V ref_global_avg_pool(const RefOperands& o) {
  const std::int64_t NC = o.shape[0][0] * o.shape[0][1], HW = o.shape[0][2] * o.shape[0][3];
  V y(at(NC), 0.0);
  for (std::int64_t i = 0; i < NC * HW; ++i) y[at(i / HW)] += o.in[0][at(i)] / double(HW);
  return y;
}

// Channel c of x [N, C, ...]: element i's channel.
std::int64_t channel_of(const Shape& x, std::int64_t i) {
  const std::int64_t inner = numel(x) / (x[0] * x[1]);
  return (i / inner) % x[1];
}
// (mean, mean of (x - about)^2) per channel; about = the mean when null.
V channel_stats(const RefOperands& o, const V* about) {
  const Shape& x = o.shape[0];
  const std::int64_t C = x[1], n = numel(x), count = n / C;
  V stats(at(2 * C), 0.0);
  for (std::int64_t i = 0; i < n; ++i) stats[at(channel_of(x, i))] += o.in[0][at(i)] / double(count);
  const V& m = about != nullptr ? *about : stats;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t c = channel_of(x, i);
    stats[at(C + c)] += std::pow(o.in[0][at(i)] - m[at(c)], 2) / double(count);
  }
  if (about != nullptr) std::copy(about->begin(), about->begin() + C, stats.begin());
  return stats;
}
V ref_batch_norm_stats(const RefOperands& o) { return channel_stats(o, nullptr); }
V ref_batch_norm_centered_stats(const RefOperands& o) { return channel_stats(o, &o.in[1]); }
// y = (x - mean) / sqrt(var + eps) * gamma + beta with mean, var, gamma, beta per channel.
V normalise_channels(const RefOperands& o, const V& mean, const V& var, const V& gamma, const V& beta) {
  V y(o.in[0].size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const auto c = at(channel_of(o.shape[0], static_cast<std::int64_t>(i)));
    y[i] = (o.in[0][i] - mean[c]) / std::sqrt(var[c] + double(o.op.attrs.norm_eps)) * gamma[c] + beta[c];
  }
  return y;
}
V ref_batch_norm(const RefOperands& o) {
  const auto C = static_cast<std::ptrdiff_t>(o.shape[0][1]);
  const V mean(o.in[1].begin(), o.in[1].begin() + C), var(o.in[1].begin() + C, o.in[1].end());
  return normalise_channels(o, mean, var, o.in[2], o.in[3]);
}
V ref_batch_norm_inference(const RefOperands& o) { return normalise_channels(o, o.in[1], o.in[2], o.in[3], o.in[4]); }

// Per row of the last dim: (mean, 1 / sqrt(biased var + eps)).
V ref_layer_norm_stats(const RefOperands& o) {
  const std::int64_t D = o.shape[0].dims.back(), rows = numel(o.shape[0]) / D;
  V stats(at(2 * rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::int64_t j = 0; j < D; ++j) m += o.in[0][at(r * D + j)] / double(D);
    for (std::int64_t j = 0; j < D; ++j) v += std::pow(o.in[0][at(r * D + j)] - m, 2) / double(D);
    stats[at(2 * r)] = m;
    stats[at(2 * r + 1)] = 1.0 / std::sqrt(v + double(o.op.attrs.norm_eps));
  }
  return stats;
}
V ref_layer_norm(const RefOperands& o) {
  const std::int64_t D = o.shape[0].dims.back();
  V y(o.in[0].size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const auto r = static_cast<std::int64_t>(i) / D, j = static_cast<std::int64_t>(i) % D;
    y[i] = (o.in[0][i] - o.in[1][at(2 * r)]) * o.in[1][at(2 * r + 1)] * o.in[2][at(j)] + o.in[3][at(j)];
  }
  return y;
}
V ref_rms_norm(const RefOperands& o) {
  const std::int64_t D = o.shape[0].dims.back(), rows = numel(o.shape[0]) / D;
  V y(o.in[0].size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (std::int64_t j = 0; j < D; ++j) ms += std::pow(o.in[0][at(r * D + j)], 2) / double(D);
    const double inv = 1.0 / std::sqrt(ms + double(o.op.attrs.norm_eps));
    for (std::int64_t j = 0; j < D; ++j) y[at(r * D + j)] = o.in[0][at(r * D + j)] * inv * o.in[1][at(j)];
  }
  return y;
}
V ref_embedding(const RefOperands& o) {
  const std::int64_t rows = o.shape[1][0], D = o.shape[1][1];
  const std::int64_t start = o.op.attrs.world > 1 ? o.op.attrs.start : 0;  // a vocabulary slice
  V y;
  for (double id : o.in[0]) {
    const auto row = static_cast<std::int64_t>(id) - start;
    if (row < 0 || row >= rows) {
      y.insert(y.end(), static_cast<std::size_t>(D), 0.0);
      continue;
    }
    y.insert(y.end(), o.in[1].begin() + row * D, o.in[1].begin() + (row + 1) * D);
  }
  return y;
}
// Per row: log sum exp over the `length` real columns, and the label's logit when the slice
// [start, start + length) holds it (else 0).
V ref_vocab_parallel_stats(const RefOperands& o) {
  const std::int64_t rows = o.shape[0][0], cols = o.shape[0][1], real = o.op.attrs.length;
  V y;
  for (std::int64_t r = 0; r < rows; ++r) {
    double z = 0;
    for (std::int64_t c = 0; c < real; ++c) z += std::exp(o.in[0][at(r * cols + c)]);
    y.push_back(std::log(z));
    const std::int64_t label = static_cast<std::int64_t>(o.in[1][at(r)]) - o.op.attrs.start;
    y.push_back(label >= 0 && label < real ? o.in[0][at(r * cols + label)] : 0.0);
  }
  return y;
}
// The mean over rows of log sum over ranks of exp(lse) minus the sum over ranks of the label logit.
V ref_vocab_parallel_loss(const RefOperands& o) {
  const std::int64_t world = o.shape[0][0], rows = o.shape[0][1];
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double z = 0, label = 0;
    for (std::int64_t k = 0; k < world; ++k) {
      z += std::exp(o.in[0][at((k * rows + r) * 2)]);
      label += o.in[0][at((k * rows + r) * 2 + 1)];
    }
    total += std::log(z) - label;
  }
  return {total / double(rows)};
}
// Softmax over the last dim; causal: row i of each trailing [T, T] block sees j <= i, and with a
// window j > i - window too (the rest 0).
V ref_softmax(const RefOperands& o) {
  const std::int64_t D = o.shape[0].dims.back(), rows = numel(o.shape[0]) / D, window = o.op.attrs.window;
  V y(o.in[0].size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t seen = o.op.attrs.causal ? r % D + 1 : D;
    const std::int64_t first = o.op.attrs.causal && window > 0 ? std::max<std::int64_t>(0, seen - window) : 0;
    double mx = -INFINITY, z = 0;
    for (std::int64_t j = first; j < seen; ++j) mx = std::max(mx, o.in[0][at(r * D + j)]);
    for (std::int64_t j = first; j < seen; ++j) z += std::exp(o.in[0][at(r * D + j)] - mx);
    for (std::int64_t j = first; j < seen; ++j) y[at(r * D + j)] = std::exp(o.in[0][at(r * D + j)] - mx) / z;
  }
  return y;
}
// Row-major strides of a shape.
std::vector<std::int64_t> strides(const Shape& s) {
  std::vector<std::int64_t> st(s.dims.size(), 1);
  for (int i = s.rank() - 2; i >= 0; --i) st[at(i)] = st[at(i + 1)] * s[i + 1];
  return st;
}
// Output dim i is input dim perm[i].
V ref_permute(const RefOperands& o) {
  const auto in_st = strides(o.shape[0]), out_st = strides(o.out);
  V y(o.in[0].size());
  for (std::int64_t i = 0; i < numel(o.out); ++i) {
    std::int64_t src = 0;
    for (int d = 0; d < o.out.rank(); ++d) src += (i / out_st[at(d)]) % o.out[d] * in_st[at(o.op.attrs.perm[at(d)])];
    y[at(i)] = o.in[0][at(src)];
  }
  return y;
}
V ref_reshape(const RefOperands& o) { return o.in[0]; }
// The output split at `axis` as [outer, extent, inner].
V ref_concat(const RefOperands& o) {
  const int axis = static_cast<int>(o.op.attrs.axis);
  const auto inner = strides(o.out)[at(axis)];
  const std::int64_t ea = o.shape[0][axis] * inner, eb = o.shape[1][axis] * inner, outer = numel(o.out) / (ea + eb);
  V y;
  for (std::int64_t r = 0; r < outer; ++r) {
    y.insert(y.end(), o.in[0].begin() + r * ea, o.in[0].begin() + (r + 1) * ea);
    y.insert(y.end(), o.in[1].begin() + r * eb, o.in[1].begin() + (r + 1) * eb);
  }
  return y;
}
V ref_slice(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const int axis = static_cast<int>(a.axis);
  const auto inner = strides(o.shape[0])[at(axis)];
  const std::int64_t extent = o.shape[0][axis] * inner, outer = numel(o.shape[0]) / extent;
  V y;
  for (std::int64_t r = 0; r < outer; ++r) {
    const auto first = o.in[0].begin() + r * extent + a.start * inner;
    y.insert(y.end(), first, first + a.length * inner);
  }
  return y;
}
// Pairs (i, i + HD/2) of x[..., T, HD] rotated by t * base^(-2i/HD) at position t.
V ref_rotary(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const int r = o.shape[0].rank();
  const std::int64_t T = o.shape[0][r - 2], HD = o.shape[0][r - 1], rows = numel(o.shape[0]) / HD;
  const std::int64_t R = a.rotary_dims > 0 ? a.rotary_dims : HD, half = R / 2;  // channels from R on stay
  V y = o.in[0];
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = (a.inverse ? -1.0 : 1.0) * double(row % T) * std::pow(double(a.rope_base), -2.0 * double(i) / double(R));
      const double x0 = o.in[0][at(row * HD + i)], x1 = o.in[0][at(row * HD + i + half)];
      y[at(row * HD + i)] = x0 * std::cos(angle) - x1 * std::sin(angle);
      y[at(row * HD + i + half)] = x1 * std::cos(angle) + x0 * std::sin(angle);
    }
  return y;
}
V ref_repeat_heads(const RefOperands& o) {
  const Shape& x = o.shape[0];
  const std::int64_t B = x[0], H = x[1], R = o.op.attrs.repeats, inner = numel(x) / (B * H);
  V y;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H * R; ++h) {
      const auto first = o.in[0].begin() + (b * H + h / R) * inner;
      y.insert(y.end(), first, first + inner);
    }
  return y;
}
V ref_channel_scale(const RefOperands& o) {
  const Shape& x = o.shape[0];
  const std::int64_t inner = numel(x) / (x[0] * x[1]);
  V y(o.in[0].size());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = o.in[0][i] * o.in[1][i / at(inner)];
  return y;
}
// Mixtures of experts, from graph/op.h's contract: the k largest per row (ties: the lower index);
// expert e's slots hold its routed tokens (gate != 0) in token order, the first `capacity` of them.
V ref_moe_top_k(const RefOperands& o) {
  const std::int64_t N = o.shape[0][0], E = o.shape[0][1];
  V gates(o.in[0].size(), 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    const double* row = o.in[0].data() + n * E;
    std::vector<bool> chosen(at(E), false);
    double sum = 0.0;
    for (std::int64_t pick = 0; pick < o.op.attrs.top_k; ++pick) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        if (!chosen[at(e)] && (best < 0 || row[e] > row[best])) best = e;
      }
      chosen[at(best)] = true;
      sum += row[best];
    }
    for (std::int64_t e = 0; e < E; ++e) {
      if (chosen[at(e)]) gates[at(n * E + e)] = o.op.attrs.normalize ? row[e] / sum : row[e];
    }
  }
  return gates;
}
// slot[n * E + e]: token n's slot in expert e, or -1 (not routed, or beyond the capacity).
std::vector<std::int64_t> moe_slots(const V& gates, std::int64_t N, std::int64_t E, std::int64_t capacity) {
  std::vector<std::int64_t> slot(at(N * E), -1);
  for (std::int64_t e = 0; e < E; ++e) {
    std::int64_t used = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      if (gates[at(n * E + e)] != 0.0 && used < capacity) slot[at(n * E + e)] = used++;
    }
  }
  return slot;
}
V ref_moe_dispatch(const RefOperands& o) {
  const std::int64_t N = o.shape[0][0], C = o.shape[0][1], E = o.shape[1][1], S = o.op.attrs.capacity;
  const auto slot = moe_slots(o.in[1], N, E, S);
  V xe(at(E * S * C), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t e = 0; e < E; ++e) {
      if (slot[at(n * E + e)] < 0) continue;
      const double w = o.op.attrs.weighted ? o.in[1][at(n * E + e)] : 1.0;
      for (std::int64_t c = 0; c < C; ++c) xe[at((e * S + slot[at(n * E + e)]) * C + c)] = w * o.in[0][at(n * C + c)];
    }
  return xe;
}
V ref_moe_combine(const RefOperands& o) {
  const std::int64_t E = o.shape[0][0], S = o.shape[0][1], C = o.shape[0][2], N = o.shape[1][0];
  const auto slot = moe_slots(o.in[1], N, E, S);
  V y(at(N * C), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t e = 0; e < E; ++e) {
      if (slot[at(n * E + e)] < 0) continue;
      const double w = o.op.attrs.weighted ? o.in[1][at(n * E + e)] : 1.0;
      for (std::int64_t c = 0; c < C; ++c) y[at(n * C + c)] += w * o.in[0][at((e * S + slot[at(n * E + e)]) * C + c)];
    }
  return y;
}
V ref_moe_router_stats(const RefOperands& o) {
  const std::int64_t N = o.shape[0][0], E = o.shape[0][1];
  V stats(at(2 * E), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t e = 0; e < E; ++e) {
      stats[at(e)] += o.in[1][at(n * E + e)] != 0.0 ? 1.0 : 0.0;
      stats[at(E + e)] += o.in[0][at(n * E + e)];
    }
  return stats;
}
// transformers' _relative_position_bucket, step by step in float32 as PyTorch computes it.
std::int64_t ref_t5_bucket(std::int64_t relative, bool bidirectional, std::int64_t buckets, std::int64_t max_distance) {
  std::int64_t result = 0;
  if (bidirectional) {
    buckets /= 2;
    result += relative > 0 ? buckets : 0;
    relative = std::abs(relative);
  } else {
    relative = -std::min<std::int64_t>(relative, 0);
  }
  const std::int64_t max_exact = buckets / 2;
  if (relative < max_exact) return result + relative;
  const float large = std::log(float(relative) / float(max_exact)) /
                      float(std::log(double(max_distance) / double(max_exact))) * float(buckets - max_exact);
  return result + std::min(max_exact + static_cast<std::int64_t>(large), buckets - 1);
}
V ref_relative_position_bias(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const std::int64_t H = o.shape[0][1], Tq = a.shape[0], Tk = a.shape[1];
  V y(at(H * Tq * Tk));
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < Tq; ++i)
      for (std::int64_t j = 0; j < Tk; ++j)
        y[at((h * Tq + i) * Tk + j)] = o.in[0][at(ref_t5_bucket(j - i, a.bidirectional, a.buckets, a.max_distance) * H + h)];
  return y;
}
V ref_broadcast_scalar(const RefOperands& o) { return V(at(numel(o.out)), double(o.op.attrs.alpha) * o.in[0][0]); }
// Element i: 0 where splitmix64(stream + i)'s top 24 bits / 2^24 < p, else 1 / (1 - p), with
// stream = splitmix64(seed ^ splitmix64(step)); the harness runs step 1.
V ref_dropout_mask(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const std::uint64_t stream = splitmix64_mix(a.seed ^ splitmix64_mix(1));
  V y(at(numel(o.out)));
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double u = double(splitmix64_mix(stream + i) >> 40) / 16777216.0;
    y[i] = u < double(a.dropout) ? 0.0 : 1.0 / (1.0 - double(a.dropout));
  }
  return y;
}
// Scores alpha q_i.k_j of query head h against K/V head h / (H/KH), j <= i when causal (and
// j > i - window with a window).
struct Attention {
  const RefOperands& o;
  std::int64_t B, H, KH, T, D;
  explicit Attention(const RefOperands& ops)
      : o(ops), B(ops.shape[0][0]), H(ops.shape[0][1]), KH(ops.shape[1][1]), T(ops.shape[0][2]), D(ops.shape[0][3]) {}
  std::int64_t keys(std::int64_t i) const { return o.op.attrs.causal ? i + 1 : T; }
  std::int64_t first_key(std::int64_t i) const {
    return o.op.attrs.causal && o.op.attrs.window > 0 ? std::max<std::int64_t>(0, i + 1 - o.op.attrs.window) : 0;
  }
  std::int64_t kv_row(std::int64_t b, std::int64_t h, std::int64_t j) const { return ((b * KH + h / (H / KH)) * T + j) * D; }
  double score(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    double s = 0;
    for (std::int64_t d = 0; d < D; ++d) s += o.in[0][at(((b * H + h) * T + i) * D + d)] * o.in[1][at(kv_row(b, h, j) + d)];
    const double scaled = double(o.op.attrs.alpha) * s, cap = o.op.attrs.softcap;
    return cap > 0.0 ? cap * std::tanh(scaled / cap) : scaled;
  }
};
V ref_attention_lse(const RefOperands& o) {
  const Attention a(o);
  V lse;
  for (std::int64_t b = 0; b < a.B; ++b)
    for (std::int64_t h = 0; h < a.H; ++h)
      for (std::int64_t i = 0; i < a.T; ++i) {
        double z = 0;
        for (std::int64_t j = a.first_key(i); j < a.keys(i); ++j) z += std::exp(a.score(b, h, i, j));
        lse.push_back(std::log(z));
      }
  return lse;
}
// y = exp(scores - lse) v with the given lse (inputs: q, k, v, lse); the cases use no dropout.
V ref_attention(const RefOperands& o) {
  const Attention a(o);
  V y(at(numel(o.out)), 0.0);
  for (std::int64_t b = 0; b < a.B; ++b)
    for (std::int64_t h = 0; h < a.H; ++h)
      for (std::int64_t i = 0; i < a.T; ++i)
        for (std::int64_t j = a.first_key(i); j < a.keys(i); ++j) {
          const double p = std::exp(a.score(b, h, i, j) - o.in[3][at((b * a.H + h) * a.T + i)]);
          for (std::int64_t d = 0; d < a.D; ++d) y[at(((b * a.H + h) * a.T + i) * a.D + d)] += p * o.in[2][at(a.kv_row(b, h, j) + d)];
        }
  return y;
}

// new = (1 - m) old + m batch per channel, the variance's batch value times alpha (M / (M - 1)).
V ref_running_stats_update(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const std::size_t C = o.updates[0].size();
  V y;
  for (std::size_t u = 0; u < 2; ++u)
    for (std::size_t c = 0; c < C; ++c) {
      const double batch = o.in[0][u * C + c] * (u == 1 ? double(a.alpha) : 1.0);
      y.push_back((1.0 - double(a.momentum)) * o.updates[u][c] + double(a.momentum) * batch);
    }
  return y;
}
// SGD: p - lr (g + wd p).
V ref_sgd_update(const RefOperands& o) {
  const auto& a = o.op.attrs;
  V y = o.updates[0];
  for (std::size_t i = 0; i < y.size(); ++i) y[i] -= double(a.lr) * (o.in[0][i] + double(a.weight_decay) * y[i]);
  return y;
}
// SGD with momentum (PyTorch's, dampening 0): buf = m buf + g + wd p; p -= lr buf. Returns p, buf.
V ref_sgd_momentum_update(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const std::size_t n = o.updates[0].size();
  V y(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const double p = o.updates[0][i];
    const double buf = double(a.momentum) * o.updates[1][i] + o.in[0][i] + double(a.weight_decay) * p;
    y[i] = p - double(a.lr) * buf;
    y[n + i] = buf;
  }
  return y;
}
// AdamW at step 1 (the harness's): p (1 - lr wd) - lr / (1 - b1) * m / (sqrt(v) / sqrt(1 - b2) + eps)
// with m, v the moments after this step's gradient. Returns p, m, v.
V ref_adamw_update(const RefOperands& o) {
  const auto& a = o.op.attrs;
  const double b1 = a.beta1, b2 = a.beta2, lr = a.lr;
  const std::size_t n = o.updates[0].size();
  V y(3 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const double g = o.in[0][i];
    const double m = b1 * o.updates[1][i] + (1 - b1) * g, v = b2 * o.updates[2][i] + (1 - b2) * g * g;
    y[i] = o.updates[0][i] * (1 - lr * double(a.weight_decay)) -
           lr / (1 - b1) * m / (std::sqrt(v) / std::sqrt(1 - b2) + double(a.eps));
    y[n + i] = m;
    y[2 * n + i] = v;
  }
  return y;
}

struct ReferenceEntry {
  OpKind kind;
  Reference fn;
};
const ReferenceEntry kReferences[] = {
    {OpKind::matmul, ref_matmul},
    {OpKind::bias_add, ref_bias_add},
    {OpKind::add, [](const RefOperands& o) { return binary(o, [](double a, double b) { return a + b; }); }},
    {OpKind::mul, [](const RefOperands& o) { return binary(o, [](double a, double b) { return a * b; }); }},
    {OpKind::scale, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs& a) { return double(a.alpha) * x; }); }},
    {OpKind::relu, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs&) { return std::max(x, 0.0); }); }},
    {OpKind::gelu, [](const RefOperands& o) {
       return unary(o, [](double x, const graph::OpAttrs&) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); });
     }},
    {OpKind::sigmoid, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs&) { return sigmoid(x); }); }},
    {OpKind::tanh, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs&) { return std::tanh(x); }); }},
    {OpKind::silu, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs&) { return x * sigmoid(x); }); }},
    {OpKind::clip, [](const RefOperands& o) {
       return unary(o, [](double x, const graph::OpAttrs& a) { return std::min(std::max(x, double(a.clip_min)), double(a.clip_max)); });
     }},
    {OpKind::swiglu, [](const RefOperands& o) { return binary(o, [](double g, double u) { return g * sigmoid(g) * u; }); }},
    {OpKind::quant_matmul, ref_quant_matmul},
    {OpKind::cast, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs&) { return x; }); }},
    {OpKind::reshape, ref_reshape},
    {OpKind::tp_copy, ref_reshape},  // the identity
    // Over one rank (the cases' world): a sum of one is alpha x; a gather of one is a copy.
    {OpKind::all_reduce, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs& a) { return double(a.alpha) * x; }); }},
    {OpKind::all_gather, ref_reshape},
    {OpKind::all_to_all, ref_reshape},
    {OpKind::reduce_scatter, [](const RefOperands& o) { return unary(o, [](double x, const graph::OpAttrs& a) { return double(a.alpha) * x; }); }},
    {OpKind::vocab_parallel_stats, ref_vocab_parallel_stats},
    {OpKind::vocab_parallel_loss, ref_vocab_parallel_loss},
    {OpKind::sum, ref_sum},
    {OpKind::mean, ref_mean},
    {OpKind::broadcast_scalar, ref_broadcast_scalar},
    {OpKind::softmax_cross_entropy, ref_softmax_cross_entropy},
    {OpKind::linear_cross_entropy_lse, ref_linear_cross_entropy_lse},
    {OpKind::linear_cross_entropy, ref_linear_cross_entropy},
    {OpKind::im2col, ref_im2col},
    {OpKind::conv2d, ref_conv2d},
    {OpKind::grouped_conv2d, ref_grouped_conv2d},
    {OpKind::max_pool2d, ref_max_pool2d},
    {OpKind::avg_pool2d, ref_avg_pool2d},
    {OpKind::global_avg_pool, ref_global_avg_pool},
    {OpKind::channel_scale, ref_channel_scale},
    {OpKind::moe_top_k, ref_moe_top_k},
    {OpKind::moe_dispatch, ref_moe_dispatch},
    {OpKind::moe_combine, ref_moe_combine},
    {OpKind::moe_router_stats, ref_moe_router_stats},
    {OpKind::relative_position_bias, ref_relative_position_bias},
    {OpKind::batch_norm_stats, ref_batch_norm_stats},
    {OpKind::batch_norm_centered_stats, ref_batch_norm_centered_stats},
    {OpKind::batch_norm, ref_batch_norm},
    {OpKind::batch_norm_inference, ref_batch_norm_inference},
    {OpKind::layer_norm_stats, ref_layer_norm_stats},
    {OpKind::layer_norm, ref_layer_norm},
    {OpKind::rms_norm, ref_rms_norm},
    {OpKind::embedding, ref_embedding},
    {OpKind::batched_matmul, ref_batched_matmul},
    {OpKind::softmax, ref_softmax},
    {OpKind::permute, ref_permute},
    {OpKind::concat, ref_concat},
    {OpKind::slice, ref_slice},
    {OpKind::rotary, ref_rotary},
    {OpKind::repeat_heads, ref_repeat_heads},
    {OpKind::dropout_mask, ref_dropout_mask},
    {OpKind::attention_lse, ref_attention_lse},
    {OpKind::attention, ref_attention},
    {OpKind::running_stats_update, ref_running_stats_update},
    {OpKind::sgd_update, ref_sgd_update},
    {OpKind::sgd_momentum_update, ref_sgd_momentum_update},
    {OpKind::adamw_update, ref_adamw_update},
};

}  // namespace

Reference reference_of(OpKind kind) {
  for (const ReferenceEntry& e : kReferences) {
    if (e.kind == kind) return e.fn;
  }
  return nullptr;
}

TensorId build_case_graph(const OpCase& c, const Dims& dims, DType dtype, bool backward, graph::Graph& g) {
  Builder b(g);
  const TensorId y = c.build(b, dims, dtype);
  const TensorId weights = b.input("R", g.tensor(y).shape, g.tensor(y).dtype);
  g.loss = b.sum(b.mul(y, weights, "yR"), "loss");
  g.retained.push_back(y);
  if (backward) {
    graph::append_backward(g, g.loss);
    for (TensorId p : g.parameters()) {
      if (!g.tensor(p).frozen) g.retained.push_back(g.tensor(p).grad);  // frozen storage has none
    }
  }
  return y;
}

const graph::Op& op_under_test(const graph::Graph& g, OpKind kind) {
  const graph::Op* found = nullptr;
  for (const graph::Op& op : g.ops()) {
    if (op.kind == kind && op.phase != graph::Phase::backward) found = &op;
  }
  MEMPLAN_CHECK(found != nullptr, "the case's graph has no op of its kind");
  return *found;
}

}  // namespace memplan::testing
