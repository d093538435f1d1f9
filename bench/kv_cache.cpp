// KV cache managers side by side: the same 200 requests through the contiguous layout (a
// whole-context slab per sequence) and the paged one (16-position blocks taken as sequences grow)
// at the same KV memory, on a GPT with a 512-position context and random weights (memory figures
// do not depend on the weights; tokens/s on the CPU here only shows the loop's cost). Checks
// first: both layouts give the same tokens, no device allocation during decode. Then: running
// sequences at the peak, KV waste at the peak, preemptions, tokens/s.
//
// Workload (prompt-heavy, as chat turns that carry their context): prompt lengths uniform in
// [96, 288], output lengths uniform in [16, 128] (a sequence reaches 112..415 positions), tokens
// uniform over the vocabulary, all from seed 2026.
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/kernels/kernel.h"
#include "memplan/runtime/device.h"
#include "memplan/serve/generator.h"

namespace memplan {
namespace {

models::GptConfig bench_gpt() {
  models::GptConfig c;
  c.vocab = 96;
  c.context = 512;
  c.layers = 2;
  c.heads = 4;
  c.width = 64;
  return c;
}

std::vector<serve::GenerationRequest> workload(std::int64_t count, std::int64_t vocab) {
  Rng rng(2026);
  std::vector<serve::GenerationRequest> requests;
  for (std::int64_t r = 0; r < count; ++r) {
    serve::GenerationRequest q;
    const auto prompt = static_cast<std::int64_t>(96 + rng.below(193));
    q.max_tokens = static_cast<std::int64_t>(16 + rng.below(113));
    for (std::int64_t i = 0; i < prompt; ++i) q.prompt.push_back(static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab))));
    requests.push_back(std::move(q));
  }
  return requests;
}

}  // namespace
}  // namespace memplan

