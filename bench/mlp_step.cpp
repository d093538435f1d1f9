// MLP training-step time (forward, backward, AdamW) at several batch sizes, beside the same
// model, batch and optimizer in PyTorch eager (Debian's python3-torch) when it is installed,
// interleaved round by round in one run so machine noise hits both alike.
//
//   bench_mlp_step [--batches 128,512] [--steps 200] [--rounds 3] [--json-out bench_mlp_step.json]
//                  [--no-torch] [--python /usr/bin/python3]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/mlp.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace {

using namespace memplan;

struct Options {
  std::vector<std::int64_t> batches = {128, 512};
  int steps = 200;
  int warmup = 20;
  int rounds = 3;
  std::string json_out = "bench_mlp_step.json";
  bool torch = true;
  std::string python = "/usr/bin/python3";
};

// Median step time of our executor; checks first that training on the batch lowers the loss.
double ours_ms(std::int64_t batch, const Options& o) {
  graph::OptimizerConfig opt;  // AdamW, lr 1e-3, as the PyTorch side
  runtime::CpuDevice device;
  const planner::PlannedStep planned =
      runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(models::ModelOptions{}), batch, opt), device).value();
  const graph::Graph& g = planned.graph;
  runtime::Executor exec(planned, device);  // planned, the default
  if (!exec.setup().ok()) throw std::runtime_error("setup failed");
  exec.initialize_persistent(0);
  Rng rng(1);
  std::vector<float> x(static_cast<std::size_t>(batch * 784));
  for (float& v : x) v = rng.uniform01();
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(10));
  exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
  float first = 0, last = 0;
  for (int i = 0; i < o.warmup; ++i) {
    if (!exec.run_step().ok()) throw std::runtime_error("step failed");
    last = exec.read_scalar(g.loss);
    if (i == 0) first = last;
  }
  if (!std::isfinite(last) || !(last < first)) {
    throw std::runtime_error("check failed: loss did not decrease on a fixed batch (" +
                             std::to_string(first) + " -> " + std::to_string(last) + ")");
  }
  std::vector<double> times;
  for (int i = 0; i < o.steps; ++i) {
    times.push_back(bench::time_ms([&] { (void)exec.run_step(); }));
  }
  return bench::median(times);
}

// Runs the PyTorch script; returns a negative value when torch is unavailable.
double torch_ms(std::int64_t batch, const Options& o, std::string& version) {
  std::ostringstream cmd;
  cmd << o.python << " " << MEMPLAN_SOURCE_DIR << "/bench/torch_mlp_step.py --batch " << batch
      << " --steps " << o.steps << " --warmup " << o.warmup << " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.str().c_str(), "r"), pclose);
  if (!pipe) return -1.0;
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), pipe.get())) out += buf;
  try {
    auto j = nlohmann::json::parse(out);
    version = j["torch_version"].get<std::string>() + " (" + std::to_string(j["threads"].get<int>()) + " threads)";
    return j["step_time_ms_median"].get<double>();
  } catch (const std::exception&) {
    return -1.0;
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--batches") {
      o.batches.clear();
      std::stringstream ss(next());
      for (std::string item; std::getline(ss, item, ',');) o.batches.push_back(std::stoll(item));
    } else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--rounds") o.rounds = std::stoi(next());
    else if (a == "--json-out") o.json_out = next();
    else if (a == "--no-torch") o.torch = false;
    else if (a == "--python") o.python = next();
    else throw std::invalid_argument("unknown flag " + a + " (see the comment at the top of bench/mlp_step.cpp)");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mlp_step: %s\n", e.what());
    return 2;
  }
  std::printf("MLP 784-256-256-10, AdamW, CPU, %d steps per measurement, %d rounds (median of rounds), %d threads\n\n",
              o.steps, o.rounds, kernels::cpu_threads());
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  std::string torch_version = "not installed";
  for (std::int64_t batch : o.batches) {
    std::vector<double> ours, theirs;
    for (int r = 0; r < o.rounds; ++r) {
      try {
        ours.push_back(ours_ms(batch, o));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_mlp_step: %s\n", e.what());
        return 1;
      }
      if (o.torch) {
        const double t = torch_ms(batch, o, torch_version);
        if (t > 0) theirs.push_back(t);
      }
    }
    const double ours_med = bench::median(ours);
    const double torch_med = theirs.empty() ? -1.0 : bench::median(theirs);
    rows.push_back({std::to_string(batch), bench::fmt(ours_med), torch_med > 0 ? bench::fmt(torch_med) : "-",
                    torch_med > 0 ? bench::fmt(torch_med / ours_med, 2) + "x" : "-",
                    bench::fmt(double(batch) * 1000.0 / ours_med, 0)});
    nlohmann::json j{{"batch", batch}, {"memplan_step_ms_median", ours_med}, {"memplan_rounds_ms", ours}};
    if (torch_med > 0) {
      j["torch_step_ms_median"] = torch_med;
      j["torch_rounds_ms"] = theirs;
      j["speedup_vs_torch"] = torch_med / ours_med;
    }
    results.push_back(j);
  }
  bench::print_table({"batch", "memplan ms/step", "PyTorch ms/step", "PyTorch / memplan", "memplan samples/s"}, rows);
  std::printf("\nPyTorch: %s\n", torch_version.c_str());
  bench::write_json(o.json_out, {{"benchmark", "mlp_step"}, {"model", "mlp 784-256-256-10"},
                                 {"optimizer", "adamw"}, {"steps", o.steps}, {"rounds", o.rounds},
                                 {"threads", kernels::cpu_threads()}, {"torch", torch_version},
                                 {"results", results}});
  return 0;
}
