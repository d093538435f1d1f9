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
    desc.ep_parts = p.ep_parts;
    desc.ep_index = p.ep_index;
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

// 8-bit AdamW's four states after the parameter (and master): the u8 codes of m and v, their
// absmax per block. Paged: the codes of a large parameter in host-visible memory.
std::vector<TensorId> add_8bit_states(Graph& graph, TensorId param, const Shape& shape, bool paged) {
  const std::int64_t n = shape.numel();
  const Shape blocks{(n + kAdam8bitBlock - 1) / kAdam8bitBlock};
  const bool host = paged && graph.tensor(param).shape.numel() >= kPagedStateMinElements;
  std::vector<TensorId> out;
  for (const char* suffix : {"adam_m8", "adam_v8"}) {
    const TensorId codes = add_state(graph, param, shape, suffix);
    TensorDesc& desc = graph.mutable_tensor(codes);
    desc.dtype = DType::u8;
    desc.host = host;
    out.push_back(codes);
  }
  for (const char* suffix : {"adam_m8_absmax", "adam_v8_absmax"}) {
    out.push_back(add_state(graph, param, blocks, suffix));
  }
  return out;
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
  OptimizerKind kind = config.kind;
  // bnb keeps f32 states for a parameter under min_8bit_size: AdamW's update.
  if (is_8bit_adam(kind) && graph.tensor(p).shape.numel() < kAdam8bitMinElements) kind = OptimizerKind::adamw;
  const bool paged = kind == OptimizerKind::paged_adamw8bit;
  if (graph.tensor(p).dtype != DType::f32) {
    // Mixed precision: the update runs on the f32 master copy and rounds it into the parameter.
    const TensorId master = add_master(graph, p, shape, attrs);
    switch (kind) {
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
      case OptimizerKind::adamw8bit:
      case OptimizerKind::paged_adamw8bit: {
        std::vector<TensorId> updates{p, master};
        for (TensorId s : add_8bit_states(graph, p, shape, paged)) updates.push_back(s);
        graph.add_op(OpKind::adamw8bit_update_mixed, {g}, attrs, name, Role::temporary, Phase::optimizer, updates);
        break;
      }
    }
    return;
  }
  switch (kind) {
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
    case OptimizerKind::adamw8bit:
    case OptimizerKind::paged_adamw8bit: {
      std::vector<TensorId> updates{p};
      for (TensorId s : add_8bit_states(graph, p, shape, paged)) updates.push_back(s);
      graph.add_op(OpKind::adamw8bit_update, {g}, attrs, name, Role::temporary, Phase::optimizer, updates);
      break;
    }
  }
}

EightBitStates eight_bit_states(const Graph& graph) {
  EightBitStates out;
  for (const Op& op : graph.ops()) {
    const bool mixed = op.kind == OpKind::adamw8bit_update_mixed;
    if (op.kind == OpKind::adamw8bit_update || mixed) {
      ++out.quantized_updates;
      const std::size_t first = mixed ? 2 : 1;
      for (std::size_t u = first; u < op.updates.size(); ++u) {
        const TensorDesc& s = graph.tensor(op.updates[u]);
        if (s.dtype == DType::u8) {
          out.code_bytes += s.size_bytes();
          if (s.host) out.paged_bytes += s.size_bytes();
        } else {
          out.absmax_bytes += s.size_bytes();
        }
      }
    } else if (op.kind == OpKind::adamw_update || op.kind == OpKind::adamw_update_mixed) {
      ++out.f32_updates;
      const std::size_t first = op.kind == OpKind::adamw_update_mixed ? 2 : 1;
      for (std::size_t u = first; u < op.updates.size(); ++u) out.f32_state_bytes += graph.tensor(op.updates[u]).size_bytes();
    }
  }
  return out;
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
      case OpKind::adamw8bit_update:
      case OpKind::adamw8bit_update_mixed:
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
