#include "memplan/planner/chain_dp.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <thread>

#include "memplan/common/check.h"

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

namespace memplan::planner {
namespace {

// C(s, t, m) over intervals [s, t] and memory units m; choice: 0 keep s whole, j > 0 split at
// k = s + j. Only s <= t is stored, and a row only up to its saturation: with every stage of
// [s, t] kept whole (sat(s, t) units, the sum of their rounded sizes) the cost is the least any
// schedule has (each stage runs forward once), so C(s, t, m) = C(s, t, sat) for every m above
// it. Short intervals are most of the table and saturate early: reads past a row's end read its
// last cell.
// A row depends only on its stages' rounded sizes and FLOPs, in order: intervals holding the
// same sequence (a transformer's identical layers) share one row, its choices relative to the
// interval's start. A chain of L equal layers then fills O(L^2) rows' worth of cells instead of
// O(L^3), with the same table.
struct NestedTable {
  int n = 0;
  Bytes width = 0;
  std::vector<double> cost;
  std::vector<int> choice;             // -1: infeasible
  std::vector<int> shared;             // per (s, t), s <= t: its shared row
  std::vector<std::size_t> row_start;  // per shared row: where its cells begin
  std::vector<Bytes> row_last;         // per shared row: its last stored m
  int row(int s, int t) const { return shared[static_cast<std::size_t>(s) * static_cast<std::size_t>(n) + static_cast<std::size_t>(t)]; }
  std::size_t at(int s, int t, Bytes m) const {
    const auto r = static_cast<std::size_t>(row(s, t));
    return row_start[r] + static_cast<std::size_t>(std::min(m, row_last[r]));
  }
};

// One split candidate over m in [from, to): c = run + after(m - kept) + before(m), where a
// saturated operand (kAfterFlat, kBeforeFlat) is its row's last cell for every m. Templated so
// the loop stays a contiguous, vectorisable one in each case.
template <bool kAfterFlat, bool kBeforeFlat>
void relax_split(double* best, int* best_choice, int j, double run, const double* after, Bytes kept, const double* before,
                 Bytes from, Bytes to) {
  for (Bytes m = from; m < to; ++m) {
    const double a = kAfterFlat ? after[0] : after[m - kept];
    const double b = kBeforeFlat ? before[0] : before[m];
    const double c = run + a + b;
    if (c < best[m]) {
      best[m] = c;
      best_choice[m] = j;
    }
  }
}

NestedTable fill_nested(const std::vector<ChainStage>& stages, Bytes limit_units, Bytes quantum) {
  NestedTable t;
  t.n = static_cast<int>(stages.size());
  t.width = limit_units + 1;
  auto stage = [&](int i) -> const ChainStage& { return stages[static_cast<std::size_t>(i)]; };
  // Stages the DP cannot tell apart get one kind; an interval's shared row is the kind of its
  // first stage followed by the shared row of the rest.
  std::vector<int> kind(static_cast<std::size_t>(t.n));
  {
    std::map<std::tuple<Bytes, Bytes, double>, int> kinds;
    for (int i = 0; i < t.n; ++i) {
      const auto key = std::make_tuple(units(stage(i).all_bytes(), quantum), units(stage(i).boundary_bytes, quantum), stage(i).forward_flops);
      kind[static_cast<std::size_t>(i)] = kinds.emplace(key, static_cast<int>(kinds.size())).first->second;
    }
  }
  const std::size_t intervals = static_cast<std::size_t>(t.n) * static_cast<std::size_t>(t.n);
  t.shared.assign(intervals, -1);
  std::vector<std::vector<std::pair<int, int>>> rows_of_length(static_cast<std::size_t>(t.n) + 1);  // one (s, e) per shared row
  std::size_t cells = 0;
  {
    std::map<std::pair<int, int>, int> rows;  // (kind of s, shared row of [s + 1, e] or -1) -> shared row
    for (int len = 1; len <= t.n; ++len) {
      for (int s = 0; s + len - 1 < t.n; ++s) {
        const int e = s + len - 1;
        const std::pair<int, int> key(kind[static_cast<std::size_t>(s)], s == e ? -1 : t.row(s + 1, e));
        const auto [it, added] = rows.emplace(key, static_cast<int>(rows.size()));
        t.shared[static_cast<std::size_t>(s) * static_cast<std::size_t>(t.n) + static_cast<std::size_t>(e)] = it->second;
        if (!added) continue;
        Bytes saturated = 0;
        for (int i = s; i <= e; ++i) saturated += units(stage(i).all_bytes(), quantum);
        t.row_start.push_back(cells);
        t.row_last.push_back(std::min(saturated, limit_units));
        cells += static_cast<std::size_t>(t.row_last.back()) + 1;
        rows_of_length[static_cast<std::size_t>(len)].emplace_back(s, e);
      }
    }
  }
  t.cost.assign(cells, kInfeasible);
  t.choice.assign(cells, -1);
  // Rows of one interval length depend only on shorter ones: a length's rows are filled on as
  // many threads as the machine has (each writes its own row, so the table does not depend on
  // the thread count); small tables stay on one thread.
  auto fill_row = [&](int s, int e) {
    // Every memory limit m at once, candidates in the same order for each m (keep-all first,
    // then split points k ascending, strict improvement): the same table as filling one m at
    // a time, with the inner loop running along contiguous memory.
    const auto here = static_cast<std::size_t>(t.row(s, e));
    const Bytes end = t.row_last[here] + 1;
    double* best = &t.cost[t.row_start[here]];
    int* best_choice = &t.choice[t.row_start[here]];
    const Bytes all = units(stage(s).all_bytes(), quantum);
    // m - all never passes the rest's saturation (sat(s, e) = all + sat(s + 1, e)).
    const double* rest = s == e ? nullptr : &t.cost[t.row_start[static_cast<std::size_t>(t.row(s + 1, e))]];
    for (Bytes m = all; m < end; ++m) {
      const double c = stage(s).forward_flops + (rest == nullptr ? 0.0 : rest[m - all]);
      if (c < best[m]) {  // best[m] is still infeasible: an infeasible rest leaves it so
        best[m] = c;
        best_choice[m] = 0;
      }
    }
    double run = 0.0;
    for (int k = s + 1; k <= e; ++k) {
      run += stage(k - 1).forward_flops;
      const Bytes kept = units(stage(k - 1).boundary_bytes, quantum);
      if (kept >= end) continue;
      const auto after_row = static_cast<std::size_t>(t.row(k, e)), before_row = static_cast<std::size_t>(t.row(s, k - 1));
      const double* after = &t.cost[t.row_start[after_row]];     // stages k..e with m - kept
      const double* before = &t.cost[t.row_start[before_row]];  // stages s..k-1 with m
      const double* after_flat = after + t.row_last[after_row];
      const double* before_flat = before + t.row_last[before_row];
      // m below after_direct reads after directly, below before_direct before directly.
      const Bytes after_direct = std::clamp(kept + t.row_last[after_row] + 1, kept, end);
      const Bytes before_direct = std::clamp(t.row_last[before_row] + 1, kept, end);
      const Bytes both = std::min(after_direct, before_direct);
      const int j = k - s;
      relax_split<false, false>(best, best_choice, j, run, after, kept, before, kept, both);
      if (after_direct < before_direct) {
        relax_split<true, false>(best, best_choice, j, run, after_flat, kept, before, after_direct, before_direct);
      } else {
        relax_split<false, true>(best, best_choice, j, run, after, kept, before_flat, before_direct, after_direct);
      }
      relax_split<true, true>(best, best_choice, j, run, after_flat, kept, before_flat, std::max(after_direct, before_direct), end);
    }
  };
  const std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  for (int len = 1; len <= t.n; ++len) {
    const std::vector<std::pair<int, int>>& todo = rows_of_length[static_cast<std::size_t>(len)];
    const auto count = static_cast<int>(todo.size());
    const double work = double(count) * double(len) * double(t.width);
    if (threads <= 1 || count < 2 || work < 1e6) {
      for (const auto& [s, e] : todo) fill_row(s, e);
      continue;
    }
    std::atomic<int> next{0};
    auto worker = [&] {
      for (int r = next++; r < count; r = next++) fill_row(todo[static_cast<std::size_t>(r)].first, todo[static_cast<std::size_t>(r)].second);
    };
    std::vector<std::thread> pool;
    for (std::size_t i = 1; i < std::min<std::size_t>(threads, static_cast<std::size_t>(count)); ++i) pool.emplace_back(worker);
    worker();
    for (std::thread& th : pool) th.join();
  }
  return t;
}

void emit_nested(const NestedTable& t, const std::vector<ChainStage>& stages, Bytes quantum, int s, int e, Bytes m,
                 std::vector<ChainAction>& out) {
  const int j = t.choice[t.at(s, e, m)];
  MEMPLAN_CHECK(j >= 0, "nested chain DP reconstruction reached an infeasible cell");
  if (j == 0) {
    out.push_back({ChainActionKind::kForwardKeepAll, s});
    if (s < e) emit_nested(t, stages, quantum, s + 1, e, m - units(stages[static_cast<std::size_t>(s)].all_bytes(), quantum), out);
    out.push_back({ChainActionKind::kBackward, s});
    return;
  }
  const int k = s + j;
  for (int i = s; i < k; ++i) out.push_back({ChainActionKind::kForward, i});
  emit_nested(t, stages, quantum, k, e, m - units(stages[static_cast<std::size_t>(k - 1)].boundary_bytes, quantum), out);
  emit_nested(t, stages, quantum, s, k - 1, m, out);
}

}  // namespace

ChainSchedule simulate_chain(const std::vector<ChainStage>& stages, std::vector<ChainAction> actions) {
  const int n = static_cast<int>(stages.size());
  const int steps = static_cast<int>(actions.size());
  // Items: boundary versions and kept internals, each with its creation and last use.
  struct Item {
    Bytes bytes = 0;
    int created = 0;
    int last_use = 0;
  };
  std::vector<Item> items;
  std::vector<int> latest(static_cast<std::size_t>(n), -1);     // item of the latest output of each stage
  std::vector<int> internals(static_cast<std::size_t>(n), -1);  // item of the kept internals of the latest run
  std::vector<bool> ran(static_cast<std::size_t>(n), false), done(static_cast<std::size_t>(n), false);
  ChainSchedule out;
  int next_backward = n - 1;
  for (int a = 0; a < steps; ++a) {
    const ChainAction& act = actions[static_cast<std::size_t>(a)];
    const int i = act.stage;
    MEMPLAN_CHECK(i >= 0 && i < n && !done[static_cast<std::size_t>(i)], "action on stage " << i << " after its backward");
    auto use = [&](int item) { items[static_cast<std::size_t>(item)].last_use = a; };
    if (i > 0) {
      MEMPLAN_CHECK(latest[static_cast<std::size_t>(i - 1)] >= 0, "stage " << i << " runs before its input exists");
      use(latest[static_cast<std::size_t>(i - 1)]);
    }
    if (act.kind == ChainActionKind::kBackward) {
      MEMPLAN_CHECK(i == next_backward, "backward of stage " << i << " out of order");
      MEMPLAN_CHECK(internals[static_cast<std::size_t>(i)] >= 0, "backward of stage " << i << " without its activations");
      use(internals[static_cast<std::size_t>(i)]);
      use(latest[static_cast<std::size_t>(i)]);
      done[static_cast<std::size_t>(i)] = true;
      --next_backward;
      continue;
    }
    MEMPLAN_CHECK(ran[static_cast<std::size_t>(i)] || i == 0 || ran[static_cast<std::size_t>(i - 1)],
                  "the first run of stage " << i << " comes before its predecessor's");
    if (ran[static_cast<std::size_t>(i)]) out.recompute_flops += stages[static_cast<std::size_t>(i)].forward_flops;
    ran[static_cast<std::size_t>(i)] = true;
    const ChainStage& st = stages[static_cast<std::size_t>(i)];
    latest[static_cast<std::size_t>(i)] = static_cast<int>(items.size());
    items.push_back({st.boundary_bytes, a, a});
    internals[static_cast<std::size_t>(i)] = -1;
    if (act.kind == ChainActionKind::kForwardKeepAll) {
      internals[static_cast<std::size_t>(i)] = static_cast<int>(items.size());
      items.push_back({st.internal_bytes, a, a});
    }
  }
  MEMPLAN_CHECK(next_backward == -1, "the schedule leaves " << next_backward + 1 << " stages without a backward");
  for (int a = 0; a < steps; ++a) {
    if (actions[static_cast<std::size_t>(a)].kind != ChainActionKind::kBackward) continue;
    Bytes live = 0;
    for (const Item& item : items) {
      if (item.created <= a && a <= item.last_use) live += item.bytes;
    }
    out.peak_bytes = std::max(out.peak_bytes, live);
  }
  out.actions = std::move(actions);
  return out;
}

ChainSchedule solve_chain_nested(const std::vector<ChainStage>& stages, Bytes memory_limit, Bytes quantum) {
  MEMPLAN_CHECK(quantum >= 1, "quantum must be positive");
  if (stages.empty() || memory_limit < 0) return {};
  const Bytes limit_units = std::min(memory_limit / quantum, total_units(stages, quantum));
  const NestedTable t = fill_nested(stages, limit_units, quantum);
  const int n = static_cast<int>(stages.size());
  if (t.cost[t.at(0, n - 1, limit_units)] == kInfeasible) return {};
  std::vector<ChainAction> actions;
  emit_nested(t, stages, quantum, 0, n - 1, limit_units, actions);
  return simulate_chain(stages, std::move(actions));
}

std::vector<ChainSchedule> chain_frontier_nested(const std::vector<ChainStage>& stages, int resolution) {
  if (stages.empty()) return {};
  Bytes total = 0;
  for (const ChainStage& s : stages) total += s.all_bytes();
  const Bytes quantum = std::max<Bytes>(1, (total + resolution - 1) / std::max(resolution, 1));
  const Bytes limit_units = total_units(stages, quantum);
  const NestedTable t = fill_nested(stages, limit_units, quantum);
  const int n = static_cast<int>(stages.size());
  std::vector<ChainSchedule> by_memory;
  double previous = kInfeasible;
  for (Bytes m = 0; m <= limit_units; ++m) {
    const double c = t.cost[t.at(0, n - 1, m)];
    if (c == kInfeasible || c >= previous) continue;
    previous = c;
    std::vector<ChainAction> actions;
    emit_nested(t, stages, quantum, 0, n - 1, m, actions);
    ChainSchedule s = simulate_chain(stages, std::move(actions));
    while (!by_memory.empty() && by_memory.back().peak_bytes >= s.peak_bytes) by_memory.pop_back();
    by_memory.push_back(std::move(s));
  }
  std::reverse(by_memory.begin(), by_memory.end());
  return by_memory;
}

std::vector<ChainAction> segments_to_actions(const std::vector<ChainSegment>& segments) {
  std::vector<ChainAction> actions;
  for (const ChainSegment& seg : segments) {
    for (int i = seg.first; i <= seg.last; ++i) {
      actions.push_back({seg.recompute ? ChainActionKind::kForward : ChainActionKind::kForwardKeepAll, i});
    }
  }
  for (auto seg = segments.rbegin(); seg != segments.rend(); ++seg) {
    if (seg->recompute) {
      for (int i = seg->first; i <= seg->last; ++i) actions.push_back({ChainActionKind::kForwardKeepAll, i});
    }
    for (int i = seg->last; i >= seg->first; --i) actions.push_back({ChainActionKind::kBackward, i});
  }
  return actions;
}

}  // namespace memplan::planner
