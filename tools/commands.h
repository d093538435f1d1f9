// The memplan CLI is a set of subcommands. Each adds itself to the root app and returns the
// function main() runs when it was chosen; that function returns the process exit code
// (0 success, 1 the answer is "no" / the run failed, 2 a usage or input error).
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace memplan::tools {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_train_command(CLI::App& root);
Command add_solve_command(CLI::App& root);
Command add_plan_command(CLI::App& root);
Command add_compare_command(CLI::App& root);
Command add_fit_command(CLI::App& root);
Command add_sample_command(CLI::App& root);
Command add_replay_command(CLI::App& root);
Command add_generate_command(CLI::App& root);

// Exit codes shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCancelled = 130;  // stopped on request (common/cancellation.h), as a shell reports SIGINT

}  // namespace memplan::tools
