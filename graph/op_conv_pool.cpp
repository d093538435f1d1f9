// Convolutions (im2col + GEMM, grouped and depthwise) and pooling, with their gradients.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <cstdint>
#include <string>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

// Output extent of a window sweep along one axis (the height's kernel and padding, or the
// width's: graph::kernel_width): the window spans D*(K-1)+1 input positions (D = dilation);
// throws when it does not fit.
std::int64_t window_out(std::string_view op, std::int64_t in, std::int64_t kernel, std::int64_t padding, const OpAttrs& a) {
  if (kernel <= 0 || a.stride <= 0 || padding < 0 || a.dilation <= 0) {
    fail(op, "kernel, stride and dilation must be positive and padding non-negative");
  }
  const std::int64_t span = checked_mul(a.dilation, kernel - 1) + 1;
  if (2 * padding > span) {
    fail(op, "padding " + str(padding) + " is more than half the window " + str(span) +
                 (a.dilation == 1 ? std::string() : " (kernel " + str(kernel) + ", dilation " + str(a.dilation) + ")"));
  }
  const std::int64_t extent = in + 2 * padding - span;
  if (extent < 0) {
    fail(op, "window " + str(span) + (a.dilation == 1 ? std::string() : " (kernel " + str(kernel) + ", dilation " + str(a.dilation) + ")") +
                 " is larger than the padded input " + str(in + 2 * padding));
  }
  return extent / a.stride + 1;
}
std::int64_t rows_out(std::string_view op, std::int64_t in, const OpAttrs& a) { return window_out(op, in, a.kernel, a.padding, a); }
std::int64_t cols_out(std::string_view op, std::int64_t in, const OpAttrs& a) {
  return window_out(op, in, kernel_width(a), padding_width(a), a);
}
// Grouped convolutions and pooling take square windows with one padding.
void expect_square(std::string_view op, const OpAttrs& a) {
  if (kernel_width(a) != a.kernel || padding_width(a) != a.padding) {
    fail(op, "takes square windows (kernel " + str(a.kernel) + "x" + str(kernel_width(a)) + ", padding " + str(a.padding) +
                 "/" + str(padding_width(a)) + ")");
  }
}

OutputSpec infer_im2col(Inputs in, const OpAttrs& a) {
  const TensorDesc& x = *in[0];
  expect_float("im2col", x);
  expect_rank("im2col", x, 4);
  const std::int64_t oh = rows_out("im2col", x.shape[2], a), ow = cols_out("im2col", x.shape[3], a);
  return {Shape{x.shape[0], checked_mul(checked_mul(x.shape[1], a.kernel), kernel_width(a)), checked_mul(oh, ow)}, x.dtype};
}

OutputSpec infer_conv2d(Inputs in, const OpAttrs& a) {
  const TensorDesc& cols = *in[0];
  const TensorDesc& w = *in[1];
  expect_float("conv2d", cols);
  expect_float("conv2d", w);
  expect_rank("conv2d", cols, 3);
  expect_rank("conv2d", w, 4);
  if (w.shape[2] != a.kernel || w.shape[3] != kernel_width(a)) {
    fail("conv2d", "weight '" + w.name + "' " + w.shape.to_string() + " must have a " + str(a.kernel) + "x" +
                       str(kernel_width(a)) + " kernel");
  }
  if (checked_mul(checked_mul(w.shape[1], a.kernel), kernel_width(a)) != cols.shape[1]) {
    fail("conv2d", "weight '" + w.name + "' " + w.shape.to_string() + " expects " + str(w.shape[1]) +
                       " input channels; columns '" + cols.name + "' " + cols.shape.to_string() + " disagree");
  }
  if (a.shape.size() != 2 || checked_mul(a.shape[0], a.shape[1]) != cols.shape[2]) {
    fail("conv2d", "attrs.shape must be {OH, OW} with OH*OW = " + str(cols.shape[2]));
  }
  return {Shape{cols.shape[0], w.shape[0], a.shape[0], a.shape[1]}, cols.dtype};
}

