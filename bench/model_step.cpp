// Training-step time (forward, backward, AdamW) of memplan's three reference models beside the
// same models in PyTorch eager (bench/torch_model_step.py, Debian's python3-torch) when it is
// installed: each thread count, interleaved round by round in one run so machine noise hits both
// alike, each side at its best thread count, and the shared-machine case: the MLP step with
// competing busy processes on the cores against the same step without them. There the steps'
// times are far apart (most steps run as if alone, some wait out a busy process's time slice), so
// it reports the mean step time (the throughput a training job gets) beside the median.
//
//   bench_model_step [--models mlp,cnn,gpt] [--threads 1,2] [--rounds 3] [--steps-scale 1.0]
//                    [--busy 2] [--json-out bench_model_step.json] [--no-torch] [--python /usr/bin/python3]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_ref.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace {

using namespace memplan;

struct ModelCase {
  std::string name;
  std::string shape;  // for the table
  std::int64_t batch;
  int steps;  // timed steps per measurement
};

// The reference shapes: each model's `memplan train` defaults.
const ModelCase kModels[] = {
    {"mlp", "MLP 784-256-256-10, batch 128", 128, 100},
    {"cnn", "CNN (ResNet 16/32/64) 1x28x28, batch 64", 64, 8},
    {"gpt", "GPT (2 x 128, 4 heads, T 64, V 96), batch 32", 32, 10},
};

struct Options {
  std::vector<std::string> models = {"mlp", "cnn", "gpt"};
  std::vector<int> threads = {1, 2};
  int rounds = 3;
  double steps_scale = 1.0;
  int busy = 2;
  std::string json_out = "bench_model_step.json";
  bool torch = true;
  std::string python = "/usr/bin/python3";
};

// The model as a user names it (memplan train --model NAME): mlp 784-256-256-10; cnn widths
// 16/32/64 on 28x28; gpt 2 x 128, T 64, its vocabulary fixed at 96 (the PyTorch side's) rather
// than read from the fortunes.
planner::StepDescription model_step(const ModelCase& mc, const graph::OptimizerConfig& opt) {
  models::ModelRef ref;
  ref.name = mc.name;
  ref.batch = mc.batch;
  if (mc.name == "gpt") ref.vocab = 96;
  auto resolved = models::resolve_model(ref, opt);
  if (!resolved) throw std::runtime_error(mc.name + ": " + resolved.error().message);
  return std::move(resolved.value().step);
}

int scaled(int steps, const Options& o) { return std::max(2, static_cast<int>(std::lround(steps * o.steps_scale))); }

struct StepTimes {
  double median_ms = -1.0, mean_ms = -1.0;
};

// Step times of memplan's planned executor at `threads`; checks first that a few steps on a fixed
// batch lower the loss.
StepTimes ours_times(const ModelCase& mc, int threads, const Options& o) {
  kernels::set_cpu_threads(threads);
  graph::OptimizerConfig opt;  // AdamW, lr 1e-3, as the PyTorch side
  runtime::CpuDevice device;
  const planner::PlannedStep planned =
      runtime::plan_step_for(model_step(mc, opt), device).value();
  const graph::Graph& g = planned.graph;
  runtime::Executor exec(planned, device);
  if (!exec.setup().ok()) throw std::runtime_error("setup failed");
  exec.initialize_persistent(0);
  Rng rng(1);
  const graph::TensorDesc& xd = g.tensor(g.find("x"));
  const graph::TensorDesc& yd = g.tensor(g.find("labels"));
  const auto classes = static_cast<std::uint64_t>(g.tensor(g.output).shape[1]);
  if (xd.dtype == graph::DType::i32) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(xd.shape.numel()));
    for (auto& v : ids) v = static_cast<std::int32_t>(rng.below(classes));
    exec.set_input(g.find("x"), ids.data(), xd.size_bytes());
  } else {
    std::vector<float> x(static_cast<std::size_t>(xd.shape.numel()));
    for (float& v : x) v = rng.uniform01();
    exec.set_input(g.find("x"), x.data(), xd.size_bytes());
  }
  std::vector<std::int32_t> y(static_cast<std::size_t>(yd.shape.numel()));
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(classes));
  exec.set_input(g.find("labels"), y.data(), yd.size_bytes());
  float first = 0, last = 0;
  for (int i = 0; i < 3; ++i) {
    if (!exec.run_step().ok()) throw std::runtime_error("step failed");
    last = exec.read_scalar(g.loss);
    if (i == 0) first = last;
  }
  if (!std::isfinite(last) || !(last < first)) {
    throw std::runtime_error("check failed: " + mc.name + "'s loss did not decrease on a fixed batch (" +
                             std::to_string(first) + " -> " + std::to_string(last) + ")");
  }
  std::vector<double> times;
  for (int i = 0; i < scaled(mc.steps, o); ++i) times.push_back(bench::time_ms([&] { (void)exec.run_step(); }));
  double sum = 0.0;
  for (double t : times) sum += t;
  return {bench::median(times), sum / static_cast<double>(times.size())};
}

