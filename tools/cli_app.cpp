#include "tools/cli_app.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "memplan/common/cancellation.h"
#include "memplan/common/check.h"
#include "memplan/common/memory_files.h"

namespace memplan::tools {
namespace {

// CLI11's help lists an option's "Excludes:" in the order of the options' addresses, which
// depends on the heap; sorted by name, --help reads the same in every process (the Python package
// compares its in-process help with the CLI's).
class StableHelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string text = CLI::Formatter::make_option_opts(opt);
    const std::string label = " " + get_label("Excludes") + ":";
    const std::size_t at = text.find(label);
    if (at == std::string::npos || opt->get_excludes().size() < 2) return text;
    std::vector<std::string> names;
    for (const CLI::Option* other : opt->get_excludes()) names.push_back(other->get_name());
    std::sort(names.begin(), names.end());
    std::string sorted = label;
    for (const std::string& name : names) sorted += " " + name;
    std::size_t end = at + label.size();
    for (std::size_t i = 0; i < names.size(); ++i) end += 1 + names[i].size();  // the unsorted list's length
    return text.substr(0, at) + sorted + text.substr(end);
  }
};

}  // namespace

CliApp::CliApp()
    : app_("memplan: a training framework that plans every byte of a training step before it runs.\n"
           "Run 'memplan COMMAND --help' for a command's options.") {
  app_.require_subcommand(1);
  app_.formatter(std::make_shared<StableHelpFormatter>());  // subcommands take the root's formatter
  commands_ = {add_train_command(app_),   add_plan_command(app_),  add_fit_command(app_),
               add_compare_command(app_), add_solve_command(app_), add_sample_command(app_),
               add_replay_command(app_), add_generate_command(app_)};
}

std::optional<int> CliApp::parse(int argc, const char* const* argv) {
  if (argc > 1 && argv[1] != nullptr && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const Command& command : commands_) {
      known = known || command.app->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + command.app->get_name();
    }
    if (!known) {
      std::cerr << "memplan: unknown command '" << argv[1] << "' (commands: " << names
                << "; see 'memplan --help')\n";
      return kExitUsage;
    }
  }
  try {
    app_.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app_.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app_.exit(e);
  } catch (const CLI::ParseError& e) {
    app_.exit(e);  // prints the message and usage
    return kExitUsage;
  }
  return std::nullopt;
}

int CliApp::run() {
  try {
    for (const Command& command : commands_) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const memplan::Cancelled&) {
    std::cerr << "memplan: stopped on request\n";
    return kExitCancelled;
  } catch (const memplan::InternalError& e) {
    std::cerr << "memplan: internal error (please report): " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "memplan: " << e.what() << "\n";
    return kExitFailure;
  }
  return kExitUsage;
}

int run_cli(int argc, const char* const* argv) {
  CliApp cli;
  if (std::optional<int> code = cli.parse(argc, argv)) return *code;
  return cli.run();
}

CapturedRun run_cli_captured(const std::vector<std::string>& args, const std::map<std::string, std::string>& inputs,
                             const std::vector<std::string>& outputs) {
  static std::mutex one_at_a_time;
  std::lock_guard lock(one_at_a_time);
  CapturedRun run;
  std::vector<ScopedMemoryInput> in;
  for (const auto& [name, bytes] : inputs) {
    auto made = ScopedMemoryInput::create(name, bytes);
    if (!made) {
      run.exit_code = kExitUsage;
      run.err = "memplan: " + made.error().message + "\n";
      return run;
    }
    in.push_back(std::move(made).value());
  }
  std::vector<ScopedMemoryOutput> out_files;
  for (const std::string& name : outputs) {
    auto made = ScopedMemoryOutput::create(name);
    if (!made) {
      run.exit_code = kExitUsage;
      run.err = "memplan: " + made.error().message + "\n";
      return run;
    }
    out_files.push_back(std::move(made).value());
  }
  std::vector<const char*> argv = {"memplan"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  // Restores the streams however the run ends.
  struct Swap {
    std::streambuf* cout_buf;
    std::streambuf* cerr_buf;
    ~Swap() {
      std::cout.rdbuf(cout_buf);
      std::cerr.rdbuf(cerr_buf);
    }
  } swap{std::cout.rdbuf(out.rdbuf()), std::cerr.rdbuf(err.rdbuf())};
  const auto start = std::chrono::steady_clock::now();
  try {
    CliApp cli;
    std::optional<int> code = cli.parse(static_cast<int>(argv.size()), argv.data());
    run.exit_code = code ? *code : cli.run();
  } catch (const std::exception& e) {  // CliApp::run catches what commands throw; this is CLI11's setup
    err << "memplan: " << e.what() << "\n";
    run.exit_code = kExitFailure;
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.out = out.str();
  run.err = err.str();
  for (const ScopedMemoryOutput& m : out_files) run.outputs[m.name()] = m.bytes();
  return run;
}

}  // namespace memplan::tools
