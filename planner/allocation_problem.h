// The offset-assignment problem as plain data: buffers (size, alignment, lifetime) in, one
// offset per buffer and an arena height out. No graph, no pointers, no devices: liveness
// analysis builds an AllocationProblem elsewhere; solvers and the validator only read it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"

namespace memplan::planner {

// A position in a schedule. Wider than OpIndex so MiniMalloc traces (64-bit times) fit.
using TimePoint = std::int64_t;

struct BufferSpec {
  std::string id;                      // a name for messages and CSV files
  Bytes size_bytes = 0;                // >= 0; a zero-size buffer conflicts with nothing
  Bytes alignment = 1;                 // >= 1; the offset must be a multiple of it
  TimePoint first_op = 0;              // live over the half-open range [first_op, end_op):
  TimePoint end_op = 0;                //   end_op is one past the last op that touches it
  std::optional<Offset> fixed_offset;  // pinned by the caller (e.g. a persistent region)
};

struct AllocationProblem {
  std::vector<BufferSpec> buffers;
  std::optional<Bytes> capacity_bytes;  // no capacity: minimise the arena height
};

// optimal:   a packing whose height is proven minimal (it equals the lower bound, or the
//            search proved nothing lower exists; with a capacity, proven within it too).
// feasible:  a valid packing (within the capacity if one was given), not proven minimal.
// not_found: the search finished without a packing within the capacity. For the exact
//            solver with no budget hit this is a proof that none exists.
// timed_out: the time/node budget ran out before a packing within the capacity was found.
enum class SolveStatus { optimal, feasible, not_found, timed_out };

std::string_view to_string(SolveStatus status);

struct Solution {
  std::vector<Offset> offsets;  // one per problem buffer, same order; empty without a packing
  Bytes height_bytes = 0;       // max over buffers of offset + footprint_bytes
  SolveStatus status = SolveStatus::not_found;

  bool has_packing() const {
    return status == SolveStatus::optimal || status == SolveStatus::feasible;
  }
};

// Solvers reserve a buffer's size rounded up to its alignment, so the next buffer stacked on
// it starts aligned; heights and the lower bound are measured in these footprints.
inline Bytes footprint_bytes(const BufferSpec& buffer) {
  return align_up(buffer.size_bytes, buffer.alignment);
}

inline bool lifetimes_overlap(const BufferSpec& a, const BufferSpec& b) {
  return a.first_op < b.end_op && b.first_op < a.end_op;
}

// Max over time of the summed footprints of live buffers: no packing is lower. Also counts
// fixed-offset buffers at their top (offset + footprint), which no packing can go below.
Bytes lower_bound_bytes(const AllocationProblem& problem);

// Input checks at the public boundary: sizes >= 0 and below 2^60, all footprints together at
// most 2^62 (so no height overflows 64 bits), alignment >= 1,
// first_op < end_op, fixed offsets non-negative and aligned, fixed buffers not overlapping
// each other, capacity >= 0. Solvers MEMPLAN_CHECK this; callers get a message naming the
// buffer.
Status check_problem(const AllocationProblem& problem);

// Height of a set of offsets (max offset + footprint, 0 for no buffers).
Bytes packing_height(const AllocationProblem& problem, const std::vector<Offset>& offsets);

}  // namespace memplan::planner
