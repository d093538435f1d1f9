// ONNX ModelProto -> memplan forward graph. One handler per ONNX op type in one table; a node's
// operands are Values: graph tensors, constants (folded on the host: Shape arithmetic, Constant
// nodes, integer initializers), or a few recognised pending forms (a transposed 2-D parameter,
// GELU's Erf decomposition, an additive causal mask, LayerNormalization's ReduceMean/Sub/Pow/Sqrt/
// Div decomposition) that become one memplan op at their consumer.
#include "memplan/import/onnx_import.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include <sys/mman.h>

#include <onnx/onnx_pb.h>

#include "memplan/common/input_file.h"
#include "memplan/graph/builder.h"

namespace memplan::import {

using graph::DType;
using graph::GraphError;
using graph::Shape;

namespace {

// Protobuf refuses messages past 2 GiB; so does the reader, before reading them.
constexpr Bytes kMaxOnnxBytes = (Bytes{1} << 31) - 1;

// A constant known while importing: integer (shapes, indices, axes) or floating (scalars, masks).
struct Constant {
  std::vector<std::int64_t> dims;
  bool is_float = false;
  std::vector<std::int64_t> ints;
  std::vector<double> floats;
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : dims) n = graph::checked_mul(n, d);
    return n;
  }
  double at(std::int64_t i) const {
    return is_float ? floats[static_cast<std::size_t>(i)] : static_cast<double>(ints[static_cast<std::size_t>(i)]);
  }
};

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

std::string node_label(const onnx::NodeProto& node, std::int64_t opset) {
  return "node '" + (node.name().empty() ? (node.output_size() > 0 ? node.output(0) : std::string("?")) : node.name()) +
         "' (" + node.op_type() + ", opset " + std::to_string(opset) + ")";
}

// `with_data` false reads a float tensor's dims and checks its size, leaving its values unread.
// `raw` is the tensor's raw_data: t.raw_data(), or the bytes in the file of an initializer whose
// raw_data the loader left out of the parsed message (OnnxModel::Impl::raw).
Result<Constant> read_tensor_proto(const onnx::TensorProto& t, std::string_view raw, bool with_data = true) {
  Constant c;
  for (std::int64_t d : t.dims()) {
    if (d < 0) return Error{"tensor '" + t.name() + "' has a negative dimension " + std::to_string(d)};
    c.dims.push_back(d);
  }
  std::int64_t n = 0;
  try {
    n = c.numel();
  } catch (const graph::SizeError&) {
    return Error{"tensor '" + t.name() + "' has dimensions whose product overflows"};
  }
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    return Error{"tensor '" + t.name() + "' keeps its data in an external file, which memplan does not read; "
                 "export with the weights inside the .onnx file"};
  }
  auto size_error = [&](std::size_t have) {
    return Error{"tensor '" + t.name() + "' declares " + std::to_string(n) + " elements but holds " + std::to_string(have)};
  };
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT: {
      c.is_float = true;
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * 4) return size_error(raw.size() / 4);
        if (!with_data) return c;
        c.floats.resize(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          float f;
          std::memcpy(&f, raw.data() + i * 4, 4);
          c.floats[static_cast<std::size_t>(i)] = f;
        }
      } else {
        if (t.float_data_size() != n) return size_error(static_cast<std::size_t>(t.float_data_size()));
        if (!with_data) return c;
        c.floats.assign(t.float_data().begin(), t.float_data().end());
      }
      return c;
    }
    case onnx::TensorProto::DOUBLE: {
      c.is_float = true;
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * 8) return size_error(raw.size() / 8);
        c.floats.resize(static_cast<std::size_t>(n));
        std::memcpy(c.floats.data(), raw.data(), raw.size());
      } else {
        if (t.double_data_size() != n) return size_error(static_cast<std::size_t>(t.double_data_size()));
        c.floats.assign(t.double_data().begin(), t.double_data().end());
      }
      return c;
    }
    case onnx::TensorProto::INT64: {
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * 8) return size_error(raw.size() / 8);
        c.ints.resize(static_cast<std::size_t>(n));
        std::memcpy(c.ints.data(), raw.data(), raw.size());
      } else {
        if (t.int64_data_size() != n) return size_error(static_cast<std::size_t>(t.int64_data_size()));
        c.ints.assign(t.int64_data().begin(), t.int64_data().end());
      }
      return c;
    }
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::BOOL: {
      const std::size_t width = t.data_type() == onnx::TensorProto::BOOL ? 1 : 4;
      c.ints.resize(static_cast<std::size_t>(n));
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * width) return size_error(raw.size() / width);
        for (std::int64_t i = 0; i < n; ++i) {
          std::int32_t v = 0;
          if (width == 1) {
            v = static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]);
          } else {
            std::memcpy(&v, raw.data() + i * 4, 4);
          }
          c.ints[static_cast<std::size_t>(i)] = v;
        }
      } else {
        if (t.int32_data_size() != n) return size_error(static_cast<std::size_t>(t.int32_data_size()));
        for (std::int64_t i = 0; i < n; ++i) c.ints[static_cast<std::size_t>(i)] = t.int32_data(static_cast<int>(i));
      }
      return c;
    }
    default:
      return Error{"tensor '" + t.name() + "' has ONNX data type " + std::to_string(t.data_type()) +
                   "; memplan reads float, double, int64, int32 and bool tensors"};
  }
}

// A float tensor's values (its size checked by read_tensor_proto).
std::vector<float> float_values(const onnx::TensorProto& t, std::string_view raw) {
  if (t.data_type() != onnx::TensorProto::FLOAT) {
    auto c = read_tensor_proto(t, raw);
    return c ? std::vector<float>(c.value().floats.begin(), c.value().floats.end()) : std::vector<float>{};
  }
  if (raw.empty()) return {t.float_data().begin(), t.float_data().end()};
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

// A constant of a list of integers (a shape, axes).
Constant int_list(std::vector<std::int64_t> values) {
  Constant c;
  c.dims = {static_cast<std::int64_t>(values.size())};
  c.ints = std::move(values);
  return c;
}

}  // namespace

struct OnnxModel::Impl {
  onnx::ModelProto model;
  std::string source;
  std::int64_t opset = 0;
  // When not empty: initializer i's raw_data is raw[i], bytes of the file held by `storage`, and
  // left out of `model` (protobuf would copy every weight; an import reads them only if asked).
  std::vector<std::string_view> raw;
  std::shared_ptr<const void> storage;
  std::string_view raw_of(int initializer) const {
    return raw.empty() ? std::string_view(model.graph().initializer(initializer).raw_data())
                       : raw[static_cast<std::size_t>(initializer)];
  }
};

