// memplan fit: does a model's training step fit a memory budget, and what is the largest batch
// that does, by planning alone (nothing is allocated; the plan is the one execution would use).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "memplan/common/byte_size.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/models/zoo.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/fit.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

std::int64_t parameter_count(const graph::Graph& g) {
  std::int64_t n = 0;
  for (TensorId p : g.parameters()) n += g.tensor(p).shape.numel();
  return n;
}

struct FitFlags {
  std::string model = "mlp";
  std::int64_t batch = 0;  // 0: the model's default
  std::string budget;
  std::string device = "cuda";
  std::string overhead;  // overrides the runtime overhead constants
  std::string optimizer = "adamw";
  std::string dtype = "fp32";
  std::int64_t seq = 0;         // 0: the model's default
  std::int64_t image_size = 0;  // 0: the model's default
  std::vector<std::int64_t> hidden = {256, 256};
  bool max_batch = false;
  bool json = false;
  CheckpointFlags checkpoint;  // --checkpoint; the arena budget is --budget minus the overheads
  bool checkpoint_given = false;  // --checkpoint on the command line: --max-batch searches it alone
  Bytes arena_budget = 0;
};

// The checkpoint strategies --max-batch shows side by side and the suggestion chooses from,
// least recomputation first.
std::vector<std::string> checkpoint_strategies() { return {"none", "sqrt", "optimal"}; }

struct Planned {
  graph::Graph graph;
  planner::MemoryPlan plan;
  std::optional<planner::CheckpointOutcome> checkpoint;
};

// The training step of the chosen model at a batch size: a zoo model (planning only) or one of
// the trainable models (the same graph `memplan train` runs).
Result<graph::Graph> build_step(const FitFlags& flags, std::int64_t batch) {
  auto dtype = graph::parse_float_dtype(flags.dtype);
  if (!dtype) return dtype.error();
  Result<graph::Graph> forward = Error{""};
  if (models::find_zoo_model(flags.model) != nullptr) {
    forward = models::build_zoo_forward(flags.model, batch, {flags.seq, flags.image_size, dtype.value()});
  } else {
    models::ModelOptions options;
    options.name = flags.model;
    options.mlp.hidden = flags.hidden;
    if (flags.seq > 0) options.gpt.context = flags.seq;
    if (flags.image_size > 0) options.cnn.image = flags.image_size;
    forward = models::build_forward(options, batch);
  }
  if (!forward) return forward.error();
  auto kind = graph::parse_optimizer_kind(flags.optimizer);
  if (!kind) return kind.error();
  graph::Graph step = std::move(forward).value();
  graph::OptimizerConfig config;
  config.kind = kind.value();
  graph::make_training_step(step, config);
  return step;
}

// How fit plans: the trainable models with exactly the options the planned executor uses, so the
// arena is the one `memplan train` allocates. The zoo models (planning only, thousands of
// buffers) skip the time-limited exact search after the greedy portfolio: the answer stays a
// valid plan's exact arena, is deterministic (no wall-clock limit decides it), and comes in
// well under a second. Both skip solving the program order when its lower bound shows it
// cannot win (the chosen plan is the same).
planner::PlanOptions plan_options(const FitFlags& flags) {
  planner::PlanOptions options;
  options.skip_dominated_schedule = true;
  if (models::find_zoo_model(flags.model) != nullptr) options.solver_time_limit_s = 0.0;
  return options;
}

// Every plan fit reports goes through here (the requested batch, every probe of the batch
// search, every checkpoint strategy).
Result<Planned> plan_batch(const FitFlags& flags, std::int64_t batch, const std::string& checkpoint) {
  auto built = build_step(flags, batch);
  if (!built) return built.error();
  Planned p{std::move(built).value(), {}, std::nullopt};
  const planner::PlanOptions options = plan_options(flags);
  // A strategy that cannot meet the budget still plans its smallest arena: the answer is then "no".
  Result<std::optional<planner::CheckpointOutcome>> checkpointed = std::optional<planner::CheckpointOutcome>();
  if (checkpoint != "none") {
    CheckpointFlags wanted = flags.checkpoint;
    wanted.strategy = checkpoint;
    checkpointed = apply_checkpoint_flags(wanted, p.graph, options, flags.arena_budget);
    if (wanted.strategy == "auto") wanted.strategy = "optimal";
    if (!checkpointed) checkpointed = apply_checkpoint_flags(wanted, p.graph, options);
    if (!checkpointed) return checkpointed.error();
  }
  if (checkpointed.value()) {
    p.checkpoint = checkpointed.value();
    p.graph = std::move(checkpointed.value()->graph);
  }
  auto plan = planner::plan_memory(p.graph, options);
  if (!plan) return plan.error();
  p.plan = std::move(plan).value();
  return p;
}

