// An offset-assignment problem cut into independent parts, so the solvers work on pieces of a
// few thousand buffers however long the recording or step is.
//
// Two cuts, applied again inside every piece until neither applies:
//  * a floor: buffers live over the piece's whole time range (parameters, blocks alive across a
//    whole recording) are stacked at its bottom, where that lets the rest split in time (or
//    leaves nothing); a floor that cuts nothing stays in its piece, free for the search;
//  * time cuts: the rest splits at times no buffer crosses.
// A piece neither cuts is a leaf, solved on its own, its offsets starting at `base` (the floors
// under it). Heights and lower bounds compose exactly: the problem's lower bound is the largest
// over the leaves of (base + the leaf's lower bound). No packing of the whole is lower than
// base + the best packing of any one leaf either (take the whole packing, drop the floors'
// ranges, which span the leaf's whole time, and close the gaps), so a leaf proven optimal at the
// top proves the whole. Closing gaps moves buffers by floor footprints, which keeps offsets
// aligned only when those footprints are multiples of every alignment in the piece: a floor is
// cut only then (always for real traces: 512-byte blocks; byte-aligned MiniMalloc files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "memplan/planner/allocation_problem.h"

namespace memplan::planner {

struct ProblemLeaf {
  std::vector<std::size_t> buffers;  // indices into the problem, by first_op (longest first)
  Bytes base = 0;                    // the floors under the leaf: its packing starts here
};

struct ProblemParts {
  std::vector<ProblemLeaf> leaves;
  std::vector<std::pair<std::size_t, Offset>> floor;  // floor buffers and their offsets
  // Worth solving apart: several leaves, or floors alone. One leaf on floors is not: the floors
  // would only take freedom from the search (zero-slack packings hold such buffers mid-height,
  // and one of bench/data/zero-slack is found in 0.6 s whole but not in 10 s on its floors).
  bool decomposed() const { return leaves.size() > 1 || (leaves.empty() && !floor.empty()); }
};

// The parts of `problem`, which must pass check_problem() and hold no fixed buffers. Zero-size
// buffers are in no part (they conflict with nothing). O(n log n), plus the length of every
// piece that is cut or left whole.
ProblemParts split_problem(const AllocationProblem& problem);

// A leaf as a problem of its own: its buffers in leaf order, times and sizes as they are, no
// capacity.
AllocationProblem leaf_problem(const AllocationProblem& problem, const ProblemLeaf& leaf);

// Every buffer's offset from the floor's, and from each leaf's packing (`leaf_offsets[l]`
// indexed like leaves[l].buffers) moved up by its base; zero-size buffers at 0.
std::vector<Offset> assemble_parts(const AllocationProblem& problem, const ProblemParts& parts,
                                   const std::vector<const std::vector<Offset>*>& leaf_offsets);

// Leaves grouped by shape (leaf_shape): `shape_of[l]` numbers leaf l's shape, `first[k]` is the
// first leaf of shape k.
struct LeafShapes {
  std::vector<std::size_t> shape_of;
  std::vector<std::size_t> first;
};
LeafShapes group_leaves_by_shape(const AllocationProblem& problem, const ProblemParts& parts);

// A key equal for leaves that are the same problem shifted in time (each buffer's size,
// alignment and lifetime relative to the leaf's first time, in leaf order): a recording of
// repeated training steps is mostly such copies, solved once.
std::vector<std::int64_t> leaf_shape(const AllocationProblem& problem, const ProblemLeaf& leaf);

}  // namespace memplan::planner
