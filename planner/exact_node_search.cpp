// The exact solver's node search: branch and bound over canonical placements, one feasibility
// question (does every buffer fit under a capacity?) per call, for one preorder. The driver
// (exact_solver.cpp) runs it for targets that are not zero-waste.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>
#include <vector>

#include "memplan/planner/exact_search_internal.h"

namespace memplan::planner::exact_search {

namespace {

// The search, once:
//  * Time is cut into sections at every lifetime endpoint; a buffer covers a contiguous run
//    of sections, and buffers in one section are all live together.
//  * Canonical packings only: every buffer sits at the lowest offset allowed by the buffers
//    already placed that are live with it (its `min offset`), and buffers are placed in
//    non-decreasing offset order (equal offsets in a fixed preorder). Any packing can be
//    pushed down into such a form without growing, so nothing better is lost.
//  * Dominance: a buffer is never placed at or above the top some unplaced buffer would have
//    at its own min offset; that buffer would then sit in a hole it could drop into, which
//    is not canonical.
//  * Section floors: offsets only grow, so in every section the space left above
//    max(section floor, current offset) must hold all unplaced buffers of that section.
//  * Decomposition: once no unplaced buffer crosses a section boundary, the two sides are
//    independent problems and are searched one after the other instead of interleaved.
//  * Budget: the search gives up after a node or time limit; several static preorders
//    (the tie-break among equal offsets) are tried round-robin with doubling node limits,
//    since one ordering often finds in milliseconds what another misses for minutes.

// Static preorders: the tie-break among buffers that could go at the same offset. Named by
// keys, all descending: T = the fullest section the buffer is in (by what is still unplaced
// when the group is formed), A = area, Z = size, W = lifetime length. Ties: problem order.
void rank_items(const Instance& inst, const std::vector<Bytes>& remaining, std::string_view keys,
                const std::vector<int>& items, std::vector<int>& rank, std::vector<std::vector<Bytes>>& table) {
  // The fullest section under each item by a sparse table over the sections the items span:
  // O(S log S + n) instead of walking every lifetime (real traces' span thousands).
  std::vector<Bytes> total(items.size(), 0);
  if (keys.find('T') != std::string_view::npos && !items.empty()) {
    int lo = inst.items[std::size_t(items[0])].first_section, hi = inst.items[std::size_t(items[0])].end_section;
    for (const int i : items) {
      lo = std::min(lo, inst.items[std::size_t(i)].first_section);
      hi = std::max(hi, inst.items[std::size_t(i)].end_section);
    }
    const std::size_t len = std::size_t(hi - lo);
    // `table` is the caller's scratch: its rows keep their memory from one group to the next.
    std::size_t levels = 1;
    while ((std::size_t{2} << (levels - 1)) <= len) ++levels;
    if (table.size() < levels) table.resize(levels);
    table[0].assign(remaining.begin() + lo, remaining.begin() + hi);
    for (std::size_t l = 1, w = 1; l < levels; ++l, w *= 2) {
      const std::vector<Bytes>& prev = table[l - 1];
      std::vector<Bytes>& next = table[l];
      next.resize(len - 2 * w + 1);
      for (std::size_t x = 0; x < next.size(); ++x) next[x] = std::max(prev[x], prev[x + w]);
    }
    for (std::size_t k = 0; k < items.size(); ++k) {
      const auto& item = inst.items[std::size_t(items[k])];
      const std::size_t a = std::size_t(item.first_section - lo), b = std::size_t(item.end_section - lo);
      std::size_t level = 0;
      while ((std::size_t{2} << level) <= b - a) ++level;
      total[k] = std::max(table[level][a], table[level][b - (std::size_t{1} << level)]);
    }
  }
  // The keys sit beside each item (no indirection in the comparisons), and the item index is
  // the last key, so the order is total and std::sort gives what a stable sort would.
  struct Keyed {
    Bytes t, z;
    double a, w;
    int item;
  };
  std::vector<Keyed> keyed(items.size());
  for (std::size_t k = 0; k < items.size(); ++k) {
    const auto& x = inst.items[std::size_t(items[k])];
    keyed[k] = {total[k], x.size, x.area, x.width, items[k]};
  }
  std::sort(keyed.begin(), keyed.end(), [&](const Keyed& x, const Keyed& y) {
    for (const char key : keys) {
      switch (key) {
        case 'T':
          if (x.t != y.t) return x.t > y.t;
          break;
        case 'A':
          if (x.a != y.a) return x.a > y.a;
          break;
        case 'Z':
          if (x.z != y.z) return x.z > y.z;
          break;
        case 'W':
          if (x.w != y.w) return x.w > y.w;
          break;
        default: break;
      }
    }
    return x.item < y.item;
  });
  for (std::size_t k = 0; k < keyed.size(); ++k) rank[std::size_t(keyed[k].item)] = int(k);
}

// Per-section values with range add and range max, O(log S) each: the search asks for the
// largest remainder of a section range at every candidate, and real traces have thousands
// of sections.
class RangeMax {
 public:
  explicit RangeMax(const std::vector<Bytes>& values) : n_(std::max<std::size_t>(1, values.size())) {
    max_.assign(4 * n_, 0);
    add_.assign(4 * n_, 0);
    if (!values.empty()) build(1, 0, n_, values);
  }
  void add(int a, int b, Bytes delta) { add(1, 0, n_, std::size_t(a), std::size_t(b), delta); }
  Bytes max(int a, int b) const { return query(1, 0, n_, std::size_t(a), std::size_t(b)); }
  // A section of [a, b) holding the maximum (the leftmost), for a nonempty range.
  int argmax(int a, int b) const {
    const Bytes target = max(a, b);
    return int(find(1, 0, n_, std::size_t(a), std::size_t(b), target, 0));
  }

