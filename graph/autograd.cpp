#include "memplan/graph/autograd.h"

#include <array>
#include <vector>

#include "memplan/common/check.h"

namespace memplan::graph {
namespace {

class GradContext {
 public:
  GradContext(Graph& graph, std::vector<bool> needs_grad)
      : graph_(graph), needs_grad_(std::move(needs_grad)),
        grad_(static_cast<std::size_t>(graph.num_tensors()), kNoTensor) {}

  bool needs_grad(TensorId id) const { return needs_grad_[static_cast<std::size_t>(id)]; }
  const TensorDesc& tensor(TensorId id) const { return graph_.tensor(id); }
  TensorId grad(TensorId id) const { return grad_[static_cast<std::size_t>(id)]; }

  // Adds a contribution to x's gradient; the second and later contributions are summed by an
  // explicit add op, in a fixed order, so results are deterministic.
  void accumulate(TensorId x, TensorId g) {
    if (!needs_grad(x)) return;
    TensorId& slot = grad_[static_cast<std::size_t>(x)];
    if (slot == kNoTensor) {
      slot = g;
    } else {
      slot = emit(OpKind::add, {slot, g}, {}, "grad_acc(" + tensor(x).name + ")");
    }
  }

  TensorId emit(OpKind kind, std::vector<TensorId> inputs, OpAttrs attrs, const std::string& name,
                Role role = Role::gradient) {
    return graph_.add_op(kind, std::move(inputs), std::move(attrs), name, role, Phase::backward);
  }
  // The op producing `id`, or nullptr for tensors no op produces.
  const Op* producer(TensorId id) const {
    const int p = graph_.producer(id);
    return p < 0 ? nullptr : &graph_.ops()[static_cast<std::size_t>(p)];
  }

  std::string gname(TensorId id) const { return "d(" + tensor(id).name + ")"; }

 private:
  Graph& graph_;
  std::vector<bool> needs_grad_;
  std::vector<TensorId> grad_;  // per tensor: its gradient so far
};

using GradRule = void (*)(GradContext&, const Op&, TensorId dy);

OpAttrs transposes(bool a, bool b) {
  OpAttrs attrs;
  attrs.trans_a = a;
  attrs.trans_b = b;
  return attrs;
}

// C = op(A) op(B). Each case writes dA and dB as one matmul with the right transposes so no
// transposed copy is ever materialised.
// Also batched_matmul: the same transposes apply per leading index.
void grad_matmul(GradContext& c, const Op& op, TensorId dy) {
  const OpKind mm = op.kind;
  const TensorId a = op.inputs[0], b = op.inputs[1];
  const bool ta = op.attrs.trans_a, tb = op.attrs.trans_b;
  if (c.needs_grad(a)) {
    TensorId da;
    if (!ta && !tb) da = c.emit(mm, {dy, b}, transposes(false, true), c.gname(a));
    else if (!ta && tb) da = c.emit(mm, {dy, b}, transposes(false, false), c.gname(a));
    else if (ta && !tb) da = c.emit(mm, {b, dy}, transposes(false, true), c.gname(a));
    else da = c.emit(mm, {b, dy}, transposes(true, true), c.gname(a));
    c.accumulate(a, da);
  }
  if (c.needs_grad(b)) {
    TensorId db;
    if (!ta && !tb) db = c.emit(mm, {a, dy}, transposes(true, false), c.gname(b));
    else if (!ta && tb) db = c.emit(mm, {dy, a}, transposes(true, false), c.gname(b));
    else if (ta && !tb) db = c.emit(mm, {a, dy}, transposes(false, false), c.gname(b));
    else db = c.emit(mm, {dy, a}, transposes(true, true), c.gname(b));
    c.accumulate(b, db);
  }
}

void grad_bias_add(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], dy);
  if (c.needs_grad(op.inputs[1])) {
    c.accumulate(op.inputs[1], c.emit(OpKind::reduce_rows, {dy}, {}, c.gname(op.inputs[1])));
  }
}

void grad_add(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], dy);
  c.accumulate(op.inputs[1], dy);
}

