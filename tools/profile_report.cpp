// Step profile rendering (see profile_report.h).
#include "tools/profile_report.h"

#include <cstdio>
#include <string>
#include <vector>

#include "memplan/kernels/cpu/parallel.h"

namespace memplan::tools {

nlohmann::json cpu_pool_json() {
  const kernels::cpu::ParallelStats s = kernels::cpu::parallel_stats();
  return {{"loops_across_threads", s.loops_across_threads}, {"stalled_loops", s.stalls}};
}

namespace {

std::string fixed(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

std::string rate(double gflops_per_s) { return gflops_per_s > 0.0 ? fixed(gflops_per_s, 1) : "-"; }

// "conv2d", "conv2d or conv2d_backward_weight", ...
std::string kind_list(const std::vector<graph::OpKind>& kinds) {
  std::string out;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + std::string(graph::op_name(kinds[i]));
  }
  return out;
}

}  // namespace

std::string profile_text(const runtime::StepProfile& p) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "profile: mean of %lld step%s: %.3f ms per step = ops %.3f ms + inputs and executor %.3f ms; "
                "%.3f GFLOP per step\n\n",
                static_cast<long long>(p.steps), p.steps == 1 ? "" : "s", p.step_ms, p.ops_ms, p.other_ms,
                p.flops * 1e-9);
  out += line;
  out += "| op kind | ops | ms/step | share | GFLOP/s |\n| --- | --- | --- | --- | --- |\n";
  std::string fused_notes;
  for (const runtime::KindTime& k : p.kinds) {
    out += "| " + std::string(graph::op_name(k.kind)) + " | " + std::to_string(k.ops) + " | " + fixed(k.ms, 3) +
           " | " + fixed(100.0 * k.share, 1) + "% | " + rate(k.gflops_per_s()) + " |\n";
    if (k.timed_elsewhere > 0) {
      fused_notes += std::string(graph::op_name(k.kind)) + ": " + std::to_string(k.timed_elsewhere) + " of " +
                     std::to_string(k.ops) + " ran fused with " + kind_list(k.timed_in) +
                     ", their time counted there\n";
    }
  }
  if (!fused_notes.empty()) out += "\n" + fused_notes;
  out += "\nslowest ops:\n\n| op | kind | ms/step | share | GFLOP/s |\n| --- | --- | --- | --- | --- |\n";
  for (int i : p.slowest) {
    const runtime::OpTime& t = p.ops[static_cast<std::size_t>(i)];
    out += "| " + t.name + " | " + std::string(graph::op_name(t.kind)) + " | " + fixed(t.ms, 3) + " | " +
           fixed(100.0 * t.share, 1) + "% | " + rate(t.gflops_per_s()) + " |\n";
  }
  return out;
}

nlohmann::json profile_json(const runtime::StepProfile& p) {
  nlohmann::json j;
  j["steps"] = p.steps;
  j["step_ms"] = p.step_ms;
  j["ops_ms"] = p.ops_ms;
  j["other_ms"] = p.other_ms;
  j["gflop_per_step"] = p.flops * 1e-9;
  auto with_rate = [](nlohmann::json& row, double flops, double gflops_per_s) {
    if (flops <= 0.0) return;
    row["gflop"] = flops * 1e-9;
    row["gflops_per_s"] = gflops_per_s;
  };
  nlohmann::json kinds = nlohmann::json::array();
  for (const runtime::KindTime& k : p.kinds) {
    nlohmann::json row{{"kind", graph::op_name(k.kind)}, {"ops", k.ops}, {"ms", k.ms}, {"share", k.share}};
    with_rate(row, k.flops, k.gflops_per_s());
    if (k.timed_elsewhere > 0) {
      nlohmann::json within = nlohmann::json::array();
      for (graph::OpKind kind : k.timed_in) within.push_back(graph::op_name(kind));
      row["timed_within"] = within;
      row["ops_timed_within"] = k.timed_elsewhere;
    }
    kinds.push_back(row);
  }
  j["kinds"] = kinds;
  nlohmann::json ops = nlohmann::json::array();
  for (const runtime::OpTime& t : p.ops) {
    nlohmann::json row{{"op", t.name}, {"kind", graph::op_name(t.kind)}, {"ms", t.ms}, {"share", t.share}};
    with_rate(row, t.flops, t.gflops_per_s());
    ops.push_back(row);
  }
  j["ops"] = ops;
  nlohmann::json slowest = nlohmann::json::array();
  for (int i : p.slowest) slowest.push_back(p.ops[static_cast<std::size_t>(i)].name);
  j["slowest"] = slowest;
  return j;
}

}  // namespace memplan::tools
