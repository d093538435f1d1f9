#include "planner/schedule.h"

#include <string>

namespace memplan::planner {

using graph::Graph;
using graph::Op;

std::string_view schedule_name(ScheduleKind kind) {
  return kind == ScheduleKind::program ? "program" : "memory_aware";
}

Result<ScheduleKind> parse_schedule_kind(std::string_view name) {
  if (name == "program") return ScheduleKind::program;
  if (name == "memory_aware") return ScheduleKind::memory_aware;
  return Error{"unknown schedule '" + std::string(name) + "' (expected program or memory_aware)"};
}

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

Schedule make_schedule(const Graph& graph, ScheduleKind kind) {
  if (kind == ScheduleKind::program) return default_schedule(graph);
  const auto readers = readers_of_persistent(graph);
  std::vector<bool> done(static_cast<std::size_t>(graph.num_ops()), false);
  std::vector<int> updates;
  Schedule schedule;
  auto ready = [&](int i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    for (TensorId t : op.inputs) {
      const int p = graph.producer(t);
      if (p >= 0 && !done[static_cast<std::size_t>(p)]) return false;
    }
    for (TensorId t : op.updates) {
      for (int r : readers[static_cast<std::size_t>(graph.storage_root(t))]) {
        if (r != i && !done[static_cast<std::size_t>(r)]) return false;
      }
    }
    return true;
  };
  auto emit = [&](int i) {
    schedule.push_back(i);
    done[static_cast<std::size_t>(i)] = true;
  };
  for (int i = 0; i < graph.num_ops(); ++i) {
    if (!graph.ops()[static_cast<std::size_t>(i)].updates.empty()) updates.push_back(i);
  }
  std::size_t next_update = 0;
  std::vector<bool> update_done(updates.size(), false);
  for (int i = 0; i < graph.num_ops(); ++i) {
    if (!graph.ops()[static_cast<std::size_t>(i)].updates.empty()) continue;
    emit(i);
    // Run every update that just became ready, in program order among themselves.
    for (std::size_t u = next_update; u < updates.size(); ++u) {
      if (!update_done[u] && ready(updates[u])) {
        emit(updates[u]);
        update_done[u] = true;
      }
    }
    while (next_update < updates.size() && update_done[next_update]) ++next_update;
  }
  for (std::size_t u = 0; u < updates.size(); ++u) {
    if (!update_done[u]) emit(updates[u]);
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
  for (int i = 0; i < graph.num_ops(); ++i) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    for (TensorId t : op.inputs) {
      const int p = graph.producer(t);
      if (p >= 0 && position[static_cast<std::size_t>(p)] > position[static_cast<std::size_t>(i)]) {
        return Error{"op '" + op.name + "' runs before the producer of its input '" + graph.tensor(t).name + "'"};
      }
    }
    for (TensorId t : op.updates) {
      for (int r : readers[static_cast<std::size_t>(graph.storage_root(t))]) {
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
