// The memplan command line as an object: building the CLI::App and parsing argv are separate
// from running the chosen command, so tests and fuzzers can parse flags without executing.
#pragma once

#include <map>
#include <optional>
#include <string>
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

// A command run in-process, its standard output and error kept rather than printed: the Python
// package runs the CLI's own flags, errors and JSON this way. One such run at a time in a process
// (std::cout and std::cerr are swapped for the run's buffers, and the in-memory names below are
// process-wide; a lock keeps runs apart).
struct CapturedRun {
  int exit_code = 0;   // as the CLI's (commands.h), kExitCancelled when stopped on request
  std::string out;     // what the command wrote to standard output
  std::string err;     // and to standard error
  double seconds = 0;  // the command itself, from parsing its flags to its last output
  // Each name of `outputs`: what the command wrote there, or nothing.
  std::map<std::string, std::optional<std::string>> outputs;
};
// `args` are the command line without the program name ("fit", "--model", "gpt2", ...). The
// command reads `inputs` (name -> bytes) as files of those names and writes its reports to the
// names in `outputs` into memory (common/memory_files.h), for the run only. A name that cannot be
// registered is a usage error.
CapturedRun run_cli_captured(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& inputs = {},
                             const std::vector<std::string>& outputs = {});

}  // namespace memplan::tools
