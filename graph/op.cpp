#include "graph/op.h"

#include <array>
#include <sstream>

#include "common/check.h"

namespace memplan::graph {
namespace {

using Inputs = std::span<const TensorDesc* const>;

[[noreturn]] void fail(std::string_view op, const std::string& what) {
  throw GraphError(std::string(op) + ": " + what);
}

void expect_f32(std::string_view op, const TensorDesc& t) {
  if (t.dtype != DType::f32) {
    fail(op, "'" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) + ", expected f32");
  }
}

void expect_same_shape(std::string_view op, const TensorDesc& a, const TensorDesc& b) {
  if (a.shape != b.shape) {
    fail(op, "'" + a.name + "' " + a.shape.to_string() + " and '" + b.name + "' " +
                 b.shape.to_string() + " must have the same shape");
  }
}

Shape shape_from_attrs(std::string_view op, const OpAttrs& attrs) {
  for (std::int64_t d : attrs.shape) {
    if (d <= 0) fail(op, "every dimension of the target shape must be positive");
  }
  return Shape(attrs.shape);
}

// --- shape inference --------------------------------------------------------------------

OutputSpec infer_matmul(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& a = *in[0];
  const TensorDesc& b = *in[1];
  expect_f32("matmul", a);
  expect_f32("matmul", b);
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
  return {Shape{m, n}, DType::f32};
}

OutputSpec infer_bias_add(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  const TensorDesc& b = *in[1];
  expect_f32("bias_add", x);
  expect_f32("bias_add", b);
  if (b.shape.rank() != 1 || x.shape.rank() < 1 || b.shape[0] != x.shape.cols()) {
    fail("bias_add", "bias '" + b.name + "' " + b.shape.to_string() +
                         " must be 1-D with the last dimension of '" + x.name + "' " +
                         x.shape.to_string());
  }
  return {x.shape, DType::f32};
}

OutputSpec infer_binary_same(Inputs in, const OpAttrs&) {
  expect_f32("elementwise", *in[0]);
  expect_same_shape("elementwise", *in[0], *in[1]);
  return {in[0]->shape, DType::f32};
}

OutputSpec infer_unary(Inputs in, const OpAttrs&) {
  expect_f32("elementwise", *in[0]);
  return {in[0]->shape, DType::f32};
}

OutputSpec infer_reshape(Inputs in, const OpAttrs& attrs) {
  Shape target = shape_from_attrs("reshape", attrs);
  if (target.numel() != in[0]->shape.numel()) {
    fail("reshape", "cannot view '" + in[0]->name + "' " + in[0]->shape.to_string() + " as " +
                        target.to_string() + ": element counts differ");
  }
  return {target, in[0]->dtype};
}

OutputSpec infer_reduce_all(Inputs in, const OpAttrs&) {
  expect_f32("reduction", *in[0]);
  return {Shape{}, DType::f32};
}

OutputSpec infer_softmax_xent(Inputs in, const OpAttrs&) {
  const TensorDesc& logits = *in[0];
  const TensorDesc& labels = *in[1];
  expect_f32("softmax_cross_entropy", logits);
  if (logits.shape.rank() != 2) fail("softmax_cross_entropy", "logits must be [batch, classes]");
  if (labels.dtype != DType::i32 || labels.shape != Shape{logits.shape[0]}) {
    fail("softmax_cross_entropy", "labels '" + labels.name + "' must be i32 [" +
                                      std::to_string(logits.shape[0]) + "], got " +
                                      std::string(dtype_name(labels.dtype)) + " " +
                                      labels.shape.to_string());
  }
  return {Shape{}, DType::f32};
}

OutputSpec infer_backward_like_second(Inputs in, const OpAttrs&) {
  expect_same_shape("backward", *in[0], *in[1]);
  return {in[1]->shape, DType::f32};
}

OutputSpec infer_broadcast_scalar(Inputs in, const OpAttrs& attrs) {
  if (in[0]->shape.numel() != 1) fail("broadcast_scalar", "input must hold one element");
  return {shape_from_attrs("broadcast_scalar", attrs), DType::f32};
}

OutputSpec infer_reduce_rows(Inputs in, const OpAttrs&) {
  expect_f32("reduce_rows", *in[0]);
  if (in[0]->shape.rank() < 1) fail("reduce_rows", "input must have at least one dimension");
  return {Shape{in[0]->shape.cols()}, DType::f32};
}

OutputSpec infer_softmax_xent_backward(Inputs in, const OpAttrs&) {
  return {in[1]->shape, DType::f32};
}

OutputSpec infer_fill(Inputs, const OpAttrs& attrs) {
  return {Shape(attrs.shape), DType::f32};
}

OutputSpec infer_update(Inputs, const OpAttrs&) { return {}; }

// --- FLOPs: multiply-adds count 2; transcendental functions count 1 each -----------------

double numel_of(const TensorDesc* t) { return t ? double(t->shape.numel()) : 0.0; }
double flops_zero(Inputs, const TensorDesc*) { return 0.0; }
double flops_per_output(Inputs, const TensorDesc* out) { return numel_of(out); }
double flops_matmul(Inputs in, const TensorDesc* out) {
  // 2*M*N*K: K is the shared dimension = numel(A) / M.
  const double m = double(out->shape[0]);
  return 2.0 * numel_of(out) * (numel_of(in[0]) / m);
}
double flops_gelu(Inputs, const TensorDesc* out) { return 8.0 * numel_of(out); }
double flops_per_input(Inputs in, const TensorDesc*) { return numel_of(in[0]); }
double flops_softmax_xent(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[0]); }
double flops_softmax_xent_backward(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[1]); }
double flops_sgd(Inputs in, const TensorDesc*) { return 4.0 * numel_of(in[0]); }
double flops_adamw(Inputs in, const TensorDesc*) { return 14.0 * numel_of(in[0]); }

