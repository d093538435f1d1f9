// The op order search (planner/order_search.h) on every zoo model at its defaults, the reference
// models, GPT-2 124M (T 1024, batch 8, fp32), Llama-3.2-1B (T 2048, batch 8, bf16, the CUDA
// profile) and checkpointed steps (sqrt, and optimal's least arena): the arena in the
// memory-aware order, in the searched order (and how many ops it moved), and as --schedule auto
// keeps it, beside the previous binary's (MEMPLAN_BASELINE_CLI, when given), which must not be
// smaller. Then the time `plan` takes for GPT-2 XL with the search, and GPT-2's largest batch in
// 80 GiB per checkpoint strategy, both binaries side by side.
//
//   [MEMPLAN_BASELINE_CLI=/path/to/an/older/memplan] bench_order_search [--json-out FILE] [--only TEXT]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_util.h"
#include "memplan/models/zoo.h"

namespace memplan::bench {
namespace {

struct Case {
  std::string label;
  std::string args;  // plan's model flags
};

nlohmann::json json_or_die(const std::string& cli, const std::string& command) {
  return cli_json_or_exit("bench_order_search", cli, command);
}

std::string mib(double bytes) { return fmt(bytes / double(1ull << 20), 1); }

int run(int argc, char** argv) {
  std::string json_out = "bench_order_search.json", only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_order_search [--json-out FILE] [--only TEXT]\n");
      return 2;
    }
  }
  std::vector<Case> cases = {
      {"gpt2 T1024 b8 fp32", "--model gpt2 --seq 1024 --batch 8"},
      {"gpt2 T1024 b8 fp32, sqrt", "--model gpt2 --seq 1024 --batch 8 --checkpoint sqrt"},
      {"llama-1b T2048 b8 bf16 (cuda)", "--model llama-1b --seq 2048 --batch 8 --dtype bf16 --device cuda"},
  };
  for (const models::ZooModel& z : models::zoo_models()) cases.push_back({z.name + " (defaults)", "--model " + z.name});
  for (const char* m : {"mlp", "cnn", "gpt"}) cases.push_back({std::string(m) + " (defaults)", std::string("--model ") + m});
  for (const char* m : {"cnn", "gpt"}) {
    for (const char* strategy : {"sqrt", "optimal"}) {
      cases.push_back({std::string(m) + " (defaults), " + strategy, std::string("--model ") + m + " --checkpoint " + strategy});
    }
  }
  if (!only.empty()) std::erase_if(cases, [&](const Case& c) { return c.label.find(only) == std::string::npos; });
  const char* baseline_env = std::getenv("MEMPLAN_BASELINE_CLI");
  const std::string baseline = baseline_env != nullptr ? baseline_env : "";

