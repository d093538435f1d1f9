#include "memplan/graph/quantize.h"

#include <algorithm>
#include <utility>

#include "memplan/graph/grad_context_internal.h"
#include "memplan/graph/linear_layers_internal.h"
#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace linear_layers;
using namespace op_rules;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// One storage tensor of a quantized weight: its name suffix, shape and dtype.
struct Part {
  std::string suffix;
  std::int64_t numel;
  DType dtype;
};

// The storage tensors of a [out, in] weight, in the order quant_matmul reads them.
std::vector<Part> layout_parts(const QuantConfig& c, std::int64_t out, std::int64_t in) {
  const std::int64_t numel = checked_mul(out, in);
  switch (c.format) {
    case QuantFormat::nf4:
    case QuantFormat::fp4: {
      const std::int64_t blocks = ceil_div(numel, kQuant4BitBlock);
      if (!c.double_quant) return {{".quant", ceil_div(numel, 2), DType::u8}, {".absmax", blocks, DType::f32}};
      return {{".quant", ceil_div(numel, 2), DType::u8},
              {".absmax", blocks, DType::u8},
              {".absmax2", ceil_div(blocks, kQuantDoubleBlock), DType::f32},
              {".offset", 1, DType::f32}};
    }
    case QuantFormat::int8: return {{".quant", numel, DType::u8}, {".row_scale", out, DType::f32}};
    case QuantFormat::fp8: return {{".quant", numel, DType::u8}, {".scale", 1, DType::f32}};
    case QuantFormat::gptq:
    case QuantFormat::awq: {
      const std::int64_t g = c.group_size;
      if (g <= 0 || in % g != 0 || in % 2 != 0 || out % 2 != 0) {
        throw GraphError("--group-size " + std::to_string(g) + " does not divide the " + std::to_string(in) +
                         " input channels of a [" + std::to_string(out) + ", " + std::to_string(in) +
                         "] weight (packed int4 also needs even sizes): pick a divisor such as 32, 64 or 128");
      }
      const std::int64_t groups = in / g;
      std::vector<Part> parts = {{".qweight", numel / 2, DType::u8},
                                 {".qzeros", groups * out / 2, DType::u8},
                                 {".scales", groups * out, DType::f16}};
      if (c.format == QuantFormat::gptq) parts.push_back({".g_idx", in, DType::i32});
      return parts;
    }
    case QuantFormat::none: break;
  }
  throw GraphError("no quantized layout for format none");
}

// A random quantized weight of about the scale the models initialise theirs at (N(0, 0.02)):
// every code drawn uniformly (u8 values are initialised modulo 256), scales uniform in +-0.05
// (a negative scale flips its block, which is as random). Zero offsets and GPTQ's g_idx.
InitSpec storage_init(const Part& part) {
  if (part.dtype == DType::u8) return {InitSpec::Kind::uniform, 128.0f};
  if (part.suffix == ".offset" || part.suffix == ".g_idx") return {InitSpec::Kind::zeros, 0.0f};
  return {InitSpec::Kind::uniform, 0.05f};
}

OutputSpec infer_quant_matmul(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("quant_matmul", x);
  if (attrs.shape.size() != 2) fail("quant_matmul", "the weight's shape [out, in] is required in attrs.shape");
  const std::int64_t out = attrs.shape[0], width = attrs.shape[1];
  QuantConfig c{attrs.quant, attrs.double_quant, attrs.group_size};
  const std::vector<Part> parts = layout_parts(c, out, width);
  if (in.size() != parts.size() + 1) {
    fail("quant_matmul", "a " + std::string(enum_name(kQuantFormatNames, attrs.quant)) + " weight has " +
                             std::to_string(parts.size()) + " storage tensors, got " + std::to_string(in.size() - 1));
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const TensorDesc& t = *in[i + 1];
    if (t.shape.numel() != parts[i].numel || t.dtype != parts[i].dtype) {
      fail("quant_matmul", "storage '" + t.name + "' " + t.shape.to_string() + " " + std::string(dtype_name(t.dtype)) +
                               " is not the layout's [" + std::to_string(parts[i].numel) + "] " +
                               std::string(dtype_name(parts[i].dtype)));
    }
  }
  const std::int64_t k = attrs.trans_b ? width : out, n = attrs.trans_b ? out : width;
  if (x.shape.rank() != 2 || x.shape[1] != k) {
    fail("quant_matmul", "input '" + x.name + "' " + x.shape.to_string() + " must be [N, " + std::to_string(k) + "]");
  }
  return {Shape{x.shape[0], n}, x.dtype};
}

