#include "tools/step_lines.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "memplan/common/byte_size.h"

namespace memplan::tools {

namespace {
std::string mib(Bytes bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}
std::string mib_exact(Bytes bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f MiB (%lld B)", static_cast<double>(bytes) / (1024.0 * 1024.0),
                static_cast<long long>(bytes));
  return text;
}
}  // namespace

std::string unmet_budget_message(const planner::PlannedStep& step, planner::CheckpointStrategy asked) {
  std::string message = "budget " + mib_exact(step.budget.value_or(0)) + " is below what checkpoint " +
                        std::string(planner::checkpoint_strategy_name(asked)) + " can reach";
  if (step.checkpoint && step.checkpoint->minimum) {
    const planner::MinimumArena& least = *step.checkpoint->minimum;
    char overhead[64];
    std::snprintf(overhead, sizeof overhead, "%.1f", 100.0 * least.extra_flops_fraction);
    message += "; the minimum feasible arena is " + mib_exact(least.arena_bytes) + ", reached with --checkpoint " +
               std::string(planner::checkpoint_strategy_name(least.strategy)) + " (recompute +" + overhead +
               "% FLOPs); use a budget of at least that, a smaller batch or a smaller model";
  }
  return message;
}

std::string checkpoint_line(const planner::CheckpointOutcome& outcome) {
  char overhead[32];
  std::snprintf(overhead, sizeof overhead, "%.1f", 100.0 * outcome.extra_flops_fraction);
  return "checkpoint " + std::string(planner::checkpoint_strategy_name(outcome.chosen)) + ": arena " +
         mib(outcome.arena_bytes_without) + " -> " + mib(outcome.arena_bytes_with) + ", recompute +" + overhead + "% FLOPs";
}

std::string loss_fusion_line(const planner::LossFusionReport& report) {
  const graph::LossFusion& f = report.fusion;
  const std::string mode = "(--fused-loss " + std::string(graph::fused_loss_name(report.mode)) + ")";
  // Not applicable: said where --fused-loss on asked for it (auto stays quiet; JSON has why_not).
  if (!f.fused) return f.why_not.empty() || report.mode != graph::FusedLoss::on ? "" : "fused loss: not applied " + mode + ": " + f.why_not;
  const std::string bounds = report.unfused_lower_bound > 0
                                 ? "; arena lower bound " + format_bytes(report.fused_lower_bound) + " fused, " +
                                       format_bytes(report.unfused_lower_bound) + " unfused"
                                 : "";
  const std::string logits = "'" + f.logits + "' [" + std::to_string(f.rows) + ", " + std::to_string(f.vocab) + "]";
  if (!report.used) {
    const bool same = report.fused_lower_bound == report.unfused_lower_bound;
    return "fused loss: not used " + mode + ": storing the logits " + logits + (same ? " plans the same (the step peaks where they are not live)" : " plans less") + bounds;
  }
  return "fused loss: used " + mode + ": the logits " + logits + " are never stored, " + std::to_string(std::min(f.chunk_rows, f.rows)) +
         " rows at a time (" + format_bytes(graph::loss_chunk_scratch_bytes(f.rows, f.vocab, f.chunk_rows)) + " of scratch)" + bounds;
}

nlohmann::json loss_fusion_json(const planner::LossFusionReport& report) {
  const graph::LossFusion& f = report.fusion;
  nlohmann::json j{{"mode", graph::fused_loss_name(report.mode)}, {"used", report.used}};
  if (f.fused) {
    j["logits"] = f.logits;
    j["rows"] = f.rows;
    j["vocab"] = f.vocab;
    j["chunk_rows"] = std::min(f.chunk_rows, f.rows);
    j["scratch_bytes"] = graph::loss_chunk_scratch_bytes(f.rows, f.vocab, f.chunk_rows);
  }
  if (report.unfused_lower_bound > 0) {
    j["fused_lower_bound_bytes"] = report.fused_lower_bound;
    j["unfused_lower_bound_bytes"] = report.unfused_lower_bound;
  }
  if (!f.fused && !f.why_not.empty()) j["why_not"] = f.why_not;
  return j;
}

