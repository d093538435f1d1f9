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
  } else if (optimal) {
    st.proof = "exhausted";
  }
  return {std::move(best), optimal};
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
      exact_search::count_conflict_pairs(problem, searched) > options.max_conflict_pairs) {
    return finish(greedy.offsets, capacity ? SolveStatus::timed_out : SolveStatus::feasible);
  }
  // A wall-clock budget spent by the greedy portfolio leaves its packing as the answer.
  if (deadline && Clock::now() >= *deadline) {
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
      return finish({}, SolveStatus::not_found);
    }
    if (outcome == Outcome::budget) return finish({}, SolveStatus::timed_out);
    std::vector<Offset> offsets = assemble(greedy.offsets, searched, item_offsets);
    const bool at_bound = packing_height(problem, offsets) <= lower_bound;
    if (at_bound) st.proof = "search";
    return finish(std::move(offsets), at_bound ? SolveStatus::optimal : SolveStatus::feasible);
  }
  Minimised minimised = minimise(problem, lower_bound, greedy, inst, searched, budget, options.band_search, st);
  st.search_ms = ms_since(search_start);
  return finish(std::move(minimised.offsets), minimised.optimal ? SolveStatus::optimal : SolveStatus::feasible);
}

}  // namespace

}  // namespace memplan::planner
