// Mixtures of experts: top-k routing, dispatch of tokens into each expert's slots, the weighted
// combination of the experts' outputs, and the router statistics of the load-balancing loss.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
//
// Routing is a function of the gates alone (a token goes to expert e where gates[n, e] != 0, in
// token order, the first `capacity` kept), so dispatch, combine and their gradients agree on every
// slot without storing an index tensor.
#include <string>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

// gates [N, E]: one row per token of `x` (rows), floating.
void expect_gates(std::string_view op, const TensorDesc& gates, std::int64_t tokens, const std::string& of) {
  expect_float(op, gates);
  expect_rank(op, gates, 2);
  if (gates.shape[0] != tokens) {
    fail(op, "gates '" + gates.name + "' " + gates.shape.to_string() + " must have one row per token of " + of);
  }
}

OutputSpec infer_moe_top_k(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& p = *in[0];
  expect_float("moe_top_k", p);
  expect_rank("moe_top_k", p, 2);
  if (p.shape[1] > kMaxExperts) fail("moe_top_k", "'" + p.name + "' " + p.shape.to_string() + " routes among more than " + str(kMaxExperts) + " experts");
  if (attrs.top_k < 1 || attrs.top_k > p.shape[1]) {
    fail("moe_top_k", "top_k " + str(attrs.top_k) + " must be between 1 and the " + str(p.shape[1]) + " experts of '" +
                          p.name + "' " + p.shape.to_string());
  }
  if (in.size() > 2) fail("moe_top_k", "takes probs and at most a choice bias");
  if (in.size() == 2 && (in[1]->shape != Shape{p.shape[1]} || in[1]->dtype != p.dtype)) {
    fail("moe_top_k", "the choice bias '" + in[1]->name + "' " + in[1]->shape.to_string() + " must be [" + str(p.shape[1]) +
                          "] of the probabilities' dtype");
  }
  if (attrs.expert_groups > 1) {
    const std::int64_t E = p.shape[1], G = attrs.expert_groups;
    if (E % G != 0) fail("moe_top_k", str(E) + " experts do not split into " + str(G) + " groups");
    if (attrs.top_groups < 1 || attrs.top_groups > G || attrs.top_groups * (E / G) < attrs.top_k) {
      fail("moe_top_k", "top_groups " + str(attrs.top_groups) + " of " + str(G) + " groups of " + str(E / G) +
                            " experts cannot hold top_k " + str(attrs.top_k));
    }
  }
  return {p.shape, p.dtype};
}

OutputSpec infer_moe_dispatch(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("moe_dispatch", x);
  expect_rank("moe_dispatch", x, 2);
  expect_gates("moe_dispatch", *in[1], x.shape[0], "'" + x.name + "' " + x.shape.to_string());
  if (attrs.capacity < 1) fail("moe_dispatch", "capacity " + str(attrs.capacity) + " must be at least 1 slot per expert");
  return {Shape{in[1]->shape[1], attrs.capacity, x.shape[1]}, x.dtype};
}

OutputSpec infer_moe_combine(Inputs in, const OpAttrs&) {
  const TensorDesc& ye = *in[0];
  const TensorDesc& gates = *in[1];
  expect_float("moe_combine", ye);
  expect_rank("moe_combine", ye, 3);
  expect_float("moe_combine", gates);
  expect_rank("moe_combine", gates, 2);
  if (gates.shape[1] != ye.shape[0]) {
    fail("moe_combine", "gates '" + gates.name + "' " + gates.shape.to_string() + " must have one column per expert of '" +
                            ye.name + "' " + ye.shape.to_string());
  }
  return {Shape{gates.shape[0], ye.shape[2]}, ye.dtype};
}

OutputSpec infer_moe_router_stats(Inputs in, const OpAttrs&) {
  const TensorDesc& p = *in[0];
  expect_float("moe_router_stats", p);
  expect_rank("moe_router_stats", p, 2);
  expect_same_shape("moe_router_stats", p, *in[1]);
  return {Shape{2, p.shape[1]}, DType::f32};  // counts up to N: exact in f32, not in 16 bits
}

OutputSpec infer_moe_top_k_backward(Inputs in, const OpAttrs&) {
  expect_same_shape("moe_top_k_backward", *in[0], *in[1]);
  expect_same_shape("moe_top_k_backward", *in[1], *in[2]);
  return {in[2]->shape, in[2]->dtype};
}

OutputSpec infer_moe_combine_backward_gates(Inputs in, const OpAttrs&) {
  const TensorDesc& dy = *in[0];
  const TensorDesc& ye = *in[1];
  const TensorDesc& gates = *in[2];
  expect_rank("moe_combine_backward_gates", ye, 3);
  expect_gates("moe_combine_backward_gates", gates, dy.shape[0], "'" + dy.name + "'");
  if (dy.shape.rank() != 2 || dy.shape[1] != ye.shape[2] || gates.shape[1] != ye.shape[0]) {
    fail("moe_combine_backward_gates", "'" + dy.name + "' " + dy.shape.to_string() + ", '" + ye.name + "' " +
                                           ye.shape.to_string() + " and gates " + gates.shape.to_string() + " disagree");
  }
  return {gates.shape, gates.dtype};
}

