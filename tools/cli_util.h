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

// The training step (forward, backward, optimizer) of a reference model at a batch size, shapes
// only: what plan, fit and compare start from. `hidden` sets the MLP's widths.
Result<graph::Graph> build_training_step(const std::string& model, std::int64_t batch,
                                         const std::vector<std::int64_t>& hidden, const std::string& optimizer);

// --checkpoint and --budget, shared by train, plan and fit.
struct CheckpointFlags {
  std::string strategy = "none";
  std::string budget;  // empty: no arena budget
};
// Registers --checkpoint, and --budget unless the command has its own (fit's device budget).
void add_checkpoint_options(CLI::App& app, CheckpointFlags& flags, bool with_budget = true);
// Applies the flags to a built training step. nullopt when nothing was asked (none, no budget);
// an Error (the budget cannot be met: it names the minimum and the strategy) otherwise.
// `budget` replaces the flag's (fit passes its device budget minus the runtime overheads).
Result<std::optional<planner::CheckpointOutcome>> apply_checkpoint_flags(const CheckpointFlags& flags,
                                                                         const graph::Graph& step,
                                                                         const planner::PlanOptions& options = {},
                                                                         std::optional<Bytes> budget = std::nullopt);
// "checkpoint optimal: peak 120.9 MiB -> 47.0 MiB, recompute +0.5% FLOPs"
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
