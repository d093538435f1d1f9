// Shared CLI pieces: validators that turn bad flag values into usage errors (exit 2), and the
// progress line long-running commands print to stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/plan_step.h"

namespace memplan::tools {

// Accepts a finite number > 0 (rejects 0, negatives, NaN, inf and non-numbers).
CLI::Validator positive_finite();
// Accepts a finite number in [lo, hi] (rejects NaN, which CLI::Range lets through).
CLI::Validator finite_in_range(double lo, double hi);
// Accepts an integer >= 1.
CLI::Validator positive_integer();
// Accepts a whole number in [0, max] written in decimal digits only (no sign, no exponent): a
// seed or a byte count. CLI11's own conversion lets "-1" wrap around and clamps overflow.
CLI::Validator whole_number(std::uint64_t max = UINT64_MAX);
// Accepts a byte size as parse_byte_size() reads it ("24GiB", "80GB", "4096"); "0" too when
// `allow_zero`.
CLI::Validator byte_size(bool allow_zero = false);

// --checkpoint and --budget, shared by train, plan and fit.
struct CheckpointFlags {
  std::string strategy = "none";
  std::string budget;  // empty: no arena budget
};
// Registers --checkpoint, and --budget unless the command has its own meaning for it.
void add_checkpoint_options(CLI::App& app, CheckpointFlags& flags, bool with_budget = true);
// Sets the request's checkpoint strategy and arena budget from the flags (an Error names the flag).
Status apply_checkpoint_flags(const CheckpointFlags& flags, planner::PlanRequest& request);

// The model flags plan, fit and compare share, as a step description for plan_step.
struct ModelFlags {
  std::string model = "mlp";
  std::int64_t batch = 0;  // 0: the model's default
  std::string optimizer = "adamw";
  std::vector<std::int64_t> hidden = {256, 256};
  std::int64_t seq = 0;         // 0: the model's default
  std::int64_t image_size = 0;  // 0: the model's default
  std::string dtype = "fp32";
};
// Registers --model (every model in the registry, or the trainable ones), --batch, --optimizer,
// --hidden, and with `shapes` --seq, --image-size and --dtype.
void add_model_options(CLI::App& app, ModelFlags& flags, bool trainable_only, bool shapes);
// The step the flags describe; an Error names the flag that cannot work with the model.
Result<planner::StepDescription> step_description(const ModelFlags& flags);

// "budget 1.00 MiB is below what checkpoint none can reach; the minimum feasible arena is ..."
std::string unmet_budget_message(const planner::PlannedStep& step, planner::CheckpointStrategy asked);
// "checkpoint optimal: arena 120.9 MiB -> 47.0 MiB, recompute +0.5% FLOPs"
std::string checkpoint_line(const planner::CheckpointOutcome& outcome);
nlohmann::json checkpoint_json(const planner::CheckpointOutcome& outcome);

// A progress line on stderr: redrawn in place on a terminal, a line per 10% otherwise.
class Progress {
 public:
  Progress(std::string label, std::int64_t total, bool enabled);
  void update(std::int64_t done, const std::string& detail);
  void finish(const std::string& detail);

 private:
  std::string label_;
  std::int64_t total_;
  bool enabled_;
  bool tty_;
  std::int64_t last_decile_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace memplan::tools