int main(int argc, char** argv) {
  using namespace memplan;
  std::string json_out = "bench/results/kv_cache.json";
  std::int64_t requests_count = 200, slabs = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else if (a == "--requests" && i + 1 < argc) requests_count = std::stoll(argv[++i]);
    else if (a == "--slabs" && i + 1 < argc) slabs = std::stoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_kv_cache [--requests N] [--slabs N] [--json-out FILE]\n");
      return 2;
    }
  }
  kernels::set_cpu_threads(1);
  const models::GptConfig config = bench_gpt();
  const auto requests = workload(requests_count, config.vocab);
  const std::int64_t block_size = 16;
  // The KV memory: `slabs` whole contexts, what the contiguous layout needs for `slabs` sequences.
  const Bytes kv_memory = slabs * (config.context / block_size) * serve::kv_block_bytes(config, block_size);
  struct Row {
    serve::KvLayout layout;
    std::int64_t max_running;
    serve::GenerationReport report;
  };
  std::vector<Row> rows;
  // Each layout gets the decode batch it can use: contiguous never runs more than its slabs.
  for (auto [layout, max_running] : {std::pair{serve::KvLayout::contiguous, slabs}, std::pair{serve::KvLayout::paged, slabs * 6}}) {
    runtime::CpuDevice device;
    serve::GeneratorOptions options;
    options.layout = layout;
    options.kv_memory = kv_memory;
    options.block_size = block_size;
    options.max_running = max_running;
    options.temperature = 0.0;
    auto generator = serve::Generator::create(config, device, options);
    if (!generator) {
      std::fprintf(stderr, "%s\n", generator.error().message.c_str());
      return 1;
    }
    generator.value()->initialize_weights(1);
    auto report = generator.value()->run(requests);
    if (!report) {
      std::fprintf(stderr, "%s\n", report.error().message.c_str());
      return 1;
    }
    rows.push_back({layout, max_running, std::move(report).value()});
  }
  // Checks before figures.
  const serve::GenerationReport& c = rows[0].report;
  const serve::GenerationReport& p = rows[1].report;
  bool ok = true;
  if (c.outputs_sha256 != p.outputs_sha256) {
    std::fprintf(stderr, "FAIL: contiguous and paged generated different tokens\n");
    ok = false;
  }
  for (const Row& r : rows) {
    if (r.report.device_allocations_during_decode != 0) {
      std::fprintf(stderr, "FAIL: %s allocated during decode\n", std::string(serve::kv_layout_name(r.layout)).c_str());
      ok = false;
    }
  }
  std::printf("KV cache managers: %lld requests (prompt U[96,288], output U[16,128] tokens), GPT context %lld, "
              "%lld layers, width %lld, random weights; KV memory %lld bytes (%lld blocks of %lld positions) for both\n\n",
              static_cast<long long>(requests.size()), static_cast<long long>(config.context),
              static_cast<long long>(config.layers), static_cast<long long>(config.width), static_cast<long long>(kv_memory),
              static_cast<long long>(kv_memory / serve::kv_block_bytes(config, block_size)), static_cast<long long>(block_size));
  std::vector<std::vector<std::string>> table;
  nlohmann::json runs = nlohmann::json::array();
  for (const Row& r : rows) {
    const serve::GenerationReport& g = r.report;
    table.push_back({std::string(serve::kv_layout_name(r.layout)), std::to_string(r.max_running), std::to_string(g.running_peak),
                     bench::fmt(100.0 * g.kv_waste_ratio, 2) + "%", bench::fmt(100.0 * g.kv_waste_ratio_mean, 2) + "%",
                     std::to_string(g.kv_token_bytes_at_peak),
                     std::to_string(g.kv_reserved_bytes_at_peak), std::to_string(g.preemptions), std::to_string(g.steps),
                     std::to_string(g.generated_tokens), bench::fmt(g.tokens_per_s, 0),
                     std::to_string(g.device_allocations_during_decode)});
    runs.push_back({{"kv", serve::kv_layout_name(r.layout)}, {"max_running", r.max_running}, {"running_peak", g.running_peak},
                    {"kv_waste_ratio", g.kv_waste_ratio}, {"kv_waste_ratio_mean", g.kv_waste_ratio_mean},
                    {"kv_token_bytes_at_peak", g.kv_token_bytes_at_peak},
                    {"kv_reserved_bytes_at_peak", g.kv_reserved_bytes_at_peak}, {"preemptions", g.preemptions},
                    {"steps", g.steps}, {"generated_tokens", g.generated_tokens}, {"seconds", g.seconds},
                    {"tokens_per_s", g.tokens_per_s}, {"device_allocations_during_decode", g.device_allocations_during_decode},
                    {"outputs_sha256", g.outputs_sha256}});
  }
  bench::print_table({"kv", "decode slots", "running peak", "waste at peak", "mean waste", "token bytes at peak", "reserved bytes then", "preemptions",
                      "steps", "tokens", "tokens/s", "allocs in decode"},
                     table);
  const double ratio = double(p.running_peak) / double(std::max<std::int64_t>(c.running_peak, 1));
  std::printf("\npaged runs %.2fx the sequences of contiguous at equal KV memory; paged waste %.2f%%\n", ratio,
              100.0 * p.kv_waste_ratio);
  nlohmann::json out = {{"bench", "kv_cache"},
                        {"workload", {{"requests", requests.size()}, {"prompt_tokens", "uniform [96, 288]"},
                                      {"output_tokens", "uniform [16, 128]"}, {"seed", 2026}}},
                        {"model", {{"context", config.context}, {"layers", config.layers}, {"width", config.width},
                                   {"heads", config.heads}, {"vocab", config.vocab}, {"weights", "random (seed 1)"}}},
                        {"kv_memory_bytes", kv_memory}, {"block_size", block_size}, {"runs", runs},
                        {"paged_over_contiguous_running", ratio}, {"checks_passed", ok}};
  bench::write_json(json_out, out);
  return ok ? 0 : 1;
}
