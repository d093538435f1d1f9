// The gradient-check harness: every differentiable op's backward rule against central finite
// differences, parameterised over shapes. Adding an op means adding one entry to kCases.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "memplan/graph/autograd.h"
#include "memplan/graph/builder.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::Builder;
using graph::OpKind;
using graph::Shape;

// A case builds `y = op(params...)` from parameters it creates (so they receive gradients); the
// harness then reduces y to a scalar loss = sum(y * R) with a fixed random R, so every output
// element carries a distinct weight.
struct GradCase {
  const char* name;
  OpKind kind;  // the op under test (checked to have a gradient rule)
  std::function<TensorId(Builder&, const std::vector<std::int64_t>& dims)> build;
  std::vector<std::vector<std::int64_t>> dim_sets;  // shapes to try
  float tolerance = 2e-2f;
  bool away_from_zero = false;  // inputs kept away from kinks (relu)
  bool distinct = false;        // parameter values at least 0.1 apart (max pooling: no near-ties)
  std::int64_t id_range = 0;    // i32 inputs hold (7i + 1) % id_range; 0 = dims[1]
};

graph::InitSpec no_init() { return {}; }

TensorId with_attrs(Builder& b, OpKind kind, TensorId x, graph::OpAttrs attrs) {
  return b.graph().add_op(kind, {x}, std::move(attrs), "y", graph::Role::activation, graph::Phase::forward);
}

graph::OpAttrs window(std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  graph::OpAttrs attrs;
  attrs.kernel = kernel;
  attrs.stride = stride;
  attrs.padding = padding;
  return attrs;
}

TensorId batched(Builder& b, const std::vector<std::int64_t>& d, bool ta, bool tb) {
  // d = {B, M, K, N}
  auto a = b.parameter("a", ta ? Shape{d[0], d[2], d[1]} : Shape{d[0], d[1], d[2]}, no_init());
  auto w = b.parameter("w", tb ? Shape{d[0], d[3], d[2]} : Shape{d[0], d[2], d[3]}, no_init());
  return b.batched_matmul(a, w, ta, tb, "y");
}