namespace {

// The protobuf wire format, as far as leaving the initializers' raw_data out of a parse needs it:
// ModelProto.graph (field 7) -> GraphProto.initializer (field 5) -> TensorProto.raw_data (field 9).
struct WireField {
  std::uint64_t number = 0;
  int type = 0;
  std::string_view payload;  // length-delimited fields
  std::string_view whole;    // tag and value as in the input
};

bool read_varint(std::string_view& in, std::uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in.empty()) return false;
    const auto b = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    v |= std::uint64_t(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// The next field of `in`, or false at the end or on anything this reader does not take
// (malformed bytes, groups): the caller then lets protobuf parse everything and say what is wrong.
bool next_field(std::string_view& in, WireField& f) {
  const char* start = in.data();
  std::uint64_t tag = 0;
  if (!read_varint(in, tag)) return false;
  f.number = tag >> 3;
  f.type = static_cast<int>(tag & 7);
  std::uint64_t v = 0;
  switch (f.type) {
    case 0:
      if (!read_varint(in, v)) return false;
      break;
    case 1:
    case 5: {
      const std::size_t n = f.type == 1 ? 8 : 4;
      if (in.size() < n) return false;
      in.remove_prefix(n);
      break;
    }
    case 2:
      if (!read_varint(in, v) || v > in.size()) return false;
      f.payload = in.substr(0, static_cast<std::size_t>(v));
      in.remove_prefix(static_cast<std::size_t>(v));
      break;
    default:
      return false;
  }
  f.whole = std::string_view(start, static_cast<std::size_t>(in.data() - start));
  return true;
}

void put_message(std::string& out, std::uint64_t number, std::string_view body) {
  put_varint(out, number << 3 | 2);
  put_varint(out, body.size());
  out.append(body);
}

// Copies a message, rewriting the length-delimited fields numbered `field` with `inner`.
template <typename Inner>
bool rewrite(std::string_view in, std::uint64_t field, std::string& out, Inner inner) {
  WireField f;
  while (!in.empty()) {
    if (!next_field(in, f)) return false;
    if (f.number == field && f.type == 2) {
      std::string body;
      if (!inner(f.payload, body)) return false;
      put_message(out, field, body);
    } else {
      out.append(f.whole);
    }
  }
  return true;
}

// `bytes` without the raw_data of the graph's initializers, which go to `raw` in order (an empty
// view for an initializer without raw_data). False: let protobuf parse `bytes` itself.
bool strip_initializer_data(std::string_view bytes, std::string& stripped, std::vector<std::string_view>& raw) {
  return rewrite(bytes, 7, stripped, [&](std::string_view graph, std::string& graph_out) {
    return rewrite(graph, 5, graph_out, [&](std::string_view tensor, std::string& tensor_out) {
      std::string_view data;
      WireField f;
      while (!tensor.empty()) {
        if (!next_field(tensor, f)) return false;
        if (f.number == 9 && f.type == 2) {
          data = f.payload;  // the last occurrence wins, as in protobuf
        } else {
          tensor_out.append(f.whole);
        }
      }
      raw.push_back(data);
      return true;
    });
  });
}

// Parses `bytes` (kept alive by `storage`) with the initializers' data left in place.
Result<std::unique_ptr<OnnxModel::Impl>> parse_model(std::string_view bytes, std::shared_ptr<const void> storage,
                                                     const std::string& source) {
  auto impl = std::make_unique<OnnxModel::Impl>();
  const Error corrupt{source + ": not a valid ONNX model (the protobuf does not parse: a truncated or corrupt file?)"};
  if (bytes.size() > static_cast<std::size_t>(kMaxOnnxBytes)) return corrupt;
  std::string stripped;
  std::vector<std::string_view> raw;
  if (strip_initializer_data(bytes, stripped, raw) &&
      impl->model.ParseFromArray(stripped.data(), static_cast<int>(stripped.size())) &&
      impl->model.graph().initializer_size() == static_cast<int>(raw.size())) {
    impl->raw = std::move(raw);
    impl->storage = std::move(storage);
    return impl;
  }
  impl->model.Clear();
  if (!impl->model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return corrupt;
  return impl;
}

}  // namespace

namespace {

// One import at one batch: the state handlers share.
class Importer {
 public:
  Importer(const OnnxModel::Impl& impl, const ImportOptions& options)
      : impl_(impl), options_(options), builder_(out_.graph) {}

  ImportedGraph run();

  using Handler = void (Importer::*)(const onnx::NodeProto&);
  static const std::map<std::string, Handler>& handlers();

 private:

  [[noreturn]] void fail(const std::string& why) const { throw GraphError(node_label(*node_, impl_.opset) + ": " + why); }

  // Operand access.
  const Value& in(int i) const {
    if (i >= node_->input_size() || node_->input(i).empty()) fail("input " + std::to_string(i) + " is missing");
    auto it = values_.find(node_->input(i));
    if (it == values_.end()) fail("input '" + node_->input(i) + "' is used before any node defines it");
    return it->second;
  }
  bool has_in(int i) const { return i < node_->input_size() && !node_->input(i).empty(); }
  TensorId tensor(int i);                // the operand as a graph tensor (pending forms materialised)
  TensorId materialize(const Value& v, const std::string& input_name);
  const Constant& constant(int i) const;  // the operand as a constant (values loaded), or fail
  const Value& loaded(int i) const;        // in(i) with an initializer's values read
  bool is_constant(int i) const {
    const Value& v = in(i);
    return v.kind == Value::Kind::constant || (v.kind == Value::Kind::initializer && !v.constant.is_float);
  }
  bool is_scalar_constant(int i, double* value) const;
  std::vector<std::int64_t> ints_of(int i) const;
  void set(int output, Value v);
  void set_tensor(int output, TensorId id) {
    Value v;
    v.id = id;
    set(output, std::move(v));
  }
  std::string out_name(int i = 0) const { return node_->output(i); }
  const graph::TensorDesc& desc(TensorId id) const { return out_.graph.tensor(id); }
  Shape shape_of(TensorId id) const { return desc(id).shape; }

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
  TensorId reshape_to(TensorId x, const Shape& shape, const std::string& name) {
    if (shape_of(x) == shape) return x;
    return builder_.reshape(x, shape, name);
  }

  // Handlers, one per ONNX op type.
  void h_conv(const onnx::NodeProto&);
  void h_batch_norm(const onnx::NodeProto&);
  void h_relu(const onnx::NodeProto&);
  void h_sigmoid(const onnx::NodeProto&);
  void h_tanh(const onnx::NodeProto&);
  void h_clip(const onnx::NodeProto&);
  void h_max_pool(const onnx::NodeProto&);
  void h_average_pool(const onnx::NodeProto&);
  void h_global_average_pool(const onnx::NodeProto&);
  void h_flatten(const onnx::NodeProto&);
  void h_gemm(const onnx::NodeProto&);
  void h_matmul(const onnx::NodeProto&);
  void h_add(const onnx::NodeProto&);
  void h_sub(const onnx::NodeProto&);
  void h_mul(const onnx::NodeProto&);
  void h_div(const onnx::NodeProto&);
  void h_erf(const onnx::NodeProto&);
  void h_gelu(const onnx::NodeProto&);
  void h_softmax(const onnx::NodeProto&);
  void h_layer_norm(const onnx::NodeProto&);
  void h_reshape(const onnx::NodeProto&);
  void h_transpose(const onnx::NodeProto&);
  void h_concat(const onnx::NodeProto&);
  void h_split(const onnx::NodeProto&);
  void h_slice(const onnx::NodeProto&);
  void h_gather(const onnx::NodeProto&);
  void h_unsqueeze(const onnx::NodeProto&);
  void h_squeeze(const onnx::NodeProto&);
  void h_shape(const onnx::NodeProto&);
  void h_constant(const onnx::NodeProto&);
  void h_constant_of_shape(const onnx::NodeProto&);
  void h_cast(const onnx::NodeProto&);
  void h_identity(const onnx::NodeProto&);
  void h_equal(const onnx::NodeProto&);
  void h_where(const onnx::NodeProto&);
  void h_expand(const onnx::NodeProto&);
  void h_dropout(const onnx::NodeProto&);
  void h_range(const onnx::NodeProto&);
  void h_reduce_mean(const onnx::NodeProto&);
  void h_pow(const onnx::NodeProto&);
  void h_sqrt(const onnx::NodeProto&);
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
  std::int64_t to_int(double v) const {
    if (!(v >= -9.2e18 && v <= 9.2e18)) fail("a constant value " + std::to_string(v) + " does not fit a 64-bit integer");
    return static_cast<std::int64_t>(v);
  }
  // Integer/float arithmetic on two constants with numpy broadcasting (shape computations).
  Constant fold_binary(const Constant& a, const Constant& b, const std::function<double(double, double)>& f) const;
  void add_loss();

  const OnnxModel::Impl& impl_;
  const ImportOptions& options_;
  ImportedGraph out_;
  graph::Builder builder_;
  std::unordered_map<std::string, Value> values_;
  std::unordered_map<std::string, TensorId> materialized_;  // initializer or pending value -> its tensor
  std::set<std::string> buffer_names_;  // initializers that are batch-norm running statistics
  std::int64_t file_batch_ = -1;        // the first input's static first dimension in the file, if any
  const onnx::NodeProto* node_ = nullptr;
};

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
    case Value::Kind::constant:
      fail("the constant '" + input_name +
           "' is used as a tensor; memplan imports constants only as shapes, axes, scalar factors and causal masks");
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

// ---- handlers -------------------------------------------------------------------------------

void Importer::h_conv(const onnx::NodeProto&) {
  const TensorId x = tensor(0);
  const TensorId w = tensor(1);
  const Shape xs = shape_of(x), ws = shape_of(w);
  if (xs.rank() != 4 || ws.rank() != 4) fail("memplan imports 2-D convolutions of [N, C, H, W] inputs, got input " + xs.to_string() + " and weight " + ws.to_string());
  const std::int64_t groups = attr_int("group", 1);
  if (groups < 1 || xs[1] % groups != 0 || ws[0] % groups != 0) {
    fail("group " + std::to_string(groups) + " must divide the input's " + std::to_string(xs[1]) + " and the weight's " +
         std::to_string(ws[0]) + " channels");
  }
  const auto dilations = attr_ints("dilations");
  const std::int64_t dilation = dilations.empty() ? 1 : dilations[0];
  if (!dilations.empty() && (dilations.size() != 2 || dilations[1] != dilation || dilation < 1)) {
    fail("memplan's convolution takes one positive dilation along H and W, got dilations " + Shape(dilations).to_string());
  }
  if (const auto* pad = attr("auto_pad"); pad && pad->s() != "NOTSET") fail("auto_pad " + pad->s() + " is not supported; export explicit pads");
  if (ws[2] != ws[3]) fail("memplan's convolution takes square kernels, got " + ws.to_string());
  if (ws[1] * groups != xs[1]) {
    fail("the weight " + ws.to_string() + " in " + std::to_string(groups) + " group(s) expects " + std::to_string(ws[1] * groups) +
         " input channels, the input " + xs.to_string() + " has " + std::to_string(xs[1]));
  }
  const auto strides = attr_ints("strides");
  const auto pads = attr_ints("pads");
  const std::int64_t stride = strides.empty() ? 1 : strides[0];
  if (!strides.empty() && (strides.size() != 2 || strides[1] != stride)) fail("memplan's convolution takes equal strides along H and W");
  const std::int64_t padding = pads.empty() ? 0 : pads[0];
  if (!pads.empty() && (pads.size() != 4 || std::any_of(pads.begin(), pads.end(), [&](std::int64_t p) { return p != padding; }))) {
    fail("memplan's convolution takes the same padding on every side");
  }
  auto conv = [&](const std::string& name) {
    return groups == 1 ? builder_.conv2d(x, w, stride, padding, name, dilation)
                       : builder_.grouped_conv2d(x, w, stride, padding, groups, name, dilation);
  };
  if (!has_in(2)) return set_tensor(0, conv(out_name()));
  // A per-channel bias: memplan's bias_add adds along the last dim, so the output goes
  // channels-last for it and back (two copies; docs/onnx_import.md notes the cost).
  const TensorId b = tensor(2);
  if (shape_of(b) != Shape{ws[0]}) fail("the bias must be [" + std::to_string(ws[0]) + "], got " + shape_of(b).to_string());
  const TensorId y = conv(out_name() + ".conv");
  const TensorId last = builder_.permute(y, {0, 2, 3, 1}, out_name() + ".nhwc");
  const TensorId biased = builder_.bias_add(last, b, out_name() + ".biased");
  set_tensor(0, builder_.permute(biased, {0, 3, 1, 2}, out_name()));
}

void Importer::h_batch_norm(const onnx::NodeProto& n) {
  const TensorId x = tensor(0);
  const TensorId gamma = tensor(1), beta = tensor(2), mean = tensor(3), var = tensor(4);
  const std::int64_t c = shape_of(x).rank() >= 2 ? shape_of(x)[1] : -1;
  for (TensorId t : {gamma, beta, mean, var}) {
    if (shape_of(t) != Shape{c}) fail("'" + desc(t).name + "' is " + shape_of(t).to_string() + ", the input " + shape_of(x).to_string() + " has " + std::to_string(c) + " channels");
  }
  // ONNX: running = running * momentum + batch * (1 - momentum); memplan's momentum is the batch's share.
  const float momentum = 1.0f - attr_float("momentum", 0.9f);
  set_tensor(0, builder_.batch_norm(x, gamma, beta, mean, var, options_.training, out_name(), momentum, attr_float("epsilon", 1e-5f)));
  for (int i = 1; i < n.output_size(); ++i) {
    if (!n.output(i).empty()) set_tensor(i, i == 1 ? mean : var);  // the updated running statistics
  }
}

void Importer::h_relu(const onnx::NodeProto&) { set_tensor(0, builder_.relu(tensor(0), out_name())); }
void Importer::h_sigmoid(const onnx::NodeProto&) { set_tensor(0, builder_.sigmoid(tensor(0), out_name())); }
void Importer::h_tanh(const onnx::NodeProto&) { set_tensor(0, builder_.tanh(tensor(0), out_name())); }

// Clip's bounds: constant inputs 1 and 2 (opset 11+) or the min/max attributes (earlier); a bound
// left out is open.
void Importer::h_clip(const onnx::NodeProto&) {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  if (const auto* a = attr("min")) lo = a->f();
  if (const auto* a = attr("max")) hi = a->f();
  if (has_in(1) && !is_scalar_constant(1, &lo)) fail("the min bound must be a constant scalar");
  if (has_in(2) && !is_scalar_constant(2, &hi)) fail("the max bound must be a constant scalar");
  if (std::isnan(lo) || std::isnan(hi) || lo > hi) fail("the bounds [" + std::to_string(lo) + ", " + std::to_string(hi) + "] are not a range");
  set_tensor(0, builder_.clip(tensor(0), static_cast<float>(lo), static_cast<float>(hi), out_name()));
}

void Importer::h_max_pool(const onnx::NodeProto& n) {
  const TensorId x = tensor(0);
  if (shape_of(x).rank() != 4) fail("memplan pools [N, C, H, W] inputs, got " + shape_of(x).to_string());
  const auto k = attr_ints("kernel_shape");
  const auto s = attr_ints("strides");
  const auto p = attr_ints("pads");
  if (k.size() != 2 || k[0] != k[1]) fail("memplan pools with square windows");
  if (attr_int("ceil_mode", 0) != 0) fail("ceil_mode 1 is not supported");
  for (std::int64_t d : attr_ints("dilations")) {
    if (d != 1) fail("dilated pooling is not supported");
  }
  if (n.output_size() > 1 && !n.output(1).empty()) fail("the Indices output is not supported");
  const std::int64_t stride = s.empty() ? 1 : s[0];
  if (!s.empty() && (s.size() != 2 || s[1] != stride)) fail("memplan pools with equal strides along H and W");
  const std::int64_t padding = p.empty() ? 0 : p[0];
  if (!p.empty() && std::any_of(p.begin(), p.end(), [&](std::int64_t v) { return v != padding; })) fail("memplan pools with the same padding on every side");
  set_tensor(0, builder_.max_pool2d(x, k[0], stride, padding, out_name()));
}

void Importer::h_average_pool(const onnx::NodeProto&) {
  const TensorId x = tensor(0);
  const auto k = attr_ints("kernel_shape");
  const auto s = attr_ints("strides");
  const auto p = attr_ints("pads");
  if (shape_of(x).rank() != 4 || k.size() != 2 || k[0] != k[1]) fail("memplan pools [N, C, H, W] inputs with square windows");
  if (std::any_of(p.begin(), p.end(), [](std::int64_t v) { return v != 0; })) fail("average pooling with padding is not supported");
  if (attr_int("ceil_mode", 0) != 0) fail("ceil_mode 1 is not supported");
  const std::int64_t stride = s.empty() ? 1 : s[0];
  if (!s.empty() && (s.size() != 2 || s[1] != stride)) fail("memplan pools with equal strides along H and W");
  set_tensor(0, builder_.avg_pool2d(x, k[0], stride, out_name()));
}

void Importer::h_global_average_pool(const onnx::NodeProto&) {
  const TensorId x = tensor(0);
  const Shape xs = shape_of(x);
  if (xs.rank() != 4) fail("memplan pools [N, C, H, W] inputs, got " + xs.to_string());
  const TensorId y = builder_.global_avg_pool(x, out_name() + ".pooled");
  set_tensor(0, builder_.reshape(y, Shape{xs[0], xs[1], 1, 1}, out_name()));
}

void Importer::h_flatten(const onnx::NodeProto&) {
  const TensorId x = tensor(0);
  const Shape xs = shape_of(x);
  const std::int64_t axis = axis_of(attr_int("axis", 1), xs.rank());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < xs.rank(); ++d) (d < axis ? outer : inner) = graph::checked_mul(d < axis ? outer : inner, xs[d]);
  set_tensor(0, reshape_to(x, Shape{outer, inner}, out_name()));
}

void Importer::h_gemm(const onnx::NodeProto&) {
  if (attr_float("alpha", 1.0f) != 1.0f || attr_float("beta", 1.0f) != 1.0f) fail("Gemm with alpha or beta other than 1 is not supported");
  const TensorId a = tensor(0), b = tensor(1);
  const bool ta = attr_int("transA", 0) != 0, tb = attr_int("transB", 0) != 0;
  TensorId y = builder_.matmul(a, b, ta, tb, has_in(2) ? out_name() + ".matmul" : out_name());
  if (has_in(2)) {
    const TensorId c = tensor(2);
    const std::int64_t n = shape_of(y)[1];
    if (shape_of(c) != Shape{n} && shape_of(c) != Shape{1, n}) fail("memplan adds Gemm's C as a bias of [" + std::to_string(n) + "], got " + shape_of(c).to_string());
    y = builder_.bias_add(y, reshape_to(c, Shape{n}, node_->input(2) + ".row"), out_name());
  }
  set_tensor(0, y);
}

void Importer::h_matmul(const onnx::NodeProto&) {
  const Value& bv = in(1);
  const TensorId a = tensor(0);
  const Shape as = shape_of(a);
  // Activations times a 2-D weight (transposed in the file or not): one GEMM over the rows.
  if (bv.kind == Value::Kind::transposed || (bv.kind == Value::Kind::initializer && bv.constant.dims.size() == 2) ||
      (bv.kind == Value::Kind::tensor && shape_of(bv.id).rank() == 2)) {
    const bool tb = bv.kind == Value::Kind::transposed;
    const TensorId w = tb ? bv.id : tensor(1);
    const Shape ws = shape_of(w);
    const std::int64_t k = tb ? ws[1] : ws[0], n = tb ? ws[0] : ws[1];
    if (as.rank() < 2 || as.cols() != k) fail("cannot multiply " + as.to_string() + " by a [" + std::to_string(k) + ", " + std::to_string(n) + "] matrix");
    const TensorId rows = reshape_to(a, Shape{as.rows(), k}, out_name() + ".rows");
    TensorId y = builder_.matmul(rows, w, false, tb, as.rank() == 2 ? out_name() : out_name() + ".matmul");
    std::vector<std::int64_t> dims = as.dims;
    dims.back() = n;
    set_tensor(0, reshape_to(y, Shape(dims), out_name()));
    return;
  }
  const TensorId b = tensor(1);
  const Shape bs = shape_of(b);
  if (as.rank() < 3 || as.rank() != bs.rank()) fail("memplan multiplies batches of matrices of equal rank >= 3, got " + as.to_string() + " and " + bs.to_string());
  set_tensor(0, builder_.batched_matmul(a, b, false, false, out_name()));
}

namespace {
bool is_causal_mask(const Constant& c, std::int64_t t) {
  if (!c.is_float || c.dims.size() < 2 || c.dims[c.dims.size() - 1] != t || c.dims[c.dims.size() - 2] != t) return false;
  if (c.numel() != t * t) return false;
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t j = 0; j < t; ++j) {
      const double v = c.floats[static_cast<std::size_t>(i * t + j)];
      if (j <= i ? v != 0.0 : !(v < -1e9)) return false;
    }
  }
  return true;
}
}  // namespace

