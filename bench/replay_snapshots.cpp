// `memplan replay` on real PyTorch memory snapshots: per file, events, the recorded and simulated
// reserved peaks (and whether the segment allocations match), the live peak (lower bound), the
// static plan, expandable segments, and the time to read and to replay. The snapshots are not part
// of the project (they carry no licence); the bench reads them from a folder, by default
// ../shared/snapshots beside the source tree, and says so when it is absent.
//
// With --cuts N, each file is also replayed cut at N points (its first K events dropped, K =
// events * i / (N + 1)), as if the recording had started mid-run: the self-test of the start
// state rebuilt from the dumped one (trace::cut_snapshot). Per cut: the share of placements at the
// recorded segment and offset, and whether the segment sizes and the reserved peak match.
//
//   bench_replay_snapshots [--dir DIR] [--exact-nodes N] [--cuts N] [--json-out bench_replay_snapshots.json]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "bench/bench_util.h"
#include "memplan/trace/memory_snapshot.h"
#include "memplan/trace/snapshot_replay.h"

namespace {

std::string mib(memplan::Bytes b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", double(b) / double(1 << 20));
  return buf;
}

std::string fixed(double v, const char* format) {
  char buf[32];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

struct CutResult {
  std::int64_t first = 0;
  double placements = 0.0;
  bool segments = false, peak = false;
  std::int64_t divergence = -1;
  std::string error;
};

// The file replayed from `cuts` points inside it, each cut's fidelity.
std::vector<CutResult> replay_cuts(const memplan::trace::MemorySnapshot& snapshot, int cuts) {
  using namespace memplan;
  std::vector<CutResult> out;
  const std::size_t events = snapshot.device_traces.empty() ? 0 : snapshot.device_traces.front().size();
  for (int i = 1; i <= cuts; ++i) {
    CutResult c;
    c.first = static_cast<std::int64_t>(events * static_cast<std::size_t>(i) / static_cast<std::size_t>(cuts + 1));
    trace::SnapshotReplayRequest request;
    request.solver_nodes = 0;  // the plan is not what is measured here
    auto replay = trace::replay_snapshot(trace::cut_snapshot(snapshot, 0, static_cast<std::size_t>(c.first)), request);
    if (!replay) {
      c.error = replay.error().message;
    } else {
      const trace::ReplayFidelity& f = replay.value().fidelity;
      c.placements = f.placement_match_ratio;
      c.segments = f.segment_sizes_match;
      c.peak = f.reserved_peak_matches;
      c.divergence = f.first_divergence ? c.first + f.first_divergence->event : -1;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace memplan;
  std::string dir = MEMPLAN_SHARED_SNAPSHOTS_DIR;
  std::string json_out = "bench_replay_snapshots.json";
  std::int64_t nodes = trace::SnapshotReplayRequest{}.solver_nodes;
  int cuts = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--exact-nodes" && i + 1 < argc) nodes = std::stoll(argv[++i]);
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else if (a == "--cuts" && i + 1 < argc) cuts = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_replay_snapshots [--dir DIR] [--exact-nodes N] [--cuts N] [--json-out FILE]\n");
      return 2;
    }
  }
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".pickle") files.push_back(entry.path());
  }
  if (ec || files.empty()) {
    std::printf("bench_replay_snapshots: no snapshots in %s (the folder of real PyTorch snapshots is not part of the "
                "project; pass --dir with files from torch.cuda.memory._dump_snapshot). Nothing measured.\n",
                dir.c_str());
    return 0;
  }
  std::sort(files.begin(), files.end());
  std::vector<std::vector<std::string>> rows, cut_rows;
  nlohmann::json results = nlohmann::json::array();
  bool all_checked = true;
  for (const auto& path : files) {
    Result<trace::MemorySnapshot> snapshot = Error{""};
    const double read_ms = bench::time_ms([&] { snapshot = trace::read_memory_snapshot(path.string()); });
    if (!snapshot) {
      std::fprintf(stderr, "%s\n", snapshot.error().message.c_str());
      return 1;
    }
    trace::SnapshotReplayRequest request;
    request.solver_nodes = nodes;
    Result<trace::SnapshotReplay> replay = Error{""};
    const double replay_ms = bench::time_ms([&] { replay = trace::replay_snapshot(snapshot.value(), request); });
    if (!replay) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), replay.error().message.c_str());
      return 1;
    }
    const auto& r = replay.value();
    // Checks before numbers: the plan is at or above the lower bound and validated inside.
    if (r.planned_arena_bytes < r.live_peak_bytes) {
      std::fprintf(stderr, "check failed: %s: plan below the lower bound\n", path.c_str());
      return 1;
    }
    all_checked = all_checked && r.fidelity.segment_sizes_match && r.fidelity.reserved_peak_matches;
    const std::string name = path.stem().string();
    const double plan_ratio = r.live_peak_bytes ? double(r.planned_arena_bytes) / double(r.live_peak_bytes) : 1.0;
    rows.push_back({name, std::to_string(r.events), mib(r.recorded.reserved_peak_bytes), mib(r.simulated.reserved_peak_bytes),
                    r.fidelity.segment_sizes_match ? "yes" : "no", fixed(100 * r.fidelity.placement_match_ratio, "%.1f%%"),
                    mib(r.live_peak_bytes), mib(r.planned_arena_bytes), fixed(plan_ratio, "%.4f"),
                    mib(r.expandable.reserved_peak_bytes), fixed(read_ms, "%.0f"), fixed(replay_ms - r.plan_ms, "%.0f"), fixed(r.plan_ms, "%.0f")});
    results.push_back({{"file", name},
                       {"events", r.events},
                       {"allocs", r.allocs},
                       {"recorded_reserved_peak_bytes", r.recorded.reserved_peak_bytes},
                       {"simulated_reserved_peak_bytes", r.simulated.reserved_peak_bytes},
                       {"segment_sizes_match", r.fidelity.segment_sizes_match},
                       {"placement_match_ratio", r.fidelity.placement_match_ratio},
                       {"first_divergence_event", r.fidelity.first_divergence ? r.fidelity.first_divergence->event : -1},
                       {"live_peak_bytes", r.live_peak_bytes},
                       {"planned_arena_bytes", r.planned_arena_bytes},
                       {"plan_status", planner::to_string(r.plan_status)},
                       {"expandable_reserved_peak_bytes", r.expandable.reserved_peak_bytes},
                       {"read_ms", read_ms},
                       {"replay_ms", replay_ms - r.plan_ms},
                       {"plan_ms", r.plan_ms}});
    nlohmann::json cut_json = nlohmann::json::array();
    for (const CutResult& c : replay_cuts(snapshot.value(), cuts)) {
      cut_rows.push_back({name, std::to_string(c.first), c.error.empty() ? fixed(100 * c.placements, "%.1f%%") : "error",
                          c.segments ? "yes" : "no", c.peak ? "yes" : "no",
                          c.divergence < 0 ? "-" : std::to_string(c.divergence), c.error.substr(0, 80)});
      cut_json.push_back({{"first_event", c.first}, {"placement_match_ratio", c.placements}, {"segment_sizes_match", c.segments},
                          {"reserved_peak_matches", c.peak}, {"first_divergence_event", c.divergence}, {"error", c.error}});
    }
    if (cuts > 0) results.back()["cuts"] = cut_json;
  }
  std::printf("memplan replay on %zu PyTorch snapshots from %s (MiB; solver budget %lld nodes)\n\n", files.size(), dir.c_str(),
              static_cast<long long>(nodes));
  bench::print_table({"snapshot", "events", "recorded peak", "simulated peak", "segments match", "placements match",
                      "live peak (LB)", "static plan", "plan / LB", "expandable", "read ms", "replay ms", "plan ms"},
                     rows);
  std::printf("\n%s\n", all_checked ? "every snapshot: simulated segment allocations and reserved peak equal the recording"
                                    : "NOT every snapshot reproduces its recording: see the segments match column");
  if (cuts > 0) {
    std::printf("\ncut at %d points each: replayed from event K on, the start state rebuilt from the dumped one\n\n", cuts);
    bench::print_table({"snapshot", "from event", "placements match", "segments match", "reserved peak matches",
                        "first divergence (event)", "error"},
                       cut_rows);
  }
  bench::write_json(json_out, {{"bench", "replay_snapshots"}, {"solver_nodes", nodes}, {"results", results}});
  return 0;
}