std::string swiglu_line(const graph::SwigluFusion& swiglu) {
  if (swiglu.pairs == 0) return "";
  return "swiglu: " + std::to_string(swiglu.pairs) + " silu-then-product pairs run as one op each: " + format_bytes(swiglu.bytes) +
         " of SiLU outputs recomputed in the backward pass, not stored (the same bits)";
}

nlohmann::json swiglu_json(const graph::SwigluFusion& swiglu) {
  return {{"pairs", swiglu.pairs}, {"silu_bytes_not_stored", swiglu.bytes}};
}

std::string copies_line(const graph::CopyRecompute& copies) {
  if (copies.copies == 0) return "";
  return "layout copies: " + std::to_string(copies.copies) + " permuted tensors (" + format_bytes(copies.bytes) +
         ") copied again in the backward pass from inputs it keeps, not stored (the same bits)";
}

nlohmann::json copies_json(const graph::CopyRecompute& copies) {
  return {{"copies", copies.copies}, {"bytes_not_stored", copies.bytes}};
}

std::string order_line(const planner::MemoryPlan& plan) {
  if (plan.memory_aware_arena_bytes == 0 || plan.program_order_arena_bytes == 0) return "";
  auto arena = [](Bytes bytes, bool skipped) { return (skipped ? "at least " : "") + format_bytes(bytes); };
  std::string line = "op order: " + std::string(planner::schedule_name(plan.schedule_kind));
  if (plan.schedule_kind == planner::ScheduleKind::searched) {
    line += " (" + std::to_string(plan.order_moves) + " ops moved across the peak)";
  }
  line += ", the lowest arena of: memory-aware " + arena(plan.memory_aware_arena_bytes, false) + ", program " +
          arena(plan.program_order_arena_bytes, plan.program_order_skipped);
  if (plan.searched_order_arena_bytes > 0) {
    line += ", searched " + arena(plan.searched_order_arena_bytes, plan.searched_order_skipped);
  }
  return line;
}

nlohmann::json order_json(const planner::MemoryPlan& plan) {
  nlohmann::json j{{"used", planner::schedule_name(plan.schedule_kind)}};
  if (plan.schedule_kind == planner::ScheduleKind::searched) j["moves"] = plan.order_moves;
  // Where an order was not solved its bytes are its lower bound (0: not looked at).
  j["program_arena_bytes"] = plan.program_order_arena_bytes;
  j["memory_aware_arena_bytes"] = plan.memory_aware_arena_bytes;
  j["searched_arena_bytes"] = plan.searched_order_arena_bytes;
  j["program_skipped"] = plan.program_order_skipped;
  j["searched_skipped"] = plan.searched_order_skipped;
  return j;
}

std::string lora_line(const graph::LoraReport& lora, const graph::QuantReport& quant) {
  if (lora.adapted_layers == 0 && lora.frozen_params == 0) return {};
  std::string line = "fine-tuning: ";
  if (lora.adapted_layers > 0) {
    std::string names;
    std::vector<std::string> seen;
    for (const std::string& m : lora.modules) {
      const std::string last = m.substr(m.rfind('.') + 1);
      if (std::find(seen.begin(), seen.end(), last) != seen.end()) continue;
      seen.push_back(last);
      names += (names.empty() ? "" : ", ") + last;
    }
    line += "LoRA adapters on " + std::to_string(lora.adapted_layers) + " linear layers (" + names + "), " +
            std::to_string(lora.adapter_params) + " parameters (" + format_bytes(lora.adapter_bytes) + "); ";
  }
  const Bytes stored = lora.frozen_bytes - quant.full_bytes + quant.data_bytes + quant.constant_bytes;
  if (!lora.skipped_narrow.empty()) {
    line += "all-linear leaves out " + std::to_string(lora.skipped_narrow.size()) + " layer" +
            (lora.skipped_narrow.size() == 1 ? "" : "s") + " narrower than the rank (" + lora.skipped_narrow.front() +
            (lora.skipped_narrow.size() > 1 ? ", ..." : "") + "); ";
  }
  line += std::to_string(lora.trainable_params) + " parameters train, " + std::to_string(lora.frozen_params) +
          " are frozen (" + format_bytes(stored) + (quant.quantized_layers > 0 ? " as stored" : "") +
          ": no gradients, optimizer state or master copies)";
  return line;
}

