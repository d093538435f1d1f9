// "Does it fit?" as a value. A FitQuestion (a step, a plan request with the device's profile, the
// device's memory) gets a FitAnswer: whether it fits (one predicate: DeviceProfile::fits), the
// breakdown of the bytes, the least arena any checkpoint strategy reaches when it does not, the
// largest batch per strategy, and a suggestion — found by planning alone, every plan through
// plan_step. tools/ renders the answer; nothing here prints.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/planner/device_profile.h"
#include "memplan/planner/plan_step.h"

namespace memplan::planner {

struct FitBreakdown {
  Bytes parameters = 0;
  Bytes gradients_at_peak = 0;
  Bytes master_weights = 0;       // mixed precision: the f32 master copies of 16-bit parameters
  Bytes optimizer_state = 0;      // momentum, Adam's moments (the master copies apart)
  Bytes activations_at_peak = 0;  // activations, inputs and temporaries live at the peak
  Bytes communication_at_peak = 0;  // data parallel: buckets and gathered parameters live at the peak
  Bytes workspace = 0;            // kernel workspace inside the arena
  Bytes arena = 0;
  Bytes runtime_overhead = 0;     // outside the arena
  Bytes total = 0;
  // Host memory, not the device's: the copy of the persistent state (parameters, master weights,
  // optimizer state, buffers) that train --save-dir takes between steps and writes while
  // training goes on. Not in `total`.
  Bytes host_snapshot = 0;
  // Optimizer offload: the plan's host region (optimizer state, master copies and the gradients
  // copied out for the CPU's update), in host memory for the whole run. Not in `total`.
  Bytes host_offload = 0;
};

FitBreakdown fit_breakdown(const MemoryPlan& plan, const DeviceProfile& device);
// The bytes of the plan's f32 master copies (mixed precision; part of the optimizer state's role).
Bytes master_copy_bytes(const MemoryPlan& plan);

// Activations (and inputs, temporaries) live at the transient peak, grouped by name with layer
// numbers folded ("h.*.attn.fused.lse" sums that tensor over every layer), largest first: what
// the activation bytes are made of.
struct NamedBytes {
  std::string name;
  Bytes bytes = 0;
  int count = 0;  // buffers summed
};
std::vector<NamedBytes> activations_at_peak_by_name(const MemoryPlan& plan);

struct FitQuestion {
  StepDescription step;  // a model at the batch asked about
  PlanRequest request;   // device profile, checkpoint strategy, solver budget (its budget is set here)
  Bytes device_memory = 0;
  // Search the largest batch for each of these strategies (empty: no search). A batch that does
  // not fit is searched for the request's strategy anyway, for the suggestion.
  std::vector<CheckpointStrategy> max_batch_strategies;
  std::int64_t max_batch_limit = std::int64_t{1} << 20;
  // When the batch does not fit, also find the least arena any strategy reaches (FitAnswer::
  // minimum): a plan per point of the optimal strategy's frontier (GPT-2 XL: about 17 s).
  bool find_minimum_arena = false;
  // Host memory the run may use (--host-memory): with optimizer offload, the host region must fit
  // it too, whatever the batch. Unset: not checked.
  std::optional<Bytes> host_memory;
};

struct StrategyMaxBatch {
  CheckpointStrategy strategy = CheckpointStrategy::kNone;
  std::int64_t max_batch = 0;      // 0: not even batch 1 fits
  std::int64_t steps_planned = 0;  // probes of the search
};

// The plan at the largest batch that fits under the strategy asked (the question's
// request.checkpoint), as `FitAnswer::planned` is the plan at the batch asked: what a run at that
// batch allocates.
struct MaxBatchPlan {
  std::int64_t batch = 0;
  CheckpointStrategy strategy = CheckpointStrategy::kNone;
  Bytes arena_bytes = 0;
  Bytes total_bytes = 0;     // the arena plus the runtime's overheads
  Bytes headroom_bytes = 0;  // device_memory - total_bytes
};

struct FitSuggestion {
  std::int64_t micro_batch = 0;  // 0: nothing fits; `note` says why
  std::int64_t accumulation_steps = 0;
  CheckpointStrategy checkpoint = CheckpointStrategy::kNone;
  // The first strategy (least recomputation first) under which the whole batch fits, if any.
  std::optional<CheckpointStrategy> whole_batch_checkpoint;
  bool persistent_state_too_big = false;  // parameters + optimizer state + overheads exceed the memory
  Bytes activation_room_bytes = 0;        // memory left after those (when they fit)
};

struct FitAnswer {
  bool fits = false;
  bool host_fits = true;  // the host region fits FitQuestion::host_memory (true when unset)
  Bytes device_memory = 0;
  Bytes headroom_bytes = 0;  // device_memory - total (negative when it does not fit)
  FitBreakdown breakdown;
  std::vector<Overhead> overheads;
  PlannedStep planned;                  // the batch asked about
  std::optional<MinimumArena> minimum;  // when it does not fit: the least arena any strategy reaches
  std::vector<StrategyMaxBatch> max_batch;
  // With max_batch_strategies including the strategy asked and a batch that fits under it.
  std::optional<MaxBatchPlan> max_batch_plan;
  std::optional<FitSuggestion> suggestion;  // when it does not fit
  std::int64_t steps_planned = 0;          // every step planned for this answer
};

Result<FitAnswer> answer_fit(const FitQuestion& question);

// Whether a batch size fits, or an Error (e.g. the model cannot be built at it).
using FitsAtBatch = std::function<Result<bool>(std::int64_t batch)>;

// A probe that also says by how much: slack_bytes = budget - the bytes the batch needs (negative
// when it does not fit), when the probe knows it. (A checkpoint strategy that spends the budget on
// less recomputation knows only, when it does not fit, how far its smallest arena is over.)
struct BatchProbe {
  bool fits = false;
  std::optional<double> slack_bytes;
};
using ProbeAtBatch = std::function<Result<BatchProbe>(std::int64_t batch)>;

struct BatchSearch {
  std::int64_t max_batch = 0;  // 0: not even batch 1 fits
  std::int64_t probes = 0;     // plans made
};

// The largest batch in [1, limit] that fits. Memory grows with the batch, so doubling then
// bisection finds it; the answer is checked: max_batch fits and max_batch + 1 does not (unless
// max_batch == limit).
Result<BatchSearch> search_max_batch(const FitsAtBatch& fits, std::int64_t limit = std::int64_t{1} << 20);

// The same answer, found in fewer plans when memory is close to affine in the batch (a training
// step's is: persistent state plus activations per sample): each probe aims where the line
// through the two nearest probes that measured their slack crosses zero, and once the answer is
// bracketed,
// a probe that does not halve the bracket is followed by a bisection, so the plans made never
// exceed about twice the bisection's. Still exact: max_batch fits and max_batch + 1 does not.
// `start` (> 1): a batch likely to fit, probed second (e.g. another strategy's answer: more
// recomputation rarely fits fewer samples); any value gives the same answer.
Result<BatchSearch> search_max_batch(const ProbeAtBatch& probe, std::int64_t limit = std::int64_t{1} << 20,
                                     std::int64_t start = 0);

}  // namespace memplan::planner
