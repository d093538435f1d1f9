#include "memplan/planner/exact_solver.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>

#include "memplan/planner/greedy_solver.h"
#include "memplan/planner/validator.h"

namespace memplan::planner {

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

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

enum class Outcome { found, infeasible, budget };

constexpr Offset kUnplaced = -1;

// Node and time limits at three levels: the whole solve, one phase (a target height while
// minimising) and one attempt (one preorder in the round-robin).
class Budget {
 public:
  Budget(std::int64_t node_limit, std::optional<Clock::time_point> deadline)
      : node_limit_(node_limit), deadline_(deadline) {}

  // Spends one node; false once any limit is reached.
  bool spend() {
    ++nodes_;
    if (attempt_nodes_left_-- <= 0) return false;
    if ((node_limit_ >= 0 && nodes_ > node_limit_) || (phase_node_limit_ >= 0 && nodes_ > phase_node_limit_)) {
      exhausted_ = true;
      return false;
    }
    // Reading the clock costs more than a node, so look at it every 256 nodes.
    if ((nodes_ & 255) == 0) check_clock();
    return !exhausted_;
  }

  void start_attempt(std::int64_t nodes) { attempt_nodes_left_ = nodes; }
  // A phase gets at most `share` of what is left of the whole budget (nodes and time).
  void start_phase(double share) {
    exhausted_ = false;
    phase_node_limit_ = node_limit_ < 0 ? -1 : nodes_ + std::int64_t(double(node_limit_ - nodes_) * share);
    phase_deadline_ = deadline_;
    if (deadline_) {
      const auto left = *deadline_ - Clock::now();
      phase_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(left * share);
    }
  }
  // The current phase (or the whole solve) is out of nodes or time.
  bool exhausted() {
    check_clock();
    return exhausted_;
  }
  // The whole solve is out of nodes or time.
  bool solve_exhausted() const {
    return (node_limit_ >= 0 && nodes_ >= node_limit_) || (deadline_ && Clock::now() >= *deadline_);
  }
  std::int64_t nodes() const { return nodes_; }

 private:
  void check_clock() {
    if (phase_deadline_ && Clock::now() >= *phase_deadline_) exhausted_ = true;
  }

