// memplan plan: build a model's training step and show where every byte lives.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "memplan/kernels/kernel.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/schedule.h"
#include "memplan/common/atomic_file.h"
#include "memplan/planner/minimalloc_csv.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/layout_svg.h"
#include "tools/memory_report.h"
#include "tools/profile_report.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/timed_step.h"

namespace memplan::tools {
namespace {

struct PlanFlags {
  ModelFlags model;
  kernels::DeviceKind device = kernels::DeviceKind::cpu;
  std::optional<planner::ScheduleKind> schedule;  // empty: auto (the lowest arena of every order)
  bool no_in_place = false;
  std::int64_t exact_nodes = planner::SolverBudget{}.exact_nodes;
  double time_limit_s = 0.0;
  bool json = false;
  std::string out;
  std::string svg;
  bool profile = false;
  CheckpointFlags checkpoint;
};

int run_plan(const PlanFlags& flags) {
  auto step = step_description(flags.model);
  if (!step) {
    std::cerr << "memplan plan: " << step.error().message << "\n";
    return kExitUsage;
  }
  planner::PlanRequest request;
  request.device = planner::documented_device_profile(kernels::device_kind_name(flags.device)).value();
  // --profile runs the step: it is planned for the device it runs on.
  std::unique_ptr<runtime::Device> device;
  if (flags.profile) {
    auto made = runtime::make_device(flags.device);
    if (!made) {
      std::cerr << "memplan plan: --profile runs the step on --device " << kernels::device_kind_name(flags.device)
                << ": " << made.error().message << "\n";
      return kExitUsage;
    }
    device = std::move(made).value();
    request.device = runtime::device_profile(*device);
  }
  request.in_place = !flags.no_in_place;
  request.solver = {flags.exact_nodes, flags.time_limit_s};
  apply_schedule_flag(flags.schedule, request);
  if (Status s = apply_checkpoint_flags(flags.checkpoint, request); !s) {
    std::cerr << "memplan plan: " << s.error().message << "\n";
    return kExitUsage;
  }
  auto planned = planner::plan_step(step.value(), request);
  if (!planned) {
    std::cerr << "memplan plan: " << planned.error().message << "\n";
    return kExitUsage;
  }
  if (!planned.value().fits) {
    std::cerr << "memplan plan: " << unmet_budget_message(planned.value(), request.checkpoint) << "\n";
    return kExitUsage;
  }
  const graph::Graph& graph = planned.value().graph;
  const planner::MemoryPlan& plan = planned.value().plan;
  const std::optional<planner::CheckpointOutcome>& checkpoint = planned.value().checkpoint;
  nlohmann::json j = plan_json(graph, plan, true);
  j["model"] = flags.model.label();
  j["batch"] = step.value().batch;
  if (flags.model.tensor_parallel > 1) j["tensor_parallel"] = flags.model.tensor_parallel;  // the plan is one rank's
  if (flags.model.sequence_parallel) j["sequence_parallel"] = true;
  j["optimizer"] = graph::optimizer_name(flags.model.optimizer);
  j["device"] = kernels::device_kind_name(flags.device);
  if (checkpoint) j["checkpoint"] = checkpoint_json(*checkpoint);
  add_rewrites_json(j, planned.value().rewrites, &planned.value().plan);
  std::optional<runtime::StepProfile> profile;
  if (flags.profile) {
    auto timed = runtime::time_steps(planned.value(), *device);
    if (!timed) {
      std::cerr << "memplan plan: --profile: " << timed.error().message << "\n";
      return kExitFailure;
    }
    profile = timed.value();
    j["profile"] = profile_json(*profile);
    j["threads"] = kernels::cpu_threads();
    j["cpu_pool"] = cpu_pool_json();
  }
  if (!flags.out.empty()) {
    if (Status s = write_file_atomically(flags.out, j.dump(2) + "\n"); !s) {
      std::cerr << "memplan plan: " << s.error().message << "\n";
      return kExitFailure;
    }
  }
  if (!flags.svg.empty()) {
    const std::string title = flags.model.label() + ", batch " + std::to_string(step.value().batch) + ": the planned arena";
    if (!write_report_file("plan", flags.svg, render_layout_svg(title, {planned_layout_panel(plan)}))) return kExitFailure;
  }
  if (flags.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    const std::string slice = flags.model.tensor_parallel > 1 ? ", one rank's slice of --tensor-parallel " +
                                                                     std::to_string(flags.model.tensor_parallel) +
                                                                     (flags.model.sequence_parallel ? " --sequence-parallel" : "")
                                                               : "";
    print_out("%s, batch %lld, %s%s: %d ops, %zu buffers\n\n", flags.model.label().c_str(),
                static_cast<long long>(step.value().batch), std::string(graph::optimizer_name(flags.model.optimizer)).c_str(),
                slice.c_str(), graph.num_ops(), plan.buffers.size());
    std::cout << buffer_table(plan);
    print_out("\n%s", memory_summary(graph, plan).c_str());
    if (checkpoint) print_out("%s\n", checkpoint_line(*checkpoint).c_str());
    print_out("%s", rewrite_lines(planned.value().rewrites).c_str());
    if (profile) print_out("\n%s", profile_text(*profile).c_str());
    if (!flags.out.empty()) print_out("\nwrote %s\n", flags.out.c_str());
    if (!flags.svg.empty()) print_out("%swrote %s\n", flags.out.empty() ? "\n" : "", flags.svg.c_str());
  }
  return kExitOk;
}

}  // namespace

Command add_plan_command(CLI::App& root) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* app = root.add_subcommand(
      "plan", "Plan a model's training step: every tensor's offset, size and lifetime in one arena, and the totals.");
  add_model_options(*app, flags->model, /*trainable_only=*/false, /*shapes=*/true);
  add_enum_option(*app, "--device", flags->device, kernels::kDeviceKindNames,
                  "Plan for this device kind's documented profile: cpu, or cuda (the cuBLAS workspace inside the arena)");
  add_schedule_option(*app, flags->schedule);
  app->add_flag("--no-in-place", flags->no_in_place, "Do not let elementwise ops write over an input that dies there");
  app->add_option("--exact-nodes", flags->exact_nodes,
                  "Search nodes for the exact offset search after the greedy portfolio (0: greedy only); a node "
                  "budget gives the same plan on any machine")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app->add_option("--time-limit", flags->time_limit_s,
                  "Also stop the exact search after this many seconds (0: no wall-clock limit; with one, plans may "
                  "differ between a busy machine and an idle one)")
      ->check(finite_in_range(0.0, 3600.0))
      ->capture_default_str();
  app->add_flag("--json", flags->json, "Print the plan as JSON (totals and every buffer)");
  app->add_option("--out", flags->out, "Also write the JSON plan to this file (atomically)");
  app->add_option("--svg", flags->svg,
                  "Also write a picture of the arena (SVG): every tensor at its offset over its lifetime");
  app->add_flag("--profile", flags->profile,
                "Also run the planned step on --device with random inputs (one warm-up step, then one timed step) "
                "and show where its time goes: per op kind, share, GFLOP/s, the five slowest ops (JSON: \"profile\")");
  add_checkpoint_options(*app, flags->checkpoint);
  return Command{app, [flags] { return run_plan(*flags); }};
}

}  // namespace memplan::tools
