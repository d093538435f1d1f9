// Caching allocator throughput: random alloc/free pairs (512 B .. 16 MiB, 256 live slots) over
// a simulated device, with and without expandable segments. Checks first that every request is
// served and that the cache absorbs nearly all of them.
//
//   bench_caching_allocator_bench [--pairs 1000000] [--json-out bench_caching_allocator.json]
#include <cstdio>
#include <string>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/simulated_device.h"

int main(int argc, char** argv) {
  using namespace memplan;
  std::int64_t pairs = 1000000;
  std::string json_out = "bench_caching_allocator.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--pairs" && i + 1 < argc) pairs = std::stoll(argv[++i]);
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_caching_allocator_bench [--pairs N] [--json-out FILE]\n");
      return 2;
    }
  }
  std::vector<std::vector<std::string>> rows;
  nlohmann::json results = nlohmann::json::array();
  for (bool expandable : {false, true}) {
    runtime::SimulatedDevice device(Bytes{64} << 30);
    runtime::CachingAllocatorOptions options;
    options.expandable_segments = expandable;
    runtime::CachingAllocator allocator(device, options);
    Rng rng(7);
    std::vector<void*> live(256, nullptr);
    bool ok = true;
    const double ms = bench::time_ms([&] {
      for (std::int64_t i = 0; i < pairs; ++i) {
        const std::size_t slot = static_cast<std::size_t>(rng.below(live.size()));
        if (live[slot] != nullptr) allocator.free(live[slot]);
        auto p = allocator.allocate(Bytes{512} << rng.below(16));
        ok = ok && p.ok();
        live[slot] = p.ok() ? p.value() : nullptr;
      }
    });
    const auto& s = allocator.stats();
    if (!ok || s.num_device_alloc * 100 > pairs) {
      std::fprintf(stderr, "check failed: a request failed or the cache absorbed under 99%% of them\n");
      return 1;
    }
    const double ns_per_pair = ms * 1e6 / double(pairs);
    rows.push_back({expandable ? "expandable segments" : "default", std::to_string(pairs), bench::fmt(ms, 1),
                    bench::fmt(ns_per_pair, 1), std::to_string(s.num_device_alloc)});
    results.push_back({{"variant", expandable ? "expandable_segments" : "default"}, {"pairs", pairs}, {"ms", ms},
                       {"ns_per_pair", ns_per_pair}, {"device_allocations", s.num_device_alloc}});
  }
  bench::print_table({"allocator", "alloc/free pairs", "total ms", "ns per pair", "device allocations"}, rows);
  bench::write_json(json_out, {{"benchmark", "caching_allocator"}, {"results", results}});
  return 0;
}
