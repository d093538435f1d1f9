// Elementwise ops and their gradients: activations, sums and products of equal shapes, scaling, fills and dropout masks.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <string>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

OutputSpec infer_bias_add(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("bias_add", x);
  expect_float("bias_add", b);
  if (b.shape.rank() != 1 || x.shape.rank() < 1 || b.shape[0] != x.shape.cols()) {
    fail("bias_add", "bias '" + b.name + "' " + b.shape.to_string() +
                         " must be 1-D with the last dimension of '" + x.name + "' " +
                         x.shape.to_string());
  }
  return {x.shape, x.dtype};
}

OutputSpec infer_binary_same(Inputs in, const OpAttrs&) {
  expect_float("elementwise", *in[0]);
  expect_same_shape("elementwise", *in[0], *in[1]);
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_unary(Inputs in, const OpAttrs&) {
  expect_float("elementwise", *in[0]);
  return {in[0]->shape, in[0]->dtype};
}

// f32 to or from a 16-bit dtype, or a copy at the same dtype (bf16 <-> f16 is two roundings:
// the caller writes it through f32).
OutputSpec infer_cast(Inputs in, const OpAttrs& attrs) {
  expect_float("cast", *in[0]);
  const DType from = in[0]->dtype, to = attrs.dtype;
  if (!is_floating(to)) fail("cast", "to " + std::string(dtype_name(to)) + ": a floating dtype is required");
  if (is_16bit_float(from) && is_16bit_float(to) && from != to) {
    fail("cast", "'" + in[0]->name + "' from " + std::string(dtype_name(from)) + " to " + std::string(dtype_name(to)) +
                     ": cast between 16-bit dtypes through f32");
  }
  return {in[0]->shape, to};
}

OutputSpec infer_broadcast_scalar(Inputs in, const OpAttrs& attrs) {
  if (in[0]->shape.numel() != 1) fail("broadcast_scalar", "input must hold one element");
  return {shape_from_attrs("broadcast_scalar", attrs), attrs.dtype};
}

OutputSpec infer_fill(Inputs, const OpAttrs& attrs) {
  return {Shape(attrs.shape), attrs.dtype};
}

// g's first two dims are x's (N, C), any further dims are 1.
OutputSpec infer_channel_scale(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  const TensorDesc& g = *in[1];
  expect_float("channel_scale", x);
  expect_float("channel_scale", g);
  bool ok = x.shape.rank() >= 2 && g.shape.rank() >= 2 && g.shape.rank() <= x.shape.rank() && g.shape[0] == x.shape[0] &&
            g.shape[1] == x.shape[1];
  for (int i = 2; ok && i < g.shape.rank(); ++i) ok = g.shape[i] == 1;
  if (!ok) {
    fail("channel_scale", "gate '" + g.name + "' " + g.shape.to_string() + " must be [N, C] or [N, C, 1, ...] of '" + x.name +
                              "' " + x.shape.to_string());
  }
  return {x.shape, x.dtype};
}

OutputSpec infer_clip(Inputs in, const OpAttrs& a) {
  expect_float("clip", *in[0]);
  if (!(a.clip_min <= a.clip_max)) fail("clip", "clip_min " + std::to_string(a.clip_min) + " exceeds clip_max " + std::to_string(a.clip_max));
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_dropout_mask(Inputs, const OpAttrs& attrs) {
  if (!(attrs.dropout >= 0.0f && attrs.dropout < 1.0f)) fail("dropout_mask", "p must be in [0, 1)");
  return {shape_from_attrs("dropout_mask", attrs), attrs.dtype};
}

double flops_gelu(Inputs, const TensorDesc* out) { return 8.0 * numel_of(out); }

// SiLU: exp, add, divide, multiply; its derivative 5 (dy * s * (1 + x * (1 - s)) given
// s = sigmoid(x)); swiglu silu's 4 and a multiply.
double flops_5_per_output(Inputs, const TensorDesc* out) { return 5.0 * numel_of(out); }

// Channel scale: one multiply per output element; its gate gradient a multiply-add per element of dy.
double flops_2_per_input(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[0]); }

void grad_bias_add(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], dy);
  if (c.needs_grad(op.inputs[1])) {
    c.accumulate(op.inputs[1], c.emit(OpKind::reduce_rows, {dy}, {}, c.gname(op.inputs[1])));
  }
}

