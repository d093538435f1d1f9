// Constants folded while importing: nothing here adds a graph op.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_importer.h"

namespace memplan::import {

using graph::Shape;

namespace {

void h_shape(Importer& im, const onnx::NodeProto&) {
  const Value& v = im.in(0);
  std::vector<std::int64_t> dims;
  if (v.kind == Value::Kind::constant || v.kind == Value::Kind::initializer) {
    dims = v.constant.dims;
  } else if (v.kind == Value::Kind::transposed) {
    dims = im.shape_of(v.id).dims;
    std::swap(dims[0], dims[1]);
  } else {
    dims = im.shape_of(v.kind == Value::Kind::tensor ? v.id : im.tensor(0)).dims;
  }
  const std::int64_t r = static_cast<std::int64_t>(dims.size());
  std::int64_t start = im.attr_int("start", 0), end = im.attr_int("end", r);
  start = std::clamp<std::int64_t>(start < 0 ? start + r : start, 0, r);
  end = std::clamp<std::int64_t>(end < 0 ? end + r : end, 0, r);
  im.set(0, constant_value(int_list({dims.begin() + start, dims.begin() + std::max(start, end)})));
}

void h_constant(Importer& im, const onnx::NodeProto&) {
  Constant c;
  if (const auto* a = im.attr("value")) {
    auto r = read_tensor_proto(a->t(), a->t().raw_data());
    if (!r) im.fail(r.error().message);
    c = std::move(r).value();
  } else if (const auto* f = im.attr("value_float")) {
    c.is_float = true;
    c.floats = {f->f()};
  } else if (const auto* i = im.attr("value_int")) {
    c.ints = {i->i()};
  } else if (const auto* is = im.attr("value_ints")) {
    c = int_list({is->ints().begin(), is->ints().end()});
  } else if (const auto* fs = im.attr("value_floats")) {
    c.is_float = true;
    c.floats.assign(fs->floats().begin(), fs->floats().end());
    c.dims = {static_cast<std::int64_t>(c.floats.size())};
  } else {
    im.fail("a Constant without a value, value_float, value_int, value_ints or value_floats attribute");
  }
  im.set(0, constant_value(c));
}

void h_constant_of_shape(Importer& im, const onnx::NodeProto&) {
  Constant c;
  c.dims = im.ints_of(0);
  for (std::int64_t d : c.dims) {
    if (d < 0 || d > (std::int64_t{1} << 24)) im.fail("a dimension " + std::to_string(d) + " outside [0, 2^24]");
  }
  double v = 0;
  bool is_float = true;
  if (const auto* a = im.attr("value")) {
    auto r = read_tensor_proto(a->t(), a->t().raw_data());
    if (!r || r.value().numel() != 1) im.fail("value must be a one-element tensor");
    v = r.value().at(0);
    is_float = r.value().is_float;
  }
  const std::int64_t n = c.numel();
  im.check_fold_size(n);
  c.is_float = is_float;
  if (is_float) {
    c.floats.assign(static_cast<std::size_t>(n), v);
  } else {
    c.ints.assign(static_cast<std::size_t>(n), im.to_int(v));
  }
  im.set(0, constant_value(c));
}

void h_range(Importer& im, const onnx::NodeProto&) {
  const double start = im.constant(0).at(0), limit = im.constant(1).at(0), delta = im.constant(2).at(0);
  if (delta == 0) im.fail("delta 0");
  Constant c;
  c.is_float = im.constant(0).is_float;
  const double count = std::max(std::ceil((limit - start) / delta), 0.0);
  if (!(count <= double(std::int64_t{1} << 24))) im.fail("a range too large to fold");
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(count); ++i) {
    if (c.is_float) {
      c.floats.push_back(start + double(i) * delta);
    } else {
      c.ints.push_back(im.to_int(start + double(i) * delta));
    }
  }
  c.dims = {static_cast<std::int64_t>(count)};
  im.set(0, constant_value(c));
}

void h_equal(Importer& im, const onnx::NodeProto&) {
  Constant c = im.fold_binary(im.constant(0), im.constant(1), [](double a, double b) { return a == b ? 1.0 : 0.0; });
  if (c.is_float) {
    for (double f : c.floats) c.ints.push_back(im.to_int(f));
    c.floats.clear();
    c.is_float = false;
  }
  im.set(0, constant_value(std::move(c)));
}

// Mod of constants (Swin's window padding, (w - W % w) % w): fmod 0 takes the divisor's sign, as
// Python's %; fmod 1 the dividend's, as C's. A zero divisor is refused.
void h_mod(Importer& im, const onnx::NodeProto&) {
  const bool fmod = im.attr_int("fmod", 0) != 0;
  Constant c = im.fold_binary(im.constant(0), im.constant(1), [&](double a, double b) {
    if (b == 0.0) im.fail("a constant divided by zero");
    const double r = std::fmod(a, b);
    return !fmod && r != 0.0 && (r < 0.0) != (b < 0.0) ? r + b : r;
  });
  im.set(0, constant_value(std::move(c)));
}

void h_where(Importer& im, const onnx::NodeProto&) {
  const Constant& cond = im.constant(0);
  // where(c, a, b) = c * a + (1 - c) * b, elementwise with broadcasting, on constants only.
  const Constant picked_a = im.fold_binary(cond, im.constant(1), [](double c, double a) { return c != 0 ? a : 0.0; });
  const Constant picked_b = im.fold_binary(cond, im.constant(2), [](double c, double b) { return c != 0 ? 0.0 : b; });
  Constant r = im.fold_binary(picked_a, picked_b, std::plus<>());
  if (!im.constant(1).is_float && !im.constant(2).is_float && r.is_float) {
    for (double f : r.floats) r.ints.push_back(im.to_int(f));
    r.floats.clear();
    r.is_float = false;
  }
  im.set(0, constant_value(std::move(r)));
}

void h_not(Importer& im, const onnx::NodeProto&) {
  Constant c = im.constant(0);
  if (c.is_float) im.fail("Not of a float constant");
  for (std::int64_t& v : c.ints) v = v == 0 ? 1 : 0;
  im.set(0, constant_value(std::move(c)));
}

// ScatterND of constants (Swin builds its shifted-window mask by assigning slices of a zero
// tensor): data with updates written at the index tuples, in order (reduction "none" only).
void h_scatter_nd(Importer& im, const onnx::NodeProto&) {
  const auto* reduction = im.attr("reduction");
  if (reduction != nullptr && reduction->s() != "none") im.fail("ScatterND with reduction '" + reduction->s() + "' is not supported");
  Constant data = im.constant(0);
  const Constant& indices = im.constant(1);
  const Constant& updates = im.constant(2);
  const auto rank = data.dims.size();
  if (indices.dims.empty()) im.fail("indices must have at least one dimension");
  const auto k = static_cast<std::size_t>(indices.dims.back());
  if (k < 1 || k > rank) im.fail("index tuples of " + std::to_string(k) + " entries into a rank " + std::to_string(rank) + " tensor");
  // Each index tuple names a slice of the trailing rank - k dimensions.
  std::int64_t slice = 1;
  for (std::size_t d = k; d < rank; ++d) slice *= data.dims[d];
  const std::int64_t tuples = indices.numel() / static_cast<std::int64_t>(k);
  if (updates.numel() != tuples * slice) im.fail("updates hold " + std::to_string(updates.numel()) + " values, the indices address " + std::to_string(tuples * slice));
  for (std::int64_t t = 0; t < tuples; ++t) {
    std::int64_t offset = 0;
    for (std::size_t j = 0; j < k; ++j) {
      std::int64_t i = im.to_int(indices.at(t * static_cast<std::int64_t>(k) + static_cast<std::int64_t>(j)));
      if (i < 0) i += data.dims[j];
      if (i < 0 || i >= data.dims[j]) im.fail("index " + std::to_string(i) + " out of range for a dimension of " + std::to_string(data.dims[j]));
      offset = offset * data.dims[j] + i;
    }
    for (std::int64_t e = 0; e < slice; ++e) {
      const auto dst = static_cast<std::size_t>(offset * slice + e);
      const double value = updates.at(t * slice + e);
      if (data.is_float) {
        data.floats[dst] = value;
      } else {
        data.ints[dst] = im.to_int(value);
      }
    }
  }
  im.set(0, constant_value(std::move(data)));
}

}  // namespace

HandlerRows constant_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Shape", h_shape},
      {"Constant", h_constant},
      {"ConstantOfShape", h_constant_of_shape},
      {"Range", h_range},
      {"Equal", h_equal},
      {"Where", h_where},
      {"Mod", h_mod},
      {"Not", h_not},
      {"ScatterND", h_scatter_nd},
  };
  return rows;
}

}  // namespace memplan::import
