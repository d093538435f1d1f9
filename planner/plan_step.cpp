#include "memplan/planner/plan_step.h"
#include "memplan/planner/step_size.h"

#include <utility>

#include "memplan/common/cancellation.h"
#include "memplan/graph/data_parallel.h"
#include "memplan/graph/tensor_parallel.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/graph/training_step.h"

namespace memplan::planner {

StepDescription StepDescription::of_source(graph::ModelSource source, std::int64_t batch,
                                           graph::OptimizerConfig optimizer) {
  StepDescription d;
  d.source = std::move(source);
  d.batch = batch;
  d.optimizer = optimizer;
  return d;
}

StepDescription StepDescription::of_graph(graph::Graph graph) {
  StepDescription d;
  d.graph = std::move(graph);
  return d;
}

PlanOptions PlanRequest::plan_options() const {
  PlanOptions o;
  o.schedule = schedule;
  o.choose_best_schedule = choose_best_schedule;
  // Skipping the program order when its lower bound cannot beat the memory-aware arena gives the
  // same plan, found faster.
  o.skip_dominated_schedule = true;
  o.in_place = in_place;
  o.fits_budget = budget;
  o.solver = solver;
  o.guard_bytes = guard_bytes;
  o.workspace_bytes = device.workspace_bytes;
  o.widen_16bit = device.widens_16bit;
  o.native_16bit_ops = device.native_16bit_ops;
  return o;
}

std::int64_t PlannedStep::parameter_count() const {
  std::int64_t n = 0;
  for (TensorId p : graph.parameters()) {
    const graph::TensorDesc& t = graph.tensor(p);
    // A ZeRO-3 shard counts its tensor, a tensor-parallel slice the whole tensor (the vocabulary
    // padded to a multiple of the ranks): the model's count, whatever one rank holds.
    n += graph::whole_shape(t.shard_of == kNoTensor ? t : graph.tensor(t.shard_of)).numel();
  }
  return n;
}

namespace {

// The forward graph of a source step at the step's dtype, its SwiGLU pairs fused where asked.
Result<graph::Graph> build_forward(const StepDescription& step, graph::SwigluFusion& swiglu, graph::LoraReport& lora,
                                   graph::QuantReport& quant) {
  const graph::ModelSource& source = *step.source;
  if (step.batch <= 0) return Error{"the batch size must be positive, got " + std::to_string(step.batch)};
  const graph::DataParallelConfig& dp = step.parallel;
  if (dp.active()) {
    if (auto problem = global_batch_problem(step)) return Error{describe(*problem)};
    if (!source.training) return Error{"data parallelism applies to training steps"};
  }
  const std::int64_t rank_batch = dp.active() ? step.batch / dp.world : step.batch;
  try {
    graph::Graph g = source.forward(rank_batch);
    if (step.dtype != graph::DType::f32) g = graph::with_working_dtype(g, step.dtype);
    if (step.lora.active()) lora = graph::apply_lora(g, step.lora);  // an evaluation graph keeps the adapters too
    if (step.quant.active()) quant = graph::quantize_frozen_linears(g, step.quant);
    if (source.training && step.rewrite_step) swiglu = graph::fuse_swiglu(g);
    return g;
  } catch (const graph::GraphError& e) {
    return Error{source.name.empty() ? std::string(e.what()) : "model '" + source.name + "': " + e.what()};
  }
}

// A forward graph made a training step (backward, updates, and what the step asks besides).
Status make_step(const StepDescription& step, graph::Graph& g, graph::CopyRecompute& copies) {
  if (step.offload_optimizer && !step.source->training) return Error{"optimizer offload applies to training steps"};
  if (!step.source->training) return Status::success();
  try {
    graph::make_data_parallel_training_step(g, step.optimizer, step.parallel);
    if (step.rewrite_step) copies = graph::recompute_layout_copies(g);
    // fp16 underflows where bf16 does not: its gradients are scaled (graph/mixed_precision.h).
    if (step.dtype == graph::DType::f16) graph::add_loss_scaling(g);
    if (step.offload_optimizer) graph::offload_optimizer(g);
  } catch (const graph::GraphError& e) {
    return Error{e.what()};
  }
  return Status::success();
}

// The step to plan, with the fused loss where the description asks for it (auto: where the
// fused step's arena lower bound is the lower).
Result<graph::Graph> build_step(const StepDescription& step, const PlanOptions& options, LossFusionReport& report,
                                graph::SwigluFusion& swiglu, graph::CopyRecompute& copies, graph::LoraReport& lora,
                                graph::QuantReport& quant) {
  report = LossFusionReport{};
  lora = graph::LoraReport{};
  quant = graph::QuantReport{};
  report.mode = step.fused_loss;
  swiglu = graph::SwigluFusion{};
  copies = graph::CopyRecompute{};
  if (step.graph) return *step.graph;
  if (!step.source) return Error{"the step has neither a model source nor a graph"};
  auto forward = build_forward(step, swiglu, lora, quant);
  if (!forward) return forward.error();
  graph::Graph unfused = std::move(forward).value();
  if (step.source->training && step.fused_loss != graph::FusedLoss::off) {
    graph::Graph fused = unfused;
    try {
      report.fusion = graph::fuse_linear_cross_entropy(fused, step.loss_chunk_rows);
    } catch (const graph::GraphError& e) {
      return Error{"fusing the loss: " + std::string(e.what())};
    }
    if (report.fusion.fused) {
      graph::CopyRecompute fused_copies;
      if (Status s = make_step(step, fused, fused_copies); !s) return s.error();
      if (step.fused_loss == graph::FusedLoss::on) {
        report.used = true;
        copies = fused_copies;
        return fused;
      }
      if (Status s = make_step(step, unfused, copies); !s) return s.error();
      auto with = arena_lower_bound(fused, options);
      if (!with) return with.error();
      auto without = arena_lower_bound(unfused, options);
      if (!without) return without.error();
      report.fused_lower_bound = with.value();
      report.unfused_lower_bound = without.value();
      report.used = with.value() < without.value();
      if (report.used) copies = fused_copies;
      return report.used ? std::move(fused) : std::move(unfused);
    }
  }
  if (Status s = make_step(step, unfused, copies); !s) return s.error();
  return unfused;
}

}  // namespace

Result<PlannedStep> plan_step(const StepDescription& step, const PlanRequest& request) {
  throw_if_cancelled();
  PlanOptions options = request.plan_options();
  LossFusionReport fusion;
  graph::SwigluFusion swiglu;
  graph::CopyRecompute copies;
  graph::LoraReport lora;
  graph::QuantReport quant;
  auto built = build_step(step, options, fusion, swiglu, copies, lora, quant);
  if (!built) return built.error();
  // A probe answers only "fits or not": the exact search runs where it can change that answer.
  if (request.answer_only && request.budget) options.decide_against = request.budget;
  PlannedStep out;
  out.rewrites = {std::move(fusion), swiglu, copies, std::move(lora), quant, step.quant.format};
  out.budget = request.budget;
  if (request.checkpoint == CheckpointStrategy::kNone && request.budget && request.answer_only) {
    // No recomputation to choose: when even the arena's lower bound exceeds the budget, the
    // answer is known without packing anything.
    auto bound = arena_lower_bound(built.value(), options);
    if (!bound) return bound.error();
    if (bound.value() > *request.budget) {
      out.graph = std::move(built).value();
      out.plan.arena_bytes = bound.value();
      out.plan.lower_bound_bytes = bound.value();
      out.plan.solve_status = SolveStatus::not_found;
      out.fits = false;
      out.runnable = false;
      return out;
    }
  }
  if (request.checkpoint == CheckpointStrategy::kNone && !request.budget) {
    out.graph = std::move(built).value();
    auto plan = plan_memory(out.graph, options);
    if (!plan) return plan.error();
    out.plan = std::move(plan).value();
    return out;
  }
  CheckpointRequest cr{request.checkpoint, request.budget, request.find_minimum_arena && !request.answer_only, request.answer_only,
                       request.answer_only && request.any_fitting};
  auto outcome = apply_checkpointing(built.value(), cr, options);
  if (!outcome) return outcome.error();
  out.fits = outcome.value().fits;
  if (!out.fits && request.answer_only) {
    out.graph = std::move(built).value();
    out.plan.arena_bytes = outcome.value().arena_bytes_with;
    out.runnable = false;
    out.checkpoint = std::move(outcome).value();
    return out;
  }
  out.plan = std::move(outcome.value().plan);
  out.graph = outcome.value().graph;
  out.checkpoint = std::move(outcome).value();
  return out;
}

}  // namespace memplan::planner