// Flag combinations that cannot work, as a message naming the flag (empty when fine).
std::string check_flags(const FitFlags& flags) {
  const models::ZooModel* zoo = models::find_zoo_model(flags.model);
  const bool vision = zoo != nullptr ? zoo->vision : flags.model != "gpt";
  const bool language = zoo != nullptr ? !zoo->vision : flags.model == "gpt";
  if (flags.seq > 0 && !language) return "--seq applies to language models; '" + flags.model + "' takes none";
  if (flags.image_size > 0 && (!vision || flags.model == "mlp")) {
    return "--image-size applies to vision models (cnn, vit-b16, resnet50), not '" + flags.model + "'";
  }
  if (auto d = graph::parse_float_dtype(flags.dtype); !d) return "--dtype: " + d.error().message;
  if (zoo == nullptr && flags.dtype != "fp32" && flags.dtype != "f32") {
    return "--dtype " + flags.dtype + " is for the zoo models (" + [] {
      std::string names;
      for (const std::string& n : models::zoo_model_names()) names += (names.empty() ? "" : ", ") + n;
      return names;
    }() + "); the trainable models plan in fp32";
  }
  if (auto s = planner::parse_checkpoint_strategy(flags.checkpoint.strategy); !s) return "--checkpoint: " + s.error().message;
  return {};
}

