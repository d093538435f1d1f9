// The exact solver's driver: the greedy seed, the instance the searches share, and the probes
// of target heights, each answered by the searches in turn (feasible_within). The searches
// themselves: exact_node_search.cpp, zero_waste_search.cpp, band_search.cpp.
#include "memplan/planner/exact_solver.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <numeric>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "memplan/planner/exact_search_internal.h"
#include "memplan/planner/greedy_solver.h"
#include "memplan/planner/problem_parts.h"
#include "memplan/planner/validator.h"

namespace memplan::planner {

namespace exact_search {

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

}  // namespace exact_search

namespace {

using exact_search::Budget;
using exact_search::Clock;
using exact_search::Instance;
using exact_search::Outcome;
using exact_search::SearchTrail;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

constexpr std::string_view kPreorders[] = {"WAT", "TAW", "TWA"};

// Round-robin feasibility for one target height. found: item_offsets filled; infeasible:
// proven (any one ordering's exhausted search is a proof); budget: the phase ran out.
Outcome feasible_within(const Instance& inst, Bytes capacity, Budget& budget, SearchTrail& trail,
                        std::vector<Offset>& item_offsets, bool try_bands,
                        ExactSolverStats& stats) {
  std::int64_t limit = std::max<std::int64_t>(256, std::int64_t(inst.items.size()) * 2);
  const bool perfect = exact_search::zero_waste_applies(inst, capacity);
  exact_search::ZeroWasteMemo memo, mirror_memo;
  std::optional<Instance> mirror;
  if (perfect) {
    stats.zero_waste = true;
    memo = exact_search::zero_waste_memo(inst);
  }
  // The band decomposition and the zero-waste search share the nodes about equally: a band
  // attempt runs before a round whenever the zero-waste search has spent as many nodes as it,
  // its node limit growing fourfold each time up to a few thousand nodes a buffer (the named
  // zero-slack problems need up to ~530 a buffer), its refuted sets kept. So problems the
  // zero-waste search packs in milliseconds do not wait for it. It only knows guillotine
  // packings: its not finding one proves nothing.
  exact_search::BandMemo band_memo;
  bool bands_left = perfect && try_bands;
  std::int64_t band_limit = std::int64_t{1} << 15;
  const std::int64_t band_cap = std::max<std::int64_t>(std::int64_t{1} << 16, std::int64_t(inst.items.size()) * 4096);
  std::int64_t band_nodes = 0, zero_waste_nodes = 0;
  for (int attempt = 0;; ++attempt) {
    if (bands_left && band_nodes <= zero_waste_nodes) {
      ++stats.attempts;
      const std::int64_t before = budget.nodes();
      budget.start_attempt(band_limit);
      const Outcome outcome =
          exact_search::band_search(inst, capacity, budget, memo.item_key, band_memo, item_offsets, stats.backtracks);
      band_nodes += budget.nodes() - before;
      if (outcome == Outcome::found) {
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
          mirror = exact_search::mirror_instance(inst);
          mirror_memo.refuted.assign(memo.refuted.size(), {0, 0});
          mirror_memo.item_key = memo.item_key;
        }
        outcome = exact_search::zero_waste_search(mirrored ? *mirror : inst, capacity, 3 * attempt + k, budget,
                                                  mirrored ? mirror_memo : memo, item_offsets, stats.backtracks);
      } else {
        outcome =
            exact_search::node_search(inst, capacity, kPreorders[k], budget, trail, item_offsets, stats.backtracks);
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

// Stack per buffer for the searches' recursion. Measured with -fstack-usage, a placed buffer
// costs one node frame and a new group a solve_group and split_and_solve frame: 352 + 272 + 144
// bytes at -O3, 6.2 + 3.3 + 1.7 KiB with ASan at -O1 (the band search's two frames are smaller).
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kSearchStackBytesPerBuffer = 16 << 10;
#else
constexpr std::size_t kSearchStackBytesPerBuffer = 2 << 10;
#endif

// The searches recurse once per placed buffer: thousands of frames deep on real traces and
// big training graphs, more than a default 8 MiB stack holds once the sanitizers enlarge each
// frame. They run on a thread of their own whose stack holds kSearchStackBytesPerBuffer per
// buffer (address space: pages are touched only as deep as the search goes); where no such
// thread can be made, on the caller's.
void run_with_deep_stack(std::size_t buffers, const std::function<void()>& work) {
  const std::size_t kStackBytes = std::max<std::size_t>(std::size_t{64} << 20, buffers * kSearchStackBytesPerBuffer);
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

// Offsets of every buffer: the searched ones from the search (indexed like `searched`), fixed
// and zero-size buffers keep the greedy packing's.
std::vector<Offset> assemble(const std::vector<Offset>& greedy_offsets, const std::vector<std::size_t>& searched,
                             const std::vector<Offset>& item_offsets) {
  std::vector<Offset> offsets = greedy_offsets;
  for (std::size_t i = 0; i < searched.size(); ++i) offsets[searched[i]] = item_offsets[i];
  return offsets;
}

// Minimise: probe target heights between the lower bound (lo, not yet shown reachable) and
// the best height found (hi). The first probe is the lower bound itself, since zero-waste
// packings are common and then one probe ends the solve; later probes bisect. A probe that
// runs out of its share moves lo up without a proof. The first probe gets three quarters of
// the budget: the greedy seed is already within a fraction of a percent on real traces, so
// what bisection could still win is small beside reaching (and proving) the bound.
// Starts from the greedy packing; st.proof says what proved the answer optimal, if anything.
struct Minimised {
  std::vector<Offset> offsets;  // every buffer's
  bool optimal = false;
};
Minimised minimise(const AllocationProblem& problem, Bytes lower_bound, const Solution& greedy, const Instance& inst,
                   const std::vector<std::size_t>& searched, Budget& budget, bool try_bands, ExactSolverStats& st) {
  std::vector<Offset> item_offsets;
  SearchTrail trail;  // the node search's undo records, kept across attempts
  std::vector<Offset> best = greedy.offsets;
  Bytes lo = lower_bound;
  Bytes hi = greedy.height_bytes;
  bool proven = true;
  bool first = true;
  while (lo < hi && !budget.solve_exhausted()) {
    const Bytes target = first ? lo : lo + (hi - lo) / 2;
    budget.start_phase(first ? 0.75 : 0.34);
    first = false;
    const Outcome outcome = feasible_within(inst, target, budget, trail, item_offsets, try_bands, st);
    if (outcome == Outcome::found) {
      best = assemble(greedy.offsets, searched, item_offsets);
      hi = packing_height(problem, best);
    } else {
      lo = target + 1;
      if (outcome == Outcome::budget) proven = false;
    }
  }
  const bool optimal = hi <= lower_bound || (proven && lo >= hi);
  if (hi <= lower_bound) {
    st.proof = "search";
    st.stopped = "bound";
  } else if (optimal) {
    st.proof = "exhausted";
    st.stopped = "proof";
  } else {
    st.stopped = *budget.limit_reached() ? budget.limit_reached() : "time limit";
  }
  return {std::move(best), optimal};
}

// The whole problem as one: greedy seed (given, or the portfolio's), then the search.
Solution solve_whole(const AllocationProblem& problem, const ExactSolverOptions& options,
                     std::optional<Clock::time_point> deadline, ExactSolverStats& st, const Solution* seed);

// The parts of a problem without fixed buffers (planner/problem_parts.h).
Solution solve_by_parts(const AllocationProblem& problem, const ProblemParts& parts, const ExactSolverOptions& options,
                        std::optional<Clock::time_point> deadline, ExactSolverStats& st);

}  // namespace

Solution solve_exact(const AllocationProblem& problem, const ExactSolverOptions& options, ExactSolverStats* stats) {
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
  const bool any_fixed = std::any_of(problem.buffers.begin(), problem.buffers.end(),
                                     [](const BufferSpec& b) { return b.fixed_offset.has_value(); });
  if (!any_fixed) {
    ProblemParts parts = split_problem(problem);
    if (parts.decomposed()) return solve_by_parts(problem, parts, options, deadline, st);
  }
  Solution solution;
  run_with_deep_stack(problem.buffers.size(), [&] { solution = solve_whole(problem, options, deadline, st, nullptr); });
  return solution;
}

namespace {

Solution solve_by_parts(const AllocationProblem& problem, const ProblemParts& parts, const ExactSolverOptions& options,
                        std::optional<Clock::time_point> deadline, ExactSolverStats& st) {
  const LeafShapes shapes = group_leaves_by_shape(problem, parts);
  st.parts = std::int64_t(parts.leaves.size());
  st.distinct_parts = std::int64_t(shapes.first.size());
  st.floor_buffers = std::int64_t(parts.floor.size());
  const std::optional<Bytes> capacity = problem.capacity_bytes;
  const std::size_t kinds = shapes.first.size();
  // Per shape: the problem, the highest base any of its copies sits on (the one that binds),
  // its lower bound and its packing so far.
  struct Shape {
    AllocationProblem problem;
    Bytes base = 0;
    Bytes lower_bound = 0;
    Solution packed;
    bool proven = false;  // its height is its optimum
  };
  std::vector<Shape> shape(kinds);
  for (std::size_t k = 0; k < kinds; ++k) {
    shape[k].problem = leaf_problem(problem, parts.leaves[shapes.first[k]]);
    shape[k].lower_bound = lower_bound_bytes(shape[k].problem);
  }
  for (std::size_t l = 0; l < parts.leaves.size(); ++l) {
    Shape& s = shape[shapes.shape_of[l]];
    s.base = std::max(s.base, parts.leaves[l].base);
  }
  // The whole's lower bound, by composition (planner/problem_parts.h); floors alone count too.
  Bytes lower_bound = 0;
  for (const auto& [b, offset] : parts.floor) lower_bound = std::max(lower_bound, offset + footprint_bytes(problem.buffers[b]));
  for (const Shape& s : shape) lower_bound = std::max(lower_bound, s.base + s.lower_bound);

  Solution solution;
  auto finish = [&](SolveStatus status) {
    solution.status = status;
    if (solution.has_packing()) {
      std::vector<const std::vector<Offset>*> leaf_offsets;
      for (const std::size_t k : shapes.shape_of) leaf_offsets.push_back(&shape[k].packed.offsets);
      solution.offsets = assemble_parts(problem, parts, leaf_offsets);
      solution.height_bytes = packing_height(problem, solution.offsets);
#ifndef NDEBUG
      const Status valid = validate_solution(problem, solution);
      MEMPLAN_CHECK(valid.ok(), "exact solver produced an invalid packing of the parts: " << valid.error().message);
#endif
    }
    return solution;
  };
  if (capacity && lower_bound > *capacity) {
    st.proof = "capacity";
    st.stopped = "proof";
    solution.height_bytes = lower_bound;
    return finish(SolveStatus::not_found);
  }
  // Every distinct part through the greedy portfolio first: most reach what they need.
  const auto greedy_start = Clock::now();
  GreedyOptions greedy_options;
  greedy_options.deadline = deadline;
  Bytes greedy_height = lower_bound;
  for (Shape& s : shape) {
    s.packed = solve_greedy(s.problem, greedy_options);
    s.proven = s.packed.status == SolveStatus::optimal;
    greedy_height = std::max(greedy_height, s.base + s.packed.height_bytes);
  }
  st.greedy_height_bytes = greedy_height;
  st.greedy_ms = ms_since(greedy_start);
  // What each part must reach: the capacity, or else the whole's lower bound.
  const Bytes goal = capacity ? *capacity : lower_bound;
  std::vector<std::size_t> to_search;
  for (std::size_t k = 0; k < kinds; ++k) {
    if (shape[k].base + shape[k].packed.height_bytes > goal) to_search.push_back(k);
  }
  // Largest first: they need the most of the time left.
  std::sort(to_search.begin(), to_search.end(), [&](std::size_t a, std::size_t b) {
    return shape[a].problem.buffers.size() != shape[b].problem.buffers.size()
               ? shape[a].problem.buffers.size() > shape[b].problem.buffers.size()
               : a < b;
  });
  std::int64_t nodes_left = options.node_limit;
  bool capacity_refuted = false;
  const char* ran_out = nullptr;  // the limit that stopped some part's search
  auto count = [&](const ExactSolverStats& part) {
    st.nodes += part.nodes;
    st.attempts += part.attempts;
    st.backtracks += part.backtracks;
    st.searched = st.searched || part.searched;
    st.zero_waste = st.zero_waste || part.zero_waste;
    st.bands = st.bands || part.bands;
    st.setup_ms += part.setup_ms;
    if (nodes_left >= 0) nodes_left = std::max<std::int64_t>(0, nodes_left - part.nodes);
  };
  std::vector<char> cannot_reach(kinds, 0);  // the part cannot reach the goal (proven)
  enum class PartResult { settled, refuted, open };
  // Searches part k with `share` of the time and nodes left: first for a packing within the
  // goal (which settles it); when minimising and there is none, for the part's own lowest.
  auto search_part = [&](std::size_t k, double share) {
    Shape& s = shape[k];
    const std::size_t n = s.problem.buffers.size();
    ExactSolverOptions part = options;
    if (deadline) {
      const double left_s = std::chrono::duration<double>(*deadline - Clock::now()).count();
      if (left_s <= 0) {
        ran_out = "time limit";
        return PartResult::open;
      }
      part.time_limit_s = left_s * share;
    }
    if (options.node_limit >= 0) part.node_limit = std::int64_t(double(nodes_left) * share);
    const auto part_start = Clock::now();
    std::int64_t spent_nodes = 0;
    if (!cannot_reach[k]) {
      AllocationProblem capped = s.problem;
      capped.capacity_bytes = goal - s.base;
      ExactSolverStats part_stats;
      Solution found;
      run_with_deep_stack(n, [&] { found = solve_whole(capped, part, deadline, part_stats, &s.packed); });
      count(part_stats);
      spent_nodes = part_stats.nodes;
      if (found.has_packing()) {
        s.packed = std::move(found);
        s.proven = s.packed.status == SolveStatus::optimal;
        return PartResult::settled;
      }
      if (found.status == SolveStatus::not_found) {
        // Proven: this part cannot reach the goal, so neither can the whole.
        cannot_reach[k] = 1;
        capacity_refuted = true;
        if (capacity) return PartResult::refuted;
      } else {
        ran_out = part_stats.stopped;
        if (capacity) return PartResult::open;
      }
    }
    // Minimising: the part's own lowest height, with what is left of its share.
    const double spent_s = std::chrono::duration<double>(Clock::now() - part_start).count();
    if (deadline && spent_s >= part.time_limit_s) return PartResult::open;
    ExactSolverOptions rest = part;
    if (deadline) rest.time_limit_s = part.time_limit_s - spent_s;
    if (rest.node_limit >= 0) rest.node_limit = std::max<std::int64_t>(0, rest.node_limit - spent_nodes);
    ExactSolverStats minimise_stats;
    Solution lowest;
    run_with_deep_stack(n, [&] { lowest = solve_whole(s.problem, rest, deadline, minimise_stats, &s.packed); });
    count(minimise_stats);
    if (lowest.has_packing() && lowest.height_bytes <= s.packed.height_bytes) {
      s.packed = std::move(lowest);
      s.proven = s.packed.status == SolveStatus::optimal;
    }
    if (s.proven) return PartResult::settled;
    ran_out = minimise_stats.stopped;
    return PartResult::open;
  };
  // Round one gives each part a share of what is left by its buffers, so one hard part cannot
  // starve the others; round two gives the parts still open all that is left, one after another.
  const auto search_start = Clock::now();
  std::size_t buffers_left = 0;
  for (const std::size_t k : to_search) buffers_left += shape[k].problem.buffers.size();
  std::vector<std::size_t> open;
  for (const std::size_t k : to_search) {
    const std::size_t n = shape[k].problem.buffers.size();
    const double share = double(n) / double(std::max<std::size_t>(buffers_left, 1));
    buffers_left -= n;
    const PartResult result = search_part(k, share);
    if (result == PartResult::refuted) break;  // with a capacity: the answer is known
    if (result == PartResult::open) open.push_back(k);
  }
  if (!(capacity && capacity_refuted)) {
    for (const std::size_t k : open) {
      if (search_part(k, 1.0) != PartResult::settled && capacity) break;
    }
  }
  st.search_ms = ms_since(search_start);
  Bytes height = 0;
  for (const auto& [b, offset] : parts.floor) height = std::max(height, offset + footprint_bytes(problem.buffers[b]));
  for (const Shape& s : shape) height = std::max(height, s.base + s.packed.height_bytes);
  solution.height_bytes = height;
  if (capacity) {
    if (height <= *capacity) {
      st.stopped = height <= lower_bound ? "bound" : "capacity";
      if (height <= lower_bound) st.proof = st.searched ? "search" : "greedy";
      return finish(height <= lower_bound ? SolveStatus::optimal : SolveStatus::feasible);
    }
    if (capacity_refuted) {
      st.proof = "capacity";
      st.stopped = "proof";
      return finish(SolveStatus::not_found);
    }
    st.stopped = ran_out ? ran_out : "time limit";
    return finish(SolveStatus::timed_out);
  }
  if (height <= lower_bound) {
    st.proof = st.searched ? "search" : "greedy";
    st.stopped = "bound";
    return finish(SolveStatus::optimal);
  }
  // Above the bound: optimal when every part at the top is proven at its own optimum (no packing
  // of the whole is lower than a part's optimum on its base, planner/problem_parts.h).
  bool proven = true;
  for (const Shape& s : shape) {
    if (s.base + s.packed.height_bytes == height && !s.proven) proven = false;
  }
  if (proven) {
    st.proof = "exhausted";
    st.stopped = "proof";
    return finish(SolveStatus::optimal);
  }
  st.stopped = ran_out ? ran_out : "time limit";
  return finish(SolveStatus::feasible);
}

Solution solve_whole(const AllocationProblem& problem, const ExactSolverOptions& options,
                     std::optional<Clock::time_point> deadline, ExactSolverStats& st, const Solution* seed) {
  if (options.time_limit_s > 0) {
    const auto own = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.time_limit_s));
    deadline = deadline ? std::min(*deadline, own) : own;
  }
  Budget budget(options.node_limit, deadline);

  const Bytes lower_bound = lower_bound_bytes(problem);
  const std::optional<Bytes> capacity = problem.capacity_bytes;
  const auto greedy_start = Clock::now();
  Solution greedy;
  if (seed) {
    greedy = *seed;
  } else {
    AllocationProblem uncapped = problem;
    uncapped.capacity_bytes.reset();
    GreedyOptions greedy_options;
    greedy_options.deadline = deadline;
    greedy = solve_greedy(uncapped, greedy_options);
  }
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
    st.stopped = "proof";
    return finish({}, SolveStatus::not_found);
  }
  if (greedy.height_bytes <= lower_bound) {
    st.proof = "greedy";
    st.stopped = "bound";
    return finish(greedy.offsets, SolveStatus::optimal);
  }
  if (capacity && greedy.height_bytes <= *capacity) {
    st.stopped = "capacity";
    return finish(greedy.offsets, SolveStatus::feasible);
  }

  std::vector<std::size_t> searched;
  for (std::size_t b = 0; b < problem.buffers.size(); ++b) {
    if (!problem.buffers[b].fixed_offset && footprint_bytes(problem.buffers[b]) > 0) searched.push_back(b);
  }
  // The search keeps conflict lists: past this size they would not fit comfortably in memory,
  // so the greedy packing stands.
  if (exact_search::count_conflict_pairs(problem, searched) > options.max_conflict_pairs) {
    st.stopped = "conflict limit";
    return finish(greedy.offsets, capacity ? SolveStatus::timed_out : SolveStatus::feasible);
  }
  // A wall-clock budget spent by the greedy portfolio leaves its packing as the answer.
  if (deadline && Clock::now() >= *deadline) {
    st.stopped = "time limit";
    return finish(greedy.offsets, capacity ? SolveStatus::timed_out : SolveStatus::feasible);
  }
  st.searched = true;
  const auto setup_start = Clock::now();
  const Instance inst = exact_search::build_instance(problem, searched);
  st.setup_ms = ms_since(setup_start);
  const auto search_start = Clock::now();
  if (capacity) {
    std::vector<Offset> item_offsets;
    SearchTrail trail;  // the node search's undo records, kept across attempts
    budget.start_phase(1.0);
    const Outcome outcome = feasible_within(inst, *capacity, budget, trail, item_offsets, options.band_search, st);
    st.nodes = budget.nodes();
    st.search_ms = ms_since(search_start);
    if (outcome == Outcome::infeasible) {
      st.proof = "capacity";
      st.stopped = "proof";
      return finish({}, SolveStatus::not_found);
    }
    if (outcome == Outcome::budget) {
      st.stopped = budget.limit_reached();
      return finish({}, SolveStatus::timed_out);
    }
    std::vector<Offset> offsets = assemble(greedy.offsets, searched, item_offsets);
    const bool at_bound = packing_height(problem, offsets) <= lower_bound;
    if (at_bound) st.proof = "search";
    st.stopped = at_bound ? "bound" : "capacity";
    return finish(std::move(offsets), at_bound ? SolveStatus::optimal : SolveStatus::feasible);
  }
  Minimised minimised = minimise(problem, lower_bound, greedy, inst, searched, budget, options.band_search, st);
  st.search_ms = ms_since(search_start);
  return finish(std::move(minimised.offsets), minimised.optimal ? SolveStatus::optimal : SolveStatus::feasible);
}

}  // namespace

}  // namespace memplan::planner
