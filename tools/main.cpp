// memplan: plan a training step's memory before it runs, then train inside that plan.
#include <exception>
#include <string>
#include <iostream>
#include <vector>

#include "common/check.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace memplan::tools;
  CLI::App app{
      "memplan: a training framework that plans every byte of a training step before it runs.\n"
      "Run 'memplan COMMAND --help' for a command's options."};
  app.require_subcommand(1);
  std::vector<Command> commands = {add_train_command(app), add_plan_command(app), add_fit_command(app), add_compare_command(app), add_solve_command(app), add_sample_command(app)};
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const Command& command : commands) {
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
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and usage
    return kExitUsage;
  }
  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const memplan::InternalError& e) {
    std::cerr << "memplan: internal error (please report): " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "memplan: " << e.what() << "\n";
    return kExitFailure;
  }
  return kExitUsage;
}
