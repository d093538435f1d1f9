#include "memplan/graph/autograd.h"

#include <vector>

#include "memplan/common/check.h"
#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/tensor_parallel.h"

namespace memplan::graph {

bool has_gradient_rule(OpKind kind) {
  return op_info(kind).grad != nullptr;
}

void append_backward(Graph& graph, TensorId loss) {
  const TensorDesc& loss_desc = graph.tensor(loss);
  if (loss_desc.shape.numel() != 1 || loss_desc.dtype != DType::f32) {
    throw GraphError("the loss '" + loss_desc.name + "' must be an f32 scalar, got " +
                     std::string(dtype_name(loss_desc.dtype)) + " " + loss_desc.shape.to_string());
  }
  const int forward_ops = graph.num_ops();

  // A tensor needs a gradient if a parameter that trains reaches it and it reaches the loss.
  std::vector<bool> from_param(static_cast<std::size_t>(graph.num_tensors()), false);
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    from_param[static_cast<std::size_t>(id)] = graph.tensor(id).role == Role::parameter && !graph.tensor(id).frozen;
  }
  for (const Op& op : graph.ops()) {
    bool any = false;
    for (TensorId in : op.inputs) any = any || from_param[static_cast<std::size_t>(in)];
    for (TensorId out : op.outputs) from_param[static_cast<std::size_t>(out)] = any;
  }
  std::vector<bool> to_loss(from_param.size(), false);
  to_loss[static_cast<std::size_t>(loss)] = true;
  for (int i = forward_ops - 1; i >= 0; --i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    bool reaches = false;
    for (TensorId out : op.outputs) reaches = reaches || to_loss[static_cast<std::size_t>(out)];
    if (reaches) {
      for (TensorId in : op.inputs) to_loss[static_cast<std::size_t>(in)] = true;
    }
  }
  std::vector<bool> needs(from_param.size());
  for (std::size_t i = 0; i < needs.size(); ++i) needs[i] = from_param[i] && to_loss[i];
  if (!needs[static_cast<std::size_t>(loss)]) {
    throw GraphError("the loss '" + loss_desc.name + "' does not depend on any parameter that trains");
  }

  GradContext ctx(graph, std::move(needs));
  OpAttrs seed;
  seed.alpha = 1.0f;
  seed.loss_scaled = true;  // times the step's loss scale: 1 but under fp16 loss scaling
  seed.shape = loss_desc.shape.dims;
  ctx.accumulate(loss, ctx.emit(OpKind::fill, {}, seed, "d(" + loss_desc.name + ")"));

  // Every consumer of an op's output comes after it, so visiting forward ops in reverse sees
  // each output's gradient complete before it is propagated.
  for (int i = forward_ops - 1; i >= 0; --i) {
    const Op op = graph.ops()[static_cast<std::size_t>(i)];  // copy: emitting grows ops()
    if (op.outputs.empty()) continue;
    const TensorId dy = ctx.grad(op.outputs[0]);
    if (dy == kNoTensor) continue;
    const GradRule rule = op_info(op.kind).grad;
    if (rule == nullptr) {
      throw GraphError("no gradient rule for op '" + std::string(op_name(op.kind)) + "' ('" +
                       op.name + "')");
    }
    rule(ctx, op, dy);
  }
  for (TensorId p : graph.parameters()) graph.mutable_tensor(p).grad = ctx.grad(p);
  // Sequence parallelism: gathered rows are gathered again for the backward pass, not kept.
  regather_rows_for_backward(graph);
}

}  // namespace memplan::graph