  std::int64_t node_limit_;
  std::optional<Clock::time_point> deadline_;
  std::int64_t phase_node_limit_ = -1;
  std::optional<Clock::time_point> phase_deadline_;
  std::int64_t attempt_nodes_left_ = std::numeric_limits<std::int64_t>::max();
  std::int64_t nodes_ = 0;
  bool exhausted_ = false;
};

// Buffers the search places (not fixed, not zero-size), with sections and conflicts.
struct Instance {
  struct Item {
    std::size_t buffer;  // index into problem.buffers
    Bytes size;          // footprint
    Bytes alignment;
    int first_section, end_section;  // covers sections [first_section, end_section)
    double area;
    double width;  // lifetime length in time units
  };
  std::vector<Item> items;
  int section_count = 0;
  std::vector<std::size_t> conflict_begin;  // CSR: conflicts of item i are
  std::vector<int> conflicts;               //   conflicts[conflict_begin[i] .. [i+1])
  std::vector<std::vector<std::pair<Offset, Offset>>> obstacles;  // fixed [lo, hi) per item
  std::vector<std::size_t> section_begin;  // CSR: items covering section s are
  std::vector<int> section_items;          //   section_items[section_begin[s] .. [s+1])
  std::vector<Bytes> section_total;  // sum of item sizes per section
  std::vector<Bytes> item_total;     // max section_total over an item's sections
};

std::int64_t count_conflict_pairs(const AllocationProblem& problem, const std::vector<std::size_t>& searched) {
  std::vector<TimePoint> starts;
  for (const std::size_t b : searched) starts.push_back(problem.buffers[b].first_op);
  std::sort(starts.begin(), starts.end());
  std::int64_t pairs = 0;
  for (const std::size_t b : searched) {
    const BufferSpec& buffer = problem.buffers[b];
    // buffers starting in [first_op, end_op), minus itself: each overlapping pair is counted
    // once from the buffer that starts first (ties counted twice: an upper estimate).
    pairs += std::int64_t(std::lower_bound(starts.begin(), starts.end(), buffer.end_op) -
                          std::lower_bound(starts.begin(), starts.end(), buffer.first_op)) - 1;
  }
  return pairs;
}

Instance build_instance(const AllocationProblem& problem, const std::vector<std::size_t>& searched) {
  Instance inst;
  std::vector<TimePoint> times;
  for (const std::size_t b : searched) {
    times.push_back(problem.buffers[b].first_op);
    times.push_back(problem.buffers[b].end_op);
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  inst.section_count = std::max(0, int(times.size()) - 1);
  auto section_of = [&](TimePoint t) { return int(std::lower_bound(times.begin(), times.end(), t) - times.begin()); };
  for (const std::size_t b : searched) {
    const BufferSpec& buffer = problem.buffers[b];
    inst.items.push_back({b, footprint_bytes(buffer), buffer.alignment, section_of(buffer.first_op),
                          section_of(buffer.end_op),
                          double(footprint_bytes(buffer)) * (double(buffer.end_op) - double(buffer.first_op)),
                          double(buffer.end_op) - double(buffer.first_op)});
  }
  const int n = int(inst.items.size());
  // Conflicts: scanning in start order, every later buffer that starts before this one ends
  // overlaps it, so the scan touches only real pairs.
  std::vector<int> by_start(std::size_t(n), 0);
  std::iota(by_start.begin(), by_start.end(), 0);
  std::sort(by_start.begin(), by_start.end(), [&](int a, int b) {
    return inst.items[std::size_t(a)].first_section < inst.items[std::size_t(b)].first_section;
  });
  // Two scans, one to count and one to fill, write the CSR arrays in place (real traces have
  // millions of pairs: per-item lists would be allocated, grown and copied).
  inst.conflict_begin.assign(std::size_t(n) + 1, 0);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<std::size_t> fill;
    if (pass == 1) {
      for (int i = 0; i < n; ++i) inst.conflict_begin[std::size_t(i) + 1] += inst.conflict_begin[std::size_t(i)];
      inst.conflicts.resize(inst.conflict_begin.back());
      fill.assign(inst.conflict_begin.begin(), inst.conflict_begin.end() - 1);
    }
    for (int x = 0; x < n; ++x) {
      const int i = by_start[std::size_t(x)];
      for (int y = x + 1; y < n; ++y) {
        const int j = by_start[std::size_t(y)];
        if (inst.items[std::size_t(j)].first_section >= inst.items[std::size_t(i)].end_section) break;
        if (pass == 0) {
          ++inst.conflict_begin[std::size_t(i) + 1];
          ++inst.conflict_begin[std::size_t(j) + 1];
        } else {
          inst.conflicts[fill[std::size_t(i)]++] = j;
          inst.conflicts[fill[std::size_t(j)]++] = i;
        }
      }
    }
  }
  inst.obstacles.resize(std::size_t(n));
  for (std::size_t f = 0; f < problem.buffers.size(); ++f) {
    const BufferSpec& fixed = problem.buffers[f];
    if (!fixed.fixed_offset || footprint_bytes(fixed) == 0) continue;
    for (int i = 0; i < n; ++i) {
      if (lifetimes_overlap(fixed, problem.buffers[inst.items[std::size_t(i)].buffer])) {
        inst.obstacles[std::size_t(i)].emplace_back(*fixed.fixed_offset, *fixed.fixed_offset + footprint_bytes(fixed));
      }
    }
  }
  for (auto& list : inst.obstacles) std::sort(list.begin(), list.end());
  inst.section_total.assign(std::size_t(inst.section_count), 0);
  for (const auto& item : inst.items) {
    for (int s = item.first_section; s < item.end_section; ++s) inst.section_total[std::size_t(s)] += item.size;
  }
  inst.section_begin.assign(std::size_t(inst.section_count) + 1, 0);
  for (const auto& item : inst.items) {
    for (int s = item.first_section; s < item.end_section; ++s) ++inst.section_begin[std::size_t(s) + 1];
  }
  for (std::size_t s = 0; s < std::size_t(inst.section_count); ++s) inst.section_begin[s + 1] += inst.section_begin[s];
  inst.section_items.resize(inst.section_begin.back());
  {
    std::vector<std::size_t> fill(inst.section_begin.begin(), inst.section_begin.end() - 1);
    for (int i = 0; i < n; ++i) {
      const auto& item = inst.items[std::size_t(i)];
      for (int s = item.first_section; s < item.end_section; ++s) inst.section_items[fill[std::size_t(s)]++] = i;
    }
  }
  for (const auto& item : inst.items) {
    Bytes total = 0;
    for (int s = item.first_section; s < item.end_section; ++s) total = std::max(total, inst.section_total[std::size_t(s)]);
    inst.item_total.push_back(total);
  }
  return inst;
}

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

// One undo record of the general search: the slot and its old value (no slot: an item placed).
struct SearchTrailEntry {
  std::int64_t* slot;
  std::int64_t old;
};

// The general search's undo records, in fixed chunks that are allocated as the trail first
// grows that deep and never copied or cleared: real traces' trails run to millions of entries,
// and a vector's doubling (copy, zero-fill) made the page faults cost as much as the search.
// The chunks outlive one attempt, so later attempts reuse their memory.
class SearchTrail {
 public:
  SearchTrailEntry& operator[](std::size_t i) { return chunks_[i >> kShift][i & (kChunk - 1)]; }
  // Room for indices below `size`.
  void ensure(std::size_t size) {
    while (chunks_.size() << kShift < size) chunks_.emplace_back(new SearchTrailEntry[kChunk]);
  }

