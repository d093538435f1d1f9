#include "memplan/planner/greedy_solver.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <numeric>
#include <tuple>

#include "memplan/planner/problem_parts.h"
#include "memplan/planner/validator.h"

namespace memplan::planner {

namespace {

// Gap search examines the placed buffers live with the one being placed; a run may spend
// about this many such visits in all before crowded lifetimes fall back to the skyline.
// Real allocation traces have buffers live with a thousand others: their gaps are where the
// packing is won (the skyline fallback cost them 7-19% of height), so the budget is generous.
// Above kGenerousBuffers (where the exact search stops too: planning-scale graphs of 50,000
// buffers and more) the budget stays at the tenth that keeps a run near O(n log n).
constexpr std::size_t kNeighbourVisitBudget = 40'000'000;
constexpr std::size_t kLargeProblemVisitBudget = 4'000'000;
constexpr std::size_t kGenerousBuffers = 20'000;

// Finds the placed buffers whose lifetimes overlap a query lifetime without looking at all
// placed buffers: buffers sorted by first_op sit at the leaves of a max-tree over end_op
// (placed buffers only), so a query visits only subtrees that can hold an overlap.
class PlacedIndex {
 public:
  explicit PlacedIndex(const AllocationProblem& problem) : problem_(problem) {
    const std::size_t n = problem.buffers.size();
    by_start_.resize(n);
    std::iota(by_start_.begin(), by_start_.end(), std::size_t{0});
    std::sort(by_start_.begin(), by_start_.end(), [&](std::size_t a, std::size_t b) {
      return problem.buffers[a].first_op < problem.buffers[b].first_op;
    });
    starts_.resize(n);
    leaf_of_.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      starts_[k] = problem.buffers[by_start_[k]].first_op;
      leaf_of_[by_start_[k]] = k;
    }
    leaves_ = 1;
    while (leaves_ < std::max<std::size_t>(n, 1)) leaves_ *= 2;
    max_end_.assign(2 * leaves_, kNone);
  }

  void insert(std::size_t buffer) {
    std::size_t node = leaves_ + leaf_of_[buffer];
    max_end_[node] = problem_.buffers[buffer].end_op;
    for (node /= 2; node >= 1; node /= 2) max_end_[node] = std::max(max_end_[2 * node], max_end_[2 * node + 1]);
  }

  // Appends every placed buffer live at some time in [first_op, end_op) to `out`; stops and
  // returns false once more than `limit` were found.
  bool overlapping(TimePoint first_op, TimePoint end_op, std::size_t limit_count, std::vector<std::size_t>& out) {
    // Only leaves with start < end_op can overlap; among them, those with end > first_op.
    const std::size_t limit =
        std::size_t(std::lower_bound(starts_.begin(), starts_.end(), end_op) - starts_.begin());
    if (limit == 0) return true;
    stack_.clear();
    stack_.push_back({1, 0, leaves_});
    while (!stack_.empty()) {
      const Frame f = stack_.back();
      stack_.pop_back();
      if (f.lo >= limit || max_end_[f.node] <= first_op) continue;
      if (f.node >= leaves_) {
        out.push_back(by_start_[f.lo]);
        if (out.size() > limit_count) return false;
        continue;
      }
      const std::size_t mid = (f.lo + f.hi) / 2;
      stack_.push_back({2 * f.node + 1, mid, f.hi});
      stack_.push_back({2 * f.node, f.lo, mid});
    }
    return true;
  }

 private:
  static constexpr TimePoint kNone = std::numeric_limits<TimePoint>::min();
  struct Frame {
    std::size_t node, lo, hi;
  };
  const AllocationProblem& problem_;
  std::vector<std::size_t> by_start_;
  std::vector<TimePoint> starts_;
  std::vector<std::size_t> leaf_of_;
  std::size_t leaves_ = 1;
  std::vector<TimePoint> max_end_;
  std::vector<Frame> stack_;
};

// The highest top of any placed buffer at each time, as a max segment tree over time
// sections with lazy "raise to at least" updates: O(log n) per placement and per query.
class Skyline {
 public:
  explicit Skyline(const AllocationProblem& problem) {
    for (const BufferSpec& b : problem.buffers) {
      times_.push_back(b.first_op);
      times_.push_back(b.end_op);
    }
    std::sort(times_.begin(), times_.end());
    times_.erase(std::unique(times_.begin(), times_.end()), times_.end());
    sections_ = std::max<std::size_t>(1, times_.size());
    max_.assign(4 * sections_, 0);
    raised_.assign(4 * sections_, 0);
  }
  // Highest top over [first_op, end_op).
  Offset max(TimePoint first_op, TimePoint end_op) const { return query(1, 0, sections_, section(first_op), section(end_op)); }
  void raise(TimePoint first_op, TimePoint end_op, Offset top) { update(1, 0, sections_, section(first_op), section(end_op), top); }

