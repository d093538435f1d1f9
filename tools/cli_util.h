// Shared CLI pieces: validators that turn bad flag values into usage errors (exit 2), and the
// progress line long-running commands print to stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "common/result.h"
#include "graph/graph.h"

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
