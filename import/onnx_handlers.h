// ONNX op handlers: free functions `void(Importer&, const onnx::NodeProto&)`, grouped by family in
// onnx_handlers_<family>.cpp, each family exposing its rows (op type -> handler). One table is
// assembled from the families; an op type claimed twice is a bug, caught when the table is built.
// Adding an op: write its handler in its family's file and add one row there (docs/onnx_import.md).
// Internal to import/ (onnx_import.h is the interface).
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>

namespace onnx {
class NodeProto;
}

namespace memplan::import {

class Importer;

using OnnxHandler = void (*)(Importer&, const onnx::NodeProto&);

struct HandlerRow {
  std::string_view op_type;
  OnnxHandler handler;
};
using HandlerRows = std::span<const HandlerRow>;

// The families.
HandlerRows activation_handlers();   // Relu, Sigmoid, Tanh, Clip, Gelu and its Erf form, Softmax, Dropout
HandlerRows arithmetic_handlers();   // Add, Sub, Mul, Div, Pow
HandlerRows matmul_handlers();       // Gemm, MatMul
HandlerRows conv_pool_handlers();    // Conv and the pools
HandlerRows norm_handlers();         // BatchNormalization, LayerNormalization and its ReduceMean/Sqrt steps
HandlerRows shape_handlers();        // Reshape, Transpose, Concat, Slice, Gather, ...
HandlerRows constant_handlers();     // Constant, Shape, Range, ... (folded while importing)

using HandlerTable = std::map<std::string, OnnxHandler, std::less<>>;

// Every family, as the table is built from them.
std::span<const HandlerRows> handler_families();
// One table from `families`; MEMPLAN_CHECK fails (InternalError) on an op type in two rows.
HandlerTable assemble_handler_table(std::span<const HandlerRows> families);
// The importer's table: assemble_handler_table(handler_families()), built once.
const HandlerTable& handler_table();

}  // namespace memplan::import