 private:
  std::size_t section(TimePoint t) const { return std::size_t(std::lower_bound(times_.begin(), times_.end(), t) - times_.begin()); }
  // max_[v] is the max over v's range; a raise covering v's whole range is kept at v only
  // (tops only grow, so a pending raise never needs to be pushed down: queries take the max
  // along the path).
  Offset query(std::size_t v, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b) const {
    if (b <= lo || hi <= a) return 0;
    if (a <= lo && hi <= b) return max_[v];
    const std::size_t mid = (lo + hi) / 2;
    return std::max(raised_[v], std::max(query(2 * v, lo, mid, a, b), query(2 * v + 1, mid, hi, a, b)));
  }
  void update(std::size_t v, std::size_t lo, std::size_t hi, std::size_t a, std::size_t b, Offset top) {
    if (b <= lo || hi <= a) return;
    max_[v] = std::max(max_[v], top);
    if (a <= lo && hi <= b) {
      raised_[v] = std::max(raised_[v], top);
      return;
    }
    const std::size_t mid = (lo + hi) / 2;
    update(2 * v, lo, mid, a, b, top);
    update(2 * v + 1, mid, hi, a, b, top);
  }
  std::vector<TimePoint> times_;
  std::size_t sections_ = 1;
  std::vector<Offset> max_;
  std::vector<Offset> raised_;  // raises that covered the node's whole range
};

// Number of other buffers live together with each buffer, by counting those that end
// before it starts or start after it ends: O(n log n) instead of over all pairs.
std::vector<std::int64_t> conflict_counts(const AllocationProblem& problem) {
  std::vector<TimePoint> starts, ends;
  for (const BufferSpec& b : problem.buffers) {
    starts.push_back(b.first_op);
    ends.push_back(b.end_op);
  }
  std::sort(starts.begin(), starts.end());
  std::sort(ends.begin(), ends.end());
  std::vector<std::int64_t> counts;
  const auto n = std::int64_t(problem.buffers.size());
  for (const BufferSpec& b : problem.buffers) {
    const auto starting_after = std::int64_t(starts.end() - std::lower_bound(starts.begin(), starts.end(), b.end_op));
    const auto ending_before = std::int64_t(std::upper_bound(ends.begin(), ends.end(), b.first_op) - ends.begin());
    counts.push_back(n - 1 - starting_after - ending_before);
  }
  return counts;
}

std::vector<std::size_t> placement_order(const AllocationProblem& problem, GreedyOrder order) {
  const std::size_t n = problem.buffers.size();
  std::vector<double> key(n);  // double: area can exceed int64 (size * lifetime)
  std::vector<std::int64_t> conflicts;
  if (order == GreedyOrder::conflicts) conflicts = conflict_counts(problem);
  for (std::size_t i = 0; i < n; ++i) {
    const BufferSpec& b = problem.buffers[i];
    const double size = double(footprint_bytes(b));
    const double length = double(b.end_op) - double(b.first_op);
    switch (order) {
      case GreedyOrder::size: key[i] = size; break;
      case GreedyOrder::lifetime: key[i] = length; break;
      case GreedyOrder::area: key[i] = size * length; break;
      case GreedyOrder::conflicts: key[i] = double(conflicts[i]); break;
    }
  }
  std::vector<std::size_t> result(n);
  std::iota(result.begin(), result.end(), std::size_t{0});
  // Secondary key: size, so equal-key runs still put big buffers first. Then index, so every
  // run is deterministic.
  std::stable_sort(result.begin(), result.end(), [&](std::size_t a, std::size_t b) {
    if (key[a] != key[b]) return key[a] > key[b];
    return footprint_bytes(problem.buffers[a]) > footprint_bytes(problem.buffers[b]);
  });
  return result;
}

}  // namespace