void grad_add(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], dy);
  c.accumulate(op.inputs[1], dy);
}

void grad_mul(GradContext& c, const Op& op, TensorId dy) {
  const TensorId a = op.inputs[0], b = op.inputs[1];
  if (c.needs_grad(a)) c.accumulate(a, c.emit(OpKind::mul, {dy, b}, {}, c.gname(a)));
  if (c.needs_grad(b)) c.accumulate(b, c.emit(OpKind::mul, {dy, a}, {}, c.gname(b)));
}

void grad_scale(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs attrs;
  attrs.alpha = op.attrs.alpha;
  c.accumulate(op.inputs[0], c.emit(OpKind::scale, {dy}, attrs, c.gname(op.inputs[0])));
}

// The gradient comes back at the input's dtype.
void grad_cast(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  if (c.tensor(dy).dtype == c.tensor(x).dtype) return c.accumulate(x, dy);
  OpAttrs attrs;
  attrs.dtype = c.tensor(x).dtype;
  c.accumulate(x, c.emit(OpKind::cast, {dy}, attrs, c.gname(x)));
}

void grad_relu(GradContext& c, const Op& op, TensorId dy) {
  // Uses the output y (y > 0 iff x > 0), so x itself need not stay alive.
  c.accumulate(op.inputs[0],
               c.emit(OpKind::relu_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

void grad_gelu(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0],
               c.emit(OpKind::gelu_backward, {dy, op.inputs[0]}, {}, c.gname(op.inputs[0])));
}

void grad_broadcast_scalar(GradContext& c, const Op& op, TensorId dy) {
  TensorId s = c.emit(OpKind::sum, {dy}, {}, c.gname(op.inputs[0]) + ".sum");
  OpAttrs attrs;
  attrs.alpha = op.attrs.alpha;
  TensorId g = c.emit(OpKind::scale, {s}, attrs, c.gname(op.inputs[0]));
  // A scalar may be stored as [1] or []: view the result with the input's shape.
  if (c.tensor(g).shape != c.tensor(op.inputs[0]).shape) {
    OpAttrs view;
    view.shape = c.tensor(op.inputs[0]).shape.dims;
    g = c.emit(OpKind::reshape, {g}, view, c.gname(op.inputs[0]) + ".view");
  }
  c.accumulate(op.inputs[0], g);
}

// dx is dy scaled by the same gate; the gate's gradient sums dy * x over each (sample, channel).
void grad_channel_scale(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], g = op.inputs[1];
  if (c.needs_grad(g)) {
    c.accumulate(g, c.emit(OpKind::channel_scale_backward, {dy, x}, with_shape(op.attrs, c.tensor(g).shape), c.gname(g)));
  }
  if (c.needs_grad(x)) c.accumulate(x, c.emit(OpKind::channel_scale, {dy, g}, {}, c.gname(x)));
}

// sigmoid' = y (1 - y), tanh' = 1 - y^2: both from the output, so x need not stay alive.
void grad_sigmoid(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::sigmoid_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

void grad_tanh(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::tanh_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

// The gradient passes where x is strictly inside the range (PyTorch's hardtanh_backward).
void grad_clip(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::clip_backward, {dy, op.inputs[0]}, op.attrs, c.gname(op.inputs[0])));
}

void grad_silu(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::silu_backward, {dy, op.inputs[0]}, {}, c.gname(op.inputs[0])));
}

