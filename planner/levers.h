// The levers a training job pulls to fit its devices, and the cheapest combination that fits
// (`memplan fit --suggest`): activation checkpointing, the ZeRO stage, the tensor-parallel degree,
// optimizer offload, and a micro-batch with gradient accumulation. Whether a combination fits is
// decided by planning its step (plan_step, as `fit` does); which fitting one is cheapest by an
// estimate of its step time from the planned graph: its FLOPs (recomputation included), the bytes
// its collectives move within a tensor-parallel group and between replicas, and the bytes it
// copies to and from host memory, each at a stated rate (CostModel). The estimate ranks
// combinations; it is not a prediction of a run's time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/plan_step.h"

namespace memplan::planner {

struct Levers {
  // none, or optimal with the device's memory as its budget (the least recomputation that fits).
  CheckpointStrategy checkpoint = CheckpointStrategy::kNone;
  int zero = 0;             // ZeRO stage over the data-parallel replicas (0 with one replica)
  int tensor_parallel = 1;  // ranks each layer is split over (graph/tensor_parallel.h)
  bool offload_optimizer = false;
  // Samples per replica in one forward/backward pass; 0: the whole per-replica batch (no
  // gradient accumulation).
  std::int64_t micro_batch = 0;
};

// "--tensor-parallel 8 --zero 1 --checkpoint optimal, micro-batch 2 x 4 accumulation steps"
std::string describe(const Levers& levers, std::int64_t accumulation_steps);
// How many levers are pulled (checkpointing, ZeRO, tensor parallelism, offload, micro-batching).
int levers_pulled(const Levers& levers);
// Among fitting combinations whose estimates are within this fraction of the least, the one that
// pulls the fewest levers is suggested: the estimate ranks, it is not precise to a few percent.
inline constexpr double kSimplerWithin = 0.05;

// The training step of one rank with `levers` pulled, at `batch` samples over all replicas (the
// micro-batch times the replicas when accumulating): the caller builds it from its model, whose
// source decides each tensor-parallel slice. An Error when the model cannot take the levers
// (heads that do not split).
using StepWithLevers = std::function<Result<StepDescription>(const Levers& levers, std::int64_t batch)>;

// Effective rates of one GPU of 8-GPU H100 SXM nodes, as an estimate uses them: bf16 GEMMs at
// about 40% of the 989 dense TFLOP/s, NVLink 4 at 300 of its 450 GB/s a direction (inside a node:
// the tensor-parallel group, and the replicas when every device is in one node), one 400 Gb/s NIC
// per GPU at 40 GB/s (the replicas across nodes), PCIe 5 x16 at 25 GB/s each way (host memory).
struct CostModel {
  double flops_per_s = 400e12;
  double nvlink_bytes_per_s = 300e9;
  double network_bytes_per_s = 40e9;
  double host_bytes_per_s = 25e9;
  int gpus_per_node = 8;
  // The rate of the replicas' collectives on `devices` devices: NVLink inside one node, else the
  // network (a ring over nodes runs at its slowest link).
  double data_parallel_bytes_per_s(int devices) const {
    return devices <= gpus_per_node ? nvlink_bytes_per_s : network_bytes_per_s;
  }
};

// What one execution of a rank's step does, from its graph.
struct StepCost {
  double flops = 0;              // every op's (graph::op_flops), recompute ops included
  double tensor_parallel_bytes = 0;  // sent by this rank in tensor-parallel collectives (ring algorithms)
  double data_parallel_bytes = 0;    // sent by this rank in data-parallel collectives
  double host_bytes = 0;         // copied between device and host memory (optimizer offload)

  double seconds(const CostModel& model, int devices) const;
  StepCost times(std::int64_t n) const;
};
StepCost step_cost(const graph::Graph& step);

struct LeverCandidate {
  Levers levers;
  std::int64_t accumulation_steps = 1;
  bool fits = false;
  // Device memory one rank needs (arena + runtime overheads). A combination that fits without
  // recomputation was planned only to answer "fits": its bytes may be a greedy packing's (an
  // upper bound); the suggestion's are its exact plan's.
  Bytes total_bytes = 0;
  Bytes host_bytes = 0;   // optimizer offload's host region of one rank
  double recompute_fraction = 0;
  StepCost cost;          // one optimizer step of one rank (every micro-step)
  double seconds = 0;     // cost.seconds(model, devices): the ranking
  std::string why_not;    // the model cannot take these levers (no plan made)
};

struct SuggestQuestion {
  StepWithLevers step;
  std::int64_t batch = 1;  // the global batch of one optimizer step
  int devices = 1;
  std::vector<int> tensor_parallel_degrees = {1};  // the degrees to try (each divides `devices`)
  Bytes device_memory = 0;
  std::optional<Bytes> host_memory;  // offload's host region must fit it when given
  PlanRequest request;               // device profile, solver budget (strategy and budget are set here)
  CostModel costs;
  std::function<void(const std::string&)> progress;  // one line per combination planned (may be empty)
};

struct SuggestAnswer {
  // The fitting combination of the least estimated time, or within kSimplerWithin of it with
  // fewer levers pulled.
  std::optional<LeverCandidate> best;
  std::vector<LeverCandidate> candidates;  // every combination considered, in the order decided
  std::int64_t steps_planned = 0;
};

// Plans, for each tensor-parallel degree and ZeRO stage (0-3 with several replicas), without and
// with optimizer offload, the whole batch without checkpointing: whether it fits, and its cost,
// a lower bound of that combination's with recomputation or accumulation. Then, in order of that
// bound, until it reaches the least fitting estimate found: a combination that does not fit gets
// the least recomputation that fits, else the largest micro-batch that fits with accumulation (its
// cost: a pass's times the accumulation steps, collectives included: an upper bound where
// gradients would be reduced once). Offload is not tried where the step fits without it, and
// stages 0 and 1 get no recomputation or micro-batch: stage 2 holds less for no more traffic.
Result<SuggestAnswer> suggest_levers(const SuggestQuestion& question);

// What each lever of `chosen` saves one rank of `devices` at global `batch`: the device memory of
// the same step with that lever released (checkpointing off, ZeRO stage 0, tensor-parallel degree
// 1, offload off, the whole batch in one pass) less the memory with it. Checkpointing is compared
// with every other lever as chosen; the others without checkpointing on either side (a budget
// would move the recomputation around a released lever and hide its saving).
struct LeverSaving {
  std::string lever;      // "checkpoint optimal", "ZeRO-3", "tensor-parallel 8", ...
  std::string released;   // "without it: --checkpoint none", ...
  Bytes total_without = 0;
  Bytes saved = 0;        // total_without - total with every lever (negative: the lever costs memory)
  std::string why_not;    // the step cannot be built without the lever (no figure)
};
Result<std::vector<LeverSaving>> lever_savings(const StepWithLevers& step, const Levers& chosen, std::int64_t batch,
                                               int devices, const PlanRequest& request, Bytes device_memory);

}  // namespace memplan::planner
