// Normalisation: batch norm (its statistics and running statistics), layer norm and RMSNorm, with their gradients.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <cstdint>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

void expect_channels(std::string_view op, const TensorDesc& x) {
  expect_float(op, x);
  if (x.shape.rank() < 2) fail(op, "'" + x.name + "' " + x.shape.to_string() + " must be [N, C, ...]");
}

void expect_vector(std::string_view op, const TensorDesc& t, std::int64_t n) {
  expect_float(op, t);
  if (t.shape != Shape{n}) fail(op, "'" + t.name + "' " + t.shape.to_string() + " must be [" + str(n) + "]");
}

OutputSpec infer_batch_norm_stats(Inputs in, const OpAttrs&) {
  expect_channels("batch_norm_stats", *in[0]);
  return {Shape{2, in[0]->shape[1]}, DType::f32};
}

// Synchronised batch norm's second pass: the deviation about a mean shared by every rank.
OutputSpec infer_batch_norm_centered_stats(Inputs in, const OpAttrs&) {
  expect_channels("batch_norm_centered_stats", *in[0]);
  const std::int64_t c = in[0]->shape[1];
  if (in[1]->shape != Shape{2, c}) {
    fail("batch_norm_centered_stats", "statistics '" + in[1]->name + "' must be [2, " + str(c) + "]");
  }
  return {Shape{2, c}, DType::f32};
}

OutputSpec infer_batch_norm(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_channels("batch_norm", x);
  const std::int64_t c = x.shape[1];
  if (in[1]->shape != Shape{2, c}) fail("batch_norm", "statistics '" + in[1]->name + "' must be [2, " + str(c) + "]");
  expect_vector("batch_norm", *in[2], c);
  expect_vector("batch_norm", *in[3], c);
  return {x.shape, x.dtype};
}

OutputSpec infer_batch_norm_inference(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_channels("batch_norm_inference", x);
  for (int i = 1; i <= 4; ++i) expect_vector("batch_norm_inference", *in[i], x.shape[1]);
  return {x.shape, x.dtype};
}

OutputSpec infer_layer_norm_stats(Inputs in, const OpAttrs&) {
  expect_float("layer_norm_stats", *in[0]);
  if (in[0]->shape.rank() < 1) fail("layer_norm_stats", "input must have at least one dimension");
  return {Shape{in[0]->shape.rows(), 2}, DType::f32};
}

OutputSpec infer_layer_norm(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_float("layer_norm", x);
  if (x.shape.rank() < 1) fail("layer_norm", "input must have at least one dimension");
  if (in[1]->shape != Shape{x.shape.rows(), 2}) {
    fail("layer_norm", "statistics '" + in[1]->name + "' must be [" + str(x.shape.rows()) + ", 2]");
  }
  expect_vector("layer_norm", *in[2], x.shape.cols());
  expect_vector("layer_norm", *in[3], x.shape.cols());
  return {x.shape, x.dtype};
}

OutputSpec infer_channel_vector(Inputs in, const OpAttrs&) {
  expect_channels("channel reduction", *in[0]);
  return {Shape{in[0]->shape[1]}, in[0]->dtype};
}

OutputSpec infer_last_dim_vector(Inputs in, const OpAttrs&) { return {Shape{in[0]->shape.cols()}, in[0]->dtype}; }

OutputSpec infer_rms_norm(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_float("rms_norm", x);
  if (x.shape.rank() < 1) fail("rms_norm", "input must have at least one dimension");
  expect_vector("rms_norm", *in[1], x.shape.cols());
  return {x.shape, x.dtype};
}

OutputSpec infer_rms_norm_dgamma(Inputs in, const OpAttrs&) { return {Shape{in[1]->shape.cols()}, in[1]->dtype}; }

// Normalisation: statistics 3 per element (sum, centre, square); apply 4 (sub, mul, mul, add);
// the data gradient 6; dgamma 3 (centre, scale, multiply-add).
double flops_3_per_input(Inputs in, const TensorDesc*) { return 3.0 * numel_of(in[0]); }

double flops_6_per_output(Inputs, const TensorDesc* out) { return 6.0 * numel_of(out); }

double flops_running_stats(Inputs in, const TensorDesc*) { return 6.0 * double(in[0]->shape[1]); }

// The statistics input gets no gradient of its own: batch_norm_backward's dx already contains
// the paths through the mean and variance (the statistics op has no rule and is never reached).
void grad_batch_norm(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], stats = op.inputs[1], gamma = op.inputs[2], beta = op.inputs[3];
  const TensorId dgamma = c.emit(OpKind::batch_norm_dgamma, {dy, x, stats}, op.attrs, c.gname(gamma));
  const TensorId dbeta = c.emit(OpKind::channel_sum, {dy}, {}, c.gname(beta));
  if (c.needs_grad(x)) {
    c.accumulate(x, c.emit(OpKind::batch_norm_backward, {dy, x, stats, gamma, dgamma, dbeta}, op.attrs, c.gname(x)));
  }
  c.accumulate(gamma, dgamma);
  c.accumulate(beta, dbeta);
}