 private:
  static constexpr std::size_t kShift = 16;
  static constexpr std::size_t kChunk = std::size_t{1} << kShift;
  std::vector<std::unique_ptr<SearchTrailEntry[]>> chunks_;
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
std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class PerfectSearch {
 public:
  // Refuted (range, floors, placed multiset) states, as two independent 64-bit hashes, in a
  // fixed table where a newer refutation overwrites an older one in its slot: it keeps
  // learning for the whole solve in bounded memory, and stays deterministic.
  struct Memo {
    std::vector<std::uint64_t> item_key;  // per item: equal for identical buffers
    std::vector<std::pair<std::uint64_t, std::uint64_t>> refuted;  // size a power of two
    bool contains(const std::pair<std::uint64_t, std::uint64_t>& key) const {
      return refuted[key.first & (refuted.size() - 1)] == key;
    }
    void insert(const std::pair<std::uint64_t, std::uint64_t>& key) { refuted[key.first & (refuted.size() - 1)] = key; }
  };

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

  // The target applies when every occupied section sums to exactly it and nothing is fixed.
  static bool applies(const Instance& inst, Bytes capacity) {
    for (const Bytes total : inst.section_total) {
      if (total != 0 && total != capacity) return false;
    }
    for (const auto& list : inst.obstacles) {
      if (!list.empty()) return false;
    }
    return !inst.items.empty();
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

// Band decomposition, for zero-waste targets whose packing can be cut recursively, in time or
// in offset, into rectangles each filled by one buffer (a guillotine packing: the zero-slack
// family is built that way, and so are arenas where groups of buffers fill a band exactly).
// Complete for such packings, and not beyond them: it finding none proves nothing, so it takes
// turns with the zero-waste search above (feasible_within). Over a set of buffers that fills [a, b) x height:
//  * where no buffer of the set crosses a time, the two sides are independent rectangles;
//  * a buffer spanning all of [a, b) can go to the bottom (what lies above and below it are
//    full rectangles, so it can be moved below the lower one);
//  * otherwise the top cut is in offset: the set is a stack of bands, each spanning [a, b)
//    at a constant height, and the bands can be stacked in any order. The band holding one
//    chosen buffer (the pivot, starting at a) is a subset where, at every time inside the
//    range, the sizes of its buffers that end there add up to those that start there, and
//    which some time inside the range cuts (else it would split further, by offset). The
//    band and the rest are then packed apart, one above the other.
// Bands are found by a depth-first search that adds buffers to balance the boundary with the
// fewest candidates, pruned by subset sums (bitsets in units of the sizes' common divisor):
// an imbalance no subset of the undecided buffers there can cancel is a dead end. Sets that
// could not be packed are remembered by their multiset of buffers (identical buffers alike),
// since many bands leave the same rest.
class BandSearch {
 public:
  // Sets of buffers (as multisets, with the base's misalignment) that have no guillotine
  // packing: kept across attempts, since a restart with a larger node limit meets them again.
  using Key = std::pair<std::uint64_t, std::uint64_t>;
  struct KeyHash {
    std::size_t operator()(const Key& k) const { return std::size_t(k.first ^ (k.second * 0x9e3779b97f4a7c15ULL)); }
  };
  using Memo = std::unordered_set<Key, KeyHash>;

  BandSearch(const Instance& inst, Bytes capacity, Budget& budget, const std::vector<std::uint64_t>& item_key, Memo& failed)
      : inst_(inst), capacity_(capacity), budget_(budget), item_key_(item_key), failed_(failed) {
    offset_.assign(inst.items.size(), kUnplaced);
    unit_ = capacity;
    for (const auto& item : inst.items) {
      unit_ = std::gcd(unit_, item.size);
      align_ = std::max(align_, item.alignment);
    }
    // Subset sums as bitsets up to the height in units; past 2^16 bits the plain sums prune.
    use_bitsets_ = unit_ > 0 && capacity / unit_ < (Bytes{1} << 16);
  }

  Outcome run() {
    std::vector<int> all(inst_.items.size());
    std::iota(all.begin(), all.end(), 0);
    return solve(all, capacity_, 0);
  }
  const std::vector<Offset>& offsets() const { return offset_; }
  std::int64_t backtracks() const { return backtracks_; }

 private:
  Key set_key(const std::vector<int>& items, Offset base) const {
    // Order-free: sums of two hashes of each buffer's class, with the base's misalignment.
    std::uint64_t a = mix(std::uint64_t(base % align_) + 0x51ed27fULL), b = mix(a + 1);
    for (const int i : items) {
      a += mix(item_key_[std::size_t(i)]);
      b += mix(item_key_[std::size_t(i)] ^ 0xd6e8feb86659fd93ULL);
    }
    return {a, b};
  }

  // Packs `items`, which fill their time range at `height` in every section, from `base` up.
  Outcome solve(const std::vector<int>& items, Bytes height, Offset base) {
    if (!budget_.spend()) return Outcome::budget;
    const Key key = set_key(items, base);
    if (failed_.count(key)) return dead();
    const Outcome outcome = solve_uncached(items, height, base);
    if (outcome == Outcome::infeasible) {
      if (failed_.size() >= kMaxRemembered) failed_.clear();
      failed_.insert(key);
    }
    return outcome;
  }

  Outcome solve_uncached(const std::vector<int>& items, Bytes height, Offset base) {
    // Independent time ranges: split where no buffer crosses.
    std::vector<int> sorted = items;
    std::stable_sort(sorted.begin(), sorted.end(), [&](int x, int y) { return item(x).first_section < item(y).first_section; });
    int reach = item(sorted[0]).end_section;
    for (std::size_t k = 1; k < sorted.size(); ++k) {
      if (item(sorted[k]).first_section >= reach) {
        const std::vector<int> left(sorted.begin(), sorted.begin() + std::ptrdiff_t(k));
        const std::vector<int> right(sorted.begin() + std::ptrdiff_t(k), sorted.end());
        const Outcome outcome = solve(left, height, base);
        return outcome == Outcome::found ? solve(right, height, base) : outcome;
      }
      reach = std::max(reach, item(sorted[k]).end_section);
    }
    const int a = item(sorted[0]).first_section;
    const int b = reach;
    // Buffers spanning the whole range go to the bottom.
    std::vector<int> rest;
    Offset top = base;
    for (const int i : sorted) {
      if (item(i).first_section == a && item(i).end_section == b) {
        if (top % item(i).alignment != 0) return dead();
        offset_[std::size_t(i)] = top;
        top += item(i).size;
      } else {
        rest.push_back(i);
      }
    }
    if (rest.empty()) return top - base == height ? Outcome::found : dead();
    if (top != base) return solve(rest, height - (top - base), top);
    return choose_band(rest, a, b, height, base);
  }

  // The band search over `items` (no time cut, no buffer spanning [a, b)).
  struct Band {
    int a = 0, b = 0;
    std::vector<int> items;
    std::vector<std::vector<int>> starts, ends;  // per boundary t - a: positions in items
    std::vector<signed char> state;               // per position: 0 undecided, 1 in, -1 out
    std::vector<Bytes> imbalance;                 // per boundary: sizes starting - ending (in)
    Bytes edge = 0;                               // sizes starting at a - ending at b (in)
    std::vector<int> cover;                       // per boundary: chosen buffers crossing it
    std::vector<int> chosen;
  };

  Outcome choose_band(const std::vector<int>& items, int a, int b, Bytes height, Offset base) {
    Band band;
    band.a = a;
    band.b = b;
    band.items = items;
    const std::size_t boundaries = std::size_t(b - a + 1);
    band.starts.resize(boundaries);
    band.ends.resize(boundaries);
    band.imbalance.assign(boundaries, 0);
    band.cover.assign(boundaries, 0);
    band.state.assign(items.size(), 0);
    for (std::size_t k = 0; k < items.size(); ++k) {
      band.starts[std::size_t(item(items[k]).first_section - a)].push_back(int(k));
      band.ends[std::size_t(item(items[k]).end_section - a)].push_back(int(k));
    }
    // The pivot: the largest buffer (by area) starting at a; every band has some.
    int pivot = -1;
    for (const int k : band.starts[0]) {
      if (pivot < 0 || item(items[std::size_t(k)]).area > item(items[std::size_t(pivot)]).area) pivot = k;
    }
    choose(band, pivot, 1);
    return band_node(band, height, base);
  }

  void choose(Band& band, int k, int sign) {
    const auto& it = item(band.items[std::size_t(k)]);
    band.state[std::size_t(k)] = sign > 0 ? 1 : 0;
    const Bytes size = it.size * sign;
    if (it.first_section == band.a) band.edge += size; else band.imbalance[std::size_t(it.first_section - band.a)] += size;
    if (it.end_section == band.b) band.edge -= size; else band.imbalance[std::size_t(it.end_section - band.a)] -= size;
    for (int t = it.first_section + 1; t < it.end_section; ++t) band.cover[std::size_t(t - band.a)] += sign;
    if (sign > 0) band.chosen.push_back(k); else band.chosen.pop_back();
  }

  Outcome band_node(Band& band, Bytes height, Offset base) {
    if (!budget_.spend()) return Outcome::budget;
    if (dead_end(band, height)) return dead();
    // The boundary to balance: the one with the fewest candidates; the edge last.
    int need = -1;
    std::size_t fewest = std::numeric_limits<std::size_t>::max();
    for (int t = band.a + 1; t < band.b; ++t) {
      const Bytes v = band.imbalance[std::size_t(t - band.a)];
      if (v == 0) continue;
      const std::size_t count = undecided(band, v > 0 ? band.ends[std::size_t(t - band.a)] : band.starts[std::size_t(t - band.a)]);
      if (count < fewest) {
        fewest = count;
        need = t;
      }
    }
    std::vector<int> pool;
    Bytes gap = 0;
    if (need >= 0) {
      gap = band.imbalance[std::size_t(need - band.a)];
      pool = gap > 0 ? band.ends[std::size_t(need - band.a)] : band.starts[std::size_t(need - band.a)];
    } else if (band.edge != 0) {
      gap = band.edge;
      pool = gap > 0 ? band.ends.back() : band.starts.front();
    } else {
      // Balanced: a band. Pack it and the rest; if either fails, grow it by another buffer
      // starting at a (a larger band holding this one).
      if (band.chosen.size() < band.items.size()) {
        std::vector<int> in, out;
        Bytes y = 0;
        for (std::size_t k = 0; k < band.items.size(); ++k) {
          (band.state[k] == 1 ? in : out).push_back(band.items[k]);
          if (band.state[k] == 1 && item(band.items[k]).first_section == band.a) y += item(band.items[k]).size;
        }
        Outcome outcome = solve(in, y, base);
        if (outcome == Outcome::found) outcome = solve(out, height - y, base + y);
        if (outcome != Outcome::infeasible) return outcome;
      }
      pool = band.starts.front();
    }
    const Bytes want = gap < 0 ? -gap : gap;
    std::erase_if(pool, [&](int k) { return band.state[std::size_t(k)] != 0; });
    // Exact fits first, then larger buffers: fewer steps to balance.
    std::stable_sort(pool.begin(), pool.end(), [&](int x, int y) {
      const Bytes sx = item(band.items[std::size_t(x)]).size, sy = item(band.items[std::size_t(y)]).size;
      if ((sx == want) != (sy == want)) return sx == want;
      return sx > sy;
    });
    // Each candidate in turn, the ones before it left out (so every band is met once);
    // identical buffers are tried once.
    std::vector<int> excluded;
    Outcome result = Outcome::infeasible;
    std::vector<std::uint64_t> tried;
    for (const int k : pool) {
      const std::uint64_t cls = item_key_[std::size_t(band.items[std::size_t(k)])];
      if (std::find(tried.begin(), tried.end(), cls) == tried.end()) {
        tried.push_back(cls);
        choose(band, k, 1);
        const Outcome outcome = band_node(band, height, base);
        choose(band, k, -1);
        if (outcome != Outcome::infeasible) {
          result = outcome;
          break;
        }
      }
      band.state[std::size_t(k)] = -1;
      excluded.push_back(k);
    }
    for (const int k : excluded) band.state[std::size_t(k)] = 0;
    if (result == Outcome::infeasible) ++backtracks_;
    return result;
  }

  std::size_t undecided(const Band& band, const std::vector<int>& list) const {
    std::size_t n = 0;
    for (const int k : list) n += band.state[std::size_t(k)] == 0 ? 1 : 0;
    return n;
  }

  // No band can come of this choice: every time inside the range is crossed by a chosen
  // buffer (a band has a time cut), or some boundary's imbalance cannot be cancelled.
  bool dead_end(const Band& band, Bytes height) {
    bool cut = false;
    for (int t = band.a + 1; t < band.b && !cut; ++t) cut = band.cover[std::size_t(t - band.a)] == 0;
    if (!cut) return true;
    for (int t = band.a + 1; t < band.b; ++t) {
      const Bytes v = band.imbalance[std::size_t(t - band.a)];
      if (v != 0 && !cancellable(band, v, band.ends[std::size_t(t - band.a)], band.starts[std::size_t(t - band.a)], height)) return true;
    }
    return band.edge != 0 && !cancellable(band, band.edge, band.ends.back(), band.starts.front(), height);
  }

  // Can undecided buffers from `ends` (sum E) and `starts` (sum S) give E - S == v?
  bool cancellable(const Band& band, Bytes v, const std::vector<int>& ends, const std::vector<int>& starts, Bytes height) {
    Bytes end_sum = 0, start_sum = 0;
    for (const int k : ends) end_sum += band.state[std::size_t(k)] == 0 ? item(band.items[std::size_t(k)]).size : 0;
    for (const int k : starts) start_sum += band.state[std::size_t(k)] == 0 ? item(band.items[std::size_t(k)]).size : 0;
    if (v > 0 ? end_sum < v : start_sum < -v) return false;
    if (!use_bitsets_) return true;
    const std::size_t bits = std::size_t(height / unit_) + 1;
    subset_sums(band, ends, bits, end_bits_);
    subset_sums(band, starts, bits, start_bits_);
    // v > 0: some e in E with e - v in S; v < 0: some s in S with s + v in E.
    const auto& high = v > 0 ? end_bits_ : start_bits_;
    const auto& low = v > 0 ? start_bits_ : end_bits_;
    const std::size_t shift = std::size_t((v > 0 ? v : -v) / unit_);
    const std::size_t words = (bits + 63) / 64;
    for (std::size_t w = 0; w < words; ++w) {
      // Bits [64w, 64w + 64) of high >> shift.
      const std::size_t from = w * 64 + shift;
      const std::size_t q = from / 64, r = from % 64;
      if (q >= words) break;
      std::uint64_t x = high[q] >> r;
      if (r != 0 && q + 1 < words) x |= high[q + 1] << (64 - r);
      if (x & low[w]) return true;
    }
    return false;
  }

  void subset_sums(const Band& band, const std::vector<int>& list, std::size_t bits, std::vector<std::uint64_t>& out) const {
    const std::size_t words = (bits + 63) / 64;
    out.assign(words, 0);
    out[0] = 1;
    for (const int k : list) {
      if (band.state[std::size_t(k)] != 0) continue;
      const std::size_t shift = std::size_t(item(band.items[std::size_t(k)]).size / unit_);
      const std::size_t q = shift / 64, r = shift % 64;
      for (std::size_t w = words; w-- > q;) {
        std::uint64_t x = out[w - q] << r;
        if (r != 0 && w - q >= 1) x |= out[w - q - 1] >> (64 - r);
        out[w] |= x;
      }
    }
    if (bits % 64 != 0) out[words - 1] &= (std::uint64_t{1} << (bits % 64)) - 1;
  }

  const Instance::Item& item(int i) const { return inst_.items[std::size_t(i)]; }
  Outcome dead() {
    ++backtracks_;
    return Outcome::infeasible;
  }

  static constexpr std::size_t kMaxRemembered = std::size_t{1} << 20;
  const Instance& inst_;
  const Bytes capacity_;
  Budget& budget_;
  const std::vector<std::uint64_t>& item_key_;
  Bytes unit_ = 1;
  Bytes align_ = 1;
  bool use_bitsets_ = false;
  std::vector<Offset> offset_;
  std::vector<std::uint64_t> end_bits_, start_bits_;
  Memo& failed_;
  std::int64_t backtracks_ = 0;
};

constexpr std::string_view kPreorders[] = {"WAT", "TAW", "TWA"};

// The same buffers with time running backwards (section s becomes S - 1 - s; items keep their
// indices, so offsets carry over unchanged). A packing of one is a packing of the other, but
// the zero-waste search scans valleys from the earliest and breaks ties towards it, so the
// mirror searches the same problem in a different order.
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

// Round-robin feasibility for one target height. found: item_offsets filled; infeasible:
// proven (any one ordering's exhausted search is a proof); budget: the phase ran out.
Outcome feasible_within(const Instance& inst, Bytes capacity, Budget& budget, SearchTrail& trail,
                        std::vector<Offset>& item_offsets, bool band_search,
                        ExactSolverStats& stats) {
  std::int64_t limit = std::max<std::int64_t>(256, std::int64_t(inst.items.size()) * 2);
  const bool perfect = PerfectSearch::applies(inst, capacity);
  PerfectSearch::Memo memo, mirror_memo;
  std::optional<Instance> mirror;
  if (perfect) {
    stats.zero_waste = true;
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
  }
  // The band decomposition and the zero-waste search share the nodes about equally: a band
  // attempt runs before a round whenever the zero-waste search has spent as many nodes as it,
  // its node limit growing fourfold each time up to a few thousand nodes a buffer (the named
  // zero-slack problems need up to ~530 a buffer), its refuted sets kept. So problems the
  // zero-waste search packs in milliseconds do not wait for it. It only knows guillotine
  // packings: its not finding one proves nothing.
  BandSearch::Memo band_memo;
  bool bands_left = perfect && band_search;
  std::int64_t band_limit = std::int64_t{1} << 15;
  const std::int64_t band_cap = std::max<std::int64_t>(std::int64_t{1} << 16, std::int64_t(inst.items.size()) * 4096);
  std::int64_t band_nodes = 0, zero_waste_nodes = 0;
  for (int attempt = 0;; ++attempt) {
    if (bands_left && band_nodes <= zero_waste_nodes) {
      ++stats.attempts;
      const std::int64_t before = budget.nodes();
      budget.start_attempt(band_limit);
      BandSearch bands(inst, capacity, budget, memo.item_key, band_memo);
      const Outcome outcome = bands.run();
      band_nodes += budget.nodes() - before;
      stats.backtracks += bands.backtracks();
      if (outcome == Outcome::found) {
        item_offsets = bands.offsets();
        stats.bands = true;
        return outcome;
      }
      if (budget.exhausted()) return Outcome::budget;
      // Searched to the end, or as far as it goes: no more attempts.
      bands_left = outcome == Outcome::budget && band_limit < band_cap;
      band_limit = std::min(band_limit * 4, band_cap);
    }
    const std::int64_t round_start = budget.nodes();
    for (int k = 0; k < 3; ++k) {
      ++stats.attempts;
      budget.start_attempt(limit);
      Outcome outcome;
      if (perfect) {
        // Every other round searches the mirror.
        const bool mirrored = attempt % 2 == 1;
        if (mirrored && !mirror) {
          // Made when first needed (most zero-waste solves end in the first round). The
          // mirror's states are other states: a memo of its own, where identical buffers stay
          // identical.
          mirror = mirror_instance(inst);
          mirror_memo.refuted.assign(memo.refuted.size(), {0, 0});
          mirror_memo.item_key = memo.item_key;
        }
        PerfectSearch search(mirrored ? *mirror : inst, capacity, 3 * attempt + k, budget, mirrored ? mirror_memo : memo);
        outcome = search.run();
        stats.backtracks += search.backtracks();
        if (outcome == Outcome::found) item_offsets = search.offsets();
      } else {
        Search search(inst, capacity, kPreorders[k], budget, trail);
        outcome = search.run();
        stats.backtracks += search.backtracks();
        if (outcome == Outcome::found) item_offsets = search.offsets();
      }
      if (outcome != Outcome::budget) return outcome;
      if (budget.exhausted()) return Outcome::budget;
      // Zero-waste searches restart more often: their refutations are kept in the memo, and
      // the heavy tail of one ordering is what restarts cure.
      if (perfect) limit += limit / 8;
    }
    zero_waste_nodes += budget.nodes() - round_start;
    if (!perfect) limit *= 2;
  }
}

// The searches recurse once per placed buffer: thousands of frames deep on real traces and
// big training graphs, more than a default 8 MiB stack holds once the sanitizers enlarge each
// frame. They run on a thread of their own with a 1 GiB stack (address space: pages are touched
// only as deep as the search goes); where no such thread can be made, on the caller's.
void run_with_deep_stack(const std::function<void()>& work) {
  constexpr std::size_t kStackBytes = std::size_t{1} << 30;
  struct Call {
    const std::function<void()>* work;
    std::exception_ptr error;
  } call{&work, nullptr};
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) {
    work();
    return;
  }
  pthread_t thread;
  const bool made = pthread_attr_setstacksize(&attr, kStackBytes) == 0 &&
                    pthread_create(
                        &thread, &attr,
                        [](void* p) -> void* {
                          auto* c = static_cast<Call*>(p);
                          try {
                            (*c->work)();
                          } catch (...) {
                            c->error = std::current_exception();
                          }
                          return nullptr;
                        },
                        &call) == 0;
  pthread_attr_destroy(&attr);
  if (!made) {
    work();
    return;
  }
  pthread_join(thread, nullptr);
  if (call.error) std::rethrow_exception(call.error);
}

Solution solve_exact_on_this_stack(const AllocationProblem& problem, const ExactSolverOptions& options,
                                   ExactSolverStats* stats);

}  // namespace

Solution solve_exact(const AllocationProblem& problem, const ExactSolverOptions& options, ExactSolverStats* stats) {
  Solution solution;
  run_with_deep_stack([&] { solution = solve_exact_on_this_stack(problem, options, stats); });
  return solution;
}

namespace {

Solution solve_exact_on_this_stack(const AllocationProblem& problem, const ExactSolverOptions& options,
                                   ExactSolverStats* stats) {
  {
    const Status status = check_problem(problem);
    MEMPLAN_CHECK(status.ok(), "invalid problem: " << status.error().message);
  }
  ExactSolverStats local_stats;
  ExactSolverStats& st = stats ? *stats : local_stats;
  st = ExactSolverStats{};
  std::optional<Clock::time_point> deadline;
  if (options.time_limit_s > 0) {
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.time_limit_s));
  }
  Budget budget(options.node_limit, deadline);

