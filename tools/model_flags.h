// The flags that name a model and the step trained on it, shared by plan, fit and compare: a
// models::ModelRef (resolved in models/, models/model_ref.h) plus the step's own choices.
#pragma once

#include <optional>

#include <CLI/CLI.hpp>

#include "memplan/common/result.h"
#include "memplan/graph/fusions.h"
#include "memplan/graph/lora.h"
#include "memplan/graph/optimizer.h"
#include "memplan/models/model_ref.h"
#include "memplan/planner/plan_step.h"

namespace memplan::tools {

// Fine-tuning (graph/lora.h): --lora RANK[:ALPHA], --lora-targets, --lora-dropout, --lora-dtype,
// --freeze; shared by plan, fit, compare and train.
struct LoraFlags {
  std::string lora;  // "RANK" or "RANK:ALPHA"; empty: no adapters
  std::vector<std::string> targets;
  double dropout = 0.0;
  std::string dtype = "fp32";  // fp32 (PEFT's) or working (the step's --dtype)
  std::vector<std::string> freeze;
  // --quant, --double-quant, --group-size: the frozen linear weights stored quantized
  // (graph/quantize.h); train refuses them (fit, plan and compare plan them).
  graph::QuantFormat quant = graph::QuantFormat::none;
  bool double_quant = false;
  std::int64_t group_size = 0;  // 0: not given (128 for gptq and awq)
};
// `with_quant`: also --quant, --double-quant and --group-size.
void add_lora_options(CLI::App& app, LoraFlags& flags, bool with_quant = true);
// The flags as a LoraConfig for a step at `working` dtype split over `tensor_parallel` ranks; an
// Error names the flag.
Result<graph::LoraConfig> lora_config(const LoraFlags& flags, graph::DType working, int tensor_parallel);
Result<graph::QuantConfig> quant_config(const LoraFlags& flags);

// The model reference (--model, --config, --onnx, sizes, --dtype, ...) and the step's choices
// beside it.
struct ModelFlags : models::ModelRef {
  LoraFlags lora;
  graph::OptimizerKind optimizer = graph::OptimizerKind::adamw;
  bool offload_optimizer = false;  // --offload-optimizer (graph::offload_optimizer)
  graph::FusedLoss fused_loss = graph::FusedLoss::auto_;  // --fused-loss (graph/fusions.h)
};
// Registers --model (every model in the registry, or the trainable ones), --batch, --optimizer,
// --hidden, --onnx, --loss, --output, and with `shapes` --seq, --target-seq, --image-size, --dtype,
// --config (which excludes --model) and the rest of the reference's sizes.
void add_model_options(CLI::App& app, ModelFlags& flags, bool trainable_only, bool shapes);
// --schedule program|memory_aware|searched|auto, shared by plan, fit, compare and train; unset is
// auto (every order planned, the lowest arena kept).
void add_schedule_option(CLI::App& app, std::optional<planner::ScheduleKind>& schedule);
void apply_schedule_flag(std::optional<planner::ScheduleKind> schedule, planner::PlanRequest& request);
// --fused-loss auto|on|off, shared by plan, fit, compare and train.
void add_fused_loss_option(CLI::App& app, graph::FusedLoss& mode);
// --moe-capacity-factor F: the slots per expert a mixture-of-experts config plans (F times the
// balanced share; 0: every token, nothing dropped).
void add_moe_capacity_option(CLI::App& app, std::optional<double>& factor);

// The step the flags describe (models::resolve_model, with the step's choices set); the
// resolution's notes go to stderr unless `notes` is false (a step built again for another
// lever). An Error names the flag that cannot work.
Result<planner::StepDescription> step_description(const ModelFlags& flags, bool notes = true);
// Notes for the user (models::ResolvedModel::notes), a line each on stderr so --json stays one document.
void print_notes(const std::vector<std::string>& notes);

}  // namespace memplan::tools