const std::vector<GradCase>& cases() {
  static const std::vector<GradCase> kCases = {
      {"matmul", OpKind::matmul,
       [](Builder& b, const auto& d) {
         auto a = b.parameter("a", {d[0], d[1]}, no_init());
         auto w = b.parameter("w", {d[1], d[2]}, no_init());
         return b.matmul(a, w, false, false, "y");
       },
       {{1, 1, 1}, {3, 4, 5}, {7, 2, 3}}},
      {"matmul_trans_b", OpKind::matmul,
       [](Builder& b, const auto& d) {
         auto a = b.parameter("a", {d[0], d[1]}, no_init());
         auto w = b.parameter("w", {d[2], d[1]}, no_init());
         return b.matmul(a, w, false, true, "y");
       },
       {{3, 4, 5}, {2, 6, 1}}},
      {"matmul_trans_a", OpKind::matmul,
       [](Builder& b, const auto& d) {
         auto a = b.parameter("a", {d[1], d[0]}, no_init());
         auto w = b.parameter("w", {d[1], d[2]}, no_init());
         return b.matmul(a, w, true, false, "y");
       },
       {{3, 4, 5}, {1, 3, 2}}},
      {"matmul_trans_both", OpKind::matmul,
       [](Builder& b, const auto& d) {
         auto a = b.parameter("a", {d[1], d[0]}, no_init());
         auto w = b.parameter("w", {d[2], d[1]}, no_init());
         return b.matmul(a, w, true, true, "y");
       },
       {{3, 4, 5}, {4, 1, 2}}},
      {"bias_add", OpKind::bias_add,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1]}, no_init());
         auto bias = b.parameter("b", {d[1]}, no_init());
         return b.bias_add(x, bias, "y");
       },
       {{1, 3}, {4, 5}}},
      {"add", OpKind::add,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", Shape(d), no_init());
         auto y = b.parameter("y", Shape(d), no_init());
         return b.add(x, y, "z");
       },
       {{5}, {2, 3}}},
      {"add_same_operand_twice", OpKind::add,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", Shape(d), no_init());
         return b.add(x, x, "z");  // gradient must accumulate both uses
       },
       {{4}, {2, 3}}},
      {"mul", OpKind::mul,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", Shape(d), no_init());
         auto y = b.parameter("y", Shape(d), no_init());
         return b.mul(x, y, "z");
       },
       {{5}, {3, 2}}},
      {"scale", OpKind::scale,
       [](Builder& b, const auto& d) { return b.scale(b.parameter("x", Shape(d), no_init()), -1.5f, "y"); },
       {{4}, {2, 2}}},
      {"relu", OpKind::relu,
       [](Builder& b, const auto& d) { return b.relu(b.parameter("x", Shape(d), no_init()), "y"); },
       {{7}, {3, 4}}, 2e-2f, true},
      {"gelu", OpKind::gelu,
       [](Builder& b, const auto& d) { return b.gelu(b.parameter("x", Shape(d), no_init()), "y"); },
       {{7}, {3, 4}}},
      {"sigmoid", OpKind::sigmoid,
       [](Builder& b, const auto& d) { return b.sigmoid(b.parameter("x", Shape(d), no_init()), "y"); },
       {{7}, {3, 4}}},
      {"tanh", OpKind::tanh,
       [](Builder& b, const auto& d) { return b.tanh(b.parameter("x", Shape(d), no_init()), "y"); },
       {{7}, {3, 4}}},
      // Both bounds inside the inputs' range, so both the passing and the clipped sides are checked.
      {"clip", OpKind::clip,
       [](Builder& b, const auto& d) { return b.clip(b.parameter("x", Shape(d), no_init()), 0.0f, 0.5f, "y"); },
       {{7}, {3, 4}}, 2e-2f, true},
      // d = {N, C, H, W, Cout, K, stride, padding, groups}: depthwise, grouped with a stride, 1x1
      {"grouped_conv2d", OpKind::grouped_conv2d,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         auto w = b.parameter("w", {d[4], d[1] / d[8], d[5], d[5]}, no_init());
         return b.grouped_conv2d(x, w, d[6], d[7], d[8], "y");
       },
       {{2, 4, 5, 5, 4, 3, 1, 1, 4}, {1, 4, 6, 6, 6, 3, 2, 1, 2}, {2, 2, 4, 4, 4, 1, 1, 0, 2}}, 3e-2f},
      // dilated: d = {N, C, H, W, Cout, K, stride, padding, groups, dilation}; taps reach into the
      // padding, and with stride 2 some input pixels are read by no tap
      {"grouped_conv2d_dilated", OpKind::grouped_conv2d,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         auto w = b.parameter("w", {d[4], d[1] / d[8], d[5], d[5]}, no_init());
         return b.grouped_conv2d(x, w, d[6], d[7], d[8], "y", d[9]);
       },
       {{2, 4, 6, 6, 4, 3, 1, 2, 4, 2}, {1, 4, 7, 7, 6, 3, 2, 1, 2, 3}}, 3e-2f},
      // d = {N, C, H, W, gate rank}: a gate of [N, C] or [N, C, 1, 1]
      {"channel_scale", OpKind::channel_scale,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         auto g = b.parameter("g", d[4] == 2 ? Shape{d[0], d[1]} : Shape{d[0], d[1], 1, 1}, no_init());
         return b.channel_scale(x, g, "y");
       },
       {{2, 3, 4, 5, 2}, {1, 4, 3, 3, 4}}},
      {"reshape", OpKind::reshape,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1]}, no_init());
         return b.reshape(x, {d[0] * d[1]}, "y");
       },
       {{2, 3}, {4, 1}}},
      {"sum", OpKind::sum,
       [](Builder& b, const auto& d) { return b.sum(b.parameter("x", Shape(d), no_init()), "y"); },
       {{5}, {2, 3}}},
      {"mean", OpKind::mean,
       [](Builder& b, const auto& d) { return b.mean(b.parameter("x", Shape(d), no_init()), "y"); },
       {{5}, {2, 3}}},
      {"broadcast_scalar", OpKind::broadcast_scalar,
       [](Builder& b, const auto& d) {
         auto s = b.parameter("s", {1}, no_init());
         graph::OpAttrs attrs;
         attrs.shape = d;
         attrs.alpha = 0.5f;
         return b.graph().add_op(OpKind::broadcast_scalar, {s}, attrs, "y", graph::Role::activation,
                                 graph::Phase::forward);
       },
       {{3}, {2, 2}}},
      {"im2col", OpKind::im2col,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         return with_attrs(b, OpKind::im2col, x, window(d[4], d[5], d[6]));
       },
       {{2, 2, 5, 5, 3, 2, 1}, {1, 3, 4, 4, 2, 1, 0}}},
      // d = {N, C, H, W, K, stride, padding, dilation}
      {"im2col_dilated", OpKind::im2col,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         graph::OpAttrs attrs = window(d[4], d[5], d[6]);
         attrs.dilation = d[7];
         return with_attrs(b, OpKind::im2col, x, attrs);
       },
       {{2, 2, 6, 6, 3, 1, 2, 2}, {1, 2, 7, 5, 2, 2, 1, 3}}},
      // d = {N, Cin, H, W, Cout, K, stride, padding}
      {"conv2d", OpKind::conv2d,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         auto w = b.parameter("w", {d[4], d[1], d[5], d[5]}, no_init());
         return b.conv2d(x, w, d[6], d[7], "y");
       },
       {{2, 2, 5, 5, 3, 3, 1, 1}, {1, 3, 6, 6, 2, 3, 2, 1}, {2, 1, 4, 4, 2, 1, 2, 0}}, 3e-2f},
      // d = {N, Cin, H, W, Cout, K, stride, padding, dilation}: DeepLab's (3x3, dilation 2,
      // padding 2: the size kept) and a stride with a dilation of 3
      {"conv2d_dilated", OpKind::conv2d,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         auto w = b.parameter("w", {d[4], d[1], d[5], d[5]}, no_init());
         return b.conv2d(x, w, d[6], d[7], "y", d[8]);
       },
       {{2, 2, 6, 6, 3, 3, 1, 2, 2}, {1, 2, 8, 8, 2, 3, 2, 1, 3}}, 3e-2f},
      {"max_pool2d", OpKind::max_pool2d,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         return b.max_pool2d(x, d[4], d[5], d[6], "y");
       },
       {{2, 2, 4, 4, 2, 2, 0}, {1, 2, 5, 5, 3, 2, 1}}, 2e-2f, false, true},
      {"avg_pool2d", OpKind::avg_pool2d,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         return b.avg_pool2d(x, d[4], d[5], "y");
       },
       {{2, 2, 4, 4, 2, 2}, {1, 1, 5, 5, 3, 1}}},
      {"global_avg_pool", OpKind::global_avg_pool,
       [](Builder& b, const auto& d) {
         return b.global_avg_pool(b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init()), "y");
       },
       {{2, 3, 2, 2}, {1, 1, 3, 1}}},
      {"batch_norm", OpKind::batch_norm,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", Shape(d), no_init());
         auto gamma = b.parameter("gamma", {d[1]}, no_init());
         auto beta = b.parameter("beta", {d[1]}, no_init());
         auto mean = b.buffer("running_mean", {d[1]}, {graph::InitSpec::Kind::zeros, 0.0f});
         auto var = b.buffer("running_var", {d[1]}, {graph::InitSpec::Kind::ones, 0.0f});
         return b.batch_norm(x, gamma, beta, mean, var, /*training=*/true, "y");
       },
       {{3, 2, 2, 2}, {4, 3}}, 5e-2f},
      {"layer_norm", OpKind::layer_norm,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", Shape(d), no_init());
         auto gamma = b.parameter("gamma", {d.back()}, no_init());
         auto beta = b.parameter("beta", {d.back()}, no_init());
         return b.layer_norm(x, gamma, beta, "y");
       },
       {{3, 5}, {2, 2, 4}}, 5e-2f},
      {"embedding", OpKind::embedding,
       [](Builder& b, const auto& d) {
         auto ids = b.input("ids", {d[0]}, graph::DType::i32);
         auto table = b.parameter("table", {d[1], d[2]}, no_init());
         return b.embedding(ids, table, "y");  // 5 ids over 3 rows: repeats accumulate
       },
       {{5, 3, 4}, {2, 6, 1}}},
      {"batched_matmul", OpKind::batched_matmul,
       [](Builder& b, const auto& d) { return batched(b, d, false, false); }, {{2, 3, 4, 5}, {1, 1, 2, 1}}},
      {"batched_matmul_trans_a", OpKind::batched_matmul,
       [](Builder& b, const auto& d) { return batched(b, d, true, false); }, {{2, 3, 4, 2}}},
      {"batched_matmul_trans_b", OpKind::batched_matmul,
       [](Builder& b, const auto& d) { return batched(b, d, false, true); }, {{3, 2, 4, 3}}},
      {"batched_matmul_trans_both", OpKind::batched_matmul,
       [](Builder& b, const auto& d) { return batched(b, d, true, true); }, {{2, 2, 3, 4}}},
      {"batched_matmul_rank4", OpKind::batched_matmul,
       [](Builder& b, const auto& d) {
         auto q = b.parameter("q", {d[0], d[1], d[2], d[3]}, no_init());
         auto k = b.parameter("k", {d[0], d[1], d[2], d[3]}, no_init());
         return b.batched_matmul(q, k, false, true, "y");  // attention scores [B, H, T, T]
       },
       {{2, 2, 3, 2}}},
      {"softmax", OpKind::softmax,
       [](Builder& b, const auto& d) { return b.softmax(b.parameter("x", Shape(d), no_init()), false, "y"); },
       {{3, 5}, {2, 1, 4}}},
      {"softmax_causal", OpKind::softmax,
       [](Builder& b, const auto& d) { return b.softmax(b.parameter("x", Shape(d), no_init()), true, "y"); },
       {{2, 3, 3}, {1, 2, 4, 4}}},
      {"permute", OpKind::permute,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init());
         return b.permute(x, {d[4], d[5], d[6], d[7]}, "y");
       },
       {{2, 3, 4, 1, 0, 2, 1, 3}, {2, 3, 2, 2, 3, 0, 2, 1}}},
      {"rms_norm", OpKind::rms_norm,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", Shape(d), no_init());
         auto gamma = b.parameter("gamma", {d.back()}, no_init());
         return b.rms_norm(x, gamma, "y");
       },
       {{3, 5}, {2, 2, 4}}, 5e-2f},
      {"silu", OpKind::silu,
       [](Builder& b, const auto& d) { return b.silu(b.parameter("x", Shape(d), no_init()), "y"); },
       {{7}, {3, 4}}},
      {"swiglu", OpKind::swiglu,
       [](Builder& b, const auto& d) {
         return b.swiglu(b.parameter("gate", Shape(d), no_init()), b.parameter("up", Shape(d), no_init()), "y");
       },
       {{7}, {3, 4}}},
      {"swiglu_same_operand_twice", OpKind::swiglu,
       [](Builder& b, const auto& d) {
         auto x = b.parameter("x", Shape(d), no_init());
         return b.swiglu(x, x, "y");  // both gradient paths accumulate into x
       },
       {{5}}},
      {"rotary", OpKind::rotary,
       [](Builder& b, const auto& d) { return b.rotary(b.parameter("x", Shape(d), no_init()), 10.0f, "y"); },
       {{2, 3, 4}, {1, 2, 5, 6}}},
      {"repeat_heads", OpKind::repeat_heads,
       [](Builder& b, const auto& d) {
         return b.repeat_heads(b.parameter("x", {d[0], d[1], d[2], d[3]}, no_init()), d[4], "y");
       },
       {{2, 2, 3, 2, 3}, {1, 1, 2, 2, 2}}},
      {"concat", OpKind::concat,
       [](Builder& b, const auto& d) {
         // d = {outer, extent of a, extent of b, inner}
         auto a = b.parameter("a", {d[0], d[1], d[3]}, no_init());
         auto c = b.parameter("c", {d[0], d[2], d[3]}, no_init());
         return b.concat(a, c, 1, "y");
       },
       {{2, 1, 3, 2}, {3, 2, 2, 1}}},
      {"slice", OpKind::slice,
       [](Builder& b, const auto& d) {
         // d = {outer, extent, inner, start, length}
         auto x = b.parameter("x", {d[0], d[1], d[2]}, no_init());
         return b.slice(x, 1, d[3], d[4], "y");
       },
       {{2, 4, 3, 0, 1}, {2, 5, 2, 1, 3}, {1, 3, 2, 1, 2}}},
      // d = {B, H, KH, T, D, causal}: grouped-query when KH < H; T = 66 spans two key tiles
      {"attention", OpKind::attention,
       [](Builder& b, const auto& d) {
         auto q = b.parameter("q", {d[0], d[1], d[3], d[4]}, no_init());
         auto k = b.parameter("k", {d[0], d[2], d[3], d[4]}, no_init());
         auto v = b.parameter("v", {d[0], d[2], d[3], d[4]}, no_init());
         return b.attention(q, k, v, d[5] != 0, 0.7f, 0.0f, "y");
       },
       {{2, 2, 2, 5, 3, 1}, {1, 2, 2, 4, 3, 0}, {1, 4, 2, 5, 2, 1}, {2, 3, 1, 3, 2, 0}, {1, 1, 1, 66, 2, 1}}},
      {"softmax_cross_entropy", OpKind::softmax_cross_entropy,
       [](Builder& b, const auto& d) {
         auto logits = b.parameter("logits", {d[0], d[1]}, no_init());
         auto labels = b.input("labels", {d[0]}, graph::DType::i32);
         return b.cross_entropy(logits, labels, "loss");
       },
       {{1, 2}, {4, 5}, {6, 3}}},
  };
  return kCases;
}

