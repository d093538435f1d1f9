// Reductions to a scalar and the losses, with their gradients.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <string>

#include "memplan/graph/fusions.h"
#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

OutputSpec infer_reduce_all(Inputs in, const OpAttrs&) {
  expect_float("reduction", *in[0]);
  return {Shape{}, DType::f32};
}

OutputSpec infer_softmax_xent(Inputs in, const OpAttrs&) {
  const TensorDesc& logits = *in[0];
  const TensorDesc& labels = *in[1];
  expect_float("softmax_cross_entropy", logits);
  if (logits.shape.rank() != 2) fail("softmax_cross_entropy", "logits must be [batch, classes]");
  if (labels.dtype != DType::i32 || labels.shape != Shape{logits.shape[0]}) {
    fail("softmax_cross_entropy", "labels '" + labels.name + "' must be i32 [" +
                                      std::to_string(logits.shape[0]) + "], got " +
                                      std::string(dtype_name(labels.dtype)) + " " +
                                      labels.shape.to_string());
  }
  return {Shape{}, DType::f32};
}

OutputSpec infer_reduce_rows(Inputs in, const OpAttrs&) {
  expect_float("reduce_rows", *in[0]);
  if (in[0]->shape.rank() < 1) fail("reduce_rows", "input must have at least one dimension");
  return {Shape{in[0]->shape.cols()}, in[0]->dtype};
}

OutputSpec infer_softmax_xent_backward(Inputs in, const OpAttrs&) {
  return {in[1]->shape, in[1]->dtype};
}

double flops_softmax_xent(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[0]); }

double flops_softmax_xent_backward(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[1]); }

void grad_reduce_all(GradContext& c, const Op& op, TensorId dy, float alpha) {
  OpAttrs attrs;
  attrs.shape = c.tensor(op.inputs[0]).shape.dims;
  attrs.alpha = alpha;
  attrs.dtype = c.tensor(op.inputs[0]).dtype;
  c.accumulate(op.inputs[0], c.emit(OpKind::broadcast_scalar, {dy}, attrs, c.gname(op.inputs[0])));
}

void grad_sum(GradContext& c, const Op& op, TensorId dy) { grad_reduce_all(c, op, dy, 1.0f); }

void grad_mean(GradContext& c, const Op& op, TensorId dy) {
  grad_reduce_all(c, op, dy, 1.0f / static_cast<float>(c.tensor(op.inputs[0]).shape.numel()));
}

void grad_softmax_cross_entropy(GradContext& c, const Op& op, TensorId dy) {
  const TensorId logits = op.inputs[0], labels = op.inputs[1];
  c.accumulate(logits, c.emit(OpKind::softmax_cross_entropy_backward, {dy, logits, labels}, {},
                              c.gname(logits)));
}

// The fused projection and cross-entropy (graph/fusions.h): h [N, C], w [V, C] of one floating
// dtype, labels i32 [N], chunk_rows 0 or a whole number of kLossRowBlock blocks.
void expect_linear_xent_operands(std::string_view op, const TensorDesc& h, const TensorDesc& w, const OpAttrs& attrs) {
  expect_float(op, h);
  expect_rank(op, h, 2);
  expect_rank(op, w, 2);
  expect_same_dtype(op, h, w);
  if (w.shape[1] != h.shape[1]) {
    fail(op, "weight '" + w.name + "' " + w.shape.to_string() + " must have the " + str(h.shape[1]) + " columns of '" +
                 h.name + "' " + h.shape.to_string());
  }
  if (attrs.chunk_rows < 0 || attrs.chunk_rows % kLossRowBlock != 0) {
    fail(op, "chunk_rows must be 0 (every row) or a multiple of " + str(kLossRowBlock) + ", got " + str(attrs.chunk_rows));
  }
}

void expect_rows_of(std::string_view op, const TensorDesc& h, const TensorDesc& t, DType dtype) {
  if (t.dtype != dtype || t.shape != Shape{h.shape[0]}) {
    fail(op, "'" + t.name + "' must be " + std::string(dtype_name(dtype)) + " [" + str(h.shape[0]) + "], got " +
                 std::string(dtype_name(t.dtype)) + " " + t.shape.to_string());
  }
}

OutputSpec infer_linear_xent_lse(Inputs in, const OpAttrs& attrs) {
  expect_linear_xent_operands("linear_cross_entropy_lse", *in[0], *in[1], attrs);
  return {Shape{in[0]->shape[0]}, DType::f32};
}

OutputSpec infer_linear_xent(Inputs in, const OpAttrs& attrs) {
  expect_linear_xent_operands("linear_cross_entropy", *in[0], *in[1], attrs);
  expect_rows_of("linear_cross_entropy", *in[0], *in[2], DType::i32);
  expect_rows_of("linear_cross_entropy", *in[0], *in[3], DType::f32);
  return {Shape{}, DType::f32};
}

