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
  if (n > (std::int64_t{1} << 24)) im.fail("a constant of " + std::to_string(n) + " elements is too large to fold");
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

}  // namespace

HandlerRows constant_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Shape", h_shape},
      {"Constant", h_constant},
      {"ConstantOfShape", h_constant_of_shape},
      {"Range", h_range},
      {"Equal", h_equal},
      {"Where", h_where},
  };
  return rows;
}

}  // namespace memplan::import
