// Offset-assignment solvers on benchmark instances: the greedy portfolio and the exact search
// on MiniMalloc's challenging files (and its README example), plus a synthetic 50,000-buffer
// training-step-like instance for greedy speed. Every packing is validated before its time
// is reported; prints a markdown table and writes JSON (--json-out, default
// bench_solver.json). Instances come from collect_instances(): add new sources there.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/common/rng.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/mlp.h"
#include "memplan/planner/exact_solver.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/greedy_solver.h"
#include "memplan/planner/minimalloc_csv.h"
#include "memplan/planner/validator.h"

namespace memplan::bench {
namespace {

using planner::AllocationProblem;
using planner::BufferSpec;
using planner::Solution;
using planner::TimePoint;

// One benchmark instance. The capacity (if any) lives in the problem; the exact solver then
// answers the feasibility question, otherwise it minimises the height.
struct BenchInstance {
  std::string name;
  AllocationProblem problem;
  bool run_exact = true;                  // false for instances only meant to time greedy
  std::optional<double> reference_ms;     // a published time for the same question, if any
  std::string reference_name;             // whose time that is
};

// MiniMalloc (Moffitt, ASPLOS 2023) built from its public source on a 2-core machine like
// ours (see bench/data/minimalloc/README.md).
const std::map<std::string, double> kMinimallocMs = {
    {"A", 4830}, {"B", 3490}, {"C", 650}, {"D", 2840}, {"E", 3190}, {"F", 5010},
    {"G", 1080}, {"H", 1600}, {"I", 3620}, {"J", 1080}, {"K", 500}};

std::vector<BenchInstance> minimalloc_instances(const std::filesystem::path& dir) {
  std::vector<BenchInstance> out;
  // The inputs are part of the repository, so a missing folder is a broken checkout, not a skip.
  if (!std::filesystem::is_directory(dir)) {
    std::cerr << "solver_bench: MiniMalloc inputs not found at " << dir << "\n";
    std::exit(2);
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".csv") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    Result<planner::MinimallocCsv> csv = planner::read_minimalloc_csv(path.string());
    if (!csv) {
      std::cerr << "solver_bench: " << csv.error().message << "\n";
      std::exit(2);
    }
    BenchInstance instance;
    const std::string stem = path.stem().string();  // "A.1048576" or "input.12"
    instance.name = "minimalloc/" + stem;
    instance.problem = std::move(csv.value().problem);
    // The capacity is the number in the file name, as MiniMalloc's benchmark intends.
    const std::string capacity = stem.substr(stem.find('.') + 1);
    instance.problem.capacity_bytes = std::stoll(capacity);
    const std::string letter = stem.substr(0, stem.find('.'));
    if (const auto it = kMinimallocMs.find(letter); it != kMinimallocMs.end()) {
      instance.reference_ms = it->second;
      instance.reference_name = "MiniMalloc";
    }
    out.push_back(std::move(instance));
  }
  return out;
}

// A training-step-like instance: persistent buffers live the whole step, activations saved in
// the forward pass live until their backward op (nested lifetimes), and many short-lived
// temporaries. Sizes log-uniform between 256 B and 16 MiB, 256-byte aligned.
BenchInstance synthetic_instance(int buffers, std::uint64_t seed) {
  Rng rng(seed);
  const TimePoint steps = 20000;
  BenchInstance instance;
  instance.name = "synthetic/" + std::to_string(buffers);
  instance.run_exact = false;
  auto size = [&] {
    const double log_size = std::log(256.0) + (std::log(16.0 * 1024 * 1024) - std::log(256.0)) * rng.uniform01();
    return align_up(Bytes(std::exp(log_size)), 256);
  };
  const int persistent = buffers / 200;
  const int saved = buffers / 25;
  for (int i = 0; i < buffers; ++i) {
    BufferSpec b;
    b.id = "t" + std::to_string(i);
    b.size_bytes = size();
    b.alignment = 256;
    if (i < persistent) {
      b.first_op = 0;
      b.end_op = steps;
    } else if (i < persistent + saved) {
      b.first_op = TimePoint(rng.below(steps / 2));
      b.end_op = steps - b.first_op + TimePoint(rng.below(4)) + 1;
    } else {
      b.first_op = TimePoint(rng.below(std::uint64_t(steps - 8)));
      b.end_op = b.first_op + 1 + TimePoint(rng.below(8));
    }
    instance.problem.buffers.push_back(std::move(b));
  }
  return instance;
}

// The transient region of reference models' training steps (AdamW, memory-aware schedule,
// in-place reuse), exactly as plan_memory hands it to the solvers.
std::vector<BenchInstance> training_graph_instances() {
  struct Model {
    const char* name;
    models::MlpConfig config;
  };
  const Model models_[] = {{"mlp", {}}, {"mlp-1024x3", {784, {1024, 1024, 1024}, 10}}};
  std::vector<BenchInstance> out;
  for (const Model& m : models_) {
    for (std::int64_t batch : {32, 128, 512, 2048}) {
      graph::Graph g = models::build_mlp(m.config, batch);
      graph::make_training_step(g, graph::OptimizerConfig{});
      planner::PlanOptions options;
      options.choose_best_schedule = false;
      options.solver = planner::SolverBudget::greedy_only();  // the bench runs the solvers itself
      auto plan = planner::plan_memory(g, options);
      if (!plan) {
        std::cerr << "solver_bench: planning " << m.name << " failed: " << plan.error().message << "\n";
        std::exit(1);
      }
      BenchInstance instance;
      instance.name = std::string("train/") + m.name + "/b" + std::to_string(batch);
      instance.problem = planner::transient_problem(plan.value());
      out.push_back(std::move(instance));
    }
  }
  return out;
}

// Every instance the bench runs. To add a source, append its BenchInstances here.
std::vector<BenchInstance> collect_instances() {
  std::vector<BenchInstance> instances =
      minimalloc_instances(std::filesystem::path(MEMPLAN_MINIMALLOC_DIR));
  for (BenchInstance& instance : training_graph_instances()) instances.push_back(std::move(instance));
  instances.push_back(synthetic_instance(50000, 1));
  return instances;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void require_valid(const std::string& what, const AllocationProblem& problem, const Solution& solution) {
  const Status valid = planner::validate_solution(problem, solution);
  if (!valid.ok()) {
    std::cerr << "solver_bench: INVALID packing from " << what << ": " << valid.error().message << "\n";
    std::exit(1);
  }
}

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

int run(int argc, char** argv) {
  std::string json_out = "bench_solver.json";
  double time_limit_s = 60.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json-out" && i + 1 < argc) {
      json_out = argv[++i];
    } else if (arg == "--time-limit" && i + 1 < argc) {
      time_limit_s = std::atof(argv[++i]);
    } else {
      std::cerr << "usage: bench_solver_bench [--json-out FILE] [--time-limit SECONDS]\n";
      return 2;
    }
  }

