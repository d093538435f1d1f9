#include "memplan/graph/mixed_precision.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "memplan/common/check.h"

namespace memplan::graph {

Graph with_working_dtype(const Graph& forward, DType dtype) {
  MEMPLAN_CHECK(is_floating(dtype), "a working dtype must be floating, got " << dtype_name(dtype));
  Graph g;
  std::vector<TensorId> map(static_cast<std::size_t>(forward.num_tensors()), kNoTensor);
  // Tensors no op produces first, in their order (parameters() keeps its order): inputs and
  // parameters take the working dtype; persistent state (running statistics) keeps its own.
  for (TensorId id = 0; id < forward.num_tensors(); ++id) {
    if (forward.producer(id) >= 0) continue;
    TensorDesc desc = forward.tensor(id);
    MEMPLAN_CHECK(!desc.is_view() && desc.grad == kNoTensor && desc.shard_of == kNoTensor,
                  "with_working_dtype takes a forward graph; '" << desc.name << "' is not a forward tensor");
    if (is_floating(desc.dtype) && (desc.role == Role::input || desc.role == Role::parameter)) desc.dtype = dtype;
    map[static_cast<std::size_t>(id)] = g.add_tensor(std::move(desc));
  }
  auto mapped = [&](const std::vector<TensorId>& ids) {
    std::vector<TensorId> out;
    out.reserve(ids.size());
    for (TensorId t : ids) {
      MEMPLAN_CHECK(map[static_cast<std::size_t>(t)] != kNoTensor, "operand '" << forward.tensor(t).name << "' is read before it is made");
      out.push_back(map[static_cast<std::size_t>(t)]);
    }
    return out;
  };
  for (const Op& op : forward.ops()) {
    OpAttrs attrs = op.attrs;
    const bool makes_its_dtype = op.kind == OpKind::fill || op.kind == OpKind::broadcast_scalar || op.kind == OpKind::dropout_mask;
    if (makes_its_dtype && is_floating(attrs.dtype)) attrs.dtype = dtype;
    const TensorDesc* out = op.outputs.empty() ? nullptr : &forward.tensor(op.outputs[0]);
    const TensorId made = g.add_op(op.kind, mapped(op.inputs), std::move(attrs), out != nullptr ? out->name : op.name,
                                   out != nullptr ? out->role : Role::temporary, op.phase, mapped(op.updates));
    if (out == nullptr) continue;
    TensorDesc& desc = g.mutable_tensor(made);
    desc.init = out->init;
    desc.external = out->external;
    map[static_cast<std::size_t>(op.outputs[0])] = made;
  }
  auto remap = [&](TensorId t) { return t == kNoTensor ? kNoTensor : map[static_cast<std::size_t>(t)]; };
  g.loss = remap(forward.loss);
  g.output = remap(forward.output);
  for (TensorId t : forward.retained) g.retained.push_back(remap(t));
  return g;
}

void add_loss_scaling(Graph& step) {
  std::vector<TensorId> grads;
  for (const Op& op : step.ops()) {
    if (op.kind != OpKind::sgd_update_mixed && op.kind != OpKind::sgd_momentum_update_mixed &&
        op.kind != OpKind::adamw_update_mixed && op.kind != OpKind::adamw8bit_update_mixed) {
      continue;
    }
    if (op.attrs.shard_count >= 0 || step.tensor(op.updates[0]).shard_of != kNoTensor) {
      throw GraphError("fp16 loss scaling needs every rank to see every gradient; '" + op.name +
                       "' updates one rank's shard (ZeRO 1-3): use ZeRO stage 0, or bf16, which needs no loss scaling");
    }
    if (std::find(grads.begin(), grads.end(), op.inputs[0]) == grads.end()) grads.push_back(op.inputs[0]);
  }
  if (grads.empty()) throw GraphError("fp16 loss scaling needs a step with 16-bit parameters and their mixed updates");
  const TensorId flag = step.add_op(OpKind::grads_finite, grads, {}, "grads_finite", Role::temporary, Phase::backward);
  const int check = step.num_ops() - 1;
  std::vector<int> order, updates;
  for (int i = 0; i < check; ++i) (step.ops()[static_cast<std::size_t>(i)].phase == Phase::optimizer ? updates : order).push_back(i);
  order.push_back(check);
  order.insert(order.end(), updates.begin(), updates.end());
  step.reorder_ops(order);
  step.retained.push_back(flag);
}

TensorId grads_finite_flag(const Graph& step) {
  for (const Op& op : step.ops()) {
    if (op.kind == OpKind::grads_finite) return op.outputs[0];
  }
  return kNoTensor;
}

namespace {

Bytes aligned(Bytes bytes) { return (bytes + kWidenAlignment - 1) / kWidenAlignment * kWidenAlignment; }

}  // namespace

bool splits_by_rows(const OpInfo& info, const OpAttrs& attrs) {
  return info.split_rows && (info.split_rows_when == nullptr || info.split_rows_when(attrs));
}

Widening widening_of(std::span<const WidenedOperand> operands) {
  Widening w;
  for (const WidenedOperand& o : operands) {
    if (o.by_rows) {
      w.rows = o.first_dim;
      break;
    }
  }
  bool even = w.rows > 0;
  Bytes per_row = 0;  // the split copies' f32 bytes per row
  for (const WidenedOperand& o : operands) {
    if (!o.by_rows || !even) continue;
    even = o.first_dim % w.rows == 0 && o.elements % w.rows == 0;
    if (o.is_16bit) per_row += o.elements / w.rows * Bytes{4};
  }
  if (!even) w.rows = 0;
  w.rows_per_slice = w.rows == 0 ? 0 : std::clamp<std::int64_t>(kWidenSliceBytes / std::max<Bytes>(per_row, 1), 1, w.rows);
  for (const WidenedOperand& o : operands) {
    if (!o.is_16bit) continue;
    const bool split = w.rows > 0 && o.by_rows;
    w.bytes += aligned((split ? o.elements / w.rows * w.rows_per_slice : o.elements) * Bytes{4});
  }
  return w;
}

Widening op_widening(const Graph& graph, const Op& op) {
  const OpInfo& info = op_info(op.kind);
  // A view computes nothing; to_host copies bytes at whatever dtype they have.
  if (info.pure_view || op.kind == OpKind::to_host) return {};
  if ((op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter) && is_16bit_float(graph.tensor(op.inputs[0]).dtype)) {
    // A 16-bit sum across ranks exchanges 16-bit chunks and adds them in f32: the chunks every
    // rank sends this one (a reduce-scatter) or, for an all-reduce over a tensor padded to whole
    // shards, the chunks sent and those received.
    const std::int64_t n = graph.tensor(op.inputs[0]).shape.numel();
    const std::int64_t padded = (n + op.attrs.world - 1) / op.attrs.world * op.attrs.world;
    Widening w;
    w.bytes = op.kind == OpKind::reduce_scatter ? aligned(n * 2) : aligned(2 * padded * 2);
    return w;
  }
  const bool split = splits_by_rows(info, op.attrs);
  std::vector<WidenedOperand> operands;
  auto add = [&](TensorId t, bool by_rows) {
    const TensorDesc& d = graph.tensor(t);
    operands.push_back({d.shape.numel(), d.shape.rank() == 0 ? 1 : d.shape[0], is_16bit_float(d.dtype), by_rows});
  };
  for (std::size_t i = 0; i < op.inputs.size(); ++i) add(op.inputs[i], split && i < 8 && ((info.row_inputs >> i) & 1u) != 0);
  for (TensorId t : op.updates) add(t, false);
  if (!info.output_is_view) {
    for (TensorId t : op.outputs) add(t, split && !info.sums_rows);  // a sum over rows: the whole output
  }
  bool any_16bit = false;
  for (const WidenedOperand& o : operands) any_16bit = any_16bit || o.is_16bit;
  return any_16bit ? widening_of(operands) : Widening{};
}

Bytes widening_scratch_bytes(const Graph& graph, std::span<const OpKind> native) {
  Bytes most = 0;
  for (const Op& op : graph.ops()) {
    if (std::find(native.begin(), native.end(), op.kind) != native.end()) continue;
    most = std::max(most, op_widening(graph, op).bytes);
  }
  return most;
}

Bytes op_scratch_bytes(const Graph& graph, const Op& op) {
  const OpInfo& info = op_info(op.kind);
  if (info.scratch == nullptr) return 0;
  std::vector<const TensorDesc*> inputs;
  inputs.reserve(op.inputs.size());
  for (TensorId t : op.inputs) inputs.push_back(&graph.tensor(t));
  return aligned(info.scratch(inputs, op.attrs));
}

Bytes kernel_scratch_bytes(const Graph& graph, bool widen, std::span<const OpKind> native) {
  Bytes most = 0;
  for (const Op& op : graph.ops()) {
    const bool widened = widen && std::find(native.begin(), native.end(), op.kind) == native.end();
    most = std::max(most, op_scratch_bytes(graph, op) + (widened ? op_widening(graph, op).bytes : Bytes{0}));
  }
  return most;
}

}  // namespace memplan::graph
