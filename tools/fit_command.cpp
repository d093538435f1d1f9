// memplan fit: does a model's training step fit a memory budget, and what is the largest batch
// that does, by planning alone (nothing is allocated; the plan is the one execution would use).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "graph/training_step.h"
#include "models/registry.h"
#include "planner/fit.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

struct FitFlags {
  std::string model = "mlp";
  std::int64_t batch = 128;
  std::string budget;
  std::string device = "cuda";
  std::string overhead;  // overrides the runtime overhead constants
  std::string optimizer = "adamw";
  std::vector<std::int64_t> hidden = {256, 256};
  bool max_batch = false;
  bool json = false;
  CheckpointFlags checkpoint;  // --checkpoint; the arena budget is --budget minus the overheads
  Bytes arena_budget = 0;
};

struct Planned {
  graph::Graph graph;
  planner::MemoryPlan plan;
  std::optional<planner::CheckpointOutcome> checkpoint;
};

Result<Planned> plan_batch(const FitFlags& flags, std::int64_t batch) {
  auto built = build_training_step(flags.model, batch, flags.hidden, flags.optimizer);
  if (!built) return built.error();
  Planned p{std::move(built).value(), {}};
  // A strategy that cannot meet the budget still plans its smallest arena: the answer is then "no".
  Result<std::optional<planner::CheckpointOutcome>> checkpointed = std::optional<planner::CheckpointOutcome>();
  if (flags.checkpoint.strategy != "none") {
    checkpointed = apply_checkpoint_flags(flags.checkpoint, p.graph, {}, flags.arena_budget);
    CheckpointFlags least = flags.checkpoint;
    if (least.strategy == "auto") least.strategy = "optimal";
    if (!checkpointed) checkpointed = apply_checkpoint_flags(least, p.graph);
  }
  if (checkpointed && checkpointed.value()) {
    p.checkpoint = checkpointed.value();
    p.graph = std::move(checkpointed.value()->graph);
  }
  auto plan = planner::plan_memory(p.graph);  // the same options the executor uses
  if (!plan) return plan.error();
  p.plan = std::move(plan).value();
  return p;
}