  const Bytes lower_bound = lower_bound_bytes(problem);
  const std::optional<Bytes> capacity = problem.capacity_bytes;
  AllocationProblem uncapped = problem;
  uncapped.capacity_bytes.reset();
  const auto greedy_start = Clock::now();
  GreedyOptions greedy_options;
  greedy_options.deadline = deadline;
  const Solution greedy = solve_greedy(uncapped, greedy_options);
  st.greedy_height_bytes = greedy.height_bytes;
  st.greedy_ms = ms_since(greedy_start);

  Solution solution;
  auto finish = [&](std::vector<Offset> offsets, SolveStatus status) {
    solution.status = status;
    if (solution.has_packing()) {
      solution.offsets = std::move(offsets);
      solution.height_bytes = packing_height(problem, solution.offsets);
#ifndef NDEBUG
      const Status valid = validate_solution(problem, solution);
      MEMPLAN_CHECK(valid.ok(), "exact solver produced an invalid packing: " << valid.error().message);
#endif
    } else {
      solution.height_bytes = greedy.height_bytes;  // the lowest height seen, for messages
    }
    st.nodes = budget.nodes();
    return solution;
  };

  if (capacity && lower_bound > *capacity) {
    st.proof = "capacity";
    return finish({}, SolveStatus::not_found);
  }
  if (greedy.height_bytes <= lower_bound) {
    st.proof = "greedy";
    return finish(greedy.offsets, SolveStatus::optimal);
  }
  if (capacity && greedy.height_bytes <= *capacity) return finish(greedy.offsets, SolveStatus::feasible);

