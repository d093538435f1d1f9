#include "tools/cli_util.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "memplan/common/atomic_file.h"
#include "memplan/common/byte_size.h"
#include "memplan/common/memory_files.h"
#include "memplan/planner/step_size.h"
#include "memplan/runtime/caching_allocator.h"

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
  add_enum_option(app, "--checkpoint", flags.strategy, planner::kCheckpointStrategyNames,
                  "Activation checkpointing: none, sqrt (Chen et al.), optimal (least recomputation for the "
                  "budget), auto (the cheapest that fits the budget)");
  if (with_budget) {
    app.add_option("--budget", flags.budget,
                   "Arena budget for --checkpoint, e.g. 24GiB, 512MB or bytes (without it sqrt and optimal "
                   "minimise memory)")
        ->check(byte_size());
  }
}

Status apply_checkpoint_flags(const CheckpointFlags& flags, planner::PlanRequest& request) {
  request.checkpoint = flags.strategy;
  if (!flags.budget.empty()) {
    auto parsed = parse_byte_size(flags.budget);
    if (!parsed) return Error{"--budget: " + parsed.error().message};
    request.budget = parsed.value();
  }
  return Status::success();
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

CLI::Validator alloc_conf() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto parsed = runtime::CachingAllocatorOptions::parse(value);
        return parsed ? std::string() : parsed.error().message;
      },
      "KEY:VALUE,...");
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

void print_out(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n > 0) {
    std::string text(static_cast<std::size_t>(n) + 1, '\0');
    std::vsnprintf(text.data(), text.size(), format, args);
    text.pop_back();
    std::cout << text;
  }
  va_end(args);
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

bool write_report_file(std::string_view command, const std::string& path, std::string_view bytes) {
  if (write_memory_output(path, bytes)) return true;  // a report an in-process caller reads back
  if (Status s = write_file_atomically(path, bytes); !s) {
    std::cerr << "memplan " << command << ": cannot write " << s.error().message << "\n";
    return false;
  }
  return true;
}

}  // namespace memplan::tools