double ours_ms(const ModelCase& mc, int threads, const Options& o) { return ours_times(mc, threads, o).median_ms; }

// Runs the PyTorch script; negative values when torch is unavailable or the run failed.
StepTimes torch_times(const ModelCase& mc, int threads, const Options& o, std::string& version) {
  std::ostringstream cmd;
  cmd << o.python << " " << MEMPLAN_SOURCE_DIR << "/bench/torch_model_step.py --model " << mc.name << " --batch "
      << mc.batch << " --steps " << scaled(mc.steps, o) << " --warmup 3 --threads " << threads << " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.str().c_str(), "r"), pclose);
  if (!pipe) return {};
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), pipe.get())) out += buf;
  try {
    auto j = nlohmann::json::parse(out);
    version = j["torch_version"].get<std::string>() + ", BLAS " + j.value("blas", std::string("unknown"));
    if (!(j["final_loss"].get<double>() < j["first_loss"].get<double>())) return {};
    return {j["step_time_ms_median"].get<double>(), j["step_time_ms_mean"].get<double>()};
  } catch (const std::exception&) {
    return {};
  }
}

double torch_ms(const ModelCase& mc, int threads, const Options& o, std::string& version) {
  return torch_times(mc, threads, o, version).median_ms;
}

// Busy processes competing for the cores while alive (each a spinning child).
class BusyProcesses {
 public:
  explicit BusyProcesses(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        volatile unsigned long spin = 0;
        for (;;) spin = spin + 1;
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~BusyProcesses() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

 private:
  std::vector<pid_t> pids_;
};

Options parse(int argc, char** argv) {
  Options o;
  auto split = [](const std::string& s) {
    std::vector<std::string> items;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');) items.push_back(item);
    return items;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--models") {
      o.models = split(next());
      for (const std::string& m : o.models) {
        if (m != "mlp" && m != "cnn" && m != "gpt") throw std::invalid_argument("--models takes mlp, cnn, gpt; got " + m);
      }
    } else if (a == "--threads") {
      o.threads.clear();
      for (const std::string& t : split(next())) o.threads.push_back(std::stoi(t));
    } else if (a == "--rounds") o.rounds = std::stoi(next());
    else if (a == "--steps-scale") o.steps_scale = std::stod(next());
    else if (a == "--busy") o.busy = std::stoi(next());
    else if (a == "--json-out") o.json_out = next();
    else if (a == "--no-torch") o.torch = false;
    else if (a == "--python") o.python = next();
    else throw std::invalid_argument("unknown flag " + a + " (see the comment at the top of bench/model_step.cpp)");
  }
  if (o.rounds < 1 || o.threads.empty() || o.steps_scale <= 0.0) throw std::invalid_argument("nothing to measure");
  return o;
}

