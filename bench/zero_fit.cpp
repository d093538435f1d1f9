// Per-device memory of data-parallel training with ZeRO stages 0-3, as memplan plans one rank's
// step (arena + runtime overheads, activations and communication buffers included), beside the
// model-state formulas people size clusters with: the ZeRO paper's (Rajbhandari et al. 2020,
// K = 12 for mixed-precision Adam) per stage, and DeepSpeed's estimators without offload
// (estimate_zero2_model_states_mem_needs: 4P + 16P/N; estimate_zero3_...: 4 * largest layer +
// 18P/N). Models in bf16 with AdamW at one sequence per device; N = 1, 8, 64.
// Usage: bench_zero_fit [results.json]
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "memplan/models/model_source.h"
#include "memplan/planner/device_profile.h"
#include "memplan/planner/fit.h"
#include "memplan/planner/plan_step.h"

namespace memplan::bench {
namespace {

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "check failed: %s\n", what.c_str());
    std::exit(1);
  }
}

double gib(double bytes) { return bytes / double(1ull << 30); }

struct Row {
  std::string model;
  int devices = 1;
  int zero = 0;
  planner::FitBreakdown breakdown;
  Bytes persistent = 0;
  double seconds = 0.0;
};

// The ZeRO paper's model states per device: parameters 2P, gradients 2P, optimizer K*P (K = 12).
double zero_paper_bytes(double p, int n, int zero) {
  switch (zero) {
    case 0: return 16.0 * p;
    case 1: return 4.0 * p + 12.0 * p / n;
    case 2: return 2.0 * p + 14.0 * p / n;
    default: return 16.0 * p / n;
  }
}

}  // namespace
}  // namespace memplan::bench

int main(int argc, char** argv) {
  using namespace memplan;
  using namespace memplan::bench;
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fprintf(stderr, "usage: bench_zero_fit [results.json]   (default zero_fit.json)\n");
    return argc == 2 && std::string(argv[1]) == "--help" ? 0 : 2;
  }
  const std::string out_path = argc > 1 ? argv[1] : "zero_fit.json";
  const std::vector<std::string> models = {"gpt2-xl", "llama-1b", "llama2-7b"};
  const planner::DeviceProfile device = planner::documented_device_profile("cuda").value();
  std::vector<std::vector<std::string>> table;
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : models) {
    models::ModelOptions model;
    model.name = name;
    model.zoo.dtype = graph::DType::bf16;
    // Parameters and the largest layer (DeepSpeed's "largest_layer_params": the biggest module's
    // own parameters; here the tensors sharing a name up to the last '.').
    auto single = planner::plan_step(planner::StepDescription::of_source(models::registry_source(model), 1), planner::PlanRequest{.device = device});
    check(single.ok(), name + " plans");
    const double params = double(single.value().parameter_count());
    std::map<std::string, double> layers;
    for (TensorId p : single.value().graph.parameters()) {
      const std::string& n = single.value().graph.tensor(p).name;
      layers[n.substr(0, n.rfind('.'))] += double(single.value().graph.tensor(p).shape.numel());
    }
    double largest_layer = 0.0;
    for (const auto& [layer, count] : layers) largest_layer = std::max(largest_layer, count);
    std::map<std::pair<int, int>, Row> by;
    for (int devices : {1, 8, 64}) {
      for (int zero = 0; zero <= 3; ++zero) {
        if (devices == 1 && zero > 0) continue;  // one device: nothing to shard
        planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(model), devices);  // one sequence per device
        step.optimizer.kind = graph::OptimizerKind::adamw;
        step.parallel.world = devices;
        step.parallel.zero = zero;
        planner::PlanRequest request;
        request.device = device;
        Row row{name, devices, zero};
        Result<planner::PlannedStep> planned = Error{""};
        row.seconds = time_ms([&] { planned = planner::plan_step(step, request); }) / 1000.0;
        check(planned.ok(), name + " N=" + std::to_string(devices) + " ZeRO-" + std::to_string(zero) + ": " +
                                (planned.ok() ? "" : planned.error().message));
        row.breakdown = planner::fit_breakdown(planned.value().plan, device);
        // Model states held across steps: the arena's persistent region less the kernel workspace.
        row.persistent = planned.value().plan.persistent_bytes - planned.value().plan.workspace_bytes;
        by[{devices, zero}] = row;
        const double ds = zero == 2   ? 4.0 * params + 16.0 * params / devices
                          : zero == 3 ? 4.0 * largest_layer + 18.0 * params / devices
                                      : -1.0;
        const double paper = zero_paper_bytes(params, devices, zero);
        const planner::FitBreakdown& b = row.breakdown;
        table.push_back({name, std::to_string(devices), std::to_string(zero), fmt(gib(double(b.total)), 2),
                         fmt(gib(double(row.persistent)), 2), fmt(gib(double(b.gradients_at_peak)), 2),
                         fmt(gib(double(b.activations_at_peak)), 2), fmt(gib(double(b.communication_at_peak)), 2),
                         fmt(gib(paper), 2), ds < 0 ? "-" : fmt(gib(ds), 2), fmt(row.seconds, 2)});
        rows.push_back({{"model", name},
                        {"parameters", params},
                        {"largest_layer_parameters", largest_layer},
                        {"devices", devices},
                        {"zero", zero},
                        {"memplan_total_bytes", b.total},
                        {"arena_bytes", b.arena},
                        {"persistent_bytes", row.persistent},
                        {"gradients_at_peak_bytes", b.gradients_at_peak},
                        {"activations_at_peak_bytes", b.activations_at_peak},
                        {"communication_at_peak_bytes", b.communication_at_peak},
                        {"runtime_overhead_bytes", b.runtime_overhead},
                        {"zero_paper_bytes", paper},
                        {"deepspeed_estimate_bytes", ds < 0 ? nlohmann::json(nullptr) : nlohmann::json(ds)},
                        {"plan_seconds", row.seconds}});
      }
    }
    // Checks before anything is reported: sharding never grows what a device holds persistently,
    // and ZeRO-3 on 64 devices persistently holds 1/64 of the 14 bytes per parameter of bf16
    // parameters, f32 master copy and Adam's two moments (gradients are transient in a plan).
    for (int devices : {8, 64}) {
      for (int zero = 1; zero <= 3; ++zero) {
        check(by[{devices, zero}].persistent <= by[{devices, zero - 1}].persistent,
              name + ": ZeRO-" + std::to_string(zero) + " holds more than ZeRO-" + std::to_string(zero - 1));
      }
    }
    const double z3_64 = double(by[{64, 3}].persistent);
    check(z3_64 >= 14.0 * params / 64 * 0.99 && z3_64 <= 14.0 * params / 64 * 1.01,
          name + ": ZeRO-3 persistent bytes on 64 devices are " + std::to_string(z3_64) + ", not 14P/64 = " +
              std::to_string(14.0 * params / 64));
  }
  print_table({"model", "N", "ZeRO", "memplan total GiB", "persistent states", "grads@peak", "activations@peak", "comm@peak",
               "ZeRO paper (2+2+K)P", "DeepSpeed estimate", "plan s"},
              table);
  write_json(out_path, {{"bench", "zero_fit"},
                        {"dtype", "bf16"},
                        {"optimizer", "adamw"},
                        {"per_device_batch", 1},
                        {"device_profile", "cuda"},
                        {"rows", rows}});
  return 0;
}
