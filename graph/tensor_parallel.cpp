#include "memplan/graph/tensor_parallel.h"

#include <algorithm>
#include <cstring>

namespace memplan::graph {

std::int64_t TensorParallel::split(std::int64_t n, const std::string& what) const {
  if (n % degree != 0) {
    throw GraphError(what + " (" + std::to_string(n) + ") cannot be split evenly over " + std::to_string(degree) +
                     " tensor-parallel ranks: choose a --tensor-parallel that divides it");
  }
  return n / degree;
}

void check_tensor_parallel(const TensorParallel& tp) {
  if (tp.degree < 1 || tp.rank < 0 || tp.rank >= tp.degree) {
    throw GraphError("tensor-parallel rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.degree) +
                     " does not exist (the degree must be at least 1, the rank below it)");
  }
}

TensorId parameter_slice(Builder& b, const TensorParallel& tp, const std::string& name, const Shape& whole, int axis,
                         InitSpec init, DType dtype) {
  if (!tp.active()) return b.parameter(name, whole, init, dtype);
  Shape slice = whole;
  slice.dims[static_cast<std::size_t>(axis)] = tp.padded_slice(whole[axis]);
  const TensorId p = b.parameter(name, slice, init, dtype);
  TensorDesc& desc = b.graph().mutable_tensor(p);
  desc.tp_axis = axis;
  desc.tp_parts = tp.degree;
  desc.tp_index = tp.rank;
  desc.tp_whole = whole[axis];
  return p;
}

TensorId tp_copy(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name) {
  if (!tp.active()) return x;
  OpAttrs attrs;
  attrs.world = tp.degree;
  attrs.group = RankGroup::tensor;
  return b.graph().add_op(OpKind::tp_copy, {x}, attrs, name, Role::activation, Phase::forward);
}

TensorId tp_sum(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name) {
  if (!tp.active()) return x;
  OpAttrs attrs;
  attrs.world = tp.degree;
  attrs.group = RankGroup::tensor;
  return b.graph().add_op(OpKind::all_reduce, {x}, attrs, name, Role::activation, Phase::forward);
}

namespace {

OpAttrs tensor_group(const TensorParallel& tp) {
  OpAttrs attrs;
  attrs.world = tp.degree;
  attrs.group = RankGroup::tensor;
  return attrs;
}

std::int64_t sequence_rows(Builder& b, TensorId x, const std::string& name) {
  const Shape& shape = b.graph().tensor(x).shape;
  if (shape.rank() != 2) throw GraphError("sequence parallelism splits [rows, width] tensors, not '" + name + "' " + shape.to_string());
  return shape[0];
}

// This rank's share of `rows` token rows, or a GraphError naming them.
std::int64_t rows_per_rank(const TensorParallel& tp, std::int64_t rows) {
  return tp.split(rows, "sequence parallelism: the " + std::to_string(rows) + " token rows (batch x sequence)");
}

}  // namespace

TensorId column_input(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name) {
  if (!tp.active() || !tp.sequence_parallel) return tp_copy(b, tp, x, name);
  const std::int64_t shard_rows = sequence_rows(b, x, name), width = b.graph().tensor(x).shape[1];
  OpAttrs gather = tensor_group(tp);
  gather.shape = {checked_mul(shard_rows, tp.degree), width};
  const TensorId flat = b.reshape(x, {checked_mul(shard_rows, width)}, name + ".shard");
  return b.graph().add_op(OpKind::all_gather, {flat}, gather, name, Role::activation, Phase::forward);
}

TensorId row_output(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name) {
  if (!tp.active() || !tp.sequence_parallel) return tp_sum(b, tp, x, name);
  const std::int64_t rows = sequence_rows(b, x, name), width = b.graph().tensor(x).shape[1];
  const std::int64_t shard_rows = rows_per_rank(tp, rows);
  const TensorId flat = b.reshape(x, {checked_mul(rows, width)}, name + ".flat");
  const TensorId shard =
      b.graph().add_op(OpKind::reduce_scatter, {flat}, tensor_group(tp), name + ".scatter", Role::activation, Phase::forward);
  return b.reshape(shard, {shard_rows, width}, name);
}

TensorId sequence_shard(Builder& b, const TensorParallel& tp, TensorId x, const std::string& name) {
  if (!tp.active() || !tp.sequence_parallel) return x;
  const std::int64_t shard_rows = rows_per_rank(tp, sequence_rows(b, x, name));
  return b.slice(tp_copy(b, tp, x, name + ".whole"), 0, shard_rows * tp.rank, shard_rows, name);
}

TensorId sequence_parallel_parameter(Builder& b, const TensorParallel& tp, TensorId parameter) {
  if (!tp.active() || !tp.sequence_parallel) return parameter;
  return tp_copy(b, tp, parameter, b.graph().tensor(parameter).name + ".rows");
}

void regather_rows_for_backward(Graph& g) {
  const int n = g.num_ops();
  std::vector<std::vector<int>> before(static_cast<std::size_t>(n));  // per op: gathers placed just before it
  bool any = false;
  for (int i = 0; i < n; ++i) {
    const Op op = g.ops()[static_cast<std::size_t>(i)];  // a copy: add_op grows ops()
    // column_input's gathers: whole [rows, width] (the loss's statistics gather is [ranks, rows, 2]).
    if (op.kind != OpKind::all_gather || op.attrs.group != RankGroup::tensor || op.phase != Phase::forward) continue;
    const TensorId whole = op.outputs[0];
    if (g.tensor(whole).shape.rank() != 2) continue;
    std::vector<std::pair<int, int>> readers;  // backward (op, input slot)
    for (int j = i + 1; j < n; ++j) {
      const Op& r = g.ops()[static_cast<std::size_t>(j)];
      if (r.phase != Phase::backward) continue;
      for (int slot = 0; slot < static_cast<int>(r.inputs.size()); ++slot) {
        if (r.inputs[static_cast<std::size_t>(slot)] == whole) readers.emplace_back(j, slot);
      }
    }
    if (readers.empty()) continue;
    const TensorId again =
        g.add_op(OpKind::all_gather, {op.inputs[0]}, op.attrs, g.tensor(whole).name + ".for_backward", Role::activation, Phase::backward);
    before[static_cast<std::size_t>(readers.front().first)].push_back(g.num_ops() - 1);
    for (const auto& [j, slot] : readers) g.replace_input(j, slot, again);
    any = true;
  }
  if (!any) return;
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(g.num_ops()));
  for (int i = 0; i < n; ++i) {
    for (int added : before[static_cast<std::size_t>(i)]) order.push_back(added);
    order.push_back(i);
  }
  g.reorder_ops(order);
}