void grad_mul(GradContext& c, const Op& op, TensorId dy) {
  const TensorId a = op.inputs[0], b = op.inputs[1];
  if (c.needs_grad(a)) c.accumulate(a, c.emit(OpKind::mul, {dy, b}, {}, c.gname(a)));
  if (c.needs_grad(b)) c.accumulate(b, c.emit(OpKind::mul, {dy, a}, {}, c.gname(b)));
}

void grad_scale(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs attrs;
  attrs.alpha = op.attrs.alpha;
  c.accumulate(op.inputs[0], c.emit(OpKind::scale, {dy}, attrs, c.gname(op.inputs[0])));
}

void grad_relu(GradContext& c, const Op& op, TensorId dy) {
  // Uses the output y (y > 0 iff x > 0), so x itself need not stay alive.
  c.accumulate(op.inputs[0],
               c.emit(OpKind::relu_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

void grad_gelu(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0],
               c.emit(OpKind::gelu_backward, {dy, op.inputs[0]}, {}, c.gname(op.inputs[0])));
}

void grad_reshape(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs attrs;
  attrs.shape = c.tensor(op.inputs[0]).shape.dims;
  c.accumulate(op.inputs[0], c.emit(OpKind::reshape, {dy}, attrs, c.gname(op.inputs[0])));
}

void grad_reduce_all(GradContext& c, const Op& op, TensorId dy, float alpha) {
  OpAttrs attrs;
  attrs.shape = c.tensor(op.inputs[0]).shape.dims;
  attrs.alpha = alpha;
  attrs.dtype = c.tensor(op.inputs[0]).dtype;
  c.accumulate(op.inputs[0], c.emit(OpKind::broadcast_scalar, {dy}, attrs, c.gname(op.inputs[0])));
}

void grad_sum(GradContext& c, const Op& op, TensorId dy) { grad_reduce_all(c, op, dy, 1.0f); }

void grad_mean(GradContext& c, const Op& op, TensorId dy) {
  grad_reduce_all(c, op, dy, 1.0f / static_cast<float>(c.tensor(op.inputs[0]).shape.numel()));
}

void grad_softmax_cross_entropy(GradContext& c, const Op& op, TensorId dy) {
  const TensorId logits = op.inputs[0], labels = op.inputs[1];
  c.accumulate(logits, c.emit(OpKind::softmax_cross_entropy_backward, {dy, logits, labels}, {},
                              c.gname(logits)));
}

void grad_broadcast_scalar(GradContext& c, const Op& op, TensorId dy) {
  TensorId s = c.emit(OpKind::sum, {dy}, {}, c.gname(op.inputs[0]) + ".sum");
  OpAttrs attrs;
  attrs.alpha = op.attrs.alpha;
  TensorId g = c.emit(OpKind::scale, {s}, attrs, c.gname(op.inputs[0]));
  // A scalar may be stored as [1] or []: view the result with the input's shape.
  if (c.tensor(g).shape != c.tensor(op.inputs[0]).shape) {
    OpAttrs view;
    view.shape = c.tensor(op.inputs[0]).shape.dims;
    g = c.emit(OpKind::reshape, {g}, view, c.gname(op.inputs[0]) + ".view");
  }
  c.accumulate(op.inputs[0], g);
}


OpAttrs with_shape(OpAttrs attrs, const Shape& shape) {
  attrs.shape = shape.dims;
  return attrs;
}

// im2col's columns are scattered back onto the input (overlapping windows add up).
void grad_im2col(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::col2im, {dy}, with_shape(op.attrs, c.tensor(x).shape), c.gname(x)));
}

