// The op table assembled from the families' rows (graph/op_*.cpp): one row per OpKind, row i
// stating kind i, op_info returning the row of the kind it was asked for, a kind with two rows or
// none refused, and the rows' in-place inputs and gradient rules consistent with their shapes.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/op.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

TEST(OpTable, RowIStatesKindI) {
  const std::span<const OpInfo> table = op_table();
  for (std::size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(static_cast<int>(table[i].kind), static_cast<int>(i))
        << "row " << i << " ('" << table[i].name << "') states kind " << static_cast<int>(table[i].kind);
  }
}

TEST(OpTable, EveryKindHasExactlyOneRow) {
  const std::span<const OpInfo> table = op_table();
  EXPECT_EQ(table.size(), static_cast<std::size_t>(kOpKindCount)) << "rows for " << kOpKindCount << " op kinds";
  std::vector<int> rows_of_kind(static_cast<std::size_t>(kOpKindCount), 0);
  for (const OpInfo& row : table) {
    const int k = static_cast<int>(row.kind);
    ASSERT_TRUE(k >= 0 && k < kOpKindCount) << "row '" << row.name << "' states kind " << k;
    ++rows_of_kind[static_cast<std::size_t>(k)];
  }
  for (int k = 0; k < kOpKindCount; ++k) {
    EXPECT_EQ(rows_of_kind[static_cast<std::size_t>(k)], 1) << "op kind " << k << " has "
                                                            << rows_of_kind[static_cast<std::size_t>(k)] << " rows";
  }
}

TEST(OpTable, OpInfoReturnsTheRowOfItsKind) {
  for (int k = 0; k < kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    EXPECT_EQ(op_info(kind).kind, kind) << "op_info(" << k << ") returned '" << op_info(kind).name << "'";
    EXPECT_EQ(op_name(kind), op_info(kind).name);
  }
}

TEST(OpTable, RowsAreComplete) {
  std::set<std::string, std::less<>> names;
  for (const OpInfo& row : op_table()) {
    EXPECT_FALSE(row.name.empty()) << "op kind " << static_cast<int>(row.kind) << " has no name";
    EXPECT_TRUE(names.insert(std::string(row.name)).second) << "two rows are named '" << row.name << "'";
    EXPECT_NE(row.infer, nullptr) << row.name;
    EXPECT_NE(row.flops, nullptr) << row.name;
    // An op either produces one tensor or updates tensors in place, never both or neither.
    EXPECT_EQ(row.num_outputs == 0, row.num_updates > 0) << row.name;
    EXPECT_TRUE(row.num_outputs == 0 || row.num_outputs == 1) << row.name;
  }
}

TEST(OpTable, SpotChecksAgainstTheEnum) {
  EXPECT_EQ(op_name(OpKind::matmul), "matmul");
  EXPECT_EQ(op_name(OpKind::max_pool2d_backward), "max_pool2d_backward");
  EXPECT_EQ(op_name(OpKind::adamw_update_mixed), "adamw_update_mixed");
  EXPECT_TRUE(op_info(OpKind::reshape).output_is_view);
  EXPECT_EQ(op_info(OpKind::adamw_update).num_updates, 3);
}

std::vector<OpInfo> all_rows() { return {op_table().begin(), op_table().end()}; }

TEST(OpTable, AKindWithTwoRowsOrNoneIsRefusedNamingIt) {
  std::vector<OpInfo> rows = all_rows();
  const std::span<const OpInfo> complete[] = {rows};
  EXPECT_EQ(assemble_op_table(complete)[3].name, op_table()[3].name);
  OpInfo again = op_info(OpKind::relu);
  again.name = "relu_again";
  const std::span<const OpInfo> one_more(&again, 1);
  const std::span<const OpInfo> duplicated[] = {rows, one_more};
  try {
    assemble_op_table(duplicated);
    FAIL() << "a second row for relu was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("two rows: 'relu' and 'relu_again'"), std::string::npos) << e.what();
  }
  rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(OpKind::gelu));
  const std::span<const OpInfo> missing[] = {rows};
  try {
    assemble_op_table(missing);
    FAIL() << "a table without gelu was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("op kind " + std::to_string(static_cast<int>(OpKind::gelu)) + " has no row"),
              std::string::npos)
        << e.what();
  }
}

// Liveness lets an output take an input's storage by the row's in-place bits alone: only ops
// with one output of that input's shape and dtype may set them.
TEST(OpTable, InPlaceInputsAreInputsOfOpsWithOneOutput) {
  int in_place_ops = 0;
  for (const OpInfo& row : op_table()) {
    if (row.in_place_inputs == 0) continue;
    ++in_place_ops;
    EXPECT_EQ(row.num_outputs, 1) << row.name;
    EXPECT_FALSE(row.output_is_view) << row.name;
    EXPECT_NE(row.num_inputs, kVariadic) << row.name;
    EXPECT_LT(row.in_place_inputs, 1u << row.num_inputs) << row.name << " marks an input it does not have";
  }
  EXPECT_TRUE(op_info(OpKind::add).may_run_in_place(1));
  EXPECT_FALSE(op_info(OpKind::matmul).may_run_in_place(0));
  EXPECT_GE(in_place_ops, 14);
}

TEST(OpTable, GradientRulesBelongToOpsWithAnOutput) {
  for (const OpInfo& row : op_table()) {
    if (row.grad != nullptr) {
      EXPECT_EQ(row.num_outputs, 1) << row.name;
      EXPECT_TRUE(row.name.find("_backward") == std::string_view::npos) << row.name << ": a backward op with a gradient rule";
    }
  }
  EXPECT_NE(op_info(OpKind::matmul).grad, nullptr);
  EXPECT_EQ(op_info(OpKind::adamw_update).grad, nullptr);
}

// An f32 update refuses a 16-bit gradient (that takes the mixed update, with an f32 master copy)
// and the mixed update an f32 one; other ops take every floating dtype.
TEST(OpTable, AnOpRefusesADtypeItsRowDoesNotAccept) {
  Graph g;
  const TensorId w = g.add_tensor({.name = "w", .shape = Shape{4}, .dtype = DType::bf16, .role = Role::parameter});
  const TensorId dw = g.add_tensor({.name = "dw", .shape = Shape{4}, .dtype = DType::bf16, .role = Role::gradient});
  try {
    g.add_op(OpKind::sgd_update, {dw}, {}, "update", Role::temporary, Phase::optimizer, {w});
    FAIL() << "an f32 update took a bf16 gradient";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("sgd_update: 'dw' is bf16; this op takes fp32"), std::string::npos) << e.what();
  }
  const TensorId master = g.add_tensor({.name = "w.master", .shape = Shape{4}, .dtype = DType::f32, .role = Role::optimizer_state});
  EXPECT_NO_THROW(g.add_op(OpKind::sgd_update_mixed, {dw}, {}, "mixed", Role::temporary, Phase::optimizer, {w, master}));
  const TensorId d32 = g.add_tensor({.name = "d32", .shape = Shape{4}, .dtype = DType::f32, .role = Role::gradient});
  EXPECT_THROW(g.add_op(OpKind::sgd_update_mixed, {d32}, {}, "mixed32", Role::temporary, Phase::optimizer, {w, master}),
               GraphError);
  EXPECT_TRUE(op_info(OpKind::gelu).accepts.contains(DType::bf16));
}

}  // namespace
}  // namespace memplan::graph