  nlohmann::json records = nlohmann::json::array();
  std::cout << "| instance | buffers | lower bound | capacity | greedy height | greedy/LB | greedy ms "
               "| exact height | exact/LB | exact status | exact ms | reference ms |\n"
            << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n";
  double exact_total_ms = 0, reference_total_ms = 0;
  for (const BenchInstance& instance : collect_instances()) {
    const AllocationProblem& problem = instance.problem;
    const Bytes lower_bound = planner::lower_bound_bytes(problem);

    // Greedy answers "how high", so it runs without the capacity; its packing is validated
    // against the uncapped problem.
    AllocationProblem uncapped = problem;
    uncapped.capacity_bytes.reset();
    auto start = std::chrono::steady_clock::now();
    const Solution greedy = planner::solve_greedy(uncapped);
    const double greedy_ms = ms_since(start);
    require_valid(instance.name + " (greedy)", uncapped, greedy);

    nlohmann::json record = {{"instance", instance.name},
                             {"buffers", problem.buffers.size()},
                             {"lower_bound", lower_bound},
                             {"capacity", problem.capacity_bytes ? nlohmann::json(*problem.capacity_bytes) : nlohmann::json()},
                             {"greedy_height", greedy.height_bytes},
                             {"greedy_ratio", double(greedy.height_bytes) / double(std::max<Bytes>(lower_bound, 1))},
                             {"greedy_ms", greedy_ms}};
    std::string exact_cells = "| - | - | - | - ";
    if (instance.run_exact) {
      planner::ExactSolverOptions options;
      options.time_limit_s = time_limit_s;
      planner::ExactSolverStats stats;
      start = std::chrono::steady_clock::now();
      const Solution exact = planner::solve_exact(problem, options, &stats);
      const double exact_ms = ms_since(start);
      exact_total_ms += exact_ms;
      if (exact.has_packing()) require_valid(instance.name + " (exact)", problem, exact);
      record["exact_status"] = std::string(planner::to_string(exact.status));
      record["exact_height"] = exact.has_packing() ? nlohmann::json(exact.height_bytes) : nlohmann::json();
      record["exact_ms"] = exact_ms;
      record["exact_nodes"] = stats.nodes;
      exact_cells = "| " + (exact.has_packing() ? std::to_string(exact.height_bytes) : std::string("-")) + " | " +
                    (exact.has_packing() ? fixed(double(exact.height_bytes) / double(std::max<Bytes>(lower_bound, 1)), 4)
                                         : std::string("-")) +
                    " | " + std::string(planner::to_string(exact.status)) + " | " + fixed(exact_ms, 1) + " ";
    }
    std::string reference = "-";
    if (instance.reference_ms) {
      record["reference_ms"] = *instance.reference_ms;
      record["reference"] = instance.reference_name;
      reference = fixed(*instance.reference_ms, 0) + " (" + instance.reference_name + ")";
      reference_total_ms += *instance.reference_ms;
    }
    records.push_back(record);
    std::cout << "| " << instance.name << " | " << problem.buffers.size() << " | " << lower_bound << " | "
              << (problem.capacity_bytes ? std::to_string(*problem.capacity_bytes) : "-") << " | "
              << greedy.height_bytes << " | " << fixed(double(greedy.height_bytes) / double(std::max<Bytes>(lower_bound, 1)), 4)
              << " | " << fixed(greedy_ms, 1) << " " << exact_cells << "| " << reference << " |" << std::endl;
  }
  std::cout << "\nexact total " << fixed(exact_total_ms / 1000, 2) << " s; reference total (same files) "
            << fixed(reference_total_ms / 1000, 2) << " s\n";
  nlohmann::json out = {{"bench", "solver"}, {"time_limit_s", time_limit_s}, {"results", records}};
  std::ofstream file(json_out);
  file << out.dump(2) << "\n";
  if (!file) {
    std::cerr << "solver_bench: cannot write " << json_out << "\n";
    return 1;
  }
  std::cout << "wrote " << json_out << "\n";
  return 0;
}

}  // namespace
}  // namespace memplan::bench

int main(int argc, char** argv) { return memplan::bench::run(argc, argv); }
