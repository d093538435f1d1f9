// Where a training step's time goes: per-op wall time measured by the executor (opt-in, a clock
// read per op), summed per op kind, each op's share of the step, and the FLOPs (each op's row's
// count, graph::op_flops, the one checkpointing reads) and the rate reached.
// The executor records; this file turns the record into a report. tools/ renders it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memplan/graph/graph.h"

namespace memplan::runtime {

struct OpTime {
  int op_index = 0;  // into graph.ops()
  std::string name;
  graph::OpKind kind{};
  double ms = 0.0;     // mean per step
  double share = 0.0;  // of the mean step time, 0..1
  double flops = 0.0;  // per step (graph::op_flops; 0 for ops that only move data)
  // Run fused with a neighbour (Executor: fused kernels) whose time includes this op's: that
  // op's index into StepProfile::ops; -1 when timed on its own.
  int timed_in = -1;
  double gflops_per_s() const { return ms > 0.0 && flops > 0.0 ? flops / (ms * 1e6) : 0.0; }
};

struct KindTime {
  graph::OpKind kind{};
  int ops = 0;  // ops of this kind in the step
  double ms = 0.0;
  double share = 0.0;
  double flops = 0.0;
  int timed_elsewhere = 0;    // ops of this kind run fused and timed within another op
  std::vector<graph::OpKind> timed_in;  // the kinds of those ops, each once, as first met
  double gflops_per_s() const { return ms > 0.0 && flops > 0.0 ? flops / (ms * 1e6) : 0.0; }
};

struct StepProfile {
  std::int64_t steps = 0;     // steps measured
  double step_ms = 0.0;       // mean wall time of run_step
  double ops_ms = 0.0;        // sum of the ops' means
  double other_ms = 0.0;      // step_ms - ops_ms: copying the inputs in, executor bookkeeping
  double flops = 0.0;         // per step, every op's
  std::vector<OpTime> ops;    // schedule order; each op's time includes its allocation events
  std::vector<KindTime> kinds;  // slowest first
  std::vector<int> slowest;   // up to five indices into `ops`, slowest first
};

// The raw record the executor keeps while profiling.
struct ProfileRecord {
  std::int64_t steps = 0;
  double step_ns = 0.0;                 // summed over steps
  std::vector<double> op_ns;            // per schedule position, summed over steps
  // Per schedule position: the position whose time includes this op's (a fused pair), or -1.
  std::vector<int> timed_in;
};

StepProfile make_step_profile(const graph::Graph& graph, const std::vector<int>& schedule, const ProfileRecord& record);

}  // namespace memplan::runtime