struct Param {
  std::size_t case_index;
  std::size_t dims_index;
};

class GradCheck : public ::testing::TestWithParam<Param> {};

TEST_P(GradCheck, BackwardMatchesCentralFiniteDifferences) {
  const GradCase& c = cases()[GetParam().case_index];
  const auto& dims = c.dim_sets[GetParam().dims_index];
  ASSERT_TRUE(graph::has_gradient_rule(c.kind)) << c.name;

  graph::Graph g;
  Builder b(g);
  const TensorId y = c.build(b, dims);
  const TensorId weights = b.input("R", g.tensor(y).shape);
  g.loss = b.sum(b.mul(y, weights, "yR"), "loss");
  graph::append_backward(g, g.loss);
  for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);

  testing::CpuRun run(g);
  run.executor.initialize_persistent(1);  // non-parameter state (running statistics)
  std::uint64_t seed = 17;
  for (TensorId p : g.parameters()) {
    auto values = testing::random_values(static_cast<std::size_t>(g.tensor(p).shape.numel()), seed++);
    if (c.away_from_zero) {
      for (float& v : values) v = v >= 0 ? v + 0.2f : v - 0.2f;
    }
    if (c.distinct) {  // a scrambled ramp: no two values within 0.1 (37 is prime to every size used)
      const auto n = static_cast<std::int64_t>(values.size());
      for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = 0.1f * float((i * 37) % n - n / 2);
    }
    run.executor.write_tensor(p, values.data());
  }
  const auto r = testing::random_values(static_cast<std::size_t>(g.tensor(weights).shape.numel()), 99);
  run.executor.set_input(weights, r.data(), g.tensor(weights).size_bytes());
  // Integer inputs (labels, token ids) take values below id_range, or below the class count.
  const auto id_range = static_cast<std::size_t>(c.id_range > 0 ? c.id_range : dims.size() > 1 ? dims[1] : 1);
  for (TensorId id : g.tensors_with_role(graph::Role::input)) {
    if (g.tensor(id).dtype != graph::DType::i32) continue;
    std::vector<std::int32_t> l(static_cast<std::size_t>(g.tensor(id).shape.numel()));
    for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<std::int32_t>((i * 7 + 1) % id_range);
    run.executor.set_input(id, l.data(), static_cast<Bytes>(l.size() * 4));
  }

  auto loss_now = [&] {
    EXPECT_TRUE(run.executor.run_step().ok());
    return double(run.executor.read_scalar(g.loss));
  };
  loss_now();
  std::vector<std::vector<float>> analytic;
  for (TensorId p : g.parameters()) analytic.push_back(testing::read_floats(run.executor, g.tensor(p).grad));

  constexpr float h = 1e-2f;
  std::size_t param_index = 0;
  for (TensorId p : g.parameters()) {
    auto values = testing::read_floats(run.executor, p);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float original = values[i];
      values[i] = original + h;
      run.executor.write_tensor(p, values.data());
      const double up = loss_now();
      values[i] = original - h;
      run.executor.write_tensor(p, values.data());
      const double down = loss_now();
      values[i] = original;
      run.executor.write_tensor(p, values.data());
      const double numeric = (up - down) / (2.0 * h);
      const double got = analytic[param_index][i];
      EXPECT_NEAR(got, numeric, c.tolerance * (1.0 + std::abs(numeric)))
          << c.name << ": d loss / d " << g.tensor(p).name << "[" << i << "]";
    }
    ++param_index;
  }
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (std::size_t c = 0; c < cases().size(); ++c) {
    for (std::size_t d = 0; d < cases()[c].dim_sets.size(); ++d) out.push_back({c, d});
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::string name = cases()[info.param.case_index].name;
  for (std::int64_t d : cases()[info.param.case_index].dim_sets[info.param.dims_index]) {
    name += "_" + std::to_string(d);
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryOp, GradCheck, ::testing::ValuesIn(all_params()), param_name);

// Every op kind that can sit on a path from parameters to the loss has a rule here; this keeps
// the table above honest when an op is added.
TEST(GradCheckCoverage, EveryForwardOpWithARuleHasACase) {
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (!graph::has_gradient_rule(kind)) continue;
    bool covered = false;
    for (const GradCase& c : cases()) covered = covered || c.kind == kind;
    EXPECT_TRUE(covered) << "op '" << graph::op_name(kind) << "' has a gradient rule but no gradient check";
  }
}

}  // namespace
}  // namespace memplan
