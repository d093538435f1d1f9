// Elementwise arithmetic. Each handler folds constants, continues a recognised pattern
// (LayerNormalization's decomposition, GELU's Erf form, a causal mask), or maps the tensors
// onto one memplan op; broadcasts memplan has no op for are refused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_importer.h"

namespace memplan::import {

using graph::Shape;

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

TensorId add_constant_bias(Importer& im, TensorId x, const Constant& c, const std::string& name) {
  const Shape xs = im.shape_of(x);
  const auto rank = static_cast<std::size_t>(xs.rank());
  if (c.dims.size() > rank) im.fail("the constant " + Shape(c.dims).to_string() + " has more dimensions than " + xs.to_string());
  std::vector<std::int64_t> aligned(rank, 1);
  std::copy(c.dims.begin(), c.dims.end(), aligned.begin() + static_cast<std::ptrdiff_t>(rank - c.dims.size()));
  std::size_t first = 0;
  while (first + 1 < rank && aligned[first] == 1) ++first;
  std::vector<std::int64_t> tail;
  for (std::size_t k = first; k < rank; ++k) {
    if (aligned[k] != 1 && aligned[k] != xs.dims[k]) im.fail("cannot broadcast the constant " + Shape(c.dims).to_string() + " to " + xs.to_string());
    tail.push_back(xs.dims[k]);
  }
  Constant zeros;
  zeros.dims = tail;
  im.check_fold_size(zeros.numel());
  zeros.is_float = true;
  zeros.floats.assign(static_cast<std::size_t>(zeros.numel()), 0.0);
  Constant trimmed = c;
  trimmed.dims.assign(aligned.begin() + static_cast<std::ptrdiff_t>(first), aligned.end());
  const Value bias_values = constant_value(im.fold_binary(trimmed, zeros, std::plus<>()));
  const TensorId bias = im.materialize(bias_values, name + ".as" + Shape(tail).to_string());
  const std::int64_t inner = Shape(tail).numel();
  const TensorId rows = im.reshape_to(x, Shape{xs.numel() / inner, inner}, im.out_name() + ".rows");
  const TensorId sum = im.builder().bias_add(rows, im.reshape_to(bias, Shape{inner}, im.out_name() + ".bias"), im.out_name() + ".sum");
  return im.reshape_to(sum, xs, im.out_name());
}

void h_add(Importer& im, const onnx::NodeProto& n) {
  if (im.is_constant(0) && im.is_constant(1)) return im.set(0, constant_value(im.fold_binary(im.constant(0), im.constant(1), std::plus<>())));
  double s = 0;
  for (int i = 0; i < 2; ++i) {
    if (im.ln_step(i, Value::Kind::ln_variance) && im.is_scalar_constant(1 - i, &s)) {
      Value v = im.ln_value(Value::Kind::ln_variance_eps, im.in(i));
      v.eps = static_cast<float>(s);
      return im.set(0, v);
    }
    if (im.ln_step(i, Value::Kind::ln_scaled) && im.in(1 - i).kind == Value::Kind::initializer) {
      const Value v = im.in(i);
      const TensorId beta = im.tensor(1 - i);
      const std::int64_t d = im.shape_of(v.id).cols();
      if (im.shape_of(beta) != Shape{d}) im.fail("the bias of a LayerNormalization pattern must be [" + std::to_string(d) + "], got " + im.shape_of(beta).to_string());
      return im.set_tensor(0, im.builder().layer_norm(v.id, v.gamma, beta, im.out_name(), v.eps));
    }
  }
  // GELU's decomposition: erf(x / sqrt 2) + 1.
  for (int i = 0; i < 2; ++i) {
    if (im.in(i).kind == Value::Kind::gelu_erf && im.is_scalar_constant(1 - i, &s) && s == 1.0) {
      Value v = im.in(i);
      v.kind = Value::Kind::gelu_erf1;
      return im.set(0, v);
    }
  }
  // An additive causal mask (0 on and below the diagonal, -inf above), read by a Softmax.
  for (int i = 0; i < 2; ++i) {
    const Value& m = (im.in(1 - i).kind == Value::Kind::initializer && im.in(1 - i).constant.numel() <= (std::int64_t{1} << 20)) ? im.loaded(1 - i) : im.in(1 - i);
    if ((m.kind == Value::Kind::constant || m.kind == Value::Kind::initializer) && m.constant.is_float &&
        im.in(i).kind == Value::Kind::tensor && im.shape_of(im.in(i).id).rank() >= 2 &&
        is_causal_mask(m.constant, im.shape_of(im.in(i).id).cols())) {
      return im.set(0, pending(Value::Kind::causal, im.in(i).id));
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (im.in(i).kind == Value::Kind::constant && im.in(i).constant.is_float && im.in(1 - i).kind == Value::Kind::tensor) {
      // A float constant broadcast against x (Swin's mask [1, windows, 1, N, N] on scores
      // [B, windows, heads, N, N]): repeated on the host over x's trailing dims from its first
      // that is not 1, so it becomes a bias read by every leading index.
      return im.set_tensor(0, add_constant_bias(im, im.in(1 - i).id, im.in(i).constant, n.input(i)));
    }
  }
  TensorId a = im.tensor(0), b = im.tensor(1);
  Shape as = im.shape_of(a), bs = im.shape_of(b);
  if (as == bs) return im.set_tensor(0, im.builder().add(a, b, im.out_name()));
  if (as.numel() < bs.numel()) {
    std::swap(a, b);
    std::swap(as, bs);
  }
  // b broadcasts along leading dims only: a bias over the trailing numel(b) elements of each row.
  std::vector<std::int64_t> tail = bs.dims;
  while (!tail.empty() && tail.front() == 1) tail.erase(tail.begin());
  const bool suffix = tail.size() <= as.dims.size() && std::equal(tail.begin(), tail.end(), as.dims.end() - static_cast<std::ptrdiff_t>(tail.size()));
  if (!suffix || n.input_size() != 2) im.fail("memplan adds tensors of equal shape, or a tensor whose shape is a suffix of the other's; got " + as.to_string() + " and " + bs.to_string());
  const std::int64_t inner = bs.numel();
  const TensorId rows = im.reshape_to(a, Shape{as.numel() / inner, inner}, im.out_name() + ".rows");
  const TensorId bias = im.reshape_to(b, Shape{inner}, im.out_name() + ".bias");
  im.set_tensor(0, im.reshape_to(im.builder().bias_add(rows, bias, as.rank() == 2 && as == im.shape_of(rows) ? im.out_name() : im.out_name() + ".sum"), as, im.out_name()));
}

void h_sub(Importer& im, const onnx::NodeProto&) {
  if (im.is_constant(0) && im.is_constant(1)) return im.set(0, constant_value(im.fold_binary(im.constant(0), im.constant(1), std::minus<>())));
  if (im.in(0).kind == Value::Kind::tensor && im.ln_step(1, Value::Kind::ln_mean, im.in(0).id)) {
    return im.set(0, im.ln_value(Value::Kind::ln_centered, im.in(1)));
  }
  const TensorId a = im.tensor(0), b = im.tensor(1);
  if (im.shape_of(a) != im.shape_of(b)) im.fail("memplan subtracts tensors of equal shape, got " + im.shape_of(a).to_string() + " and " + im.shape_of(b).to_string());
  im.set_tensor(0, im.builder().add(a, im.builder().scale(b, -1.0f, im.out_name() + ".negated"), im.out_name()));
}

void h_mul(Importer& im, const onnx::NodeProto&) {
  if (im.is_constant(0) && im.is_constant(1)) return im.set(0, constant_value(im.fold_binary(im.constant(0), im.constant(1), std::multiplies<>())));
  double s = 0;
  for (int i = 0; i < 2; ++i) {
    if (im.ln_step(i, Value::Kind::ln_normalized) && im.in(1 - i).kind == Value::Kind::initializer) {
      Value v = im.ln_value(Value::Kind::ln_scaled, im.in(i));
      v.gamma = im.tensor(1 - i);
      const std::int64_t d = im.shape_of(v.id).cols();
      if (im.shape_of(v.gamma) != Shape{d}) im.fail("the scale of a LayerNormalization pattern must be [" + std::to_string(d) + "], got " + im.shape_of(v.gamma).to_string());
      return im.set(0, v);
    }
  }
  for (int i = 0; i < 2; ++i) {
    const Value& v = im.in(i);
    // GELU's decomposition: x * (1 + erf(x / sqrt 2)), then times 0.5.
    if (v.kind == Value::Kind::gelu_erf1 && im.in(1 - i).kind == Value::Kind::tensor && im.in(1 - i).id == v.id) {
      Value h = v;
      h.kind = Value::Kind::gelu_half;
      return im.set(0, h);
    }
    if (v.kind == Value::Kind::gelu_half && im.is_scalar_constant(1 - i, &s) && s == 0.5) {
      return im.set_tensor(0, im.builder().gelu(v.id, im.out_name()));
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (im.is_scalar_constant(1 - i, &s) && im.in(i).kind != Value::Kind::constant) {
      return im.set_tensor(0, im.builder().scale(im.tensor(i), static_cast<float>(s), im.out_name()));
    }
  }
  const TensorId a = im.tensor(0), b = im.tensor(1);
  // A squeeze-and-excitation gate: [N, C, H, W] * [N, C, 1, 1] (either order) scales each
  // (sample, channel) plane without broadcasting the gate into memory.
  for (int i = 0; i < 2; ++i) {
    const Shape& xs = im.shape_of(i == 0 ? a : b);
    const Shape& gs = im.shape_of(i == 0 ? b : a);
    bool gate = xs != gs && xs.rank() >= 3 && gs.rank() == xs.rank() && gs[0] == xs[0] && gs[1] == xs[1];
    for (int k = 2; gate && k < gs.rank(); ++k) gate = gs[k] == 1;
    if (gate) return im.set_tensor(0, im.builder().channel_scale(i == 0 ? a : b, i == 0 ? b : a, im.out_name()));
  }
  // A per-channel factor shared by the batch, [C, 1, 1] or [1, C, 1, 1] (ConvNeXt's layer scale):
  // repeated over the batch into an [N, C, 1, 1] gate (zeros plus the factor as a bias; the
  // gradient sums over the batch) and applied as above.
  for (int i = 0; i < 2; ++i) {
    const TensorId x = i == 0 ? a : b, factor = i == 0 ? b : a;
    const Shape& xs = im.shape_of(x);
    const Shape& fs = im.shape_of(factor);
    if (xs.rank() < 3 || fs.rank() > xs.rank() || fs.rank() < xs.rank() - 1 || fs.numel() != xs[1] || fs == xs) continue;
    const int lead = xs.rank() - fs.rank();  // fs aligned to xs's last dims
    bool per_channel = true;
    for (int k = 0; per_channel && k < fs.rank(); ++k) per_channel = fs[k] == (k + lead == 1 ? xs[1] : 1);
    if (!per_channel) continue;
    const std::string n = im.out_name();
    const TensorId rows = im.repeat_as_rows(factor, xs[0], n + ".factor");
    Shape gate_shape = xs;
    for (int k = 2; k < gate_shape.rank(); ++k) gate_shape.dims[static_cast<std::size_t>(k)] = 1;
    return im.set_tensor(0, im.builder().channel_scale(x, im.reshape_to(rows, gate_shape, n + ".gate"), n));
  }
  if (im.shape_of(a) != im.shape_of(b)) {
    im.fail("memplan multiplies tensors of equal shape, by a scalar constant, [N, C, ...] by a gate [N, C, 1, ...] or by a "
            "per-channel factor [C, 1, ...]; got " +
         im.shape_of(a).to_string() + " and " + im.shape_of(b).to_string());
  }
  im.set_tensor(0, im.builder().mul(a, b, im.out_name()));
}

void h_div(Importer& im, const onnx::NodeProto&) {
  if (im.is_constant(0) && im.is_constant(1)) {
    const bool ints = !im.constant(0).is_float && !im.constant(1).is_float;
    return im.set(0, constant_value(im.fold_binary(im.constant(0), im.constant(1), [&](double x, double y) {
                     if (y == 0) im.fail("division by zero in a constant");
                     return ints ? std::floor(x / y) : x / y;
                   })));
  }
  if (im.ln_step(0, Value::Kind::ln_centered) && im.ln_step(1, Value::Kind::ln_std, im.in(0).id)) {
    return im.set(0, im.ln_value(Value::Kind::ln_normalized, im.in(1)));
  }
  double s = 0;
  if (!im.is_scalar_constant(1, &s) || s == 0) im.fail("memplan divides a tensor by a non-zero scalar constant only");
  if (im.in(0).kind == Value::Kind::tensor && std::fabs(s - std::sqrt(2.0)) < 1e-5) {
    // Perhaps GELU's x / sqrt 2: kept pending, a scale op if anything else reads it.
    return im.set(0, pending(Value::Kind::gelu_scaled, im.in(0).id));
  }
  im.set_tensor(0, im.builder().scale(im.tensor(0), static_cast<float>(1.0 / s), im.out_name()));
}

// Pow: (x - mean)^2 of LayerNormalization's decomposition, or any tensor squared.
void h_pow(Importer& im, const onnx::NodeProto&) {
  if (im.is_constant(0) && im.is_constant(1)) {
    // Constants (Swin's head_dim ** -0.5): the result has the base's type, as ONNX says.
    Constant base = im.constant(0);
    const bool base_float = base.is_float;
    if (!base_float) {
      for (std::int64_t v : base.ints) base.floats.push_back(static_cast<double>(v));
      base.ints.clear();
      base.is_float = true;
    }
    Constant c = im.fold_binary(base, im.constant(1), [](double a, double b) { return std::pow(a, b); });
    if (!base_float) {
      for (double f : c.floats) c.ints.push_back(im.to_int(std::trunc(f)));
      c.floats.clear();
      c.is_float = false;
    }
    return im.set(0, constant_value(std::move(c)));
  }
  double p = 0;
  if (!im.is_scalar_constant(1, &p) || p != 2.0) im.fail("memplan imports Pow with the constant exponent 2 only");
  if (im.ln_step(0, Value::Kind::ln_centered)) return im.set(0, im.ln_value(Value::Kind::ln_squared, im.in(0)));
  const TensorId x = im.tensor(0);
  im.set_tensor(0, im.builder().mul(x, x, im.out_name()));
}

}  // namespace

HandlerRows arithmetic_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Add", h_add},
      {"Sub", h_sub},
      {"Mul", h_mul},
      {"Div", h_div},
      {"Pow", h_pow},
  };
  return rows;
}

}  // namespace memplan::import
