// Matrix products, softmax, rotary embeddings and fused attention (FlashAttention's algorithm), with their gradients.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

OutputSpec infer_matmul(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& a = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("matmul", a);
  expect_float("matmul", b);
  expect_same_dtype("matmul", a, b);
  if (a.shape.rank() != 2 || b.shape.rank() != 2) {
    fail("matmul", "operands must be 2-D, got '" + a.name + "' " + a.shape.to_string() +
                       " and '" + b.name + "' " + b.shape.to_string());
  }
  const std::int64_t m = attrs.trans_a ? a.shape[1] : a.shape[0];
  const std::int64_t ka = attrs.trans_a ? a.shape[0] : a.shape[1];
  const std::int64_t kb = attrs.trans_b ? b.shape[1] : b.shape[0];
  const std::int64_t n = attrs.trans_b ? b.shape[0] : b.shape[1];
  if (ka != kb) {
    std::ostringstream msg;
    msg << "inner dimensions differ: '" << a.name << "' " << a.shape.to_string()
        << (attrs.trans_a ? "^T" : "") << " x '" << b.name << "' " << b.shape.to_string()
        << (attrs.trans_b ? "^T" : "") << " (" << ka << " vs " << kb << ")";
    fail("matmul", msg.str());
  }
  return {Shape{m, n}, a.dtype};
}

OutputSpec infer_batched_matmul(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& a = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("batched_matmul", a);
  expect_float("batched_matmul", b);
  expect_same_dtype("batched_matmul", a, b);
  const int r = a.shape.rank();
  if (r < 3 || b.shape.rank() != r ||
      !std::equal(a.shape.dims.begin(), a.shape.dims.end() - 2, b.shape.dims.begin())) {
    fail("batched_matmul", "operands must have rank >= 3 and equal leading dims, got '" + a.name + "' " +
                               a.shape.to_string() + " and '" + b.name + "' " + b.shape.to_string());
  }
  const std::int64_t m = attrs.trans_a ? a.shape[r - 1] : a.shape[r - 2];
  const std::int64_t ka = attrs.trans_a ? a.shape[r - 2] : a.shape[r - 1];
  const std::int64_t kb = attrs.trans_b ? b.shape[r - 1] : b.shape[r - 2];
  const std::int64_t n = attrs.trans_b ? b.shape[r - 2] : b.shape[r - 1];
  if (ka != kb) {
    fail("batched_matmul", "inner dimensions differ: '" + a.name + "' " + a.shape.to_string() +
                               (attrs.trans_a ? "^T" : "") + " x '" + b.name + "' " + b.shape.to_string() +
                               (attrs.trans_b ? "^T" : ""));
  }
  std::vector<std::int64_t> dims(a.shape.dims.begin(), a.shape.dims.end() - 2);
  dims.push_back(m);
  dims.push_back(n);
  return {Shape(std::move(dims)), a.dtype};
}

OutputSpec infer_softmax(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("softmax", x);
  if (x.shape.rank() < 1) fail("softmax", "input must have at least one dimension");
  if (attrs.causal && (x.shape.rank() < 2 || x.shape[x.shape.rank() - 2] != x.shape.cols())) {
    fail("softmax", "a causal softmax needs [..., T, T], got '" + x.name + "' " + x.shape.to_string());
  }
  return {x.shape, x.dtype};
}

OutputSpec infer_rotary(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("rotary", x);
  if (x.shape.rank() < 2 || x.shape.cols() % 2 != 0) {
    fail("rotary", "'" + x.name + "' " + x.shape.to_string() + " must be [..., T, head_dim] with an even head_dim");
  }
  if (!(attrs.rope_base > 1.0f)) fail("rotary", "rope_base must be > 1");
  if (attrs.rotary_dims < 0 || attrs.rotary_dims % 2 != 0 || attrs.rotary_dims > x.shape.cols()) {
    fail("rotary", "rotary_dims " + std::to_string(attrs.rotary_dims) + " must be even and at most head_dim " +
                       std::to_string(x.shape.cols()) + " (0: all)");
  }
  return {x.shape, x.dtype};
}

