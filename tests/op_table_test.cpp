// graph/op.cpp's op table: one row per OpKind, row i stating kind i, and op_info returning the
// row of the kind it was asked for. A row added out of order, left out or duplicated fails here.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "memplan/graph/op.h"

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

}  // namespace
}  // namespace memplan::graph
