// Tensor parallelism's ops (graph/tensor_parallel.h): the identity whose gradient is summed over
// the tensor-parallel ranks, and the cross-entropy over a vocabulary split between them.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, gradient rule.
#include <cstdint>
#include <string>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

std::int64_t tensor_world(std::string_view op, const OpAttrs& attrs) {
  if (attrs.world < 1) fail(op, "the number of tensor-parallel ranks must be at least 1, got " + str(attrs.world));
  if (attrs.group != RankGroup::tensor) fail(op, "runs over the tensor-parallel ranks (attrs.group tensor)");
  return attrs.world;
}

OutputSpec infer_tp_copy(Inputs in, const OpAttrs& attrs) {
  tensor_world("tp_copy", attrs);
  expect_float("tp_copy", *in[0]);
  return {in[0]->shape, in[0]->dtype};
}

// Megatron's f: the same input on every rank feeds each rank's slice of a column-parallel layer,
// so the input's gradient is the sum of the slices' (an all-reduce over the tensor-parallel
// ranks, in place on the gradient; it is this op's alone: the gradient of a tp_copy output
// reaches it through the layers' own backward ops, never shared with another branch).
void grad_tp_copy(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs attrs;
  attrs.world = op.attrs.world;
  attrs.group = RankGroup::tensor;
  c.accumulate(op.inputs[0], c.emit(OpKind::all_reduce, {dy}, attrs, c.gname(op.inputs[0]) + ".over_tp"));
}

// Logits [N, Vr] holding vocabulary columns [start, start + Vr), of which the first `length` are
// real (the rest pad the vocabulary to a multiple of the ranks); labels [N] i32.
void expect_vocab_slice(std::string_view op, const TensorDesc& logits, const TensorDesc& labels, const OpAttrs& attrs) {
  tensor_world(op, attrs);
  expect_float(op, logits);
  expect_rank(op, logits, 2);
  if (labels.dtype != DType::i32 || labels.shape != Shape{logits.shape[0]}) {
    fail(op, "labels '" + labels.name + "' must be i32 [" + str(logits.shape[0]) + "], got " +
                 std::string(dtype_name(labels.dtype)) + " " + labels.shape.to_string());
  }
  if (attrs.start < 0 || attrs.length < 0 || attrs.length > logits.shape[1]) {
    fail(op, "the vocabulary slice [" + str(attrs.start) + ", +" + str(attrs.length) + ") does not fit the " +
                 str(logits.shape[1]) + " columns of '" + logits.name + "'");
  }
}

OutputSpec infer_vocab_stats(Inputs in, const OpAttrs& attrs) {
  expect_vocab_slice("vocab_parallel_stats", *in[0], *in[1], attrs);
  return {Shape{in[0]->shape[0], 2}, DType::f32};
}

OutputSpec infer_vocab_loss(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = tensor_world("vocab_parallel_loss", attrs);
  expect_vocab_slice("vocab_parallel_loss", *in[1], *in[2], attrs);
  const TensorDesc& gathered = *in[0];
  if (gathered.dtype != DType::f32 || gathered.shape != Shape{world, in[1]->shape[0], 2}) {
    fail("vocab_parallel_loss", "the gathered statistics '" + gathered.name + "' must be f32 [" + str(world) + ", " +
                                    str(in[1]->shape[0]) + ", 2], got " + gathered.shape.to_string());
  }
  return {Shape{}, DType::f32};
}

OutputSpec infer_vocab_backward(Inputs in, const OpAttrs& attrs) {
  expect_vocab_slice("vocab_parallel_cross_entropy_backward", *in[1], *in[2], attrs);
  return {in[1]->shape, in[1]->dtype};
}

double flops_vocab_stats(Inputs in, const TensorDesc*) { return 3.0 * numel_of(in[0]); }
double flops_vocab_loss(Inputs in, const TensorDesc*) { return 3.0 * numel_of(in[0]); }
double flops_vocab_backward(Inputs in, const TensorDesc*) { return 3.0 * numel_of(in[1]); }

// The loss reads every rank's statistics; its gradient goes to this rank's logits directly (the
// statistics carry none: the softmax they summarise is recomputed from the logits).
void grad_vocab_loss(GradContext& c, const Op& op, TensorId dy) {
  const TensorId gathered = op.inputs[0], logits = op.inputs[1], labels = op.inputs[2];
  c.accumulate(logits, c.emit(OpKind::vocab_parallel_cross_entropy_backward, {dy, logits, labels, gathered}, op.attrs,
                              c.gname(logits)));
}

// clang-format off
constexpr OpInfo kTensorParallelRows[] = {
  {.kind = OpKind::tp_copy, .name = "tp_copy", .num_inputs = 1, .num_updates = 0, .num_outputs = 1, .output_is_view = true,
    .infer = infer_tp_copy, .flops = flops_zero, .grad = grad_tp_copy, .pure_view = true},
  {.kind = OpKind::vocab_parallel_stats, .name = "vocab_parallel_stats", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_vocab_stats, .flops = flops_vocab_stats, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::vocab_parallel_loss, .name = "vocab_parallel_loss", .num_inputs = 3, .num_updates = 0, .num_outputs = 1,
    .infer = infer_vocab_loss, .flops = flops_vocab_loss, .grad = grad_vocab_loss},
  // Split by rows of the logits: the gathered statistics are read whole (KernelCall::first_row).
  {.kind = OpKind::vocab_parallel_cross_entropy_backward, .name = "vocab_parallel_cross_entropy_backward", .num_inputs = 4,
    .num_updates = 0, .num_outputs = 1, .infer = infer_vocab_backward, .flops = flops_vocab_backward,
    .split_rows = true, .row_inputs = 0b0110},
};
// clang-format on

}  // namespace

std::span<const OpInfo> tensor_parallel_rows() { return kTensorParallelRows; }

}  // namespace memplan::graph
