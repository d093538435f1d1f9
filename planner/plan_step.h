// The one planning pipeline: a step description (a model source at a batch size with an
// optimizer, or a graph already built) and a request (the device's profile, debug guard bytes, a checkpoint
// strategy and budget, a deterministic solver budget) in; the planned step out: the graph as it
// will run (recompute ops included), its MemoryPlan, the checkpointing outcome, and whether it
// fits. `memplan plan`, `fit`, `train`, `compare`, the out-of-memory advice and the benches all
// call this; the executor receives what it returns and never plans.
#pragma once

#include <cstdint>
#include <optional>

#include "memplan/common/result.h"
#include "memplan/graph/data_parallel.h"
#include "memplan/graph/fusions.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/lora.h"
#include "memplan/graph/quantize.h"
#include "memplan/graph/model_source.h"
#include "memplan/graph/optimizer.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/device_profile.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::planner {

struct StepDescription {
  // The model, built at `batch` (planner/ sees it only through this interface). With
  // source->training the forward graph becomes a training step (backward + `optimizer`
  // updates); without, it is planned as it is (evaluation, generation).
  std::optional<graph::ModelSource> source;
  std::int64_t batch = 1;
  graph::OptimizerConfig optimizer;
  // Data parallel (graph/data_parallel.h): with world > 1 the step is one rank's, `batch` stays
  // the global batch (it must divide by the world) and the model is built at batch / world.
  graph::DataParallelConfig parallel;
  // The working dtype (graph/mixed_precision.h): f32, or bf16/f16 for mixed precision (16-bit
  // activations, gradients and parameters' working copies; f32 master weights and optimizer
  // state). Applies to a source's forward graph; a prebuilt graph keeps its own dtypes.
  graph::DType dtype = graph::DType::f32;
  // Optimizer offload (graph::offload_optimizer): optimizer state and master copies in host
  // memory, updated by the CPU from gradients copied there; the plan's host region holds them.
  bool offload_optimizer = false;
  // Whether a training step computes its output projection and cross-entropy fused, chunk by
  // chunk, never storing the logits (graph/fusions.h): auto fuses where that lowers the arena's
  // lower bound. `loss_chunk_rows` 0: graph::default_loss_chunk_rows.
  graph::FusedLoss fused_loss = graph::FusedLoss::auto_;
  std::int64_t loss_chunk_rows = 0;
  // A training step's SiLU-then-product pairs run as one swiglu op (graph::fuse_swiglu) and its
  // layout copies the backward reads are copied again there (graph::recompute_layout_copies):
  // the same bits, less stored. false: the step as an eager framework runs it.
  bool rewrite_step = true;
  // Fine-tuning (graph/lora.h): LoRA adapters on the linear layers it names, everything else
  // frozen, and parameters frozen by pattern; applied to a source's forward graph at `dtype`.
  graph::LoraConfig lora;
  // Quantized frozen weights (graph/quantize.h): the frozen linear layers' weights stored as the
  // format lays them out, dequantized a tile at a time inside their products.
  graph::QuantConfig quant;
  // A graph built elsewhere (a test's, a decoder's), planned as it is; replaces `source`.
  std::optional<graph::Graph> graph;

  static StepDescription of_source(graph::ModelSource source, std::int64_t batch, graph::OptimizerConfig optimizer = {});
  static StepDescription of_graph(graph::Graph graph);
};

struct PlanRequest {
  DeviceProfile device;  // workspace inside the arena; alignment and overheads for "fits"
  Bytes guard_bytes = 0;  // debug: a gap after every buffer (--debug guards)
  CheckpointStrategy checkpoint = CheckpointStrategy::kNone;
  std::optional<Bytes> budget;  // the arena budget in bytes; nullopt: none
  ScheduleKind schedule = ScheduleKind::memory_aware;
  bool choose_best_schedule = true;  // plan every op order, keep the lowest arena (--schedule auto)
  bool in_place = true;
  SolverBudget solver;  // deterministic unless it asks for wall-clock time
  // When the budget is not met, also search the least arena any checkpoint strategy reaches
  // (CheckpointOutcome::minimum): what an error message should name. It costs a plan per point
  // of the optimal strategy's frontier, seconds for billion-parameter models.
  bool find_minimum_arena = true;
  // Only "fits or not" is wanted (batch-size searches): a step that does not fit returns as soon
  // as that is known; its plan is then not one to run (PlannedStep::runnable is false). A step
  // that fits may answer with the greedy packing where the exact search could not change "fits"
  // (PlanOptions::decide_against): a valid plan, not always the least arena.
  bool answer_only = false;
  // With answer_only: a fitting step may also answer with any fitting plan of its strategy, not
  // the one with the least recomputation (optimal then searches its frontier from the
  // least-memory end; "fits" is the same answer either way).
  bool any_fitting = false;

  // The options plan_memory receives for this request.
  PlanOptions plan_options() const;
};

// What the fused loss did to a planned step (StepDescription::fused_loss), for reports: whether the
// step is fused, and the arena lower bounds of both forms where both were built (auto).
struct LossFusionReport {
  graph::FusedLoss mode = graph::FusedLoss::auto_;
  graph::LossFusion fusion;       // the rewrite's answer (fused, rows, chunk rows, why not)
  bool used = false;              // the planned step is the fused one
  Bytes fused_lower_bound = 0;    // 0 where not computed
  Bytes unfused_lower_bound = 0;  // 0 where not computed
};

// The rewrites a planned step went through (graph/fusions.h), for reports.
struct StepRewrites {
  LossFusionReport loss_fusion;
  graph::SwigluFusion swiglu;   // the pairs fuse_swiglu fused (none: nothing to fuse, or not asked)
  graph::CopyRecompute copies;  // the layout copies recompute_layout_copies made again
  graph::LoraReport lora;       // the adapters added and the parameters frozen (none unless asked)
  graph::QuantReport quant;     // the frozen linear weights stored quantized (none unless asked)
  graph::QuantFormat quant_format = graph::QuantFormat::none;
};

struct PlannedStep {
  graph::Graph graph;  // the step as it runs: recompute ops included
  StepRewrites rewrites;
  MemoryPlan plan;
  // Set when a checkpoint strategy or a budget was asked for.
  std::optional<CheckpointOutcome> checkpoint;
  std::optional<Bytes> budget;
  bool fits = true;          // plan.arena_bytes <= budget (true without one)
  bool runnable = true;      // false only for answer_only steps that do not fit
  std::int64_t steps_planned = 1;  // graphs planned to reach this answer (checkpoint candidates excluded)
  std::int64_t parameter_count() const;  // the model's (a sharded parameter counts whole)
};

// Builds the step (unless given), applies checkpointing for the request's strategy and budget,
// and plans it. An Error means the step cannot be built or planned (a bad model option, an
// invalid schedule); a budget that cannot be met is an answer (fits == false), not an error.
Result<PlannedStep> plan_step(const StepDescription& step, const PlanRequest& request);

}  // namespace memplan::planner