namespace {

// This rank's vocabulary columns: [start, start + slice), of which `length` are real ids.
OpAttrs vocab_attrs(const TensorParallel& tp, std::int64_t vocab) {
  OpAttrs attrs;
  attrs.world = tp.degree;
  attrs.group = RankGroup::tensor;
  const std::int64_t slice = tp.padded_slice(vocab);
  attrs.start = slice * tp.rank;
  attrs.length = std::clamp<std::int64_t>(vocab - attrs.start, 0, slice);
  return attrs;
}

}  // namespace

TensorId vocab_parallel_embedding(Builder& b, const TensorParallel& tp, TensorId ids, TensorId table,
                                  std::int64_t vocab, const std::string& name) {
  if (!tp.active()) return b.embedding(ids, table, name);
  const OpAttrs attrs = vocab_attrs(tp, vocab);
  // The gather keeps the embedding's name: the sum is in place, so the buffer is it.
  const TensorId partial = b.graph().add_op(OpKind::embedding, {ids, table}, attrs, name, Role::activation, Phase::forward);
  return tp_sum(b, tp, partial, name + ".sum");
}

TensorId vocab_parallel_cross_entropy(Builder& b, const TensorParallel& tp, TensorId logits, TensorId labels,
                                      std::int64_t vocab, const std::string& name) {
  if (!tp.active()) return b.cross_entropy(logits, labels, name);
  Graph& g = b.graph();
  const OpAttrs attrs = vocab_attrs(tp, vocab);
  const std::int64_t rows = g.tensor(logits).shape[0];
  const TensorId stats = g.add_op(OpKind::vocab_parallel_stats, {logits, labels}, attrs, name + ".stats",
                                  Role::activation, Phase::forward);
  const TensorId flat = b.reshape(stats, {checked_mul(rows, 2)}, name + ".stats.flat");
  OpAttrs gather;
  gather.world = tp.degree;
  gather.group = RankGroup::tensor;
  gather.shape = {tp.degree, rows, 2};
  const TensorId all = g.add_op(OpKind::all_gather, {flat}, gather, name + ".stats.all", Role::activation, Phase::forward);
  return g.add_op(OpKind::vocab_parallel_loss, {all, logits, labels}, attrs, name, Role::activation, Phase::forward);
}

Shape whole_shape(const TensorDesc& desc) {
  Shape shape = desc.shape;
  if (desc.tp_axis >= 0) shape.dims[static_cast<std::size_t>(desc.tp_axis)] = desc.tp_whole;
  if (desc.ep_parts > 1) shape.dims[0] *= desc.ep_parts;
  return shape;
}

