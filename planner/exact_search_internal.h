// What the exact solver's searches share (planner/exact_solver.cpp runs them in turn): the
// node and time budget, the instance they search (buffers cut into sections, with conflicts),
// and one entry point per search. Internal to memplan_solver: not installed, not API.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "memplan/common/cancellation.h"
#include "memplan/planner/allocation_problem.h"

namespace memplan::planner::exact_search {

using Clock = std::chrono::steady_clock;

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
      limit_reached_ = "node limit";
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
  bool solve_exhausted() {
    if (node_limit_ >= 0 && nodes_ >= node_limit_) {
      limit_reached_ = "node limit";
      return true;
    }
    if (deadline_ && Clock::now() >= *deadline_) {
      limit_reached_ = "time limit";
      return true;
    }
    if (cancellation_requested()) {
      limit_reached_ = "cancelled";
      return true;
    }
    return false;
  }
  std::int64_t nodes() const { return nodes_; }
  // The limit the budget last ran out on ("node limit" or "time limit"; none yet: "").
  const char* limit_reached() const { return limit_reached_; }

 private:
  void check_clock() {
    if (phase_deadline_ && Clock::now() >= *phase_deadline_) {
      exhausted_ = true;
      limit_reached_ = "time limit";
    }
    // A search may run on a worker thread, so a cancellation stops it as a limit would.
    if (cancellation_requested()) {
      exhausted_ = true;
      limit_reached_ = "cancelled";
    }
  }

  std::int64_t node_limit_;
  std::optional<Clock::time_point> deadline_;
  std::int64_t phase_node_limit_ = -1;
  std::optional<Clock::time_point> phase_deadline_;
  std::int64_t attempt_nodes_left_ = std::numeric_limits<std::int64_t>::max();
  std::int64_t nodes_ = 0;
  bool exhausted_ = false;
  const char* limit_reached_ = "";
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

// Buffer pairs live together among `searched`, an upper estimate (the search's conflict lists).
std::int64_t count_conflict_pairs(const AllocationProblem& problem, const std::vector<std::size_t>& searched);
// The instance over problem.buffers[searched] (none fixed, none of size zero).
Instance build_instance(const AllocationProblem& problem, const std::vector<std::size_t>& searched);

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One undo record of the node search: the slot and its old value (no slot: an item placed).
struct SearchTrailEntry {
  std::int64_t* slot;
  std::int64_t old;
};

// The node search's undo records, in fixed chunks that are allocated as the trail first
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

// Each search below is one attempt: it spends nodes from `budget`, adds the nodes whose every
// branch failed to `backtracks`, and on found writes every item's offset to `item_offsets`
// (indexed like inst.items).

// One attempt of a search object (run(), backtracks(), offsets()), reported as above.
template <typename SearchT>
Outcome run_attempt(SearchT& search, std::vector<Offset>& item_offsets, std::int64_t& backtracks) {
  const Outcome outcome = search.run();
  backtracks += search.backtracks();
  if (outcome == Outcome::found) item_offsets = search.offsets();
  return outcome;
}

// The node search (planner/exact_node_search.cpp): branch and bound over canonical placements,
// complete for any target. `preorder` is the tie-break among equal offsets, keys from "TAZW".
Outcome node_search(const Instance& inst, Bytes capacity, std::string_view preorder, Budget& budget,
                    SearchTrail& trail, std::vector<Offset>& item_offsets, std::int64_t& backtracks);

// The zero-waste search (planner/zero_waste_search.cpp), for targets every occupied section
// fills exactly. Refuted (range, floors, placed multiset) states, as two independent 64-bit
// hashes, in a fixed table where a newer refutation overwrites an older one in its slot: it
// keeps learning for the whole solve in bounded memory, and stays deterministic.
struct ZeroWasteMemo {
  std::vector<std::uint64_t> item_key;  // per item: equal for identical buffers
  std::vector<std::pair<std::uint64_t, std::uint64_t>> refuted;  // size a power of two
  bool contains(const std::pair<std::uint64_t, std::uint64_t>& key) const {
    return refuted[key.first & (refuted.size() - 1)] == key;
  }
  void insert(const std::pair<std::uint64_t, std::uint64_t>& key) { refuted[key.first & (refuted.size() - 1)] = key; }
};
// The target applies when every occupied section sums to exactly it and nothing is fixed.
bool zero_waste_applies(const Instance& inst, Bytes capacity);
// An empty memo for `inst`, sized to it, with identical buffers (lifetime, size, alignment)
// sharing a key, so that the memo sees multisets.
ZeroWasteMemo zero_waste_memo(const Instance& inst);
// `attempt` picks the candidate order (see the search).
Outcome zero_waste_search(const Instance& inst, Bytes capacity, int attempt, Budget& budget, ZeroWasteMemo& memo,
                          std::vector<Offset>& item_offsets, std::int64_t& backtracks);
// The same buffers with time running backwards (section s becomes S - 1 - s; items keep their
// indices, so offsets carry over unchanged). A packing of one is a packing of the other, but
// the zero-waste search scans valleys from the earliest and breaks ties towards it, so the
// mirror searches the same problem in a different order.
Instance mirror_instance(const Instance& inst);

// The band decomposition (planner/band_search.cpp), for zero-waste targets with a guillotine
// packing; its not finding one proves nothing. Sets of buffers (as multisets, with the base's
// misalignment) that have no guillotine packing: kept across attempts, since a restart with a
// larger node limit meets them again.
using BandKey = std::pair<std::uint64_t, std::uint64_t>;
struct BandKeyHash {
  std::size_t operator()(const BandKey& k) const { return std::size_t(k.first ^ (k.second * 0x9e3779b97f4a7c15ULL)); }
};
using BandMemo = std::unordered_set<BandKey, BandKeyHash>;
// `item_key`: the zero-waste memo's (identical buffers alike).
Outcome band_search(const Instance& inst, Bytes capacity, Budget& budget, const std::vector<std::uint64_t>& item_key,
                    BandMemo& failed, std::vector<Offset>& item_offsets, std::int64_t& backtracks);

}  // namespace memplan::planner::exact_search