std::string_view to_string(GreedyOrder order) {
  switch (order) {
    case GreedyOrder::size: return "size";
    case GreedyOrder::lifetime: return "lifetime";
    case GreedyOrder::area: return "area";
    case GreedyOrder::conflicts: return "conflicts";
  }
  return "unknown";
}

std::string_view to_string(GreedyPlacement placement) {
  switch (placement) {
    case GreedyPlacement::best_fit: return "best_fit";
    case GreedyPlacement::lowest_offset: return "lowest_offset";
  }
  return "unknown";
}

namespace {

// With a cutoff, a run whose height reaches it stops and returns no offsets with *beaten set:
// heights only grow as buffers are placed, so it could not have beaten the packing the cutoff
// came from.
std::vector<Offset> pack(const AllocationProblem& problem, GreedyOrder order, GreedyPlacement placement,
                         std::optional<std::chrono::steady_clock::time_point> deadline, std::size_t visit_budget,
                         Bytes cutoff = std::numeric_limits<Bytes>::max(), bool* beaten = nullptr) {
  Offset height = 0;
  const std::size_t n = problem.buffers.size();
  std::vector<Offset> offsets(n, 0);
  PlacedIndex placed(problem);
  Skyline skyline(problem);
  // Every placed buffer by its [offset, top), kept in order as they are placed: a buffer live
  // beside many placed ones reads its neighbours' ranges in order from here (marked, O(placed))
  // instead of sorting them (O(k log k)). Either way the ranges come in ascending order, and
  // ranges of equal offset close the same gaps in any order, so the packing is the same.
  std::vector<std::size_t> by_offset;
  std::vector<std::uint32_t> mark(n, 0);
  std::uint32_t stamp = 0;
  auto range_of = [&](std::size_t j) { return std::make_pair(offsets[j], offsets[j] + footprint_bytes(problem.buffers[j])); };
  auto place = [&](std::size_t i) {
    placed.insert(i);
    const auto range = range_of(i);
    by_offset.insert(std::upper_bound(by_offset.begin(), by_offset.end(), range,
                                      [&](const std::pair<Offset, Offset>& r, std::size_t j) { return r < range_of(j); }),
                     i);
  };
  // Pinned buffers go first: everything else must fit around them.
  for (std::size_t i = 0; i < n; ++i) {
    const BufferSpec& b = problem.buffers[i];
    if (!b.fixed_offset) continue;
    offsets[i] = *b.fixed_offset;
    if (footprint_bytes(b) == 0) continue;
    place(i);
    skyline.raise(b.first_op, b.end_op, *b.fixed_offset + footprint_bytes(b));
  }
  const std::size_t max_neighbours = std::max<std::size_t>(64, visit_budget / std::max<std::size_t>(n, 1));
  const std::vector<std::int64_t> conflicts = conflict_counts(problem);
  std::vector<std::size_t> neighbours;
  std::vector<std::pair<Offset, Offset>> taken;  // [offset, top) of placed neighbours
  std::size_t placed_count = 0;
  for (const std::size_t i : placement_order(problem, order)) {
    // The clock costs more than a placement: look every 256.
    if (deadline && (++placed_count & 255) == 0 && std::chrono::steady_clock::now() >= *deadline) return {};
    const BufferSpec& b = problem.buffers[i];
    const Bytes size = footprint_bytes(b);
    if (b.fixed_offset || size == 0) continue;
    neighbours.clear();
    // Searching gaps costs O(k log k) in the k placed buffers live with this one. Past
    // max_neighbours the buffer goes on the skyline instead (the highest top over its
    // lifetime, O(log n)): such a crowded lifetime rarely has a usable gap, and this keeps a
    // run near O(n log n) on large training steps. Small problems never hit the limit.
    // The check uses all buffers live together with this one (placed or not), counted in
    // O(log n), so a crowded buffer costs nothing before it falls back.
    if (std::size_t(conflicts[i]) > max_neighbours ||
        !placed.overlapping(b.first_op, b.end_op, max_neighbours, neighbours)) {
      offsets[i] = align_up(skyline.max(b.first_op, b.end_op), b.alignment);
      place(i);
      skyline.raise(b.first_op, b.end_op, offsets[i] + size);
      height = std::max(height, offsets[i] + size);
      if (height >= cutoff) {
        *beaten = true;
        return {};
      }
      continue;
    }
    taken.clear();
    if (neighbours.size() * 16 < by_offset.size()) {
      for (const std::size_t j : neighbours) taken.push_back(range_of(j));
      std::sort(taken.begin(), taken.end());
    } else {
      if (++stamp == 0) {  // the stamps wrapped: clear the marks once
        std::fill(mark.begin(), mark.end(), 0);
        stamp = 1;
      }
      for (const std::size_t j : neighbours) mark[j] = stamp;
      for (const std::size_t j : by_offset) {
        if (mark[j] == stamp) taken.push_back(range_of(j));
      }
    }
    // Walk the gaps between taken ranges from the bottom; `floor` is the top of everything
    // below the current gap.
    Offset floor = 0;
    Offset chosen = -1;
    Bytes chosen_gap = std::numeric_limits<Bytes>::max();
    for (const auto& [lo, hi] : taken) {
      const Offset start = align_up(floor, b.alignment);
      if (start + size <= lo) {
        const Bytes gap = lo - floor;
        if (placement == GreedyPlacement::lowest_offset) {
          chosen = start;
          break;
        }
        if (gap < chosen_gap) {  // strict: ties keep the lower gap
          chosen_gap = gap;
          chosen = start;
        }
      }
      floor = std::max(floor, hi);
    }
    if (chosen < 0) chosen = align_up(floor, b.alignment);
    offsets[i] = chosen;
    place(i);
    skyline.raise(b.first_op, b.end_op, chosen + size);
    height = std::max(height, chosen + size);
    if (height >= cutoff) {
      *beaten = true;
      return {};
    }
  }
  return offsets;
}

}  // namespace

