// Searching a step's op order for a lower transient peak: the arena's lower bound under an order
// is its peak of live footprints, so an order with a lower peak lets the offset solver pack a
// smaller arena. The search starts from a valid order and moves one op (or one fused pair) at a
// time, each move chosen at the peak: the writer of a buffer live there run after it, or the
// last reader of one run before it. A move is kept only when it lowers the peak, or keeps it and
// leaves fewer ops at it. Every move keeps the orderings the step's results depend on (below), so
// a searched order computes the same bits as the order it started from.
#pragma once

#include <cstdint>
#include <span>

#include "memplan/common/types.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/liveness.h"

namespace memplan::planner {

struct OrderSearchOptions {
  bool in_place = true;      // LivenessOptions::in_place of the plan the order is for
  Bytes guard_bytes = 0;     // footprints as the plan counts them (PlanOptions::guard_bytes)
  // Candidate orders evaluated (each a pass over the step's accesses; each move kept costs one
  // more, to list the next candidates); deterministic, so the same step gets the same order on
  // any machine. 0: kOrderSearchWork / (the step's ops), at least 8 and at most
  // kDefaultOrderEvaluations.
  std::int64_t max_evaluations = 0;
};

inline constexpr std::int64_t kDefaultOrderEvaluations = 3000;
inline constexpr std::int64_t kOrderSearchWork = 4'000'000;  // ops times evaluations

struct OrderSearchResult {
  Schedule schedule;
  Bytes start_peak = 0;  // transient peak (live footprints) of the start order
  Bytes peak = 0;        // of the searched order: never above start_peak
  std::int64_t evaluations = 0;  // candidate orders evaluated
  std::int64_t moves = 0;        // moves kept
};

// Searches from `start`, which must be a valid order (check_schedule). What every order it tries
// keeps, taken from `start`:
//  - each op after the last earlier writer of every buffer it touches, and each write after every
//    earlier reader of that buffer (producers before readers, an update after the reads of the old
//    value, an in-place collective after the reads of its input);
//  - the step's updates after the op that decides whether they run (OpInfo::gates_updates);
//  - the collectives in their order, the same on every rank (OpInfo::communicates);
//  - pairs a backend runs as one kernel still adjacent (graph::fusable_pair).
OrderSearchResult search_order(const graph::Graph& graph, const Schedule& start, const OrderSearchOptions& options = {});
// The same from the lowest-peak of `starts` (the first of equals), each a valid order.
OrderSearchResult search_order(const graph::Graph& graph, std::span<const Schedule> starts,
                               const OrderSearchOptions& options = {});

// The transient peak of `schedule`: the most bytes of footprints live at once, as the plan counts
// them (in-place sharing, guards, alignment).
Bytes transient_peak(const graph::Graph& graph, const Schedule& schedule, const OrderSearchOptions& options = {});

}  // namespace memplan::planner
