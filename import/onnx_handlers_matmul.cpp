// Matrix products: Gemm and MatMul as memplan matmul (a GEMM over rows) or batched_matmul.
#include <cstdint>
#include <string>
#include <vector>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_importer.h"

namespace memplan::import {

using graph::Shape;

namespace {

void h_gemm(Importer& im, const onnx::NodeProto& node) {
  if (im.attr_float("alpha", 1.0f) != 1.0f || im.attr_float("beta", 1.0f) != 1.0f) im.fail("Gemm with alpha or beta other than 1 is not supported");
  const TensorId a = im.tensor(0), b = im.tensor(1);
  const bool ta = im.attr_int("transA", 0) != 0, tb = im.attr_int("transB", 0) != 0;
  TensorId y = im.builder().matmul(a, b, ta, tb, im.has_in(2) ? im.out_name() + ".matmul" : im.out_name());
  if (im.has_in(2)) {
    const TensorId c = im.tensor(2);
    const std::int64_t n = im.shape_of(y)[1];
    if (im.shape_of(c) != Shape{n} && im.shape_of(c) != Shape{1, n}) im.fail("memplan adds Gemm's C as a bias of [" + std::to_string(n) + "], got " + im.shape_of(c).to_string());
    y = im.builder().bias_add(y, im.reshape_to(c, Shape{n}, node.input(2) + ".row"), im.out_name());
  }
  im.set_tensor(0, y);
}

void h_matmul(Importer& im, const onnx::NodeProto&) {
  const Value& bv = im.in(1);
  const TensorId a = im.tensor(0);
  const Shape as = im.shape_of(a);
  // Activations times a 2-D weight (transposed in the file or not): one GEMM over the rows.
  if (bv.kind == Value::Kind::transposed || (bv.kind == Value::Kind::initializer && bv.constant.dims.size() == 2) ||
      (bv.kind == Value::Kind::tensor && im.shape_of(bv.id).rank() == 2)) {
    const bool tb = bv.kind == Value::Kind::transposed;
    const TensorId w = tb ? bv.id : im.tensor(1);
    const Shape ws = im.shape_of(w);
    const std::int64_t k = tb ? ws[1] : ws[0], n = tb ? ws[0] : ws[1];
    if (as.rank() < 2 || as.cols() != k) im.fail("cannot multiply " + as.to_string() + " by a [" + std::to_string(k) + ", " + std::to_string(n) + "] matrix");
    const TensorId rows = im.reshape_to(a, Shape{as.rows(), k}, im.out_name() + ".rows");
    TensorId y = im.builder().matmul(rows, w, false, tb, as.rank() == 2 ? im.out_name() : im.out_name() + ".matmul");
    std::vector<std::int64_t> dims = as.dims;
    dims.back() = n;
    im.set_tensor(0, im.reshape_to(y, Shape(dims), im.out_name()));
    return;
  }
  const TensorId b = im.tensor(1);
  const Shape bs = im.shape_of(b);
  if (as.rank() < 3 || as.rank() != bs.rank()) im.fail("memplan multiplies batches of matrices of equal rank >= 3, got " + as.to_string() + " and " + bs.to_string());
  im.set_tensor(0, im.builder().batched_matmul(a, b, false, false, im.out_name()));
}

}  // namespace

HandlerRows matmul_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Gemm", h_gemm},
      {"MatMul", h_matmul},
  };
  return rows;
}

}  // namespace memplan::import