void Importer::h_add(const onnx::NodeProto& n) {
  if (is_constant(0) && is_constant(1)) return set(0, constant_value(fold_binary(constant(0), constant(1), std::plus<>())));
  double s = 0;
  for (int i = 0; i < 2; ++i) {
    if (ln_step(i, Value::Kind::ln_variance) && is_scalar_constant(1 - i, &s)) {
      Value v = ln_value(Value::Kind::ln_variance_eps, in(i));
      v.eps = static_cast<float>(s);
      return set(0, v);
    }
    if (ln_step(i, Value::Kind::ln_scaled) && in(1 - i).kind == Value::Kind::initializer) {
      const Value v = in(i);
      const TensorId beta = tensor(1 - i);
      const std::int64_t d = shape_of(v.id).cols();
      if (shape_of(beta) != Shape{d}) fail("the bias of a LayerNormalization pattern must be [" + std::to_string(d) + "], got " + shape_of(beta).to_string());
      return set_tensor(0, builder_.layer_norm(v.id, v.gamma, beta, out_name(), v.eps));
    }
  }
  // GELU's decomposition: erf(x / sqrt 2) + 1.
  for (int i = 0; i < 2; ++i) {
    if (in(i).kind == Value::Kind::gelu_erf && is_scalar_constant(1 - i, &s) && s == 1.0) {
      Value v = in(i);
      v.kind = Value::Kind::gelu_erf1;
      return set(0, v);
    }
  }
  // An additive causal mask (0 on and below the diagonal, -inf above), read by a Softmax.
  for (int i = 0; i < 2; ++i) {
    const Value& m = (in(1 - i).kind == Value::Kind::initializer && in(1 - i).constant.numel() <= (std::int64_t{1} << 20)) ? loaded(1 - i) : in(1 - i);
    if ((m.kind == Value::Kind::constant || m.kind == Value::Kind::initializer) && m.constant.is_float &&
        in(i).kind == Value::Kind::tensor && shape_of(in(i).id).rank() >= 2 &&
        is_causal_mask(m.constant, shape_of(in(i).id).cols())) {
      return set(0, pending(Value::Kind::causal, in(i).id));
    }
  }
  TensorId a = tensor(0), b = tensor(1);
  Shape as = shape_of(a), bs = shape_of(b);
  if (as == bs) return set_tensor(0, builder_.add(a, b, out_name()));
  if (as.numel() < bs.numel()) {
    std::swap(a, b);
    std::swap(as, bs);
  }
  // b broadcasts along leading dims only: a bias over the trailing numel(b) elements of each row.
  std::vector<std::int64_t> tail = bs.dims;
  while (!tail.empty() && tail.front() == 1) tail.erase(tail.begin());
  const bool suffix = tail.size() <= as.dims.size() && std::equal(tail.begin(), tail.end(), as.dims.end() - static_cast<std::ptrdiff_t>(tail.size()));
  if (!suffix || n.input_size() != 2) fail("memplan adds tensors of equal shape, or a tensor whose shape is a suffix of the other's; got " + as.to_string() + " and " + bs.to_string());
  const std::int64_t inner = bs.numel();
  const TensorId rows = reshape_to(a, Shape{as.numel() / inner, inner}, out_name() + ".rows");
  const TensorId bias = reshape_to(b, Shape{inner}, out_name() + ".bias");
  set_tensor(0, reshape_to(builder_.bias_add(rows, bias, as.rank() == 2 && as == shape_of(rows) ? out_name() : out_name() + ".sum"), as, out_name()));
}