double flops_quant_matmul(Inputs in, const TensorDesc* out) {
  return 2.0 * double(in[0]->shape.numel()) * double(out->shape[1]);
}

// A tile of kQuantTileRows dequantized rows of W, in f32.
constexpr std::int64_t kQuantTileRows = 64;
std::int64_t scratch_quant_matmul(Inputs, const OpAttrs& attrs) {
  return std::min(kQuantTileRows, attrs.shape[0]) * attrs.shape[1] * std::int64_t{4};
}

// Only the input has a gradient: the weight is frozen.
void grad_quant_matmul(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  if (!c.needs_grad(x)) return;
  std::vector<TensorId> inputs = op.inputs;
  inputs[0] = dy;
  OpAttrs attrs = op.attrs;
  attrs.trans_b = !op.attrs.trans_b;
  c.accumulate(x, c.emit(OpKind::quant_matmul, std::move(inputs), attrs, c.gname(x)));
}

const OpInfo kQuantRows[] = {
  {.kind = OpKind::quant_matmul, .name = "quant_matmul", .num_inputs = kVariadic, .num_updates = 0, .num_outputs = 1,
    .infer = infer_quant_matmul, .flops = flops_quant_matmul, .grad = grad_quant_matmul, .scratch = scratch_quant_matmul},
};

}  // namespace

std::span<const OpInfo> quant_rows() { return kQuantRows; }

QuantLayout quant_layout(const QuantConfig& config, std::int64_t out, std::int64_t in) {
  QuantLayout layout;
  const std::vector<Part> parts = layout_parts(config, out, in);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Bytes bytes = parts[i].numel * dtype_size(parts[i].dtype);
    (i == 0 ? layout.data : layout.constants) += bytes;
  }
  return layout;
}

std::vector<TensorId> add_quantized_weight(Graph& g, const std::string& name, std::int64_t out, std::int64_t in,
                                           const QuantConfig& config) {
  std::vector<TensorId> storage;
  for (const Part& part : layout_parts(config, out, in)) {
    TensorDesc s;
    s.name = name + part.suffix;
    s.shape = Shape{part.numel};
    s.dtype = part.dtype;
    s.role = Role::parameter;
    s.frozen = true;
    s.init = storage_init(part);
    storage.push_back(g.add_tensor(std::move(s)));
  }
  return storage;
}

TensorId add_quant_matmul(Graph& g, TensorId x, const std::vector<TensorId>& storage, std::int64_t out, std::int64_t in,
                          const QuantConfig& config, const std::string& name, Role role, Phase phase) {
  std::vector<TensorId> inputs = {x};
  inputs.insert(inputs.end(), storage.begin(), storage.end());
  OpAttrs attrs;
  attrs.trans_b = true;
  attrs.quant = config.format;
  attrs.double_quant = config.double_quant;
  attrs.group_size = config.group_size;
  attrs.shape = {out, in};
  return g.add_op(OpKind::quant_matmul, std::move(inputs), std::move(attrs), name, role, phase);
}

