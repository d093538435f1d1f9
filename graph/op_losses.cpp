// Reductions to a scalar and the losses, with their gradients.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <string>

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
};
// clang-format on

}  // namespace

std::span<const OpInfo> losses_rows() { return kLossesRows; }

}  // namespace memplan::graph
