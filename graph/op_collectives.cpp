// Data-parallel collectives over `world` ranks and the flat layout they move (dist/shard.h states the split).
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <cstdint>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

// Data parallel: flat layouts over `world` ranks (dist/shard.h states the split).
std::int64_t world_of(std::string_view op, const OpAttrs& attrs) {
  if (attrs.world < 1) fail(op, "the number of ranks must be at least 1, got " + str(attrs.world));
  return attrs.world;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

OutputSpec infer_pack(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = world_of("pack", attrs);
  std::int64_t chunk = 0;
  for (const TensorDesc* x : in) {
    expect_float("pack", *x);
    expect_same_dtype("pack", *in[0], *x);
    chunk += ceil_div(x->shape.numel(), world);
  }
  return {Shape{checked_mul(chunk, world)}, in[0]->dtype};
}

OutputSpec infer_all_reduce(Inputs in, const OpAttrs& attrs) {
  world_of("all_reduce", attrs);
  expect_float("all_reduce", *in[0]);
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_reduce_scatter(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = world_of("reduce_scatter", attrs);
  const TensorDesc& x = *in[0];
  expect_float("reduce_scatter", x);
  if (x.shape.rank() != 1 || x.shape[0] % world != 0) {
    fail("reduce_scatter", "'" + x.name + "' " + x.shape.to_string() + " must be flat with a multiple of " + str(world) +
                               " elements (one chunk per rank)");
  }
  return {Shape{x.shape[0] / world}, x.dtype};
}

OutputSpec infer_all_gather(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = world_of("all_gather", attrs);
  const TensorDesc& x = *in[0];
  expect_float("all_gather", x);
  const Shape full = shape_from_attrs("all_gather", attrs);
  if (x.shape.rank() != 1 || x.shape[0] != ceil_div(full.numel(), world)) {
    fail("all_gather", "the shard '" + x.name + "' " + x.shape.to_string() + " of " + full.to_string() + " over " +
                           str(world) + " ranks must be flat with " + str(ceil_div(full.numel(), world)) + " elements");
  }
  return {full, x.dtype};
}

OutputSpec infer_all_gather_into(Inputs, const OpAttrs& attrs) {
  world_of("all_gather_into", attrs);
  return {};
}

// Expert parallelism's exchange: the leading dimension splits into one chunk per rank.
OutputSpec infer_all_to_all(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = world_of("all_to_all", attrs);
  const TensorDesc& x = *in[0];
  expect_float("all_to_all", x);
  if (x.shape.rank() < 1 || x.shape[0] % world != 0) {
    fail("all_to_all", "'" + x.name + "' " + x.shape.to_string() + " must split along its first dimension into " +
                           str(world) + " equal chunks (one per rank)");
  }
  return {x.shape, x.dtype};
}

// Chunk r of x went to rank r as chunk `rank` of its y: the gradient of that chunk comes back the
// same way, by the same exchange of dy.
void grad_all_to_all(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::all_to_all, {dy}, op.attrs, c.gname(op.inputs[0])));
}

// Megatron's g: the sum of a row-parallel layer's partial outputs over the tensor-parallel ranks;
// every rank then holds the same sum, and the gradient of each partial is the sum's own. The
// data-parallel all-reduces are added after the backward pass and never differentiated.
void grad_all_reduce(GradContext& c, const Op& op, TensorId dy) {
  if (op.attrs.group != RankGroup::tensor || op.attrs.alpha != 1.0f) {
    fail("all_reduce", "'" + op.name + "': only a tensor-parallel sum (alpha 1) is differentiated");
  }
  c.accumulate(op.inputs[0], dy);
}

// Sequence parallelism's row gather (graph/tensor_parallel.h: column_input): every rank's shard
// fed every rank's copy of the whole, so a shard's gradient is the sum over the ranks of its rows
// of the whole's gradient: a reduce-scatter. Data-parallel gathers (ZeRO-3's parameters) are
// added after the backward pass and never differentiated.
void grad_all_gather(GradContext& c, const Op& op, TensorId dy) {
  const TensorDesc& whole = c.tensor(op.outputs[0]);
  if (op.attrs.group != RankGroup::tensor || whole.shape.numel() % op.attrs.world != 0) {
    fail("all_gather", "'" + op.name + "': only a tensor-parallel gather of equal shards is differentiated");
  }
  OpAttrs flat;
  flat.shape = {whole.shape.numel()};
  OpAttrs scatter;
  scatter.world = op.attrs.world;
  scatter.group = RankGroup::tensor;
  const TensorId dy_flat = c.emit(OpKind::reshape, {dy}, flat, c.gname(op.outputs[0]) + ".flat");
  c.accumulate(op.inputs[0], c.emit(OpKind::reduce_scatter, {dy_flat}, scatter, c.gname(op.inputs[0])));
}

// Sequence parallelism's reduce-scatter (graph/tensor_parallel.h: row_output): each rank's
// partial fed every rank's shard of the sum, so its gradient is every shard's gradient, gathered.
void grad_reduce_scatter(GradContext& c, const Op& op, TensorId dy) {
  if (op.attrs.group != RankGroup::tensor || op.attrs.alpha != 1.0f) {
    fail("reduce_scatter", "'" + op.name + "': only a tensor-parallel sum (alpha 1) is differentiated");
  }
  OpAttrs gather;
  gather.world = op.attrs.world;
  gather.group = RankGroup::tensor;
  gather.shape = c.tensor(op.inputs[0]).shape.dims;
  c.accumulate(op.inputs[0], c.emit(OpKind::all_gather, {dy}, gather, c.gname(op.inputs[0])));
}

// Reductions across ranks: one add per element this rank contributes (moving bytes is not a FLOP).
double flops_collective_sum(Inputs in, const TensorDesc*) { return numel_of(in[0]); }

// clang-format off
constexpr OpInfo kCollectivesRows[] = {
  {.kind = OpKind::pack, .name = "pack", .num_inputs = kVariadic, .num_updates = 0, .num_outputs = 1,
    .infer = infer_pack, .flops = flops_zero},
  {.kind = OpKind::all_reduce, .name = "all_reduce", .num_inputs = 1, .num_updates = 0, .num_outputs = 1, .output_is_view = true,
    .infer = infer_all_reduce, .flops = flops_collective_sum, .grad = grad_all_reduce, .communicates = true},
  {.kind = OpKind::reduce_scatter, .name = "reduce_scatter", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_reduce_scatter, .flops = flops_collective_sum, .grad = grad_reduce_scatter, .communicates = true},
  {.kind = OpKind::all_gather, .name = "all_gather", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_all_gather, .flops = flops_zero, .grad = grad_all_gather, .communicates = true},
  {.kind = OpKind::all_gather_into, .name = "all_gather_into", .num_inputs = 0, .num_updates = 1, .num_outputs = 0,
    .infer = infer_all_gather_into, .flops = flops_zero, .communicates = true},
  {.kind = OpKind::all_to_all, .name = "all_to_all", .num_inputs = 1, .num_updates = 0, .num_outputs = 1,
    .infer = infer_all_to_all, .flops = flops_zero, .grad = grad_all_to_all, .communicates = true},
};
// clang-format on

}  // namespace

std::span<const OpInfo> collectives_rows() { return kCollectivesRows; }

}  // namespace memplan::graph
