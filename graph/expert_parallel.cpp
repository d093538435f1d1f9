#include "memplan/graph/expert_parallel.h"

namespace memplan::graph {

std::int64_t ExpertParallel::local_experts(std::int64_t experts) const {
  if (experts % degree != 0) {
    std::string divisors;
    for (std::int64_t d = 2; d <= experts; ++d) {
      if (experts % d == 0 && divisors.size() < 40) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    }
    throw GraphError("the " + std::to_string(experts) + " experts of each mixture layer cannot be split evenly over " +
                     std::to_string(degree) + " expert-parallel ranks: choose an --expert-parallel that divides them (" +
                     divisors + ")");
  }
  return experts / degree;
}

void check_expert_parallel(const ExpertParallel& ep) {
  if (ep.degree < 1 || ep.rank < 0 || ep.rank >= ep.degree) {
    throw GraphError("expert-parallel rank " + std::to_string(ep.rank) + " of " + std::to_string(ep.degree) +
                     " does not exist (the degree must be at least 1, the rank below it)");
  }
}

TensorId expert_weights(Builder& b, const ExpertParallel& ep, const TensorParallel& tp, const std::string& name,
                        const Shape& whole, int tp_axis, InitSpec init, DType dtype) {
  Shape share = whole;
  if (ep.active()) share.dims[0] = ep.local_experts(whole[0]);
  const TensorId p = parameter_slice(b, tp, name, share, tp_axis, init, dtype);
  if (ep.active()) {
    TensorDesc& desc = b.graph().mutable_tensor(p);
    desc.ep_parts = ep.degree;
    desc.ep_index = ep.rank;
  }
  return p;
}

namespace {

TensorId all_to_all(Builder& b, const ExpertParallel& ep, TensorId x, const std::string& name) {
  OpAttrs attrs;
  attrs.world = ep.degree;
  attrs.group = RankGroup::expert;
  return b.graph().add_op(OpKind::all_to_all, {x}, attrs, name, Role::activation, Phase::forward);
}

// [a, b, slots, C] -> [b, a, slots, C], merged as [b, a * slots, C] or [b * a, slots, C].
TensorId swap_leading(Builder& b, TensorId x, std::int64_t a, std::int64_t lead, std::int64_t slots, std::int64_t width,
                      const Shape& out, const std::string& name) {
  const TensorId split = b.reshape(x, {a, lead, slots, width}, name + ".split");
  return b.reshape(b.permute(split, {1, 0, 2, 3}, name + ".regrouped"), out, name);
}

}  // namespace

TensorId exchange_to_experts(Builder& b, const ExpertParallel& ep, TensorId xe, const std::string& name) {
  if (!ep.active()) return xe;
  const Shape& s = b.graph().tensor(xe).shape;
  if (s.rank() != 3) throw GraphError("expert parallelism exchanges [experts, slots, width] tensors, not '" + name + "' " + s.to_string());
  const std::int64_t local = ep.local_experts(s[0]), slots = s[1], width = s[2], P = ep.degree;
  // Received: chunk r (rank r's tokens) holds this rank's `local` experts' slots, [P, local, slots, C].
  const TensorId received = all_to_all(b, ep, xe, name + ".all_to_all");
  return swap_leading(b, received, P, local, slots, width, Shape{local, checked_mul(P, slots), width}, name);
}

TensorId exchange_from_experts(Builder& b, const ExpertParallel& ep, TensorId ye, const std::string& name) {
  if (!ep.active()) return ye;
  const Shape& s = b.graph().tensor(ye).shape;
  if (s.rank() != 3 || s[1] % ep.degree != 0) {
    throw GraphError("expert parallelism returns [local experts, ranks * slots, width] tensors, not '" + name + "' " + s.to_string());
  }
  const std::int64_t local = s[0], P = ep.degree, slots = s[1] / P, width = s[2];
  const TensorId by_rank = swap_leading(b, ye, local, P, slots, width, Shape{checked_mul(P, local), slots, width},
                                        name + ".by_rank");  // chunk r: rank r's tokens
  return all_to_all(b, ep, by_rank, name);
}

ExpertShare expert_share(const Graph& g) {
  ExpertShare share;
  for (TensorId p : g.parameters()) {
    const TensorDesc& stored = g.tensor(p);
    const TensorDesc& desc = stored.shard_of == kNoTensor ? stored : g.tensor(stored.shard_of);
    if (desc.ep_parts <= 1) continue;
    share.local_experts = desc.shape[0];
    share.experts = desc.shape[0] * desc.ep_parts;
    ++share.tensors;
    share.bytes += stored.size_bytes();
  }
  return share;
}

}  // namespace memplan::graph