 private:
  void build(std::size_t v, std::size_t lo, std::size_t hi, const std::vector<Bytes>& values) {
    if (hi - lo == 1) {
      max_[v] = values[lo];
      return;
    }
    const std::size_t mid = (lo + hi) / 2;
    build(2 * v, lo, mid, values);
    build(2 * v + 1, mid, hi, values);
    max_[v] = std::max(max_[2 * v], max_[2 * v + 1]);
  }
  // add_[v] applies to v's whole range and is already part of max_[v] (not pushed down).
  void add(std::size_t v, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b, Bytes delta) {
    if (b <= lo || hi <= a) return;
    if (a <= lo && hi <= b) {
      max_[v] += delta;
      add_[v] += delta;
      return;
    }
    const std::size_t mid = (lo + hi) / 2;
    add(2 * v, lo, mid, a, b, delta);
    add(2 * v + 1, mid, hi, a, b, delta);
    max_[v] = std::max(max_[2 * v], max_[2 * v + 1]) + add_[v];
  }
  Bytes query(std::size_t v, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b) const {
    if (b <= lo || hi <= a) return std::numeric_limits<Bytes>::min();
    if (a <= lo && hi <= b) return max_[v];
    const std::size_t mid = (lo + hi) / 2;
    const Bytes below = std::max(query(2 * v, lo, mid, a, b), query(2 * v + 1, mid, hi, a, b));
    // No section of [a, b) under v: the sentinel stays as it is (adding to it would overflow).
    return below == std::numeric_limits<Bytes>::min() ? below : below + add_[v];
  }
  // Leftmost position in [a, b) whose value (with `above`, the adds of v's ancestors) is
  // `target`; n_ when there is none in v.
  std::size_t find(std::size_t v, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b, Bytes target,
                   Bytes above) const {
    if (b <= lo || hi <= a || max_[v] + above < target) return n_;
    if (hi - lo == 1) return lo;
    const std::size_t mid = (lo + hi) / 2;
    const std::size_t left = find(2 * v, lo, mid, a, b, target, above + add_[v]);
    return left != n_ ? left : find(2 * v + 1, mid, hi, a, b, target, above + add_[v]);
  }
  std::size_t n_;
  std::vector<Bytes> max_, add_;
};

// One feasibility search: can every item be placed with all tops <= capacity?
class Search {
 public:
  Search(const Instance& inst, Bytes capacity, std::string_view preorder, Budget& budget,
         SearchTrail& trail)
      : inst_(inst), capacity_(capacity), preorder_(preorder), budget_(budget), trail_(trail) {
    rank_.assign(inst.items.size(), 0);
    const std::size_t n = inst.items.size();
    const std::size_t sections = std::size_t(inst.section_count);
    offset_.assign(n, kUnplaced);
    min_offset_.resize(n);
    for (std::size_t i = 0; i < n; ++i) min_offset_[i] = lowest_fit(int(i), 0);
    floor_.assign(sections, 0);
    remaining_ = inst.section_total;
    remaining_max_.emplace(remaining_);
    // cut_[s]: unplaced items covering both section s and s + 1.
    cut_.assign(sections, 0);
    affected_mark_.assign(sections, 0);
    for (std::size_t s = 0; s < sections; ++s) {
      Offset lowest = 0;
      for (std::size_t k = inst.section_begin[s]; k < inst.section_begin[s + 1]; ++k) {
        const Offset m = min_offset_[std::size_t(inst.section_items[k])];
        lowest = k == inst.section_begin[s] ? m : std::min(lowest, m);
      }
      floor_[s] = lowest;
    }
    for (const auto& item : inst.items) {
      for (int s = item.first_section; s + 1 < item.end_section; ++s) ++cut_[std::size_t(s)];
    }
  }

