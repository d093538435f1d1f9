// The static plan against the caching allocator (with and without expandable segments) on the
// reference models' training steps, by replay over a simulated device: reserved peaks and the
// ratios planned / caching and expandable / caching. Checks first that every plan validates and
// that no allocator reserves less than the lower bound.
//
//   bench_compare_allocators [--steps 3] [--json-out bench_compare_allocators.json]
#include <cstdio>
#include <string>

#include "bench/bench_util.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/dynamic_replay.h"
#include "memplan/runtime/simulated_device.h"

int main(int argc, char** argv) {
  using namespace memplan;
  int steps = 3;
  std::string json_out = "bench_compare_allocators.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_compare_allocators [--steps N] [--json-out FILE]\n");
      return 2;
    }
  }
  struct Case {
    std::string label;
    models::ModelOptions model;
    std::int64_t batch;
  };
  std::vector<Case> cases;
  for (std::int64_t batch : {128, 1024}) {
    cases.push_back({"mlp 784-256-256-10", models::ModelOptions{}, batch});
    models::ModelOptions wide;
    wide.mlp.hidden = {1024, 1024, 1024};
    cases.push_back({"mlp 784-1024x3-10", wide, batch});
    models::ModelOptions cnn;
    cnn.name = "cnn";
    cases.push_back({"cnn (small ResNet)", cnn, batch});
  }
  std::vector<std::vector<std::string>> rows;
  nlohmann::json results = nlohmann::json::array();
  for (const Case& c : cases) {
    auto planned = planner::plan_step(planner::StepDescription::of_source(models::registry_source(c.model), c.batch), planner::PlanRequest{});
    if (!planned) {
      std::fprintf(stderr, "bench_compare_allocators: %s\n", planned.error().message.c_str());
      return 1;
    }
    if (!planner::validate_plan(planned.value().plan).ok()) {
      std::fprintf(stderr, "check failed: no valid plan for %s\n", c.label.c_str());
      return 1;
    }
    const auto& p = planned.value().plan;
    Bytes reserved[2] = {0, 0};
    for (int v = 0; v < 2; ++v) {
      runtime::SimulatedDevice device(Bytes{1} << 50);
      runtime::ReplayOptions options;
      options.steps = steps;
      options.allocator.expandable_segments = v == 1;
      const runtime::ReplayResult r = runtime::replay_dynamic(p, device, options);
      if (r.out_of_memory || r.peak_allocated_bytes < p.transient_lower_bound_bytes) {
        std::fprintf(stderr, "check failed: replay of %s is inconsistent\n", c.label.c_str());
        return 1;
      }
      reserved[v] = r.peak_reserved_bytes;
    }
    const double planned_over = double(p.arena_bytes) / double(reserved[0]);
    const double expandable_over = double(reserved[1]) / double(reserved[0]);
    rows.push_back({c.label, std::to_string(c.batch), std::to_string(p.lower_bound_bytes), std::to_string(p.arena_bytes),
                    std::to_string(reserved[0]), std::to_string(reserved[1]), bench::fmt(planned_over, 3),
                    bench::fmt(expandable_over, 3)});
    results.push_back({{"model", c.label}, {"batch", c.batch}, {"lower_bound_bytes", p.lower_bound_bytes},
                       {"planned_arena_bytes", p.arena_bytes}, {"caching_reserved_peak_bytes", reserved[0]},
                       {"expandable_reserved_peak_bytes", reserved[1]}, {"planned_over_caching", planned_over},
                       {"expandable_over_caching", expandable_over}});
  }
  std::printf("Training step (AdamW) replayed for %d steps; bytes.\n\n", steps);
  bench::print_table({"model", "batch", "lower bound", "planned arena", "caching reserved peak",
                      "expandable reserved peak", "planned / caching", "expandable / caching"},
                     rows);
  bench::write_json(json_out, {{"benchmark", "compare_allocators"}, {"steps", steps}, {"results", results}});
  return 0;
}