// The weight's gradient reads the columns again. Where they are im2col's, they are rebuilt from
// the image here rather than kept from the forward pass: the image is a ninth of 3x3 columns
// (and usually kept anyway), and rebuilding columns costs far less than their trip through
// memory (the CPU fuses each im2col with its product, the columns never leaving the cache).
void grad_conv2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId cols = op.inputs[0], w = op.inputs[1];
  if (c.needs_grad(w)) {
    TensorId cols_again = cols;
    if (const Op* p = c.producer(cols); p != nullptr && p->kind == OpKind::im2col) {
      cols_again = c.emit(OpKind::im2col, {p->inputs[0]}, p->attrs, c.tensor(cols).name + ".again", Role::temporary);
    }
    c.accumulate(w, c.emit(OpKind::conv2d_backward_weight, {dy, cols_again},
                           with_shape(op.attrs, c.tensor(w).shape), c.gname(w)));
  }
  if (c.needs_grad(cols)) c.accumulate(cols, c.emit(OpKind::conv2d_backward_cols, {dy, w}, {}, c.gname(cols)));
}

void grad_grouped_conv2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], w = op.inputs[1];
  if (c.needs_grad(w)) {
    c.accumulate(w, c.emit(OpKind::grouped_conv2d_backward_weight, {dy, x}, with_shape(op.attrs, c.tensor(w).shape),
                           c.gname(w)));
  }
  if (c.needs_grad(x)) {
    c.accumulate(x, c.emit(OpKind::grouped_conv2d_backward_input, {dy, w}, with_shape(op.attrs, c.tensor(x).shape),
                           c.gname(x)));
  }
}

// sigmoid' = y (1 - y), tanh' = 1 - y^2: both from the output, so x need not stay alive.
// dx is dy scaled by the same gate; the gate's gradient sums dy * x over each (sample, channel).
void grad_channel_scale(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], g = op.inputs[1];
  if (c.needs_grad(g)) {
    c.accumulate(g, c.emit(OpKind::channel_scale_backward, {dy, x}, with_shape(op.attrs, c.tensor(g).shape), c.gname(g)));
  }
  if (c.needs_grad(x)) c.accumulate(x, c.emit(OpKind::channel_scale, {dy, g}, {}, c.gname(x)));
}

void grad_sigmoid(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::sigmoid_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

void grad_tanh(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::tanh_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

// The gradient passes where x is strictly inside the range (PyTorch's hardtanh_backward).
void grad_clip(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::clip_backward, {dy, op.inputs[0]}, op.attrs, c.gname(op.inputs[0])));
}

void grad_max_pool2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::max_pool2d_backward, {dy, x}, op.attrs, c.gname(x)));
}

void grad_avg_pool2d(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::avg_pool2d_backward, {dy}, with_shape(op.attrs, c.tensor(x).shape), c.gname(x)));
}

void grad_global_avg_pool(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  c.accumulate(x, c.emit(OpKind::global_avg_pool_backward, {dy}, with_shape({}, c.tensor(x).shape), c.gname(x)));
}

// The statistics input gets no gradient of its own: batch_norm_backward's dx already contains
// the paths through the mean and variance (the statistics op has no rule and is never reached).
void grad_batch_norm(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], stats = op.inputs[1], gamma = op.inputs[2], beta = op.inputs[3];
  const TensorId dgamma = c.emit(OpKind::batch_norm_dgamma, {dy, x, stats}, op.attrs, c.gname(gamma));
  const TensorId dbeta = c.emit(OpKind::channel_sum, {dy}, {}, c.gname(beta));
  if (c.needs_grad(x)) {
    c.accumulate(x, c.emit(OpKind::batch_norm_backward, {dy, x, stats, gamma, dgamma, dbeta}, op.attrs, c.gname(x)));
  }
  c.accumulate(gamma, dgamma);
  c.accumulate(beta, dbeta);
}

// As batch norm: the statistics' contribution is inside layer_norm_backward.
void grad_layer_norm(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], stats = op.inputs[1], gamma = op.inputs[2], beta = op.inputs[3];
  if (c.needs_grad(x)) {
    c.accumulate(x, c.emit(OpKind::layer_norm_backward, {dy, x, stats, gamma}, {}, c.gname(x)));
  }
  if (c.needs_grad(gamma)) c.accumulate(gamma, c.emit(OpKind::layer_norm_dgamma, {dy, x, stats}, {}, c.gname(gamma)));
  if (c.needs_grad(beta)) c.accumulate(beta, c.emit(OpKind::reduce_rows, {dy}, {}, c.gname(beta)));
}

