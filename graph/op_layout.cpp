// Ops that move data without arithmetic: views, permutes, concatenation and slices, head repetition, embedding gathers.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <cstdint>
#include <string>
#include <vector>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

OutputSpec infer_reshape(Inputs in, const OpAttrs& attrs) {
  Shape target = shape_from_attrs("reshape", attrs);
  if (target.numel() != in[0]->shape.numel()) {
    fail("reshape", "cannot view '" + in[0]->name + "' " + in[0]->shape.to_string() + " as " +
                        target.to_string() + ": element counts differ");
  }
  return {target, in[0]->dtype};
}

OutputSpec infer_embedding(Inputs in, const OpAttrs&) {
  const TensorDesc& ids = *in[0];
  const TensorDesc& table = *in[1];
  if (ids.dtype != DType::i32) fail("embedding", "ids '" + ids.name + "' must be i32");
  expect_float("embedding", table);
  expect_rank("embedding", table, 2);
  std::vector<std::int64_t> dims = ids.shape.dims;
  dims.push_back(table.shape[1]);
  return {Shape(std::move(dims)), table.dtype};
}

OutputSpec infer_permute(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  const auto rank = static_cast<std::size_t>(x.shape.rank());
  std::vector<bool> seen(rank, false);
  if (attrs.perm.size() != rank) fail("permute", "perm must list all " + str(x.shape.rank()) + " dims");
  std::vector<std::int64_t> dims;
  for (std::int64_t p : attrs.perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(rank) || seen[static_cast<std::size_t>(p)]) {
      fail("permute", "perm is not a permutation of 0.." + str(x.shape.rank() - 1));
    }
    seen[static_cast<std::size_t>(p)] = true;
    dims.push_back(x.shape[static_cast<int>(p)]);
  }
  return {Shape(std::move(dims)), x.dtype};
}

OutputSpec infer_repeat_heads(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("repeat_heads", x);
  if (x.shape.rank() < 2 || attrs.repeats < 1) fail("repeat_heads", "needs [B, H, ...] and repeats >= 1");
  std::vector<std::int64_t> dims = x.shape.dims;
  dims[1] *= attrs.repeats;
  return {Shape(std::move(dims)), x.dtype};
}

OutputSpec infer_repeat_heads_backward(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& dy = *in[0];
  if (dy.shape.rank() < 2 || attrs.repeats < 1 || dy.shape[1] % attrs.repeats != 0) {
    fail("repeat_heads_backward", "heads of '" + dy.name + "' must be a multiple of repeats");
  }
  std::vector<std::int64_t> dims = dy.shape.dims;
  dims[1] /= attrs.repeats;
  return {Shape(std::move(dims)), dy.dtype};
}

void expect_axis(std::string_view op, const TensorDesc& x, std::int64_t axis) {
  if (axis < 0 || axis >= x.shape.rank()) {
    fail(op, "axis " + str(axis) + " is outside '" + x.name + "' " + x.shape.to_string());
  }
}

OutputSpec infer_concat(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& a = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("concat", a);
  expect_same_dtype("concat", a, b);
  expect_axis("concat", a, attrs.axis);
  bool ok = a.shape.rank() == b.shape.rank();
  for (int i = 0; ok && i < a.shape.rank(); ++i) ok = i == attrs.axis || a.shape[i] == b.shape[i];
  if (!ok) {
    fail("concat", "'" + a.name + "' " + a.shape.to_string() + " and '" + b.name + "' " + b.shape.to_string() +
                       " must agree on every dim but " + str(attrs.axis));
  }
  std::vector<std::int64_t> dims = a.shape.dims;
  dims[static_cast<std::size_t>(attrs.axis)] += b.shape[static_cast<int>(attrs.axis)];
  return {Shape(std::move(dims)), a.dtype};
}

OutputSpec infer_slice(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("slice", x);
  expect_axis("slice", x, attrs.axis);
  const std::int64_t extent = x.shape[static_cast<int>(attrs.axis)];
  if (attrs.start < 0 || attrs.length < 1 || attrs.start + attrs.length > extent) {
    fail("slice", "[" + str(attrs.start) + ", " + str(attrs.start + attrs.length) + ") is not inside dim " +
                      str(attrs.axis) + " of '" + x.name + "' " + x.shape.to_string());
  }
  std::vector<std::int64_t> dims = x.shape.dims;
  dims[static_cast<std::size_t>(attrs.axis)] = attrs.length;
  return {Shape(std::move(dims)), x.dtype};
}

void grad_reshape(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs attrs;
  attrs.shape = c.tensor(op.inputs[0]).shape.dims;
  c.accumulate(op.inputs[0], c.emit(OpKind::reshape, {dy}, attrs, c.gname(op.inputs[0])));
}

void grad_embedding(GradContext& c, const Op& op, TensorId dy) {
  const TensorId ids = op.inputs[0], table = op.inputs[1];
  OpAttrs attrs = with_shape({}, c.tensor(table).shape);
  attrs.world = op.attrs.world;  // a vocabulary-parallel table's slice: ids [start, start + V)
  attrs.start = op.attrs.start;
  c.accumulate(table, c.emit(OpKind::embedding_backward, {dy, ids}, attrs, c.gname(table)));
}

