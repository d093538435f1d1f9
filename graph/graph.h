// The static graph of one training step: a tensor table and an op list in program order.
// Built once (forward by a model, then autograd and optimizer append to it) and never mutated
// while it runs. Knows nothing of devices, pointers or memory offsets.
#pragma once

#include <string>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/graph/op.h"
#include "memplan/graph/tensor.h"

namespace memplan::graph {

class Graph {
 public:
  TensorId add_tensor(TensorDesc desc);

  // Appends an op after checking its operands (counts, shapes, dtypes) and creates its output
  // tensor (named `output_name`, with `output_role`). Returns the output, or kNoTensor for ops
  // that only update tensors in place. Throws GraphError on inconsistent operands.
  TensorId add_op(OpKind kind, std::vector<TensorId> inputs, OpAttrs attrs, std::string output_name,
                  Role output_role, Phase phase, std::vector<TensorId> updates = {});

  // Inline: schedules, lifetimes and lower bounds call these for every operand of every op.
  const TensorDesc& tensor(TensorId id) const {
    MEMPLAN_CHECK(id >= 0 && id < num_tensors(), "no tensor " << id);
    return tensors_[static_cast<std::size_t>(id)];
  }
  TensorDesc& mutable_tensor(TensorId id);
  const std::vector<TensorDesc>& tensors() const { return tensors_; }
  const std::vector<Op>& ops() const { return ops_; }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  int num_ops() const { return static_cast<int>(ops_.size()); }

  // The tensor that owns the storage `id` lives in (follows view_of to the end).
  TensorId storage_root(TensorId id) const {
    while (tensor(id).is_view()) id = tensors_[static_cast<std::size_t>(id)].view_of;
    return id;
  }
  // Every tensor with the given role, in creation order.
  std::vector<TensorId> tensors_with_role(Role role) const;
  std::vector<TensorId> parameters() const { return tensors_with_role(Role::parameter); }
  // Index of the op producing `id`, or -1 for tensors no op produces (inputs, persistent state).
  int producer(TensorId id) const;
  TensorId find(const std::string& name) const;  // kNoTensor when absent

  // Graph rewrites for passes such as activation checkpointing (before anything runs):
  // point input `slot` of op `op_index` at another tensor of the same shape and dtype.
  void replace_input(int op_index, int slot, TensorId tensor);
  // A scale factor of op `op_index` (OpAttrs::alpha), which no shape depends on: e.g. the
  // unbiasing factor of running statistics once they cover every rank's samples.
  void set_alpha(int op_index, float alpha);
  // Puts the ops in a new program order: order[i] is the current index of the op to run i-th
  // (a permutation of all ops). Producer indices follow; dependences are the caller's to keep.
  void reorder_ops(const std::vector<int>& order);
  // A copy with every tensor and op name empty: the same step for what reads only shapes, roles
  // and the op structure (schedules, lifetimes, lower bounds), and much cheaper to copy again
  // (searches that rewrite a step hundreds of times copy this one). Messages name nothing.
  Graph without_names() const;

  TensorId loss = kNoTensor;    // the scalar training loss
  TensorId output = kNoTensor;  // the model's prediction (e.g. logits), for evaluation
  // Extra tensors kept alive to the end of the step so callers can read them (gradient checks,
  // golden tests, debugging); planned like the loss.
  std::vector<TensorId> retained;

 private:
  std::vector<TensorDesc> tensors_;
  std::vector<Op> ops_;
  std::vector<int> producer_;  // per tensor
};

// Floating-point operations of one execution of `op` (its row's formula, graph/op.h).
double op_flops(const Graph& graph, const Op& op);
// The dtype `op` computes in, which picks its kernel: the first 16-bit dtype among its inputs,
// updates and outputs (mixed precision: f32 operands beside it are f32 statistics or master
// copies), else f32.
DType op_dtype(const Graph& graph, const Op& op);

}  // namespace memplan::graph