// SwiGLU, the gated MLP's activation (LLaMA, Mistral, Qwen): silu(gate) * up in one pass. The
// gradient reuses silu, mul and silu_backward, recomputing silu(gate) rather than keeping it.
void grad_swiglu(GradContext& c, const Op& op, TensorId dy) {
  const TensorId gate = op.inputs[0], up = op.inputs[1];
  if (c.needs_grad(up)) {
    const TensorId act = c.emit(OpKind::silu, {gate}, {}, c.gname(up) + ".silu", Role::temporary);
    c.accumulate(up, c.emit(OpKind::mul, {dy, act}, {}, c.gname(up)));
  }
  if (c.needs_grad(gate)) {
    const TensorId dact = c.emit(OpKind::mul, {dy, up}, {}, c.gname(gate) + ".act");
    c.accumulate(gate, c.emit(OpKind::silu_backward, {dact, gate}, {}, c.gname(gate)));
  }
}

// clang-format off
constexpr OpInfo kElementwiseRows[] = {
  {.kind = OpKind::bias_add, .name = "bias_add", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_bias_add, .flops = flops_per_output, .in_place_inputs = 0b1, .grad = grad_bias_add, .split_rows = true, .row_inputs = 0b01},
  {.kind = OpKind::add, .name = "add", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_binary_same, .flops = flops_per_output, .in_place_inputs = 0b11, .grad = grad_add, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::mul, .name = "mul", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_binary_same, .flops = flops_per_output, .in_place_inputs = 0b11, .grad = grad_mul, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::scale, .name = "scale", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_unary, .flops = flops_per_output, .in_place_inputs = 0b1, .grad = grad_scale, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::relu, .name = "relu", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_unary, .flops = flops_per_output, .in_place_inputs = 0b1, .grad = grad_relu, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::gelu, .name = "gelu", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_unary, .flops = flops_gelu, .grad = grad_gelu, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::dropout_mask, .name = "dropout_mask", .num_inputs = 0, .num_updates = 0, .num_outputs = 1,
    .infer = infer_dropout_mask, .flops = flops_zero},
  {.kind = OpKind::silu, .name = "silu", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_unary, .flops = flops_4_per_output, .grad = grad_silu, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::sigmoid, .name = "sigmoid", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_unary, .flops = flops_4_per_output, .in_place_inputs = 0b1, .grad = grad_sigmoid, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::tanh, .name = "tanh", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_unary, .flops = flops_4_per_output, .in_place_inputs = 0b1, .grad = grad_tanh, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::clip, .name = "clip", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_clip, .flops = flops_per_output, .in_place_inputs = 0b1, .grad = grad_clip, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::cast, .name = "cast", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_cast, .flops = flops_zero, .grad = grad_cast, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::channel_scale, .name = "channel_scale", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_channel_scale, .flops = flops_per_output, .in_place_inputs = 0b1, .grad = grad_channel_scale, .split_rows = true, .row_inputs = 0b01},
  {.kind = OpKind::swiglu, .name = "swiglu", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_binary_same, .flops = flops_5_per_output, .in_place_inputs = 0b11, .grad = grad_swiglu, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::relu_backward, .name = "relu_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_backward_like_second, .flops = flops_per_output, .in_place_inputs = 0b1, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::gelu_backward, .name = "gelu_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_backward_like_second, .flops = flops_gelu, .in_place_inputs = 0b1, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::broadcast_scalar, .name = "broadcast_scalar", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_broadcast_scalar, .flops = flops_per_output, .grad = grad_broadcast_scalar, .split_rows = true},
  {.kind = OpKind::fill, .name = "fill", .num_inputs = 0, .num_updates = 0, .num_outputs = 1,
    .infer = infer_fill, .flops = flops_zero, .split_rows = true},
  {.kind = OpKind::silu_backward, .name = "silu_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_backward_like_second, .flops = flops_5_per_output, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::sigmoid_backward, .name = "sigmoid_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_backward_like_second, .flops = flops_3_per_output, .in_place_inputs = 0b1, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::tanh_backward, .name = "tanh_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_backward_like_second, .flops = flops_3_per_output, .in_place_inputs = 0b1, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::clip_backward, .name = "clip_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_backward_like_second, .flops = flops_per_output, .in_place_inputs = 0b1, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::channel_scale_backward, .name = "channel_scale_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_shape_attr, .flops = flops_2_per_input},
};
// clang-format on

}  // namespace

std::span<const OpInfo> elementwise_rows() { return kElementwiseRows; }

}  // namespace memplan::graph
