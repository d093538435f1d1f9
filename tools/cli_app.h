// The memplan command line as an object: building the CLI::App and parsing argv are separate
// from running the chosen command, so tests and fuzzers can parse flags without executing.
#pragma once

#include <optional>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/commands.h"

namespace memplan::tools {

class CliApp {
 public:
  CliApp();
  CliApp(const CliApp&) = delete;
  CliApp& operator=(const CliApp&) = delete;

  // Parses argv (argv[0] is the program name). Returns no value when a command was chosen and
  // its flags parsed (run() runs it); otherwise the exit code after printing help (0) or the
  // usage error (kExitUsage).
  std::optional<int> parse(int argc, const char* const* argv);
  // Runs the parsed command; exceptions become messages and exit codes.
  int run();
  // The root app, whose subcommands are the commands (for tests that walk every flag).
  const CLI::App& app() const { return app_; }

 private:
  CLI::App app_;
  std::vector<Command> commands_;
};

// parse() then run(): what main() does.
int run_cli(int argc, const char* const* argv);

}  // namespace memplan::tools
