#include "memplan/import/onnx_importer.h"

#include <cmath>
#include <utility>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_model.h"

namespace memplan::import {

using graph::DType;
using graph::GraphError;
using graph::Shape;

namespace {

std::string node_label(const onnx::NodeProto& node, std::int64_t opset) {
  return "node '" + (node.name().empty() ? (node.output_size() > 0 ? node.output(0) : std::string("?")) : node.name()) +
         "' (" + node.op_type() + ", opset " + std::to_string(opset) + ")";
}

}  // namespace

Value constant_value(Constant c) {
  Value v;
  v.kind = Value::Kind::constant;
  v.constant = std::move(c);
  return v;
}

Value pending(Value::Kind kind, TensorId id) {
  Value v;
  v.kind = kind;
  v.id = id;
  return v;
}

void Importer::fail(const std::string& why) const { throw GraphError(node_label(*node_, impl_.opset) + ": " + why); }

const Value& Importer::in(int i) const {
  if (i >= node_->input_size() || node_->input(i).empty()) fail("input " + std::to_string(i) + " is missing");
  auto it = values_.find(node_->input(i));
  if (it == values_.end()) fail("input '" + node_->input(i) + "' is used before any node defines it");
  return it->second;
}

std::int64_t Importer::to_int(double v) const {
  if (!(v >= -9.2e18 && v <= 9.2e18)) fail("a constant value " + std::to_string(v) + " does not fit a 64-bit integer");
  return static_cast<std::int64_t>(v);
}

const Value& Importer::loaded(int i) const {
  const Value& v = in(i);
  if (v.kind == Value::Kind::initializer && !v.loaded) {
    // Read on first use as a constant; the map owns the value, so filling it in is invisible to callers.
    Value& m = const_cast<Value&>(v);
    auto c = read_tensor_proto(*v.proto, v.raw);
    if (!c) fail(c.error().message);
    m.constant = std::move(c).value();
    m.loaded = true;
  }
  return v;
}

bool Importer::is_scalar_constant(int i, double* value) const {
  const Value& v = in(i);
  if (v.kind != Value::Kind::constant && v.kind != Value::Kind::initializer) return false;
  if (v.constant.numel() != 1) return false;
  *value = loaded(i).constant.at(0);
  return true;
}

const Constant& Importer::constant(int i) const {
  const Value& v = loaded(i);
  if (v.kind != Value::Kind::constant && v.kind != Value::Kind::initializer) {
    fail("input '" + node_->input(i) + "' must be a constant (known while importing) for memplan to import this node");
  }
  return v.constant;
}

std::vector<std::int64_t> Importer::ints_of(int i) const {
  const Constant& c = constant(i);
  std::vector<std::int64_t> v;
  for (std::int64_t k = 0; k < c.numel(); ++k) {
    const double x = c.at(k);
    if (c.is_float && x != std::floor(x)) fail("input '" + node_->input(i) + "' must hold integers");
    v.push_back(c.is_float ? to_int(x) : c.ints[static_cast<std::size_t>(k)]);
  }
  return v;
}

void Importer::set(int output, Value v) {
  if (output >= node_->output_size() || node_->output(output).empty()) return;
  if (!values_.emplace(node_->output(output), std::move(v)).second) {
    fail("output '" + node_->output(output) + "' is defined a second time");
  }
}

TensorId Importer::constant_buffer(const std::string& name, const graph::Shape& shape, DType dtype,
                                   const std::function<std::vector<float>()>& values) {
  if (auto it = materialized_.find(name); it != materialized_.end()) return it->second;
  const TensorId id = builder_.buffer(name, shape, {}, dtype);
  if (options_.keep_values) out_.initial_values.emplace_back(id, values());
  out_.constant_buffers.push_back(id);
  materialized_.emplace(name, id);
  return id;
}

TensorId Importer::index_buffer(const std::string& name, const graph::Shape& shape, const std::vector<std::int64_t>& values) {
  return constant_buffer(name, shape, DType::i32, [&] {
    // f32 holds these exactly: the caller bounds them by a table's rows
    return std::vector<float>(values.begin(), values.end());
  });
}

TensorId Importer::materialize(const Value& v, const std::string& input_name) {
  switch (v.kind) {
    case Value::Kind::tensor:
      return v.id;
    case Value::Kind::initializer: {
      auto it = materialized_.find(v.name);
      if (it != materialized_.end()) return it->second;
      if (!v.constant.is_float) fail("the integer initializer '" + v.name + "' cannot be used as a float tensor");
      const bool buffer = buffer_names_.count(v.name) > 0;
      const TensorId id = buffer ? builder_.buffer(v.name, Shape(v.constant.dims), {})
                                 : builder_.parameter(v.name, Shape(v.constant.dims), {}, options_.dtype);
      if (options_.keep_values) out_.initial_values.emplace_back(id, float_values(*v.proto, v.raw));
      materialized_.emplace(v.name, id);
      return id;
    }
    case Value::Kind::constant: {
      // A float constant read as a tensor (Swin's shifted-window mask): a buffer holding its values,
      // persistent and never trained, created once however many nodes read it.
      if (!v.constant.is_float) {
        fail("the integer constant '" + input_name + "' is used as a float tensor; memplan reads integer constants as "
             "shapes, axes, indices of a Gather and factors only");
      }
      return constant_buffer(input_name, Shape(v.constant.dims), options_.dtype,
                             [&] { return std::vector<float>(v.constant.floats.begin(), v.constant.floats.end()); });
    }
    case Value::Kind::transposed: {
      auto it = materialized_.find(input_name);
      if (it != materialized_.end()) return it->second;
      const TensorId id = builder_.permute(v.id, {1, 0}, input_name);
      materialized_.emplace(input_name, id);
      return id;
    }
    case Value::Kind::gelu_scaled:
    case Value::Kind::gelu_erf:
    case Value::Kind::gelu_erf1:
    case Value::Kind::gelu_half:
      fail("'" + input_name + "' is part of GELU's Erf decomposition (x * 0.5 * (1 + erf(x / sqrt(2)))) but is used "
           "outside it; memplan imports Erf only within that pattern");
    case Value::Kind::unavailable:
      fail("'" + input_name + "' is an output memplan does not compute (Dropout's mask)");
    case Value::Kind::ln_mean:
    case Value::Kind::ln_centered:
    case Value::Kind::ln_squared:
    case Value::Kind::ln_variance:
    case Value::Kind::ln_variance_eps:
    case Value::Kind::ln_std:
    case Value::Kind::ln_normalized:
    case Value::Kind::ln_scaled:
      fail("'" + input_name + "' is part of LayerNormalization's decomposition (ReduceMean, Sub, Pow, ReduceMean, Add, "
           "Sqrt, Div, Mul by the scale, Add of the bias, over the last axis) but is used outside it; memplan imports "
           "these ops only within that pattern (or export with opset 17 for one LayerNormalization node)");
    case Value::Kind::causal:
      fail("'" + input_name + "' adds a causal mask but is not read by a Softmax over its last axis; memplan imports "
           "an additive mask only as a causal softmax");
  }
  fail("unknown value");
}

TensorId Importer::tensor(int i) { return materialize(in(i), node_->input(i)); }

void Importer::check_fold_size(std::int64_t elements) const {
  if (elements > (std::int64_t{1} << 24)) fail("a constant of " + std::to_string(elements) + " elements is too large to fold");
}

Constant Importer::fold_binary(const Constant& a, const Constant& b, const std::function<double(double, double)>& f) const {
  const std::size_t rank = std::max(a.dims.size(), b.dims.size());
  std::vector<std::int64_t> da(rank, 1), db(rank, 1), dout(rank, 1);
  std::copy(a.dims.begin(), a.dims.end(), da.begin() + static_cast<std::ptrdiff_t>(rank - a.dims.size()));
  std::copy(b.dims.begin(), b.dims.end(), db.begin() + static_cast<std::ptrdiff_t>(rank - b.dims.size()));
  for (std::size_t k = 0; k < rank; ++k) {
    if (da[k] != db[k] && da[k] != 1 && db[k] != 1) fail("constant operands of shapes that do not broadcast");
    dout[k] = std::max(da[k], db[k]);
  }
  Constant c;
  c.dims = dout;
  c.is_float = a.is_float || b.is_float;
  const std::int64_t n = c.numel();
  check_fold_size(n);
  for (std::int64_t idx = 0; idx < n; ++idx) {
    std::int64_t rem = idx, ia = 0, ib = 0, sa = 1, sb = 1;
    for (std::size_t k = rank; k-- > 0;) {
      const std::int64_t coord = rem % dout[k];
      rem /= dout[k];
      ia += (da[k] == 1 ? 0 : coord) * sa;
      ib += (db[k] == 1 ? 0 : coord) * sb;
      sa *= da[k];
      sb *= db[k];
    }
    const double r = f(a.at(ia), b.at(ib));
    if (c.is_float) {
      c.floats.push_back(r);
    } else {
      c.ints.push_back(to_int(r));
    }
  }
  return c;
}

ImportedGraph Importer::run() {
  const onnx::GraphProto& g = impl_.model.graph();
  if (options_.batch <= 0) throw GraphError("the batch size must be positive, got " + std::to_string(options_.batch));
  declare_initializers();
  declare_inputs();
  for (const auto& n : g.node()) import_node(n);
  node_ = nullptr;
  if (g.output_size() == 0) throw GraphError(impl_.source + ": the graph has no outputs");
  std::string output = options_.output.empty() ? g.output(0).name() : options_.output;
  auto it = values_.find(output);
  if (it == values_.end()) {
    std::string names;
    for (const auto& o : g.output()) names += (names.empty() ? "" : ", ") + o.name();
    throw GraphError(impl_.source + ": no value named '" + output + "' (the graph's outputs: " + names + ")");
  }
  if (it->second.kind != Value::Kind::tensor) throw GraphError(impl_.source + ": the output '" + output + "' is not a tensor computed from the inputs");
  out_.graph.output = it->second.id;
  add_loss();
  return std::move(out_);
}

// Float initializers become parameters (or batch-norm state) when a node first reads them as a
// tensor; until then only their dims are read, so planning never touches the weights.
void Importer::declare_initializers() {
  const onnx::GraphProto& g = impl_.model.graph();
  // Batch-norm running statistics are state, not trained parameters.
  for (const auto& n : g.node()) {
    if (n.op_type() == "BatchNormalization") {
      for (int i = 3; i < std::min(n.input_size(), 5); ++i) buffer_names_.insert(n.input(i));
    }
  }
  for (int i = 0; i < g.initializer_size(); ++i) {
    const onnx::TensorProto& t = g.initializer(i);
    auto c = read_tensor_proto(t, impl_.raw_of(i), /*with_data=*/false);
    if (!c) throw GraphError(impl_.source + ": initializer: " + c.error().message);
    Value v;
    v.kind = c.value().is_float ? Value::Kind::initializer : Value::Kind::constant;
    v.name = t.name();
    v.proto = &t;
    v.raw = impl_.raw_of(i);
    v.loaded = !c.value().is_float || c.value().numel() == 0;
    v.constant = std::move(c).value();
    if (!values_.emplace(t.name(), std::move(v)).second) throw GraphError(impl_.source + ": initializer '" + t.name() + "' is defined twice");
  }
}

void Importer::declare_inputs() {
  const onnx::GraphProto& g = impl_.model.graph();
  for (const auto& input : g.input()) {
    if (values_.count(input.name())) continue;  // an initializer also listed as an input (older exports)
    const std::string where = impl_.source + ": graph input '" + input.name() + "'";
    if (!input.type().has_tensor_type()) throw GraphError(where + " is not a tensor");
    const auto& tt = input.type().tensor_type();
    DType dtype;
    switch (tt.elem_type()) {
      case onnx::TensorProto::FLOAT: dtype = options_.dtype; break;
      case onnx::TensorProto::INT64:
      case onnx::TensorProto::INT32: dtype = DType::i32; break;  // token ids
      default: throw GraphError(where + " has ONNX element type " + std::to_string(tt.elem_type()) + "; memplan takes float and integer inputs");
    }
    std::vector<std::int64_t> dims;
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (i == 0) {
        if (d.has_dim_value() && file_batch_ < 0) file_batch_ = d.dim_value();
        dims.push_back(options_.batch);
      } else if (d.has_dim_value() && d.dim_value() > 0) {
        dims.push_back(d.dim_value());
      } else {
        throw GraphError(where + " has a symbolic or unknown dimension " + std::to_string(i) +
                         (d.has_dim_param() ? " ('" + d.dim_param() + "')" : std::string()) +
                         "; memplan replaces only the first (batch) dimension: export with a fixed size for the others");
      }
    }
    if (dims.empty()) throw GraphError(where + " is a scalar; memplan needs a batch dimension");
    const TensorId id = builder_.input(input.name(), Shape(dims), dtype);
    out_.inputs.push_back(id);
    values_.emplace(input.name(), pending(Value::Kind::tensor, id));
  }
  if (out_.inputs.empty()) throw GraphError(impl_.source + ": the graph has no inputs");
}