void grad_embedding(GradContext& c, const Op& op, TensorId dy) {
  const TensorId ids = op.inputs[0], table = op.inputs[1];
  c.accumulate(table, c.emit(OpKind::embedding_backward, {dy, ids}, with_shape({}, c.tensor(table).shape),
                             c.gname(table)));
}

void grad_softmax(GradContext& c, const Op& op, TensorId dy) {
  // Masked (causal) positions have y = 0, so the same formula gives them zero gradient.
  c.accumulate(op.inputs[0], c.emit(OpKind::softmax_backward, {dy, op.outputs[0]}, {}, c.gname(op.inputs[0])));
}

void grad_permute(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs inverse;
  inverse.perm.resize(op.attrs.perm.size());
  for (std::size_t i = 0; i < op.attrs.perm.size(); ++i) {
    inverse.perm[static_cast<std::size_t>(op.attrs.perm[i])] = static_cast<std::int64_t>(i);
  }
  c.accumulate(op.inputs[0], c.emit(OpKind::permute, {dy}, inverse, c.gname(op.inputs[0])));
}

void grad_rms_norm(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0], gamma = op.inputs[1];
  if (c.needs_grad(x)) c.accumulate(x, c.emit(OpKind::rms_norm_backward, {dy, x, gamma}, op.attrs, c.gname(x)));
  if (c.needs_grad(gamma)) {
    c.accumulate(gamma, c.emit(OpKind::rms_norm_dgamma, {dy, x}, op.attrs, c.gname(gamma)));
  }
}

void grad_silu(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::silu_backward, {dy, op.inputs[0]}, {}, c.gname(op.inputs[0])));
}

// A rotation's adjoint is the rotation by the negative angle.
void grad_rotary(GradContext& c, const Op& op, TensorId dy) {
  OpAttrs attrs = op.attrs;
  attrs.inverse = !attrs.inverse;
  c.accumulate(op.inputs[0], c.emit(OpKind::rotary, {dy}, attrs, c.gname(op.inputs[0])));
}

void grad_repeat_heads(GradContext& c, const Op& op, TensorId dy) {
  c.accumulate(op.inputs[0], c.emit(OpKind::repeat_heads_backward, {dy}, op.attrs, c.gname(op.inputs[0])));
}

OpAttrs slice_attrs(std::int64_t axis, std::int64_t start, std::int64_t length) {
  OpAttrs attrs;
  attrs.axis = axis;
  attrs.start = start;
  attrs.length = length;
  return attrs;
}

// FlashAttention's backward: the rowwise dot(dy, y), then one op recomputing the probabilities
// tile by tile from q, k and the saved log-sum-exp, writing dq, dk and dv side by side along the
// head dim; slices hand each its part. The log-sum-exp gets no gradient of its own: its paths
// through q and k are inside attention_backward (attention_lse has no rule and is never reached).
void grad_attention(GradContext& c, const Op& op, TensorId dy) {
  const TensorId q = op.inputs[0], k = op.inputs[1], v = op.inputs[2], lse = op.inputs[3];
  const std::int64_t heads = c.tensor(q).shape[1], kv_heads = c.tensor(k).shape[1];
  const TensorId delta = c.emit(OpKind::attention_backward_dot, {dy, op.outputs[0]}, {}, c.gname(op.outputs[0]) + ".delta");
  const TensorId dqkv = c.emit(OpKind::attention_backward, {dy, q, k, v, lse, delta}, op.attrs, c.gname(op.outputs[0]) + ".qkv");
  if (c.needs_grad(q)) c.accumulate(q, c.emit(OpKind::slice, {dqkv}, slice_attrs(1, 0, heads), c.gname(q)));
  if (c.needs_grad(k)) c.accumulate(k, c.emit(OpKind::slice, {dqkv}, slice_attrs(1, heads, kv_heads), c.gname(k)));
  if (c.needs_grad(v)) {
    c.accumulate(v, c.emit(OpKind::slice, {dqkv}, slice_attrs(1, heads + kv_heads, kv_heads), c.gname(v)));
  }
}

