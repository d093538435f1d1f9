// Shared CLI pieces: validators that turn bad flag values into usage errors (exit 2), and the
// progress line long-running commands print to stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace memplan::tools {

// Accepts a finite number > 0 (rejects 0, negatives, NaN, inf and non-numbers).
CLI::Validator positive_finite();
// Accepts an integer >= 1.
CLI::Validator positive_integer();

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