OutputSpec infer_linear_xent_backward(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& h = *in[1];
  expect_linear_xent_operands("linear_cross_entropy_backward", h, *in[2], attrs);
  if (in[0]->shape.numel() != 1) fail("linear_cross_entropy_backward", "dloss must be a scalar");
  expect_rows_of("linear_cross_entropy_backward", h, *in[3], DType::i32);
  expect_rows_of("linear_cross_entropy_backward", h, *in[4], DType::f32);
  return {Shape{h.shape[0] + in[2]->shape[0], h.shape[1]}, h.dtype};
}

// N x V x C multiply-adds per pass over the logits; exp and the sums per logit.
double logits_flops(Inputs in, int passes) {
  const double n = double(in[0]->shape[0]), c = double(in[0]->shape[1]), v = double(in[1]->shape[0]);
  return passes * 2.0 * n * v * c + 3.0 * n * v;
}
double flops_linear_xent_lse(Inputs in, const TensorDesc*) { return logits_flops(in, 1); }
double flops_linear_xent(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[0]); }
// The logits recomputed, then the products for dh and dw.
double flops_linear_xent_backward(Inputs in, const TensorDesc*) { return logits_flops(in.subspan(1), 3); }

std::int64_t scratch_linear_xent(Inputs in, const OpAttrs& attrs) {
  return loss_chunk_scratch_bytes(in[0]->shape[0], in[1]->shape[0], attrs.chunk_rows);
}
std::int64_t scratch_linear_xent_backward(Inputs in, const OpAttrs& attrs) {
  return loss_chunk_scratch_bytes(in[1]->shape[0], in[2]->shape[0], attrs.chunk_rows);
}

// dh and dw in one op (the logits are recomputed once for both), taken apart by two slices.
void grad_linear_cross_entropy(GradContext& c, const Op& op, TensorId dy) {
  const TensorId h = op.inputs[0], w = op.inputs[1], labels = op.inputs[2], lse = op.inputs[3];
  const std::int64_t rows = c.tensor(h).shape[0], vocab = c.tensor(w).shape[0];
  const TensorId both = c.emit(OpKind::linear_cross_entropy_backward, {dy, h, w, labels, lse}, op.attrs,
                               c.gname(op.outputs[0]) + ".hw");
  if (c.needs_grad(h)) c.accumulate(h, c.emit(OpKind::slice, {both}, slice_attrs(0, 0, rows), c.gname(h)));
  if (c.needs_grad(w)) c.accumulate(w, c.emit(OpKind::slice, {both}, slice_attrs(0, rows, vocab), c.gname(w)));
}

// clang-format off
constexpr OpInfo kLossesRows[] = {
  {.kind = OpKind::sum, .name = "sum", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_reduce_all, .flops = flops_per_input, .grad = grad_sum},
  {.kind = OpKind::mean, .name = "mean", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_reduce_all, .flops = flops_per_input, .grad = grad_mean},
  {.kind = OpKind::softmax_cross_entropy, .name = "softmax_cross_entropy", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_softmax_xent, .flops = flops_softmax_xent, .grad = grad_softmax_cross_entropy},
  {.kind = OpKind::reduce_rows, .name = "reduce_rows", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_reduce_rows, .flops = flops_per_input, .split_rows = true, .row_inputs = 0b1, .sums_rows = true},
  {.kind = OpKind::softmax_cross_entropy_backward, .name = "softmax_cross_entropy_backward", .num_inputs = 3, .num_updates = 0, .num_outputs = 1,
    .infer = infer_softmax_xent_backward, .flops = flops_softmax_xent_backward, .split_rows = true, .row_inputs = 0b110},
  {.kind = OpKind::linear_cross_entropy_lse, .name = "linear_cross_entropy_lse", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_linear_xent_lse, .flops = flops_linear_xent_lse, .scratch = scratch_linear_xent},
  {.kind = OpKind::linear_cross_entropy, .name = "linear_cross_entropy", .num_inputs = 4, .num_updates = 0, .num_outputs = 1,
    .infer = infer_linear_xent, .flops = flops_linear_xent, .grad = grad_linear_cross_entropy},
  {.kind = OpKind::linear_cross_entropy_backward, .name = "linear_cross_entropy_backward", .num_inputs = 5, .num_updates = 0,
    .num_outputs = 1, .infer = infer_linear_xent_backward, .flops = flops_linear_xent_backward, .scratch = scratch_linear_xent_backward},
};
// clang-format on

}  // namespace

std::span<const OpInfo> losses_rows() { return kLossesRows; }

}  // namespace memplan::graph
