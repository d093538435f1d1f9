// Checkpointing a chain of stages, as plain data: which stages of a forward chain to keep until
// their backward runs and which to recompute, minimising the recomputed FLOPs under a memory
// limit. No graph here; planner/checkpoint.cpp builds the chain and rewrites the graph.
//
// Two families of schedules, both exact under the same memory model:
//
// Single-level (Chen et al. 2016 generalised to stages with different costs): the stages are cut
// into consecutive segments. A stored segment keeps every activation of its stages from the
// forward pass to their backward. A recomputed segment keeps only its last stage's output (the
// boundary the next segment starts from) and, when the backward pass reaches it, runs its forward
// again from the previous kept boundary, then its backward. The modelled peak is the largest,
// over segments k, of the bytes kept by the segments before k plus every activation of segment k
// (when k's backward runs, later segments are already freed). solve_chain is exact for this
// family: dynamic programming over (first stage, memory left) in units of `quantum` bytes, with
// sizes rounded up to whole units so a solution never exceeds the limit in bytes.
//
// Nested (below): a recomputed stretch may itself keep boundaries while it is recomputed, and a
// stage may run forward more than twice; it contains the single-level family.
#pragma once

#include <vector>

#include "memplan/common/types.h"

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

// --- The nested family (Beaumont et al. 2019, the rotor project's DP) ----------------------
//
// A schedule is a sequence of actions on the chain: run stage i forward keeping only its output
// (kForward), run it keeping every activation its backward reads (kForwardKeepAll), or run its
// backward (kBackward). A stage may run forward several times; each run reads the latest output
// of the stage before it, and a stored output lives until its last reader. A recomputed stretch
// may thus keep boundaries of its own while it is recomputed, which the single-level family
// cannot. The peak is the largest number of live bytes while a backward action runs (forward
// transients are left to the real planner, as above), the cost the FLOPs of every forward run.
// solve_chain_nested is exact for this family and peak (tests compare it with brute force over
// every schedule the recursion below can form, measured by simulate_chain):
//   C(s, t, m) = min( f_s + C(s+1, t, m - all_s)                        keep stage s whole,
//                     min_{s<k<=t} f_s..f_{k-1} + C(k, t, m - b_{k-1}) + C(s, k-1, m) )
// (run s..k-1 keeping only b_{k-1}, finish k..t, then redo s..k-1 from the kept input).

enum class ChainActionKind : unsigned char { kForward, kForwardKeepAll, kBackward };

struct ChainAction {
  ChainActionKind kind = ChainActionKind::kForward;
  int stage = 0;
  bool operator==(const ChainAction&) const = default;
};

struct ChainSchedule {
  std::vector<ChainAction> actions;  // empty: no schedule fits
  double recompute_flops = 0.0;      // FLOPs of forward runs beyond each stage's first
  Bytes peak_bytes = 0;
};

// Checks that `actions` is a valid schedule (MEMPLAN_CHECK on a malformed one) and measures it.
ChainSchedule simulate_chain(const std::vector<ChainStage>& stages, std::vector<ChainAction> actions);

// The least recomputation whose peak is at most `memory_limit` (empty actions when none fits).
ChainSchedule solve_chain_nested(const std::vector<ChainStage>& stages, Bytes memory_limit, Bytes quantum = 1);

// As chain_frontier, for the nested family: increasing recompute FLOPs, strictly decreasing peaks.
std::vector<ChainSchedule> chain_frontier_nested(const std::vector<ChainStage>& stages, int resolution = 2000);

// A single-level segmentation as a schedule: the forward pass (stored stages kept whole,
// recomputed ones keeping only their outputs), then per segment from the last, its recomputation
// (if any) and its backward.
std::vector<ChainAction> segments_to_actions(const std::vector<ChainSegment>& segments);

// Chen et al.'s segments: about sqrt(n) stages each, all recomputed but the last (whose
// activations the backward pass needs at once, so recomputing them would save nothing).
std::vector<ChainSegment> sqrt_segments(int num_stages);

}  // namespace memplan::planner