// One node through its handler. Errors from below (the builder's shape checks, size overflow)
// get the node's label unless they already carry one.
void Importer::import_node(const onnx::NodeProto& n) {
  node_ = &n;
  if (!n.domain().empty() && n.domain() != "ai.onnx") fail("ops of domain '" + n.domain() + "' are not supported");
  const HandlerTable& table = handler_table();
  auto it = table.find(n.op_type());
  if (it == table.end()) {
    std::string list;
    for (const std::string& op : supported_onnx_ops()) list += (list.empty() ? "" : ", ") + op;
    fail("this op is not supported; memplan imports " + list);
  }
  try {
    it->second(*this, n);
  } catch (const graph::SizeError& e) {
    if (std::string_view(e.what()).starts_with("node '")) throw;
    throw graph::SizeError(node_label(n, impl_.opset) + ": " + e.what());
  } catch (const GraphError& e) {
    if (std::string_view(e.what()).starts_with("node '")) throw;
    throw GraphError(node_label(n, impl_.opset) + ": " + e.what());
  }
}

void Importer::add_loss() {
  const TensorId y = out_.graph.output;
  const Shape ys = shape_of(y);
  if (!graph::is_floating(desc(y).dtype)) throw GraphError("the output '" + desc(y).name + "' is not a float tensor");
  if (options_.loss == LossKind::cross_entropy) {
    if (ys.rank() < 2) throw GraphError("cross_entropy needs logits [..., classes]; the output '" + desc(y).name + "' is " + ys.to_string());
    std::vector<std::int64_t> label_dims(ys.dims.begin(), ys.dims.end() - 1);
    out_.labels = builder_.input("labels", Shape(label_dims), DType::i32);
    const TensorId logits = reshape_to(y, Shape{ys.rows(), ys.cols()}, "loss.logits");
    const TensorId labels = reshape_to(out_.labels, Shape{ys.rows()}, "loss.labels");
    out_.graph.loss = builder_.cross_entropy(logits, labels, "loss");
  } else {
    out_.labels = builder_.input("target", ys, desc(y).dtype);
    const TensorId diff = builder_.add(y, builder_.scale(out_.labels, -1.0f, "loss.negated_target"), "loss.diff");
    out_.graph.loss = builder_.mean(builder_.mul(diff, diff, "loss.squared"), "loss");
  }
}

}  // namespace memplan::import
