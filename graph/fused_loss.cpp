#include "memplan/graph/fused_loss.h"

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
  if (loss_op < 0 || g.ops()[static_cast<std::size_t>(loss_op)].kind != OpKind::softmax_cross_entropy) return p;
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

}  // namespace

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
    if (i == p.matmul_op) continue;
    if (i == p.loss_op) {
      OpAttrs attrs;
      attrs.chunk_rows = out.chunk_rows;
      const TensorDesc& loss = forward.tensor(op.outputs[0]);
      const TensorId mh = map[static_cast<std::size_t>(h)], mw = map[static_cast<std::size_t>(w)];
      const TensorId lse = g.add_op(OpKind::linear_cross_entropy_lse, {mh, mw}, attrs, loss.name + ".lse", Role::activation, op.phase);
      map[static_cast<std::size_t>(op.outputs[0])] =
          g.add_op(OpKind::linear_cross_entropy, {mh, mw, map[static_cast<std::size_t>(op.inputs[1])], lse}, attrs, loss.name,
                   loss.role, op.phase);
      continue;
    }
    const TensorDesc* o = op.outputs.empty() ? nullptr : &forward.tensor(op.outputs[0]);
    const TensorId made = g.add_op(op.kind, mapped(op.inputs), op.attrs, o != nullptr ? o->name : op.name,
                                   o != nullptr ? o->role : Role::temporary, op.phase, mapped(op.updates));
    if (o == nullptr) continue;
    TensorDesc& desc = g.mutable_tensor(made);
    desc.init = o->init;
    desc.external = o->external;
    map[static_cast<std::size_t>(op.outputs[0])] = made;
  }
  auto remap = [&](TensorId t) { return t == kNoTensor || t == logits ? kNoTensor : map[static_cast<std::size_t>(t)]; };
  g.loss = remap(forward.loss);
  g.output = remap(forward.output);
  for (TensorId t : forward.retained) g.retained.push_back(remap(t));
  forward = std::move(g);
  out.fused = true;
  return out;
}

}  // namespace memplan::graph
