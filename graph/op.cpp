#include "memplan/graph/op.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "memplan/common/check.h"

namespace memplan::graph {
namespace {

using Inputs = std::span<const TensorDesc* const>;

[[noreturn]] void fail(std::string_view op, const std::string& what) {
  throw GraphError(std::string(op) + ": " + what);
}

// Floating-point operands: f32 executes; f16 and bf16 are planned (mixed-precision accounting).
void expect_float(std::string_view op, const TensorDesc& t) {
  if (!is_floating(t.dtype)) {
    fail(op, "'" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) + ", expected a floating dtype (" +
                 std::string(dtype_name(DType::f32)) + ", " + std::string(dtype_name(DType::f16)) + " or " +
                 std::string(dtype_name(DType::bf16)) + ")");
  }
}

void expect_same_dtype(std::string_view op, const TensorDesc& a, const TensorDesc& b) {
  if (a.dtype != b.dtype) {
    fail(op, "'" + a.name + "' is " + std::string(dtype_name(a.dtype)) + " but '" + b.name + "' is " +
                 std::string(dtype_name(b.dtype)));
  }
}

void expect_same_shape(std::string_view op, const TensorDesc& a, const TensorDesc& b) {
  if (a.shape != b.shape) {
    fail(op, "'" + a.name + "' " + a.shape.to_string() + " and '" + b.name + "' " +
                 b.shape.to_string() + " must have the same shape");
  }
}

Shape shape_from_attrs(std::string_view op, const OpAttrs& attrs) {
  for (std::int64_t d : attrs.shape) {
    if (d <= 0) fail(op, "every dimension of the target shape must be positive");
  }
  return Shape(attrs.shape);
}

// --- shape inference --------------------------------------------------------------------

OutputSpec infer_matmul(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& a = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("matmul", a);
  expect_float("matmul", b);
  expect_same_dtype("matmul", a, b);
  if (a.shape.rank() != 2 || b.shape.rank() != 2) {
    fail("matmul", "operands must be 2-D, got '" + a.name + "' " + a.shape.to_string() +
                       " and '" + b.name + "' " + b.shape.to_string());
  }
  const std::int64_t m = attrs.trans_a ? a.shape[1] : a.shape[0];
  const std::int64_t ka = attrs.trans_a ? a.shape[0] : a.shape[1];
  const std::int64_t kb = attrs.trans_b ? b.shape[1] : b.shape[0];
  const std::int64_t n = attrs.trans_b ? b.shape[0] : b.shape[1];
  if (ka != kb) {
    std::ostringstream msg;
    msg << "inner dimensions differ: '" << a.name << "' " << a.shape.to_string()
        << (attrs.trans_a ? "^T" : "") << " x '" << b.name << "' " << b.shape.to_string()
        << (attrs.trans_b ? "^T" : "") << " (" << ka << " vs " << kb << ")";
    fail("matmul", msg.str());
  }
  return {Shape{m, n}, a.dtype};
}

OutputSpec infer_bias_add(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("bias_add", x);
  expect_float("bias_add", b);
  if (b.shape.rank() != 1 || x.shape.rank() < 1 || b.shape[0] != x.shape.cols()) {
    fail("bias_add", "bias '" + b.name + "' " + b.shape.to_string() +
                         " must be 1-D with the last dimension of '" + x.name + "' " +
                         x.shape.to_string());
  }
  return {x.shape, x.dtype};
}

OutputSpec infer_binary_same(Inputs in, const OpAttrs&) {
  expect_float("elementwise", *in[0]);
  expect_same_shape("elementwise", *in[0], *in[1]);
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_unary(Inputs in, const OpAttrs&) {
  expect_float("elementwise", *in[0]);
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_reshape(Inputs in, const OpAttrs& attrs) {
  Shape target = shape_from_attrs("reshape", attrs);
  if (target.numel() != in[0]->shape.numel()) {
    fail("reshape", "cannot view '" + in[0]->name + "' " + in[0]->shape.to_string() + " as " +
                        target.to_string() + ": element counts differ");
  }
  return {target, in[0]->dtype};
}

OutputSpec infer_reduce_all(Inputs in, const OpAttrs&) {
  expect_float("reduction", *in[0]);
  return {Shape{}, DType::f32};
}

OutputSpec infer_softmax_xent(Inputs in, const OpAttrs&) {
  const TensorDesc& logits = *in[0];
  const TensorDesc& labels = *in[1];
  expect_float("softmax_cross_entropy", logits);
  if (logits.shape.rank() != 2) fail("softmax_cross_entropy", "logits must be [batch, classes]");
  if (labels.dtype != DType::i32 || labels.shape != Shape{logits.shape[0]}) {
    fail("softmax_cross_entropy", "labels '" + labels.name + "' must be i32 [" +
                                      std::to_string(logits.shape[0]) + "], got " +
                                      std::string(dtype_name(labels.dtype)) + " " +
                                      labels.shape.to_string());
  }
  return {Shape{}, DType::f32};
}

OutputSpec infer_backward_like_second(Inputs in, const OpAttrs&) {
  expect_same_shape("backward", *in[0], *in[1]);
  return {in[1]->shape, in[1]->dtype};
}

OutputSpec infer_broadcast_scalar(Inputs in, const OpAttrs& attrs) {
  if (in[0]->shape.numel() != 1) fail("broadcast_scalar", "input must hold one element");
  return {shape_from_attrs("broadcast_scalar", attrs), attrs.dtype};
}

OutputSpec infer_reduce_rows(Inputs in, const OpAttrs&) {
  expect_float("reduce_rows", *in[0]);
  if (in[0]->shape.rank() < 1) fail("reduce_rows", "input must have at least one dimension");
  return {Shape{in[0]->shape.cols()}, in[0]->dtype};
}

OutputSpec infer_softmax_xent_backward(Inputs in, const OpAttrs&) {
  return {in[1]->shape, in[1]->dtype};
}

OutputSpec infer_fill(Inputs, const OpAttrs& attrs) {
  return {Shape(attrs.shape), attrs.dtype};
}

OutputSpec infer_update(Inputs, const OpAttrs&) { return {}; }

// --- convolutional nets -----------------------------------------------------------------

std::string str(std::int64_t v) { return std::to_string(v); }

void expect_rank(std::string_view op, const TensorDesc& t, int rank) {
  if (t.shape.rank() != rank) {
    fail(op, "'" + t.name + "' " + t.shape.to_string() + " must have rank " + str(rank));
  }
}

// Output extent of a window sweep: the window spans D*(K-1)+1 input positions (D = dilation);
// throws when it does not fit.
std::int64_t window_out(std::string_view op, std::int64_t in, const OpAttrs& a) {
  if (a.kernel <= 0 || a.stride <= 0 || a.padding < 0 || a.dilation <= 0) {
    fail(op, "kernel, stride and dilation must be positive and padding non-negative");
  }
  const std::int64_t span = checked_mul(a.dilation, a.kernel - 1) + 1;
  if (2 * a.padding > span) {
    fail(op, "padding " + str(a.padding) + " is more than half the window " + str(span) +
                 (a.dilation == 1 ? std::string() : " (kernel " + str(a.kernel) + ", dilation " + str(a.dilation) + ")"));
  }
  const std::int64_t extent = in + 2 * a.padding - span;
  if (extent < 0) {
    fail(op, "window " + str(span) + (a.dilation == 1 ? std::string() : " (kernel " + str(a.kernel) + ", dilation " + str(a.dilation) + ")") +
                 " is larger than the padded input " + str(in + 2 * a.padding));
  }
  return extent / a.stride + 1;
}

OutputSpec infer_im2col(Inputs in, const OpAttrs& a) {
  const TensorDesc& x = *in[0];
  expect_float("im2col", x);
  expect_rank("im2col", x, 4);
  const std::int64_t oh = window_out("im2col", x.shape[2], a), ow = window_out("im2col", x.shape[3], a);
  return {Shape{x.shape[0], checked_mul(checked_mul(x.shape[1], a.kernel), a.kernel), checked_mul(oh, ow)}, x.dtype};
}

OutputSpec infer_conv2d(Inputs in, const OpAttrs& a) {
  const TensorDesc& cols = *in[0];
  const TensorDesc& w = *in[1];
  expect_float("conv2d", cols);
  expect_float("conv2d", w);
  expect_rank("conv2d", cols, 3);
  expect_rank("conv2d", w, 4);
  if (w.shape[2] != a.kernel || w.shape[3] != a.kernel) {
    fail("conv2d", "weight '" + w.name + "' " + w.shape.to_string() + " must have a " + str(a.kernel) + "x" +
                       str(a.kernel) + " kernel");
  }
  if (checked_mul(checked_mul(w.shape[1], a.kernel), a.kernel) != cols.shape[1]) {
    fail("conv2d", "weight '" + w.name + "' " + w.shape.to_string() + " expects " + str(w.shape[1]) +
                       " input channels; columns '" + cols.name + "' " + cols.shape.to_string() + " disagree");
  }
  if (a.shape.size() != 2 || checked_mul(a.shape[0], a.shape[1]) != cols.shape[2]) {
    fail("conv2d", "attrs.shape must be {OH, OW} with OH*OW = " + str(cols.shape[2]));
  }
  return {Shape{cols.shape[0], w.shape[0], a.shape[0], a.shape[1]}, cols.dtype};
}

OutputSpec infer_grouped_conv2d(Inputs in, const OpAttrs& a) {
  const TensorDesc& x = *in[0];
  const TensorDesc& w = *in[1];
  expect_float("grouped_conv2d", x);
  expect_float("grouped_conv2d", w);
  expect_rank("grouped_conv2d", x, 4);
  expect_rank("grouped_conv2d", w, 4);
  if (a.groups < 1 || x.shape[1] % a.groups != 0 || w.shape[0] % a.groups != 0) {
    fail("grouped_conv2d", "groups " + str(a.groups) + " must divide the input channels of '" + x.name + "' " +
                               x.shape.to_string() + " and the output channels of '" + w.name + "' " + w.shape.to_string());
  }
  if (w.shape[1] != x.shape[1] / a.groups || w.shape[2] != a.kernel || w.shape[3] != a.kernel) {
    fail("grouped_conv2d", "weight '" + w.name + "' " + w.shape.to_string() + " must be [Cout, " +
                               str(x.shape[1] / a.groups) + ", " + str(a.kernel) + ", " + str(a.kernel) + "]");
  }
  const std::int64_t oh = window_out("grouped_conv2d", x.shape[2], a), ow = window_out("grouped_conv2d", x.shape[3], a);
  return {Shape{x.shape[0], w.shape[0], oh, ow}, x.dtype};
}

// g's first two dims are x's (N, C), any further dims are 1.
OutputSpec infer_channel_scale(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  const TensorDesc& g = *in[1];
  expect_float("channel_scale", x);
  expect_float("channel_scale", g);
  bool ok = x.shape.rank() >= 2 && g.shape.rank() >= 2 && g.shape.rank() <= x.shape.rank() && g.shape[0] == x.shape[0] &&
            g.shape[1] == x.shape[1];
  for (int i = 2; ok && i < g.shape.rank(); ++i) ok = g.shape[i] == 1;
  if (!ok) {
    fail("channel_scale", "gate '" + g.name + "' " + g.shape.to_string() + " must be [N, C] or [N, C, 1, ...] of '" + x.name +
                              "' " + x.shape.to_string());
  }
  return {x.shape, x.dtype};
}

OutputSpec infer_clip(Inputs in, const OpAttrs& a) {
  expect_float("clip", *in[0]);
  if (!(a.clip_min <= a.clip_max)) fail("clip", "clip_min " + std::to_string(a.clip_min) + " exceeds clip_max " + std::to_string(a.clip_max));
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_pool(Inputs in, const OpAttrs& a) {
  const TensorDesc& x = *in[0];
  expect_float("pool", x);
  expect_rank("pool", x, 4);
  if (a.dilation != 1) fail("pool", "dilation " + str(a.dilation) + " is not supported (pooling windows are dense)");
  return {Shape{x.shape[0], x.shape[1], window_out("pool", x.shape[2], a), window_out("pool", x.shape[3], a)},
          x.dtype};
}

OutputSpec infer_avg_pool(Inputs in, const OpAttrs& a) {
  if (a.padding != 0) fail("avg_pool2d", "padding is not supported");
  return infer_pool(in, a);
}

OutputSpec infer_global_avg_pool(Inputs in, const OpAttrs&) {
  expect_float("global_avg_pool", *in[0]);
  expect_rank("global_avg_pool", *in[0], 4);
  return {Shape{in[0]->shape[0], in[0]->shape[1]}, in[0]->dtype};
}

void expect_channels(std::string_view op, const TensorDesc& x) {
  expect_float(op, x);
  if (x.shape.rank() < 2) fail(op, "'" + x.name + "' " + x.shape.to_string() + " must be [N, C, ...]");
}

void expect_vector(std::string_view op, const TensorDesc& t, std::int64_t n) {
  expect_float(op, t);
  if (t.shape != Shape{n}) fail(op, "'" + t.name + "' " + t.shape.to_string() + " must be [" + str(n) + "]");
}

OutputSpec infer_batch_norm_stats(Inputs in, const OpAttrs&) {
  expect_channels("batch_norm_stats", *in[0]);
  return {Shape{2, in[0]->shape[1]}, DType::f32};
}

// Synchronised batch norm's second pass: the deviation about a mean shared by every rank.
OutputSpec infer_batch_norm_centered_stats(Inputs in, const OpAttrs&) {
  expect_channels("batch_norm_centered_stats", *in[0]);
  const std::int64_t c = in[0]->shape[1];
  if (in[1]->shape != Shape{2, c}) {
    fail("batch_norm_centered_stats", "statistics '" + in[1]->name + "' must be [2, " + str(c) + "]");
  }
  return {Shape{2, c}, DType::f32};
}

OutputSpec infer_batch_norm(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_channels("batch_norm", x);
  const std::int64_t c = x.shape[1];
  if (in[1]->shape != Shape{2, c}) fail("batch_norm", "statistics '" + in[1]->name + "' must be [2, " + str(c) + "]");
  expect_vector("batch_norm", *in[2], c);
  expect_vector("batch_norm", *in[3], c);
  return {x.shape, x.dtype};
}

OutputSpec infer_batch_norm_inference(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_channels("batch_norm_inference", x);
  for (int i = 1; i <= 4; ++i) expect_vector("batch_norm_inference", *in[i], x.shape[1]);
  return {x.shape, x.dtype};
}

OutputSpec infer_layer_norm_stats(Inputs in, const OpAttrs&) {
  expect_float("layer_norm_stats", *in[0]);
  if (in[0]->shape.rank() < 1) fail("layer_norm_stats", "input must have at least one dimension");
  return {Shape{in[0]->shape.rows(), 2}, DType::f32};
}

OutputSpec infer_layer_norm(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_float("layer_norm", x);
  if (x.shape.rank() < 1) fail("layer_norm", "input must have at least one dimension");
  if (in[1]->shape != Shape{x.shape.rows(), 2}) {
    fail("layer_norm", "statistics '" + in[1]->name + "' must be [" + str(x.shape.rows()) + ", 2]");
  }
  expect_vector("layer_norm", *in[2], x.shape.cols());
  expect_vector("layer_norm", *in[3], x.shape.cols());
  return {x.shape, x.dtype};
}

OutputSpec infer_embedding(Inputs in, const OpAttrs&) {
  const TensorDesc& ids = *in[0];
  const TensorDesc& table = *in[1];
  if (ids.dtype != DType::i32) fail("embedding", "ids '" + ids.name + "' must be i32");
  expect_float("embedding", table);
  expect_rank("embedding", table, 2);
  std::vector<std::int64_t> dims = ids.shape.dims;
  dims.push_back(table.shape[1]);
  return {Shape(std::move(dims)), table.dtype};
}

OutputSpec infer_batched_matmul(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& a = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("batched_matmul", a);
  expect_float("batched_matmul", b);
  expect_same_dtype("batched_matmul", a, b);
  const int r = a.shape.rank();
  if (r < 3 || b.shape.rank() != r ||
      !std::equal(a.shape.dims.begin(), a.shape.dims.end() - 2, b.shape.dims.begin())) {
    fail("batched_matmul", "operands must have rank >= 3 and equal leading dims, got '" + a.name + "' " +
                               a.shape.to_string() + " and '" + b.name + "' " + b.shape.to_string());
  }
  const std::int64_t m = attrs.trans_a ? a.shape[r - 1] : a.shape[r - 2];
  const std::int64_t ka = attrs.trans_a ? a.shape[r - 2] : a.shape[r - 1];
  const std::int64_t kb = attrs.trans_b ? b.shape[r - 1] : b.shape[r - 2];
  const std::int64_t n = attrs.trans_b ? b.shape[r - 2] : b.shape[r - 1];
  if (ka != kb) {
    fail("batched_matmul", "inner dimensions differ: '" + a.name + "' " + a.shape.to_string() +
                               (attrs.trans_a ? "^T" : "") + " x '" + b.name + "' " + b.shape.to_string() +
                               (attrs.trans_b ? "^T" : ""));
  }
  std::vector<std::int64_t> dims(a.shape.dims.begin(), a.shape.dims.end() - 2);
  dims.push_back(m);
  dims.push_back(n);
  return {Shape(std::move(dims)), a.dtype};
}

OutputSpec infer_softmax(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("softmax", x);
  if (x.shape.rank() < 1) fail("softmax", "input must have at least one dimension");
  if (attrs.causal && (x.shape.rank() < 2 || x.shape[x.shape.rank() - 2] != x.shape.cols())) {
    fail("softmax", "a causal softmax needs [..., T, T], got '" + x.name + "' " + x.shape.to_string());
  }
  return {x.shape, x.dtype};
}

OutputSpec infer_permute(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  const auto rank = static_cast<std::size_t>(x.shape.rank());
  std::vector<bool> seen(rank, false);
  if (attrs.perm.size() != rank) fail("permute", "perm must list all " + str(x.shape.rank()) + " dims");
  std::vector<std::int64_t> dims;
  for (std::int64_t p : attrs.perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(rank) || seen[static_cast<std::size_t>(p)]) {
      fail("permute", "perm is not a permutation of 0.." + str(x.shape.rank() - 1));
    }
    seen[static_cast<std::size_t>(p)] = true;
    dims.push_back(x.shape[static_cast<int>(p)]);
  }
  return {Shape(std::move(dims)), x.dtype};
}

OutputSpec infer_dropout_mask(Inputs, const OpAttrs& attrs) {
  if (!(attrs.dropout >= 0.0f && attrs.dropout < 1.0f)) fail("dropout_mask", "p must be in [0, 1)");
  return {shape_from_attrs("dropout_mask", attrs), attrs.dtype};
}

OutputSpec infer_conv2d_backward_weight(Inputs in, const OpAttrs& attrs) {
  return {shape_from_attrs("conv2d_backward_weight", attrs), in[0]->dtype};
}

OutputSpec infer_conv2d_backward_cols(Inputs in, const OpAttrs&) {
  const Shape& dy = in[0]->shape;
  const Shape& w = in[1]->shape;
  return {Shape{dy[0], w[1] * w[2] * w[3], dy[2] * dy[3]}, in[0]->dtype};
}

OutputSpec infer_shape_attr(Inputs in, const OpAttrs& attrs) {
  return {shape_from_attrs("backward", attrs), in[0]->dtype};
}

OutputSpec infer_like_second(Inputs in, const OpAttrs&) { return {in[1]->shape, in[1]->dtype}; }

OutputSpec infer_channel_vector(Inputs in, const OpAttrs&) {
  expect_channels("channel reduction", *in[0]);
  return {Shape{in[0]->shape[1]}, in[0]->dtype};
}

OutputSpec infer_last_dim_vector(Inputs in, const OpAttrs&) { return {Shape{in[0]->shape.cols()}, in[0]->dtype}; }


// --- LLaMA-style and token ops -----------------------------------------------------------

OutputSpec infer_rms_norm(Inputs in, const OpAttrs&) {
  const TensorDesc& x = *in[0];
  expect_float("rms_norm", x);
  if (x.shape.rank() < 1) fail("rms_norm", "input must have at least one dimension");
  expect_vector("rms_norm", *in[1], x.shape.cols());
  return {x.shape, x.dtype};
}

OutputSpec infer_rotary(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("rotary", x);
  if (x.shape.rank() < 2 || x.shape.cols() % 2 != 0) {
    fail("rotary", "'" + x.name + "' " + x.shape.to_string() + " must be [..., T, head_dim] with an even head_dim");
  }
  if (!(attrs.rope_base > 1.0f)) fail("rotary", "rope_base must be > 1");
  return {x.shape, x.dtype};
}

OutputSpec infer_repeat_heads(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("repeat_heads", x);
  if (x.shape.rank() < 2 || attrs.repeats < 1) fail("repeat_heads", "needs [B, H, ...] and repeats >= 1");
  std::vector<std::int64_t> dims = x.shape.dims;
  dims[1] *= attrs.repeats;
  return {Shape(std::move(dims)), x.dtype};
}

OutputSpec infer_repeat_heads_backward(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& dy = *in[0];
  if (dy.shape.rank() < 2 || attrs.repeats < 1 || dy.shape[1] % attrs.repeats != 0) {
    fail("repeat_heads_backward", "heads of '" + dy.name + "' must be a multiple of repeats");
  }
  std::vector<std::int64_t> dims = dy.shape.dims;
  dims[1] /= attrs.repeats;
  return {Shape(std::move(dims)), dy.dtype};
}

void expect_axis(std::string_view op, const TensorDesc& x, std::int64_t axis) {
  if (axis < 0 || axis >= x.shape.rank()) {
    fail(op, "axis " + str(axis) + " is outside '" + x.name + "' " + x.shape.to_string());
  }
}

OutputSpec infer_concat(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& a = *in[0];
  const TensorDesc& b = *in[1];
  expect_float("concat", a);
  expect_same_dtype("concat", a, b);
  expect_axis("concat", a, attrs.axis);
  bool ok = a.shape.rank() == b.shape.rank();
  for (int i = 0; ok && i < a.shape.rank(); ++i) ok = i == attrs.axis || a.shape[i] == b.shape[i];
  if (!ok) {
    fail("concat", "'" + a.name + "' " + a.shape.to_string() + " and '" + b.name + "' " + b.shape.to_string() +
                       " must agree on every dim but " + str(attrs.axis));
  }
  std::vector<std::int64_t> dims = a.shape.dims;
  dims[static_cast<std::size_t>(attrs.axis)] += b.shape[static_cast<int>(attrs.axis)];
  return {Shape(std::move(dims)), a.dtype};
}

OutputSpec infer_slice(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& x = *in[0];
  expect_float("slice", x);
  expect_axis("slice", x, attrs.axis);
  const std::int64_t extent = x.shape[static_cast<int>(attrs.axis)];
  if (attrs.start < 0 || attrs.length < 1 || attrs.start + attrs.length > extent) {
    fail("slice", "[" + str(attrs.start) + ", " + str(attrs.start + attrs.length) + ") is not inside dim " +
                      str(attrs.axis) + " of '" + x.name + "' " + x.shape.to_string());
  }
  std::vector<std::int64_t> dims = x.shape.dims;
  dims[static_cast<std::size_t>(attrs.axis)] = attrs.length;
  return {Shape(std::move(dims)), x.dtype};
}

// The operands generation with a KV cache shares: per-slot k, v [B, KW] (KW = NKV*HD), a block
// table [B, MB] and positions [B], both i32.
void expect_kv_slots(std::string_view op, const TensorDesc& k, const TensorDesc& v, const TensorDesc& table,
                     const TensorDesc& positions) {
  expect_float(op, k);
  expect_rank(op, k, 2);
  expect_same_shape(op, k, v);
  expect_same_dtype(op, k, v);
  if (table.dtype != DType::i32 || positions.dtype != DType::i32) fail(op, "block table and positions must be i32");
  expect_rank(op, table, 2);
  expect_rank(op, positions, 1);
  if (table.shape[0] != k.shape[0] || positions.shape[0] != k.shape[0]) {
    fail(op, "block table " + table.shape.to_string() + " and positions " + positions.shape.to_string() +
                 " must have one row per slot of '" + k.name + "' " + k.shape.to_string());
  }
}

// attrs.shape: {} stores keys as they are; {HD} rotates each head of HD values of the key by its
// position first (rotary embedding with attrs.rope_base).
OutputSpec infer_kv_cache_write(Inputs in, const OpAttrs& attrs) {
  expect_kv_slots("kv_cache_write", *in[0], *in[1], *in[2], *in[3]);
  if (!attrs.shape.empty() &&
      (attrs.shape.size() != 1 || attrs.shape[0] <= 0 || attrs.shape[0] % 2 != 0 || in[0]->shape[1] % attrs.shape[0] != 0)) {
    fail("kv_cache_write", "shape must be {} or {head size} (even, dividing the key's width)");
  }
  return {};
}

OutputSpec infer_decode_attention(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& q = *in[0];
  const TensorDesc& k = *in[1];
  expect_kv_slots("decode_attention", k, *in[2], *in[5], *in[6]);
  expect_float("decode_attention", q);
  expect_rank("decode_attention", q, 2);
  expect_same_dtype("decode_attention", q, k);
  // attrs.shape: {heads, kv_heads}, or {heads, kv_heads, 1} to rotate the query and the slot's own
  // key by the slot's position first (rotary embedding with attrs.rope_base; the cache holds
  // rotated keys, kv_cache_write's {HD}).
  const bool shape_ok = (attrs.shape.size() == 2 || (attrs.shape.size() == 3 && attrs.shape[2] == 1)) &&
                        attrs.shape[0] > 0 && attrs.shape[1] > 0 && attrs.shape[0] % attrs.shape[1] == 0;
  if (!shape_ok) fail("decode_attention", "shape must be {heads, kv_heads} or {heads, kv_heads, 1}, kv_heads dividing heads");
  const std::int64_t nh = attrs.shape[0], nkv = attrs.shape[1];
  if (q.shape[0] != k.shape[0] || q.shape[1] % nh != 0 || k.shape[1] != q.shape[1] / nh * nkv) {
    fail("decode_attention", "query '" + q.name + "' " + q.shape.to_string() + " and key '" + k.name + "' " +
                                 k.shape.to_string() + " do not split into " + str(nh) + " and " + str(nkv) +
                                 " heads of one size");
  }
  for (const TensorDesc* cache : {in[3], in[4]}) {
    expect_rank("decode_attention", *cache, 3);
    expect_same_dtype("decode_attention", *cache, k);
    if (cache->shape[2] != k.shape[1]) {
      fail("decode_attention", "cache '" + cache->name + "' " + cache->shape.to_string() + " must hold rows of " +
                                   str(k.shape[1]) + " values");
    }
  }
  expect_same_shape("decode_attention", *in[3], *in[4]);
  return {q.shape, q.dtype};
}

// Data parallel: flat layouts over `world` ranks (dist/shard.h states the split).
std::int64_t world_of(std::string_view op, const OpAttrs& attrs) {
  if (attrs.world < 1) fail(op, "the number of ranks must be at least 1, got " + str(attrs.world));
  return attrs.world;
}
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

OutputSpec infer_pack(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = world_of("pack", attrs);
  std::int64_t chunk = 0;
  for (const TensorDesc* x : in) {
    expect_float("pack", *x);
    expect_same_dtype("pack", *in[0], *x);
    chunk += ceil_div(x->shape.numel(), world);
  }
  return {Shape{checked_mul(chunk, world)}, in[0]->dtype};
}

OutputSpec infer_all_reduce(Inputs in, const OpAttrs& attrs) {
  world_of("all_reduce", attrs);
  expect_float("all_reduce", *in[0]);
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_reduce_scatter(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = world_of("reduce_scatter", attrs);
  const TensorDesc& x = *in[0];
  expect_float("reduce_scatter", x);
  if (x.shape.rank() != 1 || x.shape[0] % world != 0) {
    fail("reduce_scatter", "'" + x.name + "' " + x.shape.to_string() + " must be flat with a multiple of " + str(world) +
                               " elements (one chunk per rank)");
  }
  return {Shape{x.shape[0] / world}, x.dtype};
}

OutputSpec infer_all_gather(Inputs in, const OpAttrs& attrs) {
  const std::int64_t world = world_of("all_gather", attrs);
  const TensorDesc& x = *in[0];
  expect_float("all_gather", x);
  const Shape full = shape_from_attrs("all_gather", attrs);
  if (x.shape.rank() != 1 || x.shape[0] != ceil_div(full.numel(), world)) {
    fail("all_gather", "the shard '" + x.name + "' " + x.shape.to_string() + " of " + full.to_string() + " over " +
                           str(world) + " ranks must be flat with " + str(ceil_div(full.numel(), world)) + " elements");
  }
  return {full, x.dtype};
}

OutputSpec infer_all_gather_into(Inputs, const OpAttrs& attrs) {
  world_of("all_gather_into", attrs);
  return {};
}

OutputSpec infer_rms_norm_dgamma(Inputs in, const OpAttrs&) { return {Shape{in[1]->shape.cols()}, in[1]->dtype}; }

// --- fused attention ----------------------------------------------------------------------

// q [B, H, T, D], k and v [B, KH, T, D] with KH dividing H, all of one floating dtype.
void expect_attention_operands(std::string_view op, const TensorDesc& q, const TensorDesc& k, const TensorDesc* v,
                               const OpAttrs& attrs) {
  expect_float(op, q);
  expect_float(op, k);
  expect_same_dtype(op, q, k);
  expect_rank(op, q, 4);
  expect_rank(op, k, 4);
  if (k.shape[0] != q.shape[0] || k.shape[2] != q.shape[2] || k.shape[3] != q.shape[3]) {
    fail(op, "keys '" + k.name + "' " + k.shape.to_string() + " must be [B, KH, T, D] like queries '" + q.name +
                 "' " + q.shape.to_string());
  }
  if (q.shape[1] % k.shape[1] != 0) {
    fail(op, "query heads " + str(q.shape[1]) + " of '" + q.name + "' are not a multiple of the key/value heads " +
                 str(k.shape[1]) + " of '" + k.name + "'");
  }
  if (v != nullptr) {
    expect_same_dtype(op, q, *v);
    expect_same_shape(op, k, *v);
  }
  if (!(attrs.dropout >= 0.0f && attrs.dropout < 1.0f)) fail(op, "dropout must be in [0, 1)");
  if (!(attrs.alpha > 0.0f) || !std::isfinite(attrs.alpha)) fail(op, "the score scale alpha must be positive and finite");
}

Shape rows_of(const TensorDesc& q) { return Shape{q.shape[0], q.shape[1], q.shape[2]}; }

OutputSpec infer_attention_lse(Inputs in, const OpAttrs& attrs) {
  expect_attention_operands("attention_lse", *in[0], *in[1], nullptr, attrs);
  return {rows_of(*in[0]), DType::f32};
}

void expect_row_terms(std::string_view op, const TensorDesc& q, const TensorDesc& t) {
  if (t.dtype != DType::f32 || t.shape != rows_of(q)) {
    fail(op, "'" + t.name + "' must be f32 " + rows_of(q).to_string() + ", got " + std::string(dtype_name(t.dtype)) +
                 " " + t.shape.to_string());
  }
}

OutputSpec infer_attention(Inputs in, const OpAttrs& attrs) {
  expect_attention_operands("attention", *in[0], *in[1], in[2], attrs);
  expect_row_terms("attention", *in[0], *in[3]);
  return {in[0]->shape, in[0]->dtype};
}

OutputSpec infer_attention_backward_dot(Inputs in, const OpAttrs&) {
  expect_same_shape("attention_backward_dot", *in[0], *in[1]);
  expect_rank("attention_backward_dot", *in[1], 4);
  return {rows_of(*in[1]), DType::f32};
}

OutputSpec infer_attention_backward(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& q = *in[1];
  expect_attention_operands("attention_backward", q, *in[2], in[3], attrs);
  expect_same_shape("attention_backward", *in[0], q);
  expect_row_terms("attention_backward", q, *in[4]);
  expect_row_terms("attention_backward", q, *in[5]);
  return {Shape{q.shape[0], q.shape[1] + 2 * in[2]->shape[1], q.shape[2], q.shape[3]}, q.dtype};
}

// --- FLOPs: multiply-adds count 2; transcendental functions count 1 each -----------------

double numel_of(const TensorDesc* t) { return t ? double(t->shape.numel()) : 0.0; }
// Ops that only move or generate data count 0: reshape (a view), permute, im2col, the
// embedding gather, repeat_heads, concat and slice (copies), fill, and dropout_mask (random
// bits, no arithmetic). Checkpointing's recompute overhead is measured with this table, so
// recomputing these is free by this count.
double flops_zero(Inputs, const TensorDesc*) { return 0.0; }
double flops_per_output(Inputs, const TensorDesc* out) { return numel_of(out); }
double flops_matmul(Inputs in, const TensorDesc* out) {
  // 2*M*N*K: K is the shared dimension = numel(A) / M.
  const double m = double(out->shape[0]);
  return 2.0 * numel_of(out) * (numel_of(in[0]) / m);
}
double flops_gelu(Inputs, const TensorDesc* out) { return 8.0 * numel_of(out); }
double flops_per_input(Inputs in, const TensorDesc*) { return numel_of(in[0]); }
double flops_softmax_xent(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[0]); }
double flops_softmax_xent_backward(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[1]); }
double flops_sgd(Inputs in, const TensorDesc*) { return 4.0 * numel_of(in[0]); }
double flops_adamw(Inputs in, const TensorDesc*) { return 14.0 * numel_of(in[0]); }
// Mixed updates also round the master copy into the 16-bit parameter.
double flops_sgd_mixed(Inputs in, const TensorDesc*) { return 5.0 * numel_of(in[0]); }
double flops_adamw_mixed(Inputs in, const TensorDesc*) { return 15.0 * numel_of(in[0]); }
// Reductions across ranks: one add per element this rank contributes (moving bytes is not a FLOP).
double flops_collective_sum(Inputs in, const TensorDesc*) { return numel_of(in[0]); }
// RMSNorm: square-sum 2, scale 2 per element; backward 6 (dx), 3 (dgamma). SiLU: exp, add,
// divide, multiply; its derivative 5 (dy * s * (1 + x * (1 - s)) given s = sigmoid(x)).
// Rotary: 2 multiplies and an add per element (angles cached).
double flops_5_per_output(Inputs, const TensorDesc* out) { return 5.0 * numel_of(out); }
double flops_3_per_output(Inputs, const TensorDesc* out) { return 3.0 * numel_of(out); }

// Convolution as GEMM: 2 * N * Cout * (OH*OW) * (Cin*K*K); each backward GEMM costs the same.
double flops_conv2d(Inputs in, const TensorDesc* out) {
  return 2.0 * numel_of(out) * double(in[0]->shape[1]);  // out [N,Cout,OH,OW], cols [N,CKK,P]
}
double flops_conv2d_backward_weight(Inputs in, const TensorDesc*) {
  return 2.0 * numel_of(in[0]) * double(in[1]->shape[1]);  // dy [N,Cout,OH,OW], cols [N,CKK,P]
}
double flops_conv2d_backward_cols(Inputs in, const TensorDesc*) {
  return 2.0 * numel_of(in[0]) * double(in[1]->shape.numel() / in[1]->shape[0]);  // dy, w [Cout,CKK]
}
// Grouped convolution: 2 * (C/groups * K * K) per output element, and per element of either gradient.
double flops_grouped_conv2d(Inputs in, const TensorDesc* out) {
  return 2.0 * numel_of(out) * double(in[1]->shape.numel() / in[1]->shape[0]);  // w [Cout, C/g, K, K]
}
double flops_grouped_conv2d_backward_input(Inputs in, const TensorDesc*) {
  return 2.0 * numel_of(in[0]) * double(in[1]->shape.numel() / in[1]->shape[0]);  // dy, w
}
double flops_grouped_conv2d_backward_weight(Inputs in, const TensorDesc* out) {
  return 2.0 * numel_of(in[0]) * double(out->shape.numel() / out->shape[0]);  // dy, dw
}

// Channel scale: one multiply per output element; its gate gradient a multiply-add per element of dy.
double flops_2_per_input(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[0]); }

// Pooling: one compare or add per input element (exact when stride == kernel; overlapping
// windows revisit elements); the backward one add per input-gradient element.
double flops_pool_window(Inputs in, const TensorDesc*) { return numel_of(in[0]); }
double flops_pool_backward(Inputs, const TensorDesc* out) { return numel_of(out); }
// Normalisation: statistics 3 per element (sum, centre, square); apply 4 (sub, mul, mul, add);
// the data gradient 6; dgamma 3 (centre, scale, multiply-add).
double flops_3_per_input(Inputs in, const TensorDesc*) { return 3.0 * numel_of(in[0]); }
double flops_4_per_output(Inputs, const TensorDesc* out) { return 4.0 * numel_of(out); }
double flops_6_per_output(Inputs, const TensorDesc* out) { return 6.0 * numel_of(out); }
double flops_running_stats(Inputs in, const TensorDesc*) { return 6.0 * double(in[0]->shape[1]); }
double flops_batched_matmul(Inputs in, const TensorDesc* out) {
  // 2*M*N*K per batch entry: K = numel(A) / (batch * M) and numel(out) = batch * M * N.
  const int r = out->shape.rank();
  const double rows = double(out->shape.numel() / out->shape[r - 1]);  // batch * M
  return 2.0 * numel_of(out) * (numel_of(in[0]) / rows);
}
// Softmax: max, subtract, exp, sum, divide per element; its backward: multiply, sum, subtract, multiply.
double flops_softmax(Inputs, const TensorDesc* out) { return 5.0 * numel_of(out); }
// Attention: per (query, key) pair, 2D for a score and 2D per further product with a [T, D]
// operand, plus a few for the softmax. FLOPs see no attrs, so every pair counts (a causal kernel
// visits about half of them).
double attention_pairs(const TensorDesc& q) {
  return double(q.shape[0]) * double(q.shape[1]) * double(q.shape[2]) * double(q.shape[2]);
}
double flops_attention_lse(Inputs in, const TensorDesc*) {
  return attention_pairs(*in[0]) * (2.0 * double(in[0]->shape[3]) + 3.0);
}
double flops_attention(Inputs in, const TensorDesc*) {
  return attention_pairs(*in[0]) * (4.0 * double(in[0]->shape[3]) + 2.0);
}
double flops_attention_backward(Inputs in, const TensorDesc*) {
  return attention_pairs(*in[1]) * (10.0 * double(in[1]->shape[3]) + 6.0);
}
double flops_4_per_input0(Inputs in, const TensorDesc*) { return 4.0 * numel_of(in[0]); }
// Scatter-adds: one add per element scattered.
double flops_per_input0(Inputs in, const TensorDesc*) { return numel_of(in[0]); }
double flops_2_per_input0(Inputs in, const TensorDesc*) { return 2.0 * numel_of(in[0]); }
// Attention of one query row per slot over a full context (the most a step can do): scores and
// weighted values, 2 multiply-adds per cached element, plus the softmax.
double flops_decode_attention(Inputs in, const TensorDesc* out) {
  const double context = double(in[5]->shape[1]) * double(in[3]->shape[1]);  // MB * block size
  return 4.0 * numel_of(out) * context + 5.0 * double(in[0]->shape[0]) * context;
}

// clang-format off
// One row per OpKind, in enum order; each row states its kind (tests/op_table_test.cpp checks
// that row i is kind i and that every kind has a row; op_info checks the row it returns).
constexpr auto kOpTable = std::to_array<OpInfo>({
  // kind                                  name                              in upd out view infer                         flops
  {OpKind::matmul,                         "matmul",                         2, 0, 1, false, infer_matmul,                 flops_matmul},
  {OpKind::bias_add,                       "bias_add",                       2, 0, 1, false, infer_bias_add,               flops_per_output},
  {OpKind::add,                            "add",                            2, 0, 1, false, infer_binary_same,            flops_per_output},
  {OpKind::mul,                            "mul",                            2, 0, 1, false, infer_binary_same,            flops_per_output},
  {OpKind::scale,                          "scale",                          1, 0, 1, false, infer_unary,                  flops_per_output},
  {OpKind::relu,                           "relu",                           1, 0, 1, false, infer_unary,                  flops_per_output},
  {OpKind::gelu,                           "gelu",                           1, 0, 1, false, infer_unary,                  flops_gelu},
  {OpKind::reshape,                        "reshape",                        1, 0, 1, true,  infer_reshape,                flops_zero},
  {OpKind::sum,                            "sum",                            1, 0, 1, false, infer_reduce_all,             flops_per_input},
  {OpKind::mean,                           "mean",                           1, 0, 1, false, infer_reduce_all,             flops_per_input},
  {OpKind::softmax_cross_entropy,          "softmax_cross_entropy",          2, 0, 1, false, infer_softmax_xent,           flops_softmax_xent},
  {OpKind::im2col,                         "im2col",                         1, 0, 1, false, infer_im2col,                 flops_zero},
  {OpKind::conv2d,                         "conv2d",                         2, 0, 1, false, infer_conv2d,                 flops_conv2d},
  {OpKind::max_pool2d,                     "max_pool2d",                     1, 0, 1, false, infer_pool,                   flops_pool_window},
  {OpKind::avg_pool2d,                     "avg_pool2d",                     1, 0, 1, false, infer_avg_pool,               flops_pool_window},
  {OpKind::global_avg_pool,                "global_avg_pool",                1, 0, 1, false, infer_global_avg_pool,        flops_per_input},
  {OpKind::batch_norm_stats,               "batch_norm_stats",               1, 0, 1, false, infer_batch_norm_stats,       flops_3_per_input},
  {OpKind::batch_norm_centered_stats,      "batch_norm_centered_stats",      2, 0, 1, false, infer_batch_norm_centered_stats, flops_3_per_input},
  {OpKind::batch_norm,                     "batch_norm",                     4, 0, 1, false, infer_batch_norm,             flops_4_per_output},
  {OpKind::batch_norm_inference,           "batch_norm_inference",           5, 0, 1, false, infer_batch_norm_inference,   flops_4_per_output},
  {OpKind::running_stats_update,           "running_stats_update",           1, 2, 0, false, infer_update,                 flops_running_stats},
  {OpKind::layer_norm_stats,               "layer_norm_stats",               1, 0, 1, false, infer_layer_norm_stats,       flops_3_per_input},
  {OpKind::layer_norm,                     "layer_norm",                     4, 0, 1, false, infer_layer_norm,             flops_4_per_output},
  {OpKind::embedding,                      "embedding",                      2, 0, 1, false, infer_embedding,              flops_zero},
  {OpKind::batched_matmul,                 "batched_matmul",                 2, 0, 1, false, infer_batched_matmul,         flops_batched_matmul},
  {OpKind::softmax,                        "softmax",                        1, 0, 1, false, infer_softmax,                flops_softmax},
  {OpKind::permute,                        "permute",                        1, 0, 1, false, infer_permute,                flops_zero},
  {OpKind::dropout_mask,                   "dropout_mask",                   0, 0, 1, false, infer_dropout_mask,           flops_zero},
  {OpKind::rms_norm,                       "rms_norm",                       2, 0, 1, false, infer_rms_norm,               flops_4_per_output},
  {OpKind::silu,                           "silu",                           1, 0, 1, false, infer_unary,                  flops_4_per_output},
  {OpKind::rotary,                         "rotary",                         1, 0, 1, false, infer_rotary,                 flops_3_per_output},
  {OpKind::repeat_heads,                   "repeat_heads",                   1, 0, 1, false, infer_repeat_heads,           flops_zero},
  {OpKind::concat,                         "concat",                         2, 0, 1, false, infer_concat,                 flops_zero},
  {OpKind::slice,                          "slice",                          1, 0, 1, false, infer_slice,                  flops_zero},
  {OpKind::attention_lse,                  "attention_lse",                  2, 0, 1, false, infer_attention_lse,          flops_attention_lse},
  {OpKind::attention,                      "attention",                      4, 0, 1, false, infer_attention,              flops_attention},
  {OpKind::kv_cache_write,                 "kv_cache_write",                 4, 2, 0, false, infer_kv_cache_write,         flops_zero},
  {OpKind::decode_attention,               "decode_attention",               7, 0, 1, false, infer_decode_attention,       flops_decode_attention},
  {OpKind::sigmoid,                        "sigmoid",                        1, 0, 1, false, infer_unary,                  flops_4_per_output},
  {OpKind::tanh,                           "tanh",                           1, 0, 1, false, infer_unary,                  flops_4_per_output},
  {OpKind::clip,                           "clip",                           1, 0, 1, false, infer_clip,                   flops_per_output},
  {OpKind::grouped_conv2d,                 "grouped_conv2d",                 2, 0, 1, false, infer_grouped_conv2d,         flops_grouped_conv2d},
  {OpKind::channel_scale,                  "channel_scale",                  2, 0, 1, false, infer_channel_scale,          flops_per_output},
  {OpKind::relu_backward,                  "relu_backward",                  2, 0, 1, false, infer_backward_like_second,   flops_per_output},
  {OpKind::gelu_backward,                  "gelu_backward",                  2, 0, 1, false, infer_backward_like_second,   flops_gelu},
  {OpKind::broadcast_scalar,               "broadcast_scalar",               1, 0, 1, false, infer_broadcast_scalar,       flops_per_output},
  {OpKind::reduce_rows,                    "reduce_rows",                    1, 0, 1, false, infer_reduce_rows,            flops_per_input},
  {OpKind::softmax_cross_entropy_backward, "softmax_cross_entropy_backward", 3, 0, 1, false, infer_softmax_xent_backward,  flops_softmax_xent_backward},
  {OpKind::fill,                           "fill",                           0, 0, 1, false, infer_fill,                   flops_zero},
  {OpKind::conv2d_backward_weight,         "conv2d_backward_weight",         2, 0, 1, false, infer_conv2d_backward_weight, flops_conv2d_backward_weight},
  {OpKind::conv2d_backward_cols,           "conv2d_backward_cols",           2, 0, 1, false, infer_conv2d_backward_cols,   flops_conv2d_backward_cols},
  {OpKind::col2im,                         "col2im",                         1, 0, 1, false, infer_shape_attr,             flops_per_input0},
  {OpKind::max_pool2d_backward,            "max_pool2d_backward",            2, 0, 1, false, infer_like_second,            flops_pool_backward},
  {OpKind::avg_pool2d_backward,            "avg_pool2d_backward",            1, 0, 1, false, infer_shape_attr,             flops_pool_backward},
  {OpKind::global_avg_pool_backward,       "global_avg_pool_backward",       1, 0, 1, false, infer_shape_attr,             flops_per_output},
  {OpKind::batch_norm_backward,            "batch_norm_backward",            6, 0, 1, false, infer_like_second,            flops_6_per_output},
  {OpKind::batch_norm_dgamma,              "batch_norm_dgamma",              3, 0, 1, false, infer_channel_vector,         flops_3_per_input},
  {OpKind::channel_sum,                    "channel_sum",                    1, 0, 1, false, infer_channel_vector,         flops_per_input},
  {OpKind::layer_norm_backward,            "layer_norm_backward",            4, 0, 1, false, infer_like_second,            flops_6_per_output},
  {OpKind::layer_norm_dgamma,              "layer_norm_dgamma",              3, 0, 1, false, infer_last_dim_vector,        flops_3_per_input},
  {OpKind::embedding_backward,             "embedding_backward",             2, 0, 1, false, infer_shape_attr,             flops_per_input0},
  {OpKind::softmax_backward,               "softmax_backward",               2, 0, 1, false, infer_backward_like_second,   flops_4_per_input0},
  {OpKind::rms_norm_backward,              "rms_norm_backward",              3, 0, 1, false, infer_like_second,            flops_6_per_output},
  {OpKind::rms_norm_dgamma,                "rms_norm_dgamma",                2, 0, 1, false, infer_rms_norm_dgamma,        flops_3_per_input},
  {OpKind::silu_backward,                  "silu_backward",                  2, 0, 1, false, infer_backward_like_second,   flops_5_per_output},
  {OpKind::repeat_heads_backward,          "repeat_heads_backward",          1, 0, 1, false, infer_repeat_heads_backward,  flops_per_input0},
  {OpKind::attention_backward_dot,         "attention_backward_dot",         2, 0, 1, false, infer_attention_backward_dot, flops_2_per_input0},
  {OpKind::attention_backward,             "attention_backward",             6, 0, 1, false, infer_attention_backward,     flops_attention_backward},
  {OpKind::sigmoid_backward,               "sigmoid_backward",               2, 0, 1, false, infer_backward_like_second,   flops_3_per_output},
  {OpKind::tanh_backward,                  "tanh_backward",                  2, 0, 1, false, infer_backward_like_second,   flops_3_per_output},
  {OpKind::clip_backward,                  "clip_backward",                  2, 0, 1, false, infer_backward_like_second,   flops_per_output},
  {OpKind::grouped_conv2d_backward_input,  "grouped_conv2d_backward_input",  2, 0, 1, false, infer_shape_attr,             flops_grouped_conv2d_backward_input},
  {OpKind::grouped_conv2d_backward_weight, "grouped_conv2d_backward_weight", 2, 0, 1, false, infer_shape_attr,             flops_grouped_conv2d_backward_weight},
  {OpKind::channel_scale_backward,         "channel_scale_backward",         2, 0, 1, false, infer_shape_attr,             flops_2_per_input},
  {OpKind::sgd_update,                     "sgd_update",                     1, 1, 0, false, infer_update,                 flops_sgd},
  {OpKind::sgd_momentum_update,            "sgd_momentum_update",            1, 2, 0, false, infer_update,                 flops_sgd},
  {OpKind::adamw_update,                   "adamw_update",                   1, 3, 0, false, infer_update,                 flops_adamw},
  {OpKind::sgd_update_mixed,               "sgd_update_mixed",               1, 2, 0, false, infer_update,                 flops_sgd_mixed},
  {OpKind::sgd_momentum_update_mixed,      "sgd_momentum_update_mixed",      1, 3, 0, false, infer_update,                 flops_sgd_mixed},
  {OpKind::adamw_update_mixed,             "adamw_update_mixed",             1, 4, 0, false, infer_update,                 flops_adamw_mixed},
  {OpKind::pack,                           "pack",                   kVariadic, 0, 1, false, infer_pack,                   flops_zero},
  {OpKind::all_reduce,                     "all_reduce",                     1, 0, 1, true,  infer_all_reduce,             flops_collective_sum},
  {OpKind::reduce_scatter,                 "reduce_scatter",                 1, 0, 1, false, infer_reduce_scatter,         flops_collective_sum},
  {OpKind::all_gather,                     "all_gather",                     1, 0, 1, false, infer_all_gather,             flops_zero},
  {OpKind::all_gather_into,                "all_gather_into",                0, 1, 0, false, infer_all_gather_into,        flops_zero},
});
// clang-format on

}  // namespace

const OpInfo& op_info(OpKind kind) {
  const auto index = static_cast<std::size_t>(kind);
  MEMPLAN_CHECK(index < kOpTable.size() && kOpTable[index].kind == kind,
                "the op table has no row for op kind " << index << " at position " << index);
  return kOpTable[index];
}

std::span<const OpInfo> op_table() { return kOpTable; }

bool fusable_pair(OpKind first, OpKind second) {
  return (first == OpKind::im2col && (second == OpKind::conv2d || second == OpKind::conv2d_backward_weight)) ||
         (first == OpKind::conv2d_backward_cols && second == OpKind::col2im);
}

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::recompute: return "recompute";
  }
  MEMPLAN_CHECK(false, "unknown phase");
}

}  // namespace memplan::graph
