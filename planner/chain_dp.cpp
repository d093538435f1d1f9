#include "planner/chain_dp.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"

namespace memplan::planner {
namespace {

constexpr double kInfeasible = std::numeric_limits<double>::infinity();

Bytes units(Bytes bytes, Bytes quantum) { return (bytes + quantum - 1) / quantum; }

// best[i][m]: the least recompute FLOPs for stages i..n-1 with m units left for them; choice
// records the segment that starts at i (its last stage, and whether it is recomputed).
struct Table {
  int n = 0;
  Bytes width = 0;  // columns 0..width-1
  std::vector<double> best;
  std::vector<int> last;
  std::vector<char> recompute;
  std::size_t at(int i, Bytes m) const { return static_cast<std::size_t>(i) * static_cast<std::size_t>(width) + static_cast<std::size_t>(m); }
};

Table fill_table(const std::vector<ChainStage>& stages, Bytes limit_units, Bytes quantum) {
  Table t;
  t.n = static_cast<int>(stages.size());
  t.width = limit_units + 1;
  const std::size_t cells = static_cast<std::size_t>(t.n + 1) * static_cast<std::size_t>(t.width);
  t.best.assign(cells, kInfeasible);
  t.last.assign(cells, -1);
  t.recompute.assign(cells, 0);
  for (Bytes m = 0; m < t.width; ++m) t.best[t.at(t.n, m)] = 0.0;
  for (int i = t.n - 1; i >= 0; --i) {
    for (Bytes m = 0; m < t.width; ++m) {
      double best = kInfeasible;
      int best_last = -1;
      bool best_recompute = false;
      // Stored stage i alone (a longer stored segment is the same as stored stages in a row).
      const Bytes own = units(stages[static_cast<std::size_t>(i)].all_bytes(), quantum);
      if (own <= m) {
        const double c = t.best[t.at(i + 1, m - own)];
        if (c < best) best = c, best_last = i, best_recompute = false;
      }
      // Recomputed segment i..j: all of it is live during its backward, only its end stays kept.
      Bytes full = 0;
      double flops = 0.0;
      for (int j = i; j < t.n; ++j) {
        full += units(stages[static_cast<std::size_t>(j)].all_bytes(), quantum);
        flops += stages[static_cast<std::size_t>(j)].forward_flops;
        if (full > m) break;
        const Bytes kept = units(stages[static_cast<std::size_t>(j)].boundary_bytes, quantum);
        const double c = flops + t.best[t.at(j + 1, m - kept)];
        if (c < best) best = c, best_last = j, best_recompute = true;
      }
      t.best[t.at(i, m)] = best;
      t.last[t.at(i, m)] = best_last;
      t.recompute[t.at(i, m)] = best_recompute ? 1 : 0;
    }
  }
  return t;
}

std::vector<ChainSegment> reconstruct(const Table& t, const std::vector<ChainStage>& stages, Bytes m, Bytes quantum) {
  std::vector<ChainSegment> segments;
  int i = 0;
  while (i < t.n) {
    const std::size_t cell = t.at(i, m);
    ChainSegment s{i, t.last[cell], t.recompute[cell] != 0};
    MEMPLAN_CHECK(s.last >= i, "chain DP reconstruction reached an infeasible cell");
    if (s.recompute) {
      m -= units(stages[static_cast<std::size_t>(s.last)].boundary_bytes, quantum);
    } else {
      m -= units(stages[static_cast<std::size_t>(i)].all_bytes(), quantum);
    }
    segments.push_back(s);
    i = s.last + 1;
  }
  return segments;
}

Bytes total_units(const std::vector<ChainStage>& stages, Bytes quantum) {
  Bytes total = 0;
  for (const ChainStage& s : stages) total += units(s.all_bytes(), quantum);
  return total;
}

}  // namespace

ChainSolution evaluate_chain(const std::vector<ChainStage>& stages, std::vector<ChainSegment> segments) {
  ChainSolution out;
  Bytes kept_before = 0;
  int expected_first = 0;
  for (const ChainSegment& s : segments) {
    MEMPLAN_CHECK(s.first == expected_first && s.last >= s.first && s.last < static_cast<int>(stages.size()),
                  "segments must cover the chain in order");
    expected_first = s.last + 1;
    Bytes full = 0;
    for (int j = s.first; j <= s.last; ++j) {
      full += stages[static_cast<std::size_t>(j)].all_bytes();
      if (s.recompute) out.recompute_flops += stages[static_cast<std::size_t>(j)].forward_flops;
    }
    out.peak_bytes = std::max(out.peak_bytes, kept_before + full);
    kept_before += s.recompute ? stages[static_cast<std::size_t>(s.last)].boundary_bytes : full;
  }
  MEMPLAN_CHECK(expected_first == static_cast<int>(stages.size()), "segments must cover every stage");
  out.segments = std::move(segments);
  return out;
}

ChainSolution solve_chain(const std::vector<ChainStage>& stages, Bytes memory_limit, Bytes quantum) {
  MEMPLAN_CHECK(quantum >= 1, "quantum must be positive");
  if (stages.empty()) return {};
  if (memory_limit < 0) return {};
  // Beyond storing everything, more memory changes nothing: cap the table there.
  const Bytes limit_units = std::min(memory_limit / quantum, total_units(stages, quantum));
  const Table t = fill_table(stages, limit_units, quantum);
  if (t.best[t.at(0, limit_units)] == kInfeasible) return {};
  return evaluate_chain(stages, reconstruct(t, stages, limit_units, quantum));
}

std::vector<ChainSolution> chain_frontier(const std::vector<ChainStage>& stages, int resolution) {
  if (stages.empty()) return {};
  Bytes total = 0;
  for (const ChainStage& s : stages) total += s.all_bytes();
  const Bytes quantum = std::max<Bytes>(1, (total + resolution - 1) / std::max(resolution, 1));
  const Bytes limit_units = total_units(stages, quantum);
  const Table t = fill_table(stages, limit_units, quantum);
  std::vector<ChainSolution> by_memory;  // increasing limit, strictly decreasing FLOPs
  double previous = kInfeasible;
  for (Bytes m = 0; m <= limit_units; ++m) {
    const double c = t.best[t.at(0, m)];
    if (c == kInfeasible || c >= previous) continue;
    previous = c;
    ChainSolution s = evaluate_chain(stages, reconstruct(t, stages, m, quantum));
    // Rounding may make a later column's solution no smaller in bytes; keep the frontier strict.
    while (!by_memory.empty() && by_memory.back().peak_bytes >= s.peak_bytes) by_memory.pop_back();
    by_memory.push_back(std::move(s));
  }
  std::reverse(by_memory.begin(), by_memory.end());
  return by_memory;
}

std::vector<ChainSegment> sqrt_segments(int num_stages) {
  std::vector<ChainSegment> segments;
  if (num_stages <= 0) return segments;
  const int length = std::max(1, static_cast<int>(std::lround(std::sqrt(static_cast<double>(num_stages)))));
  for (int first = 0; first < num_stages; first += length) {
    const int last = std::min(num_stages - 1, first + length - 1);
    segments.push_back({first, last, last < num_stages - 1});
  }
  return segments;
}

}  // namespace memplan::planner