OutputSpec infer_grouped_conv2d(Inputs in, const OpAttrs& a) {
  const TensorDesc& x = *in[0];
  const TensorDesc& w = *in[1];
  expect_float("grouped_conv2d", x);
  expect_float("grouped_conv2d", w);
  expect_rank("grouped_conv2d", x, 4);
  expect_rank("grouped_conv2d", w, 4);
  if (a.groups < 1 || x.shape[1] % a.groups != 0 || w.shape[0] % a.groups != 0) {
    fail("grouped_conv2d", "groups " + str(a.groups) + " must divide the input channels of '" + x.name + "' " +
                               x.shape.to_string() + " and the output channels of '" + w.name + "' " + w.shape.to_string());
  }
  expect_square("grouped_conv2d", a);
  if (w.shape[1] != x.shape[1] / a.groups || w.shape[2] != a.kernel || w.shape[3] != a.kernel) {
    fail("grouped_conv2d", "weight '" + w.name + "' " + w.shape.to_string() + " must be [Cout, " +
                               str(x.shape[1] / a.groups) + ", " + str(a.kernel) + ", " + str(a.kernel) + "]");
  }
  const std::int64_t oh = rows_out("grouped_conv2d", x.shape[2], a), ow = cols_out("grouped_conv2d", x.shape[3], a);
  return {Shape{x.shape[0], w.shape[0], oh, ow}, x.dtype};
}

OutputSpec infer_pool(Inputs in, const OpAttrs& a) {
  const TensorDesc& x = *in[0];
  expect_float("pool", x);
  expect_rank("pool", x, 4);
  if (a.dilation != 1) fail("pool", "dilation " + str(a.dilation) + " is not supported (pooling windows are dense)");
  expect_square("pool", a);
  return {Shape{x.shape[0], x.shape[1], rows_out("pool", x.shape[2], a), cols_out("pool", x.shape[3], a)},
          x.dtype};
}

OutputSpec infer_avg_pool(Inputs in, const OpAttrs& a) {
  if (a.padding != 0) fail("avg_pool2d", "padding is not supported");
  return infer_pool(in, a);
}

OutputSpec infer_global_avg_pool(Inputs in, const OpAttrs&) {
  expect_float("global_avg_pool", *in[0]);
  expect_rank("global_avg_pool", *in[0], 4);
  return {Shape{in[0]->shape[0], in[0]->shape[1]}, in[0]->dtype};
}

OutputSpec infer_conv2d_backward_weight(Inputs in, const OpAttrs& attrs) {
  return {shape_from_attrs("conv2d_backward_weight", attrs), in[0]->dtype};
}

OutputSpec infer_conv2d_backward_cols(Inputs in, const OpAttrs&) {
  const Shape& dy = in[0]->shape;
  const Shape& w = in[1]->shape;
  return {Shape{dy[0], w[1] * w[2] * w[3], dy[2] * dy[3]}, in[0]->dtype};
}

// Convolution as GEMM: 2 * N * Cout * (OH*OW) * (Cin*K*K); each backward GEMM costs the same.
double flops_conv2d(Inputs in, const TensorDesc* out) {
  return 2.0 * numel_of(out) * double(in[0]->shape[1]);  // out [N,Cout,OH,OW], cols [N,CKK,P]
}

double flops_conv2d_backward_weight(Inputs in, const TensorDesc*) {
  return 2.0 * numel_of(in[0]) * double(in[1]->shape[1]);  // dy [N,Cout,OH,OW], cols [N,CKK,P]
}

double flops_conv2d_backward_cols(Inputs in, const TensorDesc*) {
  return 2.0 * numel_of(in[0]) * double(in[1]->shape.numel() / in[1]->shape[0]);  // dy, w [Cout,CKK]
}

// Grouped convolution: 2 * (C/groups * K * K) per output element, and per element of either gradient.
double flops_grouped_conv2d(Inputs in, const TensorDesc* out) {
  return 2.0 * numel_of(out) * double(in[1]->shape.numel() / in[1]->shape[0]);  // w [Cout, C/g, K, K]
}

double flops_grouped_conv2d_backward_input(Inputs in, const TensorDesc*) {
  return 2.0 * numel_of(in[0]) * double(in[1]->shape.numel() / in[1]->shape[0]);  // dy, w
}

double flops_grouped_conv2d_backward_weight(Inputs in, const TensorDesc* out) {
  return 2.0 * numel_of(in[0]) * double(out->shape.numel() / out->shape[0]);  // dy, dw
}

// Pooling: one compare or add per input element (exact when stride == kernel; overlapping
// windows revisit elements); the backward one add per input-gradient element.
double flops_pool_window(Inputs in, const TensorDesc*) { return numel_of(in[0]); }

double flops_pool_backward(Inputs, const TensorDesc* out) { return numel_of(out); }

// im2col's columns are scattered back onto the input (overlapping windows add up).
void grad_im2col(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::col2im, {dy}, with_shape(op.attrs, c.tensor(x).shape), c.gname(x)));
}

