// An independent checker for packings: deliberately simple (pairwise over lifetimes that
// overlap) and sharing no code with the solvers, so a solver bug cannot hide behind it.
// It checks; it never repairs or searches.
#pragma once

#include <vector>

#include "memplan/common/result.h"
#include "memplan/planner/allocation_problem.h"

namespace memplan::planner {

// Checks that `offsets` (one per buffer) with arena height `height_bytes` is a valid packing:
// every offset is >= 0 and a multiple of its buffer's alignment; fixed offsets are respected;
// no two buffers share a byte while both are live; the height holds every buffer's last byte;
// the height is within the capacity, if the problem has one. The message names the rule and
// the buffer(s) that broke it.
Status validate_packing(const AllocationProblem& problem, const std::vector<Offset>& offsets,
                        Bytes height_bytes);

// The same for a Solution; a solution without a packing (not_found, timed_out) is an error.
Status validate_solution(const AllocationProblem& problem, const Solution& solution);

}  // namespace memplan::planner
