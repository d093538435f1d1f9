#include "memplan/graph/data_parallel.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "memplan/dist/shard.h"
#include "memplan/graph/autograd.h"
#include "memplan/graph/training_step.h"

namespace memplan::graph {
namespace {

// Where the ops this rewrite adds go in program order: before or after an op of the step as
// autograd left it (the memory-aware schedule keeps that order for everything but updates).
struct Placement {
  std::vector<std::vector<int>> before, after;  // per original op: new op indices
  std::vector<int> at_end;
};

OpAttrs collective(const DataParallelConfig& config, float alpha = 1.0f, RankGroup group = RankGroup::data) {
  OpAttrs a;
  a.world = config.world;
  a.alpha = alpha;
  a.group = group;
  return a;
}

// Where a set of parameters' gradients are summed: the ranks (world, this rank's place among
// them, and the group the collectives name) and the factor that makes the sum the global batch's
// mean gradient.
struct ReductionGroup {
  DataParallelConfig config;
  RankGroup group = RankGroup::data;
  float alpha = 1.0f;
};

// A layer's parameters share their name up to the last '.' ("h.0.attn.qkv.weight" and ".bias").
std::string layer_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// Stage 3: each parameter's full tensor is gathered from its shard before the ops of `phase` that
// read it, `prefetch` layers ahead of the layer running; the parameter itself is no longer stored.
// Returns the shard of each parameter.
std::map<TensorId, TensorId> shard_parameters(Graph& g, const std::vector<TensorId>& params, const DataParallelConfig& config,
                                              RankGroup group, int original_ops, Placement& placement) {
  std::map<TensorId, TensorId> shard_of;
  for (TensorId p : params) {
    const TensorDesc& desc = g.tensor(p);
    const dist::ShardRange range = dist::shard_range(desc.shape.numel(), config.world, config.rank);
    TensorDesc shard;
    shard.name = desc.name + ".shard";
    shard.shape = Shape{dist::shard_size(desc.shape.numel(), config.world)};
    shard.dtype = desc.dtype;
    shard.role = Role::parameter;
    shard.init = desc.init;
    shard.shard_of = p;
    shard.shard_offset = range.offset;
    shard.shard_count = range.count;
    shard_of[p] = g.add_tensor(std::move(shard));
  }
  for (Phase phase : {Phase::forward, Phase::backward}) {
    // Layers in the order this phase first reads them.
    std::vector<std::string> layers;
    std::map<std::string, int> first_use;  // layer -> original op index
    std::map<std::string, std::vector<TensorId>> members;
    std::map<TensorId, std::vector<std::pair<int, int>>> uses;  // param -> (op, slot)
    for (int i = 0; i < original_ops; ++i) {
      const Op& op = g.ops()[static_cast<std::size_t>(i)];
      if (op.phase != phase) continue;
      for (int slot = 0; slot < static_cast<int>(op.inputs.size()); ++slot) {
        const TensorId t = op.inputs[static_cast<std::size_t>(slot)];
        if (!shard_of.contains(t)) continue;
        auto& u = uses[t];
        if (u.empty()) {
          const std::string layer = layer_of(g.tensor(t).name);
          if (!first_use.contains(layer)) {
            first_use[layer] = i;
            layers.push_back(layer);
          }
          members[layer].push_back(t);
        }
        u.emplace_back(i, slot);
      }
    }
    for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
      // Gathered when the layer `prefetch` places earlier starts.
      const int at = first_use[layers[static_cast<std::size_t>(std::max(0, l - config.prefetch))]];
      for (TensorId p : members[layers[static_cast<std::size_t>(l)]]) {
        OpAttrs a = collective(config, 1.0f, group);
        a.shape = g.tensor(p).shape.dims;
        const std::string suffix = phase == Phase::forward ? ".gathered" : ".gathered_for_backward";
        const TensorId full = g.add_op(OpKind::all_gather, {shard_of[p]}, a, g.tensor(p).name + suffix, Role::communication, phase);
        placement.before[static_cast<std::size_t>(at)].push_back(g.producer(full));
        for (const auto& [op, slot] : uses[p]) {
          g.replace_input(op, slot, full);
          // A view of the parameter (a reshape) now aliases the gathered copy.
          const Op& reader = g.ops()[static_cast<std::size_t>(op)];
          if (slot == 0 && op_info(reader.kind).output_is_view) g.mutable_tensor(reader.outputs[0]).view_of = full;
        }
      }
    }
  }
  for (TensorId p : params) g.mutable_tensor(p).role = Role::temporary;  // stored as its shards only
  return shard_of;
}

// Synchronised batch norm: the statistics of each batch_norm cover the global batch, as one
// process's would. Forward: the ranks' means are averaged (equal shares of the batch), each rank
// measures its deviation about that mean and those are averaged. Backward: batch_norm_backward's
// sums over the batch (dgamma, dbeta) are averaged over ranks; divided by the local count, the
// kernel then sees the global sums over the global count, scaled as each rank's loss gradient is.
// The parameter gradients themselves stay local and are reduced with the other gradients.
void synchronise_batch_norm(Graph& g, const DataParallelConfig& config, int original_ops, Placement& placement) {
  const float mean = 1.0f / static_cast<float>(config.world);
  std::map<TensorId, std::vector<std::pair<int, int>>> readers;  // statistics -> (op, slot)
  for (int i = 0; i < original_ops; ++i) {
    const Op& op = g.ops()[static_cast<std::size_t>(i)];
    for (int slot = 0; slot < static_cast<int>(op.inputs.size()); ++slot) {
      const TensorId t = op.inputs[static_cast<std::size_t>(slot)];
      const int p = g.producer(t);
      if (p >= 0 && g.ops()[static_cast<std::size_t>(p)].kind == OpKind::batch_norm_stats) readers[t].emplace_back(i, slot);
    }
  }
  for (const auto& [stats, uses] : readers) {
    const int at = g.producer(stats);
    const TensorId x = g.ops()[static_cast<std::size_t>(at)].inputs[0];
    const std::string& name = g.tensor(stats).name;
    const TensorId shared_mean =
        g.add_op(OpKind::all_reduce, {stats}, collective(config, mean), name + ".mean_over_ranks", Role::activation, Phase::forward);
    const TensorId local = g.add_op(OpKind::batch_norm_centered_stats, {x, shared_mean}, {}, name + ".about_shared_mean",
                                    Role::activation, Phase::forward);
    const TensorId global =
        g.add_op(OpKind::all_reduce, {local}, collective(config, mean), name + ".over_ranks", Role::activation, Phase::forward);
    for (TensorId t : {shared_mean, local, global}) placement.after[static_cast<std::size_t>(at)].push_back(g.producer(t));
    const TensorDesc& xd = g.tensor(x);
    const double count = double(xd.shape.numel() / xd.shape[1]) * config.world;  // elements per channel, all ranks
    for (const auto& [op, slot] : uses) {
      g.replace_input(op, slot, global);
      if (g.ops()[static_cast<std::size_t>(op)].kind == OpKind::running_stats_update) {
        g.set_alpha(op, count > 1 ? float(count / (count - 1)) : 1.0f);
      }
    }
  }
  for (int i = 0; i < original_ops; ++i) {
    const Op op = g.ops()[static_cast<std::size_t>(i)];
    if (op.kind != OpKind::batch_norm_backward) continue;
    const TensorId dgamma = op.inputs[4], dbeta = op.inputs[5];
    const std::int64_t channels = g.tensor(dgamma).shape.numel();
    const TensorId packed = g.add_op(OpKind::pack, {dgamma, dbeta}, {}, op.name + ".batch_sums", Role::communication,
                                     Phase::backward);
    const TensorId summed = g.add_op(OpKind::all_reduce, {packed}, collective(config, mean), op.name + ".batch_sums.over_ranks",
                                     Role::communication, Phase::backward);
    std::vector<int> added = {g.producer(packed), g.producer(summed)};
    for (int slot : {4, 5}) {
      OpAttrs cut;
      cut.axis = 0;
      cut.start = slot == 4 ? 0 : channels;
      cut.length = channels;
      const TensorId part = g.add_op(OpKind::slice, {summed}, cut, g.tensor(op.inputs[static_cast<std::size_t>(slot)]).name + ".over_ranks",
                                     Role::temporary, Phase::backward);
      added.push_back(g.producer(part));
      g.replace_input(i, slot, part);
    }
    auto& before = placement.before[static_cast<std::size_t>(i)];
    before.insert(before.end(), added.begin(), added.end());
  }
}

}  // namespace