void Importer::h_sub(const onnx::NodeProto&) {
  if (is_constant(0) && is_constant(1)) return set(0, constant_value(fold_binary(constant(0), constant(1), std::minus<>())));
  if (in(0).kind == Value::Kind::tensor && ln_step(1, Value::Kind::ln_mean, in(0).id)) {
    return set(0, ln_value(Value::Kind::ln_centered, in(1)));
  }
  const TensorId a = tensor(0), b = tensor(1);
  if (shape_of(a) != shape_of(b)) fail("memplan subtracts tensors of equal shape, got " + shape_of(a).to_string() + " and " + shape_of(b).to_string());
  set_tensor(0, builder_.add(a, builder_.scale(b, -1.0f, out_name() + ".negated"), out_name()));
}

void Importer::h_mul(const onnx::NodeProto&) {
  if (is_constant(0) && is_constant(1)) return set(0, constant_value(fold_binary(constant(0), constant(1), std::multiplies<>())));
  double s = 0;
  for (int i = 0; i < 2; ++i) {
    if (ln_step(i, Value::Kind::ln_normalized) && in(1 - i).kind == Value::Kind::initializer) {
      Value v = ln_value(Value::Kind::ln_scaled, in(i));
      v.gamma = tensor(1 - i);
      const std::int64_t d = shape_of(v.id).cols();
      if (shape_of(v.gamma) != Shape{d}) fail("the scale of a LayerNormalization pattern must be [" + std::to_string(d) + "], got " + shape_of(v.gamma).to_string());
      return set(0, v);
    }
  }
  for (int i = 0; i < 2; ++i) {
    const Value& v = in(i);
    // GELU's decomposition: x * (1 + erf(x / sqrt 2)), then times 0.5.
    if (v.kind == Value::Kind::gelu_erf1 && in(1 - i).kind == Value::Kind::tensor && in(1 - i).id == v.id) {
      Value h = v;
      h.kind = Value::Kind::gelu_half;
      return set(0, h);
    }
    if (v.kind == Value::Kind::gelu_half && is_scalar_constant(1 - i, &s) && s == 0.5) {
      return set_tensor(0, builder_.gelu(v.id, out_name()));
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (is_scalar_constant(1 - i, &s) && in(i).kind != Value::Kind::constant) {
      return set_tensor(0, builder_.scale(tensor(i), static_cast<float>(s), out_name()));
    }
  }
  const TensorId a = tensor(0), b = tensor(1);
  // A squeeze-and-excitation gate: [N, C, H, W] * [N, C, 1, 1] (either order) scales each
  // (sample, channel) plane without broadcasting the gate into memory.
  for (int i = 0; i < 2; ++i) {
    const Shape& xs = shape_of(i == 0 ? a : b);
    const Shape& gs = shape_of(i == 0 ? b : a);
    bool gate = xs != gs && xs.rank() >= 3 && gs.rank() == xs.rank() && gs[0] == xs[0] && gs[1] == xs[1];
    for (int k = 2; gate && k < gs.rank(); ++k) gate = gs[k] == 1;
    if (gate) return set_tensor(0, builder_.channel_scale(i == 0 ? a : b, i == 0 ? b : a, out_name()));
  }
  if (shape_of(a) != shape_of(b)) {
    fail("memplan multiplies tensors of equal shape, by a scalar constant, or [N, C, ...] by a gate [N, C, 1, ...]; got " +
         shape_of(a).to_string() + " and " + shape_of(b).to_string());
  }
  set_tensor(0, builder_.mul(a, b, out_name()));
}

void Importer::h_div(const onnx::NodeProto&) {
  if (is_constant(0) && is_constant(1)) {
    const bool ints = !constant(0).is_float && !constant(1).is_float;
    return set(0, constant_value(fold_binary(constant(0), constant(1), [&](double x, double y) {
                     if (y == 0) fail("division by zero in a constant");
                     return ints ? std::floor(x / y) : x / y;
                   })));
  }
  if (ln_step(0, Value::Kind::ln_centered) && ln_step(1, Value::Kind::ln_std, in(0).id)) {
    return set(0, ln_value(Value::Kind::ln_normalized, in(1)));
  }
  double s = 0;
  if (!is_scalar_constant(1, &s) || s == 0) fail("memplan divides a tensor by a non-zero scalar constant only");
  if (in(0).kind == Value::Kind::tensor && std::fabs(s - std::sqrt(2.0)) < 1e-5) {
    // Perhaps GELU's x / sqrt 2: kept pending, a scale op if anything else reads it.
    return set(0, pending(Value::Kind::gelu_scaled, in(0).id));
  }
  set_tensor(0, builder_.scale(tensor(0), static_cast<float>(1.0 / s), out_name()));
}

void Importer::h_erf(const onnx::NodeProto&) {
  Value v = in(0);
  if (v.kind != Value::Kind::gelu_scaled) fail("memplan imports Erf only as part of GELU (x * 0.5 * (1 + erf(x / sqrt(2))))");
  v.kind = Value::Kind::gelu_erf;
  set(0, v);
}

void Importer::h_gelu(const onnx::NodeProto&) {
  if (const auto* a = attr("approximate"); a && a->s() != "none") fail("only the exact (erf) GELU is supported");
  set_tensor(0, builder_.gelu(tensor(0), out_name()));
}

void Importer::h_softmax(const onnx::NodeProto&) {
  const Value& v = in(0);
  const bool causal = v.kind == Value::Kind::causal;
  const TensorId x = causal ? v.id : tensor(0);
  const int rank = shape_of(x).rank();
  if (axis_of(attr_int("axis", -1), rank) != rank - 1) fail("memplan's softmax runs over the last axis");
  set_tensor(0, builder_.softmax(x, causal, out_name()));
}

void Importer::h_layer_norm(const onnx::NodeProto& n) {
  const TensorId x = tensor(0);
  const Shape xs = shape_of(x);
  if (axis_of(attr_int("axis", -1), xs.rank()) != xs.rank() - 1) fail("memplan normalises over the last axis only");
  if (!has_in(2)) fail("a LayerNormalization without a bias is not supported");
  for (int i = 1; i < n.output_size(); ++i) {
    if (!n.output(i).empty()) fail("the Mean and InvStdDev outputs are not supported");
  }
  const TensorId gamma = tensor(1), beta = tensor(2);
  if (shape_of(gamma) != Shape{xs.cols()} || shape_of(beta) != Shape{xs.cols()}) fail("scale and bias must be [" + std::to_string(xs.cols()) + "]");
  set_tensor(0, builder_.layer_norm(x, gamma, beta, out_name(), attr_float("epsilon", 1e-5f)));
}

void Importer::h_reshape(const onnx::NodeProto&) {
  std::vector<std::int64_t> target = ints_of(1);
  if (attr_int("allowzero", 0) != 0) fail("allowzero 1 is not supported");
  const bool on_constant = is_constant(0);
  const Shape xs = on_constant ? Shape(constant(0).dims) : shape_of(tensor(0));
  // A static export bakes its batch into reshape targets: the first entry follows --batch.
  if (!on_constant && !target.empty() && file_batch_ > 0 && target[0] == file_batch_ && xs.rank() > 0 &&
      xs[0] == options_.batch) {
    target[0] = options_.batch;
  }
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] == 0) {
      if (static_cast<int>(i) >= xs.rank()) fail("reshape target copies a dimension the input does not have");
      target[i] = xs[static_cast<int>(i)];
    }
    if (target[i] == -1) {
      if (infer >= 0) fail("reshape target has two -1 entries");
      infer = static_cast<int>(i);
    } else if (target[i] < 0) {
      fail("reshape target has a negative entry " + std::to_string(target[i]));
    } else {
      known = graph::checked_mul(known, target[i]);
    }
  }
  if (infer >= 0) {
    if (known == 0 || xs.numel() % known != 0) fail("cannot reshape " + xs.to_string() + " with a -1 entry");
    target[static_cast<std::size_t>(infer)] = xs.numel() / known;
  }
  if (Shape(target).numel() != xs.numel()) fail("cannot reshape " + xs.to_string() + " to " + Shape(target).to_string());
  if (on_constant) {
    Constant c = constant(0);
    c.dims = target;
    return set(0, constant_value(std::move(c)));
  }
  set_tensor(0, reshape_to(tensor(0), Shape(target), out_name()));
}

