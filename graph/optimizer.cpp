#include "memplan/graph/optimizer.h"

#include <string>

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

void append_optimizer(Graph& graph, const OptimizerConfig& config) {
  for (TensorId p : graph.parameters()) {
    const TensorId g = graph.tensor(p).grad;
    if (g == kNoTensor) continue;  // the loss does not depend on it
    append_update(graph, p, g, config);
  }
}

}  // namespace memplan::graph