  Outcome run() {
    for (std::size_t i = 0; i < inst_.items.size(); ++i) {
      if (min_offset_[i] + inst_.items[i].size > capacity_) return Outcome::infeasible;
    }
    for (std::size_t s = 0; s < remaining_.size(); ++s) {
      if (remaining_[s] > 0 && floor_[s] + remaining_[s] > capacity_) return Outcome::infeasible;
    }
    std::vector<int> all(inst_.items.size());
    std::iota(all.begin(), all.end(), 0);
    return split_and_solve(all, 0, inst_.section_count);
  }

  // Offsets per item once run() returned found.
  const std::vector<Offset>& offsets() const { return offset_; }
  std::int64_t backtracks() const { return backtracks_; }

 private:
  using TrailEntry = SearchTrailEntry;

  // The trail is a preallocated array (place() reserves room first) because pushing to it is
  // the innermost operation of the search.
  void set(std::int64_t& slot, std::int64_t value) {
    trail_[trail_size_++] = {&slot, slot};
    slot = value;
  }
  void reserve_trail(std::size_t entries) {
    trail_.ensure(trail_size_ + entries);
  }
  // An entry with no slot records that item `old` was placed: its section totals and cuts
  // are restored arithmetically rather than entry by entry.
  void undo(std::size_t mark) {
    while (trail_size_ > mark) {
      const TrailEntry& entry = trail_[--trail_size_];
      if (entry.slot) {
        *entry.slot = entry.old;
        continue;
      }
      const auto& item = inst_.items[std::size_t(entry.old)];
      offset_[std::size_t(entry.old)] = kUnplaced;
      for (int s = item.first_section; s < item.end_section; ++s) remaining_[std::size_t(s)] += item.size;
      remaining_max_->add(item.first_section, item.end_section, item.size);
      for (int s = item.first_section; s + 1 < item.end_section; ++s) ++cut_[std::size_t(s)];
    }
  }