void Importer::h_transpose(const onnx::NodeProto&) {
  const Value& v = in(0);
  if (v.kind == Value::Kind::initializer && v.constant.is_float && v.constant.dims.size() == 2) {
    const auto perm = attr_ints("perm");
    if (perm.empty() || perm == std::vector<std::int64_t>{1, 0}) {
      // W^T of a weight: the matmul reading it transposes instead (no copy).
      return set(0, pending(Value::Kind::transposed, tensor(0)));
    }
  }
  const TensorId x = tensor(0);
  const int rank = shape_of(x).rank();
  std::vector<std::int64_t> perm = attr_ints("perm");
  if (perm.empty()) {
    for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  std::vector<std::int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < rank; ++i) {
    if (static_cast<int>(sorted.size()) != rank || sorted[static_cast<std::size_t>(i)] != i) fail("perm is not a permutation of the input's " + std::to_string(rank) + " axes");
  }
  bool identity = true;
  for (int i = 0; i < rank; ++i) identity = identity && perm[static_cast<std::size_t>(i)] == i;
  set_tensor(0, identity ? x : builder_.permute(x, perm, out_name()));
}

void Importer::h_concat(const onnx::NodeProto& n) {
  bool all_constant = true;
  for (int i = 0; i < n.input_size(); ++i) all_constant = all_constant && is_constant(i);
  if (all_constant) {
    if (attr_int("axis", 0) != 0 && attr_int("axis", 0) != -1) fail("constants are concatenated along one axis only");
    Constant c;
    for (int i = 0; i < n.input_size(); ++i) {
      const Constant& p = constant(i);
      if (p.dims.size() > 1) fail("constants are concatenated as lists only");
      if (p.is_float) fail("float constants are not concatenated");
      c.ints.insert(c.ints.end(), p.ints.begin(), p.ints.end());
    }
    c.dims = {static_cast<std::int64_t>(c.ints.size())};
    return set(0, constant_value(c));
  }
  TensorId y = tensor(0);
  const std::int64_t axis = axis_of(attr_int("axis", 0), shape_of(y).rank());
  for (int i = 1; i < n.input_size(); ++i) {
    y = builder_.concat(y, tensor(i), axis, i + 1 == n.input_size() ? out_name() : out_name() + ".part" + std::to_string(i));
  }
  set_tensor(0, y);
}

void Importer::h_split(const onnx::NodeProto& n) {
  const TensorId x = tensor(0);
  const Shape xs = shape_of(x);
  const std::int64_t axis = axis_of(attr_int("axis", 0), xs.rank());
  std::vector<std::int64_t> sizes = has_in(1) ? ints_of(1) : attr_ints("split");
  if (sizes.empty()) {
    if (xs[static_cast<int>(axis)] % n.output_size() != 0) fail("the axis does not split evenly");
    sizes.assign(static_cast<std::size_t>(n.output_size()), xs[static_cast<int>(axis)] / n.output_size());
  }
  if (static_cast<int>(sizes.size()) != n.output_size()) fail("split sizes and outputs differ in number");
  std::int64_t start = 0;
  for (int i = 0; i < n.output_size(); ++i) {
    const std::int64_t len = sizes[static_cast<std::size_t>(i)];
    if (len < 0 || start + len > xs[static_cast<int>(axis)]) fail("split sizes exceed the axis");
    set_tensor(i, builder_.slice(x, axis, start, len, n.output(i)));
    start += len;
  }
  if (start != xs[static_cast<int>(axis)]) fail("split sizes do not add up to the axis");
}