void grad_permute(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs inverse;
  inverse.perm.resize(op.attrs.perm.size());
  for (std::size_t i = 0; i < op.attrs.perm.size(); ++i) {
    inverse.perm[static_cast<std::size_t>(op.attrs.perm[i])] = static_cast<std::int64_t>(i);
  }
  c.accumulate(op.inputs[0], c.emit(OpKind::permute, {dy}, inverse, c.gname(op.inputs[0])));
}

void grad_repeat_heads(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::repeat_heads_backward, {dy}, op.attrs, c.gname(op.inputs[0])));
}

void grad_concat(GradContext& c, const Op& op, TensorId dy) {
  const TensorId a = op.inputs[0], b = op.inputs[1];
  const std::int64_t axis = op.attrs.axis;
  const std::int64_t na = c.tensor(a).shape[static_cast<int>(axis)];
  const std::int64_t nb = c.tensor(b).shape[static_cast<int>(axis)];
  if (c.needs_grad(a)) c.accumulate(a, c.emit(OpKind::slice, {dy}, slice_attrs(axis, 0, na), c.gname(a)));
  if (c.needs_grad(b)) c.accumulate(b, c.emit(OpKind::slice, {dy}, slice_attrs(axis, na, nb), c.gname(b)));
}

// The slice's gradient is dy placed back between zeros (fill ops) along the axis.
void grad_slice(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  // Copies, not references: emitting ops grows the tensor table and would leave them dangling.
  const std::vector<std::int64_t> x_dims = c.tensor(x).shape.dims;
  const DType x_dtype = c.tensor(x).dtype;
  const std::int64_t axis = op.attrs.axis;
  const std::int64_t before = op.attrs.start;
  const std::int64_t after = x_dims[static_cast<std::size_t>(axis)] - op.attrs.start - op.attrs.length;
  auto zeros = [&](std::int64_t extent, const std::string& suffix) {
    OpAttrs fill;
    fill.shape = x_dims;
    fill.shape[static_cast<std::size_t>(axis)] = extent;
    fill.alpha = 0.0f;
    fill.dtype = x_dtype;
    return c.emit(OpKind::fill, {}, fill, c.gname(x) + suffix);
  };
  OpAttrs join;
  join.axis = axis;
  TensorId g = dy;
  if (before > 0) g = c.emit(OpKind::concat, {zeros(before, ".before"), g}, join, c.gname(x) + (after > 0 ? ".head" : ""));
  if (after > 0) g = c.emit(OpKind::concat, {g, zeros(after, ".after")}, join, c.gname(x));
  c.accumulate(x, g);
}

// Splitting by rows holds where the batch stays dimension 0 (OpInfo::split_rows_when).
bool split_unless_axis_0(const OpAttrs& attrs) { return attrs.axis != 0; }
bool split_when_batch_stays_first(const OpAttrs& attrs) { return !attrs.perm.empty() && attrs.perm[0] == 0; }

// A copy of its input into host memory: same shape and dtype.
OutputSpec infer_to_host(Inputs in, const OpAttrs&) { return {in[0]->shape, in[0]->dtype}; }

// clang-format off
constexpr OpInfo kLayoutRows[] = {
  {.kind = OpKind::reshape, .name = "reshape", .num_inputs = 1, .num_updates = 0, .num_outputs = 1, .output_is_view = true,
    .infer = infer_reshape, .flops = flops_zero, .grad = grad_reshape, .pure_view = true},
  {.kind = OpKind::embedding, .name = "embedding", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_embedding, .flops = flops_zero, .grad = grad_embedding, .split_rows = true, .row_inputs = 0b01},
  {.kind = OpKind::permute, .name = "permute", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_permute, .flops = flops_zero, .grad = grad_permute, .split_rows = true, .row_inputs = 0b1, .split_rows_when = split_when_batch_stays_first},
  {.kind = OpKind::repeat_heads, .name = "repeat_heads", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_repeat_heads, .flops = flops_zero, .grad = grad_repeat_heads, .split_rows = true, .row_inputs = 0b1},
  {.kind = OpKind::concat, .name = "concat", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_concat, .flops = flops_zero, .grad = grad_concat, .split_rows = true, .row_inputs = 0b11, .split_rows_when = split_unless_axis_0},
  {.kind = OpKind::slice, .name = "slice", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_slice, .flops = flops_zero, .grad = grad_slice, .split_rows = true, .row_inputs = 0b1, .split_rows_when = split_unless_axis_0},
  // Split by the table's rows: a slice's kernel reads every position and sums those whose id
  // falls in it (KernelCall::first_row), so the f32 copy of a vocabulary-sized gradient is a slice.
  {.kind = OpKind::embedding_backward, .name = "embedding_backward", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_shape_attr, .flops = flops_per_input0, .split_rows = true, .row_inputs = 0},
  // Moves bytes between memories, differentiated never (it runs after the backward pass).
  {.kind = OpKind::to_host, .name = "to_host", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_to_host, .flops = flops_zero},
  {.kind = OpKind::repeat_heads_backward, .name = "repeat_heads_backward", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_repeat_heads_backward, .flops = flops_per_input0, .split_rows = true, .row_inputs = 0b1},
};
// clang-format on

}  // namespace

std::span<const OpInfo> layout_rows() { return kLayoutRows; }

}  // namespace memplan::graph