OutputSpec infer_moe_router_stats_backward(Inputs in, const OpAttrs& attrs) {
  const Shape probs = shape_from_attrs("moe_router_stats_backward", attrs);
  if (probs.rank() != 2 || in[0]->shape != Shape{2, probs[1]}) {
    fail("moe_router_stats_backward", "'" + in[0]->name + "' " + in[0]->shape.to_string() + " must be [2, E] of probs " +
                                          probs.to_string());
  }
  return {probs, attrs.dtype};
}

// A multiply-add per element of every expert's slots.
double flops_moe_combine(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[0]); }
double flops_moe_combine_backward_gates(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[1]); }
double flops_moe_router_stats(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[0]); }

void grad_moe_top_k(GradContext& c, const Op& op, TensorId dy) {
  const TensorId probs = op.inputs[0];
  if (c.needs_grad(probs)) {
    c.accumulate(probs, c.emit(OpKind::moe_top_k_backward, {dy, op.outputs[0], probs}, op.attrs, c.gname(probs)));
  }
}

// Routing is discrete: the gates receive no gradient through the choice of slots, only through
// the weights moe_combine applies.
void grad_moe_dispatch(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  if (c.needs_grad(x)) c.accumulate(x, c.emit(OpKind::moe_combine, {dy, op.inputs[1]}, op.attrs, c.gname(x)));
}

void grad_moe_combine(GradContext& c, const Op& op, TensorId dy) {
  const TensorId ye = op.inputs[0];
  const TensorId gates = op.inputs[1];
  if (c.needs_grad(ye)) {
    OpAttrs attrs = op.attrs;
    attrs.capacity = c.tensor(ye).shape[1];
    c.accumulate(ye, c.emit(OpKind::moe_dispatch, {dy, gates}, attrs, c.gname(ye)));
  }
  if (op.attrs.weighted && c.needs_grad(gates)) {
    c.accumulate(gates, c.emit(OpKind::moe_combine_backward_gates, {dy, ye, gates}, {}, c.gname(gates)));
  }
}

void grad_moe_router_stats(GradContext& c, const Op& op, TensorId dy) {
  const TensorId probs = op.inputs[0];
  if (!c.needs_grad(probs)) return;
  OpAttrs attrs = with_shape({}, c.tensor(probs).shape);
  attrs.dtype = c.tensor(probs).dtype;
  c.accumulate(probs, c.emit(OpKind::moe_router_stats_backward, {dy}, attrs, c.gname(probs)));
}

// clang-format off
constexpr OpInfo kMoeRows[] = {
  {.kind = OpKind::moe_top_k, .name = "moe_top_k", .num_inputs = kVariadic, .num_updates = 0, .num_outputs = 1,
    .infer = infer_moe_top_k, .flops = flops_per_output, .grad = grad_moe_top_k, .split_rows = true, .row_inputs = 0b1},
  // Moving a row costs nothing by this table's count; weighting it is a multiply per element.
  {.kind = OpKind::moe_dispatch, .name = "moe_dispatch", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_moe_dispatch, .flops = flops_per_output, .grad = grad_moe_dispatch},
  {.kind = OpKind::moe_combine, .name = "moe_combine", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_moe_combine, .flops = flops_moe_combine, .grad = grad_moe_combine},
  {.kind = OpKind::moe_router_stats, .name = "moe_router_stats", .num_inputs = 2, .num_updates = 0, .num_outputs = 1,
    .infer = infer_moe_router_stats, .flops = flops_moe_router_stats, .grad = grad_moe_router_stats},
  {.kind = OpKind::moe_top_k_backward, .name = "moe_top_k_backward", .num_inputs = 3, .num_updates = 0, .num_outputs = 1,
    .infer = infer_moe_top_k_backward, .flops = flops_per_output, .split_rows = true, .row_inputs = 0b111},
  {.kind = OpKind::moe_combine_backward_gates, .name = "moe_combine_backward_gates", .num_inputs = 3, .num_updates = 0,
    .num_outputs = 1, .infer = infer_moe_combine_backward_gates, .flops = flops_moe_combine_backward_gates},
  {.kind = OpKind::moe_router_stats_backward, .name = "moe_router_stats_backward", .num_inputs = 1, .num_updates = 0,
    .num_outputs = 1, .infer = infer_moe_router_stats_backward, .flops = flops_zero},
};
// clang-format on

}  // namespace

std::span<const OpInfo> moe_rows() { return kMoeRows; }

}  // namespace memplan::graph