// q [B, H, T, D], k and v [B, KH, T, D] with KH dividing H, all of one floating dtype.
void expect_attention_operands(std::string_view op, const TensorDesc& q, const TensorDesc& k, const TensorDesc* v,
                               const OpAttrs& attrs) {
  expect_float(op, q);
  expect_float(op, k);
  expect_same_dtype(op, q, k);
  expect_rank(op, q, 4);
  expect_rank(op, k, 4);
  if (k.shape[0] != q.shape[0] || k.shape[2] != q.shape[2] || k.shape[3] != q.shape[3]) {
    fail(op, "keys '" + k.name + "' " + k.shape.to_string() + " must be [B, KH, T, D] like queries '" + q.name +
                 "' " + q.shape.to_string());
  }
  if (q.shape[1] % k.shape[1] != 0) {
    fail(op, "query heads " + str(q.shape[1]) + " of '" + q.name + "' are not a multiple of the key/value heads " +
                 str(k.shape[1]) + " of '" + k.name + "'");
  }
  if (v != nullptr) {
    expect_same_dtype(op, q, *v);
    expect_same_shape(op, k, *v);
  }
  if (!(attrs.dropout >= 0.0f && attrs.dropout < 1.0f)) fail(op, "dropout must be in [0, 1)");
  if (!(attrs.alpha > 0.0f) || !std::isfinite(attrs.alpha)) fail(op, "the score scale alpha must be positive and finite");
}

Shape rows_of(const TensorDesc& q) { return Shape{q.shape[0], q.shape[1], q.shape[2]}; }

OutputSpec infer_attention_lse(Inputs in, const OpAttrs& attrs) {
  expect_attention_operands("attention_lse", *in[0], *in[1], nullptr, attrs);
  return {rows_of(*in[0]), DType::f32};
}

void expect_row_terms(std::string_view op, const TensorDesc& q, const TensorDesc& t) {
  if (t.dtype != DType::f32 || t.shape != rows_of(q)) {
    fail(op, "'" + t.name + "' must be f32 " + rows_of(q).to_string() + ", got " + std::string(dtype_name(t.dtype)) +
                 " " + t.shape.to_string());
  }
}

OutputSpec infer_attention(Inputs in, const OpAttrs& attrs) {
  expect_attention_operands("attention", *in[0], *in[1], in[2], attrs);
  expect_row_terms("attention", *in[0], *in[3]);
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_attention_backward_dot(Inputs in, const OpAttrs&) {
  expect_same_shape("attention_backward_dot", *in[0], *in[1]);
  expect_rank("attention_backward_dot", *in[1], 4);
  return {rows_of(*in[1]), DType::f32};
}

OutputSpec infer_attention_backward(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& q = *in[1];
  expect_attention_operands("attention_backward", q, *in[2], in[3], attrs);
  expect_same_shape("attention_backward", *in[0], q);
  expect_row_terms("attention_backward", q, *in[4]);
  expect_row_terms("attention_backward", q, *in[5]);
  return {Shape{q.shape[0], q.shape[1] + 2 * in[2]->shape[1], q.shape[2], q.shape[3]}, q.dtype};
}

double flops_matmul(Inputs in, const TensorDesc* out) {
  // 2*M*N*K: K is the shared dimension = numel(A) / M.
  const double m = double(out->shape[0]);
  return 2.0 * numel_of(out) * (numel_of(in[0]) / m);
}

double flops_batched_matmul(Inputs in, const TensorDesc* out) {
  // 2*M*N*K per batch entry: K = numel(A) / (batch * M) and numel(out) = batch * M * N.
  const int r = out->shape.rank();
  const double rows = double(out->shape.numel() / out->shape[r - 1]);  // batch * M
  return 2.0 * numel_of(out) * (numel_of(in[0]) / rows);
}

// Softmax: max, subtract, exp, sum, divide per element; its backward: multiply, sum, subtract, multiply.
double flops_softmax(Inputs, const TensorDesc* out) { return 5.0 * numel_of(out); }

// Attention: per (query, key) pair, 2D for a score and 2D per further product with a [T, D]
// operand, plus a few for the softmax. FLOPs see no attrs, so every pair counts (a causal kernel
// visits about half of them).
double attention_pairs(const TensorDesc& q) {
  return double(q.shape[0]) * double(q.shape[1]) * double(q.shape[2]) * double(q.shape[2]);
}

double flops_attention_lse(Inputs in, const TensorDesc*) {
  return attention_pairs(*in[0]) * (2.0 * double(in[0]->shape[3]) + 3.0);
}

double flops_attention(Inputs in, const TensorDesc*) {
  return attention_pairs(*in[0]) * (4.0 * double(in[0]->shape[3]) + 2.0);
}

double flops_attention_backward(Inputs in, const TensorDesc*) {
  return attention_pairs(*in[1]) * (10.0 * double(in[1]->shape[3]) + 6.0);
}

double flops_4_per_input0(Inputs in, const TensorDesc*) { return 4.0 * numel_of(in[0]); }

double flops_2_per_input0(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[0]); }

OpAttrs transposes(bool a, bool b) {
  OpAttrs attrs;
  attrs.trans_a = a;
  attrs.trans_b = b;
  return attrs;
}

