#include "memplan/planner/schedule.h"

#include <algorithm>
#include <set>
#include <string>

namespace memplan::planner {

using graph::Graph;
using graph::Op;

std::string_view schedule_name(ScheduleKind kind) { return enum_name(kScheduleNames, kind); }

Result<ScheduleKind> parse_schedule_kind(std::string_view name) { return parse_enum(kScheduleNames, name, "schedule"); }

namespace {

// For each persistent tensor: the non-update ops that read it (they must run before its update).
std::vector<std::vector<int>> readers_of_persistent(const Graph& graph) {
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(graph.num_tensors()));
  for (int i = 0; i < graph.num_ops(); ++i) {
    for (TensorId t : graph.ops()[static_cast<std::size_t>(i)].inputs) {
      const TensorId root = graph.storage_root(t);
      if (graph::is_persistent(graph.tensor(root).role)) readers[static_cast<std::size_t>(root)].push_back(i);
    }
  }
  return readers;
}

}  // namespace

bool keep_next_adjacent(const Graph& graph, int i, int next) {
  if (next >= graph.num_ops()) return false;
  const Op& a = graph.ops()[static_cast<std::size_t>(i)];
  const Op& b = graph.ops()[static_cast<std::size_t>(next)];
  return graph::fusable_pair(a.kind, b.kind) && a.outputs.size() == 1 &&
         std::find(b.inputs.begin(), b.inputs.end(), a.outputs[0]) != b.inputs.end();
}

