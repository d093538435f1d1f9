#include "memplan/graph/graph.h"

#include "memplan/common/check.h"

namespace memplan::graph {

TensorId Graph::add_tensor(TensorDesc desc) {
  for (std::int64_t d : desc.shape.dims) {
    if (d <= 0) {
      throw GraphError("tensor '" + desc.name + "' has shape " + desc.shape.to_string() +
                       ": every dimension must be positive");
    }
  }
  // Every tensor's size is representable from here on: numel() and size_bytes() cannot overflow.
  std::int64_t numel = 1;
  bool too_large = false;
  for (std::int64_t d : desc.shape.dims) too_large = too_large || __builtin_mul_overflow(numel, d, &numel);
  Bytes bytes = 0;
  too_large = too_large || __builtin_mul_overflow(numel, dtype_size(desc.dtype), &bytes) || bytes > kMaxTensorBytes;
  if (too_large) {
    throw SizeError("tensor '" + desc.name + "' of shape " + desc.shape.to_string() + " would hold more than 2^60 bytes, " +
                    "the most one tensor may");
  }
  const auto id = static_cast<TensorId>(tensors_.size());
  tensors_.push_back(std::move(desc));
  producer_.push_back(-1);
  return id;
}

TensorId Graph::add_op(OpKind kind, std::vector<TensorId> inputs, OpAttrs attrs,
                       std::string output_name, Role output_role, Phase phase,
                       std::vector<TensorId> updates) {
  const OpInfo& info = op_info(kind);
  MEMPLAN_CHECK(info.num_inputs == kVariadic ? !inputs.empty() : static_cast<int>(inputs.size()) == info.num_inputs,
                info.name << " takes " << info.num_inputs << " inputs, got " << inputs.size());
  MEMPLAN_CHECK(static_cast<int>(updates.size()) == info.num_updates,
                info.name << " updates " << info.num_updates << " tensors, got " << updates.size());
  std::vector<const TensorDesc*> in;
  for (TensorId id : inputs) in.push_back(&tensor(id));
  for (TensorId id : updates) {
    MEMPLAN_CHECK(is_persistent(tensor(id).role),
                  info.name << " may only update persistent tensors, not '" << tensor(id).name << "'");
  }
  for (const TensorDesc* t : in) {
    if (is_floating(t->dtype) && !info.accepts.contains(t->dtype)) {
      std::string takes;
      for (DType d : {DType::f32, DType::f16, DType::bf16}) {
        if (info.accepts.contains(d)) takes += (takes.empty() ? "" : " or ") + std::string(dtype_name(d));
      }
      throw GraphError(std::string(info.name) + ": '" + t->name + "' is " + std::string(dtype_name(t->dtype)) +
                       "; this op takes " + takes);
    }
  }
  OutputSpec spec = info.infer(in, attrs);

  Op op;
  op.kind = kind;
  op.name = output_name;
  op.inputs = std::move(inputs);
  op.updates = std::move(updates);
  op.attrs = std::move(attrs);
  op.phase = phase;
  TensorId out = kNoTensor;
  if (info.num_outputs == 1) {
    TensorDesc desc;
    desc.name = std::move(output_name);
    desc.shape = std::move(spec.shape);
    desc.dtype = spec.dtype;
    desc.role = output_role;
    if (info.output_is_view) desc.view_of = op.inputs[0];
    out = add_tensor(std::move(desc));
    op.outputs.push_back(out);
    producer_[static_cast<std::size_t>(out)] = num_ops();
  }
  ops_.push_back(std::move(op));
  return out;
}

TensorDesc& Graph::mutable_tensor(TensorId id) {
  MEMPLAN_CHECK(id >= 0 && id < num_tensors(), "no tensor " << id);
  return tensors_[static_cast<std::size_t>(id)];
}

std::vector<TensorId> Graph::tensors_with_role(Role role) const {
  std::vector<TensorId> out;
  for (TensorId id = 0; id < num_tensors(); ++id) {
    if (tensor(id).role == role) out.push_back(id);
  }
  return out;
}

int Graph::producer(TensorId id) const {
  MEMPLAN_CHECK(id >= 0 && id < num_tensors(), "no tensor " << id);
  return producer_[static_cast<std::size_t>(id)];
}

TensorId Graph::find(const std::string& name) const {
  for (TensorId id = 0; id < num_tensors(); ++id) {
    if (tensor(id).name == name) return id;
  }
  return kNoTensor;
}

void Graph::replace_input(int op_index, int slot, TensorId tensor) {
  MEMPLAN_CHECK(op_index >= 0 && op_index < num_ops(), "no op " << op_index);
  Op& op = ops_[static_cast<std::size_t>(op_index)];
  MEMPLAN_CHECK(slot >= 0 && slot < static_cast<int>(op.inputs.size()), op.name << " has no input " << slot);
  const TensorDesc& old_desc = this->tensor(op.inputs[static_cast<std::size_t>(slot)]);
  const TensorDesc& new_desc = this->tensor(tensor);
  MEMPLAN_CHECK(old_desc.shape == new_desc.shape && old_desc.dtype == new_desc.dtype,
                op.name << ": '" << new_desc.name << "' cannot replace '" << old_desc.name << "'");
  op.inputs[static_cast<std::size_t>(slot)] = tensor;
}

void Graph::set_alpha(int op_index, float alpha) {
  MEMPLAN_CHECK(op_index >= 0 && op_index < num_ops(), "no op " << op_index);
  ops_[static_cast<std::size_t>(op_index)].attrs.alpha = alpha;
}

void Graph::reorder_ops(const std::vector<int>& order) {
  MEMPLAN_CHECK(static_cast<int>(order.size()) == num_ops(), "order names " << order.size() << " of " << num_ops() << " ops");
  std::vector<bool> seen(ops_.size(), false);
  std::vector<Op> reordered;
  reordered.reserve(ops_.size());
  for (int i : order) {
    MEMPLAN_CHECK(i >= 0 && i < num_ops() && !seen[static_cast<std::size_t>(i)], "order is not a permutation");
    seen[static_cast<std::size_t>(i)] = true;
    reordered.push_back(std::move(ops_[static_cast<std::size_t>(i)]));
  }
  ops_ = std::move(reordered);
  for (int i = 0; i < num_ops(); ++i) {
    for (TensorId t : ops_[static_cast<std::size_t>(i)].outputs) producer_[static_cast<std::size_t>(t)] = i;
  }
}

Graph Graph::without_names() const {
  Graph out = *this;
  for (TensorDesc& t : out.tensors_) std::string().swap(t.name);
  for (Op& op : out.ops_) std::string().swap(op.name);
  return out;
}

DType op_dtype(const Graph& graph, const Op& op) {
  // Mixed precision: an op with any 16-bit operand computes at that width, whatever f32 operands
  // it also has (a loss gradient's f32 seed, normalisation statistics).
  for (const std::vector<TensorId>* ids : {&op.inputs, &op.updates, &op.outputs}) {
    for (TensorId t : *ids) {
      const DType d = graph.tensor(t).dtype;
      if (is_16bit_float(d)) return d;
    }
  }
  return DType::f32;
}

double op_flops(const Graph& graph, const Op& op) {
  std::vector<const TensorDesc*> in;
  in.reserve(op.inputs.size());
  for (TensorId t : op.inputs) in.push_back(&graph.tensor(t));
  const TensorDesc* out = op.outputs.empty() ? nullptr : &graph.tensor(op.outputs[0]);
  return op_info(op.kind).flops(in, out);
}

}  // namespace memplan::graph