  // Lowest aligned offset >= floor clear of the fixed buffers live with item i (sorted by
  // their bottom, so one pass suffices).
  Offset lowest_fit(int i, Offset floor) const {
    const auto& item = inst_.items[std::size_t(i)];
    Offset x = align_up(floor, item.alignment);
    for (const auto& [lo, hi] : inst_.obstacles[std::size_t(i)]) {
      if (hi <= x) continue;
      if (x + item.size <= lo) break;
      x = align_up(hi, item.alignment);
    }
    return x;
  }

  // Solves the unplaced items of `items` within sections [s_lo, s_hi), first cutting them
  // into independent groups at boundaries no unplaced item crosses.
  Outcome split_and_solve(const std::vector<int>& items, int s_lo, int s_hi) {
    std::vector<int> cuts;  // first section of each group after the first
    for (int s = s_lo; s + 1 < s_hi; ++s) {
      if (cut_[std::size_t(s)] == 0) cuts.push_back(s + 1);
    }
    if (cuts.empty()) return solve_group(items, s_lo, s_hi);
    std::vector<std::vector<int>> groups(cuts.size() + 1);
    for (const int i : items) {
      if (offset_[std::size_t(i)] != kUnplaced) continue;
      const int first = inst_.items[std::size_t(i)].first_section;
      groups[std::size_t(std::upper_bound(cuts.begin(), cuts.end(), first) - cuts.begin())].push_back(i);
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].empty()) continue;
      const int lo = g == 0 ? s_lo : cuts[g - 1];
      const int hi = g == cuts.size() ? s_hi : cuts[g];
      const Outcome outcome = solve_group(groups[g], lo, hi);
      if (outcome != Outcome::found) return outcome;
    }
    return Outcome::found;
  }

  // A group starts a fresh canonical order, ranked by what is left in its sections. Ranks
  // are restored afterwards: a caller that backtracks still orders by its own.
  Outcome solve_group(const std::vector<int>& items, int s_lo, int s_hi) {
    std::vector<int> unplaced, saved;
    for (const int i : items) {
      if (offset_[std::size_t(i)] != kUnplaced) continue;
      unplaced.push_back(i);
      saved.push_back(rank_[std::size_t(i)]);
    }
    rank_items(inst_, remaining_, preorder_, unplaced, rank_, table_);
    const Bytes bound = std::max<Bytes>(0, remaining_max_->max(s_lo, s_hi));
    const Outcome outcome = node(unplaced, s_lo, s_hi, 0, -1, bound);
    for (std::size_t k = 0; k < unplaced.size(); ++k) rank_[std::size_t(unplaced[k])] = saved[k];
    return outcome;
  }

