// Shared by the benchmarks: median timing, markdown tables, JSON output, the activations a
// training step keeps for its backward pass.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/graph/graph.h"
#include "memplan/graph/training_step.h"

namespace memplan::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

template <typename F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Prints a markdown table: a header row and rows of already-formatted cells.
inline void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  auto line = [](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (const std::string& c : cells) s += " " + c + " |";
    std::puts(s.c_str());
  };
  line(header);
  std::vector<std::string> sep(header.size(), "---");
  line(sep);
  for (const auto& r : rows) line(r);
}

inline std::string fmt(double v, int precision = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

// A memplan command run as a user runs it (`cli` COMMAND ARGS, stderr dropped): its exit code,
// standard output and wall time.
struct CliRun {
  int exit_code = -1;
  std::string output;
  double ms = 0.0;
};
inline CliRun run_cli(const std::string& cli, const std::string& command_and_args) {
  CliRun r;
  const std::string cmd = cli + " " + command_and_args + " 2>/dev/null";
  r.ms = time_ms([&] {
    FILE* pipe = popen(cmd.c_str(), "r");
    if (pipe == nullptr) return;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  });
  return r;
}

// `cli command --json`'s answer; a failed command or an answer that is not JSON ends the bench
// `bench` (exit 1), naming the command.
inline nlohmann::json cli_json_or_exit(const char* bench, const std::string& cli, const std::string& command) {
  const CliRun r = run_cli(cli, command + " --json");
  if (r.exit_code != 0 || !nlohmann::json::accept(r.output)) {
    std::fprintf(stderr, "%s: '%s %s --json' failed (exit %d)\n", bench, cli.c_str(), command.c_str(), r.exit_code);
    std::exit(1);
  }
  return nlohmann::json::parse(r.output);
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("\nwrote %s\n", path.c_str());
}

// The forward tensors of one layer (names starting with `layer`) that the backward pass reads,
// as "name [shape] dtype" -> bytes, in the training step of `forward` (a view counts as its
// storage; a tensor counts once however many backward ops read it).
struct LayerActivations {
  std::map<std::string, double> bytes;
  double total = 0;
};

inline LayerActivations stored_for_backward(graph::Graph g, const std::string& layer) {
  graph::make_training_step(g, graph::OptimizerConfig{});
  std::vector<bool> read_by_backward(static_cast<std::size_t>(g.num_tensors()), false);
  for (const graph::Op& op : g.ops()) {
    if (op.phase != graph::Phase::backward) continue;
    for (TensorId t : op.inputs) read_by_backward[static_cast<std::size_t>(g.storage_root(t))] = true;
  }
  LayerActivations out;
  for (const graph::Op& op : g.ops()) {
    if (op.phase != graph::Phase::forward || op.outputs.empty()) continue;
    const TensorId t = op.outputs[0];
    const graph::TensorDesc& d = g.tensor(t);
    if (d.is_view() || d.name.rfind(layer, 0) != 0 || !read_by_backward[static_cast<std::size_t>(t)]) continue;
    out.bytes[d.name.substr(layer.size()) + " " + d.shape.to_string() + " " + std::string(graph::dtype_name(d.dtype))] +=
        double(d.size_bytes());
    out.total += double(d.size_bytes());
  }
  return out;
}

}  // namespace memplan::bench