  std::vector<std::size_t> searched;
  for (std::size_t b = 0; b < problem.buffers.size(); ++b) {
    if (!problem.buffers[b].fixed_offset && footprint_bytes(problem.buffers[b]) > 0) searched.push_back(b);
  }
  // The search recurses once per buffer and keeps conflict lists: past these sizes it
  // would not fit in a thread's stack or in memory, so the greedy packing stands.
  if (std::int64_t(searched.size()) > options.max_search_buffers ||
      count_conflict_pairs(problem, searched) > options.max_conflict_pairs) {
    return finish(greedy.offsets, capacity ? SolveStatus::timed_out : SolveStatus::feasible);
  }
  // A wall-clock budget spent by the greedy portfolio leaves its packing as the answer.
  if (deadline && Clock::now() >= *deadline) {
    return finish(greedy.offsets, capacity ? SolveStatus::timed_out : SolveStatus::feasible);
  }
  st.searched = true;
  const auto setup_start = Clock::now();
  const Instance inst = build_instance(problem, searched);
  st.setup_ms = ms_since(setup_start);
  const auto search_start = Clock::now();
  auto assemble = [&](const std::vector<Offset>& item_offsets) {
    std::vector<Offset> offsets = greedy.offsets;  // fixed and zero-size buffers keep theirs
    for (std::size_t i = 0; i < searched.size(); ++i) offsets[searched[i]] = item_offsets[i];
    return offsets;
  };
  std::vector<Offset> item_offsets;
  SearchTrail trail;  // the general search's undo records, kept across attempts