  // Places item c at offset o; false if some unplaced item can no longer fit. Sets hatless_
  // when no unplaced item is live together with c.
  bool place(int c, Offset o) {
    hatless_ = true;
    const auto& item = inst_.items[std::size_t(c)];
    const Offset top = o + item.size;
    const std::size_t degree = inst_.conflict_begin[std::size_t(c) + 1] - inst_.conflict_begin[std::size_t(c)];
    reserve_trail(1 + degree + 2 * std::size_t(inst_.section_count));
    offset_[std::size_t(c)] = o;
    trail_[trail_size_++] = {nullptr, c};
    // c's own floors are set once, after the sweep below.
    for (int s = item.first_section; s < item.end_section; ++s) remaining_[std::size_t(s)] -= item.size;
    remaining_max_->add(item.first_section, item.end_section, -item.size);
    for (int s = item.first_section; s + 1 < item.end_section; ++s) --cut_[std::size_t(s)];
    sweep_.clear();
    for (std::size_t k = inst_.conflict_begin[std::size_t(c)]; k < inst_.conflict_begin[std::size_t(c) + 1]; ++k) {
      const int u = inst_.conflicts[k];
      const Offset old = min_offset_[std::size_t(u)];
      if (offset_[std::size_t(u)] != kUnplaced) continue;
      hatless_ = false;
      if (old >= top) {
        sweep_.emplace_back(old, u);
        continue;
      }
      const Offset lowest = lowest_fit(u, top);
      set(min_offset_[std::size_t(u)], lowest);
      if (lowest + inst_.items[std::size_t(u)].size > capacity_) {
        for (const int s : affected_) affected_mark_[std::size_t(s)] = 0;
        affected_.clear();
        return false;
      }
      sweep_.emplace_back(lowest, u);
      // floor_[s] is the lowest min offset among a section's unplaced items; it can only
      // move where u was (one of) the lowest.
      // Refreshing floors is only pruning, not correctness: on long lifetimes (real traces'
      // buffers span thousands of sections) it would cost more than the nodes it saves.
      const auto& other = inst_.items[std::size_t(u)];
      if (other.end_section - other.first_section > kRefreshSections) continue;
      for (int s = other.first_section; s < other.end_section; ++s) {
        // c's own sections are refreshed below by the sweep.
        if (s >= item.first_section && s < item.end_section) continue;
        if (floor_[std::size_t(s)] >= old) mark_affected(s);
      }
    }
    // c's own sections: every unplaced item there is live with c, so the section's floor is
    // the lowest min offset among c's unplaced conflicts covering it. Painting sections in
    // order of rising min offset (each section once, skipping painted runs by path-halving
    // links) costs O(d log d + span) rather than a rescan of every item of every section.
    {
      std::sort(sweep_.begin(), sweep_.end());
      const int span = item.end_section - item.first_section;
      next_.resize(std::size_t(span) + 1);
      std::iota(next_.begin(), next_.end(), 0);
      paint_.assign(std::size_t(span), top);
      auto find = [&](int x) {
        while (next_[std::size_t(x)] != x) {
          next_[std::size_t(x)] = next_[std::size_t(next_[std::size_t(x)])];
          x = next_[std::size_t(x)];
        }
        return x;
      };
      for (const auto& [m, u] : sweep_) {
        const auto& other = inst_.items[std::size_t(u)];
        const int a = std::max(other.first_section, item.first_section) - item.first_section;
        const int b = std::min(other.end_section, item.end_section) - item.first_section;
        for (int x = find(a); x < b; x = find(x + 1)) {
          paint_[std::size_t(x)] = std::max(top, m);
          next_[std::size_t(x)] = x + 1;
        }
      }
      for (int x = 0; x < span; ++x) {
        std::int64_t& floor = floor_[std::size_t(item.first_section + x)];
        if (floor != paint_[std::size_t(x)]) set(floor, paint_[std::size_t(x)]);
      }
      // Section floors: what is left of a section must fit above its floor.
      for (int s = item.first_section; s < item.end_section; ++s) {
        const Bytes remaining = remaining_[std::size_t(s)];
        if (remaining > 0 && floor_[std::size_t(s)] + remaining > capacity_) {
          for (const int t : affected_) affected_mark_[std::size_t(t)] = 0;
          affected_.clear();
          return false;
        }
      }
    }
    // Unplaced floors: no unplaced item of a section can go below the lowest of their min
    // offsets, so the space under it is lost to that section.
    for (const int s : affected_) {
      affected_mark_[std::size_t(s)] = 0;
      if (inst_.section_begin[std::size_t(s) + 1] - inst_.section_begin[std::size_t(s)] > kRefreshItems) continue;
      Offset lowest = std::numeric_limits<Offset>::max();
      for (std::size_t k = inst_.section_begin[std::size_t(s)]; k < inst_.section_begin[std::size_t(s) + 1]; ++k) {
        const int i = inst_.section_items[k];
        if (offset_[std::size_t(i)] == kUnplaced) lowest = std::min(lowest, min_offset_[std::size_t(i)]);
      }
      if (lowest != std::numeric_limits<Offset>::max() && lowest > floor_[std::size_t(s)]) set(floor_[std::size_t(s)], lowest);
    }
    bool fits = true;
    for (const int s : affected_) {
      const Bytes remaining = remaining_[std::size_t(s)];
      if (remaining > 0 && floor_[std::size_t(s)] + remaining > capacity_) fits = false;
    }
    affected_.clear();
    return fits;
  }

