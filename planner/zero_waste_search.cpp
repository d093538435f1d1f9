// The exact solver's zero-waste search and its mirror: a complete search for target heights
// that every occupied section fills exactly, one attempt (one candidate order) per call. The
// driver (exact_solver.cpp) runs it in turns with the band decomposition (band_search.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "memplan/planner/exact_search_internal.h"

namespace memplan::planner::exact_search {

namespace {

// Zero-waste search, for a target height that every occupied section fills exactly (the sum
// of the sizes live there equals it). Then no packing at that height leaves any hole, the
// placed buffers fill each section from 0 up to its floor, and a much narrower branching is
// complete: take a valley, a run of sections at one floor h whose neighbours are both higher
// (or absent). The byte at (valley start, h) belongs to some buffer placed with its bottom at
// h; it cannot reach into a higher neighbour, so it starts exactly at the valley and ends
// within it. The same holds mirrored for the valley's end. Each valley end is a constraint;
// the search branches on the one with the fewest candidates (none: dead end), as perfect
// strip-packing solvers fill the lowest gap first.
// Identical buffers are tried once per gap. A range that cannot be filled is remembered by
// its floors and the multiset of buffers placed (identical buffers hash alike), so the many
// orders that stack the same buffers to the same floors are refuted once: the memo outlives
// the attempt and serves every ordering of the round-robin.
class PerfectSearch {
 public:
  using Memo = ZeroWasteMemo;

  // `attempt` picks the candidate order: the first three are plain keys (area, lifetime, size),
  // later ones the same keys scaled by pseudo-random factors seeded by the attempt, so
  // restarts explore different early choices while staying reproducible.
  PerfectSearch(const Instance& inst, Bytes capacity, int attempt, Budget& budget, Memo& memo)
      : inst_(inst), capacity_(capacity), budget_(budget), memo_(memo), exact_fits_first_(attempt % 2 == 1) {
    const std::size_t n = inst.items.size();
    const std::size_t sections = std::size_t(inst.section_count);
    offset_.assign(n, kUnplaced);
    floor_.assign(sections, 0);
    for (std::size_t s = 0; s < sections; ++s) {
      if (inst.section_total[s] == 0) floor_[s] = capacity;  // nothing lives here
    }
    by_first_.resize(sections);
    by_end_.resize(sections);
    key_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& item = inst.items[i];
      switch (attempt % 3) {
        case 0: key_[i] = item.area; break;
        case 1: key_[i] = item.width * 1e30 + double(item.size); break;
        default: key_[i] = double(item.size); break;
      }
      // Identical buffers get equal factors, so they stay side by side in a gap's candidates.
      if (attempt >= 3) key_[i] *= 1.0 + double(mix(memo.item_key[i] ^ mix(std::uint64_t(attempt))) % 1024) / 1024.0;
    }
    cross_.assign(sections, 0);
    placed_hash_.assign(sections, 0);
    start_sum_.assign(sections, 0);
    end_sum_.assign(sections, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& item = inst.items[i];
      by_first_[std::size_t(item.first_section)].push_back(int(i));
      by_end_[std::size_t(item.end_section - 1)].push_back(int(i));
      for (int s = item.first_section; s + 1 < item.end_section; ++s) ++cross_[std::size_t(s)];
      start_sum_[std::size_t(item.first_section)] += item.size;
      end_sum_[std::size_t(item.end_section) - 1] += item.size;
    }
    auto same_class_adjacent = [&](std::vector<int>& list) {
      std::stable_sort(list.begin(), list.end(), [&](int x, int y) { return memo.item_key[std::size_t(x)] < memo.item_key[std::size_t(y)]; });
    };
    for (auto& list : by_first_) same_class_adjacent(list);
    for (auto& list : by_end_) same_class_adjacent(list);
  }

  Outcome run() { return node(0, inst_.section_count); }
  const std::vector<Offset>& offsets() const { return offset_; }
  std::int64_t backtracks() const { return backtracks_; }

