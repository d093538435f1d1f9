#include "memplan/import/onnx_handlers.h"

#include <array>

#include "memplan/common/check.h"
#include "memplan/import/onnx_import.h"

namespace memplan::import {

std::span<const HandlerRows> handler_families() {
  static const std::array<HandlerRows, 7> families = {activation_handlers(), arithmetic_handlers(), matmul_handlers(),
                                                      conv_pool_handlers(),  norm_handlers(),       shape_handlers(),
                                                      constant_handlers()};
  return families;
}

HandlerTable assemble_handler_table(std::span<const HandlerRows> families) {
  HandlerTable table;
  for (HandlerRows rows : families) {
    for (const HandlerRow& row : rows) {
      MEMPLAN_CHECK(row.handler != nullptr, "ONNX op " << row.op_type << " has no handler");
      // A second row would silently replace the first; two families claiming an op is a bug.
      MEMPLAN_CHECK(table.emplace(std::string(row.op_type), row.handler).second,
                    "ONNX op " << row.op_type << " has handlers in two rows");
    }
  }
  return table;
}

const HandlerTable& handler_table() {
  static const HandlerTable table = assemble_handler_table(handler_families());
  return table;
}

const std::vector<std::string>& supported_onnx_ops() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> v;
    for (const auto& [name, handler] : handler_table()) v.push_back(name);
    return v;
  }();
  return ops;
}

}  // namespace memplan::import
