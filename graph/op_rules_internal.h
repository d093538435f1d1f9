// What the op families (graph/op_*.cpp) share: argument checks that throw GraphError naming the
// op, output specs and FLOP counts several families use. Internal to graph/.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "memplan/graph/op.h"

namespace memplan::graph {

// Each family's rows, in any order; op.cpp assembles them into the table by kind.
std::span<const OpInfo> elementwise_rows();
std::span<const OpInfo> layout_rows();
std::span<const OpInfo> losses_rows();
std::span<const OpInfo> normalization_rows();
std::span<const OpInfo> matmul_attention_rows();
std::span<const OpInfo> conv_pool_rows();
std::span<const OpInfo> optimizer_updates_rows();
std::span<const OpInfo> collectives_rows();
std::span<const OpInfo> decode_rows();
std::span<const OpInfo> moe_rows();
std::span<const OpInfo> tensor_parallel_rows();
std::span<const OpInfo> quant_rows();
// The table indexed by kind from the families' rows; a kind with two rows or none, or a row
// without its shape or FLOP rule, fails (MEMPLAN_CHECK) naming it.
std::array<OpInfo, kOpKindCount> assemble_op_table(std::span<const std::span<const OpInfo>> families);

namespace op_rules {

using Inputs = std::span<const TensorDesc* const>;

[[noreturn]] void fail(std::string_view op, const std::string& what);
// Floating-point operands: f32 executes; f16 and bf16 are planned (mixed-precision accounting).
void expect_float(std::string_view op, const TensorDesc& t);
void expect_same_dtype(std::string_view op, const TensorDesc& a, const TensorDesc& b);
void expect_same_shape(std::string_view op, const TensorDesc& a, const TensorDesc& b);
Shape shape_from_attrs(std::string_view op, const OpAttrs& attrs);
OutputSpec infer_backward_like_second(Inputs in, const OpAttrs&);
OutputSpec infer_update(Inputs, const OpAttrs&);
std::string str(std::int64_t v);
void expect_rank(std::string_view op, const TensorDesc& t, int rank);
OutputSpec infer_shape_attr(Inputs in, const OpAttrs& attrs);
OutputSpec infer_like_second(Inputs in, const OpAttrs&);
double numel_of(const TensorDesc* t);
// Ops that only move or generate data count 0: reshape (a view), permute, im2col, the
// embedding gather, repeat_heads, concat and slice (copies), fill, and dropout_mask (random
// bits, no arithmetic). Checkpointing's recompute overhead is measured with this table, so
// recomputing these is free by this count.
double flops_zero(Inputs, const TensorDesc*);
double flops_per_output(Inputs, const TensorDesc* out);
double flops_per_input(Inputs in, const TensorDesc*);
double flops_3_per_output(Inputs, const TensorDesc* out);
double flops_4_per_output(Inputs, const TensorDesc* out);
// Scatter-adds: one add per element scattered.
double flops_per_input0(Inputs in, const TensorDesc*);
OpAttrs with_shape(OpAttrs attrs, const Shape& shape);
OpAttrs slice_attrs(std::int64_t axis, std::int64_t start, std::int64_t length);

}  // namespace op_rules
}  // namespace memplan::graph
