// The builder API models are written in: each call appends one op to the forward graph and
// returns its output tensor, so model code reads like the math (see models/mlp.cpp).
#pragma once

#include <string>

#include "graph/graph.h"

namespace memplan::graph {

class Builder {
 public:
  explicit Builder(Graph& graph, Phase phase = Phase::forward) : graph_(graph), phase_(phase) {}

  TensorId input(const std::string& name, Shape shape, DType dtype = DType::f32);
  TensorId parameter(const std::string& name, Shape shape, InitSpec init);

  // y = x W^T + b with W [out, in] and b [out] (PyTorch's layout).
  TensorId linear(TensorId x, TensorId weight, TensorId bias, const std::string& name);
  TensorId matmul(TensorId a, TensorId b, bool trans_a, bool trans_b, const std::string& name);
  TensorId bias_add(TensorId x, TensorId bias, const std::string& name);
  TensorId add(TensorId a, TensorId b, const std::string& name);
  TensorId mul(TensorId a, TensorId b, const std::string& name);
  TensorId scale(TensorId x, float alpha, const std::string& name);
  TensorId relu(TensorId x, const std::string& name);
  TensorId gelu(TensorId x, const std::string& name);
  TensorId reshape(TensorId x, Shape shape, const std::string& name);
  TensorId sum(TensorId x, const std::string& name);
  TensorId mean(TensorId x, const std::string& name);
  // Mean softmax cross-entropy of logits [B, C] against i32 labels [B].
  TensorId cross_entropy(TensorId logits, TensorId labels, const std::string& name);

  Graph& graph() { return graph_; }

 private:
  TensorId unary(OpKind kind, TensorId x, const std::string& name, OpAttrs attrs = {});
  TensorId binary(OpKind kind, TensorId a, TensorId b, const std::string& name, OpAttrs attrs = {});
  Graph& graph_;
  Phase phase_;
};

}  // namespace memplan::graph