// As batch norm: the statistics' contribution is inside layer_norm_backward.
void grad_layer_norm(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], stats = op.inputs[1], gamma = op.inputs[2], beta = op.inputs[3];
  if (c.needs_grad(x)) {
    c.accumulate(x, c.emit(OpKind::layer_norm_backward, {dy, x, stats, gamma}, {}, c.gname(x)));
  }
  if (c.needs_grad(gamma)) c.accumulate(gamma, c.emit(OpKind::layer_norm_dgamma, {dy, x, stats}, {}, c.gname(gamma)));
  if (c.needs_grad(beta)) c.accumulate(beta, c.emit(OpKind::reduce_rows, {dy}, {}, c.gname(beta)));
}

void grad_rms_norm(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], gamma = op.inputs[1];
  if (c.needs_grad(x)) c.accumulate(x, c.emit(OpKind::rms_norm_backward, {dy, x, gamma}, op.attrs, c.gname(x)));
  if (c.needs_grad(gamma)) {
    c.accumulate(gamma, c.emit(OpKind::rms_norm_dgamma, {dy, x}, op.attrs, c.gname(gamma)));
  }
}

// clang-format off
constexpr OpInfo kNormalizationRows[] = {
  {.kind = OpKind::batch_norm_stats, .name = "batch_norm_stats", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_batch_norm_stats, .flops = flops_3_per_input},
  {.kind = OpKind::batch_norm_centered_stats, .name = "batch_norm_centered_stats", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_batch_norm_centered_stats, .flops = flops_3_per_input},
  {.kind = OpKind::batch_norm, .name = "batch_norm", .num_inputs = 4, .num_updates = 0, .num_outputs = 1,
    .infer = infer_batch_norm, .flops = flops_4_per_output, .grad = grad_batch_norm, .split_rows = true, .row_inputs = 0b0001},
  {.kind = OpKind::batch_norm_inference, .name = "batch_norm_inference", .num_inputs = 5, .num_updates = 0, .num_outputs = 1,
    .infer = infer_batch_norm_inference, .flops = flops_4_per_output, .split_rows = true, .row_inputs = 0b00001},
  {.kind = OpKind::running_stats_update, .name = "running_stats_update", .num_inputs = 1, .num_updates = 2, .num_outputs = 0,
    .infer = infer_update, .flops = flops_running_stats},
  {.kind = OpKind::layer_norm_stats, .name = "layer_norm_stats", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_layer_norm_stats, .flops = flops_3_per_input, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::layer_norm, .name = "layer_norm", .num_inputs = 4, .num_updates = 0, .num_outputs = 1,
    .infer = infer_layer_norm, .flops = flops_4_per_output, .grad = grad_layer_norm, .split_rows = true, .row_inputs = 0b0011},
  {.kind = OpKind::rms_norm, .name = "rms_norm", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_rms_norm, .flops = flops_4_per_output, .grad = grad_rms_norm, .split_rows = true, .row_inputs = 0b01},
  {.kind = OpKind::batch_norm_backward, .name = "batch_norm_backward", .num_inputs = 6, .num_updates = 0, .num_outputs = 1,
    .infer = infer_like_second, .flops = flops_6_per_output},
  {.kind = OpKind::batch_norm_dgamma, .name = "batch_norm_dgamma", .num_inputs = 3, .num_updates = 0, .num_outputs = 1,
    .infer = infer_channel_vector, .flops = flops_3_per_input},
  {.kind = OpKind::channel_sum, .name = "channel_sum", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_channel_vector, .flops = flops_per_input},
  {.kind = OpKind::layer_norm_backward, .name = "layer_norm_backward", .num_inputs = 4, .num_updates = 0, .num_outputs = 1,
    .infer = infer_like_second, .flops = flops_6_per_output, .split_rows = true, .row_inputs = 0b0111},
  {.kind = OpKind::layer_norm_dgamma, .name = "layer_norm_dgamma", .num_inputs = 3, .num_updates = 0, .num_outputs = 1,
    .infer = infer_last_dim_vector, .flops = flops_3_per_input},
  {.kind = OpKind::rms_norm_backward, .name = "rms_norm_backward", .num_inputs = 3, .num_updates = 0, .num_outputs = 1,
    .infer = infer_like_second, .flops = flops_6_per_output, .split_rows = true, .row_inputs = 0b011},
  {.kind = OpKind::rms_norm_dgamma, .name = "rms_norm_dgamma", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_rms_norm_dgamma, .flops = flops_3_per_input},
};
// clang-format on

}  // namespace

std::span<const OpInfo> normalization_rows() { return kNormalizationRows; }

}  // namespace memplan::graph
