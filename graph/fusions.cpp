#include "memplan/graph/fusions.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace memplan::graph {

std::int64_t default_loss_chunk_rows(std::int64_t rows, std::int64_t vocab) {
  const std::int64_t per_block = kLossRowBlock * std::max<std::int64_t>(vocab, 1) * 4;
  const std::int64_t blocks = std::max<std::int64_t>(1, kLossChunkBytes / per_block);
  const std::int64_t chunk = blocks * kLossRowBlock;
  // Every row at once where that is no more (rounded up to a block, so that the attribute stays
  // a whole number of blocks).
  return chunk >= rows ? (rows + kLossRowBlock - 1) / kLossRowBlock * kLossRowBlock : chunk;
}

std::int64_t loss_chunk_scratch_bytes(std::int64_t rows, std::int64_t vocab, std::int64_t chunk_rows) {
  const std::int64_t chunk = chunk_rows <= 0 ? rows : std::min(chunk_rows, rows);
  return checked_mul(checked_mul(chunk, vocab), 4);
}

std::string_view fused_loss_name(FusedLoss mode) { return enum_name(kFusedLossNames, mode); }

Result<FusedLoss> parse_fused_loss(std::string_view name) { return parse_enum(kFusedLossNames, name, "fused loss"); }

namespace {

// The cross-entropy op of the loss and the matmul producing its logits, or why there are none.
struct Pattern {
  int loss_op = -1;
  int matmul_op = -1;
  std::string why_not;
};

Pattern find_pattern(const Graph& g) {
  Pattern p;
  if (g.loss == kNoTensor) return p;
  const int loss_op = g.producer(g.loss);
  if (loss_op < 0) return p;
  if (const OpKind kind = g.ops()[static_cast<std::size_t>(loss_op)].kind; kind != OpKind::softmax_cross_entropy) {
    p.why_not = "the loss '" + g.tensor(g.loss).name + "' is a " + std::string(op_name(kind)) +
                (kind == OpKind::vocab_parallel_loss ? " (vocabulary-parallel: already split by columns over the ranks)"
                                                     : ", not a softmax_cross_entropy of logits");
    return p;
  }
  const Op& xent = g.ops()[static_cast<std::size_t>(loss_op)];
  const TensorId logits = xent.inputs[0];
  const int mm = g.producer(logits);
  const Op* matmul = mm < 0 ? nullptr : &g.ops()[static_cast<std::size_t>(mm)];
  if (matmul == nullptr || matmul->kind != OpKind::matmul || matmul->attrs.trans_a || !matmul->attrs.trans_b) {
    p.why_not = "the logits '" + g.tensor(logits).name + "' are not a product h w^T of the hidden states and a [vocabulary, width] weight";
    return p;
  }
  for (const Op& op : g.ops()) {
    if (&op == &xent || &op == matmul) continue;
    for (TensorId t : op.inputs) {
      if (g.storage_root(t) == g.storage_root(logits)) {
        p.why_not = "the logits '" + g.tensor(logits).name + "' are also read by '" + op.name + "'";
        return p;
      }
    }
  }
  if (std::find(g.retained.begin(), g.retained.end(), logits) != g.retained.end()) {
    p.why_not = "the logits '" + g.tensor(logits).name + "' are kept for the caller";
    return p;
  }
  p.loss_op = loss_op;
  p.matmul_op = mm;
  return p;
}

// `forward` op by op into a new graph: `replace(i, map, g)` returns true where it emitted op i's
// replacement itself (or dropped it), mapping its outputs; other ops are copied. Tensors no op
// produces come first, in their order. `dropped` tensors (made by replaced ops, no longer in the
// graph) leave loss, output and retained unset.
template <typename Replace>
Graph rebuild(const Graph& forward, Replace&& replace) {
  Graph g;
  std::vector<TensorId> map(static_cast<std::size_t>(forward.num_tensors()), kNoTensor);
  for (TensorId id = 0; id < forward.num_tensors(); ++id) {
    if (forward.producer(id) < 0) map[static_cast<std::size_t>(id)] = g.add_tensor(forward.tensor(id));
  }
  auto mapped = [&](const std::vector<TensorId>& ids) {
    std::vector<TensorId> v;
    v.reserve(ids.size());
    for (TensorId t : ids) v.push_back(map[static_cast<std::size_t>(t)]);
    return v;
  };
  for (int i = 0; i < forward.num_ops(); ++i) {
    const Op& op = forward.ops()[static_cast<std::size_t>(i)];
    if (replace(i, map, g)) continue;
    const TensorDesc* o = op.outputs.empty() ? nullptr : &forward.tensor(op.outputs[0]);
    const TensorId made = g.add_op(op.kind, mapped(op.inputs), op.attrs, o != nullptr ? o->name : op.name,
                                   o != nullptr ? o->role : Role::temporary, op.phase, mapped(op.updates));
    if (o == nullptr) continue;
    TensorDesc& desc = g.mutable_tensor(made);
    desc.init = o->init;
    desc.external = o->external;
    map[static_cast<std::size_t>(op.outputs[0])] = made;
  }
  auto remap = [&](TensorId t) { return t == kNoTensor ? kNoTensor : map[static_cast<std::size_t>(t)]; };
  g.loss = remap(forward.loss);
  g.output = remap(forward.output);
  for (TensorId t : forward.retained) {
    if (remap(t) != kNoTensor) g.retained.push_back(remap(t));
  }
  return g;
}

// Whether any op of `g` but `except` reads `t`'s storage, or a caller keeps it.
bool read_elsewhere(const Graph& g, TensorId t, int except) {
  if (t == g.loss || t == g.output) return true;
  if (std::find(g.retained.begin(), g.retained.end(), t) != g.retained.end()) return true;
  for (int i = 0; i < g.num_ops(); ++i) {
    if (i == except) continue;
    for (TensorId in : g.ops()[static_cast<std::size_t>(i)].inputs) {
      if (g.storage_root(in) == g.storage_root(t)) return true;
    }
  }
  return false;
}

}  // namespace