  void mark_affected(int s) {
    if (affected_mark_[std::size_t(s)]) return;
    affected_mark_[std::size_t(s)] = 1;
    affected_.push_back(s);
  }

  // Section floors: every unplaced item will go at or above `o`, so each section needs
  // max(floor, o) + remaining <= capacity. place() checks floor + remaining on the sections
  // whose floor or remainder it changed; this checks o + remaining. `bound` is at least the
  // largest remainder in [s_lo, s_hi) (remainders only shrink deeper in the search): the
  // range query runs only when the bound does not settle it, and tightens the bound for the
  // subtree.
  bool sections_fit(int s_lo, int s_hi, Offset o, Bytes& bound) const {
    if (o + bound <= capacity_) return true;
    bound = std::max<Bytes>(0, remaining_max_->max(s_lo, s_hi));
    return bound == 0 || o + bound <= capacity_;
  }

  Outcome node(const std::vector<int>& all_items, int s_lo, int s_hi, Offset last_offset, int last_rank, Bytes bound) {
    if (!budget_.spend()) return Outcome::budget;
    Offset min_top = std::numeric_limits<Offset>::max();
    std::size_t unplaced = 0;
    for (const int i : all_items) {
      if (offset_[std::size_t(i)] != kUnplaced) continue;
      ++unplaced;
      min_top = std::min(min_top, min_offset_[std::size_t(i)] + inst_.items[std::size_t(i)].size);
    }
    if (unplaced == 0) return Outcome::found;
    // Every node scans its group's list: once most of it is placed, this node and the ones
    // below it scan a list of the unplaced only (a list at most twice what is left).
    std::vector<int> compact;
    if (all_items.size() > 64 && 2 * unplaced < all_items.size()) {
      compact.reserve(unplaced);
      for (const int i : all_items) {
        if (offset_[std::size_t(i)] == kUnplaced) compact.push_back(i);
      }
    }
    const std::vector<int>& items = compact.empty() ? all_items : compact;
    // An unplaced item whose whole slot lies below the current offset can never be placed
    // canonically: dead end.
    if (min_top <= last_offset) return Outcome::infeasible;
    // The fullest section: once o + its remainder exceeds the capacity, only a candidate
    // covering it can be next.
    const Bytes fullest = std::max<Bytes>(0, remaining_max_->max(s_lo, s_hi));
    const int fullest_at = fullest > 0 ? remaining_max_->argmax(s_lo, s_hi) : -1;
    const std::size_t base = pool_.size();
    for (const int i : items) {
      if (offset_[std::size_t(i)] != kUnplaced) continue;
      const Offset m = min_offset_[std::size_t(i)];
      if (m >= min_top || m < last_offset) continue;
      if (m == last_offset && rank_[std::size_t(i)] < last_rank) continue;
      if (fullest > 0 && m + fullest > capacity_) {
        const auto& item = inst_.items[std::size_t(i)];
        if (fullest_at < item.first_section || fullest_at >= item.end_section) continue;
      }
      pool_.push_back(i);
    }
    // Candidates go by (min offset, rank), a total order within a group. Most nodes take
    // only their first candidate (on real traces nearly all do): it is found by one linear
    // pass, and the rest come off a heap one by one if the node needs them.
    auto later = [&](int a, int b) {
      if (min_offset_[std::size_t(a)] != min_offset_[std::size_t(b)])
        return min_offset_[std::size_t(a)] > min_offset_[std::size_t(b)];
      return rank_[std::size_t(a)] > rank_[std::size_t(b)];
    };
    std::size_t heap_end = pool_.size();
    bool heaped = false;
    Outcome result = Outcome::infeasible;
    while (heap_end > base) {
      const auto first = pool_.begin() + std::ptrdiff_t(base), last = pool_.begin() + std::ptrdiff_t(heap_end);
      if (heap_end == pool_.size()) {
        // The first candidate by one linear pass; a heap only if the node needs more.
        std::iter_swap(std::max_element(first, last, later), last - 1);
      } else {
        if (!heaped) std::make_heap(first, last, later);
        heaped = true;
        std::pop_heap(first, last, later);
      }
      const int c = pool_[--heap_end];
      const Offset o = min_offset_[std::size_t(c)];
      const std::size_t mark = trail_size_;
      // Every buffer left goes at or above o: a section whose remainder would not fit above o
      // once c is placed rules c out before any of place()'s work.
      if (o + bound > capacity_) {
        const auto& item = inst_.items[std::size_t(c)];
        const Bytes after = std::max({remaining_max_->max(s_lo, item.first_section),
                                      remaining_max_->max(item.end_section, s_hi),
                                      remaining_max_->max(item.first_section, item.end_section) - item.size});
        if (after > 0 && o + after > capacity_) {
          continue;
        }
      }
      Bytes child_bound = bound;
      if (place(c, o) && sections_fit(s_lo, s_hi, o, child_bound)) {
        const Outcome outcome = after_place(items, c, s_lo, s_hi, o, child_bound);
        if (outcome == Outcome::found) {
          pool_.resize(base);
          return outcome;
        }
        if (outcome == Outcome::budget) {
          undo(mark);
          result = outcome;
          break;
        }
      }
      undo(mark);
      // A buffer live with no unplaced buffer constrains nobody: if the rest failed with it
      // placed here, placing anything else first only pushes it higher. No sibling can help.
      if (hatless_) break;
    }
    pool_.resize(base);
    if (result == Outcome::infeasible) ++backtracks_;
    return result;
  }

