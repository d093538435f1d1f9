#include "memplan/graph/op.h"

#include <array>

#include "memplan/common/check.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {

std::array<OpInfo, kOpKindCount> assemble_op_table(std::span<const std::span<const OpInfo>> families) {
  std::array<OpInfo, kOpKindCount> table{};
  for (const std::span<const OpInfo> rows : families) {
    for (const OpInfo& row : rows) {
      const auto index = static_cast<std::size_t>(row.kind);
      MEMPLAN_CHECK(index < table.size(), "op row '" << row.name << "' states no valid kind");
      MEMPLAN_CHECK(table[index].infer == nullptr,
                    "op kind " << index << " has two rows: '" << table[index].name << "' and '" << row.name << "'");
      MEMPLAN_CHECK(row.infer != nullptr && row.flops != nullptr, "op row '" << row.name << "' lacks its shape or FLOP rule");
      table[index] = row;
    }
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    MEMPLAN_CHECK(table[i].infer != nullptr, "op kind " << i << " has no row in any op family's file");
  }
  return table;
}

namespace {

const std::array<OpInfo, kOpKindCount>& table() {
  static const std::array<OpInfo, kOpKindCount> instance = [] {
    const std::span<const OpInfo> families[] = {elementwise_rows(),    layout_rows(),         losses_rows(),
                                                normalization_rows(),  matmul_attention_rows(), conv_pool_rows(),
                                                optimizer_updates_rows(), collectives_rows(), decode_rows(),
                                                moe_rows(),            tensor_parallel_rows(), quant_rows()};
    return assemble_op_table(families);
  }();
  return instance;
}

}  // namespace

const OpInfo& op_info(OpKind kind) {
  const auto index = static_cast<std::size_t>(kind);
  MEMPLAN_CHECK(index < table().size(), "op kind " << index << " is out of range");
  return table()[index];
}

std::span<const OpInfo> op_table() { return table(); }

bool fusable_pair(OpKind first, OpKind second) {
  return (first == OpKind::im2col && (second == OpKind::conv2d || second == OpKind::conv2d_backward_weight)) ||
         (first == OpKind::conv2d_backward_cols && second == OpKind::col2im);
}

std::string_view rank_group_name(RankGroup group) {
  switch (group) {
    case RankGroup::tensor: return "tensor-parallel";
    case RankGroup::expert: return "expert-parallel";
    case RankGroup::expert_data: return "expert-data-parallel";
    case RankGroup::data: break;
  }
  return "data-parallel";
}

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::recompute: return "recompute";
  }
  MEMPLAN_CHECK(false, "unknown phase");
}

}  // namespace memplan::graph