void grad_concat(GradContext& c, const Op& op, TensorId dy) {
  const TensorId a = op.inputs[0], b = op.inputs[1];
  const std::int64_t axis = op.attrs.axis;
  const std::int64_t na = c.tensor(a).shape[static_cast<int>(axis)];
  const std::int64_t nb = c.tensor(b).shape[static_cast<int>(axis)];
  if (c.needs_grad(a)) c.accumulate(a, c.emit(OpKind::slice, {dy}, slice_attrs(axis, 0, na), c.gname(a)));
  if (c.needs_grad(b)) c.accumulate(b, c.emit(OpKind::slice, {dy}, slice_attrs(axis, na, nb), c.gname(b)));
}

// The slice's gradient is dy placed back between zeros (fill ops) along the axis.
void grad_slice(GradContext& c, const Op& op, TensorId dy) {
  const TensorId x = op.inputs[0];
  // Copies, not references: emitting ops grows the tensor table and would leave them dangling.
  const std::vector<std::int64_t> x_dims = c.tensor(x).shape.dims;
  const DType x_dtype = c.tensor(x).dtype;
  const std::int64_t axis = op.attrs.axis;
  const std::int64_t before = op.attrs.start;
  const std::int64_t after = x_dims[static_cast<std::size_t>(axis)] - op.attrs.start - op.attrs.length;
  auto zeros = [&](std::int64_t extent, const std::string& suffix) {
    OpAttrs fill;
    fill.shape = x_dims;
    fill.shape[static_cast<std::size_t>(axis)] = extent;
    fill.alpha = 0.0f;
    fill.dtype = x_dtype;
    return c.emit(OpKind::fill, {}, fill, c.gname(x) + suffix);
  };
  OpAttrs join;
  join.axis = axis;
  TensorId g = dy;
  if (before > 0) g = c.emit(OpKind::concat, {zeros(before, ".before"), g}, join, c.gname(x) + (after > 0 ? ".head" : ""));
  if (after > 0) g = c.emit(OpKind::concat, {g, zeros(after, ".after")}, join, c.gname(x));
  c.accumulate(x, g);
}

// One rule per op kind; nullptr where an op is never differentiated: backward helpers and
// optimizer updates (not on a path from parameters to the loss), running_stats_update (no
// output), the statistics ops (their gradient paths are inside batch_norm_backward and
// layer_norm_backward, so no gradient reaches them; attention_lse likewise), dropout_mask (no inputs) and
// batch_norm_inference (inference graphs have no backward).
constexpr std::array<GradRule, kOpKindCount> kGradRules = [] {
  std::array<GradRule, kOpKindCount> rules{};
  auto set = [&rules](OpKind kind, GradRule rule) { rules[static_cast<std::size_t>(kind)] = rule; };
  set(OpKind::matmul, grad_matmul);
  set(OpKind::bias_add, grad_bias_add);
  set(OpKind::add, grad_add);
  set(OpKind::mul, grad_mul);
  set(OpKind::scale, grad_scale);
  set(OpKind::relu, grad_relu);
  set(OpKind::gelu, grad_gelu);
  set(OpKind::reshape, grad_reshape);
  set(OpKind::sum, grad_sum);
  set(OpKind::mean, grad_mean);
  set(OpKind::softmax_cross_entropy, grad_softmax_cross_entropy);
  set(OpKind::broadcast_scalar, grad_broadcast_scalar);
  set(OpKind::im2col, grad_im2col);
  set(OpKind::conv2d, grad_conv2d);
  set(OpKind::max_pool2d, grad_max_pool2d);
  set(OpKind::avg_pool2d, grad_avg_pool2d);
  set(OpKind::global_avg_pool, grad_global_avg_pool);
  set(OpKind::batch_norm, grad_batch_norm);
  set(OpKind::layer_norm, grad_layer_norm);
  set(OpKind::embedding, grad_embedding);
  set(OpKind::batched_matmul, grad_matmul);
  set(OpKind::softmax, grad_softmax);
  set(OpKind::permute, grad_permute);
  set(OpKind::rms_norm, grad_rms_norm);
  set(OpKind::silu, grad_silu);
  set(OpKind::sigmoid, grad_sigmoid);
  set(OpKind::tanh, grad_tanh);
  set(OpKind::clip, grad_clip);
  set(OpKind::grouped_conv2d, grad_grouped_conv2d);
  set(OpKind::channel_scale, grad_channel_scale);
  set(OpKind::rotary, grad_rotary);
  set(OpKind::repeat_heads, grad_repeat_heads);
  set(OpKind::concat, grad_concat);
  set(OpKind::slice, grad_slice);
  set(OpKind::attention, grad_attention);
  return rules;
}();

}  // namespace

