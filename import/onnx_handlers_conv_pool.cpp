// 2-D convolution and pooling over [N, C, H, W] tensors, and constant padding (Pad) of any tensor.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_importer.h"

namespace memplan::import {

using graph::Shape;

namespace {

void h_conv(Importer& im, const onnx::NodeProto&) {
  const TensorId x = im.tensor(0);
  const TensorId w = im.tensor(1);
  const Shape xs = im.shape_of(x), ws = im.shape_of(w);
  if (xs.rank() != 4 || ws.rank() != 4) im.fail("memplan imports 2-D convolutions of [N, C, H, W] inputs, got input " + xs.to_string() + " and weight " + ws.to_string());
  const std::int64_t groups = im.attr_int("group", 1);
  if (groups < 1 || xs[1] % groups != 0 || ws[0] % groups != 0) {
    im.fail("group " + std::to_string(groups) + " must divide the input's " + std::to_string(xs[1]) + " and the weight's " +
         std::to_string(ws[0]) + " channels");
  }
  const auto dilations = im.attr_ints("dilations");
  const std::int64_t dilation = dilations.empty() ? 1 : dilations[0];
  if (!dilations.empty() && (dilations.size() != 2 || dilations[1] != dilation || dilation < 1)) {
    im.fail("memplan's convolution takes one positive dilation along H and W, got dilations " + Shape(dilations).to_string());
  }
  if (const auto* pad = im.attr("auto_pad"); pad && pad->s() != "NOTSET") im.fail("auto_pad " + pad->s() + " is not supported; export explicit pads");
  if (ws[2] != ws[3] && groups != 1) im.fail("memplan's grouped convolution takes square kernels, got " + ws.to_string());
  if (ws[1] * groups != xs[1]) {
    im.fail("the weight " + ws.to_string() + " in " + std::to_string(groups) + " group(s) expects " + std::to_string(ws[1] * groups) +
         " input channels, the input " + xs.to_string() + " has " + std::to_string(xs[1]));
  }
  const auto strides = im.attr_ints("strides");
  const auto pads = im.attr_ints("pads");
  const std::int64_t stride = strides.empty() ? 1 : strides[0];
  if (!strides.empty() && (strides.size() != 2 || strides[1] != stride)) im.fail("memplan's convolution takes equal strides along H and W");
  // pads are [top, left, bottom, right]: each axis symmetric (Inception's 1x7 pads the width only).
  const std::int64_t padding = pads.empty() ? 0 : pads[0], padding_w = pads.size() == 4 ? pads[1] : padding;
  if (!pads.empty() && (pads.size() != 4 || pads[2] != padding || pads[3] != padding_w)) {
    im.fail("memplan's convolution pads each axis by the same amount on both sides, got pads " + Shape(pads).to_string());
  }
  if (groups != 1 && padding_w != padding) im.fail("memplan's grouped convolution takes the same padding on every side");
  auto conv = [&](const std::string& name) {
    return groups == 1 ? im.builder().conv2d(x, w, stride, padding, name, dilation, padding_w)
                       : im.builder().grouped_conv2d(x, w, stride, padding, groups, name, dilation);
  };
  if (!im.has_in(2)) return im.set_tensor(0, conv(im.out_name()));
  // A per-channel bias: memplan's bias_add adds along the last dim, so the output goes
  // channels-last for it and back (two copies; docs/onnx_import.md notes the cost).
  const TensorId b = im.tensor(2);
  if (im.shape_of(b) != Shape{ws[0]}) im.fail("the bias must be [" + std::to_string(ws[0]) + "], got " + im.shape_of(b).to_string());
  const TensorId y = conv(im.out_name() + ".conv");
  const TensorId last = im.builder().permute(y, {0, 2, 3, 1}, im.out_name() + ".nhwc");
  const TensorId biased = im.builder().bias_add(last, b, im.out_name() + ".biased");
  im.set_tensor(0, im.builder().permute(biased, {0, 3, 1, 2}, im.out_name()));
}

// `x` with `before` and `after` elements of `value` added along `axis`: concatenations with filled
// tensors (their gradient is the slice of x's part), so a padded copy costs one tensor of the
// padded size per padded axis.
TensorId pad_axis(Importer& im, TensorId x, std::int64_t axis, std::int64_t before, std::int64_t after, float value,
                  const std::string& name) {
  auto filled = [&](std::int64_t extent, const std::string& side) {
    Shape shape = im.shape_of(x);
    shape.dims[static_cast<std::size_t>(axis)] = extent;
    return im.builder().fill(shape, value, im.desc(x).dtype, name + side);
  };
  const std::string axis_name = name + ".axis" + std::to_string(axis);
  if (before > 0) x = im.builder().concat(filled(before, ".before" + std::to_string(axis)), x, axis, axis_name + ".before");
  if (after > 0) x = im.builder().concat(x, filled(after, ".after" + std::to_string(axis)), axis, axis_name + ".after");
  return x;
}

// Pad in constant mode (opset 11+: pads and the value as constant inputs; earlier: attributes).
// Reflect and edge modes, negative pads (cropping) and the axes input are refused.
void h_pad(Importer& im, const onnx::NodeProto&) {
  const TensorId x = im.tensor(0);
  const int rank = im.shape_of(x).rank();
  std::string mode = "constant";
  if (const auto* a = im.attr("mode")) mode = a->s();
  if (mode != "constant") im.fail("mode '" + mode + "' is not supported (constant only)");
  std::vector<std::int64_t> pads = im.attr_ints("pads");
  double value = im.attr_float("value", 0.0f);
  if (im.has_in(1)) {
    if (!im.is_constant(1)) im.fail("the pads must be a constant");
    pads = im.ints_of(1);
  }
  if (im.has_in(2) && !im.is_scalar_constant(2, &value)) im.fail("the constant value must be a constant scalar");
  if (im.has_in(3)) im.fail("the axes input is not supported (pads for every axis are)");
  if (static_cast<int>(pads.size()) != 2 * rank) {
    im.fail(std::to_string(pads.size()) + " pads for a rank-" + std::to_string(rank) + " tensor; expected " + std::to_string(2 * rank));
  }
  if (std::isnan(value)) im.fail("the constant value is not a number");
  TensorId y = x;
  for (int axis = 0; axis < rank; ++axis) {
    const std::int64_t before = pads[static_cast<std::size_t>(axis)], after = pads[static_cast<std::size_t>(axis + rank)];
    if (before < 0 || after < 0) im.fail("negative pads (cropping) are not supported");
    y = pad_axis(im, y, axis, before, after, static_cast<float>(value), im.out_name());
  }
  im.set_tensor(0, y);
}

void h_max_pool(Importer& im, const onnx::NodeProto& n) {
  const TensorId x = im.tensor(0);
  if (im.shape_of(x).rank() != 4) im.fail("memplan pools [N, C, H, W] inputs, got " + im.shape_of(x).to_string());
  const auto k = im.attr_ints("kernel_shape");
  const auto s = im.attr_ints("strides");
  const auto p = im.attr_ints("pads");
  if (k.size() != 2 || k[0] != k[1]) im.fail("memplan pools with square windows");
  for (std::int64_t d : im.attr_ints("dilations")) {
    if (d != 1) im.fail("dilated pooling is not supported");
  }
  if (n.output_size() > 1 && !n.output(1).empty()) im.fail("the Indices output is not supported");
  const std::int64_t stride = s.empty() ? 1 : s[0];
  if (!s.empty() && (s.size() != 2 || s[1] != stride)) im.fail("memplan pools with equal strides along H and W");
  const std::int64_t padding = p.empty() ? 0 : p[0];
  if (!p.empty() && std::any_of(p.begin(), p.end(), [&](std::int64_t v) { return v != padding; })) im.fail("memplan pools with the same padding on every side");
  // ceil_mode 1 (GoogLeNet, SqueezeNet): the last window may run past the input; it is kept when
  // it starts inside the input or its left padding (PyTorch's and ONNX's rule). Those extra rows
  // and columns are -inf, which never win a maximum, so padding the bottom and right with them
  // and pooling in floor mode gives the ceil-mode output and gradients.
  TensorId input = x;
  if (im.attr_int("ceil_mode", 0) != 0) {
    for (std::int64_t axis : {2, 3}) {
      const std::int64_t size = im.shape_of(x)[static_cast<int>(axis)], span = size + 2 * padding - k[0];
      if (span < 0) break;  // max_pool2d refuses a window larger than the input
      std::int64_t out = (span + stride - 1) / stride + 1;
      if ((out - 1) * stride >= size + padding) --out;
      const std::int64_t extra = (out - 1) * stride + k[0] - (size + 2 * padding);
      if (extra > 0) {
        input = pad_axis(im, input, axis, 0, extra, -std::numeric_limits<float>::infinity(), im.out_name() + ".ceil");
      }
    }
  }
  im.set_tensor(0, im.builder().max_pool2d(input, k[0], stride, padding, im.out_name()));
}

void h_average_pool(Importer& im, const onnx::NodeProto&) {
  const TensorId x = im.tensor(0);
  const auto k = im.attr_ints("kernel_shape");
  const auto s = im.attr_ints("strides");
  const auto p = im.attr_ints("pads");
  if (im.shape_of(x).rank() != 4 || k.size() != 2 || k[0] != k[1]) im.fail("memplan pools [N, C, H, W] inputs with square windows");
  if (std::any_of(p.begin(), p.end(), [](std::int64_t v) { return v != 0; })) im.fail("average pooling with padding is not supported");
  if (im.attr_int("ceil_mode", 0) != 0) im.fail("ceil_mode 1 is not supported");
  const std::int64_t stride = s.empty() ? 1 : s[0];
  if (!s.empty() && (s.size() != 2 || s[1] != stride)) im.fail("memplan pools with equal strides along H and W");
  im.set_tensor(0, im.builder().avg_pool2d(x, k[0], stride, im.out_name()));
}

void h_global_average_pool(Importer& im, const onnx::NodeProto&) {
  const TensorId x = im.tensor(0);
  const Shape xs = im.shape_of(x);
  if (xs.rank() != 4) im.fail("memplan pools [N, C, H, W] inputs, got " + xs.to_string());
  const TensorId y = im.builder().global_avg_pool(x, im.out_name() + ".pooled");
  im.set_tensor(0, im.builder().reshape(y, Shape{xs[0], xs[1], 1, 1}, im.out_name()));
}

}  // namespace

HandlerRows conv_pool_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Conv", h_conv},
      {"MaxPool", h_max_pool},
      {"Pad", h_pad},
      {"AveragePool", h_average_pool},
      {"GlobalAveragePool", h_global_average_pool},
  };
  return rows;
}

}  // namespace memplan::import