void make_data_parallel_training_step(Graph& g, const OptimizerConfig& optimizer, const DataParallelConfig& config) {
  if (config.world < 1 || config.rank < 0 || config.rank >= config.world) {
    throw GraphError("rank " + std::to_string(config.rank) + " of " + std::to_string(config.world) + " ranks does not exist");
  }
  if (config.zero < 0 || config.zero > 3) {
    throw GraphError("ZeRO stage " + std::to_string(config.zero) + " does not exist (0, 1, 2 or 3)");
  }
  if (config.bucket_bytes <= 0) throw GraphError("the gradient bucket size must be positive");
  if (config.prefetch < 0) throw GraphError("the prefetch distance must be 0 or more layers");
  if (config.expert_parallel < 1 || config.world % config.expert_parallel != 0) {
    throw GraphError("--expert-parallel " + std::to_string(config.expert_parallel) + " splits the experts over groups of that "
                     "many data-parallel ranks, but there are " + std::to_string(config.world) + ": choose a degree that divides them");
  }
  if (!config.active()) {
    make_training_step(g, optimizer);
    return;
  }
  if (g.loss == kNoTensor) throw GraphError("the model graph has no loss to train on");
  append_backward(g, g.loss);
  const int original_ops = g.num_ops();
  Placement placement;
  placement.before.resize(static_cast<std::size_t>(original_ops));
  placement.after.resize(static_cast<std::size_t>(original_ops));
  const float mean = 1.0f / static_cast<float>(config.world);
  synchronise_batch_norm(g, config, original_ops, placement);

  // The loss every rank reports: the mean of the ranks' losses (each the mean over an equal
  // share of the global batch), computed after the backward seed read the local one.
  {
    OpAttrs pack_attrs;
    const TensorId copy = g.add_op(OpKind::pack, {g.loss}, pack_attrs, "loss.local", Role::activation, Phase::forward);
    const TensorId global = g.add_op(OpKind::all_reduce, {copy}, collective(config, mean), "loss.mean_over_ranks",
                                     Role::activation, Phase::forward);
    const int at = g.producer(g.loss);
    placement.after[static_cast<std::size_t>(at)].push_back(g.producer(copy));
    placement.after[static_cast<std::size_t>(at)].push_back(g.producer(global));
    g.loss = global;
  }

  // Expert parallelism: an expert's weights are held by the data ranks of the same place in
  // their expert groups (every `expert_parallel`-th rank); each rank's gradient already sums its
  // group's tokens, so the sum over those ranks, divided by the whole world, is the global mean.
  std::vector<TensorId> params, expert_params;
  for (TensorId p : g.parameters()) {
    const TensorDesc& desc = g.tensor(p);
    if (desc.grad == kNoTensor) continue;
    (desc.ep_parts > 1 ? expert_params : params).push_back(p);
  }
  std::vector<std::pair<ReductionGroup, std::vector<TensorId>>> groups;
  groups.push_back({ReductionGroup{config, RankGroup::data, mean}, params});
  if (!expert_params.empty()) {
    ReductionGroup experts{config, RankGroup::expert_data, mean};
    experts.config.world = config.world / config.expert_parallel;
    experts.config.rank = config.rank / config.expert_parallel;
    groups.push_back({experts, expert_params});
  }
  std::size_t bucket_count = 0;
  for (const auto& [reduction, members] : groups) {
    const DataParallelConfig& rc = reduction.config;
    std::map<TensorId, TensorId> shard_of;
    if (config.zero == 3) shard_of = shard_parameters(g, members, rc, reduction.group, original_ops, placement);

    // Buckets in the order gradients become final.
    std::vector<TensorId> by_final = members;
    std::stable_sort(by_final.begin(), by_final.end(), [&](TensorId a, TensorId b) {
      return g.producer(g.tensor(a).grad) < g.producer(g.tensor(b).grad);
    });
    std::vector<std::vector<TensorId>> buckets;
    Bytes filled = 0;
    for (TensorId p : by_final) {
      const Bytes bytes = g.tensor(g.tensor(p).grad).size_bytes();
      if (buckets.empty() || filled + bytes > config.bucket_bytes) {
        buckets.emplace_back();
        filled = 0;
      }
      buckets.back().push_back(p);
      filled += bytes;
    }

    for (const std::vector<TensorId>& bucket : buckets) {
      const std::string name = "bucket" + std::to_string(bucket_count++);
      std::vector<TensorId> grads;
      int last_producer = 0;
      for (TensorId p : bucket) {
        grads.push_back(g.tensor(p).grad);
        last_producer = std::max(last_producer, g.producer(g.tensor(p).grad));
      }
      std::vector<int> added;  // non-update ops, run right after the bucket's last gradient
      OpAttrs layout;
      layout.world = config.zero == 0 ? 1 : rc.world;  // stage 0 reduces whole tensors
      const TensorId packed = g.add_op(OpKind::pack, grads, layout, name, Role::communication, Phase::backward);
      added.push_back(g.producer(packed));
      TensorId reduced;
      std::int64_t base = 0;  // where this rank's chunk starts in `reduced`
      if (config.zero <= 1) {
        reduced = g.add_op(OpKind::all_reduce, {packed}, collective(rc, reduction.alpha, reduction.group),
                           name + ".all_reduce", Role::communication, Phase::backward);
        if (config.zero == 1) base = g.tensor(packed).shape.numel() / rc.world * rc.rank;
      } else {
        reduced = g.add_op(OpKind::reduce_scatter, {packed}, collective(rc, reduction.alpha, reduction.group),
                           name + ".reduce_scatter", Role::communication, Phase::backward);
      }
      added.push_back(g.producer(reduced));
      std::int64_t offset = base;
      for (TensorId p : bucket) {
        const TensorDesc desc = g.tensor(p);
        const std::int64_t numel = desc.shape.numel();
        OpAttrs cut;
        cut.axis = 0;
        cut.start = offset;
        cut.length = config.zero == 0 ? numel : dist::shard_size(numel, rc.world);
        offset += cut.length;
        TensorId grad = g.add_op(OpKind::slice, {reduced}, cut, "grad(" + desc.name + ").reduced", Role::gradient,
                                 Phase::backward);
        added.push_back(g.producer(grad));
        if (config.zero == 0) {
          if (desc.shape.rank() != 1) {
            OpAttrs view;
            view.shape = desc.shape.dims;
            grad = g.add_op(OpKind::reshape, {grad}, view, "grad(" + desc.name + ").reduced_view", Role::gradient,
                            Phase::backward);
            added.push_back(g.producer(grad));
          }
          append_update(g, p, grad, optimizer);
        } else if (config.zero == 3) {
          append_update(g, shard_of.at(p), grad, optimizer);
        } else {
          const dist::ShardRange range = dist::shard_range(numel, rc.world, rc.rank);
          OpAttrs sharded;
          sharded.shard_offset = range.offset;
          sharded.shard_count = range.count;
          append_update(g, p, grad, optimizer, Shape{cut.length}, sharded);
          OpAttrs gather = collective(rc, 1.0f, reduction.group);
          g.add_op(OpKind::all_gather_into, {}, gather, "gather(" + desc.name + ")", Role::temporary, Phase::optimizer, {p});
        }
      }
      auto& slot = placement.after[static_cast<std::size_t>(last_producer)];
      slot.insert(slot.end(), added.begin(), added.end());
    }
  }

  // Program order: the original ops with the added ones around them; updates (and anything not
  // placed) at the end in the order they were added, as append_optimizer leaves them.
  std::vector<bool> placed(static_cast<std::size_t>(g.num_ops()), false);
  for (int i = 0; i < original_ops; ++i) placed[static_cast<std::size_t>(i)] = true;
  for (const auto* lists : {&placement.before, &placement.after}) {
    for (const auto& list : *lists) {
      for (int i : list) placed[static_cast<std::size_t>(i)] = true;
    }
  }
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(g.num_ops()));
  for (int i = 0; i < original_ops; ++i) {
    for (int b : placement.before[static_cast<std::size_t>(i)]) order.push_back(b);
    order.push_back(i);
    for (int a : placement.after[static_cast<std::size_t>(i)]) order.push_back(a);
  }
  for (int i = original_ops; i < g.num_ops(); ++i) {
    if (!placed[static_cast<std::size_t>(i)]) order.push_back(i);
  }
  g.reorder_ops(order);
}

}  // namespace memplan::graph