std::string cell(double ms) { return ms > 0 ? bench::fmt(ms, 1) : "-"; }
std::string ratio(double ours, double theirs) { return ours > 0 && theirs > 0 ? bench::fmt(ours / theirs, 2) : "-"; }

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model_step: %s\n", e.what());
    return 2;
  }
  std::string torch_version;
  if (o.torch) {
    torch_ms(kModels[0], 1, Options{.steps_scale = 0.02, .python = o.python}, torch_version);
    if (torch_version.empty()) {
      std::printf("PyTorch not available (%s -c 'import torch' failed: install Debian's python3-torch); memplan only\n\n",
                  o.python.c_str());
      o.torch = false;
    }
  }
  std::printf("AdamW step on the CPU, median step time per round, median of %d interleaved rounds\n\n", o.rounds);
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows, best_rows;
  bool all_within_target = o.torch;
  for (const ModelCase& mc : kModels) {
    if (std::find(o.models.begin(), o.models.end(), mc.name) == o.models.end()) continue;
    std::map<int, std::vector<double>> ours, theirs;
    for (int r = 0; r < o.rounds; ++r) {
      for (int t : o.threads) {
        try {
          ours[t].push_back(ours_ms(mc, t, o));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench_model_step: %s\n", e.what());
          return 1;
        }
        if (o.torch) {
          const double ms = torch_ms(mc, t, o, torch_version);
          if (ms > 0) theirs[t].push_back(ms);
        }
      }
    }
    nlohmann::json per_threads = nlohmann::json::array();
    double best_ours = -1, best_theirs = -1;
    int best_ours_t = 0, best_theirs_t = 0;
    for (int t : o.threads) {
      const double a = bench::median(ours[t]);
      const double b = theirs[t].empty() ? -1.0 : bench::median(theirs[t]);
      if (best_ours < 0 || a < best_ours) best_ours = a, best_ours_t = t;
      if (b > 0 && (best_theirs < 0 || b < best_theirs)) best_theirs = b, best_theirs_t = t;
      if (b > 0 && a > b) all_within_target = false;
      rows.push_back({mc.shape, std::to_string(t), cell(a), cell(b), ratio(a, b)});
      nlohmann::json j{{"threads", t}, {"memplan_ms", a}, {"memplan_rounds_ms", ours[t]}};
      if (b > 0) j.update({{"torch_ms", b}, {"torch_rounds_ms", theirs[t]}, {"memplan_over_torch", a / b}});
      per_threads.push_back(j);
    }
    if (best_theirs > 0 && best_ours > 0.8 * best_theirs) all_within_target = false;
    best_rows.push_back({mc.shape, cell(best_ours) + " (" + std::to_string(best_ours_t) + ")",
                         best_theirs > 0 ? cell(best_theirs) + " (" + std::to_string(best_theirs_t) + ")" : "-",
                         ratio(best_ours, best_theirs)});
    nlohmann::json m{{"model", mc.name}, {"shape", mc.shape}, {"batch", mc.batch}, {"steps", scaled(mc.steps, o)},
                     {"by_threads", per_threads}, {"memplan_best_ms", best_ours}, {"memplan_best_threads", best_ours_t}};
    if (best_theirs > 0) {
      m.update({{"torch_best_ms", best_theirs}, {"torch_best_threads", best_theirs_t},
                {"memplan_over_torch_best", best_ours / best_theirs}});
    }
    results.push_back(m);
  }
  bench::print_table({"model", "threads", "memplan ms", "PyTorch ms", "memplan / PyTorch"}, rows);
  std::printf("\nEach side at its best thread count (threads in brackets):\n\n");
  bench::print_table({"model", "memplan ms", "PyTorch ms", "memplan / PyTorch"}, best_rows);

  // The shared machine: the MLP at the largest thread count with `busy` spinning processes.
  nlohmann::json shared;
  if (o.busy > 0) {
    const ModelCase& mlp = kModels[0];
    const int t = *std::max_element(o.threads.begin(), o.threads.end());
    // At least 5 rounds: which rounds the scheduler treats well varies.
    const int rounds = std::max(o.rounds, 5);
    std::vector<double> quiet_mean, quiet_median, busy_mean, busy_median, torch_quiet, torch_busy;
    kernels::cpu::reset_parallel_stats();
    for (int r = 0; r < rounds; ++r) {
      const StepTimes q = ours_times(mlp, t, o);
      quiet_mean.push_back(q.mean_ms);
      quiet_median.push_back(q.median_ms);
      if (o.torch) torch_quiet.push_back(torch_times(mlp, t, o, torch_version).mean_ms);
      BusyProcesses busy(o.busy);
      const StepTimes l = ours_times(mlp, t, o);
      busy_mean.push_back(l.mean_ms);
      busy_median.push_back(l.median_ms);
      if (o.torch) torch_busy.push_back(torch_times(mlp, t, o, torch_version).mean_ms);
    }
    const kernels::cpu::ParallelStats pool = kernels::cpu::parallel_stats();
    const double qm = bench::median(quiet_mean), lm = bench::median(busy_mean);
    const double qd = bench::median(quiet_median), ld = bench::median(busy_median);
    std::printf("\nShared machine: %s at %d threads with %d busy processes on the cores, median of %d rounds of "
                "the mean step time (and of the median step)\n\n", mlp.shape.c_str(), t, o.busy, rounds);
    std::vector<std::vector<std::string>> srows = {
        {"memplan", cell(qm) + " (" + cell(qd) + ")", cell(lm) + " (" + cell(ld) + ")",
         bench::fmt(lm / qm, 2) + "x (" + bench::fmt(ld / qd, 2) + "x)"}};
    shared = {{"model", "mlp"}, {"threads", t}, {"busy_processes", o.busy}, {"rounds", rounds},
              {"memplan_quiet_ms", qm}, {"memplan_busy_ms", lm}, {"memplan_slowdown", lm / qm},
              {"memplan_quiet_median_step_ms", qd}, {"memplan_busy_median_step_ms", ld},
              {"memplan_slowdown_median_step", ld / qd}, {"memplan_quiet_rounds_ms", quiet_mean},
              {"memplan_busy_rounds_ms", busy_mean},
              {"memplan_pool", {{"loops_across_threads", pool.loops_across_threads},
                                {"stalled_loops", pool.stalls}}}};
    if (o.torch) {
      const double tq = bench::median(torch_quiet), tl = bench::median(torch_busy);
      srows.push_back({"PyTorch", cell(tq), cell(tl), tq > 0 && tl > 0 ? bench::fmt(tl / tq, 2) + "x" : "-"});
      shared.update({{"torch_quiet_ms", tq}, {"torch_busy_ms", tl}, {"torch_quiet_rounds_ms", torch_quiet},
                     {"torch_busy_rounds_ms", torch_busy}});
    }
    bench::print_table({"", "ms without", "ms with busy processes", "slowdown"}, srows);
    std::printf("\nmemplan's thread pool: %lld loops across threads, %lld of them stalled over 1 ms on a thread "
                "that was not running\nshared-machine target (mean step at most 3x its time alone): %s\n",
                static_cast<long long>(pool.loops_across_threads), static_cast<long long>(pool.stalls),
                lm <= 3.0 * qm ? "met" : "not met");
  }
  std::printf("\nPyTorch: %s\n", o.torch ? torch_version.c_str() : "not measured");
  if (o.torch && torch_version.find("/blas/libblas") != std::string::npos) {
    std::printf("warning: PyTorch ran on the reference BLAS, far slower than its usual GEMMs: install Debian's "
                "libopenblas0 for a fair comparison\n");
  }
  if (o.torch) {
    std::printf("target (memplan <= 0.8x PyTorch at each side's best thread count, <= 1.0x at every count): %s\n",
                all_within_target ? "met" : "not met");
  }
  bench::write_json(o.json_out, {{"benchmark", "model_step"}, {"optimizer", "adamw lr 1e-3"}, {"rounds", o.rounds},
                                 {"torch", o.torch ? torch_version : "not measured"}, {"results", results},
                                 {"shared_machine", shared}});
  return 0;
}