  if (capacity) {
    budget.start_phase(1.0);
    const Outcome outcome = feasible_within(inst, *capacity, budget, trail, item_offsets, options.band_search, st);
    st.nodes = budget.nodes();
    st.search_ms = ms_since(search_start);
    if (outcome == Outcome::infeasible) {
      st.proof = "capacity";
      return finish({}, SolveStatus::not_found);
    }
    if (outcome == Outcome::budget) return finish({}, SolveStatus::timed_out);
    std::vector<Offset> offsets = assemble(item_offsets);
    const bool at_bound = packing_height(problem, offsets) <= lower_bound;
    if (at_bound) st.proof = "search";
    return finish(std::move(offsets), at_bound ? SolveStatus::optimal : SolveStatus::feasible);
  }

  // Minimise: probe target heights between the lower bound (lo, not yet shown reachable) and
  // the best height found (hi). The first probe is the lower bound itself, since zero-waste
  // packings are common and then one probe ends the solve; later probes bisect. A probe that
  // runs out of its share moves lo up without a proof. The first probe gets three quarters of
  // the budget: the greedy seed is already within a fraction of a percent on real traces, so
  // what bisection could still win is small beside reaching (and proving) the bound.
  std::vector<Offset> best = greedy.offsets;
  Bytes lo = lower_bound;
  Bytes hi = greedy.height_bytes;
  bool proven = true;
  bool first = true;
  while (lo < hi && !budget.solve_exhausted()) {
    const Bytes target = first ? lo : lo + (hi - lo) / 2;
    budget.start_phase(first ? 0.75 : 0.34);
    first = false;
    const Outcome outcome = feasible_within(inst, target, budget, trail, item_offsets, options.band_search, st);
    if (outcome == Outcome::found) {
      best = assemble(item_offsets);
      hi = packing_height(problem, best);
    } else {
      lo = target + 1;
      if (outcome == Outcome::budget) proven = false;
    }
  }
  const bool optimal = hi <= lower_bound || (proven && lo >= hi);
  st.search_ms = ms_since(search_start);
  if (hi <= lower_bound) {
    st.proof = "search";
  } else if (optimal) {
    st.proof = "exhausted";
  }
  return finish(std::move(best), optimal ? SolveStatus::optimal : SolveStatus::feasible);
}

}  // namespace

}  // namespace memplan::planner
