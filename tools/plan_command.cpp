// memplan plan: build a model's training step and show where every byte lives.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/common/atomic_file.h"
#include "memplan/planner/minimalloc_csv.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

struct PlanFlags {
  std::string model = "mlp";
  std::int64_t batch = 128;
  std::string optimizer = "adamw";
  std::vector<std::int64_t> hidden = {256, 256};
  std::string schedule = "auto";
  bool no_in_place = false;
  double time_limit_s = 2.0;
  bool json = false;
  std::string out;
  CheckpointFlags checkpoint;
};

int run_plan(const PlanFlags& flags) {
  auto built = build_training_step(flags.model, flags.batch, flags.hidden, flags.optimizer);
  if (!built) {
    std::cerr << "memplan plan: " << built.error().message << "\n";
    return kExitUsage;
  }
  planner::PlanOptions options;
  options.in_place = !flags.no_in_place;
  options.solver_time_limit_s = flags.time_limit_s;
  if (flags.schedule != "auto") {
    options.choose_best_schedule = false;
    options.schedule = planner::parse_schedule_kind(flags.schedule).value();
  }
  auto checkpointed = apply_checkpoint_flags(flags.checkpoint, built.value(), options);
  if (!checkpointed) {
    std::cerr << "memplan plan: " << checkpointed.error().message << "\n";
    return kExitUsage;
  }
  const std::optional<planner::CheckpointOutcome>& checkpoint = checkpointed.value();
  const graph::Graph& step = checkpoint ? checkpoint->graph : built.value();
  auto plan = planner::plan_memory(step, options);
  if (!plan) {
    std::cerr << "memplan plan: " << plan.error().message << "\n";
    return kExitFailure;
  }
  nlohmann::json j = plan_json(step, plan.value(), true);
  j["model"] = flags.model;
  j["batch"] = flags.batch;
  j["optimizer"] = flags.optimizer;
  if (checkpoint) j["checkpoint"] = checkpoint_json(*checkpoint);
  if (!flags.out.empty()) {
    if (Status s = write_file_atomically(flags.out, j.dump(2) + "\n"); !s) {
      std::cerr << "memplan plan: " << s.error().message << "\n";
      return kExitFailure;
    }
  }
  if (flags.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s, batch %lld, %s: %d ops, %zu buffers\n\n", flags.model.c_str(),
                static_cast<long long>(flags.batch), flags.optimizer.c_str(), step.num_ops(),
                plan.value().buffers.size());
    std::fputs(buffer_table(plan.value()).c_str(), stdout);
    std::printf("\n%s", memory_summary(step, plan.value()).c_str());
    if (checkpoint) std::printf("%s\n", checkpoint_line(*checkpoint).c_str());
    if (!flags.out.empty()) std::printf("\nwrote %s\n", flags.out.c_str());
  }
  return kExitOk;
}

}  // namespace

Command add_plan_command(CLI::App& root) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* app = root.add_subcommand(
      "plan", "Plan a model's training step: every tensor's offset, size and lifetime in one arena, and the totals.");
  app->add_option("--model", flags->model, "Model to plan")
      ->check(CLI::IsMember(models::trainable_model_names()))
      ->capture_default_str();
  app->add_option("--batch", flags->batch, "Samples per step")->check(positive_integer())->capture_default_str();
  app->add_option("--optimizer", flags->optimizer, "sgd, momentum or adamw (decides the optimizer state)")
      ->check(CLI::IsMember({"sgd", "momentum", "adamw"}))
      ->capture_default_str();
  app->add_option("--hidden", flags->hidden, "MLP hidden widths")->delimiter(',')->check(positive_integer())->capture_default_str();
  app->add_option("--schedule", flags->schedule,
                  "Op order: program, memory_aware (updates run as soon as their gradient is final), or auto (the lower arena)")
      ->check(CLI::IsMember({"auto", "program", "memory_aware"}))
      ->capture_default_str();
  app->add_flag("--no-in-place", flags->no_in_place, "Do not let elementwise ops write over an input that dies there");
  app->add_option("--time-limit", flags->time_limit_s, "Seconds for the exact offset search after the greedy portfolio")
      ->check(finite_in_range(0.0, 3600.0))
      ->capture_default_str();
  app->add_flag("--json", flags->json, "Print the plan as JSON (totals and every buffer)");
  app->add_option("--out", flags->out, "Also write the JSON plan to this file (atomically)");
  add_checkpoint_options(*app, flags->checkpoint);
  return Command{app, [flags] { return run_plan(*flags); }};
}

}  // namespace memplan::tools
