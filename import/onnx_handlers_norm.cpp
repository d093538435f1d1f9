// Normalisation: BatchNormalization, LayerNormalization, and the ReduceMean and Sqrt steps of
// LayerNormalization as opsets before 17 export it (the arithmetic family holds the other steps).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_importer.h"

namespace memplan::import {

using graph::Shape;

namespace {

void h_batch_norm(Importer& im, const onnx::NodeProto& n) {
  const TensorId x = im.tensor(0);
  const TensorId gamma = im.tensor(1), beta = im.tensor(2), mean = im.tensor(3), var = im.tensor(4);
  const std::int64_t c = im.shape_of(x).rank() >= 2 ? im.shape_of(x)[1] : -1;
  for (TensorId t : {gamma, beta, mean, var}) {
    if (im.shape_of(t) != Shape{c}) im.fail("'" + im.desc(t).name + "' is " + im.shape_of(t).to_string() + ", the input " + im.shape_of(x).to_string() + " has " + std::to_string(c) + " channels");
  }
  // ONNX: running = running * momentum + batch * (1 - momentum); memplan's momentum is the batch's share.
  const float momentum = 1.0f - im.attr_float("momentum", 0.9f);
  im.set_tensor(0, im.builder().batch_norm(x, gamma, beta, mean, var, im.options().training, im.out_name(), momentum, im.attr_float("epsilon", 1e-5f)));
  for (int i = 1; i < n.output_size(); ++i) {
    if (!n.output(i).empty()) im.set_tensor(i, i == 1 ? mean : var);  // the updated running statistics
  }
}

void h_layer_norm(Importer& im, const onnx::NodeProto& n) {
  const TensorId x = im.tensor(0);
  const Shape xs = im.shape_of(x);
  if (im.axis_of(im.attr_int("axis", -1), xs.rank()) != xs.rank() - 1) im.fail("memplan normalises over the last axis only");
  if (!im.has_in(2)) im.fail("a LayerNormalization without a bias is not supported");
  for (int i = 1; i < n.output_size(); ++i) {
    if (!n.output(i).empty()) im.fail("the Mean and InvStdDev outputs are not supported");
  }
  const TensorId gamma = im.tensor(1), beta = im.tensor(2);
  if (im.shape_of(gamma) != Shape{xs.cols()} || im.shape_of(beta) != Shape{xs.cols()}) im.fail("scale and bias must be [" + std::to_string(xs.cols()) + "]");
  im.set_tensor(0, im.builder().layer_norm(x, gamma, beta, im.out_name(), im.attr_float("epsilon", 1e-5f)));
}

// ReduceMean: the mean and variance of LayerNormalization's decomposition (over the last axis,
// kept), or a global average pool (over H and W of [N, C, H, W]).
void h_reduce_mean(Importer& im, const onnx::NodeProto&) {
  std::vector<std::int64_t> axes = im.attr_ints("axes");
  if (im.has_in(1)) axes = im.ints_of(1);  // opset 18: an input
  const bool keep = im.attr_int("keepdims", 1) != 0;
  const Value& v = im.in(0);
  const int rank = v.kind == Value::Kind::tensor || v.kind == Value::Kind::ln_squared ? im.shape_of(v.id).rank() : -1;
  if (rank < 0) im.fail("memplan reduces graph tensors only");
  for (std::int64_t& a : axes) a = im.axis_of(a, rank);
  std::sort(axes.begin(), axes.end());
  if (keep && axes == std::vector<std::int64_t>{rank - 1}) {
    if (v.kind == Value::Kind::tensor) return im.set(0, im.ln_value(Value::Kind::ln_mean, v));
    return im.set(0, im.ln_value(Value::Kind::ln_variance, v));
  }
  if (v.kind == Value::Kind::tensor && rank == 4 && axes == std::vector<std::int64_t>{2, 3}) {
    const TensorId pooled = im.builder().global_avg_pool(v.id, im.out_name() + (keep ? ".pooled" : ""));
    if (!keep) return im.set_tensor(0, pooled);
    const Shape xs = im.shape_of(v.id);
    return im.set_tensor(0, im.builder().reshape(pooled, Shape{xs[0], xs[1], 1, 1}, im.out_name()));
  }
  im.fail("memplan imports ReduceMean over the last axis with keepdims within LayerNormalization's decomposition, or "
       "over axes [2, 3] of a [N, C, H, W] tensor (a global average pool)");
}

void h_sqrt(Importer& im, const onnx::NodeProto&) {
  if (im.ln_step(0, Value::Kind::ln_variance_eps)) return im.set(0, im.ln_value(Value::Kind::ln_std, im.in(0)));
  im.fail("memplan imports Sqrt only within LayerNormalization's decomposition (the square root of variance + eps)");
}

}  // namespace

HandlerRows norm_handlers() {
  static constexpr HandlerRow rows[] = {
      {"BatchNormalization", h_batch_norm},
      {"LayerNormalization", h_layer_norm},
      {"ReduceMean", h_reduce_mean},
      {"Sqrt", h_sqrt},
  };
  return rows;
}

}  // namespace memplan::import
