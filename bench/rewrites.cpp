// The step rewrites that take a plan below the lower bound of the step as first built: the fused
// loss (graph/fusions.h: a language model's logits never stored) and the decoders' one-op
// SwiGLU (its SiLU recomputed, not stored). For GPT-2 124M (T 1024, batch 8, fp32), Llama-3.2-1B
// (T 2048, batch 8, bf16, the CUDA profile), every zoo model at its defaults and the reference
// models: the planned arena now, with the previous binary (MEMPLAN_BASELINE_CLI, when given), and
// against the caching allocator replaying the step as PyTorch eager runs it (logits and SiLU
// outputs stored; three steps, so that the optimizer state it makes at the first update is held).
// Checks first that no arena grew.
//
//   [MEMPLAN_BASELINE_CLI=/path/to/an/older/memplan] bench_rewrites [--json-out FILE] [--only TEXT]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_util.h"
#include "memplan/models/zoo.h"

namespace memplan::bench {
namespace {

struct Case {
  std::string label;
  std::string args;  // the model flags, shared by plan and compare
};

nlohmann::json json_or_die(const std::string& cli, const std::string& command) {
  return cli_json_or_exit("bench_rewrites", cli, command);
}

std::string gib(double bytes) { return fmt(bytes / double(1ull << 30), 2); }

int run(int argc, char** argv) {
  std::string json_out = "bench_rewrites.json", only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_rewrites [--json-out FILE] [--only TEXT]\n");
      return 2;
    }
  }
  std::vector<Case> cases = {
      {"gpt2 T1024 b8 fp32", "--model gpt2 --seq 1024 --batch 8"},
      {"llama-1b T2048 b8 bf16 (cuda)", "--model llama-1b --seq 2048 --batch 8 --dtype bf16 --device cuda"},
  };
  for (const models::ZooModel& z : models::zoo_models()) cases.push_back({z.name + " (defaults)", "--model " + z.name});
  for (const char* m : {"mlp", "cnn", "gpt"}) cases.push_back({std::string(m) + " (defaults)", std::string("--model ") + m});
  if (!only.empty()) std::erase_if(cases, [&](const Case& c) { return c.label.find(only) == std::string::npos; });
  const char* baseline_env = std::getenv("MEMPLAN_BASELINE_CLI");
  const std::string baseline = baseline_env != nullptr ? baseline_env : "";

  std::vector<std::vector<std::string>> rows;
  nlohmann::json results = nlohmann::json::array();
  bool grew = false;
  for (const Case& c : cases) {
    const nlohmann::json plan = json_or_die(MEMPLAN_CLI_PATH, "plan " + c.args);
    const nlohmann::json cmp = json_or_die(MEMPLAN_CLI_PATH, "compare " + c.args);
    const auto arena = plan["arena_bytes"].get<std::int64_t>();
    if (cmp["planned_arena_bytes"].get<std::int64_t>() != arena) {
      std::fprintf(stderr, "check failed: %s: plan and compare disagree\n", c.label.c_str());
      return 1;
    }
    // PyTorch eager's step: the caching allocator on the step before the fusions where the plan
    // fused ops, else on the same step.
    const bool fused = plan["fused_loss"]["used"].get<bool>();
    const int swiglu = plan["swiglu"]["pairs"].get<int>();
    const auto torch = (cmp.contains("caching_pytorch_step") ? cmp["caching_pytorch_step"] : cmp["caching"])["reserved_peak_bytes"].get<std::int64_t>();
    nlohmann::json r{{"model", c.label}, {"args", c.args}, {"arena_bytes", arena}, {"caching_reserved_peak_bytes", torch},
                     {"planned_over_caching", double(arena) / double(torch)}, {"fused_loss", plan["fused_loss"]},
                     {"swiglu", plan["swiglu"]}, {"copies_recomputed", plan["copies_recomputed"]}};
    std::string before = "-", ratio_before = "-", change = "-";
    if (!baseline.empty()) {
      // The previous binary plans without --device on compare; plan takes it in both.
      const auto old_arena = json_or_die(baseline, "plan " + c.args)["arena_bytes"].get<std::int64_t>();
      r["baseline_arena_bytes"] = old_arena;
      before = gib(double(old_arena));
      ratio_before = fmt(double(old_arena) / double(torch), 3);
      change = fmt(double(arena) / double(old_arena), 3);
      if (arena > old_arena) {
        grew = true;
        std::fprintf(stderr, "check failed: %s: the arena grew from %lld to %lld bytes\n", c.label.c_str(),
                     static_cast<long long>(old_arena), static_cast<long long>(arena));
      }
    }
    // What the rewrites found: "fused loss", "swiglu xN", "copies xN".
    std::string found;
    auto add = [&](const std::string& what) { found += (found.empty() ? "" : ", ") + what; };
    if (fused) add("fused loss");
    if (swiglu > 0) add("swiglu x" + std::to_string(swiglu));
    if (const int copies = plan["copies_recomputed"]["copies"].get<int>(); copies > 0) add("copies x" + std::to_string(copies));
    rows.push_back({c.label, before, gib(double(arena)), change, gib(double(torch)), ratio_before, fmt(double(arena) / double(torch), 3),
                    found.empty() ? "-" : found});
    results.push_back(r);
    std::fflush(stdout);
  }
  print_table({"model", "arena before (GiB)", "arena now (GiB)", "now / before", "caching allocator, PyTorch's step (GiB)",
               "before / caching", "now / caching", "rewrites the plan used"},
              rows);
  write_json(json_out, {{"baseline_cli", baseline}, {"cases", results}});
  if (grew) return 1;
  return 0;
}

}  // namespace
}  // namespace memplan::bench

int main(int argc, char** argv) { return memplan::bench::run(argc, argv); }