int run_fit(FitFlags flags) {
  if (const std::string bad = check_flags(flags); !bad.empty()) {
    std::cerr << "memplan fit: " << bad << "\n";
    return kExitUsage;
  }
  if (flags.batch == 0) {
    const models::ZooModel* zoo = models::find_zoo_model(flags.model);
    flags.batch = zoo != nullptr ? zoo->default_batch : models::train_defaults(flags.model).batch;
  }
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

  auto planned = plan_batch(flags, flags.batch, flags.checkpoint.strategy);
  if (!planned) {
    std::cerr << "memplan fit: " << planned.error().message << "\n";
    return kExitUsage;
  }
  const planner::FitReport report = planner::fit_report(planned.value().plan, budget.value(), overhead_list);

  // The largest batch per checkpoint strategy: with --max-batch every strategy, side by side;
  // for a batch that does not fit, the requested one (for the micro-batch suggestion). When the
  // persistent state alone exceeds the budget no batch fits under any strategy (checkpointing
  // only trades activations), so nothing is searched.
  const bool persistent_too_big = planned.value().plan.persistent_bytes + overhead_bytes > budget.value();
  std::optional<planner::BatchSearch> search;  // for the requested strategy
  std::vector<std::pair<std::string, planner::BatchSearch>> by_strategy;
  if (flags.max_batch || !report.fits) {
    std::vector<std::string> strategies = flags.max_batch && !flags.checkpoint_given
                                              ? checkpoint_strategies()
                                              : std::vector<std::string>{flags.checkpoint.strategy};
    if (std::find(strategies.begin(), strategies.end(), flags.checkpoint.strategy) == strategies.end()) {
      strategies.push_back(flags.checkpoint.strategy);
    }
    for (const std::string& strategy : strategies) {
      auto total_for = [&](std::int64_t batch) -> Result<Bytes> {
        auto p = plan_batch(flags, batch, strategy);
        if (!p) return p.error();
        return p.value().plan.arena_bytes + overhead_bytes;
      };
      Result<planner::BatchSearch> s = planner::BatchSearch{};
      if (!persistent_too_big) s = planner::search_max_batch(total_for, budget.value());
      if (!s) {
        std::cerr << "memplan fit: " << s.error().message << "\n";
        return kExitFailure;
      }
      by_strategy.emplace_back(strategy, s.value());
      if (strategy == flags.checkpoint.strategy) search = s.value();
    }
  }
  // Not fitting: for each searched strategy, the largest micro-batch that fits and divides the
  // requested batch (so gradient accumulation reproduces it exactly); the largest wins, ties to
  // the strategy that recomputes least. Then the first checkpoint strategy (least recomputation
  // first) under which the whole batch fits, planned once each.
  nlohmann::json suggestion = nullptr;
  std::string suggestion_text;
  if (!report.fits) {
    std::int64_t best_micro = 0;
    std::string best_strategy;
    for (const auto& [strategy, result] : by_strategy) {
      if (result.max_batch <= 0) continue;
      std::int64_t micro = std::min(result.max_batch, flags.batch);
      while (flags.batch % micro != 0) --micro;
      if (micro > best_micro) {
        best_micro = micro;
        best_strategy = strategy;
      }
    }
    std::string whole_batch_strategy;
    if (!persistent_too_big) {
      for (const std::string& strategy : checkpoint_strategies()) {
        if (strategy == flags.checkpoint.strategy || strategy == "none") continue;
        auto p = plan_batch(flags, flags.batch, strategy);
        if (p && p.value().plan.arena_bytes + overhead_bytes <= budget.value()) {
          whole_batch_strategy = strategy;
          break;
        }
      }
    }
    if (best_micro > 0) {
      const std::int64_t accumulation = flags.batch / best_micro;
      suggestion = {{"micro_batch", best_micro}, {"gradient_accumulation_steps", accumulation},
                    {"effective_batch", best_micro * accumulation}, {"checkpoint", best_strategy}};
      suggestion_text = accumulation == 1
                            ? "batch " + std::to_string(flags.batch) + " fits with --checkpoint " + best_strategy
                            : "micro-batch " + std::to_string(best_micro) + " x " + std::to_string(accumulation) +
                                  " gradient-accumulation steps (effective batch " +
                                  std::to_string(best_micro * accumulation) + ") with --checkpoint " + best_strategy;
      if (!whole_batch_strategy.empty() && accumulation > 1) {  // otherwise it is the line above
        suggestion["whole_batch_checkpoint"] = whole_batch_strategy;
        suggestion_text += "; or the whole batch " + std::to_string(flags.batch) + " with --checkpoint " + whole_batch_strategy;
      }
    } else if (!whole_batch_strategy.empty()) {
      suggestion = {{"micro_batch", flags.batch}, {"gradient_accumulation_steps", 1},
                    {"effective_batch", flags.batch}, {"checkpoint", whole_batch_strategy}};
      suggestion_text = "batch " + std::to_string(flags.batch) + " fits with --checkpoint " + whole_batch_strategy;
    } else {
      const Bytes persistent = planned.value().plan.persistent_bytes + overhead_bytes;
      if (persistent > budget.value()) {
        suggestion_text = "not even batch 1 fits: the parameters and optimizer state (" +
                          format_bytes(planned.value().plan.persistent_bytes) + ") and the runtime overhead alone exceed " +
                          format_bytes(budget.value()) +
                          (flags.optimizer == "adamw" ? "; --optimizer sgd keeps no optimizer state" : "") +
                          "; otherwise shard the optimizer state across devices or pick a smaller model";
      } else {
        suggestion_text = "not even batch 1 fits with --checkpoint " + flags.checkpoint.strategy +
                          ": the activations of one sample need more than the " +
                          format_bytes(budget.value() - persistent) +
                          " left after parameters, optimizer state and runtime overhead; try a shorter --seq "
                          "or a smaller --image-size";
      }
      suggestion = {{"micro_batch", 0}, {"note", suggestion_text}};
    }
  }

  const planner::FitBreakdown& b = report.breakdown;
  if (flags.json) {
    nlohmann::json j{{"model", flags.model}, {"batch", flags.batch}, {"optimizer", flags.optimizer},
                     {"dtype", flags.dtype}, {"checkpoint_strategy", flags.checkpoint.strategy},
                     {"parameter_count", parameter_count(planned.value().graph)},
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
      nlohmann::json per = nlohmann::json::object();
      std::int64_t probes = 0;
      for (const auto& [strategy, result] : by_strategy) {
        per[strategy] = result.max_batch;
        probes += result.probes;
      }
      j["max_batch_by_checkpoint"] = per;
      j["plans_made"] = probes;
    }
    if (planned.value().checkpoint) j["checkpoint"] = checkpoint_json(*planned.value().checkpoint);
    j["suggestion"] = suggestion;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("%s (%lld parameters), batch %lld, %s, %s, on %s with a budget of %s: %s\n\n", flags.model.c_str(),
              static_cast<long long>(parameter_count(planned.value().graph)), static_cast<long long>(flags.batch),
              flags.dtype.c_str(), flags.optimizer.c_str(), flags.device.c_str(),
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
  if (!by_strategy.empty()) {
    std::printf("\nlargest batch that fits (exact: it fits, one more does not)\n  %-12s", "checkpoint");
    for (const auto& entry : by_strategy) std::printf(" %10s", entry.first.c_str());
    std::printf("\n  %-12s", "max batch");
    for (const auto& entry : by_strategy) std::printf(" %10lld", static_cast<long long>(entry.second.max_batch));
    std::printf("\n  %-12s", "plans made");
    for (const auto& entry : by_strategy) std::printf(" %10lld", static_cast<long long>(entry.second.probes));
    std::printf("\n");
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
  std::vector<std::string> names = models::trainable_model_names();
  for (const std::string& n : models::zoo_model_names()) names.push_back(n);
  app->add_option("--model", flags->model, "Model: a trainable one or a zoo configuration")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  app->add_option("--batch", flags->batch, "Samples per step (default: the model's; zoo language models 8, vision 32)")
      ->check(positive_integer());
  app->add_option("--seq", flags->seq, "Tokens per sequence (language models; default: the model's)")
      ->check(positive_integer());
  app->add_option("--image-size", flags->image_size, "Pixels per side (vision models; default: the model's)")
      ->check(positive_integer());
  app->add_option("--dtype", flags->dtype,
                  "fp32, or bf16/fp16 mixed precision: 16-bit weights, activations and gradients, fp32 master "
                  "weights and optimizer state (zoo models; planning only)")
      ->check(CLI::IsMember({"fp32", "f32", "bf16", "fp16", "f16"}))
      ->capture_default_str();
  add_checkpoint_options(*app, flags->checkpoint, /*with_budget=*/false);
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
  app->add_flag("--max-batch", flags->max_batch,
                "Also search the largest batch that fits (exact: it fits, one more does not) for each checkpoint "
                "strategy side by side, or for --checkpoint alone when given");
  app->add_flag("--json", flags->json, "Print the answer as JSON");
  return Command{app, [flags, app] {
                   flags->checkpoint_given = app->get_option("--checkpoint")->count() > 0;
                   return run_fit(*flags);
                 }};
}

}  // namespace memplan::tools