std::vector<Offset> greedy_pack(const AllocationProblem& problem, GreedyOrder order, GreedyPlacement placement,
                                std::optional<std::chrono::steady_clock::time_point> deadline) {
  return pack(problem, order, placement, deadline,
              problem.buffers.size() > kGenerousBuffers ? kLargeProblemVisitBudget : kNeighbourVisitBudget);
}

namespace {

// The portfolio on one problem as a whole.
Solution run_portfolio(const AllocationProblem& problem, const GreedyOptions& options) {
  const Bytes lower_bound = lower_bound_bytes(problem);
  std::vector<Offset> best;
  Bytes best_height = std::numeric_limits<Bytes>::max();
  bool out_of_time = false;
  for (const GreedyPlacement placement : options.placements) {
    for (const GreedyOrder order : options.orders) {
      if (!best.empty() && options.deadline && std::chrono::steady_clock::now() >= *options.deadline) {
        out_of_time = true;
        break;
      }
      // Only runs after the first may be cut short: there is always a packing. A later run
      // stops once it is as high as the best so far (the earlier run wins ties anyway).
      bool beaten = false;
      std::vector<Offset> offsets =
          pack(problem, order, placement, best.empty() ? std::nullopt : options.deadline,
               problem.buffers.size() > kGenerousBuffers ? kLargeProblemVisitBudget : kNeighbourVisitBudget,
               best.empty() ? std::numeric_limits<Bytes>::max() : best_height, &beaten);
      if (beaten) continue;
      if (offsets.size() != problem.buffers.size()) {
        out_of_time = true;
        break;
      }
      const Bytes height = packing_height(problem, offsets);
      if (height < best_height) {
        best_height = height;
        best = std::move(offsets);
      }
      if (best_height <= lower_bound) break;  // nothing can beat the lower bound
    }
    if (best_height <= lower_bound || out_of_time) break;
  }
  Solution solution;
  if (best.empty() && problem.buffers.empty()) best_height = 0;
  solution.height_bytes = best_height;
  if (problem.capacity_bytes && best_height > *problem.capacity_bytes) {
    solution.status = SolveStatus::not_found;
    return solution;
  }
  solution.offsets = std::move(best);
  solution.status = best_height <= lower_bound ? SolveStatus::optimal : SolveStatus::feasible;
#ifndef NDEBUG
  {
    const Status valid = validate_solution(problem, solution);
    MEMPLAN_CHECK(valid.ok(), "greedy produced an invalid packing: " << valid.error().message);
  }
#endif
  return solution;
}

// A step is often planned again as it was: fit plans the asked step, then its lever search and
// the op-order alternatives plan the same problem, and every packing of a large step costs
// seconds. Without a deadline the portfolio is a pure function of the buffers' geometry (sizes,
// alignments, lifetimes, pins), the capacity and the runs asked, so the answers for the last few
// problems are kept and an equal problem gets the same answer without packing again.
class PortfolioMemo {
 public:
  std::optional<Solution> find(const AllocationProblem& problem, const GreedyOptions& options) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& e : entries_) {
      if (same(e, problem, options)) return e.solution;
    }
    return std::nullopt;
  }
  void keep(const AllocationProblem& problem, const GreedyOptions& options, const Solution& solution) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() == kEntries) entries_.pop_front();
    Entry e{{}, problem.capacity_bytes, options.orders, options.placements, solution};
    e.buffers.reserve(problem.buffers.size());
    for (const BufferSpec& b : problem.buffers) e.buffers.push_back(geometry(b));
    entries_.push_back(std::move(e));
  }

 private:
  static constexpr std::size_t kEntries = 4;
  using Geometry = std::tuple<Bytes, Bytes, TimePoint, TimePoint, std::optional<Offset>>;
  struct Entry {
    std::vector<Geometry> buffers;
    std::optional<Bytes> capacity;
    std::vector<GreedyOrder> orders;
    std::vector<GreedyPlacement> placements;
    Solution solution;
  };
  static Geometry geometry(const BufferSpec& b) { return {b.size_bytes, b.alignment, b.first_op, b.end_op, b.fixed_offset}; }
  static bool same(const Entry& e, const AllocationProblem& problem, const GreedyOptions& options) {
    if (e.buffers.size() != problem.buffers.size() || e.capacity != problem.capacity_bytes || e.orders != options.orders ||
        e.placements != options.placements) {
      return false;
    }
    for (std::size_t i = 0; i < e.buffers.size(); ++i) {
      if (e.buffers[i] != geometry(problem.buffers[i])) return false;
    }
    return true;
  }
  std::mutex mutex_;
  std::deque<Entry> entries_;
};