int run_fit(FitFlags flags) {
  auto budget = parse_byte_size(flags.budget);
  if (!budget) {
    std::cerr << "memplan fit: --budget: " << budget.error().message << "\n";
    return kExitUsage;
  }
  auto overheads = planner::runtime_overheads(flags.device);
  if (!overheads) {
    std::cerr << "memplan fit: " << overheads.error().message << "\n";
    return kExitUsage;
  }
  std::vector<planner::Overhead> overhead_list = overheads.value();
  if (!flags.overhead.empty()) {
    Result<Bytes> custom = flags.overhead == "0" ? Result<Bytes>(Bytes{0}) : parse_byte_size(flags.overhead);
    if (!custom) {
      std::cerr << "memplan fit: --overhead: " << custom.error().message << "\n";
      return kExitUsage;
    }
    overhead_list = {{"runtime overhead (--overhead)", custom.value()}};
  }
  Bytes overhead_bytes = 0;
  for (const auto& o : overhead_list) overhead_bytes += o.bytes;
  flags.arena_budget = std::max<Bytes>(1, budget.value() - overhead_bytes);

  auto planned = plan_batch(flags, flags.batch);
  if (!planned) {
    std::cerr << "memplan fit: " << planned.error().message << "\n";
    return kExitUsage;
  }
  const planner::FitReport report = planner::fit_report(planned.value().plan, budget.value(), overhead_list);

  auto total_for = [&](std::int64_t batch) -> Result<Bytes> {
    auto p = plan_batch(flags, batch);
    if (!p) return p.error();
    return p.value().plan.arena_bytes + overhead_bytes;
  };
  std::optional<planner::BatchSearch> search;
  if (flags.max_batch || !report.fits) {
    auto s = planner::search_max_batch(total_for, budget.value());
    if (!s) {
      std::cerr << "memplan fit: " << s.error().message << "\n";
      return kExitFailure;
    }
    search = s.value();
  }
  // Not fitting: the largest micro-batch that fits, accumulated to the requested batch.
  nlohmann::json suggestion = nullptr;
  std::string suggestion_text;
  if (!report.fits) {
    if (search && search->max_batch > 0) {
      // The fewest accumulation steps whose micro-batch fits, then the smallest micro-batch
      // that still covers the requested batch.
      const std::int64_t accumulation = (flags.batch + search->max_batch - 1) / search->max_batch;
      const std::int64_t micro = (flags.batch + accumulation - 1) / accumulation;
      suggestion = {{"micro_batch", micro}, {"gradient_accumulation_steps", accumulation},
                    {"effective_batch", micro * accumulation}, {"checkpoint", "none"}};
      suggestion_text = "micro-batch " + std::to_string(micro) + " x " + std::to_string(accumulation) +
                        " gradient-accumulation steps (effective batch " + std::to_string(micro * accumulation) +
                        "), or try --checkpoint auto";
    } else {
      suggestion_text = "not even batch 1 fits: the parameters and optimizer state alone need " +
                        format_bytes(report.breakdown.parameters + report.breakdown.optimizer_state) +
                        "; try --optimizer sgd (no optimizer state) or a smaller model";
      suggestion = {{"micro_batch", 0}, {"note", suggestion_text}};
    }
  }

  const planner::FitBreakdown& b = report.breakdown;
  if (flags.json) {
    nlohmann::json j{{"model", flags.model}, {"batch", flags.batch}, {"optimizer", flags.optimizer},
                     {"device", flags.device}, {"budget_bytes", budget.value()}, {"fits", report.fits},
                     {"total_bytes", b.total}, {"arena_bytes", b.arena}, {"headroom_bytes", report.headroom_bytes},
                     {"lower_bound_bytes", planned.value().plan.lower_bound_bytes}};
    j["breakdown"] = {{"parameters", b.parameters}, {"gradients", b.gradients_at_peak},
                      {"optimizer_state", b.optimizer_state}, {"activations", b.activations_at_peak},
                      {"workspace", b.workspace}, {"runtime_overhead", b.runtime_overhead}, {"arena", b.arena}};
    nlohmann::json o = nlohmann::json::array();
    for (const auto& item : report.overheads) o.push_back({{"what", item.what}, {"bytes", item.bytes}});
    j["runtime_overheads"] = o;
    if (search) {
      j["max_batch"] = search->max_batch;
      j["max_batch_by_checkpoint"] = {{"none", search->max_batch}};
      j["plans_made"] = search->probes;
    }
    if (planned.value().checkpoint) j["checkpoint"] = checkpoint_json(*planned.value().checkpoint);
    j["suggestion"] = suggestion;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("%s, batch %lld, %s, on %s with a budget of %s: %s\n\n", flags.model.c_str(),
              static_cast<long long>(flags.batch), flags.optimizer.c_str(), flags.device.c_str(),
              format_bytes(budget.value()).c_str(), report.fits ? "FITS" : "DOES NOT FIT");
  auto row = [](const char* label, Bytes bytes) {
    std::printf("  %-28s %14s  %16lld B\n", label, format_bytes(bytes).c_str(), static_cast<long long>(bytes));
  };
  row("parameters", b.parameters);
  row("gradients (at the peak)", b.gradients_at_peak);
  row("optimizer state", b.optimizer_state);
  row("activations (at the peak)", b.activations_at_peak);
  row("workspace", b.workspace);
  row("arena (exact)", b.arena);
  for (const auto& item : report.overheads) row(("+ " + item.what).c_str(), item.bytes);
  row("total", b.total);
  std::printf("  %-28s %14s\n", "headroom", report.headroom_bytes >= 0 ? format_bytes(report.headroom_bytes).c_str()
                                                                      : ("-" + format_bytes(-report.headroom_bytes)).c_str());
  if (search) {
    std::printf("\nlargest batch that fits: %lld (checkpoint none; %lld plans)\n", static_cast<long long>(search->max_batch),
                static_cast<long long>(search->probes));
  }
  if (planned.value().checkpoint) std::printf("%s\n", checkpoint_line(*planned.value().checkpoint).c_str());
  if (!report.fits) std::printf("suggestion: %s\n", suggestion_text.c_str());
  return kExitOk;
}

}  // namespace

Command add_fit_command(CLI::App& root) {
  auto flags = std::make_shared<FitFlags>();
  CLI::App* app = root.add_subcommand(
      "fit", "Does a training step fit a memory budget, and what is the largest batch that does? Planning only.");
  app->add_option("--model", flags->model, "Model")->check(CLI::IsMember(models::trainable_model_names()))->capture_default_str();
  app->add_option("--batch", flags->batch, "Samples per step")->check(positive_integer())->capture_default_str();
  app->add_option("--budget", flags->budget, "Device memory, e.g. 80GiB, 24GB, 16000MiB, or bytes")->required()->check(byte_size());
  app->add_option("--device", flags->device, "cuda (adds CUDA context and library overheads) or cpu")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app->add_option("--overhead", flags->overhead, "Runtime overhead outside the arena, replacing the built-in constants")
      ->check(byte_size(/*allow_zero=*/true));
  app->add_option("--optimizer", flags->optimizer, "sgd, momentum or adamw")
      ->check(CLI::IsMember({"sgd", "momentum", "adamw"}))
      ->capture_default_str();
  app->add_option("--hidden", flags->hidden, "MLP hidden widths")->delimiter(',')->check(positive_integer())->capture_default_str();
  app->add_flag("--max-batch", flags->max_batch, "Also search the largest batch that fits (exact: it fits, one more does not)");
  app->add_flag("--json", flags->json, "Print the answer as JSON");
  add_checkpoint_options(*app, flags->checkpoint, /*with_budget=*/false);
  return Command{app, [flags] { return run_fit(*flags); }};
}

}  // namespace memplan::tools