nlohmann::json lora_json(const graph::LoraReport& lora) {
  if (lora.adapted_layers == 0 && lora.frozen_params == 0) return nullptr;
  return {{"adapted_layers", lora.adapted_layers}, {"adapter_parameters", lora.adapter_params},
          {"adapter_bytes", lora.adapter_bytes}, {"trainable_parameters", lora.trainable_params},
          {"frozen_parameters", lora.frozen_params}, {"frozen_bytes", lora.frozen_bytes}, {"modules", lora.modules}};
}

std::string quant_line(const graph::QuantReport& quant, graph::QuantFormat format) {
  if (quant.quantized_layers == 0) return {};
  return "quantized: " + std::to_string(quant.quantized_layers) + " frozen linear weights in " +
         std::string(enum_name(graph::kQuantFormatNames, format)) + ", " + format_bytes(quant.full_bytes) + " -> " +
         format_bytes(quant.data_bytes + quant.constant_bytes) + " (" + format_bytes(quant.data_bytes) + " of values, " +
         format_bytes(quant.constant_bytes) + " of scales and constants); each product dequantizes a tile of rows in scratch" +
         (quant.expert_weights_left > 0 ? "; the mixture of experts' " + std::to_string(quant.expert_weights_left) + " expert weight tensors (" +
                                              format_bytes(quant.expert_bytes_left) + ") stay at --dtype: memplan does not quantize them yet"
                                        : "");
}

nlohmann::json quant_json(const graph::QuantReport& quant) {
  if (quant.quantized_layers == 0) return nullptr;
  return {{"quantized_layers", quant.quantized_layers}, {"quantized_parameters", quant.quantized_params},
          {"full_precision_bytes", quant.full_bytes}, {"data_bytes", quant.data_bytes},
          {"constant_bytes", quant.constant_bytes}, {"bytes", quant.data_bytes + quant.constant_bytes},
          {"expert_weights_not_quantized", quant.expert_weights_left}, {"expert_bytes_not_quantized", quant.expert_bytes_left}};
}

std::string rewrite_lines(const planner::StepRewrites& step, const planner::MemoryPlan* plan) {
  std::string out;
  for (const std::string& line : {lora_line(step.lora, step.quant), quant_line(step.quant, step.quant_format), loss_fusion_line(step.loss_fusion), swiglu_line(step.swiglu), copies_line(step.copies),
                                  plan != nullptr ? order_line(*plan) : std::string()}) {
    if (!line.empty()) out += line + "\n";
  }
  return out;
}

void add_rewrites_json(nlohmann::json& j, const planner::StepRewrites& step, const planner::MemoryPlan* plan) {
  j["fine_tuning"] = lora_json(step.lora);
  j["quantized"] = quant_json(step.quant);
  j["fused_loss"] = loss_fusion_json(step.loss_fusion);
  j["swiglu"] = swiglu_json(step.swiglu);
  j["copies_recomputed"] = copies_json(step.copies);
  if (plan != nullptr) j["op_order"] = order_json(*plan);
}

nlohmann::json checkpoint_json(const planner::CheckpointOutcome& outcome) {
  int recompute_ops = 0;
  for (const graph::Op& op : outcome.graph.ops()) recompute_ops += op.phase == graph::Phase::recompute ? 1 : 0;
  nlohmann::json j{{"strategy", planner::checkpoint_strategy_name(outcome.chosen)},
                   {"arena_bytes_without", outcome.arena_bytes_without},
                   {"arena_bytes_with", outcome.arena_bytes_with},
                   {"fits", outcome.fits},
                   {"extra_flops_fraction", outcome.extra_flops_fraction},
                   {"recompute_ops", recompute_ops}};
  if (outcome.minimum) {
    j["minimum"] = {{"strategy", planner::checkpoint_strategy_name(outcome.minimum->strategy)},
                    {"arena_bytes", outcome.minimum->arena_bytes},
                    {"extra_flops_fraction", outcome.minimum->extra_flops_fraction}};
  }
  return j;
}


}  // namespace memplan::tools