QuantReport quantize_frozen_linears(Graph& g, const QuantConfig& config) {
  QuantReport report;
  if (!config.active()) return report;
  if (config.double_quant && config.format != QuantFormat::nf4 && config.format != QuantFormat::fp4) {
    throw GraphError("--double-quant applies to --quant nf4 and fp4 (bitsandbytes' 4-bit block scales)");
  }
  const std::set<TensorId> heads = head_weights(g);
  std::vector<bool> quantize(static_cast<std::size_t>(g.num_tensors()), false);
  bool any_linear = false;
  for (const Op& op : g.ops()) {
    const TensorId w = linear_weight(g, op);
    if (w == kNoTensor || heads.count(w)) continue;
    any_linear = true;
    if (g.tensor(w).frozen) quantize[static_cast<std::size_t>(w)] = true;
  }
  // A weight read by anything but linear products (a tied head) stays as it is.
  for (const Op& op : g.ops()) {
    for (std::size_t slot = 0; slot < op.inputs.size(); ++slot) {
      const TensorId t = op.inputs[slot];
      if (quantize[static_cast<std::size_t>(t)] && (slot != 1 || linear_weight(g, op) != t)) quantize[static_cast<std::size_t>(t)] = false;
    }
  }
  if (!any_linear) throw GraphError("--quant: this model has no linear layers to quantize");
  for (const Op& op : g.ops()) {
    if (op.kind != OpKind::batched_matmul || op.inputs.size() < 2) continue;
    const TensorDesc& w = g.tensor(op.inputs[1]);
    if (w.role == Role::parameter && w.frozen && w.shape.rank() == 3) {
      ++report.expert_weights_left;
      report.expert_bytes_left += w.size_bytes();
    }
  }
  if (std::none_of(quantize.begin(), quantize.end(), [](bool q) { return q; })) {
    throw GraphError("--quant quantizes frozen linear weights, and none is frozen: add --lora RANK (QLoRA) or --freeze PATTERN");
  }
  // The graph again, each quantized weight replaced by its storage and its products by quant_matmul.
  Graph q;
  std::vector<TensorId> map(static_cast<std::size_t>(g.num_tensors()), kNoTensor);
  std::vector<std::vector<TensorId>> storage(static_cast<std::size_t>(g.num_tensors()));
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    if (g.producer(id) >= 0) continue;
    const TensorDesc& d = g.tensor(id);
    if (!quantize[static_cast<std::size_t>(id)]) {
      map[static_cast<std::size_t>(id)] = q.add_tensor(d);
      continue;
    }
    storage[static_cast<std::size_t>(id)] = add_quantized_weight(q, d.name, d.shape[0], d.shape[1], config);
    const QuantLayout layout = quant_layout(config, d.shape[0], d.shape[1]);
    ++report.quantized_layers;
    report.quantized_params += d.shape.numel();
    report.full_bytes += d.size_bytes();
    report.data_bytes += layout.data;
    report.constant_bytes += layout.constants;
  }
  auto mapped = [&](const std::vector<TensorId>& ids) {
    std::vector<TensorId> out;
    for (TensorId t : ids) out.push_back(map[static_cast<std::size_t>(t)]);
    return out;
  };
  for (const Op& op : g.ops()) {
    const TensorDesc* out = op.outputs.empty() ? nullptr : &g.tensor(op.outputs[0]);
    const TensorId w = linear_weight(g, op);
    TensorId made;
    if (w != kNoTensor && quantize[static_cast<std::size_t>(w)]) {
      made = add_quant_matmul(q, map[static_cast<std::size_t>(op.inputs[0])], storage[static_cast<std::size_t>(w)],
                              g.tensor(w).shape[0], g.tensor(w).shape[1], config, out->name, out->role, op.phase);
    } else {
      made = q.add_op(op.kind, mapped(op.inputs), op.attrs, out != nullptr ? out->name : op.name,
                      out != nullptr ? out->role : Role::temporary, op.phase, mapped(op.updates));
    }
    if (out == nullptr) continue;
    TensorDesc& desc = q.mutable_tensor(made);
    desc.init = out->init;
    desc.external = out->external;
    map[static_cast<std::size_t>(op.outputs[0])] = made;
  }
  auto remap = [&](TensorId t) { return t == kNoTensor ? kNoTensor : map[static_cast<std::size_t>(t)]; };
  q.loss = remap(g.loss);
  q.output = remap(g.output);
  for (TensorId t : g.retained) q.retained.push_back(remap(t));
  g = std::move(q);
  return report;
}

}  // namespace memplan::graph