// C = op(A) op(B). Each case writes dA and dB as one matmul with the right transposes so no
// transposed copy is ever materialised.
// Also batched_matmul: the same transposes apply per leading index.
void grad_matmul(GradContext& c, const Op& op, TensorId dy) {
  const OpKind mm = op.kind;
  const TensorId a = op.inputs[0], b = op.inputs[1];
  const bool ta = op.attrs.trans_a, tb = op.attrs.trans_b;
  if (c.needs_grad(a)) {
    TensorId da;
    if (!ta && !tb) da = c.emit(mm, {dy, b}, transposes(false, true), c.gname(a));
    else if (!ta && tb) da = c.emit(mm, {dy, b}, transposes(false, false), c.gname(a));
    else if (ta && !tb) da = c.emit(mm, {b, dy}, transposes(false, true), c.gname(a));
    else da = c.emit(mm, {b, dy}, transposes(true, true), c.gname(a));
    c.accumulate(a, da);
  }
  if (c.needs_grad(b)) {
    TensorId db;
    if (!ta && !tb) db = c.emit(mm, {a, dy}, transposes(true, false), c.gname(b));
    else if (!ta && tb) db = c.emit(mm, {dy, a}, transposes(true, false), c.gname(b));
    else if (ta && !tb) db = c.emit(mm, {a, dy}, transposes(false, false), c.gname(b));
    else db = c.emit(mm, {dy, a}, transposes(true, true), c.gname(b));
    c.accumulate(b, db);
  }
}