// The weight's gradient reads the columns again. Where they are im2col's, they are rebuilt from
// the image here rather than kept from the forward pass: the image is a ninth of 3x3 columns
// (and usually kept anyway), and rebuilding columns costs far less than their trip through
// memory (the CPU fuses each im2col with its product, the columns never leaving the cache).
void grad_conv2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId cols = op.inputs[0], w = op.inputs[1];
  if (c.needs_grad(w)) {
    TensorId cols_again = cols;
    if (const Op* p = c.producer(cols); p != nullptr && p->kind == OpKind::im2col) {
      cols_again = c.emit(OpKind::im2col, {p->inputs[0]}, p->attrs, c.tensor(cols).name + ".again", Role::temporary);
    }
    c.accumulate(w, c.emit(OpKind::conv2d_backward_weight, {dy, cols_again},
                           with_shape(op.attrs, c.tensor(w).shape), c.gname(w)));
  }
  if (c.needs_grad(cols)) c.accumulate(cols, c.emit(OpKind::conv2d_backward_cols, {dy, w}, {}, c.gname(cols)));
}

void grad_grouped_conv2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], w = op.inputs[1];
  if (c.needs_grad(w)) {
    c.accumulate(w, c.emit(OpKind::grouped_conv2d_backward_weight, {dy, x}, with_shape(op.attrs, c.tensor(w).shape),
                           c.gname(w)));
  }
  if (c.needs_grad(x)) {
    c.accumulate(x, c.emit(OpKind::grouped_conv2d_backward_input, {dy, w}, with_shape(op.attrs, c.tensor(x).shape),
                           c.gname(x)));
  }
}

void grad_max_pool2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::max_pool2d_backward, {dy, x}, op.attrs, c.gname(x)));
}

void grad_avg_pool2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::avg_pool2d_backward, {dy}, with_shape(op.attrs, c.tensor(x).shape), c.gname(x)));
}

void grad_global_avg_pool(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::global_avg_pool_backward, {dy}, with_shape({}, c.tensor(x).shape), c.gname(x)));
}

// clang-format off
constexpr OpInfo kConvPoolRows[] = {
  {.kind = OpKind::im2col, .name = "im2col", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_im2col, .flops = flops_zero, .grad = grad_im2col, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::conv2d, .name = "conv2d", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_conv2d, .flops = flops_conv2d, .grad = grad_conv2d, .split_rows = true, .row_inputs = 0b01},
  {.kind = OpKind::max_pool2d, .name = "max_pool2d", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_pool, .flops = flops_pool_window, .grad = grad_max_pool2d, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::avg_pool2d, .name = "avg_pool2d", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_avg_pool, .flops = flops_pool_window, .grad = grad_avg_pool2d, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::global_avg_pool, .name = "global_avg_pool", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_global_avg_pool, .flops = flops_per_input, .grad = grad_global_avg_pool, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::grouped_conv2d, .name = "grouped_conv2d", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_grouped_conv2d, .flops = flops_grouped_conv2d, .grad = grad_grouped_conv2d},
  {.kind = OpKind::conv2d_backward_weight, .name = "conv2d_backward_weight", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_conv2d_backward_weight, .flops = flops_conv2d_backward_weight, .split_rows = true, .row_inputs = 0b11,
    .sums_rows = true},
  {.kind = OpKind::conv2d_backward_cols, .name = "conv2d_backward_cols", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_conv2d_backward_cols, .flops = flops_conv2d_backward_cols, .split_rows = true, .row_inputs = 0b01},
  {.kind = OpKind::col2im, .name = "col2im", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_shape_attr, .flops = flops_per_input0, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::max_pool2d_backward, .name = "max_pool2d_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_like_second, .flops = flops_pool_backward, .split_rows = true, .row_inputs = 0b11},
  {.kind = OpKind::avg_pool2d_backward, .name = "avg_pool2d_backward", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_shape_attr, .flops = flops_pool_backward, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::global_avg_pool_backward, .name = "global_avg_pool_backward", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_shape_attr, .flops = flops_per_output, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::grouped_conv2d_backward_input, .name = "grouped_conv2d_backward_input", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_shape_attr, .flops = flops_grouped_conv2d_backward_input},
  {.kind = OpKind::grouped_conv2d_backward_weight, .name = "grouped_conv2d_backward_weight", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_shape_attr, .flops = flops_grouped_conv2d_backward_weight},
};
// clang-format on

}  // namespace

std::span<const OpInfo> conv_pool_rows() { return kConvPoolRows; }

}  // namespace memplan::graph
