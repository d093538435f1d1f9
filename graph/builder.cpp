#include "graph/builder.h"

namespace memplan::graph {

TensorId Builder::input(const std::string& name, Shape shape, DType dtype) {
  TensorDesc desc;
  desc.name = name;
  desc.shape = std::move(shape);
  desc.dtype = dtype;
  desc.role = Role::input;
  return graph_.add_tensor(std::move(desc));
}

TensorId Builder::parameter(const std::string& name, Shape shape, InitSpec init) {
  TensorDesc desc;
  desc.name = name;
  desc.shape = std::move(shape);
  desc.role = Role::parameter;
  desc.init = init;
  return graph_.add_tensor(std::move(desc));
}

TensorId Builder::unary(OpKind kind, TensorId x, const std::string& name, OpAttrs attrs) {
  return graph_.add_op(kind, {x}, std::move(attrs), name, Role::activation, phase_);
}

TensorId Builder::binary(OpKind kind, TensorId a, TensorId b, const std::string& name,
                         OpAttrs attrs) {
  return graph_.add_op(kind, {a, b}, std::move(attrs), name, Role::activation, phase_);
}

TensorId Builder::linear(TensorId x, TensorId weight, TensorId bias, const std::string& name) {
  TensorId xw = matmul(x, weight, false, true, name + ".matmul");
  return bias_add(xw, bias, name);
}

TensorId Builder::matmul(TensorId a, TensorId b, bool trans_a, bool trans_b,
                         const std::string& name) {
  OpAttrs attrs;
  attrs.trans_a = trans_a;
  attrs.trans_b = trans_b;
  return binary(OpKind::matmul, a, b, name, std::move(attrs));
}

TensorId Builder::bias_add(TensorId x, TensorId bias, const std::string& name) {
  return binary(OpKind::bias_add, x, bias, name);
}
TensorId Builder::add(TensorId a, TensorId b, const std::string& name) {
  return binary(OpKind::add, a, b, name);
}
TensorId Builder::mul(TensorId a, TensorId b, const std::string& name) {
  return binary(OpKind::mul, a, b, name);
}
TensorId Builder::scale(TensorId x, float alpha, const std::string& name) {
  OpAttrs attrs;
  attrs.alpha = alpha;
  return unary(OpKind::scale, x, name, std::move(attrs));
}
TensorId Builder::relu(TensorId x, const std::string& name) { return unary(OpKind::relu, x, name); }
TensorId Builder::gelu(TensorId x, const std::string& name) { return unary(OpKind::gelu, x, name); }
TensorId Builder::reshape(TensorId x, Shape shape, const std::string& name) {
  OpAttrs attrs;
  attrs.shape = shape.dims;
  return unary(OpKind::reshape, x, name, std::move(attrs));
}
TensorId Builder::sum(TensorId x, const std::string& name) { return unary(OpKind::sum, x, name); }
TensorId Builder::mean(TensorId x, const std::string& name) { return unary(OpKind::mean, x, name); }
TensorId Builder::cross_entropy(TensorId logits, TensorId labels, const std::string& name) {
  return binary(OpKind::softmax_cross_entropy, logits, labels, name);
}

}  // namespace memplan::graph
