// The importer core: one import at one batch. It declares the initializers and graph inputs,
// walks the nodes in file order keeping the name -> Value map, and hands each node to its
// handler (onnx_handlers.h); handlers read operands and attributes and set outputs through the
// calls below. Internal to import/ (onnx_import.h is the interface).
//
// A node's operands are Values: graph tensors, constants (folded on the host: Shape arithmetic,
// Constant nodes, integer initializers), or a few recognised pending forms (a transposed 2-D
// parameter, GELU's Erf decomposition, an additive causal mask, LayerNormalization's
// ReduceMean/Sub/Pow/Sqrt/Div decomposition) that become one memplan op at their consumer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <onnx/onnx_pb.h>

#include "memplan/graph/builder.h"
#include "memplan/import/onnx_import.h"
#include "memplan/import/onnx_tensor.h"

namespace memplan::import {

struct Value {
  enum class Kind {
    tensor, constant, initializer, transposed, gelu_scaled, gelu_erf, gelu_erf1, gelu_half, causal, unavailable,
    // LayerNormalization as opsets before 17 export it, step by step over the last axis of x (id):
    // mean(x), x - mean, (x - mean)^2, its mean (the variance), + eps, sqrt, (x - mean) / that,
    // times gamma; + beta makes the layer_norm op.
    ln_mean, ln_centered, ln_squared, ln_variance, ln_variance_eps, ln_std, ln_normalized, ln_scaled
  };
  Kind kind = Kind::tensor;
  TensorId id = kNoTensor;  // tensor, transposed (the parameter), gelu_*/causal (their x)
  Constant constant;        // constant, initializer (its values)
  std::string name;         // initializer: its ONNX name
  const onnx::TensorProto* proto = nullptr;  // initializer: its values, read when first needed
  std::string_view raw;                      // initializer: its raw_data bytes (in the file)
  bool loaded = true;                        // constant.floats/ints hold the values
  float eps = 0.0f;                          // ln_variance_eps and later: the epsilon
  TensorId gamma = kNoTensor;                // ln_scaled: the scale
};

Value constant_value(Constant c);
Value pending(Value::Kind kind, TensorId id);

class Importer {
 public:
  Importer(const OnnxModel::Impl& impl, const ImportOptions& options)
      : impl_(impl), options_(options), builder_(out_.graph) {}

  ImportedGraph run();

  // ---- What handlers use; all of it is about the node being imported. ----

  // Refuses the node: a GraphError whose message starts with the node's name, op type and opset.
  [[noreturn]] void fail(const std::string& why) const;

  // Operands.
  const Value& in(int i) const;
  bool has_in(int i) const { return i < node_->input_size() && !node_->input(i).empty(); }
  TensorId tensor(int i);                  // the operand as a graph tensor (pending forms materialised)
  const Constant& constant(int i) const;  // the operand as a constant (values loaded), or fail
  const Value& loaded(int i) const;        // in(i) with an initializer's values read
  bool is_constant(int i) const {
    const Value& v = in(i);
    return v.kind == Value::Kind::constant || (v.kind == Value::Kind::initializer && !v.constant.is_float);
  }
  bool is_scalar_constant(int i, double* value) const;
  std::vector<std::int64_t> ints_of(int i) const;

  // Outputs.
  void set(int output, Value v);
  void set_tensor(int output, TensorId id) {
    Value v;
    v.id = id;
    set(output, std::move(v));
  }
  std::string out_name(int i = 0) const { return node_->output(i); }

  // Attributes (read once per node).
  const onnx::AttributeProto* attr(const std::string& name) const {
    for (const auto& a : node_->attribute()) {
      if (a.name() == name) return &a;
    }
    return nullptr;
  }
  std::int64_t attr_int(const std::string& name, std::int64_t fallback) const {
    const auto* a = attr(name);
    return a ? a->i() : fallback;
  }
  float attr_float(const std::string& name, float fallback) const {
    const auto* a = attr(name);
    return a ? a->f() : fallback;
  }
  std::vector<std::int64_t> attr_ints(const std::string& name) const {
    const auto* a = attr(name);
    if (!a) return {};
    return {a->ints().begin(), a->ints().end()};
  }
  std::int64_t axis_of(std::int64_t axis, int rank) const {
    if (axis < -rank || axis >= std::max(rank, 1)) fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
    return axis < 0 ? axis + rank : axis;
  }

