// ONNX import: a .onnx file's forward graph as a memplan forward graph with a loss, at any batch.
// Initializers become parameters (their values kept), graph inputs become inputs whose first
// dimension is the batch, and each ONNX node maps onto memplan ops (docs/onnx_import.md lists
// the supported ops). Protobuf stays inside import/: this header names none of it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"

namespace memplan::import {

// The loss an imported graph trains with, on its output: cross-entropy of logits [..., C]
// against i32 class labels [...], or the mean squared error against a target of the output's shape.
enum class LossKind : std::uint8_t { cross_entropy, mse };
inline constexpr EnumName<LossKind> kLossKindNames[] = {{"cross_entropy", LossKind::cross_entropy},
                                                        {"mse", LossKind::mse}};

struct ImportOptions {
  std::int64_t batch = 1;  // replaces the first dimension of every graph input
  LossKind loss = LossKind::cross_entropy;
  std::string output;                  // the graph output the loss reads; empty: the first one
  graph::DType dtype = graph::DType::f32;  // of parameters, inputs and activations (16-bit: planning only)
  bool keep_values = true;  // copy the initializers' values into ImportedGraph::initial_values (not for planning)
  // false: the graph as evaluation runs it (batch normalization reads its running statistics,
  // Dropout passes its input through), for test accuracy after training.
  bool training = true;
};

// A forward graph built from an ONNX model, with what training needs beside it.
struct ImportedGraph {
  graph::Graph graph;  // forward ops, graph.output = the named output, graph.loss = the loss
  // Each parameter's (and batch-norm statistic's) values from the file's initializers, in the
  // order the graph created them.
  std::vector<std::pair<TensorId, std::vector<float>>> initial_values;
  // Of those, the buffers the import made from constants (a Gather's indices, a folded mask):
  // values of the graph, not initializers of the file, so never written back to it.
  std::vector<TensorId> constant_buffers;
  std::vector<TensorId> inputs;  // the graph inputs, in the file's order
  TensorId labels = kNoTensor;   // i32 class labels (cross_entropy) or an f32 target (mse)
};

class OnnxModel {
 public:
  // Reads and parses `path` (a regular file of at most 2 GiB: protobuf's limit); an Error names
  // the file and what is wrong with it.
  static Result<std::shared_ptr<const OnnxModel>> load(const std::string& path);
  // Parses a serialized ModelProto; `source` names it in messages.
  static Result<std::shared_ptr<const OnnxModel>> parse(std::string_view bytes, const std::string& source);

  // The forward graph at `options.batch`. Throws graph::GraphError naming the node (its name and
  // op type, and the opset) when the model uses something memplan cannot import or its shapes
  // disagree, graph::SizeError when the sizes cannot be represented at this batch.
  ImportedGraph build(const ImportOptions& options) const;
  // The same as a Result (for callers that do not tell the two apart).
  Result<ImportedGraph> try_build(const ImportOptions& options) const;

  // The file's serialized bytes with every initializer that names a tensor in `values` replaced
  // by those values (f32): a trained model written back in the format it came in.
  Result<std::string> with_initializers(const std::vector<std::pair<std::string, std::vector<float>>>& values) const;

  std::int64_t opset() const;
  const std::string& source() const;

  struct Impl;
  explicit OnnxModel(std::unique_ptr<Impl> impl);
  static Result<std::shared_ptr<const OnnxModel>> finish(std::unique_ptr<Impl> impl, const std::string& source);
  ~OnnxModel();

 private:
  std::unique_ptr<Impl> impl_;
};

// The ONNX op types the importer maps, sorted (error messages and docs list them).
const std::vector<std::string>& supported_onnx_ops();

}  // namespace memplan::import
