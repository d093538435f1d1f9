// The lines and JSON that describe a planned step, shared by plan, fit, compare and train: what
// checkpointing did, the step rewrites (fused loss, SwiGLU, layout copies) and the op order.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "memplan/planner/checkpoint.h"
#include "memplan/planner/plan_step.h"

namespace memplan::tools {

// "budget 1.00 MiB is below what checkpoint none can reach; the minimum feasible arena is ..."
std::string unmet_budget_message(const planner::PlannedStep& step, planner::CheckpointStrategy asked);
// "checkpoint optimal: arena 120.9 MiB -> 47.0 MiB, recompute +0.5% FLOPs"
std::string checkpoint_line(const planner::CheckpointOutcome& outcome);
nlohmann::json checkpoint_json(const planner::CheckpointOutcome& outcome);
// "fused loss: used (--fused-loss auto): the logits 'logits' [8192, 50257] are never stored, ..."; empty
// where the step has no cross-entropy to fuse (and nothing was asked of it).
std::string loss_fusion_line(const planner::LossFusionReport& report);
nlohmann::json loss_fusion_json(const planner::LossFusionReport& report);
// "swiglu: 16 silu-then-product pairs run as one op each: ..."; empty where none was fused.
std::string swiglu_line(const graph::SwigluFusion& swiglu);
nlohmann::json swiglu_json(const graph::SwigluFusion& swiglu);
std::string copies_line(const graph::CopyRecompute& copies);
nlohmann::json copies_json(const graph::CopyRecompute& copies);
// The op order a plan used and, where every order was planned (--schedule auto), each order's
// arena: "" where the plan has no arenas to compare (an order named by --schedule).
std::string order_line(const planner::MemoryPlan& plan);
nlohmann::json order_json(const planner::MemoryPlan& plan);
// "fine-tuning: LoRA adapters on 64 linear layers (q_proj, v_proj), 4194304 parameters (16.00 MiB); ..."; empty
// without --lora or --freeze.
std::string lora_line(const graph::LoraReport& lora, const graph::QuantReport& quant = {});
nlohmann::json lora_json(const graph::LoraReport& lora);
// "quantized: 224 frozen linear weights in nf4, 12.06 GiB -> 3.39 GiB (...)"; empty without --quant.
std::string quant_line(const graph::QuantReport& quant, graph::QuantFormat format);
nlohmann::json quant_json(const graph::QuantReport& quant);
// Every rewrite line of a planned step (fine-tuning, fused loss, swiglu, layout copies) and, given its plan, its
// op order, each ending in a newline.
std::string rewrite_lines(const planner::StepRewrites& step, const planner::MemoryPlan* plan = nullptr);
// "fused_loss", "swiglu", "copies_recomputed" and, given the plan, "op_order" into a command's JSON.
void add_rewrites_json(nlohmann::json& j, const planner::StepRewrites& step, const planner::MemoryPlan* plan = nullptr);

}  // namespace memplan::tools
