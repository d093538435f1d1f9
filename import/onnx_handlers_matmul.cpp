// Matrix products: Gemm, MatMul and Einsum's matrix-product equations as memplan matmul (a GEMM
// over rows) or batched_matmul.
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

// Einsum of two operands that is a (batched) matrix product: "bik,bkj->bij" and the transposed
// forms ("bki,..." reads A transposed, "...,bjk->bij" B), with any number of leading batch labels
// the same in both operands and the output, in the same order (MaxViT's attention:
// "BGPID,BGPJD->BGPIJ"). Other equations are refused naming the equation.
void h_einsum(Importer& im, const onnx::NodeProto& node) {
  const auto* attr = im.attr("equation");
  std::string eq;
  for (char ch : attr != nullptr ? attr->s() : std::string()) {
    if (ch != ' ') eq += ch;
  }
  const std::string what = "equation '" + eq + "': memplan imports Einsum as a (batched) matrix product of two "
                           "operands, e.g. 'bik,bkj->bij' or 'bhid,bhjd->bhij'";
  const std::size_t comma = eq.find(','), arrow = eq.find("->");
  if (node.input_size() != 2 || comma == std::string::npos || arrow == std::string::npos || comma > arrow ||
      eq.find("...") != std::string::npos) {
    im.fail(what);
  }
  const std::string a = eq.substr(0, comma), b = eq.substr(comma + 1, arrow - comma - 1), out = eq.substr(arrow + 2);
  const std::size_t r = a.size();
  if (r < 2 || b.size() != r || out.size() != r || a.substr(0, r - 2) != b.substr(0, r - 2) ||
      a.substr(0, r - 2) != out.substr(0, r - 2)) {
    im.fail(what);
  }
  // The output's last two labels are the rows of A and the columns of B; the third is contracted.
  const char i = out[r - 2], j = out[r - 1];
  const std::string a2 = a.substr(r - 2), b2 = b.substr(r - 2);
  const char k = a2[0] == i ? a2[1] : a2[0];
  const bool ta = a2 == std::string{k, i}, tb = b2 == std::string{j, k};
  if (i == j || k == i || k == j || (!ta && a2 != std::string{i, k}) || (!tb && b2 != std::string{k, j}) ||
      out.substr(0, r - 2).find_first_of(std::string{i, j, k}) != std::string::npos) {
    im.fail(what);
  }
  const TensorId x = im.tensor(0), y = im.tensor(1);
  im.set_tensor(0, r == 2 ? im.builder().matmul(x, y, ta, tb, im.out_name())
                          : im.builder().batched_matmul(x, y, ta, tb, im.out_name()));
}

}  // namespace

HandlerRows matmul_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Einsum", h_einsum},
      {"Gemm", h_gemm},
      {"MatMul", h_matmul},
  };
  return rows;
}

}  // namespace memplan::import
