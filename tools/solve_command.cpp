// `memplan solve`: offsets for a MiniMalloc CSV file (buffers with [lower, upper) lifetimes),
// through the exact solver seeded by the greedy portfolio. Reads, solves, validates, reports;
// the planning itself lives in planner/.
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "memplan/planner/exact_solver.h"
#include "tools/cli_util.h"
#include "memplan/planner/minimalloc_csv.h"
#include "memplan/planner/validator.h"
#include "tools/commands.h"

namespace memplan::tools {

namespace {

struct SolveOptions {
  std::string input_path;
  std::string output_path;
  Bytes capacity_bytes = 0;  // --budget (--capacity before): the arena budget
  double time_limit_s = 10.0;
  bool json = false;
  bool stats = false;
  CLI::Option* capacity_option = nullptr;
};

int run_solve(const SolveOptions& options) {
  using namespace memplan::planner;
  Result<MinimallocCsv> csv = read_minimalloc_csv(options.input_path);
  if (!csv) {
    std::cerr << "memplan solve: " << csv.error().message << "\n";
    return kExitUsage;
  }
  AllocationProblem problem = std::move(csv.value().problem);
  if (options.capacity_option->count() > 0) problem.capacity_bytes = options.capacity_bytes;
  if (const Status status = check_problem(problem); !status) {
    std::cerr << "memplan solve: " << options.input_path << ": " << status.error().message << "\n";
    return kExitUsage;
  }

  ExactSolverOptions solver_options;
  solver_options.time_limit_s = options.time_limit_s;
  ExactSolverStats stats;
  const auto start = std::chrono::steady_clock::now();
  const Solution solution = solve_exact(problem, solver_options, &stats);
  const double solve_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const Bytes lower_bound = lower_bound_bytes(problem);

  if (solution.has_packing()) {
    // Every plan passes the independent validator before anyone sees it.
    const Status valid = validate_solution(problem, solution);
    MEMPLAN_CHECK(valid.ok(), "solver produced an invalid packing: " << valid.error().message);
    if (!options.output_path.empty()) {
      Result<std::string> text = format_minimalloc_csv(problem, solution.offsets);
      if (!text) {
        std::cerr << "memplan solve: " << options.output_path << ": " << text.error().message << "\n";
        return kExitUsage;
      }
      if (!write_report_file("solve", options.output_path, text.value())) return kExitUsage;
    }
  }

  if (options.json) {
    nlohmann::json out;
    out["input"] = options.input_path;
    out["buffers"] = problem.buffers.size();
    out["lower_bound"] = lower_bound;
    out["height"] = solution.has_packing() ? nlohmann::json(solution.height_bytes) : nlohmann::json(nullptr);
    out["capacity"] = problem.capacity_bytes ? nlohmann::json(*problem.capacity_bytes) : nlohmann::json(nullptr);
    out["status"] = std::string(to_string(solution.status));
    out["solve_ms"] = solve_ms;
    out["greedy_height"] = stats.greedy_height_bytes;
    out["nodes"] = stats.nodes;
    out["stopped"] = stats.stopped;
    out["parts"] = stats.parts;
    if (options.stats) {
      out["stats"] = {{"nodes", stats.nodes},
                      {"backtracks", stats.backtracks},
                      {"attempts", stats.attempts},
                      {"searched", stats.searched},
                      {"zero_waste", stats.zero_waste},
                      {"bands", stats.bands},
                      {"greedy_ms", stats.greedy_ms},
                      {"setup_ms", stats.setup_ms},
                      {"search_ms", stats.search_ms},
                      {"proof", stats.proof},
                      {"stopped", stats.stopped},
                      {"parts", stats.parts},
                      {"distinct_parts", stats.distinct_parts},
                      {"floor_buffers", stats.floor_buffers}};
    }
    if (!options.output_path.empty() && solution.has_packing()) out["output"] = options.output_path;
    std::cout << out.dump(2) << "\n";
  } else {
    std::ostringstream ratio;
    if (solution.has_packing() && lower_bound > 0) {
      ratio << std::fixed << std::setprecision(4) << double(solution.height_bytes) / double(lower_bound);
    } else {
      ratio << "-";
    }
    std::cout << "memplan solve: " << options.input_path << "\n"
              << "  buffers       " << problem.buffers.size() << "\n"
              << "  lower bound   " << lower_bound << " B\n"
              << "  height        " << (solution.has_packing() ? std::to_string(solution.height_bytes) + " B" : "-")
              << "\n"
              << "  height / LB   " << ratio.str() << "\n";
    if (problem.capacity_bytes) std::cout << "  capacity      " << *problem.capacity_bytes << " B\n";
    std::cout << "  status        " << to_string(solution.status) << " (stopped: " << stats.stopped << ")\n"
              << "  time          " << std::fixed << std::setprecision(1) << solve_ms << " ms\n";
    if (!options.output_path.empty() && solution.has_packing()) {
      std::cout << "  output        " << options.output_path << "\n";
    }
    if (options.stats) {
      std::cout << std::setprecision(1) << "  greedy        " << stats.greedy_ms << " ms (height "
                << stats.greedy_height_bytes << " B)\n"
                << "  setup         " << stats.setup_ms << " ms\n"
                << "  search        " << stats.search_ms << " ms" << (stats.zero_waste ? (stats.bands ? " (zero-waste, found by band decomposition)" : " (zero-waste)") : "")
                << "\n"
                << "  nodes         " << stats.nodes << "\n"
                << "  backtracks    " << stats.backtracks << "\n"
                << "  attempts      " << stats.attempts << "\n"
                << "  parts         " << stats.parts << " (" << stats.distinct_parts << " distinct, "
                << stats.floor_buffers << " buffers in floors)\n"
                << "  proof         " << stats.proof << "\n";
    }
  }
  if (!solution.has_packing()) {
    std::string why = "the search proved none exists";
    if (solution.status != SolveStatus::not_found) {
      why = std::string(stats.stopped) == "conflict limit"
                ? "the search was skipped: a part has more buffer pairs live together than it keeps in memory"
                : std::string(stats.stopped) + " reached before a packing was found; a larger --time-limit may find one";
    }
    std::cerr << "memplan solve: no packing within capacity " << *problem.capacity_bytes << " B found (" << why
              << "; lower bound " << lower_bound << " B, greedy height " << stats.greedy_height_bytes << " B)\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

Command add_solve_command(CLI::App& root) {
  auto options = std::make_shared<SolveOptions>();
  CLI::App* app = root.add_subcommand(
      "solve",
      "Assign an offset to every buffer of a MiniMalloc CSV file (id,lower,upper,size; lifetimes\n"
      "[lower, upper)). With --budget: find a packing within it (exit 1 if none is found in\n"
      "time). Without: minimise the arena height.");
  app->add_option("--input", options->input_path, "MiniMalloc CSV file to read")->required();
  options->capacity_option =
      app->add_option("--budget,--capacity", options->capacity_bytes,
                      "arena budget in bytes (--capacity: the older name, kept for a release)")
          ->check(whole_number(std::uint64_t{1} << 60));
  app->add_option("--output", options->output_path,
                  "write the packing as CSV with an offset column (written whole or not at all)");
  app->add_option("--time-limit", options->time_limit_s, "search time limit in seconds (default 10)")
      ->check(positive_finite());
  app->add_flag("--json", options->json, "print one JSON object instead of a table");
  app->add_flag("--stats", options->stats,
                "also report the search: nodes, backtracks, time per phase, and what proved the answer");
  return Command{app, [options]() { return run_solve(*options); }};
}

}  // namespace memplan::tools
