// Activations, softmax and dropout: one memplan op each. Erf exists only as a step of GELU's
// exact form, x * 0.5 * (1 + erf(x / sqrt 2)), which Add and Mul (arithmetic) finish.
#include <cmath>
#include <limits>
#include <string>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_importer.h"

namespace memplan::import {

namespace {

void h_relu(Importer& im, const onnx::NodeProto&) { im.set_tensor(0, im.builder().relu(im.tensor(0), im.out_name())); }

void h_sigmoid(Importer& im, const onnx::NodeProto&) { im.set_tensor(0, im.builder().sigmoid(im.tensor(0), im.out_name())); }

void h_tanh(Importer& im, const onnx::NodeProto&) { im.set_tensor(0, im.builder().tanh(im.tensor(0), im.out_name())); }

// Clip's bounds: constant inputs 1 and 2 (opset 11+) or the min/max attributes (earlier); a bound
// left out is open.
void h_clip(Importer& im, const onnx::NodeProto&) {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  if (const auto* a = im.attr("min")) lo = a->f();
  if (const auto* a = im.attr("max")) hi = a->f();
  if (im.has_in(1) && !im.is_scalar_constant(1, &lo)) im.fail("the min bound must be a constant scalar");
  if (im.has_in(2) && !im.is_scalar_constant(2, &hi)) im.fail("the max bound must be a constant scalar");
  if (std::isnan(lo) || std::isnan(hi) || lo > hi) im.fail("the bounds [" + std::to_string(lo) + ", " + std::to_string(hi) + "] are not a range");
  im.set_tensor(0, im.builder().clip(im.tensor(0), static_cast<float>(lo), static_cast<float>(hi), im.out_name()));
}

void h_gelu(Importer& im, const onnx::NodeProto&) {
  if (const auto* a = im.attr("approximate"); a && a->s() != "none") im.fail("only the exact (erf) GELU is supported");
  im.set_tensor(0, im.builder().gelu(im.tensor(0), im.out_name()));
}

void h_erf(Importer& im, const onnx::NodeProto&) {
  Value v = im.in(0);
  if (v.kind != Value::Kind::gelu_scaled) im.fail("memplan imports Erf only as part of GELU (x * 0.5 * (1 + erf(x / sqrt(2))))");
  v.kind = Value::Kind::gelu_erf;
  im.set(0, v);
}

void h_softmax(Importer& im, const onnx::NodeProto&) {
  const Value& v = im.in(0);
  const bool causal = v.kind == Value::Kind::causal;
  const TensorId x = causal ? v.id : im.tensor(0);
  const int rank = im.shape_of(x).rank();
  if (im.axis_of(im.attr_int("axis", -1), rank) != rank - 1) im.fail("memplan's softmax runs over the last axis");
  im.set_tensor(0, im.builder().softmax(x, causal, im.out_name()));
}

void h_dropout(Importer& im, const onnx::NodeProto&) {
  double ratio = im.attr_float("ratio", 0.5f);
  if (im.has_in(1) && !im.is_scalar_constant(1, &ratio)) im.fail("the ratio must be a constant");
  double training = 0;
  if (im.has_in(2) && !im.is_scalar_constant(2, &training)) im.fail("training_mode must be a constant");
  // Opset 12+: inference unless training_mode says otherwise; memplan trains what it imports, so
  // an exported Dropout keeps its ratio either way (documented in docs/onnx_import.md).
  if (ratio < 0 || ratio >= 1) im.fail("ratio " + std::to_string(ratio) + " is outside [0, 1)");
  im.set(1, pending(Value::Kind::unavailable, kNoTensor));  // the mask: an error only if something reads it
  if (!im.options().training) return im.set(0, im.in(0));  // evaluation: the identity
  im.set_tensor(0, im.builder().dropout(im.tensor(0), static_cast<float>(ratio), im.out_name()));
}

}  // namespace

HandlerRows activation_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Relu", h_relu},
      {"Sigmoid", h_sigmoid},
      {"Tanh", h_tanh},
      {"Clip", h_clip},
      {"Gelu", h_gelu},
      {"Erf", h_erf},
      {"Softmax", h_softmax},
      {"Dropout", h_dropout},
  };
  return rows;
}

}  // namespace memplan::import
