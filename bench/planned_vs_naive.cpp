// Planned vs naive execution of the same training step: step time side by side (ratio from one
// run, rounds interleaved), device allocations per step, and arena / lower bound for each
// model, batch and schedule. Results are checked first: both modes must produce identical
// parameters.
//
//   bench_planned_vs_naive [--steps 200] [--rounds 3] [--json-out bench_planned_vs_naive.json]
#include <cstdio>
#include <stdexcept>
#include <string>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/models/mlp.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace {

using namespace memplan;

struct Run {
  double step_ms = 0;
  double allocations_per_step = 0;
  std::string sha;
};

Run run(const graph::Graph& g, std::int64_t batch, runtime::ExecutionMode mode, int steps) {
  runtime::CpuDevice device;
  runtime::ExecutorOptions options;
  options.mode = mode;
  runtime::Executor exec(g, runtime::plan_step_for(planner::StepDescription::of_graph(g), device).value().plan, device, options);
  if (!exec.setup().ok()) throw std::runtime_error("setup failed");
  exec.initialize_persistent(0);
  Rng rng(1);
  std::vector<float> x(static_cast<std::size_t>(batch * 784));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (float& v : x) v = rng.uniform01();
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(10));
  exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    times.push_back(bench::time_ms([&] {
      if (!exec.run_step().ok()) throw std::runtime_error("step failed");
    }));
  }
  return Run{bench::median(times), double(exec.device_allocations_during_steps()) / steps, exec.params_sha256()};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, rounds = 3;
  std::string json_out = "bench_planned_vs_naive.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::stoi(argv[++i]);
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_planned_vs_naive [--steps N] [--rounds N] [--json-out FILE]\n");
      return 2;
    }
  }
  nlohmann::json out{{"benchmark", "planned_vs_naive"}, {"steps", steps}, {"rounds", rounds}};

  // 1. Step time, MLP 784-256-256-10 + AdamW.
  std::printf("## Step time: MLP 784-256-256-10, AdamW, CPU (%d steps x %d interleaved rounds, medians)\n\n", steps, rounds);
  std::vector<std::vector<std::string>> rows;
  nlohmann::json timing = nlohmann::json::array();
  for (std::int64_t batch : {128, 512}) {
    runtime::CpuDevice cpu;
    const planner::PlannedStep step =
        runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(models::ModelOptions{}), batch), cpu).value();
    const graph::Graph& g = step.graph;
    std::vector<double> planned_ms, naive_ms;
    Run planned, naive;
    for (int r = 0; r < rounds; ++r) {
      naive = run(g, batch, runtime::ExecutionMode::naive, steps);
      planned = run(g, batch, runtime::ExecutionMode::planned, steps);
      if (planned.sha != naive.sha) {
        std::fprintf(stderr, "check failed: planned and naive parameters differ at batch %lld\n",
                     static_cast<long long>(batch));
        return 1;
      }
      naive_ms.push_back(naive.step_ms);
      planned_ms.push_back(planned.step_ms);
    }
    const double p = bench::median(planned_ms), n = bench::median(naive_ms);
    rows.push_back({std::to_string(batch), bench::fmt(n), bench::fmt(p), bench::fmt(n / p, 2) + "x",
                    bench::fmt(naive.allocations_per_step, 1), bench::fmt(planned.allocations_per_step, 1)});
    timing.push_back({{"batch", batch}, {"naive_ms", n}, {"planned_ms", p}, {"naive_over_planned", n / p},
                      {"naive_allocations_per_step", naive.allocations_per_step},
                      {"planned_allocations_per_step", planned.allocations_per_step}});
  }
  bench::print_table({"batch", "naive ms/step", "planned ms/step", "naive / planned", "naive allocs/step",
                      "planned allocs/step"},
                     rows);
  out["timing"] = timing;

  // 2. Arena vs lower bound, per model configuration, batch and schedule.
  std::printf("\n## Arena vs lower bound (planning only)\n\n");
  rows.clear();
  nlohmann::json arenas = nlohmann::json::array();
  struct Config {
    const char* name;
    models::ModelOptions model;
  };
  models::ModelOptions wide;
  wide.mlp = {784, {1024, 1024, 1024}, 10};
  models::ModelOptions cnn;
  cnn.name = "cnn";
  const Config configs[] = {{"mlp 784-256-256-10", {}}, {"mlp 784-1024-1024-1024-10", wide}, {"cnn (small ResNet)", cnn}};
  for (const Config& c : configs) {
    for (std::int64_t batch : {32, 128, 512, 2048}) {
      for (auto schedule : {planner::ScheduleKind::program, planner::ScheduleKind::memory_aware}) {
        planner::PlanRequest request;
        request.schedule = schedule;
        request.choose_best_schedule = false;
        auto planned = planner::plan_step(planner::StepDescription::of_source(models::registry_source(c.model), batch), request);
        if (!planned || !planner::validate_plan(planned.value().plan).ok()) {
          std::fprintf(stderr, "check failed: no valid plan for %s batch %lld\n", c.name, static_cast<long long>(batch));
          return 1;
        }
        const auto& p = planned.value().plan;
        const double ratio = double(p.arena_bytes) / double(p.lower_bound_bytes);
        rows.push_back({c.name, std::to_string(batch), std::string(planner::schedule_name(schedule)),
                        std::to_string(p.arena_bytes), std::to_string(p.lower_bound_bytes), bench::fmt(ratio, 4),
                        std::string(planner::to_string(p.solve_status)), bench::fmt(p.solve_ms, 1)});
        arenas.push_back({{"model", c.name}, {"batch", batch}, {"schedule", planner::schedule_name(schedule)},
                          {"arena_bytes", p.arena_bytes}, {"lower_bound_bytes", p.lower_bound_bytes},
                          {"arena_over_lower_bound", ratio}, {"solve_status", planner::to_string(p.solve_status)},
                          {"plan_ms", p.solve_ms}});
      }
    }
  }
  bench::print_table({"model", "batch", "schedule", "arena B", "lower bound B", "arena / LB", "packing", "plan ms"}, rows);
  out["arenas"] = arenas;
  bench::write_json(json_out, out);
  return 0;
}
