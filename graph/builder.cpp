#include "memplan/graph/builder.h"

namespace memplan::graph {

namespace {

// A sliding window narrows a causal mask: it needs one, and is a count of keys.
void check_window(bool causal, std::int64_t window, const std::string& name) {
  if (window < 0 || (window > 0 && !causal)) {
    throw GraphError(name + ": a window of " + std::to_string(window) +
                     " keys needs a causal mask and a count of at least 1 (0: no window)");
  }
}

}  // namespace

std::uint64_t dropout_seed(const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
  return h;
}

TensorId Builder::input(const std::string& name, Shape shape, DType dtype) {
  TensorDesc desc;
  desc.name = name;
  desc.shape = std::move(shape);
  desc.dtype = dtype;
  desc.role = Role::input;
  return graph_.add_tensor(std::move(desc));
}

TensorId Builder::parameter(const std::string& name, Shape shape, InitSpec init, DType dtype) {
  TensorDesc desc;
  desc.name = name;
  desc.shape = std::move(shape);
  desc.dtype = dtype;
  desc.role = Role::parameter;
  desc.init = init;
  return graph_.add_tensor(std::move(desc));
}

TensorId Builder::buffer(const std::string& name, Shape shape, InitSpec init, DType dtype) {
  TensorDesc desc;
  desc.name = name;
  desc.shape = std::move(shape);
  desc.dtype = dtype;
  desc.role = Role::optimizer_state;
  desc.init = init;
  return graph_.add_tensor(std::move(desc));
}

TensorId Builder::external(const std::string& name, Shape shape, DType dtype) {
  TensorDesc desc;
  desc.name = name;
  desc.shape = std::move(shape);
  desc.dtype = dtype;
  desc.role = Role::optimizer_state;  // persistent, never trained
  desc.external = true;
  return graph_.add_tensor(std::move(desc));
}

namespace {

// A cache a write op updates, [blocks, block_size, the key's width] and external: the op's shape
// inference sees inputs only, so the caches are checked here.
void check_cache(const char* op, const TensorDesc& c, const TensorDesc& key) {
  if (!c.external || c.shape.rank() != 3 || c.dtype != key.dtype || key.shape.rank() != 2 || c.shape[2] != key.shape[1]) {
    throw GraphError(std::string(op) + ": cache '" + c.name + "' " + c.shape.to_string() + " must be an external [blocks, block_size, " +
                     (key.shape.rank() == 2 ? std::to_string(key.shape[1]) : "?") + "] tensor of the key's dtype");
  }
}

}  // namespace

void Builder::kv_cache_write(TensorId k, TensorId v, TensorId block_table, TensorId positions, TensorId k_cache,
                             TensorId v_cache, const std::string& name, std::int64_t rotary_head_size,
                             float rope_base, std::int64_t rotary_dims) {
  for (TensorId cache : {k_cache, v_cache}) check_cache("kv_cache_write", graph_.tensor(cache), graph_.tensor(k));
  OpAttrs attrs;
  if (rope_base > 0.0f) {
    attrs.shape = {rotary_head_size};
    attrs.rope_base = rope_base;
    attrs.rotary_dims = rotary_dims;
  }
  graph_.add_op(OpKind::kv_cache_write, {k, v, block_table, positions}, std::move(attrs), name, Role::temporary, phase_,
                {k_cache, v_cache});
}

void Builder::latent_cache_write(TensorId key, TensorId block_table, TensorId positions, TensorId cache,
                                 const std::string& name, float rope_base, std::int64_t rotary_dims) {
  const TensorDesc& kd = graph_.tensor(key);
  check_cache("latent_cache_write", graph_.tensor(cache), kd);
  OpAttrs attrs;
  if (rope_base > 0.0f) {
    attrs.shape = {kd.shape[1]};
    attrs.rope_base = rope_base;
    attrs.rotary_dims = rotary_dims;
  }
  graph_.add_op(OpKind::latent_cache_write, {key, block_table, positions}, std::move(attrs), name, Role::temporary, phase_,
                {cache});
}

TensorId Builder::latent_decode_attention(TensorId q, TensorId key, TensorId cache, TensorId block_table,
                                          TensorId positions, std::int64_t heads, std::int64_t value_start,
                                          const std::string& name, float rope_base, std::int64_t rotary_dims, float scale,
                                          float softcap) {
  OpAttrs attrs;
  attrs.shape = {heads};
  attrs.start = value_start;
  attrs.alpha = scale;  // 0: 1 / sqrt(the key's width)
  attrs.softcap = softcap;
  if (rope_base > 0.0f) {
    attrs.shape.push_back(1);
    attrs.rope_base = rope_base;
    attrs.rotary_dims = rotary_dims;
  }
  return graph_.add_op(OpKind::latent_decode_attention, {q, key, cache, block_table, positions}, std::move(attrs), name,
                       Role::activation, phase_);
}

TensorId Builder::decode_attention(TensorId q, TensorId k, TensorId v, TensorId k_cache, TensorId v_cache,
                                   TensorId block_table, TensorId positions, std::int64_t heads, std::int64_t kv_heads,
                                   const std::string& name, float rope_base, std::int64_t rotary_dims, float scale,
                                   float softcap) {
  OpAttrs attrs;
  attrs.shape = {heads, kv_heads};
  attrs.alpha = scale;  // 0: 1 / sqrt(head size)
  attrs.softcap = softcap;
  if (rope_base > 0.0f) {
    attrs.shape.push_back(1);
    attrs.rope_base = rope_base;
    attrs.rotary_dims = rotary_dims;
  }
  return graph_.add_op(OpKind::decode_attention, {q, k, v, k_cache, v_cache, block_table, positions}, std::move(attrs),
                       name, Role::activation, phase_);
}

TensorId Builder::unary(OpKind kind, TensorId x, const std::string& name, OpAttrs attrs) {
  return graph_.add_op(kind, {x}, std::move(attrs), name, Role::activation, phase_);
}

TensorId Builder::binary(OpKind kind, TensorId a, TensorId b, const std::string& name,
                         OpAttrs attrs) {
  return graph_.add_op(kind, {a, b}, std::move(attrs), name, Role::activation, phase_);
}

TensorId Builder::sigmoid(TensorId x, const std::string& name) { return unary(OpKind::sigmoid, x, name); }
TensorId Builder::tanh(TensorId x, const std::string& name) { return unary(OpKind::tanh, x, name); }
TensorId Builder::clip(TensorId x, float lo, float hi, const std::string& name) {
  OpAttrs attrs;
  attrs.clip_min = lo;
  attrs.clip_max = hi;
  return unary(OpKind::clip, x, name, std::move(attrs));
}

TensorId Builder::grouped_conv2d(TensorId x, TensorId w, std::int64_t stride, std::int64_t padding, std::int64_t groups,
                                 const std::string& name, std::int64_t dilation) {
  const Shape& ws = graph_.tensor(w).shape;
  if (ws.rank() != 4 || ws[2] != ws[3]) {
    throw GraphError("grouped_conv2d '" + name + "': weight must be [Cout, Cin / groups, K, K], got " + ws.to_string());
  }
  OpAttrs attrs;
  attrs.kernel = ws[2];
  attrs.stride = stride;
  attrs.padding = padding;
  attrs.groups = groups;
  attrs.dilation = dilation;
  return binary(OpKind::grouped_conv2d, x, w, name, std::move(attrs));
}

TensorId Builder::channel_scale(TensorId x, TensorId g, const std::string& name) {
  return binary(OpKind::channel_scale, x, g, name);
}

TensorId Builder::moe_top_k(TensorId probs, std::int64_t top_k, bool normalize, const std::string& name,
                            const MoeChoice& choice) {
  OpAttrs attrs;
  attrs.top_k = top_k;
  attrs.normalize = normalize;
  attrs.expert_groups = choice.groups;
  attrs.top_groups = choice.top_groups;
  attrs.group_top2 = choice.group_top2;
  if (choice.bias == kNoTensor) return unary(OpKind::moe_top_k, probs, name, std::move(attrs));
  return binary(OpKind::moe_top_k, probs, choice.bias, name, std::move(attrs));
}

TensorId Builder::moe_dispatch(TensorId x, TensorId gates, std::int64_t capacity, const std::string& name) {
  OpAttrs attrs;
  attrs.capacity = capacity;
  attrs.weighted = false;  // the experts see the tokens themselves; moe_combine applies the gates
  return binary(OpKind::moe_dispatch, x, gates, name, std::move(attrs));
}

TensorId Builder::moe_combine(TensorId ye, TensorId gates, const std::string& name) {
  return binary(OpKind::moe_combine, ye, gates, name);
}

TensorId Builder::moe_router_stats(TensorId probs, TensorId gates, const std::string& name) {
  return binary(OpKind::moe_router_stats, probs, gates, name);
}

TensorId Builder::linear(TensorId x, TensorId weight, TensorId bias, const std::string& name) {
  TensorId xw = matmul(x, weight, false, true, name + ".matmul");
  return bias_add(xw, bias, name);
}

TensorId Builder::matmul(TensorId a, TensorId b, bool trans_a, bool trans_b,
                         const std::string& name) {
  OpAttrs attrs;
  attrs.trans_a = trans_a;
  attrs.trans_b = trans_b;
  return binary(OpKind::matmul, a, b, name, std::move(attrs));
}

TensorId Builder::bias_add(TensorId x, TensorId bias, const std::string& name) {
  return binary(OpKind::bias_add, x, bias, name);
}
TensorId Builder::add(TensorId a, TensorId b, const std::string& name) {
  return binary(OpKind::add, a, b, name);
}
TensorId Builder::mul(TensorId a, TensorId b, const std::string& name) {
  return binary(OpKind::mul, a, b, name);
}
TensorId Builder::scale(TensorId x, float alpha, const std::string& name) {
  OpAttrs attrs;
  attrs.alpha = alpha;
  return unary(OpKind::scale, x, name, std::move(attrs));
}
TensorId Builder::relu(TensorId x, const std::string& name) { return unary(OpKind::relu, x, name); }
TensorId Builder::gelu(TensorId x, const std::string& name) { return unary(OpKind::gelu, x, name); }
TensorId Builder::reshape(TensorId x, Shape shape, const std::string& name) {
  OpAttrs attrs;
  attrs.shape = shape.dims;
  return unary(OpKind::reshape, x, name, std::move(attrs));
}
TensorId Builder::sum(TensorId x, const std::string& name) { return unary(OpKind::sum, x, name); }
TensorId Builder::mean(TensorId x, const std::string& name) { return unary(OpKind::mean, x, name); }
TensorId Builder::cross_entropy(TensorId logits, TensorId labels, const std::string& name) {
  return binary(OpKind::softmax_cross_entropy, logits, labels, name);
}
TensorId Builder::linear_cross_entropy(TensorId h, TensorId w, TensorId labels, std::int64_t chunk_rows,
                                       const std::string& name) {
  OpAttrs attrs;
  attrs.chunk_rows = chunk_rows;
  const TensorId lse = graph_.add_op(OpKind::linear_cross_entropy_lse, {h, w}, attrs, name + ".lse", Role::activation, phase_);
  return graph_.add_op(OpKind::linear_cross_entropy, {h, w, labels, lse}, std::move(attrs), name, Role::activation, phase_);
}


TensorId Builder::conv2d(TensorId x, TensorId w, std::int64_t stride, std::int64_t padding,
                         const std::string& name, std::int64_t dilation, std::int64_t padding_w) {
  const Shape& ws = graph_.tensor(w).shape;
  if (ws.rank() != 4) throw GraphError("conv2d '" + name + "': weight must be [Cout, Cin, K, K_W], got " + ws.to_string());
  OpAttrs attrs;
  attrs.kernel = ws[2];
  if (ws[3] != ws[2]) attrs.kernel_w = ws[3];
  attrs.stride = stride;
  attrs.padding = padding;
  if (padding_w >= 0 && padding_w != padding) attrs.padding_w = padding_w;
  attrs.dilation = dilation;
  const TensorId cols = unary(OpKind::im2col, x, name + ".cols", attrs);
  const Shape& xs = graph_.tensor(x).shape;
  const std::int64_t oh = (xs[2] + 2 * padding - dilation * (attrs.kernel - 1) - 1) / stride + 1;
  attrs.shape = {oh, graph_.tensor(cols).shape[2] / oh};
  return binary(OpKind::conv2d, cols, w, name, std::move(attrs));
}

TensorId Builder::max_pool2d(TensorId x, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
                             const std::string& name) {
  OpAttrs attrs;
  attrs.kernel = kernel;
  attrs.stride = stride;
  attrs.padding = padding;
  return unary(OpKind::max_pool2d, x, name, std::move(attrs));
}

TensorId Builder::avg_pool2d(TensorId x, std::int64_t kernel, std::int64_t stride, const std::string& name) {
  OpAttrs attrs;
  attrs.kernel = kernel;
  attrs.stride = stride;
  return unary(OpKind::avg_pool2d, x, name, std::move(attrs));
}

TensorId Builder::global_avg_pool(TensorId x, const std::string& name) {
  return unary(OpKind::global_avg_pool, x, name);
}

TensorId Builder::batch_norm(TensorId x, TensorId gamma, TensorId beta, TensorId running_mean,
                             TensorId running_var, bool training, const std::string& name, float momentum,
                             float eps) {
  OpAttrs attrs;
  attrs.norm_eps = eps;
  if (!training) {
    return graph_.add_op(OpKind::batch_norm_inference, {x, running_mean, running_var, gamma, beta}, attrs, name,
                         Role::activation, phase_);
  }
  const TensorId stats = unary(OpKind::batch_norm_stats, x, name + ".stats");
  const Shape& xs = graph_.tensor(x).shape;
  const std::int64_t count = xs.numel() / xs[1];  // elements per channel
  OpAttrs update;
  update.momentum = momentum;
  update.alpha = count > 1 ? float(double(count) / double(count - 1)) : 1.0f;
  graph_.add_op(OpKind::running_stats_update, {stats}, update, name + ".running_update", Role::temporary, phase_,
                {running_mean, running_var});
  return graph_.add_op(OpKind::batch_norm, {x, stats, gamma, beta}, attrs, name, Role::activation, phase_);
}

TensorId Builder::layer_norm(TensorId x, TensorId gamma, TensorId beta, const std::string& name, float eps) {
  OpAttrs attrs;
  attrs.norm_eps = eps;
  const TensorId stats = unary(OpKind::layer_norm_stats, x, name + ".stats", attrs);
  return graph_.add_op(OpKind::layer_norm, {x, stats, gamma, beta}, attrs, name, Role::activation, phase_);
}

TensorId Builder::embedding(TensorId ids, TensorId table, const std::string& name) {
  return binary(OpKind::embedding, ids, table, name);
}

TensorId Builder::relative_position_bias(TensorId table, std::int64_t queries, std::int64_t keys, bool bidirectional,
                                         std::int64_t max_distance, const std::string& name) {
  OpAttrs attrs;
  attrs.shape = {queries, keys};
  attrs.buckets = graph_.tensor(table).shape.rank() == 2 ? graph_.tensor(table).shape[0] : 0;
  attrs.max_distance = max_distance;
  attrs.bidirectional = bidirectional;
  return unary(OpKind::relative_position_bias, table, name, std::move(attrs));
}

TensorId Builder::batched_matmul(TensorId a, TensorId b, bool trans_a, bool trans_b, const std::string& name) {
  OpAttrs attrs;
  attrs.trans_a = trans_a;
  attrs.trans_b = trans_b;
  return binary(OpKind::batched_matmul, a, b, name, std::move(attrs));
}

TensorId Builder::softmax(TensorId x, bool causal, const std::string& name, std::int64_t window) {
  check_window(causal, window, name);
  OpAttrs attrs;
  attrs.causal = causal;
  attrs.window = window;
  return unary(OpKind::softmax, x, name, std::move(attrs));
}

TensorId Builder::permute(TensorId x, std::vector<std::int64_t> perm, const std::string& name) {
  OpAttrs attrs;
  attrs.perm = std::move(perm);
  return unary(OpKind::permute, x, name, std::move(attrs));
}

TensorId Builder::cast(TensorId x, DType dtype, const std::string& name) {
  if (graph_.tensor(x).dtype == dtype) return x;
  OpAttrs attrs;
  attrs.dtype = dtype;
  return graph_.add_op(OpKind::cast, {x}, std::move(attrs), name, Role::activation, phase_);
}

TensorId Builder::dropout(TensorId x, float p, const std::string& name) {
  if (p == 0.0f) return x;
  OpAttrs attrs;
  attrs.dropout = p;
  attrs.shape = graph_.tensor(x).shape.dims;
  attrs.seed = dropout_seed(name);
  attrs.dtype = graph_.tensor(x).dtype;
  const TensorId mask = graph_.add_op(OpKind::dropout_mask, {}, std::move(attrs), name + ".mask", Role::activation,
                                      phase_);
  return mul(x, mask, name);
}

TensorId Builder::rms_norm(TensorId x, TensorId gamma, const std::string& name, float eps) {
  OpAttrs attrs;
  attrs.norm_eps = eps;
  return binary(OpKind::rms_norm, x, gamma, name, std::move(attrs));
}

TensorId Builder::silu(TensorId x, const std::string& name) { return unary(OpKind::silu, x, name); }

TensorId Builder::swiglu(TensorId gate, TensorId up, const std::string& name) {
  return binary(OpKind::swiglu, gate, up, name);
}

TensorId Builder::rotary(TensorId x, float base, const std::string& name, std::int64_t rotary_dims) {
  OpAttrs attrs;
  attrs.rope_base = base;
  attrs.rotary_dims = rotary_dims;
  return unary(OpKind::rotary, x, name, std::move(attrs));
}

TensorId Builder::repeat_heads(TensorId x, std::int64_t repeats, const std::string& name) {
  if (repeats == 1) return x;
  OpAttrs attrs;
  attrs.repeats = repeats;
  return unary(OpKind::repeat_heads, x, name, std::move(attrs));
}

TensorId Builder::concat(TensorId a, TensorId b, std::int64_t axis, const std::string& name) {
  OpAttrs attrs;
  attrs.axis = axis;
  return binary(OpKind::concat, a, b, name, std::move(attrs));
}

TensorId Builder::fill(Shape shape, float value, DType dtype, const std::string& name) {
  OpAttrs attrs;
  attrs.shape = std::move(shape.dims);
  attrs.alpha = value;
  attrs.dtype = dtype;
  return graph_.add_op(OpKind::fill, {}, std::move(attrs), name, Role::activation, phase_);
}

TensorId Builder::slice(TensorId x, std::int64_t axis, std::int64_t start, std::int64_t length,
                        const std::string& name) {
  OpAttrs attrs;
  attrs.axis = axis;
  attrs.start = start;
  attrs.length = length;
  return unary(OpKind::slice, x, name, std::move(attrs));
}

}  // namespace memplan::graph

namespace memplan::graph {

TensorId Builder::attention(TensorId q, TensorId k, TensorId v, bool causal, float scale, float p,
                            const std::string& name, const std::string& dropout_name, float softcap,
                            std::int64_t window) {
  check_window(causal, window, name);
  OpAttrs attrs;
  attrs.causal = causal;
  attrs.window = window;
  attrs.alpha = scale;
  attrs.softcap = softcap;
  attrs.dropout = p;
  attrs.seed = p > 0.0f ? dropout_seed(dropout_name.empty() ? name + ".drop" : dropout_name) : 0;
  const TensorId lse = graph_.add_op(OpKind::attention_lse, {q, k}, attrs, name + ".lse", Role::activation, phase_);
  return graph_.add_op(OpKind::attention, {q, k, v, lse}, std::move(attrs), name, Role::activation, phase_);
}

}  // namespace memplan::graph
