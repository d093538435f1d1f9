// Checkpointing a chain of stages, as plain data: which stages of a forward chain to store until
// their backward runs and which to recompute from the last kept boundary, minimising the
// recomputed FLOPs under a memory limit. No graph here; planner/checkpoint.cpp builds the chain.
//
// The family of schedules (single-level, Chen et al. 2016 generalised to stages with different
// costs): the stages 1..n are cut into consecutive segments. A stored segment keeps every
// activation of its stages from the forward pass to their backward. A recomputed segment keeps
// only its last stage's output (the boundary the next segment starts from) and, when the backward
// pass reaches it, runs its forward again from the previous kept boundary, then its backward.
// The modelled peak is the largest, over segments k, of the bytes kept by the segments before k
// plus every activation of segment k (when k's backward runs, later segments are already freed).
//
// solve_chain is exact for this family and this peak model (tests compare it with brute force):
// dynamic programming over (first stage, memory left) in units of `quantum` bytes, with sizes
// rounded up to whole units so a solution never exceeds the limit in bytes. It is not the richer
// nested DP of Beaumont et al. 2019 (rotor), in which a recomputed segment may itself keep
// boundaries while it is recomputed; that family can reach lower peaks at more recomputation.
#pragma once

#include <vector>

#include "common/types.h"

namespace memplan::planner {

struct ChainStage {
  double forward_flops = 0.0;  // what recomputing the stage costs
  Bytes boundary_bytes = 0;    // its output: the next stage's input
  Bytes internal_bytes = 0;    // its other activations that its backward reads
  Bytes all_bytes() const { return boundary_bytes + internal_bytes; }
};

struct ChainSegment {
  int first = 0;  // stage indices, inclusive, 0-based
  int last = 0;
  bool recompute = false;
};

struct ChainSolution {
  std::vector<ChainSegment> segments;  // in order, covering every stage once
  double recompute_flops = 0.0;
  Bytes peak_bytes = 0;  // the modelled peak, in bytes (not rounded)
};

// The modelled peak and recompute FLOPs of a segmentation (checks nothing about optimality).
ChainSolution evaluate_chain(const std::vector<ChainStage>& stages, std::vector<ChainSegment> segments);

// The least recomputation whose modelled peak is at most `memory_limit`, or an empty segment list
// when no segmentation fits. `quantum` (>= 1) is the DP's memory unit; 1 makes it exact in bytes.
ChainSolution solve_chain(const std::vector<ChainStage>& stages, Bytes memory_limit, Bytes quantum = 1);

// Every solution on the memory/recompute trade-off for limits from the smallest feasible peak
// up to storing everything, in increasing recompute FLOPs (each strictly less memory than the
// one before), with the memory unit chosen so the table has about `resolution` columns.
std::vector<ChainSolution> chain_frontier(const std::vector<ChainStage>& stages, int resolution = 2000);

// Chen et al.'s segments: about sqrt(n) stages each, all recomputed but the last (whose
// activations the backward pass needs at once, so recomputing them would save nothing).
std::vector<ChainSegment> sqrt_segments(int num_stages);

}  // namespace memplan::planner