Schedule make_schedule(const Graph& graph, ScheduleKind kind, const OrderSearchOptions& search, OrderSearchResult* found) {
  if (kind == ScheduleKind::program) return default_schedule(graph);
  if (kind == ScheduleKind::searched) {
    const Schedule starts[] = {make_schedule(graph, ScheduleKind::memory_aware), default_schedule(graph)};
    OrderSearchResult result = search_order(graph, starts, search);
    if (found != nullptr) *found = result;
    return std::move(result.schedule);
  }
  // Program order, with every update op run as soon as it is ready: the producers of its inputs
  // have run, and so has every other op that reads a tensor it updates (or one op later, where
  // keep_next_adjacent says so). After each non-update op
  // one pass over the updates in program order runs those ready when the pass reaches them (one
  // that becomes ready behind the pass waits for the next). Each update counts its unmet
  // dependencies, so a pass touches only ready updates rather than scanning all of them.
  const auto readers = readers_of_persistent(graph);
  const int num_ops = graph.num_ops();
  std::vector<int> updates;                                     // op index per update position
  std::vector<int> unmet;                                       // per update position
  std::vector<std::vector<int>> dependents(static_cast<std::size_t>(num_ops));  // op -> update positions
  std::vector<int> last_updater(static_cast<std::size_t>(graph.num_tensors()), -1);  // per storage root
  std::vector<int> gates;  // ops every update waits for (graph::OpInfo::gates_updates)
  for (int i = 0; i < num_ops; ++i) {
    if (graph::op_info(graph.ops()[static_cast<std::size_t>(i)].kind).gates_updates) gates.push_back(i);
  }
  for (int i = 0; i < num_ops; ++i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    if (op.updates.empty()) continue;
    const int u = static_cast<int>(updates.size());
    std::vector<int> deps = op.phase == graph::Phase::optimizer ? gates : std::vector<int>{};
    for (TensorId t : op.inputs) {
      const int p = graph.producer(t);
      if (p >= 0) deps.push_back(p);
    }
    for (TensorId t : op.updates) {
      const auto root = static_cast<std::size_t>(graph.storage_root(t));
      for (int r : readers[root]) {
        if (r != i) deps.push_back(r);
      }
      // Several updates of one tensor (a sharded update, then the all-gather of the result) keep
      // their program order.
      if (last_updater[root] >= 0) deps.push_back(last_updater[root]);
      last_updater[root] = i;
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    for (int d : deps) dependents[static_cast<std::size_t>(d)].push_back(u);
    updates.push_back(i);
    unmet.push_back(static_cast<int>(deps.size()));
  }
  std::vector<bool> update_done(updates.size(), false);
  std::set<int> ready;  // update positions with no unmet dependency, not yet run
  for (std::size_t u = 0; u < updates.size(); ++u) {
    if (unmet[u] == 0) ready.insert(static_cast<int>(u));
  }
  Schedule schedule;
  schedule.reserve(static_cast<std::size_t>(num_ops));
  auto emit = [&](int i) {
    schedule.push_back(i);
    for (int u : dependents[static_cast<std::size_t>(i)]) {
      if (--unmet[static_cast<std::size_t>(u)] == 0 && !update_done[static_cast<std::size_t>(u)]) ready.insert(u);
    }
  };
  for (int i = 0; i < num_ops; ++i) {
    if (!graph.ops()[static_cast<std::size_t>(i)].updates.empty()) continue;
    emit(i);
    if (keep_next_adjacent(graph, i, i + 1)) continue;  // the ready updates run after op i + 1
    for (int cursor = 0;;) {
      const auto it = ready.lower_bound(cursor);
      if (it == ready.end()) break;
      const int u = *it;
      ready.erase(it);
      update_done[static_cast<std::size_t>(u)] = true;
      emit(updates[static_cast<std::size_t>(u)]);
      cursor = u + 1;
    }
  }
  for (std::size_t u = 0; u < updates.size(); ++u) {
    if (!update_done[u]) schedule.push_back(updates[u]);  // never ready: after everything else
  }
  return schedule;
}

Status check_schedule(const Graph& graph, const Schedule& schedule) {
  if (static_cast<int>(schedule.size()) != graph.num_ops()) {
    return Error{"schedule has " + std::to_string(schedule.size()) + " ops, the graph " +
                 std::to_string(graph.num_ops())};
  }
  std::vector<int> position(static_cast<std::size_t>(graph.num_ops()), -1);
  for (std::size_t pos = 0; pos < schedule.size(); ++pos) {
    const int i = schedule[pos];
    if (i < 0 || i >= graph.num_ops() || position[static_cast<std::size_t>(i)] >= 0) {
      return Error{"schedule position " + std::to_string(pos) + " names op " + std::to_string(i) +
                   ", which is out of range or already scheduled"};
    }
    position[static_cast<std::size_t>(i)] = static_cast<int>(pos);
  }
  const auto readers = readers_of_persistent(graph);
  std::vector<int> last_updater(static_cast<std::size_t>(graph.num_tensors()), -1);  // per storage root, program order
  int last_gate = -1;  // the latest-scheduled op every update waits for (graph::OpInfo::gates_updates)
  for (int i = 0; i < graph.num_ops(); ++i) {
    if (!graph::op_info(graph.ops()[static_cast<std::size_t>(i)].kind).gates_updates) continue;
    if (last_gate < 0 || position[static_cast<std::size_t>(i)] > position[static_cast<std::size_t>(last_gate)]) last_gate = i;
  }
  for (int i = 0; i < graph.num_ops(); ++i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    if (!op.updates.empty() && op.phase == graph::Phase::optimizer && last_gate >= 0 &&
        position[static_cast<std::size_t>(last_gate)] > position[static_cast<std::size_t>(i)]) {
      return Error{"update '" + op.name + "' runs before '" + graph.ops()[static_cast<std::size_t>(last_gate)].name +
                   "', which decides whether the step's updates run"};
    }
    for (TensorId t : op.inputs) {
      const int p = graph.producer(t);
      if (p >= 0 && position[static_cast<std::size_t>(p)] > position[static_cast<std::size_t>(i)]) {
        return Error{"op '" + op.name + "' runs before the producer of its input '" + graph.tensor(t).name + "'"};
      }
    }
    for (TensorId t : op.updates) {
      const auto root = static_cast<std::size_t>(graph.storage_root(t));
      if (const int prev = last_updater[root]; prev >= 0 && position[static_cast<std::size_t>(prev)] > position[static_cast<std::size_t>(i)]) {
        return Error{"update '" + op.name + "' runs before '" + graph.ops()[static_cast<std::size_t>(prev)].name +
                     "', an earlier update of '" + graph.tensor(t).name + "'"};
      }
      last_updater[root] = i;
      for (int r : readers[root]) {
        if (r != i && position[static_cast<std::size_t>(r)] > position[static_cast<std::size_t>(i)]) {
          return Error{"update '" + op.name + "' runs before '" + graph.ops()[static_cast<std::size_t>(r)].name +
                       "', which reads the old '" + graph.tensor(t).name + "'"};
        }
      }
    }
  }
  return Status::success();
}

}  // namespace memplan::planner
