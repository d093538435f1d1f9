// memplan on the GPU, for bench/gpu/run.sh: per reference model (and GPT-2 124M), the planned
// training step's median time on the CUDA device, the arena (exact, from the plan) against the
// device memory actually consumed (cudaMemGetInfo before/after), device allocations during steps,
// and the largest batch whose arena fits a budget (the same budget the PyTorch side gets through
// set_per_process_memory_fraction). Checks before it times: the loss is finite and falls over
// the timed steps' data, and the planned run allocates nothing during steps.
// Usage: bench_gpu_step [--out FILE.json] [--quick]   (exits 2 without a GPU)
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/fit.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/virtual_memory.h"

namespace memplan::bench {
namespace {

constexpr Bytes kGiB = Bytes{1} << 30;

struct Case {
  std::string name;
  models::ModelOptions model;
  std::int64_t batch;
  int steps;
  Bytes budget_bytes;          // for the largest-batch search
  std::int64_t batch_limit;    // searches stop here (both sides)
};

std::vector<Case> cases(bool quick) {
  std::vector<Case> out;
  models::ModelOptions mlp;
  mlp.name = "mlp";
  out.push_back({"mlp 784-256-256-10", mlp, 128, 50, kGiB / 4, 1 << 18});
  models::ModelOptions cnn;
  cnn.name = "cnn";
  out.push_back({"cnn (ResNet, 28x28)", cnn, 64, 30, 2 * kGiB, 1 << 12});
  models::ModelOptions gpt;
  gpt.name = "gpt";
  out.push_back({"gpt (char, T=64, 2x128)", gpt, 32, 30, 2 * kGiB, 1 << 12});
  if (!quick) {
    models::ModelOptions gpt2;
    gpt2.name = "gpt";
    gpt2.gpt = {50257, 1024, 12, 12, 768, 0.0f, true};
    out.push_back({"GPT-2 124M (T=1024)", gpt2, 8, 10, 40 * kGiB, 256});
  }
  return out;
}

planner::StepDescription training_step(const models::ModelOptions& model, std::int64_t batch) {
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::adamw;
  opt.lr = 1e-4f;
  return planner::StepDescription::of_source(models::registry_source(model), batch, opt);
}

// Random inputs of the right kind for a model's "x" and "labels".
void feed(const graph::Graph& g, runtime::Executor& exec, Rng& rng) {
  const graph::TensorDesc& x = g.tensor(g.find("x"));
  const auto classes = static_cast<std::uint64_t>(g.tensor(g.output).shape[1]);
  std::vector<std::int32_t> y(static_cast<std::size_t>(g.tensor(g.find("labels")).shape.numel()));
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(classes));
  if (x.dtype == graph::DType::i32) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(x.shape.numel()));
    for (auto& v : ids) v = static_cast<std::int32_t>(rng.below(classes));
    exec.set_input(g.find("x"), ids.data(), x.size_bytes());
  } else {
    std::vector<float> xf(static_cast<std::size_t>(x.shape.numel()));
    for (float& v : xf) v = rng.uniform(-1.0f, 1.0f);
    exec.set_input(g.find("x"), xf.data(), x.size_bytes());
  }
  exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
}