// clang-format off
const std::array<OpInfo, kOpKindCount> kOpTable = {{
  // name                            in upd out view  infer                          flops
  {"matmul",                          2, 0, 1, false, infer_matmul,                  flops_matmul},
  {"bias_add",                        2, 0, 1, false, infer_bias_add,                flops_per_output},
  {"add",                             2, 0, 1, false, infer_binary_same,             flops_per_output},
  {"mul",                             2, 0, 1, false, infer_binary_same,             flops_per_output},
  {"scale",                           1, 0, 1, false, infer_unary,                   flops_per_output},
  {"relu",                            1, 0, 1, false, infer_unary,                   flops_per_output},
  {"gelu",                            1, 0, 1, false, infer_unary,                   flops_gelu},
  {"reshape",                         1, 0, 1, true,  infer_reshape,                 flops_zero},
  {"sum",                             1, 0, 1, false, infer_reduce_all,              flops_per_input},
  {"mean",                            1, 0, 1, false, infer_reduce_all,              flops_per_input},
  {"softmax_cross_entropy",           2, 0, 1, false, infer_softmax_xent,            flops_softmax_xent},
  {"relu_backward",                   2, 0, 1, false, infer_backward_like_second,    flops_per_output},
  {"gelu_backward",                   2, 0, 1, false, infer_backward_like_second,    flops_gelu},
  {"broadcast_scalar",                1, 0, 1, false, infer_broadcast_scalar,        flops_per_output},
  {"reduce_rows",                     1, 0, 1, false, infer_reduce_rows,             flops_per_input},
  {"softmax_cross_entropy_backward",  3, 0, 1, false, infer_softmax_xent_backward,   flops_softmax_xent_backward},
  {"fill",                            0, 0, 1, false, infer_fill,                    flops_zero},
  {"sgd_update",                      1, 1, 0, false, infer_update,                  flops_sgd},
  {"sgd_momentum_update",             1, 2, 0, false, infer_update,                  flops_sgd},
  {"adamw_update",                    1, 3, 0, false, infer_update,                  flops_adamw},
}};
// clang-format on

}  // namespace

const OpInfo& op_info(OpKind kind) {
  const int index = static_cast<int>(kind);
  MEMPLAN_CHECK(index >= 0 && index < kOpKindCount, "bad op kind " << index);
  return kOpTable[static_cast<std::size_t>(index)];
}

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::recompute: return "recompute";
  }
  MEMPLAN_CHECK(false, "unknown phase");
}

}  // namespace memplan::graph