void Importer::h_slice(const onnx::NodeProto& n) {
  const std::vector<std::int64_t> starts = ints_of(1), ends = ints_of(2);
  if (starts.size() != ends.size()) fail("starts and ends differ in length");
  std::vector<std::int64_t> axes = has_in(3) ? ints_of(3) : std::vector<std::int64_t>{};
  if (axes.empty()) {
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
  }
  const std::vector<std::int64_t> steps = has_in(4) ? ints_of(4) : std::vector<std::int64_t>(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) fail("starts, ends, axes and steps differ in length");
  const bool on_constant = in(0).kind == Value::Kind::constant || in(0).kind == Value::Kind::initializer;
  std::vector<std::int64_t> dims = on_constant ? in(0).constant.dims : shape_of(tensor(0)).dims;
  const int rank = static_cast<int>(dims.size());
  std::vector<std::int64_t> lo(dims.size(), 0), len = dims;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (steps[i] != 1) fail("slices with a step other than 1 are not supported");
    const std::int64_t a = axis_of(axes[i], rank);
    const std::int64_t d = dims[static_cast<std::size_t>(a)];
    std::int64_t s = starts[i] < 0 ? starts[i] + d : starts[i];
    std::int64_t e = ends[i] < 0 ? ends[i] + d : ends[i];
    s = std::clamp<std::int64_t>(s, 0, d);
    e = std::clamp<std::int64_t>(e, 0, d);
    lo[static_cast<std::size_t>(a)] = s;
    len[static_cast<std::size_t>(a)] = std::max<std::int64_t>(e - s, 0);
  }
  if (on_constant) {
    const Constant& c = loaded(0).constant;
    Constant r;
    r.dims = len;
    r.is_float = c.is_float;
    const std::int64_t total = r.numel();
    for (std::int64_t idx = 0; idx < total; ++idx) {
      std::int64_t rem = idx, src = 0, stride = 1;
      for (int k = rank - 1; k >= 0; --k) {
        const std::int64_t coord = rem % len[static_cast<std::size_t>(k)] + lo[static_cast<std::size_t>(k)];
        rem /= len[static_cast<std::size_t>(k)];
        src += coord * stride;
        stride *= dims[static_cast<std::size_t>(k)];
      }
      if (c.is_float) {
        r.floats.push_back(c.floats[static_cast<std::size_t>(src)]);
      } else {
        r.ints.push_back(c.ints[static_cast<std::size_t>(src)]);
      }
    }
    Value v;
    v.kind = Value::Kind::constant;
    v.constant = std::move(r);
    return set(0, v);
  }
  TensorId y = tensor(0);
  for (int a = 0; a < rank; ++a) {
    if (lo[static_cast<std::size_t>(a)] == 0 && len[static_cast<std::size_t>(a)] == dims[static_cast<std::size_t>(a)]) continue;
    if (len[static_cast<std::size_t>(a)] == 0) fail("an empty slice");
    y = builder_.slice(y, a, lo[static_cast<std::size_t>(a)], len[static_cast<std::size_t>(a)], out_name() + ".axis" + std::to_string(a));
  }
  (void)n;
  set_tensor(0, y);
}

void Importer::h_gather(const onnx::NodeProto&) {
  const std::int64_t axis_attr = attr_int("axis", 0);
  if (is_constant(0) && is_constant(1)) {
    const Constant& data = constant(0);
    if (data.dims.size() != 1 || axis_attr != 0) fail("constants are gathered from lists only");
    const Constant& idx = constant(1);
    Constant r;
    r.dims = idx.dims;
    r.is_float = data.is_float;
    for (std::int64_t k = 0; k < idx.numel(); ++k) {
      std::int64_t i = to_int(idx.at(k));
      if (i < 0) i += data.dims[0];
      if (i < 0 || i >= data.dims[0]) fail("index " + std::to_string(i) + " out of range");
      if (data.is_float) {
        r.floats.push_back(data.floats[static_cast<std::size_t>(i)]);
      } else {
        r.ints.push_back(data.ints[static_cast<std::size_t>(i)]);
      }
    }
    return set(0, constant_value(r));
  }
  if (is_constant(1) && constant(1).numel() == 1) {
    // x[..., i, ...] along one axis by a constant index: a slice (and a reshape without the axis
    // for a scalar index), as a ViT reads its class token.
    const TensorId x = tensor(0);
    const Shape xs = shape_of(x);
    const std::int64_t axis = axis_of(axis_attr, xs.rank());
    std::int64_t i = to_int(constant(1).at(0));
    if (i < 0) i += xs[static_cast<int>(axis)];
    if (i < 0 || i >= xs[static_cast<int>(axis)]) fail("index out of range");
    const bool scalar = constant(1).dims.empty();
    const TensorId y = builder_.slice(x, axis, i, 1, scalar ? out_name() + ".slice" : out_name());
    if (!scalar) return set_tensor(0, y);
    std::vector<std::int64_t> dims = xs.dims;
    dims.erase(dims.begin() + axis);
    return set_tensor(0, reshape_to(y, Shape(dims), out_name()));
  }
  // An embedding lookup: rows of a [V, D] table picked by integer ids.
  const TensorId table = tensor(0);
  const TensorId ids = tensor(1);
  if (axis_attr != 0 || shape_of(table).rank() != 2) fail("memplan gathers rows of a [V, D] table (axis 0) only");
  if (desc(ids).dtype != DType::i32) fail("the indices '" + desc(ids).name + "' must be integer token ids");
  set_tensor(0, builder_.embedding(ids, table, out_name()));
}

void Importer::h_unsqueeze(const onnx::NodeProto&) {
  const std::vector<std::int64_t> axes = has_in(1) ? ints_of(1) : attr_ints("axes");
  const bool on_constant = is_constant(0);
  std::vector<std::int64_t> dims = on_constant ? constant(0).dims : shape_of(tensor(0)).dims;
  const int rank = static_cast<int>(dims.size() + axes.size());
  std::vector<std::int64_t> sorted;
  for (std::int64_t a : axes) sorted.push_back(axis_of(a, rank));
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t a : sorted) dims.insert(dims.begin() + a, 1);
  if (on_constant) {
    Constant c = constant(0);
    c.dims = dims;
    return set(0, constant_value(c));
  }
  set_tensor(0, reshape_to(tensor(0), Shape(dims), out_name()));
}

void Importer::h_squeeze(const onnx::NodeProto&) {
  std::vector<std::int64_t> axes = has_in(1) ? ints_of(1) : attr_ints("axes");
  const bool on_constant = is_constant(0);
  const std::vector<std::int64_t> dims = on_constant ? constant(0).dims : shape_of(tensor(0)).dims;
  const int rank = static_cast<int>(dims.size());
  std::set<std::int64_t> drop;
  for (std::int64_t a : axes) drop.insert(axis_of(a, rank));
  std::vector<std::int64_t> out;
  for (int i = 0; i < rank; ++i) {
    const bool squeeze = axes.empty() ? dims[static_cast<std::size_t>(i)] == 1 : drop.count(i) > 0;
    if (squeeze && dims[static_cast<std::size_t>(i)] != 1) fail("axis " + std::to_string(i) + " has size " + std::to_string(dims[static_cast<std::size_t>(i)]) + ", not 1");
    if (!squeeze) out.push_back(dims[static_cast<std::size_t>(i)]);
  }
  if (on_constant) {
    Constant c = constant(0);
    c.dims = out;
    return set(0, constant_value(c));
  }
  set_tensor(0, reshape_to(tensor(0), Shape(out), out_name()));
}

void Importer::h_shape(const onnx::NodeProto&) {
  const Value& v = in(0);
  std::vector<std::int64_t> dims;
  if (v.kind == Value::Kind::constant || v.kind == Value::Kind::initializer) {
    dims = v.constant.dims;
  } else if (v.kind == Value::Kind::transposed) {
    dims = shape_of(v.id).dims;
    std::swap(dims[0], dims[1]);
  } else {
    dims = shape_of(v.kind == Value::Kind::tensor ? v.id : tensor(0)).dims;
  }
  const std::int64_t r = static_cast<std::int64_t>(dims.size());
  std::int64_t start = attr_int("start", 0), end = attr_int("end", r);
  start = std::clamp<std::int64_t>(start < 0 ? start + r : start, 0, r);
  end = std::clamp<std::int64_t>(end < 0 ? end + r : end, 0, r);
  set(0, constant_value(int_list({dims.begin() + start, dims.begin() + std::max(start, end)})));
}

void Importer::h_constant(const onnx::NodeProto&) {
  Constant c;
  if (const auto* a = attr("value")) {
    auto r = read_tensor_proto(a->t(), a->t().raw_data());
    if (!r) fail(r.error().message);
    c = std::move(r).value();
  } else if (const auto* f = attr("value_float")) {
    c.is_float = true;
    c.floats = {f->f()};
  } else if (const auto* i = attr("value_int")) {
    c.ints = {i->i()};
  } else if (const auto* is = attr("value_ints")) {
    c = int_list({is->ints().begin(), is->ints().end()});
  } else if (const auto* fs = attr("value_floats")) {
    c.is_float = true;
    c.floats.assign(fs->floats().begin(), fs->floats().end());
    c.dims = {static_cast<std::int64_t>(c.floats.size())};
  } else {
    fail("a Constant without a value, value_float, value_int, value_ints or value_floats attribute");
  }
  set(0, constant_value(c));
}