 private:
  // Candidates for the byte at (section s, floor h) inside the run [a, b): buffers starting
  // at a (from_left) or ending at b (otherwise) that stay inside the run and fit. Returns
  // how many; fills `out` when given.
  // Identical buffers count once (the lists keep them side by side).
  int candidates(int a, int b, bool from_left, Offset h, std::vector<int>* out) const {
    int count = 0;
    const auto& list = from_left ? by_first_[std::size_t(a)] : by_end_[std::size_t(b - 1)];
    int last = -1;
    for (const int i : list) {
      if (offset_[std::size_t(i)] != kUnplaced) continue;
      const auto& item = inst_.items[std::size_t(i)];
      if (from_left ? item.end_section > b : item.first_section < a) continue;
      if (h + item.size > capacity_ || h % item.alignment != 0) continue;
      if (last < 0 || memo_.item_key[std::size_t(last)] != memo_.item_key[std::size_t(i)]) ++count;
      last = i;
      if (out) out->push_back(i);
    }
    return count;
  }

  void set(Offset& slot, Offset value) {
    trail_.push_back({&slot, slot});
    slot = value;
  }
  void undo(std::size_t mark) {
    while (trail_.size() > mark) {
      *trail_.back().slot = trail_.back().old;
      trail_.pop_back();
    }
  }

  // Fills sections [lo, hi). Where no unplaced buffer crosses a boundary the two sides are
  // independent: each is filled on its own, and a side that cannot be filled fails the node
  // without retrying the other side's choices.
  Outcome node(int lo, int hi) {
    if (!budget_.spend()) return Outcome::budget;
    for (int s = lo; s + 1 < hi; ++s) {
      if (cross_[std::size_t(s)] != 0) continue;
      for (int a = lo; a < hi;) {
        int b = a + 1;
        while (b < hi && cross_[std::size_t(b) - 1] != 0) ++b;
        const Outcome outcome = fill(a, b);
        if (outcome != Outcome::found) return outcome;
        a = b;
      }
      return Outcome::found;
    }
    return fill(lo, hi);
  }

