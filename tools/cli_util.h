// Shared CLI pieces: validators that turn bad flag values into usage errors (exit 2), the
// checkpoint flags, and the progress line long-running commands print to stderr. The model flags
// (model_flags.h) and a planned step's lines (step_lines.h) come with it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/optimizer.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/step_size.h"
#include "tools/model_flags.h"
#include "tools/step_lines.h"

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
// Caching-allocator options in PYTORCH_CUDA_ALLOC_CONF syntax (compare, replay).
CLI::Validator alloc_conf();

// Turns a name from an enum's table (common/enum_names.h) into the text CLI11 converts to the
// enum (its underlying integer), and `unset_name` (when given) into the empty text that leaves a
// std::optional empty. Anything else fails with "NAME not in {a,b,c}", the names in table order
// (CLI::IsMember's wording); --help shows the same set.
template <class Table>
CLI::Validator enum_names_transform(const Table& table, std::string_view unset_name = {}) {
  using E = enum_of_table<Table>;
  std::vector<EnumName<E>> rows(std::begin(table), std::end(table));
  std::string set = "{";
  for (const EnumName<E>& row : rows) set += std::string(row.name) + ",";
  if (!unset_name.empty()) set += std::string(unset_name) + ",";
  set.back() = '}';
  return CLI::Validator(
      [rows, set, unset = std::string(unset_name)](std::string& value) -> std::string {
        if (!unset.empty() && value == unset) {
          value.clear();
          return {};
        }
        for (const EnumName<E>& row : rows) {
          if (row.name == value) {
            value = std::to_string(static_cast<long long>(row.value));
            return {};
          }
        }
        return value + " not in " + set;
      },
      set);
}

// An option bound to an enum through its name table: the names it takes, its --help and its
// errors all come from the table; the default shown is the value's name.
template <class Table>
CLI::Option* add_enum_option(CLI::App& app, const std::string& flags, enum_of_table<Table>& value, const Table& table,
                             const std::string& help) {
  return app.add_option(flags, value, help)->transform(enum_names_transform(table))->default_str(std::string(enum_name(table, value)));
}
// The same for an optional value: `unset_name` ("auto") leaves it empty (the command chooses).
template <class Table>
CLI::Option* add_enum_option(CLI::App& app, const std::string& flags, std::optional<enum_of_table<Table>>& value,
                             const Table& table, const std::string& help, std::string_view unset_name) {
  return app.add_option(flags, value, help)
      ->transform(enum_names_transform(table, unset_name))
      ->default_str(value ? std::string(enum_name(table, *value)) : std::string(unset_name));
}

// --checkpoint and --budget, shared by train, plan and fit.
struct CheckpointFlags {
  planner::CheckpointStrategy strategy = planner::CheckpointStrategy::kNone;
  std::string budget;  // empty: no arena budget
};
// Registers --checkpoint, and --budget unless the command has its own meaning for it.
void add_checkpoint_options(CLI::App& app, CheckpointFlags& flags, bool with_budget = true);
// Sets the request's checkpoint strategy and arena budget from the flags (an Error names the flag).
Status apply_checkpoint_flags(const CheckpointFlags& flags, planner::PlanRequest& request);

// Writes a report file whole or not at all (a failed run never leaves half a report behind);
// on failure prints "memplan COMMAND: cannot write ..." and returns false.
bool write_report_file(std::string_view command, const std::string& path, std::string_view bytes);
// printf to the command's standard output. Commands write through std::cout only (this included),
// so a caller running a command in-process (run_cli_captured, the Python package) keeps all of it.
void print_out(const char* format, ...) __attribute__((format(printf, 1, 2)));
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