  // The graph being built.
  graph::Builder& builder() { return builder_; }
  graph::Graph& graph() { return out_.graph; }
  const graph::TensorDesc& desc(TensorId id) const { return out_.graph.tensor(id); }
  graph::Shape shape_of(TensorId id) const { return desc(id).shape; }
  TensorId reshape_to(TensorId x, const graph::Shape& shape, const std::string& name) {
    if (shape_of(x) == shape) return x;
    return builder_.reshape(x, shape, name);
  }
  // x (n elements, any shape) repeated as every row of a [rows, n] tensor: zeros plus x as a bias,
  // so x's gradient sums the rows (Expand over leading dims, a per-channel factor over the batch).
  TensorId repeat_as_rows(TensorId x, std::int64_t rows, const std::string& name) {
    const std::int64_t n = shape_of(x).numel();
    const TensorId zeros = builder_.fill(graph::Shape{rows, n}, 0.0f, desc(x).dtype, name + ".zeros");
    return builder_.bias_add(zeros, reshape_to(x, graph::Shape{n}, name + ".row"), name + ".rows");
  }
  // A value as a graph tensor named `input_name` where it needs one (constants and initializers
  // become persistent tensors, pending forms their op); once per name.
  TensorId materialize(const Value& v, const std::string& input_name);
  // Constant integer indices as a persistent i32 tensor (a buffer: not trained), holding `values`
  // from the first step on; one per constant `name`, however many nodes read it.
  TensorId index_buffer(const std::string& name, const graph::Shape& shape, const std::vector<std::int64_t>& values);
  const ImportOptions& options() const { return options_; }
  std::int64_t file_batch() const { return file_batch_; }  // the first input's static batch in the file, or -1

  // The next step of LayerNormalization's decomposition when in(i) is at step `from` over x.
  bool ln_step(int i, Value::Kind from, TensorId x = kNoTensor) const {
    const Value& v = in(i);
    return v.kind == from && (x == kNoTensor || v.id == x);
  }
  Value ln_value(Value::Kind kind, const Value& from) const {
    Value v = from;
    v.kind = kind;
    return v;
  }

  // A folded value as an integer; a value no int64 holds (NaN, infinite, too large) is refused.
  std::int64_t to_int(double v) const;
  // Refuses a folded constant of more than 2^24 elements, before it is allocated: folding is for
  // shapes, masks and indices.
  void check_fold_size(std::int64_t elements) const;
  // Integer/float arithmetic on two constants with numpy broadcasting (shape computations).
  Constant fold_binary(const Constant& a, const Constant& b, const std::function<double(double, double)>& f) const;

 private:
  // A persistent buffer named `name` holding a constant (its values computed only when kept):
  // not trained, listed in ImportedGraph::constant_buffers, created once per name.
  TensorId constant_buffer(const std::string& name, const graph::Shape& shape, graph::DType dtype,
                           const std::function<std::vector<float>()>& values);
  void declare_initializers();
  void declare_inputs();
  void import_node(const onnx::NodeProto& n);
  void add_loss();

  const OnnxModel::Impl& impl_;
  const ImportOptions& options_;
  ImportedGraph out_;
  graph::Builder builder_;
  std::unordered_map<std::string, Value> values_;
  std::unordered_map<std::string, TensorId> materialized_;  // initializer or pending value -> its tensor
  std::set<std::string> buffer_names_;  // initializers that are batch-norm running statistics
  std::int64_t file_batch_ = -1;
  const onnx::NodeProto* node_ = nullptr;
};

}  // namespace memplan::import