void Importer::h_constant_of_shape(const onnx::NodeProto&) {
  Constant c;
  c.dims = ints_of(0);
  for (std::int64_t d : c.dims) {
    if (d < 0 || d > (std::int64_t{1} << 24)) fail("a dimension " + std::to_string(d) + " outside [0, 2^24]");
  }
  double v = 0;
  bool is_float = true;
  if (const auto* a = attr("value")) {
    auto r = read_tensor_proto(a->t(), a->t().raw_data());
    if (!r || r.value().numel() != 1) fail("value must be a one-element tensor");
    v = r.value().at(0);
    is_float = r.value().is_float;
  }
  const std::int64_t n = c.numel();
  if (n > (std::int64_t{1} << 24)) fail("a constant of " + std::to_string(n) + " elements is too large to fold");
  c.is_float = is_float;
  if (is_float) {
    c.floats.assign(static_cast<std::size_t>(n), v);
  } else {
    c.ints.assign(static_cast<std::size_t>(n), to_int(v));
  }
  set(0, constant_value(c));
}

void Importer::h_cast(const onnx::NodeProto&) {
  const std::int64_t to = attr_int("to", 0);
  const bool to_float = to == onnx::TensorProto::FLOAT || to == onnx::TensorProto::DOUBLE || to == onnx::TensorProto::FLOAT16 ||
                        to == onnx::TensorProto::BFLOAT16;
  const bool to_integer = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32 || to == onnx::TensorProto::BOOL;
  if (!to_float && !to_integer) fail("Cast to ONNX type " + std::to_string(to) + " is not supported");
  if (is_constant(0) || in(0).kind == Value::Kind::constant) {
    Constant c = constant(0);
    if (to_float && !c.is_float) {
      c.floats.assign(c.ints.begin(), c.ints.end());
      c.ints.clear();
      c.is_float = true;
    } else if (to_integer && c.is_float) {
      for (double f : c.floats) c.ints.push_back(to_int(f));
      c.floats.clear();
      c.is_float = false;
    }
    return set(0, constant_value(c));
  }
  const TensorId x = tensor(0);
  if (graph::is_floating(desc(x).dtype) != to_float) fail("a Cast between integer and float tensors is not supported");
  set_tensor(0, x);
}

void Importer::h_expand(const onnx::NodeProto&) {
  const std::vector<std::int64_t> target = ints_of(1);
  const TensorId x = tensor(0);
  const Shape xs = shape_of(x);
  // numpy broadcasting of x against the target shape
  const std::size_t rank = std::max<std::size_t>(target.size(), xs.dims.size());
  std::vector<std::int64_t> dx(rank, 1), out(rank, 1);
  std::copy(xs.dims.begin(), xs.dims.end(), dx.begin() + static_cast<std::ptrdiff_t>(rank - xs.dims.size()));
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t t = k + target.size() >= rank ? target[k + target.size() - rank] : 1;
    if (dx[k] != t && dx[k] != 1 && t != 1) fail("cannot expand " + xs.to_string() + " to " + Shape(target).to_string());
    out[k] = std::max(dx[k], t);
  }
  if (Shape(out) == xs) return set_tensor(0, x);
  // Only leading dims may grow (a class token expanded over the batch): zeros plus x as a bias.
  std::size_t first_kept = 0;
  while (first_kept < rank && dx[first_kept] == 1 && out[first_kept] != 1) ++first_kept;
  for (std::size_t k = first_kept; k < rank; ++k) {
    if (dx[k] != out[k]) fail("memplan expands leading dimensions only; cannot expand " + xs.to_string() + " to " + Shape(out).to_string());
  }
  const std::int64_t inner = xs.numel();
  const std::int64_t rows = Shape(out).numel() / inner;
  graph::OpAttrs zeros;
  zeros.shape = {rows, inner};
  zeros.alpha = 0.0f;
  zeros.dtype = desc(x).dtype;
  const TensorId z = out_.graph.add_op(graph::OpKind::fill, {}, zeros, out_name() + ".zeros", graph::Role::activation, graph::Phase::forward);
  const TensorId y = builder_.bias_add(z, reshape_to(x, Shape{inner}, out_name() + ".row"), out_name() + ".rows");
  set_tensor(0, reshape_to(y, Shape(out), out_name()));
}

void Importer::h_equal(const onnx::NodeProto&) {
  Constant c = fold_binary(constant(0), constant(1), [](double a, double b) { return a == b ? 1.0 : 0.0; });
  if (c.is_float) {
    for (double f : c.floats) c.ints.push_back(to_int(f));
    c.floats.clear();
    c.is_float = false;
  }
  set(0, constant_value(std::move(c)));
}

void Importer::h_where(const onnx::NodeProto&) {
  const Constant& cond = constant(0);
  // where(c, a, b) = c * a + (1 - c) * b, elementwise with broadcasting, on constants only.
  const Constant picked_a = fold_binary(cond, constant(1), [](double c, double a) { return c != 0 ? a : 0.0; });
  const Constant picked_b = fold_binary(cond, constant(2), [](double c, double b) { return c != 0 ? 0.0 : b; });
  Constant r = fold_binary(picked_a, picked_b, std::plus<>());
  if (!constant(1).is_float && !constant(2).is_float && r.is_float) {
    for (double f : r.floats) r.ints.push_back(to_int(f));
    r.floats.clear();
    r.is_float = false;
  }
  set(0, constant_value(std::move(r)));
}

void Importer::h_identity(const onnx::NodeProto&) { set(0, in(0)); }

void Importer::h_dropout(const onnx::NodeProto&) {
  double ratio = attr_float("ratio", 0.5f);
  if (has_in(1) && !is_scalar_constant(1, &ratio)) fail("the ratio must be a constant");
  double training = 0;
  if (has_in(2) && !is_scalar_constant(2, &training)) fail("training_mode must be a constant");
  // Opset 12+: inference unless training_mode says otherwise; memplan trains what it imports, so
  // an exported Dropout keeps its ratio either way (documented in docs/onnx_import.md).
  if (ratio < 0 || ratio >= 1) fail("ratio " + std::to_string(ratio) + " is outside [0, 1)");
  set(1, pending(Value::Kind::unavailable, kNoTensor));  // the mask: an error only if something reads it
  if (!options_.training) return set(0, in(0));  // evaluation: the identity
  set_tensor(0, builder_.dropout(tensor(0), static_cast<float>(ratio), out_name()));
}

// ReduceMean: the mean and variance of LayerNormalization's decomposition (over the last axis,
// kept), or a global average pool (over H and W of [N, C, H, W]).
void Importer::h_reduce_mean(const onnx::NodeProto&) {
  std::vector<std::int64_t> axes = attr_ints("axes");
  if (has_in(1)) axes = ints_of(1);  // opset 18: an input
  const bool keep = attr_int("keepdims", 1) != 0;
  const Value& v = in(0);
  const int rank = v.kind == Value::Kind::tensor || v.kind == Value::Kind::ln_squared ? shape_of(v.id).rank() : -1;
  if (rank < 0) fail("memplan reduces graph tensors only");
  for (std::int64_t& a : axes) a = axis_of(a, rank);
  std::sort(axes.begin(), axes.end());
  if (keep && axes == std::vector<std::int64_t>{rank - 1}) {
    if (v.kind == Value::Kind::tensor) return set(0, ln_value(Value::Kind::ln_mean, v));
    return set(0, ln_value(Value::Kind::ln_variance, v));
  }
  if (v.kind == Value::Kind::tensor && rank == 4 && axes == std::vector<std::int64_t>{2, 3}) {
    const TensorId pooled = builder_.global_avg_pool(v.id, out_name() + (keep ? ".pooled" : ""));
    if (!keep) return set_tensor(0, pooled);
    const Shape xs = shape_of(v.id);
    return set_tensor(0, builder_.reshape(pooled, Shape{xs[0], xs[1], 1, 1}, out_name()));
  }
  fail("memplan imports ReduceMean over the last axis with keepdims within LayerNormalization's decomposition, or "
       "over axes [2, 3] of a [N, C, H, W] tensor (a global average pool)");
}

// Pow: (x - mean)^2 of LayerNormalization's decomposition, or any tensor squared.
void Importer::h_pow(const onnx::NodeProto&) {
  double p = 0;
  if (!is_scalar_constant(1, &p) || p != 2.0) fail("memplan imports Pow with the constant exponent 2 only");
  if (ln_step(0, Value::Kind::ln_centered)) return set(0, ln_value(Value::Kind::ln_squared, in(0)));
  const TensorId x = tensor(0);
  set_tensor(0, builder_.mul(x, x, out_name()));
}

