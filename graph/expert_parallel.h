// Expert parallelism (GShard, Lepikhin et al. 2020; DeepSpeed-MoE and Megatron-LM's layout): the
// data-parallel ranks split into groups of `degree`, and within a group each rank holds
// experts / degree of every mixture layer's experts (their stacked weights sliced along the
// expert dimension). A rank routes its own tokens as before and dispatches them into every
// expert's slots; an all-to-all sends each expert's slots to the rank that holds it, which runs
// its experts on every rank's tokens at once, and a second all-to-all brings the outputs back to
// the tokens' ranks for the weighted combine. Gradients of an expert's weights are summed over the
// ranks that hold the same experts (RankGroup::expert_data), those of every other parameter over
// all data ranks as before (graph/data_parallel.h). The exchanges are graph ops, their buffers
// planned like any other, the same shapes on every rank.
#pragma once

#include <cstdint>
#include <string>

#include "memplan/graph/builder.h"
#include "memplan/graph/tensor.h"
#include "memplan/graph/tensor_parallel.h"

namespace memplan::graph {

struct ExpertParallel {
  int degree = 1;  // data ranks splitting the experts (1: every rank holds every expert)
  int rank = 0;    // this rank's place in its group: it holds experts [rank * E / degree, + E / degree)

  bool active() const { return degree > 1; }
  // experts / degree, or a GraphError saying which degrees divide `experts`.
  std::int64_t local_experts(std::int64_t experts) const;
};

// A GraphError unless 1 <= degree and 0 <= rank < degree.
void check_expert_parallel(const ExpertParallel& ep);

// The stacked weights [E, out, in] of a mixture layer's experts: this rank's E / degree of the
// experts, and of those its tensor-parallel slice along `tp_axis` (graph/tensor_parallel.h:
// parameter_slice), initialised as that part of the whole tensor would be (so a run split over
// ranks starts from one process's weights); the whole tensor without either.
TensorId expert_weights(Builder& b, const ExpertParallel& ep, const TensorParallel& tp, const std::string& name,
                        const Shape& whole, int tp_axis, InitSpec init, DType dtype);

// xe [E, slots, C], this rank's tokens in every expert's slots, to [E / degree, degree * slots, C]:
// every rank's tokens in the slots of this rank's experts (rank r's in [r * slots, + slots)). xe
// itself without expert parallelism.
TensorId exchange_to_experts(Builder& b, const ExpertParallel& ep, TensorId xe, const std::string& name);
// The inverse: this rank's experts' outputs [E / degree, degree * slots, C] back to the ranks
// whose tokens they are, as [E, slots, C] for moe_combine.
TensorId exchange_from_experts(Builder& b, const ExpertParallel& ep, TensorId ye, const std::string& name);

// What a rank holds of the experts: the stacked expert weights' experts on this rank and in the
// whole layer, and the bytes this rank stores of them (their ZeRO shards, where sharded). Zeros in a
// graph without expert-parallel slices.
struct ExpertShare {
  std::int64_t local_experts = 0;
  std::int64_t experts = 0;
  int tensors = 0;  // sliced weight tensors (3 a gated mixture layer)
  Bytes bytes = 0;
};
ExpertShare expert_share(const Graph& g);

}  // namespace memplan::graph