int run(int argc, char** argv) {
  std::string out_path = "bench/results/gpu_memplan.json";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
    else if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else {
      std::fprintf(stderr, "bench_gpu_step: unknown argument '%s' (expected --out FILE, --quick)\n", argv[i]);
      return 2;
    }
  }
  if (!runtime::cuda_device_present()) {
    std::fprintf(stderr, "bench_gpu_step: no CUDA GPU on this machine (or memplan built without CUDA); nothing to measure\n");
    return 2;
  }
  auto device = runtime::make_device(kernels::DeviceKind::cuda).value();
  const auto* query = dynamic_cast<const runtime::DeviceMemoryQuery*>(device.get());
  const planner::DeviceProfile profile = runtime::device_profile(*device);

  nlohmann::json results = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const Case& c : cases(quick)) {
    const planner::PlannedStep planned = runtime::plan_step_for(training_step(c.model, c.batch), *device).value();
    const graph::Graph& g = planned.graph;
    const runtime::DeviceMemoryInfo before = query->memory_info();
    runtime::Executor exec(planned, *device);
    if (Status s = exec.setup(); !s) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), s.error().message.c_str());
      return 1;
    }
    exec.initialize_persistent(1);
    Rng rng(3);
    feed(g, exec, rng);  // one batch, repeated: the loss must fall on it
    std::vector<double> ms;
    float first_loss = 0.0f, last_loss = 0.0f;
    const int warmup = 3;
    for (int s = 0; s < warmup + c.steps; ++s) {
      const double t = time_ms([&] {
        if (Status st = exec.run_step(); !st) {
          std::fprintf(stderr, "%s: %s\n", c.name.c_str(), st.error().message.c_str());
          std::exit(1);
        }
      });
      last_loss = exec.read_scalar(g.loss);
      if (s == 0) first_loss = last_loss;
      if (s >= warmup) ms.push_back(t);
    }
    const runtime::DeviceMemoryInfo after = query->memory_info();
    if (!std::isfinite(last_loss) || !(last_loss < first_loss)) {
      std::fprintf(stderr, "%s: the loss did not fall on a repeated batch (%g -> %g)\n", c.name.c_str(), first_loss, last_loss);
      return 1;
    }
    if (exec.device_allocations_during_steps() != 0) {
      std::fprintf(stderr, "%s: %lld device allocations during planned steps\n", c.name.c_str(),
                   static_cast<long long>(exec.device_allocations_during_steps()));
      return 1;
    }
    const planner::MemoryPlan& plan = *exec.plan();
    const Bytes measured_delta = before.free_bytes - after.free_bytes;
    const Bytes used_total = after.total_bytes - after.free_bytes;

    // The largest batch whose arena fits the budget (PyTorch's fraction caps its allocator the
    // same way; neither side counts the CUDA context).
    auto fits_at = [&](std::int64_t batch) -> Result<bool> {
      planner::PlanRequest request;
      request.budget = c.budget_bytes;
      request.answer_only = true;
      auto p = runtime::plan_step_for(training_step(c.model, batch), *device, request);
      if (!p) return p.error();
      return p.value().fits;
    };
    const auto search = planner::search_max_batch(fits_at, c.batch_limit).value();

    nlohmann::json j;
    j["model"] = c.name;
    j["batch"] = c.batch;
    j["steps"] = c.steps;
    j["step_ms_median"] = median(ms);
    j["first_loss"] = first_loss;
    j["last_loss"] = last_loss;
    j["arena_bytes"] = plan.arena_bytes;
    j["workspace_bytes"] = plan.workspace_bytes;
    j["measured_device_bytes_delta"] = measured_delta;  // free before setup - free after the steps
    j["device_used_bytes_total"] = used_total;          // whole device, CUDA context included
    j["fit_predicted_total_bytes"] = profile.total_bytes(plan.arena_bytes);  // as memplan fit --device cuda counts it
    j["device_allocations_during_steps"] = exec.device_allocations_during_steps();
    j["budget_bytes"] = c.budget_bytes;
    j["batch_limit"] = c.batch_limit;
    j["max_batch_planned"] = search.max_batch;
    results.push_back(j);
    rows.push_back({c.name, std::to_string(c.batch), fmt(median(ms), 2), fmt(double(plan.arena_bytes) / double(1 << 20), 1),
                    fmt(double(measured_delta) / double(1 << 20), 1), std::to_string(search.max_batch)});
  }
  print_table({"model", "batch", "step ms", "arena MiB", "measured MiB", "max batch (plan)"}, rows);
  nlohmann::json doc;
  doc["device"] = device->name();
  doc["results"] = results;
  write_json(out_path, doc);
  return 0;
}

}  // namespace
}  // namespace memplan::bench

int main(int argc, char** argv) { return memplan::bench::run(argc, argv); }
