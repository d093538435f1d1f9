#include "memplan/planner/memory_plan.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "memplan/graph/mixed_precision.h"
#include "memplan/planner/exact_solver.h"
#include "memplan/planner/greedy_solver.h"
#include "memplan/planner/validator.h"

namespace memplan::planner {

PlannedBuffer unplaced_buffer(const graph::Graph& graph, const BufferLifetime& life) {
  PlannedBuffer b;
  b.root = life.root;
  b.name = graph.tensor(life.root).name;
  b.role = graph.tensor(life.root).role;
  b.size_bytes = life.size_bytes;
  b.first_op = life.first_op;
  b.last_op = life.last_op;
  b.persistent = life.persistent;
  b.step_result = life.step_result;
  b.master_copy = graph.tensor(life.root).master_of != kNoTensor;
  return b;
}

Bytes kernel_scratch_bytes(const graph::Graph& graph, const PlanOptions& options) {
  return graph::kernel_scratch_bytes(graph, options.widen_16bit, options.native_16bit_ops);
}

Bytes buffer_footprint(Bytes size_bytes, Bytes guard_bytes) {
  return align_up(std::max<Bytes>(size_bytes, 1) + guard_bytes, kArenaAlignment);
}

namespace {

// The host region: each host root tensor some op touches, in tensor order, aligned like the arena.
// Per tensor: whether it is the storage root of a tensor some op reads, writes or updates.
std::vector<bool> touched_roots(const graph::Graph& graph) {
  std::vector<bool> touched(static_cast<std::size_t>(graph.num_tensors()), false);
  for (const graph::Op& op : graph.ops()) {
    for (const auto* list : {&op.inputs, &op.outputs, &op.updates}) {
      for (TensorId t : *list) touched[static_cast<std::size_t>(graph.storage_root(t))] = true;
    }
  }
  return touched;
}

void place_host_buffers(const graph::Graph& graph, Bytes guard_bytes, MemoryPlan& plan) {
  const std::vector<bool> touched = touched_roots(graph);
  Offset next = 0;
  for (TensorId t = 0; t < graph.num_tensors(); ++t) {
    const graph::TensorDesc& desc = graph.tensor(t);
    if (!desc.host || desc.is_view() || !touched[static_cast<std::size_t>(t)]) continue;
    PlannedBuffer b;
    b.root = t;
    b.name = desc.name;
    b.role = desc.role;
    b.size_bytes = desc.size_bytes();
    b.offset = next;
    b.persistent = true;
    b.host = true;
    b.master_copy = desc.master_of != kNoTensor;
    next += buffer_footprint(b.size_bytes, guard_bytes);
    plan.host_buffers.push_back(std::move(b));
  }
  plan.host_bytes = next;
}

// `give_up_at`: when the plan's lower bound (persistent + transient) reaches it, return the
// plan unsolved (offsets unset, arena_bytes = that lower bound, solve_status not_found).
Result<MemoryPlan> plan_with_schedule(const graph::Graph& graph, ScheduleKind kind, const PlanOptions& options,
                                      std::optional<Bytes> give_up_at = std::nullopt) {
  const auto t0 = std::chrono::steady_clock::now();
  MemoryPlan plan;
  plan.schedule_kind = kind;
  OrderSearchResult search;
  plan.schedule = make_schedule(graph, kind, options.order_search(), &search);
  plan.order_moves = search.moves;
  if (Status s = check_schedule(graph, plan.schedule); !s) return s.error();
  plan.guard_bytes = options.guard_bytes;
  const Lifetimes lifetimes = compute_lifetimes(graph, plan.schedule, LivenessOptions{options.in_place});
  plan.buffer_of_tensor = lifetimes.buffer_of_tensor;

  // Persistent region: packed back to back in graph order.
  Offset next = 0;
  AllocationProblem transient;
  std::vector<int> transient_index;  // problem buffer -> plan buffer
  for (const BufferLifetime& life : lifetimes.buffers) {
    PlannedBuffer b = unplaced_buffer(graph, life);
    const Bytes footprint = buffer_footprint(b.size_bytes, options.guard_bytes);
    if (b.persistent) {
      b.offset = next;
      next += footprint;
    } else {
      BufferSpec spec;
      spec.id = b.name;
      spec.size_bytes = footprint;
      spec.alignment = kArenaAlignment;
      spec.first_op = b.first_op;
      spec.end_op = b.last_op + 1;
      transient.buffers.push_back(spec);
      transient_index.push_back(static_cast<int>(plan.buffers.size()));
    }
    plan.buffers.push_back(b);
  }
  const Bytes workspace = options.workspace_bytes + kernel_scratch_bytes(graph, options);
  if (workspace > 0) {
    plan.workspace_offset = next;
    plan.workspace_bytes = workspace;
    next += align_up(workspace, kArenaAlignment);
  }
  plan.persistent_bytes = next;
  place_host_buffers(graph, options.guard_bytes, plan);
  std::vector<bool> touched(plan.buffers.size(), false);
  for (OpIndex pos = 0; pos < static_cast<OpIndex>(plan.schedule.size()); ++pos) {
    const graph::Op& op = graph.ops()[static_cast<std::size_t>(plan.schedule[static_cast<std::size_t>(pos)])];
    for (const auto* list : {&op.inputs, &op.updates}) {
      for (TensorId t : *list) {
        const int index = plan.buffer_of_tensor[static_cast<std::size_t>(t)];
        if (index < 0) continue;  // external storage (graph::TensorDesc::external)
        const auto b = static_cast<std::size_t>(index);
        if (plan.buffers[b].persistent && !touched[b]) {
          touched[b] = true;
          plan.buffers[b].first_use = pos;
        }
      }
    }
  }

  // Sizes a step description let through (planner/step_size.h) can still add up past what one
  // arena holds once checkpointing recomputes activations: that is an answer, not a solver bug.
  if (Status s = check_problem(transient); !s) {
    return Error{"the step cannot be planned in one arena: " + s.error().message +
                 "; a smaller batch, sequence length or image size, or another checkpoint strategy, may fit"};
  }
  if (give_up_at && next + lower_bound_bytes(transient) >= *give_up_at) {
    plan.transient_lower_bound_bytes = lower_bound_bytes(transient);
    plan.lower_bound_bytes = plan.persistent_bytes + plan.transient_lower_bound_bytes;
    plan.arena_bytes = plan.lower_bound_bytes;
    plan.solve_status = SolveStatus::not_found;
    return plan;
  }
  Solution solution = solve_greedy(transient);
  const bool search_decides = !options.decide_against ||
                              (next + solution.height_bytes > *options.decide_against &&
                               next + lower_bound_bytes(transient) <= *options.decide_against);
  if (solution.status != SolveStatus::optimal && options.solver.searches() && search_decides) {
    ExactSolverOptions exact;
    exact.node_limit = options.solver.exact_nodes;
    exact.time_limit_s = options.solver.time_limit_s;
    Solution better = solve_exact(transient, exact);
    if (better.has_packing() && better.height_bytes <= solution.height_bytes) solution = better;
  }
  if (!solution.has_packing()) return Error{"no packing found for the transient region"};
  if (Status s = validate_solution(transient, solution); !s) {
    return Error{"the offset solver returned an invalid packing: " + s.error().message};
  }
  for (std::size_t i = 0; i < transient_index.size(); ++i) {
    plan.buffers[static_cast<std::size_t>(transient_index[i])].offset = plan.persistent_bytes + solution.offsets[i];
  }
  plan.transient_bytes = solution.height_bytes;
  plan.transient_lower_bound_bytes = lower_bound_bytes(transient);
  plan.arena_bytes = plan.persistent_bytes + plan.transient_bytes;
  plan.lower_bound_bytes = plan.persistent_bytes + plan.transient_lower_bound_bytes;
  plan.solve_status = solution.status;
  plan.solve_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

}  // namespace

Result<MemoryPlan> plan_memory(const graph::Graph& graph, const PlanOptions& options) {
  if (!options.choose_best_schedule) {
    auto plan = plan_with_schedule(graph, options.schedule, options);
    if (plan) {
      MemoryPlan& p = plan.value();
      (options.schedule == ScheduleKind::program        ? p.program_order_arena_bytes
       : options.schedule == ScheduleKind::memory_aware ? p.memory_aware_arena_bytes
                                                        : p.searched_order_arena_bytes) = p.arena_bytes;
    }
    return plan;
  }
  // Every order, the lower arena kept; ties go to the memory-aware order (its gradients die
  // earlier, which leaves more room for activations once checkpointing trades them), then to the
  // program order: the searched order is kept only where it is strictly lower.
  auto aware = plan_with_schedule(graph, ScheduleKind::memory_aware, options);
  if (!aware) return aware;
  const Bytes aware_bytes = aware.value().arena_bytes;
  if (options.skip_dominated_schedule && options.decide_against && aware_bytes <= *options.decide_against) {
    // "Fits" is answered: the program order is not looked at (its arena is reported as 0); the
    // searched order still is, unsolved unless its bound is below, so the bytes reported are the
    // plan's (a batch search's table shows them).
    auto searched = plan_with_schedule(graph, ScheduleKind::searched, options, aware_bytes);
    if (!searched) return searched;
    const bool searched_skipped = searched.value().solve_status == SolveStatus::not_found;
    const Bytes searched_bytes = searched.value().arena_bytes;
    MemoryPlan best = !searched_skipped && searched_bytes < aware_bytes ? std::move(searched).value() : std::move(aware).value();
    best.memory_aware_arena_bytes = aware_bytes;
    best.searched_order_arena_bytes = searched_bytes;
    best.program_order_skipped = true;
    best.searched_order_skipped = searched_skipped;
    return best;
  }
  // An order whose lower bound reaches the best arena so far could at best tie: with
  // skip_dominated_schedule the program order is then not solved; the searched order never is.
  auto program = plan_with_schedule(graph, ScheduleKind::program, options,
                                    options.skip_dominated_schedule ? std::optional<Bytes>(aware_bytes) : std::nullopt);
  if (!program) return program;
  const bool program_skipped = program.value().solve_status == SolveStatus::not_found;
  const Bytes program_bytes = program.value().arena_bytes;
  MemoryPlan best = program_skipped || aware_bytes <= program_bytes ? std::move(aware).value() : std::move(program).value();
  // The exact search packs the searched order only where it decides something: the caller's
  // fits-or-not question, else whether the plan fits its budget or the order beats the best
  // arena so far (a greedy packing already below both is kept as it is: polishing the last bytes
  // of a large step's packing can take the exact search seconds, for no change of answer).
  PlanOptions searched_options = options;
  if (!searched_options.decide_against) {
    searched_options.decide_against =
        options.fits_budget ? std::min(*options.fits_budget, best.arena_bytes - 1) : best.arena_bytes - 1;
  }
  auto searched = plan_with_schedule(graph, ScheduleKind::searched, searched_options, best.arena_bytes);
  if (!searched) return searched;
  const bool searched_skipped = searched.value().solve_status == SolveStatus::not_found;
  const Bytes searched_bytes = searched.value().arena_bytes;
  if (!searched_skipped && searched_bytes < best.arena_bytes) best = std::move(searched).value();
  best.program_order_arena_bytes = program_bytes;
  best.memory_aware_arena_bytes = aware_bytes;
  best.searched_order_arena_bytes = searched_bytes;
  best.program_order_skipped = program_skipped;
  best.searched_order_skipped = searched_skipped;
  return best;
}

namespace {

// plan_with_schedule's lower bound (persistent footprints, the workspace, the transient peak of
// live footprints) without building the plan: no names copied, no problem sorted. Sizes too
// large for an arena take plan_with_schedule's path, which says what is wrong with them.
Result<Bytes> lower_bound_with_schedule(const graph::Graph& graph, ScheduleKind kind, const PlanOptions& options,
                                        Bytes workspace) {
  OrderSearchResult found;
  const Schedule schedule = make_schedule(graph, kind, options.order_search(), &found);
  // A searched order is checked where it is planned (plan_with_schedule); a bound alone (a
  // checkpoint frontier's thousands) does not repeat the check.
  if (kind != ScheduleKind::searched) {
    if (Status s = check_schedule(graph, schedule); !s) return s.error();
  }
  constexpr Bytes kLargest = Bytes{1} << 56;  // far below where an allocation problem's checks start
  if (kind == ScheduleKind::searched) {
    // The search measured the order's transient peak; the persistent footprints do not depend on
    // the order: each persistent storage root some op touches.
    const std::vector<bool> touched = touched_roots(graph);
    Bytes persistent = 0;
    bool representable = found.peak <= kLargest;
    for (TensorId t = 0; t < graph.num_tensors() && representable; ++t) {
      const graph::TensorDesc& desc = graph.tensor(t);
      if (!touched[static_cast<std::size_t>(t)] || desc.external || desc.host) continue;
      representable = desc.size_bytes() <= kLargest && persistent <= kLargest;
      if (graph::is_persistent(desc.role)) persistent += buffer_footprint(desc.size_bytes(), options.guard_bytes);
    }
    if (representable) return persistent + (workspace > 0 ? align_up(workspace, kArenaAlignment) : 0) + found.peak;
  }
  const Lifetimes lifetimes = compute_lifetimes(graph, schedule, LivenessOptions{options.in_place});
  Bytes persistent = 0;
  std::vector<Bytes> change(schedule.size() + 1, 0);  // live transient bytes: +at first_op, -after last_op
  for (const BufferLifetime& life : lifetimes.buffers) {
    if (life.size_bytes > kLargest || persistent > kLargest) {
      auto plan = plan_with_schedule(graph, kind, options, Bytes{0});
      if (!plan) return plan.error();
      return plan.value().lower_bound_bytes;
    }
    const Bytes footprint = buffer_footprint(life.size_bytes, options.guard_bytes);
    if (life.persistent) {
      persistent += footprint;
    } else {
      change[static_cast<std::size_t>(life.first_op)] += footprint;
      change[static_cast<std::size_t>(life.last_op) + 1] -= footprint;
    }
  }
  if (workspace > 0) persistent += align_up(workspace, kArenaAlignment);
  Bytes live = 0, peak = 0;
  for (const Bytes c : change) {
    live += c;
    peak = std::max(peak, live);
  }
  return persistent + peak;
}

}  // namespace

Result<Bytes> arena_lower_bound(const graph::Graph& graph, const PlanOptions& options) {
  const Bytes workspace = options.workspace_bytes + kernel_scratch_bytes(graph, options);
  auto bound = [&](ScheduleKind kind) { return lower_bound_with_schedule(graph, kind, options, workspace); };
  if (!options.choose_best_schedule) return bound(options.schedule);
  // The searched order starts from the lower of the other two and never rises above it.
  return bound(ScheduleKind::searched);
}

AllocationProblem transient_problem(const MemoryPlan& plan) {
  AllocationProblem problem;
  for (const PlannedBuffer& b : plan.buffers) {
    if (b.persistent) continue;
    BufferSpec spec;
    spec.id = b.name;
    spec.size_bytes = buffer_footprint(b.size_bytes, plan.guard_bytes);
    spec.alignment = kArenaAlignment;
    spec.first_op = b.first_op;
    spec.end_op = b.last_op + 1;
    problem.buffers.push_back(spec);
  }
  return problem;
}

Status validate_plan(const MemoryPlan& plan) {
  // Rules, each named in its message: the persistent region fits the arena; the kernel
  // workspace is an aligned range inside the persistent region; every buffer's offset is
  // aligned; every transient lifetime is a non-empty range of the schedule; every buffer and its
  // guard bytes end inside the arena, persistent ones inside the persistent region; no buffer or
  // its guard bytes touch the workspace; no two buffers, guard bytes included, share a byte
  // while both are live (a persistent buffer is live for the whole step).
  const std::size_t n = plan.buffers.size();
  const Bytes guard = plan.guard_bytes;
  const auto range = [](Offset begin, Offset end) {
    return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  };
  const auto guard_note = [guard] {
    return guard > 0 ? " (with its " + std::to_string(guard) + " guard bytes)" : std::string();
  };
  if (plan.persistent_bytes < 0 || plan.persistent_bytes > plan.arena_bytes) {
    return Error{"the persistent region " + range(0, plan.persistent_bytes) + " does not fit the arena's " +
                 std::to_string(plan.arena_bytes) + " bytes"};
  }
  const Offset ws_end = plan.workspace_offset + plan.workspace_bytes;
  if (plan.workspace_bytes > 0 &&
      (plan.workspace_offset < 0 || plan.workspace_offset % kArenaAlignment != 0 || ws_end > plan.persistent_bytes)) {
    return Error{"the kernel workspace " + range(plan.workspace_offset, ws_end) +
                 " is not an aligned range inside the persistent region " + range(0, plan.persistent_bytes)};
  }
  const auto ops = static_cast<OpIndex>(plan.schedule.size());
  for (const PlannedBuffer& a : plan.buffers) {
    const Offset end = a.offset + a.size_bytes;
    if (a.offset < 0 || a.offset % kArenaAlignment != 0) {
      return Error{"buffer '" + a.name + "' has offset " + std::to_string(a.offset) +
                   ", not a non-negative multiple of " + std::to_string(kArenaAlignment)};
    }
    if (!a.persistent && (a.first_op < 0 || a.first_op > a.last_op || a.last_op >= ops)) {
      return Error{"buffer '" + a.name + "' has lifetime ops " + std::to_string(a.first_op) + ".." +
                   std::to_string(a.last_op) + ", not a non-empty range of the schedule's " + std::to_string(ops) +
                   " ops"};
    }
    if (end + guard > plan.arena_bytes) {
      return Error{"buffer '" + a.name + "' " + range(a.offset, end) + guard_note() + " ends past the arena's " +
                   std::to_string(plan.arena_bytes) + " bytes"};
    }
    if (a.persistent && end + guard > plan.persistent_bytes) {
      return Error{"persistent buffer '" + a.name + "' " + range(a.offset, end) + guard_note() +
                   " lies outside the persistent region " + range(0, plan.persistent_bytes)};
    }
    if (plan.workspace_bytes > 0 && a.size_bytes > 0 && a.offset < ws_end && plan.workspace_offset < end + guard) {
      return Error{"buffer '" + a.name + "' " + range(a.offset, end) + guard_note() + " overlaps the kernel workspace " +
                   range(plan.workspace_offset, ws_end)};
    }
  }
  // The host region: every host buffer inside it, none overlapping another (all live throughout).
  Offset host_end = 0;
  for (const PlannedBuffer& h : plan.host_buffers) {
    if (!h.host || h.offset < host_end || h.offset % kArenaAlignment != 0 || h.offset + h.size_bytes + guard > plan.host_bytes) {
      return Error{"host buffer '" + h.name + "' " + range(h.offset, h.offset + h.size_bytes) +
                   " is not an aligned range of the host region " + range(0, plan.host_bytes) + " after the one before it"};
    }
    host_end = h.offset + h.size_bytes + guard;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const PlannedBuffer& a = plan.buffers[i];
    for (std::size_t j = i + 1; j < n; ++j) {
      const PlannedBuffer& b = plan.buffers[j];
      if (a.size_bytes <= 0 || b.size_bytes <= 0) continue;
      const bool live_together = a.persistent || b.persistent || (a.first_op <= b.last_op && b.first_op <= a.last_op);
      const bool share_bytes = a.offset < b.offset + b.size_bytes + guard && b.offset < a.offset + a.size_bytes + guard;
      if (!live_together || !share_bytes) continue;
      const auto describe = [&](const PlannedBuffer& x) {
        return "'" + x.name + "' " + range(x.offset, x.offset + x.size_bytes) +
               (x.persistent ? " (persistent, live for the whole step)"
                             : " ops " + std::to_string(x.first_op) + ".." + std::to_string(x.last_op));
      };
      const bool bytes_overlap = a.offset < b.offset + b.size_bytes && b.offset < a.offset + a.size_bytes;
      if (!bytes_overlap) {
        return Error{"buffers " + describe(a) + " and " + describe(b) + " are live together with fewer than the " +
                     std::to_string(guard) + " guard bytes between them"};
      }
      return Error{"buffers " + describe(a) + " and " + describe(b) + " overlap while both are live"};
    }
  }
  return Status::success();
}

OpIndex MemoryPlan::peak_position() const {
  // Live transient bytes per position by a sweep over lifetime endpoints (a difference array):
  // linear in ops + buffers, where testing every buffer at every op was quadratic.
  const OpIndex ops = static_cast<OpIndex>(schedule.size());
  std::vector<Bytes> delta(static_cast<std::size_t>(ops) + 1, 0);
  for (const PlannedBuffer& b : buffers) {
    if (b.persistent || b.first_op > b.last_op || b.first_op < 0 || b.last_op >= ops) continue;
    delta[static_cast<std::size_t>(b.first_op)] += b.size_bytes;
    delta[static_cast<std::size_t>(b.last_op) + 1] -= b.size_bytes;
  }
  OpIndex peak_at = 0;
  Bytes peak = -1, live = 0;
  for (OpIndex pos = 0; pos < ops; ++pos) {
    live += delta[static_cast<std::size_t>(pos)];
    if (live > peak) {
      peak = live;
      peak_at = pos;
    }
  }
  return peak_at;
}

std::vector<std::pair<graph::Role, Bytes>> MemoryPlan::peak_by_role() const {
  const OpIndex peak_at = peak_position();
  std::map<graph::Role, Bytes> by_role;
  for (const PlannedBuffer& b : buffers) {
    if (b.persistent) by_role[b.role] += b.size_bytes;
    else if (b.first_op <= peak_at && peak_at <= b.last_op) by_role[b.role] += b.size_bytes;
  }
  return {by_role.begin(), by_role.end()};
}

}  // namespace memplan::planner