Shape padded_whole_shape(const TensorDesc& desc) {
  Shape shape = desc.shape;
  if (desc.tp_axis >= 0) shape.dims[static_cast<std::size_t>(desc.tp_axis)] *= desc.tp_parts;
  if (desc.ep_parts > 1) shape.dims[0] *= desc.ep_parts;
  return shape;
}

namespace {

// The experts' split of `desc` (graph/expert_parallel.h) as a slice along dimension 0 of a tensor
// already whole along its tensor-parallel dimension (padded, or cropped when `cropped`).
TensorDesc expert_split(const TensorDesc& desc, bool cropped) {
  TensorDesc split = desc;
  split.shape = cropped ? whole_shape(desc) : padded_whole_shape(desc);
  split.shape.dims[0] = desc.shape[0];
  split.tp_axis = 0;
  split.tp_parts = desc.ep_parts;
  split.tp_index = desc.ep_index;
  split.tp_whole = desc.shape[0] * desc.ep_parts;
  split.ep_parts = 1;
  return split;
}

}  // namespace

std::vector<std::byte> local_part(const TensorDesc& desc, std::span<const std::byte> padded_whole) {
  std::vector<std::byte> values(padded_whole.begin(), padded_whole.end());
  if (desc.ep_parts > 1) values = slice_of(expert_split(desc, /*cropped=*/false), values);
  if (desc.tp_axis >= 0) {
    TensorDesc tp = desc;
    tp.ep_parts = 1;
    values = slice_of(tp, values);
  }
  return values;
}

std::vector<std::byte> gather_whole(const TensorDesc& desc, std::span<const std::byte> local,
                                    const std::function<std::vector<std::byte>(std::span<const std::byte>, int)>& gather) {
  std::vector<std::byte> values(local.begin(), local.end());
  if (desc.tp_axis >= 0) {
    TensorDesc tp = desc;
    tp.ep_parts = 1;
    values = assemble_slices(tp, gather(values, tp.tp_parts), /*crop=*/true);
  }
  if (desc.ep_parts > 1) {
    values = assemble_slices(expert_split(desc, /*cropped=*/true), gather(values, -desc.ep_parts), /*crop=*/true);
  }
  return values;
}

std::vector<std::byte> assemble_slices(const TensorDesc& desc, std::span<const std::byte> slices, bool crop) {
  const auto es = static_cast<std::size_t>(dtype_size(desc.dtype));
  const auto axis = static_cast<std::size_t>(desc.tp_axis);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= desc.shape[static_cast<int>(d)];
  for (std::size_t d = axis + 1; d < desc.shape.dims.size(); ++d) inner *= desc.shape[static_cast<int>(d)];
  const std::int64_t slice_len = desc.shape[desc.tp_axis];
  const std::int64_t kept = crop ? desc.tp_whole : slice_len * desc.tp_parts;
  const std::int64_t slice_numel = desc.shape.numel();
  std::vector<std::byte> whole(static_cast<std::size_t>(outer * kept * inner) * es);
  for (int r = 0; r < desc.tp_parts; ++r) {
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t k = 0; k < slice_len; ++k) {
        const std::int64_t row = r * slice_len + k;  // along the split dimension of the whole
        if (row >= kept) break;
        const std::size_t src = static_cast<std::size_t>(r * slice_numel + (o * slice_len + k) * inner) * es;
        const std::size_t dst = static_cast<std::size_t>((o * kept + row) * inner) * es;
        std::memcpy(whole.data() + dst, slices.data() + src, static_cast<std::size_t>(inner) * es);
      }
    }
  }
  return whole;
}

std::vector<std::byte> slice_of(const TensorDesc& desc, std::span<const std::byte> padded_whole) {
  const auto es = static_cast<std::size_t>(dtype_size(desc.dtype));
  const auto axis = static_cast<std::size_t>(desc.tp_axis);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= desc.shape[static_cast<int>(d)];
  for (std::size_t d = axis + 1; d < desc.shape.dims.size(); ++d) inner *= desc.shape[static_cast<int>(d)];
  const std::int64_t slice_len = desc.shape[desc.tp_axis], whole_len = slice_len * desc.tp_parts;
  std::vector<std::byte> slice(static_cast<std::size_t>(desc.shape.numel()) * es);
  for (std::int64_t o = 0; o < outer; ++o) {
    const std::size_t src = static_cast<std::size_t>((o * whole_len + desc.tp_index * slice_len) * inner) * es;
    const std::size_t dst = static_cast<std::size_t>(o * slice_len * inner) * es;
    std::memcpy(slice.data() + dst, padded_whole.data() + src, static_cast<std::size_t>(slice_len * inner) * es);
  }
  return slice;
}

}  // namespace memplan::graph