  Outcome after_place(const std::vector<int>& items, int c, int s_lo, int s_hi, Offset o, Bytes bound) {
    const auto& item = inst_.items[std::size_t(c)];
    for (int s = std::max(item.first_section, s_lo); s + 1 < std::min(item.end_section, s_hi); ++s) {
      if (cut_[std::size_t(s)] == 0) return split_and_solve(items, s_lo, s_hi);
    }
    return node(items, s_lo, s_hi, o, rank_[std::size_t(c)], bound);
  }

  static constexpr int kRefreshSections = 64;
  static constexpr std::size_t kRefreshItems = 256;
  const Instance& inst_;
  const Bytes capacity_;
  const std::string_view preorder_;
  std::vector<int> rank_;  // position in the preorder of the item's group
  Budget& budget_;
  std::vector<std::int64_t> offset_, min_offset_, floor_, remaining_, cut_;
  SearchTrail& trail_;  // the caller's: its memory serves attempt after attempt
  std::size_t trail_size_ = 0;
  std::vector<int> pool_;
  bool hatless_ = false;               // set by place()
  std::int64_t backtracks_ = 0;
  std::vector<int> affected_;          // sections whose unplaced floor may have risen
  std::vector<std::pair<Offset, int>> sweep_;  // place(): (min offset, item) of c's unplaced conflicts
  std::vector<int> next_;              // place(): next unpainted section of c's span
  std::vector<Offset> paint_;          // place(): c's span's new floors
  std::vector<std::vector<Bytes>> table_;  // rank_items() scratch
  std::optional<RangeMax> remaining_max_;  // remaining_, for range maxima
  std::vector<char> affected_mark_;    // dedupes affected_
};

}  // namespace

Outcome node_search(const Instance& inst, Bytes capacity, std::string_view preorder, Budget& budget,
                    SearchTrail& trail, std::vector<Offset>& item_offsets, std::int64_t& backtracks) {
  Search search(inst, capacity, preorder, budget, trail);
  return run_attempt(search, item_offsets, backtracks);
}

}  // namespace memplan::planner::exact_search
