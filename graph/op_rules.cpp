#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph::op_rules {

[[noreturn]] void fail(std::string_view op, const std::string& what) {
  throw GraphError(std::string(op) + ": " + what);
}

void expect_float(std::string_view op, const TensorDesc& t) {
  if (!is_floating(t.dtype)) {
    fail(op, "'" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) + ", expected a floating dtype (" +
                 std::string(dtype_name(DType::f32)) + ", " + std::string(dtype_name(DType::f16)) + " or " +
                 std::string(dtype_name(DType::bf16)) + ")");
  }
}

void expect_same_dtype(std::string_view op, const TensorDesc& a, const TensorDesc& b) {
  if (a.dtype != b.dtype) {
    fail(op, "'" + a.name + "' is " + std::string(dtype_name(a.dtype)) + " but '" + b.name + "' is " +
                 std::string(dtype_name(b.dtype)));
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

OutputSpec infer_backward_like_second(Inputs in, const OpAttrs&) {
  expect_same_shape("backward", *in[0], *in[1]);
  return {in[1]->shape, in[1]->dtype};
}

OutputSpec infer_update(Inputs, const OpAttrs&) { return {}; }

std::string str(std::int64_t v) { return std::to_string(v); }

void expect_rank(std::string_view op, const TensorDesc& t, int rank) {
  if (t.shape.rank() != rank) {
    fail(op, "'" + t.name + "' " + t.shape.to_string() + " must have rank " + str(rank));
  }
}

OutputSpec infer_shape_attr(Inputs in, const OpAttrs& attrs) {
  return {shape_from_attrs("backward", attrs), in[0]->dtype};
}

OutputSpec infer_like_second(Inputs in, const OpAttrs&) { return {in[1]->shape, in[1]->dtype}; }

double numel_of(const TensorDesc* t) { return t ? double(t->shape.numel()) : 0.0; }

double flops_zero(Inputs, const TensorDesc*) { return 0.0; }

double flops_per_output(Inputs, const TensorDesc* out) { return numel_of(out); }

double flops_per_input(Inputs in, const TensorDesc*) { return numel_of(in[0]); }

double flops_3_per_output(Inputs, const TensorDesc* out) { return 3.0 * numel_of(out); }

double flops_4_per_output(Inputs, const TensorDesc* out) { return 4.0 * numel_of(out); }

double flops_per_input0(Inputs in, const TensorDesc*) { return numel_of(in[0]); }

OpAttrs with_shape(OpAttrs attrs, const Shape& shape) {
  attrs.shape = shape.dims;
  return attrs;
}

OpAttrs slice_attrs(std::int64_t axis, std::int64_t start, std::int64_t length) {
  OpAttrs attrs;
  attrs.axis = axis;
  attrs.start = start;
  attrs.length = length;
  return attrs;
}

}  // namespace memplan::graph::op_rules
