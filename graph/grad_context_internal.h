// What a gradient rule (OpInfo::grad, in the op families' files) works with while autograd
// builds the backward graph: which tensors need gradients, their gradients so far, and emitting
// backward ops. Internal to graph/.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "memplan/graph/graph.h"

namespace memplan::graph {

class GradContext {
 public:
  GradContext(Graph& graph, std::vector<bool> needs_grad)
      : graph_(graph), needs_grad_(std::move(needs_grad)),
        grad_(static_cast<std::size_t>(graph.num_tensors()), kNoTensor) {}

  bool needs_grad(TensorId id) const { return needs_grad_[static_cast<std::size_t>(id)]; }
  const TensorDesc& tensor(TensorId id) const { return graph_.tensor(id); }
  TensorId grad(TensorId id) const { return grad_[static_cast<std::size_t>(id)]; }

  // Adds a contribution to x's gradient; the second and later contributions are summed by an
  // explicit add op, in a fixed order, so results are deterministic.
  void accumulate(TensorId x, TensorId g) {
    if (!needs_grad(x)) return;
    TensorId& slot = grad_[static_cast<std::size_t>(x)];
    if (slot == kNoTensor) {
      slot = g;
    } else {
      slot = emit(OpKind::add, {slot, g}, {}, "grad_acc(" + tensor(x).name + ")");
    }
  }

  TensorId emit(OpKind kind, std::vector<TensorId> inputs, OpAttrs attrs, const std::string& name,
                Role role = Role::gradient) {
    return graph_.add_op(kind, std::move(inputs), std::move(attrs), name, role, Phase::backward);
  }
  // The op producing `id`, or nullptr for tensors no op produces.
  const Op* producer(TensorId id) const {
    const int p = graph_.producer(id);
    return p < 0 ? nullptr : &graph_.ops()[static_cast<std::size_t>(p)];
  }

  std::string gname(TensorId id) const { return "d(" + tensor(id).name + ")"; }

 private:
  Graph& graph_;
  std::vector<bool> needs_grad_;
  std::vector<TensorId> grad_;  // per tensor: its gradient so far
};

}  // namespace memplan::graph
