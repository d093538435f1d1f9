// Reverse-mode autodiff on the static graph: appends the backward ops for a scalar loss to the
// same graph (phase backward), reading each op's gradient rule from its row (graph/op.h: OpInfo::grad).
#pragma once

#include "memplan/graph/graph.h"

namespace memplan::graph {

// Appends backward ops computing d(loss)/d(p) for every parameter p the loss depends on, and
// records each in TensorDesc::grad. Gradients of tensors used more than once are accumulated.
// Inputs (data, labels) get no gradient. Throws GraphError if an op on the path has no rule.
void append_backward(Graph& graph, TensorId loss);

// True if the op kind has a gradient rule (checked by the gradient-check harness).
bool has_gradient_rule(OpKind kind);

}  // namespace memplan::graph
