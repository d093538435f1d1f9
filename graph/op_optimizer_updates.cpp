// Optimizer updates: in-place ops on parameters and their state (fp32, and 16-bit with an fp32 master copy).
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.

#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

constexpr DTypeSet kF32Only = DTypeSet::of({DType::f32});
constexpr DTypeSet k16Bit = DTypeSet::of({DType::f16, DType::bf16});

double flops_sgd(Inputs in, const TensorDesc*) { return 4.0 * numel_of(in[0]); }

double flops_adamw(Inputs in, const TensorDesc*) { return 14.0 * numel_of(in[0]); }

// 8-bit AdamW also dequantizes both moments, finds each block's new absmax and searches the
// 256-value maps (8 comparisons) for each moment's new code.
double flops_adamw8bit(Inputs in, const TensorDesc*) { return 36.0 * numel_of(in[0]); }

// Mixed updates also round the master copy into the 16-bit parameter.
double flops_sgd_mixed(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[0]); }

double flops_adamw_mixed(Inputs in, const TensorDesc*) { return 15.0 * numel_of(in[0]); }

OutputSpec infer_grads_finite(Inputs in, const OpAttrs&) {
  for (const TensorDesc* t : in) expect_float("grads_finite", *t);
  return {Shape{}, DType::f32};
}

double flops_grads_finite(Inputs in, const TensorDesc*) {
  double n = 0.0;
  for (const TensorDesc* t : in) n += numel_of(t);
  return n;
}

// clang-format off
constexpr OpInfo kOptimizerUpdatesRows[] = {
  {.kind = OpKind::sgd_update, .name = "sgd_update", .num_inputs = 1, .num_updates = 1, .num_outputs = 0,
    .infer = infer_update, .flops = flops_sgd, .accepts = kF32Only},
  {.kind = OpKind::sgd_momentum_update, .name = "sgd_momentum_update", .num_inputs = 1, .num_updates = 2, .num_outputs = 0,
    .infer = infer_update, .flops = flops_sgd, .accepts = kF32Only},
  {.kind = OpKind::adamw_update, .name = "adamw_update", .num_inputs = 1, .num_updates = 3, .num_outputs = 0,
    .infer = infer_update, .flops = flops_adamw, .accepts = kF32Only},
  {.kind = OpKind::sgd_update_mixed, .name = "sgd_update_mixed", .num_inputs = 1, .num_updates = 2, .num_outputs = 0,
    .infer = infer_update, .flops = flops_sgd_mixed, .accepts = k16Bit},
  {.kind = OpKind::sgd_momentum_update_mixed, .name = "sgd_momentum_update_mixed", .num_inputs = 1, .num_updates = 3, .num_outputs = 0,
    .infer = infer_update, .flops = flops_sgd_mixed, .accepts = k16Bit},
  {.kind = OpKind::adamw_update_mixed, .name = "adamw_update_mixed", .num_inputs = 1, .num_updates = 4, .num_outputs = 0,
    .infer = infer_update, .flops = flops_adamw_mixed, .accepts = k16Bit},
  {.kind = OpKind::adamw8bit_update, .name = "adamw8bit_update", .num_inputs = 1, .num_updates = 5, .num_outputs = 0,
    .infer = infer_update, .flops = flops_adamw8bit, .accepts = kF32Only},
  {.kind = OpKind::adamw8bit_update_mixed, .name = "adamw8bit_update_mixed", .num_inputs = 1, .num_updates = 6, .num_outputs = 0,
    .infer = infer_update, .flops = flops_adamw8bit, .accepts = k16Bit},
  {.kind = OpKind::grads_finite, .name = "grads_finite", .num_inputs = kVariadic, .num_updates = 0, .num_outputs = 1,
    .infer = infer_grads_finite, .flops = flops_grads_finite, .gates_updates = true},
};
// clang-format on

}  // namespace

std::span<const OpInfo> optimizer_updates_rows() { return kOptimizerUpdatesRows; }

}  // namespace memplan::graph