void Importer::h_sqrt(const onnx::NodeProto&) {
  if (ln_step(0, Value::Kind::ln_variance_eps)) return set(0, ln_value(Value::Kind::ln_std, in(0)));
  fail("memplan imports Sqrt only within LayerNormalization's decomposition (the square root of variance + eps)");
}

void Importer::h_range(const onnx::NodeProto&) {
  const double start = constant(0).at(0), limit = constant(1).at(0), delta = constant(2).at(0);
  if (delta == 0) fail("delta 0");
  Constant c;
  c.is_float = constant(0).is_float;
  const double count = std::max(std::ceil((limit - start) / delta), 0.0);
  if (!(count <= double(std::int64_t{1} << 24))) fail("a range too large to fold");
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(count); ++i) {
    if (c.is_float) {
      c.floats.push_back(start + double(i) * delta);
    } else {
      c.ints.push_back(to_int(start + double(i) * delta));
    }
  }
  c.dims = {static_cast<std::int64_t>(count)};
  set(0, constant_value(c));
}

const std::map<std::string, Importer::Handler>& Importer::handlers() {
  static const std::map<std::string, Handler> table = {
      {"Add", &Importer::h_add},
      {"AveragePool", &Importer::h_average_pool},
      {"BatchNormalization", &Importer::h_batch_norm},
      {"Cast", &Importer::h_cast},
      {"Concat", &Importer::h_concat},
      {"Constant", &Importer::h_constant},
      {"ConstantOfShape", &Importer::h_constant_of_shape},
      {"Conv", &Importer::h_conv},
      {"Div", &Importer::h_div},
      {"Dropout", &Importer::h_dropout},
      {"Erf", &Importer::h_erf},
      {"Equal", &Importer::h_equal},
      {"Expand", &Importer::h_expand},
      {"Flatten", &Importer::h_flatten},
      {"Gather", &Importer::h_gather},
      {"Gelu", &Importer::h_gelu},
      {"Gemm", &Importer::h_gemm},
      {"GlobalAveragePool", &Importer::h_global_average_pool},
      {"Identity", &Importer::h_identity},
      {"LayerNormalization", &Importer::h_layer_norm},
      {"MatMul", &Importer::h_matmul},
      {"MaxPool", &Importer::h_max_pool},
      {"Mul", &Importer::h_mul},
      {"Pow", &Importer::h_pow},
      {"Range", &Importer::h_range},
      {"ReduceMean", &Importer::h_reduce_mean},
      {"Relu", &Importer::h_relu},
      {"Sigmoid", &Importer::h_sigmoid},
      {"Tanh", &Importer::h_tanh},
      {"Clip", &Importer::h_clip},
      {"Reshape", &Importer::h_reshape},
      {"Shape", &Importer::h_shape},
      {"Slice", &Importer::h_slice},
      {"Softmax", &Importer::h_softmax},
      {"Split", &Importer::h_split},
      {"Sqrt", &Importer::h_sqrt},
      {"Squeeze", &Importer::h_squeeze},
      {"Sub", &Importer::h_sub},
      {"Transpose", &Importer::h_transpose},
      {"Unsqueeze", &Importer::h_unsqueeze},
      {"Where", &Importer::h_where},
  };
  return table;
}

ImportedGraph Importer::run() {
  const onnx::GraphProto& g = impl_.model.graph();
  if (options_.batch <= 0) throw GraphError("the batch size must be positive, got " + std::to_string(options_.batch));
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
  for (const auto& n : g.node()) {
    node_ = &n;
    if (!n.domain().empty() && n.domain() != "ai.onnx") fail("ops of domain '" + n.domain() + "' are not supported");
    auto it = handlers().find(n.op_type());
    if (it == handlers().end()) {
      std::string list;
      for (const std::string& op : supported_onnx_ops()) list += (list.empty() ? "" : ", ") + op;
      fail("this op is not supported; memplan imports " + list);
    }
    try {
      (this->*(it->second))(n);
    } catch (const graph::SizeError& e) {
      if (std::string_view(e.what()).starts_with("node '")) throw;
      throw graph::SizeError(node_label(n, impl_.opset) + ": " + e.what());
    } catch (const GraphError& e) {
      if (std::string_view(e.what()).starts_with("node '")) throw;
      throw GraphError(node_label(n, impl_.opset) + ": " + e.what());
    }
  }
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

}  // namespace

const std::vector<std::string>& supported_onnx_ops() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> v;
    for (const auto& [name, handler] : Importer::handlers()) v.push_back(name);
    return v;
  }();
  return ops;
}

OnnxModel::OnnxModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OnnxModel::~OnnxModel() = default;

std::int64_t OnnxModel::opset() const { return impl_->opset; }
const std::string& OnnxModel::source() const { return impl_->source; }

Result<std::shared_ptr<const OnnxModel>> OnnxModel::load(const std::string& path) {
  // InputFile refuses what is not a regular file or is too large. The file is mapped, not read:
  // protobuf parses it without the initializers' data, which stays in the mapping (in the page
  // cache) until an import asks for the values; planning never does (a ViT-B is 350 MB of them).
  auto file = InputFile::open(path, kMaxOnnxBytes, "ONNX model");
  if (!file) return file.error();
  const auto size = static_cast<std::size_t>(file.value().size());
  if (size == 0) return parse(std::string_view(), path);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.value().fd(), 0);
  if (mapped == MAP_FAILED) return Error{path + ": cannot map the file into memory: " + std::strerror(errno)};
  std::shared_ptr<const void> storage(mapped, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  auto impl = parse_model(std::string_view(static_cast<const char*>(mapped), size), storage, path);
  if (!impl) return impl.error();
  return finish(std::move(impl).value(), path);
}

Result<std::shared_ptr<const OnnxModel>> OnnxModel::parse(std::string_view bytes, const std::string& source) {
  auto copy = std::make_shared<const std::string>(bytes);  // the initializers' data stays in it
  auto impl = parse_model(*copy, copy, source);
  if (!impl) return impl.error();
  return finish(std::move(impl).value(), source);
}

Result<std::shared_ptr<const OnnxModel>> OnnxModel::finish(std::unique_ptr<Impl> impl, const std::string& source) {
  impl->source = source;
  if (!impl->model.has_graph()) return Error{source + ": the ONNX model has no graph"};
  for (const auto& op : impl->model.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx") impl->opset = op.version();
  }
  if (impl->opset == 0) return Error{source + ": the ONNX model imports no opset of the default domain"};
  return std::shared_ptr<const OnnxModel>(std::make_shared<OnnxModel>(std::move(impl)));
}

ImportedGraph OnnxModel::build(const ImportOptions& options) const { return Importer(*impl_, options).run(); }

Result<ImportedGraph> OnnxModel::try_build(const ImportOptions& options) const {
  try {
    return build(options);
  } catch (const GraphError& e) {
    return Error{e.what()};
  }
}

Result<std::string> OnnxModel::with_initializers(const std::vector<std::pair<std::string, std::vector<float>>>& values) const {
  onnx::ModelProto copy = impl_->model;
  std::map<std::string, const std::vector<float>*> by_name;
  for (const auto& [name, v] : values) by_name[name] = &v;
  std::size_t replaced = 0;
  for (int i = 0; i < copy.graph().initializer_size(); ++i) {
    onnx::TensorProto& t = *copy.mutable_graph()->mutable_initializer(i);
    auto it = by_name.find(t.name());
    if (it == by_name.end()) {
      if (!impl_->raw.empty() && !impl_->raw[static_cast<std::size_t>(i)].empty()) {
        t.set_raw_data(std::string(impl_->raw[static_cast<std::size_t>(i)]));  // the file's values, unchanged
      }
      continue;
    }
    if (t.data_type() != onnx::TensorProto::FLOAT) return Error{"initializer '" + t.name() + "' is not float"};
    std::int64_t n = 1;
    for (std::int64_t d : t.dims()) n *= d;
    if (static_cast<std::int64_t>(it->second->size()) != n) {
      return Error{"initializer '" + t.name() + "' has " + std::to_string(n) + " elements, the trained tensor " + std::to_string(it->second->size())};
    }
    t.clear_float_data();
    t.set_raw_data(std::string(reinterpret_cast<const char*>(it->second->data()), it->second->size() * sizeof(float)));
    ++replaced;
  }
  if (replaced != by_name.size()) return Error{"some trained tensors name no initializer of " + impl_->source};
  std::string out;
  if (!copy.SerializeToString(&out)) return Error{"cannot serialize the ONNX model"};
  return out;
}

}  // namespace memplan::import
