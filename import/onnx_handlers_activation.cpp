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

// HardSwish(x) = x * relu6(x + 3) / 6, written as (x * clip(x, -3, 3) + 3 x) / 6: the same values
// and the same gradients (0 below -3, 1 above 3, (2x + 3) / 6 between) from ops memplan has.
void h_hard_swish(Importer& im, const onnx::NodeProto&) {
  graph::Builder& b = im.builder();
  const TensorId x = im.tensor(0);
  const std::string n = im.out_name();
  const TensorId product = b.mul(x, b.clip(x, -3.0f, 3.0f, n + ".clip"), n + ".x_clip");
  im.set_tensor(0, b.scale(b.add(product, b.scale(x, 3.0f, n + ".3x"), n + ".sum"), 1.0f / 6.0f, n));
}

// HardSigmoid(x) = clip(alpha x + beta, 0, 1) = alpha clip(x, -beta/alpha, (1 - beta)/alpha) + beta;
// the constant beta is a filled tensor of x's shape (MobileNetV3 gates [N, C, 1, 1] with it).
void h_hard_sigmoid(Importer& im, const onnx::NodeProto&) {
  const float alpha = im.attr_float("alpha", 0.2f), beta = im.attr_float("beta", 0.5f);
  if (!(alpha > 0.0f) || !std::isfinite(alpha) || !std::isfinite(beta)) {
    im.fail("alpha " + std::to_string(alpha) + " must be positive and beta finite");
  }
  graph::Builder& b = im.builder();
  const TensorId x = im.tensor(0);
  const std::string n = im.out_name();
  const TensorId clipped = b.clip(x, -beta / alpha, (1.0f - beta) / alpha, n + ".clip");
  const TensorId offset = b.fill(im.shape_of(x), beta, im.desc(x).dtype, n + ".beta");
  im.set_tensor(0, b.add(b.scale(clipped, alpha, n + ".scaled"), offset, n));
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
      {"HardSwish", h_hard_swish},
      {"HardSigmoid", h_hard_sigmoid},
      {"Gelu", h_gelu},
      {"Erf", h_erf},
      {"Softmax", h_softmax},
      {"Dropout", h_dropout},
  };
  return rows;
}

}  // namespace memplan::import