void grad_softmax(GradContext& c, const Op& op, TensorId dy) {
  // Masked (causal) positions have y = 0, so the same formula gives them zero gradient.
  c.accumulate(op.inputs[0], c.emit(OpKind::softmax_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

// A rotation's adjoint is the rotation by the negative angle.
void grad_rotary(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs attrs = op.attrs;
  attrs.inverse = !attrs.inverse;
  c.accumulate(op.inputs[0], c.emit(OpKind::rotary, {dy}, attrs, c.gname(op.inputs[0])));
}

// FlashAttention's backward: the rowwise dot(dy, y), then one op recomputing the probabilities
// tile by tile from q, k and the saved log-sum-exp, writing dq, dk and dv side by side along the
// head dim; slices hand each its part. The log-sum-exp gets no gradient of its own: its paths
// through q and k are inside attention_backward (attention_lse has no rule and is never reached).
void grad_attention(GradContext& c, const Op& op, TensorId dy) {
  const TensorId q = op.inputs[0], k = op.inputs[1], v = op.inputs[2], lse = op.inputs[3];
  const std::int64_t heads = c.tensor(q).shape[1], kv_heads = c.tensor(k).shape[1];
  const TensorId delta = c.emit(OpKind::attention_backward_dot, {dy, op.outputs[0]}, {}, c.gname(op.outputs[0]) + ".delta");
  const TensorId dqkv = c.emit(OpKind::attention_backward, {dy, q, k, v, lse, delta}, op.attrs, c.gname(op.outputs[0]) + ".qkv");
  if (c.needs_grad(q)) c.accumulate(q, c.emit(OpKind::slice, {dqkv}, slice_attrs(1, 0, heads), c.gname(q)));
  if (c.needs_grad(k)) c.accumulate(k, c.emit(OpKind::slice, {dqkv}, slice_attrs(1, heads, kv_heads), c.gname(k)));
  if (c.needs_grad(v)) {
    c.accumulate(v, c.emit(OpKind::slice, {dqkv}, slice_attrs(1, heads + kv_heads, kv_heads), c.gname(v)));
  }
}

// T5's relative attention bias: a gather from a [buckets, H] table by the bucket of each (query,
// key) distance, transposed to [H, Tq, Tk] so that it adds onto the scores of every sample.
void check_relative_attrs(std::string_view op, const OpAttrs& attrs) {
  if (attrs.shape.size() != 2 || attrs.shape[0] <= 0 || attrs.shape[1] <= 0) {
    fail(op, "shape must be {Tq, Tk} with positive lengths");
  }
  const std::int64_t half = attrs.bidirectional ? attrs.buckets / 2 : attrs.buckets;
  if (half < 2) fail(op, "needs at least " + std::string(attrs.bidirectional ? "4" : "2") + " buckets, got " + str(attrs.buckets));
  if (attrs.max_distance <= half / 2) {
    fail(op, "max_distance " + str(attrs.max_distance) + " must exceed the " + str(half / 2) + " exact buckets");
  }
}

OutputSpec infer_relative_position_bias(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& table = *in[0];
  expect_float("relative_position_bias", table);
  expect_rank("relative_position_bias", table, 2);
  check_relative_attrs("relative_position_bias", attrs);
  if (table.shape[0] != attrs.buckets) {
    fail("relative_position_bias", "table '" + table.name + "' " + table.shape.to_string() + " must have " +
                                       str(attrs.buckets) + " rows, one per bucket");
  }
  return {Shape{table.shape[1], attrs.shape[0], attrs.shape[1]}, table.dtype};
}

OutputSpec infer_relative_position_bias_backward(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& dy = *in[0];
  expect_float("relative_position_bias_backward", dy);
  expect_rank("relative_position_bias_backward", dy, 3);
  check_relative_attrs("relative_position_bias_backward", attrs);
  if (dy.shape[1] != attrs.shape[0] || dy.shape[2] != attrs.shape[1]) {
    fail("relative_position_bias_backward", "'" + dy.name + "' " + dy.shape.to_string() + " must be [H, " +
                                                str(attrs.shape[0]) + ", " + str(attrs.shape[1]) + "]");
  }
  return {Shape{attrs.buckets, dy.shape[0]}, dy.dtype};
}

void grad_relative_position_bias(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::relative_position_bias_backward, {dy}, op.attrs, c.gname(op.inputs[0])));
}

// Splitting by rows (OpInfo::split_rows_when): a matmul's rows are A's unless A is transposed;
// attention's dropout masks follow absolute positions, so a slice of the batch would draw others.
bool split_when_a_untransposed(const OpAttrs& attrs) { return !attrs.trans_a; }
bool split_without_dropout(const OpAttrs& attrs) { return attrs.dropout == 0.0f; }

// clang-format off
constexpr OpInfo kMatmulAttentionRows[] = {
  {.kind = OpKind::matmul, .name = "matmul", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_matmul, .flops = flops_matmul, .grad = grad_matmul, .split_rows = true, .row_inputs = 0b01, .split_rows_when = split_when_a_untransposed},
  {.kind = OpKind::batched_matmul, .name = "batched_matmul", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_batched_matmul, .flops = flops_batched_matmul, .grad = grad_matmul},
  {.kind = OpKind::softmax, .name = "softmax", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_softmax, .flops = flops_softmax, .grad = grad_softmax, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::rotary, .name = "rotary", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_rotary, .flops = flops_3_per_output, .grad = grad_rotary},
  {.kind = OpKind::attention_lse, .name = "attention_lse", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_attention_lse, .flops = flops_attention_lse, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::attention, .name = "attention", .num_inputs = 4, .num_updates = 0, .num_outputs = 1,
    .infer = infer_attention, .flops = flops_attention, .grad = grad_attention, .split_rows = true, .row_inputs = 0b1111, .split_rows_when = split_without_dropout},
  {.kind = OpKind::relative_position_bias, .name = "relative_position_bias", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_relative_position_bias, .flops = flops_zero, .grad = grad_relative_position_bias},
  {.kind = OpKind::relative_position_bias_backward, .name = "relative_position_bias_backward", .num_inputs = 1, .num_updates = 0,
    .num_outputs = 1, .infer = infer_relative_position_bias_backward, .flops = flops_per_input0},
  {.kind = OpKind::softmax_backward, .name = "softmax_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_backward_like_second, .flops = flops_4_per_input0, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::attention_backward_dot, .name = "attention_backward_dot", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_attention_backward_dot, .flops = flops_2_per_input0, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::attention_backward, .name = "attention_backward", .num_inputs = 6, .num_updates = 0, .num_outputs = 1,
    .infer = infer_attention_backward, .flops = flops_attention_backward, .split_rows = true, .row_inputs = 0b111111, .split_rows_when = split_without_dropout},
};
// clang-format on

}  // namespace

std::span<const OpInfo> matmul_attention_rows() { return kMatmulAttentionRows; }

std::int64_t relative_position_bucket(std::int64_t relative, bool bidirectional, std::int64_t buckets,
                                      std::int64_t max_distance) {
  std::int64_t base = 0, n = 0;
  if (bidirectional) {
    buckets /= 2;
    if (relative > 0) base = buckets;
    n = relative < 0 ? -relative : relative;
  } else {
    n = relative < 0 ? -relative : 0;  // keys after the query share bucket 0
  }
  const std::int64_t exact = buckets / 2;
  if (n < exact) return base + n;
  // transformers' float32 steps: log(n / exact) / log(max_distance / exact) * (buckets - exact),
  // truncated, so that the same distances land in the same buckets as in PyTorch.
  const float ratio = static_cast<float>(n) / static_cast<float>(exact);
  const auto log_range = static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(exact)));
  const float scaled = std::log(ratio) / log_range * static_cast<float>(buckets - exact);
  return base + std::min(exact + static_cast<std::int64_t>(scaled), buckets - 1);
}

}  // namespace memplan::graph