SwigluFusion fuse_swiglu(Graph& forward) {
  // For each silu: the one mul reading its output, when that is all that reads it.
  std::vector<int> mul_of(static_cast<std::size_t>(forward.num_ops()), -1);   // silu op -> mul op
  std::vector<int> silu_of(static_cast<std::size_t>(forward.num_ops()), -1);  // mul op -> silu op
  std::vector<int> last_reader(static_cast<std::size_t>(forward.num_tensors()), -1);
  for (int i = 0; i < forward.num_ops(); ++i) {
    for (TensorId t : forward.ops()[static_cast<std::size_t>(i)].inputs) last_reader[static_cast<std::size_t>(forward.storage_root(t))] = i;
  }
  SwigluFusion out;
  for (int i = 0; i < forward.num_ops(); ++i) {
    const Op& op = forward.ops()[static_cast<std::size_t>(i)];
    if (op.kind != OpKind::silu) continue;
    const TensorId act = op.outputs[0];
    const auto root = static_cast<std::size_t>(forward.storage_root(act));
    if (static_cast<TensorId>(root) != act || last_reader[root] < 0) continue;
    const int m = last_reader[root];
    const Op& mul = forward.ops()[static_cast<std::size_t>(m)];
    if (mul.kind != OpKind::mul || mul.inputs[0] == mul.inputs[1] || read_elsewhere(forward, act, m)) continue;
    mul_of[static_cast<std::size_t>(i)] = m;
    silu_of[static_cast<std::size_t>(m)] = i;
    ++out.pairs;
    out.bytes += forward.tensor(act).size_bytes();
  }
  if (out.pairs == 0) return out;
  forward = rebuild(forward, [&](int i, std::vector<TensorId>& map, Graph& g) {
    if (mul_of[static_cast<std::size_t>(i)] >= 0) return true;  // the silu: made by the swiglu
    const int s = silu_of[static_cast<std::size_t>(i)];
    if (s < 0) return false;
    const Op& mul = forward.ops()[static_cast<std::size_t>(i)];
    const Op& silu = forward.ops()[static_cast<std::size_t>(s)];
    const TensorId up = mul.inputs[0] == silu.outputs[0] ? mul.inputs[1] : mul.inputs[0];
    const TensorId gate = silu.inputs[0];
    OpAttrs attrs;
    attrs.dtype = forward.tensor(silu.outputs[0]).dtype;  // the SiLU rounded as it was stored
    const TensorDesc& y = forward.tensor(mul.outputs[0]);
    map[static_cast<std::size_t>(mul.outputs[0])] =
        g.add_op(OpKind::swiglu, {map[static_cast<std::size_t>(gate)], map[static_cast<std::size_t>(up)]}, attrs, y.name, y.role,
                 mul.phase);
    return true;
  });
  return out;
}