bool has_gradient_rule(OpKind kind) {
  return kGradRules[static_cast<std::size_t>(kind)] != nullptr;
}

void append_backward(Graph& graph, TensorId loss) {
  const TensorDesc& loss_desc = graph.tensor(loss);
  if (loss_desc.shape.numel() != 1 || loss_desc.dtype != DType::f32) {
    throw GraphError("the loss '" + loss_desc.name + "' must be an f32 scalar, got " +
                     std::string(dtype_name(loss_desc.dtype)) + " " + loss_desc.shape.to_string());
  }
  const int forward_ops = graph.num_ops();

  // A tensor needs a gradient if a parameter reaches it and it reaches the loss.
  std::vector<bool> from_param(static_cast<std::size_t>(graph.num_tensors()), false);
  for (TensorId id = 0; id < graph.num_tensors(); ++id) {
    from_param[static_cast<std::size_t>(id)] = graph.tensor(id).role == Role::parameter;
  }
  for (const Op& op : graph.ops()) {
    bool any = false;
    for (TensorId in : op.inputs) any = any || from_param[static_cast<std::size_t>(in)];
    for (TensorId out : op.outputs) from_param[static_cast<std::size_t>(out)] = any;
  }
  std::vector<bool> to_loss(from_param.size(), false);
  to_loss[static_cast<std::size_t>(loss)] = true;
  for (int i = forward_ops - 1; i >= 0; --i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    bool reaches = false;
    for (TensorId out : op.outputs) reaches = reaches || to_loss[static_cast<std::size_t>(out)];
    if (reaches) {
      for (TensorId in : op.inputs) to_loss[static_cast<std::size_t>(in)] = true;
    }
  }
  std::vector<bool> needs(from_param.size());
  for (std::size_t i = 0; i < needs.size(); ++i) needs[i] = from_param[i] && to_loss[i];
  if (!needs[static_cast<std::size_t>(loss)]) {
    throw GraphError("the loss '" + loss_desc.name + "' does not depend on any parameter");
  }

  GradContext ctx(graph, std::move(needs));
  OpAttrs seed;
  seed.alpha = 1.0f;
  seed.shape = loss_desc.shape.dims;
  ctx.accumulate(loss, ctx.emit(OpKind::fill, {}, seed, "d(" + loss_desc.name + ")"));

  // Every consumer of an op's output comes after it, so visiting forward ops in reverse sees
  // each output's gradient complete before it is propagated.
  for (int i = forward_ops - 1; i >= 0; --i) {
    const Op op = graph.ops()[static_cast<std::size_t>(i)];  // copy: emitting grows ops()
    if (op.outputs.empty()) continue;
    const TensorId dy = ctx.grad(op.outputs[0]);
    if (dy == kNoTensor) continue;
    GradRule rule = kGradRules[static_cast<std::size_t>(op.kind)];
    if (rule == nullptr) {
      throw GraphError("no gradient rule for op '" + std::string(op_name(op.kind)) + "' ('" +
                       op.name + "')");
    }
    rule(ctx, op, dy);
  }
  for (TensorId p : graph.parameters()) graph.mutable_tensor(p).grad = ctx.grad(p);
}

}  // namespace memplan::graph
