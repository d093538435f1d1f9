#include "tools/cli_util.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "memplan/common/byte_size.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"

namespace memplan::tools {

CLI::Validator positive_finite() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::size_t used = 0;
        double v = 0.0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
          return "'" + value + "' is not a number";
        }
        if (used != value.size()) return "'" + value + "' is not a number";
        if (!std::isfinite(v) || v <= 0.0) return "must be a finite number > 0, got '" + value + "'";
        return {};
      },
      "NUMBER > 0");
}

CLI::Validator finite_in_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        std::size_t used = 0;
        double v = 0.0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
          return "'" + value + "' is not a number";
        }
        if (used != value.size()) return "'" + value + "' is not a number";
        if (!std::isfinite(v) || v < lo || v > hi) {
          std::ostringstream msg;
          msg << "must be a number in [" << lo << ", " << hi << "], got '" << value << "'";
          return msg.str();
        }
        return {};
      },
      "NUMBER");
}

CLI::Validator positive_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(value, &used);
        } catch (const std::exception&) {
          return "'" + value + "' is not an integer in range";
        }
        if (used != value.size()) return "'" + value + "' is not an integer";
        if (v < 1) return "must be at least 1, got '" + value + "'";
        return {};
      },
      "INTEGER >= 1");
}

void add_checkpoint_options(CLI::App& app, CheckpointFlags& flags, bool with_budget) {
  app.add_option("--checkpoint", flags.strategy,
                 "Activation checkpointing: none, sqrt (Chen et al.), optimal (least recomputation for the "
                 "budget), auto (the cheapest that fits the budget)")
      ->check(CLI::IsMember({"none", "sqrt", "optimal", "auto"}))
      ->capture_default_str();
  if (with_budget) {
    app.add_option("--budget", flags.budget,
                   "Arena budget for --checkpoint, e.g. 24GiB, 512MB or bytes (without it sqrt and optimal "
                   "minimise memory)")
        ->check(byte_size());
  }
}

Result<std::optional<planner::CheckpointOutcome>> apply_checkpoint_flags(const CheckpointFlags& flags,
                                                                         const graph::Graph& step,
                                                                         const planner::PlanOptions& options,
                                                                         std::optional<Bytes> budget) {
  auto strategy = planner::parse_checkpoint_strategy(flags.strategy);
  if (!strategy) return strategy.error();
  if (!budget && !flags.budget.empty()) {
    auto parsed = parse_byte_size(flags.budget);
    if (!parsed) return Error{"--budget: " + parsed.error().message};
    budget = parsed.value();
  }
  if (strategy.value() == planner::CheckpointStrategy::kNone && !budget) return std::optional<planner::CheckpointOutcome>();
  auto outcome = planner::apply_checkpointing(step, strategy.value(), budget, options);
  if (!outcome) return outcome.error();
  return std::optional<planner::CheckpointOutcome>(std::move(outcome).value());
}

namespace {
std::string mib(Bytes bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}
}  // namespace

std::string checkpoint_line(const planner::CheckpointOutcome& outcome) {
  char overhead[32];
  std::snprintf(overhead, sizeof overhead, "%.1f", 100.0 * outcome.extra_flops_fraction);
  return "checkpoint " + std::string(planner::checkpoint_strategy_name(outcome.chosen)) + ": peak " +
         mib(outcome.peak_before) + " -> " + mib(outcome.peak_after) + ", recompute +" + overhead + "% FLOPs";
}

nlohmann::json checkpoint_json(const planner::CheckpointOutcome& outcome) {
  int recompute_ops = 0;
  for (const graph::Op& op : outcome.graph.ops()) recompute_ops += op.phase == graph::Phase::recompute ? 1 : 0;
  return {{"strategy", planner::checkpoint_strategy_name(outcome.chosen)},
          {"peak_before_bytes", outcome.peak_before},
          {"peak_after_bytes", outcome.peak_after},
          {"extra_flops_fraction", outcome.extra_flops_fraction},
          {"recompute_ops", recompute_ops}};
}

CLI::Validator whole_number(std::uint64_t max) {
  return CLI::Validator(
      [max](std::string& value) -> std::string {
        std::uint64_t v = 0;
        const char* end = value.data() + value.size();
        const auto [ptr, ec] = std::from_chars(value.data(), end, v);
        if (value.empty() || ec == std::errc::invalid_argument || ptr != end) {
          return "'" + value + "' is not a whole number (digits only)";
        }
        if (ec == std::errc::result_out_of_range || v > max) {
          return "'" + value + "' is larger than " + std::to_string(max);
        }
        return {};
      },
      "WHOLE NUMBER");
}

CLI::Validator byte_size(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& value) -> std::string {
        if (allow_zero && value == "0") return {};
        const Result<Bytes> parsed = parse_byte_size(value);
        return parsed ? std::string() : parsed.error().message;
      },
      allow_zero ? "SIZE|0" : "SIZE");
}

Result<graph::Graph> build_training_step(const std::string& model, std::int64_t batch,
                                         const std::vector<std::int64_t>& hidden, const std::string& optimizer) {
  models::ModelOptions options;
  options.name = model;
  options.mlp.hidden = hidden;
  auto forward = models::build_forward(options, batch);
  if (!forward) return forward.error();
  auto kind = graph::parse_optimizer_kind(optimizer);
  if (!kind) return kind.error();
  graph::Graph step = std::move(forward).value();
  graph::OptimizerConfig config;
  config.kind = kind.value();
  graph::make_training_step(step, config);
  return step;
}

Progress::Progress(std::string label, std::int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}

void Progress::update(std::int64_t done, const std::string& detail) {
  if (!enabled_ || total_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total_);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld %s\033[K", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), detail.c_str());
  } else {
    const std::int64_t decile = done * 10 / total_;
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s %3lld%% %lld/%lld %s\n", label_.c_str(), static_cast<long long>(decile * 10),
                 static_cast<long long>(done), static_cast<long long>(total_), detail.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish(const std::string& detail) {
  if (!enabled_) return;
  if (tty_) std::fprintf(stderr, "\r%s done %s\033[K\n", label_.c_str(), detail.c_str());
  std::fflush(stderr);
}

}  // namespace memplan::tools
