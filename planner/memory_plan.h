// The MemoryPlan: where every byte of a training step lives. One arena: a persistent region
// (parameters, optimizer state; alive across steps) followed by a transient region packed by
// offset assignment over the buffers' lifetimes. Self-contained: the executor, the fit report
// and the dynamic comparison all read the same plan.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/planner/allocation_problem.h"
#include "memplan/planner/liveness.h"
#include "memplan/planner/schedule.h"

namespace memplan::planner {

inline constexpr Bytes kArenaAlignment = 256;  // every buffer starts on a 256-byte boundary

// What a buffer of `size_bytes` takes in the arena (or the host region): at least a byte, its
// guard gap, rounded up to the arena's alignment. Plans, lower bounds, the transient problem and
// the order search all count it this way.
Bytes buffer_footprint(Bytes size_bytes, Bytes guard_bytes);

struct PlannedBuffer {
  std::string name;  // the root tensor's name
  TensorId root = kNoTensor;
  graph::Role role = graph::Role::activation;
  Bytes size_bytes = 0;
  Offset offset = 0;  // from the arena's start
  OpIndex first_op = 0;
  OpIndex last_op = 0;  // inclusive
  bool persistent = false;
  bool step_result = false;
  OpIndex first_use = 0;  // persistent buffers: the first op that touches them (dynamic replay
                          // creates optimizer state there, as eager frameworks do lazily)
  bool master_copy = false;  // the f32 master copy of a 16-bit parameter (optimizer state)
  bool host = false;         // in the host region (MemoryPlan::host_buffers), offset from its start
};

// A lifetime as a buffer of a plan, not yet placed (offset 0): the one conversion both the
// planner and the naive executor use.
PlannedBuffer unplaced_buffer(const graph::Graph& graph, const BufferLifetime& life);

// How hard offset assignment tries after the greedy portfolio. Deterministic by default: a budget
// of search nodes gives the same plan on a busy machine and an idle one. Wall-clock time limits
// the search only when a caller asks for it (then two runs may differ).
struct SolverBudget {
  std::int64_t exact_nodes = 1'000'000;  // exact search nodes; 0: the greedy portfolio alone
  double time_limit_s = 0.0;             // > 0: also stop the exact search after this many seconds
  static SolverBudget greedy_only() { return {0, 0.0}; }
  bool searches() const { return exact_nodes != 0; }
};

struct PlanOptions {
  ScheduleKind schedule = ScheduleKind::memory_aware;
  bool choose_best_schedule = true;  // plan every order (program, memory-aware, searched), keep the lowest arena
  // With choose_best_schedule: plan the memory-aware order first and skip solving the program
  // order when its lower bound already reaches that arena (it could at best tie, and ties go to
  // the memory-aware order), so the chosen plan is the same, found faster on large graphs.
  // program_order_arena_bytes then holds that lower bound and program_order_skipped is set.
  bool skip_dominated_schedule = false;
  bool in_place = true;
  SolverBudget solver;
  Bytes guard_bytes = 0;             // debug: a gap after every buffer, checked after every op
  // Kernel scratch the device asks for (the CUDA device: cuBLAS workspace and kernels' partial
  // sums); placed at the end of the persistent region, so it is part of the arena.
  Bytes workspace_bytes = 0;
  // The device computes 16-bit ops in f32 copies of their operands: the workspace adds the most
  // any op widens, leaving out the kinds in native_16bit_ops (graph::kernel_scratch_bytes, which
  // also adds the ops' own scratch on every device).
  bool widen_16bit = false;
  std::vector<graph::OpKind> native_16bit_ops;
  // The caller asks only whether the arena fits this many bytes (a batch-size probe): the exact
  // search then runs only where its answer could differ from the greedy packing's, when the
  // greedy arena is over and the lower bound under. The yes or no is the same as with the search
  // always run (the search never returns more than the greedy packing); the bytes may be greedy's.
  // With skip_dominated_schedule, a memory-aware arena that fits ends the question there: the
  // program order is not planned (program_order_skipped, its arena 0).
  std::optional<Bytes> decide_against;
  // The budget the plan's arena will be checked against, where there is one (PlanRequest::budget),
  // without decide_against's fits-or-not shortcut: the searched order is packed exactly where
  // that decides whether it fits, as a fits-or-not probe of the same step would.
  std::optional<Bytes> fits_budget;
  // Orders the searched schedule evaluates (OrderSearchOptions::max_evaluations; 0: its default).
  std::int64_t order_evaluations = 0;

