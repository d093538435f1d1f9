// The GPT reference model's training step (AdamW, planned execution on the CPU) with fused
// attention beside materialized attention, at T = 64 and T = 512: rounds interleave the two so
// the machine's load hits both alike. Checked first: from the same initial weights both give the
// same loss (within float tolerance) over the first steps.
//
//   bench_attention_step [--rounds 3] [--threads 0] [--json-out bench/results/attention_step.json]
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace {

using namespace memplan;

struct Case {
  std::int64_t t, batch;
  int steps;  // timed steps per round
};

struct Run {
  double step_ms = 0;
  std::vector<float> losses;
  Bytes arena_bytes = 0;
};

Run run(const Case& c, models::AttentionKind kind, int steps) {
  models::ModelOptions model;
  model.name = "gpt";
  model.gpt.context = c.t;
  model.gpt.attention = kind;
  runtime::CpuDevice device;
  const planner::PlannedStep step =
      runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(model), c.batch), device).value();
  const graph::Graph& g = step.graph;
  runtime::Executor exec(g, step.plan, device, runtime::ExecutorOptions{});
  if (!exec.setup().ok()) throw std::runtime_error("setup failed");
  exec.initialize_persistent(7);
  Rng rng(3);
  std::vector<std::int32_t> x(static_cast<std::size_t>(c.batch * c.t)), y(x.size());
  for (auto& v : x) v = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(model.gpt.vocab)));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[(i + 1) % x.size()];
  exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
  Run r;
  r.arena_bytes = step.plan.arena_bytes;
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    times.push_back(bench::time_ms([&] {
      if (!exec.run_step().ok()) throw std::runtime_error("step failed");
    }));
    r.losses.push_back(exec.read_scalar(g.loss));
  }
  times.erase(times.begin());  // the first step touches the arena's pages
  r.step_ms = bench::median(times);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3, threads = 0;
  std::string json_out = std::string(MEMPLAN_SOURCE_DIR) + "/bench/results/attention_step.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::stoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_attention_step [--rounds N] [--threads N] [--json-out FILE]\n");
      return 2;
    }
  }
  kernels::set_cpu_threads(threads);
  const Case cases[] = {{64, 32, 8}, {512, 8, 4}};
  nlohmann::json out{{"benchmark", "attention_step"}, {"rounds", rounds}, {"threads", kernels::cpu_threads()}};
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const Case& c : cases) {
    std::vector<double> fused_ms, mat_ms;
    Run fused, mat;
    for (int r = 0; r < rounds; ++r) {
      mat = run(c, models::AttentionKind::materialized, c.steps + 1);
      fused = run(c, models::AttentionKind::fused, c.steps + 1);
      for (std::size_t s = 0; s < fused.losses.size(); ++s) {
        const float a = fused.losses[s], b = mat.losses[s];
        if (!(std::abs(a - b) <= 1e-3f * std::abs(b))) {
          std::fprintf(stderr, "check failed: T=%lld step %zu loss fused %.6f vs materialized %.6f\n",
                       static_cast<long long>(c.t), s + 1, double(a), double(b));
          return 1;
        }
      }
      fused_ms.push_back(fused.step_ms);
      mat_ms.push_back(mat.step_ms);
    }
    const double f = bench::median(fused_ms), m = bench::median(mat_ms);
    rows.push_back({std::to_string(c.t), std::to_string(c.batch), bench::fmt(m, 1), bench::fmt(f, 1),
                    bench::fmt(m / f, 2) + "x", bench::fmt(double(mat.arena_bytes) / (1 << 20), 1),
                    bench::fmt(double(fused.arena_bytes) / (1 << 20), 1)});
    results.push_back({{"t", c.t}, {"batch", c.batch}, {"materialized_ms", m}, {"fused_ms", f},
                       {"materialized_over_fused", m / f}, {"materialized_ms_rounds", mat_ms}, {"fused_ms_rounds", fused_ms},
                       {"materialized_arena_bytes", mat.arena_bytes}, {"fused_arena_bytes", fused.arena_bytes}});
  }
  std::printf("## GPT reference training step (2 layers, width 128, 4 heads, AdamW), CPU, %d threads, "
              "median ms/step over %d interleaved rounds\n\n",
              kernels::cpu_threads(), rounds);
  bench::print_table({"T", "batch", "materialized ms", "fused ms", "materialized / fused", "materialized arena MiB",
                      "fused arena MiB"},
                     rows);
  out["results"] = results;
  bench::write_json(json_out, out);
  return 0;
}
