#include "memplan/graph/optimizer.h"

#include <algorithm>
#include <string>
#include <vector>

namespace memplan::graph {

Result<OptimizerKind> parse_optimizer_kind(std::string_view name) { return parse_enum(kOptimizerNames, name, "optimizer"); }

std::string_view optimizer_name(OptimizerKind kind) { return enum_name(kOptimizerNames, kind); }

namespace {

// Optimizer state is f32 whatever the parameter's dtype (mixed precision keeps it full width).
TensorId add_state(Graph& graph, TensorId param, const Shape& shape, const char* suffix) {
  TensorDesc desc;
  desc.name = graph.tensor(param).name + "." + suffix;
  desc.shape = shape;
  desc.role = Role::optimizer_state;
  desc.init = InitSpec{InitSpec::Kind::zeros, 0.0f};
  const TensorDesc& p = graph.tensor(param);
  if (shape == p.shape) {  // the state of a tensor-parallel slice is the same slice of the whole state
    desc.tp_axis = p.tp_axis;
    desc.tp_parts = p.tp_parts;
    desc.tp_index = p.tp_index;
    desc.tp_whole = p.tp_whole;
  }
  return graph.add_tensor(std::move(desc));
}

// The f32 master copy of a 16-bit parameter: initialised with the parameter's values (over the
// range a ZeRO-1/2 update covers), of which the parameter is the rounding.
TensorId add_master(Graph& graph, TensorId param, const Shape& shape, const OpAttrs& attrs) {
  const TensorId master = add_state(graph, param, shape, "master");
  TensorDesc& desc = graph.mutable_tensor(master);
  desc.init = graph.tensor(param).init;
  desc.master_of = param;
  desc.master_offset = attrs.shard_count >= 0 ? attrs.shard_offset : 0;
  return master;
}

}  // namespace

void append_update(Graph& graph, TensorId p, TensorId g, const OptimizerConfig& config, const Shape& state_shape,
                   const OpAttrs& attrs_base) {
  OpAttrs attrs = attrs_base;
  attrs.lr = config.lr;
  attrs.momentum = config.momentum;
  attrs.beta1 = config.beta1;
  attrs.beta2 = config.beta2;
  attrs.eps = config.eps;
  attrs.weight_decay = config.weight_decay;
  const Shape shape = state_shape.dims.empty() ? graph.tensor(p).shape : state_shape;
  const std::string name = "update(" + graph.tensor(p).name + ")";
  if (graph.tensor(p).dtype != DType::f32) {
    // Mixed precision: the update runs on the f32 master copy and rounds it into the parameter.
    const TensorId master = add_master(graph, p, shape, attrs);
    switch (config.kind) {
      case OptimizerKind::sgd:
        graph.add_op(OpKind::sgd_update_mixed, {g}, attrs, name, Role::temporary, Phase::optimizer, {p, master});
        break;
      case OptimizerKind::momentum: {
        const TensorId buf = add_state(graph, p, shape, "momentum");
        graph.add_op(OpKind::sgd_momentum_update_mixed, {g}, attrs, name, Role::temporary, Phase::optimizer,
                     {p, master, buf});
        break;
      }
      case OptimizerKind::adamw: {
        const TensorId m = add_state(graph, p, shape, "adam_m");
        const TensorId v = add_state(graph, p, shape, "adam_v");
        graph.add_op(OpKind::adamw_update_mixed, {g}, attrs, name, Role::temporary, Phase::optimizer,
                     {p, master, m, v});
        break;
      }
    }
    return;
  }
  switch (config.kind) {
    case OptimizerKind::sgd:
      graph.add_op(OpKind::sgd_update, {g}, attrs, name, Role::temporary, Phase::optimizer, {p});
      break;
    case OptimizerKind::momentum: {
      const TensorId buf = add_state(graph, p, shape, "momentum");
      graph.add_op(OpKind::sgd_momentum_update, {g}, attrs, name, Role::temporary, Phase::optimizer, {p, buf});
      break;
    }
    case OptimizerKind::adamw: {
      const TensorId m = add_state(graph, p, shape, "adam_m");
      const TensorId v = add_state(graph, p, shape, "adam_v");
      graph.add_op(OpKind::adamw_update, {g}, attrs, name, Role::temporary, Phase::optimizer, {p, m, v});
      break;
    }
  }
}

int offload_optimizer(Graph& graph) {
  auto is_update = [](OpKind kind) {
    switch (kind) {
      case OpKind::sgd_update:
      case OpKind::sgd_momentum_update:
      case OpKind::adamw_update:
      case OpKind::sgd_update_mixed:
      case OpKind::sgd_momentum_update_mixed:
      case OpKind::adamw_update_mixed:
        return true;
      default:
        return false;
    }
  };
  const int num_ops = graph.num_ops();
  // The last op writing each storage root: a gradient is final there (accumulated, reduced), and
  // its copy goes right after, so the device's gradient dies as early as it can and the update
  // that reads the copy is ready (the memory-aware order runs it at once).
  std::vector<int> last_writer(static_cast<std::size_t>(graph.num_tensors()), -1);
  for (int i = 0; i < num_ops; ++i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    for (const auto* list : {&op.outputs, &op.updates}) {
      for (TensorId t : *list) last_writer[static_cast<std::size_t>(graph.storage_root(t))] = i;
    }
  }
  std::vector<std::vector<int>> copies_after(static_cast<std::size_t>(num_ops));  // op -> copy ops placed after it
  std::vector<int> copy_before(static_cast<std::size_t>(num_ops), -1);          // update -> its copy, when unanchored
  for (int i = 0; i < num_ops; ++i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    if (!is_update(op.kind)) continue;
    for (std::size_t u = 1; u < op.updates.size(); ++u) graph.mutable_tensor(op.updates[u]).host = true;
    const TensorId grad = op.inputs[0];
    const int anchor = std::max(last_writer[static_cast<std::size_t>(graph.storage_root(grad))], graph.producer(grad));
    const TensorId copy = graph.add_op(OpKind::to_host, {grad}, {}, "host:" + graph.tensor(grad).name, Role::gradient,
                                       Phase::optimizer);
    graph.mutable_tensor(copy).host = true;
    graph.replace_input(i, 0, copy);
    const int copy_op = graph.num_ops() - 1;
    if (anchor >= 0 && anchor < i) copies_after[static_cast<std::size_t>(anchor)].push_back(copy_op);
    else copy_before[static_cast<std::size_t>(i)] = copy_op;
  }
  if (graph.num_ops() == num_ops) return 0;
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(graph.num_ops()));
  for (int i = 0; i < num_ops; ++i) {
    if (copy_before[static_cast<std::size_t>(i)] >= 0) order.push_back(copy_before[static_cast<std::size_t>(i)]);
    order.push_back(i);
    for (int c : copies_after[static_cast<std::size_t>(i)]) order.push_back(c);
  }
  graph.reorder_ops(order);
  return graph.num_ops() - num_ops;
}

void append_optimizer(Graph& graph, const OptimizerConfig& config) {
  for (TensorId p : graph.parameters()) {
    const TensorId g = graph.tensor(p).grad;
    if (g == kNoTensor) continue;  // the loss does not depend on it
    append_update(graph, p, g, config);
  }
}

}  // namespace memplan::graph