  OrderSearchOptions order_search() const { return {in_place, guard_bytes, order_evaluations}; }
};

struct MemoryPlan {
  ScheduleKind schedule_kind = ScheduleKind::program;
  Schedule schedule;
  std::vector<PlannedBuffer> buffers;
  std::vector<int> buffer_of_tensor;  // per tensor; -1 if unused
  Bytes persistent_bytes = 0;         // region [0, persistent_bytes)
  Bytes transient_bytes = 0;          // height of the transient region
  Bytes arena_bytes = 0;              // everything the run allocates
  Bytes transient_lower_bound_bytes = 0;
  Bytes lower_bound_bytes = 0;        // persistent + transient lower bound
  Bytes guard_bytes = 0;
  Offset workspace_offset = 0;  // inside the persistent region; workspace_bytes long
  Bytes workspace_bytes = 0;
  SolveStatus solve_status = SolveStatus::feasible;
  double solve_ms = 0.0;
  // The arena each order would need (for reports): program order, memory-aware order, searched
  // order (planner/order_search.h). An order marked skipped was not solved: its lower bound
  // already reached a better order's arena (then its bytes are that lower bound), or the
  // memory-aware arena answered a fits-or-not question (then they are 0).
  Bytes program_order_arena_bytes = 0;
  Bytes memory_aware_arena_bytes = 0;
  Bytes searched_order_arena_bytes = 0;
  bool program_order_skipped = false;
  bool searched_order_skipped = false;
  std::int64_t order_moves = 0;  // ops (or fused pairs) the searched order moved; 0 for the others
  // Host memory (optimizer offload, graph::TensorDesc::host): every host tensor the step touches,
  // back to back in tensor order, live for the whole step; not part of the arena.
  std::vector<PlannedBuffer> host_buffers;
  Bytes host_bytes = 0;

  // Bytes per role at the transient peak (for reports): the sum of live sizes per role at the
  // op where the summed live bytes are largest.
  std::vector<std::pair<graph::Role, Bytes>> peak_by_role() const;
  // That op's schedule position (the first such position on a tie; 0 for an empty schedule).
  OpIndex peak_position() const;
};

// The kernels' scratch a plan of `graph` under `options` holds in its workspace beside
// options.workspace_bytes: graph::kernel_scratch_bytes with the options' 16-bit widening.
Bytes kernel_scratch_bytes(const graph::Graph& graph, const PlanOptions& options);

// Plans a training step. Fails only if the solver finds no packing (it always finds one
// without a capacity) or the schedule is invalid.
Result<MemoryPlan> plan_memory(const graph::Graph& graph, const PlanOptions& options = {});

// A lower bound on plan_memory(graph, options).arena_bytes without packing anything: the
// persistent region plus the transient peak of live bytes, the least over the schedules
// plan_memory considers. Searches (checkpointing, batch size) use it to skip candidates that
// cannot fit a budget.
Result<Bytes> arena_lower_bound(const graph::Graph& graph, const PlanOptions& options = {});

// The transient region as an allocation problem (for benchmarks and the validator).
AllocationProblem transient_problem(const MemoryPlan& plan);

// Independent check of a plan against its own lifetimes: no two buffers live at the same time
// share a byte, persistent buffers do not overlap anything, everything fits the arena, offsets
// are aligned. The message names the two buffers.
Status validate_plan(const MemoryPlan& plan);

}  // namespace memplan::planner