CopyRecompute recompute_layout_copies(Graph& step) {
  CopyRecompute out;
  const int num_ops = step.num_ops();
  auto is_backward = [&](int i) { return step.ops()[static_cast<std::size_t>(i)].phase == Phase::backward; };
  // Per storage root: whether a backward op reads it.
  std::vector<bool> read_backward(static_cast<std::size_t>(step.num_tensors()), false);
  for (int i = 0; i < num_ops; ++i) {
    if (!is_backward(i)) continue;
    for (TensorId t : step.ops()[static_cast<std::size_t>(i)].inputs) read_backward[static_cast<std::size_t>(step.storage_root(t))] = true;
  }
  std::vector<bool> result(static_cast<std::size_t>(step.num_tensors()), false);
  for (TensorId t : step.retained) result[static_cast<std::size_t>(step.storage_root(t))] = true;
  for (TensorId t : {step.loss, step.output}) {
    if (t != kNoTensor) result[static_cast<std::size_t>(step.storage_root(t))] = true;
  }
  struct Copy {
    int permute;
    std::vector<TensorId> family;  // Y, then its views in creation order
  };
  std::vector<Copy> copies;
  for (int i = 0; i < num_ops; ++i) {
    const Op& op = step.ops()[static_cast<std::size_t>(i)];
    if (op.kind != OpKind::permute || op.phase != Phase::forward) continue;
    const TensorId x = op.inputs[0], y = op.outputs[0];
    if (step.tensor(y).is_view() || result[static_cast<std::size_t>(y)] || !read_backward[static_cast<std::size_t>(y)] ||
        !read_backward[static_cast<std::size_t>(step.storage_root(x))]) {
      continue;
    }
    Copy c{i, {y}};
    for (TensorId t = y + 1; t < step.num_tensors(); ++t) {
      if (step.tensor(t).is_view() && step.storage_root(t) == y) c.family.push_back(t);
    }
    copies.push_back(std::move(c));
  }
  for (const Copy& c : copies) {
    // The clones, appended: the permute, then each view of Y made the same way from its parent's clone.
    std::vector<std::pair<TensorId, TensorId>> clone_of;  // tensor -> its copy
    auto copy_of = [&](TensorId t) {
      for (const auto& [from, to] : clone_of) {
        if (from == t) return to;
      }
      return t;
    };
    const int first_new = step.num_ops();
    for (TensorId t : c.family) {
      const Op& maker = step.ops()[static_cast<std::size_t>(step.producer(t))];
      std::vector<TensorId> inputs;
      for (TensorId in : maker.inputs) inputs.push_back(copy_of(in));
      const OpAttrs attrs = maker.attrs;
      const OpKind kind = maker.kind;
      const TensorDesc desc = step.tensor(t);
      clone_of.emplace_back(t, step.add_op(kind, std::move(inputs), attrs, desc.name + ".again", desc.role, Phase::backward));
    }
    // Backward readers of the family read the copies.
    int first_reader = -1;
    for (int i = 0; i < first_new; ++i) {
      if (!is_backward(i)) continue;
      const Op& op = step.ops()[static_cast<std::size_t>(i)];
      for (std::size_t slot = 0; slot < op.inputs.size(); ++slot) {
        const TensorId again = copy_of(op.inputs[slot]);
        if (again == op.inputs[slot]) continue;
        step.replace_input(i, static_cast<int>(slot), again);
        if (first_reader < 0) first_reader = i;
      }
    }
    // The clones run just before the first backward reader.
    std::vector<int> order;
    order.reserve(static_cast<std::size_t>(step.num_ops()));
    for (int i = 0; i < first_new; ++i) {
      if (i == first_reader) {
        for (int k = first_new; k < step.num_ops(); ++k) order.push_back(k);
      }
      order.push_back(i);
    }
    step.reorder_ops(order);
    ++out.copies;
    out.bytes += step.tensor(c.family[0]).size_bytes();
  }
  return out;
}

LossFusion fuse_linear_cross_entropy(Graph& forward, std::int64_t chunk_rows) {
  LossFusion out;
  const Pattern p = find_pattern(forward);
  if (p.loss_op < 0) {
    out.why_not = p.why_not;
    return out;
  }
  const Op& matmul = forward.ops()[static_cast<std::size_t>(p.matmul_op)];
  const TensorId h = matmul.inputs[0], w = matmul.inputs[1];
  const TensorId logits = matmul.outputs[0];
  out.rows = forward.tensor(h).shape[0];
  out.vocab = forward.tensor(w).shape[0];
  out.logits = forward.tensor(logits).name;
  out.chunk_rows = chunk_rows > 0 ? chunk_rows : default_loss_chunk_rows(out.rows, out.vocab);

  // The graph again, op by op, the product and the loss replaced by the fused pair where the loss was.
  Graph g = rebuild(forward, [&](int i, std::vector<TensorId>& map, Graph& to) {
    if (i == p.matmul_op) return true;
    if (i != p.loss_op) return false;
    const Op& op = forward.ops()[static_cast<std::size_t>(i)];
    OpAttrs attrs;
    attrs.chunk_rows = out.chunk_rows;
    const TensorDesc& loss = forward.tensor(op.outputs[0]);
    const TensorId mh = map[static_cast<std::size_t>(h)], mw = map[static_cast<std::size_t>(w)];
    const TensorId lse = to.add_op(OpKind::linear_cross_entropy_lse, {mh, mw}, attrs, loss.name + ".lse", Role::activation, op.phase);
    map[static_cast<std::size_t>(op.outputs[0])] = to.add_op(
        OpKind::linear_cross_entropy, {mh, mw, map[static_cast<std::size_t>(op.inputs[1])], lse}, attrs, loss.name, loss.role, op.phase);
    return true;
  });
  forward = std::move(g);
  out.fused = true;
  return out;
}

}  // namespace memplan::graph