// Problems below this many buffers pack in milliseconds: not worth keeping.
constexpr std::size_t kMemoBuffers = 2'000;

Solution portfolio(const AllocationProblem& problem, const GreedyOptions& options) {
  static PortfolioMemo memo;
  const bool memoised = !options.deadline && problem.buffers.size() >= kMemoBuffers;
  if (memoised) {
    if (std::optional<Solution> known = memo.find(problem, options)) return *std::move(known);
  }
  Solution solution = run_portfolio(problem, options);
  if (memoised) memo.keep(problem, options, solution);
  return solution;
}

}  // namespace

Solution solve_greedy(const AllocationProblem& problem, const GreedyOptions& options) {
  {
    const Status status = check_problem(problem);
    MEMPLAN_CHECK(status.ok(), "invalid problem: " << status.error().message);
  }
  MEMPLAN_CHECK(!options.orders.empty() && !options.placements.empty(), "greedy needs at least one run");
  const bool any_fixed = std::any_of(problem.buffers.begin(), problem.buffers.end(),
                                     [](const BufferSpec& b) { return b.fixed_offset.has_value(); });
  if (any_fixed) return portfolio(problem, options);
  // Each part on its own (planner/problem_parts.h), each distinct shape once: the orderings
  // then weigh a part's buffers against each other, not against a far-away step's.
  const ProblemParts parts = split_problem(problem);
  if (!parts.decomposed()) return portfolio(problem, options);
  const LeafShapes shapes = group_leaves_by_shape(problem, parts);
  std::vector<Solution> packed;
  packed.reserve(shapes.first.size());
  for (const std::size_t l : shapes.first) packed.push_back(portfolio(leaf_problem(problem, parts.leaves[l]), options));
  std::vector<const std::vector<Offset>*> leaf_offsets;
  for (const std::size_t k : shapes.shape_of) leaf_offsets.push_back(&packed[k].offsets);
  Solution solution;
  solution.offsets = assemble_parts(problem, parts, leaf_offsets);
  solution.height_bytes = packing_height(problem, solution.offsets);
  if (problem.capacity_bytes && solution.height_bytes > *problem.capacity_bytes) {
    solution.offsets.clear();
    solution.status = SolveStatus::not_found;
    return solution;
  }
  solution.status = solution.height_bytes <= lower_bound_bytes(problem) ? SolveStatus::optimal : SolveStatus::feasible;
#ifndef NDEBUG
  {
    const Status valid = validate_solution(problem, solution);
    MEMPLAN_CHECK(valid.ok(), "greedy produced an invalid packing of the parts: " << valid.error().message);
  }
#endif
  return solution;
}

}  // namespace memplan::planner