  std::vector<std::vector<std::string>> rows;
  nlohmann::json results = nlohmann::json::array();
  bool grew = false;
  int lowered = 0;
  for (const Case& c : cases) {
    const nlohmann::json aware = json_or_die(MEMPLAN_CLI_PATH, "plan " + c.args + " --schedule memory_aware");
    const nlohmann::json searched = json_or_die(MEMPLAN_CLI_PATH, "plan " + c.args + " --schedule searched");
    const nlohmann::json chosen = json_or_die(MEMPLAN_CLI_PATH, "plan " + c.args);
    const auto aware_bytes = aware["arena_bytes"].get<std::int64_t>();
    const auto searched_bytes = searched["arena_bytes"].get<std::int64_t>();
    const auto arena = chosen["arena_bytes"].get<std::int64_t>();
    const int moves = searched["op_order"].value("moves", 0);
    if (arena > aware_bytes) {
      std::fprintf(stderr, "check failed: %s: auto planned %lld bytes, more than the memory-aware order's %lld\n",
                   c.label.c_str(), static_cast<long long>(arena), static_cast<long long>(aware_bytes));
      return 1;
    }
    lowered += searched_bytes < aware_bytes ? 1 : 0;
    nlohmann::json r{{"model", c.label},          {"args", c.args},
                     {"memory_aware_arena_bytes", aware_bytes}, {"searched_arena_bytes", searched_bytes},
                     {"searched_moves", moves},    {"arena_bytes", arena},
                     {"schedule", chosen["schedule"]}};
    std::string before = "-", change = "-";
    if (!baseline.empty()) {
      const auto old_arena = json_or_die(baseline, "plan " + c.args)["arena_bytes"].get<std::int64_t>();
      r["baseline_arena_bytes"] = old_arena;
      before = mib(double(old_arena));
      change = fmt(double(arena) / double(old_arena), 4);
      if (arena > old_arena) {
        grew = true;
        std::fprintf(stderr, "check failed: %s: the arena grew from %lld to %lld bytes\n", c.label.c_str(),
                     static_cast<long long>(old_arena), static_cast<long long>(arena));
      }
    }
    rows.push_back({c.label, before, mib(double(aware_bytes)), mib(double(searched_bytes)) + " (" + std::to_string(moves) + " moved)",
                    mib(double(arena)), chosen["schedule"].get<std::string>(), change});
    results.push_back(r);
  }
  print_table({"step", "arena before (MiB)", "memory-aware (MiB)", "searched (MiB)", "auto now (MiB)", "order used", "now / before"}, rows);
  std::printf("\nthe searched order is below the memory-aware one on %d of %zu steps\n", lowered, cases.size());

  // Planning time with the search, and the largest batches: each binary, alternating, twice;
  // the faster of each binary's two runs.
  nlohmann::json timings = nlohmann::json::array();
  std::vector<std::vector<std::string>> timing_rows;
  const std::vector<std::pair<std::string, std::string>> timed = {
      {"plan gpt2-xl T1024 b8", "plan --model gpt2-xl --seq 1024 --batch 8"},
      {"fit gpt2 T1024 80GiB --max-batch", "fit --model gpt2 --seq 1024 --device-memory 80GiB --max-batch"},
  };
  for (const auto& [label, command] : timed) {
    if (!only.empty() && label.find(only) == std::string::npos) continue;
    std::vector<std::string> clis = {MEMPLAN_CLI_PATH};
    if (!baseline.empty()) clis.push_back(baseline);
    std::vector<double> best(clis.size(), 1e300);
    std::vector<nlohmann::json> answers(clis.size());
    for (int round = 0; round < 2; ++round) {
      for (std::size_t k = 0; k < clis.size(); ++k) {
        const double ms = time_ms([&] { answers[k] = json_or_die(clis[k], command); });
        best[k] = std::min(best[k], ms);
      }
    }
    auto answer_of = [](const nlohmann::json& j) {
      if (j.contains("max_batch_by_checkpoint")) return j["max_batch_by_checkpoint"].dump();
      return std::to_string(j["arena_bytes"].get<std::int64_t>()) + " B";
    };
    nlohmann::json t{{"what", label}, {"command", command}, {"seconds", best[0] / 1000.0}, {"answer", answers[0]}};
    if (!baseline.empty()) {
      t["baseline_seconds"] = best[1] / 1000.0;
      t["baseline_answer"] = answers[1];
    }
    timing_rows.push_back({label, fmt(best[0] / 1000.0, 2), baseline.empty() ? "-" : fmt(best[1] / 1000.0, 2), answer_of(answers[0]),
                           baseline.empty() ? "-" : answer_of(answers[1])});
    timings.push_back(t);
  }
  if (!timing_rows.empty()) {
    std::printf("\n");
    print_table({"command", "now (s)", "before (s)", "answer now", "answer before"}, timing_rows);
  }
  write_json(json_out, {{"baseline_cli", baseline}, {"cases", results}, {"timings", timings}});
  return grew ? 1 : 0;
}

}  // namespace
}  // namespace memplan::bench

int main(int argc, char** argv) { return memplan::bench::run(argc, argv); }