  Outcome fill(int lo, int hi) {
    int best_a = -1, best_b = -1, best_count = std::numeric_limits<int>::max();
    bool best_left = true;
    Offset best_h = 0;
    for (int s = lo; s < hi;) {
      const Offset h = floor_[std::size_t(s)];
      int e = s + 1;
      while (e < hi && floor_[std::size_t(e)] == h) ++e;
      if (h < capacity_) {
        const bool left = s == lo || floor_[std::size_t(s) - 1] > h;
        const bool right = e == hi || floor_[std::size_t(e)] > h;
        // Below a higher neighbour's floor only buffers that start (end) here can sit, stacked
        // from h up past that floor: they must add up to the step at least.
        if (s > lo && left && start_sum_[std::size_t(s)] < floor_[std::size_t(s) - 1] - h) return dead();
        if (e < hi && right && end_sum_[std::size_t(e) - 1] < floor_[std::size_t(e)] - h) return dead();
        for (int side = 0; side < 2; ++side) {
          const bool from_left = side == 0;
          if (!(from_left ? left : right)) continue;
          if (!(left && right)) {
            // A shelf (higher on one side only): the byte at its higher end still needs a
            // buffer starting (ending) there that reaches no higher floor. Checked, not
            // branched on.
            int r = from_left ? e : s;
            if (from_left) {
              while (r < hi && floor_[std::size_t(r)] <= h) ++r;
              if (!shelf_has_candidate(s, r, true, h)) return dead();
            } else {
              while (r > lo && floor_[std::size_t(r) - 1] <= h) --r;
              if (!shelf_has_candidate(r, e, false, h)) return dead();
            }
            continue;
          }
          const int count = candidates(s, e, from_left, h, nullptr);
          if (count == 0) return dead();
          if (from_left && e - s > 1 && !tileable(s, e, h)) return dead();
          // Fewest candidates first; ties go to the lowest floor, then the earliest valley.
          if (count < best_count || (count == best_count && h < best_h)) {
            best_count = count;
            best_a = s;
            best_b = e;
            best_left = from_left;
            best_h = h;
          }
        }
      }
      s = e;
    }
    if (best_a < 0) return Outcome::found;  // every section full
    const std::pair<std::uint64_t, std::uint64_t> key = state_key(lo, hi);
    if (memo_.contains(key)) return dead();
    std::vector<int> pool;
    candidates(best_a, best_b, best_left, best_h, &pool);
    // Exact fits first: a buffer that spans the whole valley leaves no narrower valley behind,
    // and one whose top meets the floor beside it (or the capacity) leaves no new step; every
    // valley and step must later be filled exactly, so each one avoided is a constraint less.
    // Then the attempt's key.
    fit_.resize(inst_.items.size());
    for (const int c : pool) {
      const auto& item = inst_.items[std::size_t(c)];
      const Offset top = best_h + item.size;
      int fit = (best_left ? item.end_section == best_b : item.first_section == best_a) ? 1 : 0;
      if (top == capacity_ || (item.first_section > lo && floor_[std::size_t(item.first_section) - 1] == top) ||
          (item.end_section < hi && floor_[std::size_t(item.end_section)] == top))
        ++fit;
      fit_[std::size_t(c)] = exact_fits_first_ ? fit : 0;
    }
    std::stable_sort(pool.begin(), pool.end(), [&](int x, int y) {
      if (fit_[std::size_t(x)] != fit_[std::size_t(y)]) return fit_[std::size_t(x)] > fit_[std::size_t(y)];
      return key_[std::size_t(x)] > key_[std::size_t(y)];
    });
    int tried = -1;
    Outcome result = Outcome::infeasible;
    for (const int c : pool) {
      const auto& item = inst_.items[std::size_t(c)];
      if (tried >= 0) {
        const auto& prev = inst_.items[std::size_t(tried)];
        if (prev.size == item.size && prev.first_section == item.first_section &&
            prev.end_section == item.end_section && prev.alignment == item.alignment)
          continue;
      }
      tried = c;
      const std::size_t mark = trail_.size();
      set(offset_[std::size_t(c)], best_h);
      set(placed_hash_[std::size_t(item.first_section)],
          Offset(std::uint64_t(placed_hash_[std::size_t(item.first_section)]) + memo_.item_key[std::size_t(c)]));
      set(start_sum_[std::size_t(item.first_section)], start_sum_[std::size_t(item.first_section)] - item.size);
      set(end_sum_[std::size_t(item.end_section) - 1], end_sum_[std::size_t(item.end_section) - 1] - item.size);
      for (int s = item.first_section; s < item.end_section; ++s) {
        set(floor_[std::size_t(s)], best_h + item.size);
      }
      for (int s = item.first_section; s + 1 < item.end_section; ++s) set(cross_[std::size_t(s)], cross_[std::size_t(s)] - 1);
      // Buffers live with c now sit above its top in the sections they share with it.
      bool fits = true;
      for (std::size_t k = inst_.conflict_begin[std::size_t(c)]; k < inst_.conflict_begin[std::size_t(c) + 1]; ++k) {
        const int u = inst_.conflicts[k];
        if (offset_[std::size_t(u)] == kUnplaced && best_h + item.size + inst_.items[std::size_t(u)].size > capacity_) {
          fits = false;
          break;
        }
      }
      const Outcome outcome = fits ? node(lo, hi) : dead();
      if (outcome == Outcome::found) return outcome;
      undo(mark);
      if (outcome == Outcome::budget) {
        result = outcome;
        break;
      }
    }
    if (result == Outcome::infeasible) {
      ++backtracks_;
      memo_.insert(key);
    }
    return result;
  }

  std::pair<std::uint64_t, std::uint64_t> state_key(int lo, int hi) const {
    // Only the range's own floors and buffers: a range refuted once is refuted whatever
    // happened in the independent ranges beside it.
    std::uint64_t a = mix(std::uint64_t(lo) * 0x9e3779b97f4a7c15ULL + std::uint64_t(hi));
    std::uint64_t b = mix(a);
    std::uint64_t placed = 0;
    for (int s = lo; s < hi; ++s) {
      a = mix(a ^ std::uint64_t(floor_[std::size_t(s)]));
      b = mix(b + std::uint64_t(floor_[std::size_t(s)]) * 0xff51afd7ed558ccdULL);
      placed += std::uint64_t(placed_hash_[std::size_t(s)]);
    }
    return {mix(a ^ placed), mix(b + placed * 0xc4ceb9fe1a85ec53ULL)};
  }

  Outcome dead() {
    ++backtracks_;
    return Outcome::infeasible;
  }

  // The valley [a, b) at floor h is covered at h by buffers placed side by side, each inside
  // it: some chain of unplaced buffers' lifetimes must run from a to b.
  bool tileable(int a, int b, Offset h) {
    reach_.assign(std::size_t(b - a) + 1, 0);
    reach_[0] = 1;
    for (int x = a; x < b; ++x) {
      if (!reach_[std::size_t(x - a)]) continue;
      for (const int i : by_first_[std::size_t(x)]) {
        if (offset_[std::size_t(i)] != kUnplaced) continue;
        const auto& item = inst_.items[std::size_t(i)];
        if (item.end_section > b || h + item.size > capacity_ || h % item.alignment != 0) continue;
        reach_[std::size_t(item.end_section - a)] = 1;
      }
    }
    return reach_[std::size_t(b - a)] != 0;
  }

