// The ONNX handler table: assembled from its families with no op type claimed twice (a second
// row is an error, never a silent overwrite), and in step with the "Supported ops" table of
// docs/onnx_import.md: every op listed there has a handler and every handler is listed.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "memplan/common/check.h"
#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_import.h"

namespace memplan {
namespace {

using import::HandlerRow;
using import::HandlerRows;

TEST(OnnxHandlers, EveryFamilyRowIsInTheTableOnce) {
  std::map<std::string, int> families_of;
  std::size_t rows = 0;
  for (HandlerRows family : import::handler_families()) {
    for (const HandlerRow& row : family) {
      ++families_of[std::string(row.op_type)];
      ++rows;
      EXPECT_NE(row.handler, nullptr) << row.op_type;
    }
  }
  for (const auto& [op, n] : families_of) EXPECT_EQ(n, 1) << op << " has " << n << " rows";
  ASSERT_NO_THROW(import::handler_table());
  const import::HandlerTable& table = import::handler_table();
  EXPECT_EQ(table.size(), rows);
  for (HandlerRows family : import::handler_families()) {
    for (const HandlerRow& row : family) {
      auto it = table.find(row.op_type);
      ASSERT_NE(it, table.end()) << row.op_type;
      EXPECT_EQ(it->second, row.handler) << row.op_type;
    }
  }
  EXPECT_EQ(import::supported_onnx_ops().size(), rows);
}

TEST(OnnxHandlers, AnOpTypeInTwoFamiliesIsAnErrorNotAnOverwrite) {
  const import::OnnxHandler relu = import::handler_table().at("Relu");
  const import::OnnxHandler tanh = import::handler_table().at("Tanh");
  const HandlerRow first[] = {{"Relu", relu}};
  const HandlerRow second[] = {{"Tanh", tanh}, {"Relu", tanh}};
  const HandlerRows clashing[] = {first, second};
  try {
    (void)import::assemble_handler_table(clashing);
    ADD_FAILURE() << "a table with Relu in two families was assembled";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("Relu"), std::string::npos) << e.what();
  }
  const HandlerRow other[] = {{"Tanh", tanh}};
  const HandlerRows distinct[] = {first, other};
  const import::HandlerTable table = import::assemble_handler_table(distinct);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table.at("Relu"), relu);
  EXPECT_EQ(table.at("Tanh"), tanh);
}

// `text` without its `code spans` and (parenthesised remarks), outermost first.
std::string without_remarks(const std::string& text) {
  std::string no_code;
  bool in_code = false;
  for (char c : text) {
    if (c == '`') {
      in_code = !in_code;
    } else if (!in_code) {
      no_code += c;
    }
  }
  std::string out;
  int depth = 0;
  for (char c : no_code) {
    if (c == '(') ++depth;
    if (depth == 0) out += c;
    if (c == ')' && depth > 0) --depth;
  }
  return out;
}

// The op types the first column of the docs' "Supported ops" table names: op types separated by
// commas or "and", with remarks in parentheses or code spans. Anything else in that column
// fails the test, so a cell the parser misreads cannot pass for a missing op.
std::set<std::string> documented_ops() {
  const std::string path = std::string(MEMPLAN_TEST_SOURCE_DIR) + "/../docs/onnx_import.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::string line;
  while (std::getline(in, line) && line != "## Supported ops") {
  }
  std::set<std::string> ops;
  int row = 0;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("|", 0) != 0) {
      if (in_table) break;
      continue;
    }
    in_table = true;
    if (row++ < 2) continue;  // the header and the |---| line
    std::string cell = without_remarks(line.substr(1, line.find('|', 1) - 1));
    for (char& c : cell) c = c == ',' ? ' ' : c;
    std::istringstream words(cell);
    for (std::string word; words >> word;) {
      if (word == "and") continue;
      bool op_type = std::isupper(static_cast<unsigned char>(word[0])) != 0;
      for (char c : word) op_type = op_type && std::isalnum(static_cast<unsigned char>(c)) != 0;
      EXPECT_TRUE(op_type) << "'" << word << "' in the row '" << line.substr(0, 60) << "' is not an op type";
      ops.insert(word);
    }
  }
  return ops;
}

TEST(OnnxHandlers, TheDocsListExactlyTheOpsThatHaveHandlers) {
  const std::set<std::string> documented = documented_ops();
  ASSERT_GT(documented.size(), 10u) << "docs/onnx_import.md has no Supported ops table";
  const import::HandlerTable& table = import::handler_table();
  for (const std::string& op : documented) {
    EXPECT_TRUE(table.count(op)) << "docs/onnx_import.md lists " << op << " as supported, but no family has a row for it";
  }
  for (const auto& [op, handler] : table) {
    EXPECT_TRUE(documented.count(op)) << op << " has a handler, but docs/onnx_import.md's Supported ops table does not list it";
  }
}

}  // namespace
}  // namespace memplan