  // Some unplaced buffer starts at a (from_left; else ends at b) and stays within [a, b).
  bool shelf_has_candidate(int a, int b, bool from_left, Offset h) const {
    const auto& list = from_left ? by_first_[std::size_t(a)] : by_end_[std::size_t(b - 1)];
    for (const int i : list) {
      if (offset_[std::size_t(i)] != kUnplaced) continue;
      const auto& item = inst_.items[std::size_t(i)];
      if (from_left ? item.end_section > b : item.first_section < a) continue;
      if (h + item.size > capacity_ || h % item.alignment != 0) continue;
      return true;
    }
    return false;
  }

  struct TrailEntry {
    Offset* slot;
    Offset old;
  };
  const Instance& inst_;
  const Bytes capacity_;
  Budget& budget_;
  Memo& memo_;
  const bool exact_fits_first_;  // odd attempts: candidates by exact fit, then by key
  std::vector<double> key_;  // candidates are tried by descending key
  std::vector<Offset> placed_hash_;  // per section: sum of item_key over placed buffers starting there
  std::vector<Offset> offset_, floor_;
  std::vector<Offset> cross_;  // unplaced buffers covering both section s and s + 1
  std::vector<Offset> start_sum_, end_sum_;  // unplaced sizes starting (ending) in section s
  std::vector<char> reach_;  // scratch for tileable()
  std::vector<int> fit_;     // fill(): exact fits of each candidate (0 to 2)
  std::vector<std::vector<int>> by_first_, by_end_;
  std::vector<TrailEntry> trail_;
  std::int64_t backtracks_ = 0;
};

}  // namespace

bool zero_waste_applies(const Instance& inst, Bytes capacity) {
  for (const Bytes total : inst.section_total) {
    if (total != 0 && total != capacity) return false;
  }
  for (const auto& list : inst.obstacles) {
    if (!list.empty()) return false;
  }
  return !inst.items.empty();
}

ZeroWasteMemo zero_waste_memo(const Instance& inst) {
  ZeroWasteMemo memo;
  // 16 bytes a slot: 64 KiB for the smallest problems, 8 MiB at 300 buffers, 64 MiB at most.
  std::size_t slots = 4096;
  while (slots < (std::size_t{1} << 22) && slots < inst.items.size() * 1024) slots *= 2;
  memo.refuted.assign(slots, {0, 0});
  // Identical buffers (lifetime, size, alignment) share a key: the memo sees multisets.
  std::map<std::tuple<int, int, Bytes, Bytes>, std::uint64_t> keys;
  for (const auto& item : inst.items) {
    const auto [it, fresh] = keys.emplace(std::make_tuple(item.first_section, item.end_section, item.size, item.alignment),
                                          mix(0x2545f4914f6cdd1dULL + keys.size()));
    memo.item_key.push_back(it->second);
  }
  return memo;
}

Outcome zero_waste_search(const Instance& inst, Bytes capacity, int attempt, Budget& budget, ZeroWasteMemo& memo,
                          std::vector<Offset>& item_offsets, std::int64_t& backtracks) {
  PerfectSearch search(inst, capacity, attempt, budget, memo);
  return run_attempt(search, item_offsets, backtracks);
}

Instance mirror_instance(const Instance& inst) {
  Instance m = inst;
  const int sections = inst.section_count;
  for (auto& item : m.items) {
    const int first = item.first_section;
    item.first_section = sections - item.end_section;
    item.end_section = sections - first;
  }
  std::reverse(m.section_total.begin(), m.section_total.end());
  m.section_items.clear();
  m.section_begin.assign(1, 0);
  for (int s = sections - 1; s >= 0; --s) {
    m.section_items.insert(m.section_items.end(), inst.section_items.begin() + std::ptrdiff_t(inst.section_begin[std::size_t(s)]),
                           inst.section_items.begin() + std::ptrdiff_t(inst.section_begin[std::size_t(s) + 1]));
    m.section_begin.push_back(m.section_items.size());
  }
  return m;
}

}  // namespace memplan::planner::exact_search
