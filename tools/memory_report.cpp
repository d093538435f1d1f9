#include "tools/memory_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "memplan/planner/fit.h"

namespace memplan::tools {

namespace {

Bytes role_bytes(const std::vector<std::pair<graph::Role, Bytes>>& by_role, graph::Role role) {
  Bytes total = 0;
  for (const auto& [r, bytes] : by_role) {
    if (r == role) total += bytes;
  }
  return total;
}

}  // namespace

std::string memory_summary(const graph::Graph&, const planner::MemoryPlan& plan) {
  std::ostringstream out;
  const auto by_role = plan.peak_by_role();  // persistent totals, transient at the peak
  const Bytes params = role_bytes(by_role, graph::Role::parameter);
  const Bytes master = planner::master_copy_bytes(plan);  // counted apart from the optimizer's state
  const Bytes state = role_bytes(by_role, graph::Role::optimizer_state) - master;
  const Bytes activations = role_bytes(by_role, graph::Role::activation) + role_bytes(by_role, graph::Role::input);
  const Bytes gradients = role_bytes(by_role, graph::Role::gradient);
  const Bytes temporaries = role_bytes(by_role, graph::Role::temporary);
  const Bytes communication = role_bytes(by_role, graph::Role::communication);
  auto row = [&out](const char* label, const std::string& value) {
    char padded[64];  // the label column; the value is written whole, however long
    std::snprintf(padded, sizeof(padded), "  %-34s ", label);
    out << padded << value << "\n";
  };
  out << "memory plan (" << planner::schedule_name(plan.schedule_kind) << " schedule, "
      << planner::to_string(plan.solve_status) << " packing)\n";
  row("parameters", format_bytes(params));
  if (master > 0) row("master weights (fp32)", format_bytes(master));
  row("optimizer state", format_bytes(state));
  row("activations + inputs at peak", format_bytes(activations));
  row("gradients at peak", format_bytes(gradients));
  row("temporaries at peak", format_bytes(temporaries));
  bool collectives = false;  // a data-parallel step: its buffers have a line even when none is live at the peak
  for (const planner::PlannedBuffer& b : plan.buffers) collectives = collectives || b.role == graph::Role::communication;
  if (collectives) row("communication at peak", format_bytes(communication));
  row("workspace", plan.workspace_bytes > 0 ? format_bytes(plan.workspace_bytes) + " (kernel scratch inside the arena: the fused loss's "
                                                                                    "chunk of logits, fp32 copies of 16-bit operands)"
                                            : format_bytes(0) + " (no kernel asks for scratch on this device)");
  row("arena (one allocation)", format_bytes(plan.arena_bytes) + " = " + std::to_string(plan.arena_bytes) + " B");
  row("lower bound", format_bytes(plan.lower_bound_bytes) + " = " + std::to_string(plan.lower_bound_bytes) + " B");
  if (plan.host_bytes > 0) {
    row("host region (offloaded)", format_bytes(plan.host_bytes) + " = " + std::to_string(plan.host_bytes) + " B in " +
                                       std::to_string(plan.host_buffers.size()) + " buffers, outside the arena");
  }
  char ratio[64];
  std::snprintf(ratio, sizeof(ratio), "%.4f", double(plan.arena_bytes) / double(std::max<Bytes>(1, plan.lower_bound_bytes)));
  row("arena / lower bound", ratio);
  if (plan.program_order_arena_bytes > 0 && plan.memory_aware_arena_bytes > 0) {
    auto order_row = [&](const char* label, Bytes bytes, bool skipped) {
      row(label, skipped ? "at least " + format_bytes(bytes) + " (its lower bound; not solved)" : format_bytes(bytes));
    };
    order_row("arena, program order", plan.program_order_arena_bytes, plan.program_order_skipped);
    order_row("arena, memory-aware order", plan.memory_aware_arena_bytes, false);
    if (plan.searched_order_arena_bytes > 0) {
      order_row("arena, searched order", plan.searched_order_arena_bytes, plan.searched_order_skipped);
    }
  }
  if (plan.schedule_kind == planner::ScheduleKind::searched) {
    row("order search", std::to_string(plan.order_moves) + " ops moved across the peak (planner/order_search.h)");
  }
  return out.str();
}

std::string buffer_table(const planner::MemoryPlan& plan) {
  std::vector<const planner::PlannedBuffer*> order;
  for (const auto& b : plan.buffers) order.push_back(&b);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->first_op < b->first_op;
  });
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-36s %-16s %12s %12s %8s %8s\n", "tensor", "role", "offset", "size", "first", "last");
  out << line;
  for (const auto* b : order) {
    std::string name = b->name.size() > 36 ? b->name.substr(0, 33) + "..." : b->name;
    if (b->persistent) {
      std::snprintf(line, sizeof(line), "%-36s %-16s %12lld %12lld %8s %8s\n", name.c_str(),
                    std::string(graph::role_name(b->role)).c_str(), static_cast<long long>(b->offset),
                    static_cast<long long>(b->size_bytes), "-", "-");
    } else {
      std::snprintf(line, sizeof(line), "%-36s %-16s %12lld %12lld %8d %8d\n", name.c_str(),
                    std::string(graph::role_name(b->role)).c_str(), static_cast<long long>(b->offset),
                    static_cast<long long>(b->size_bytes), b->first_op, b->last_op);
    }
    out << line;
  }
  return out.str();
}

nlohmann::json plan_json(const graph::Graph& graph, const planner::MemoryPlan& plan, bool with_buffers) {
  nlohmann::json j;
  j["schedule"] = planner::schedule_name(plan.schedule_kind);
  j["ops"] = plan.schedule.size();
  j["arena_bytes"] = plan.arena_bytes;
  j["persistent_bytes"] = plan.persistent_bytes;
  j["transient_bytes"] = plan.transient_bytes;
  j["lower_bound_bytes"] = plan.lower_bound_bytes;
  if (plan.host_bytes > 0) j["host_bytes"] = plan.host_bytes;  // optimizer offload: outside the arena
  j["transient_lower_bound_bytes"] = plan.transient_lower_bound_bytes;
  j["arena_over_lower_bound"] = double(plan.arena_bytes) / double(std::max<Bytes>(1, plan.lower_bound_bytes));
  j["program_order_arena_bytes"] = plan.program_order_arena_bytes;
  j["memory_aware_arena_bytes"] = plan.memory_aware_arena_bytes;
  j["searched_order_arena_bytes"] = plan.searched_order_arena_bytes;
  j["program_order_skipped"] = plan.program_order_skipped;
  j["searched_order_skipped"] = plan.searched_order_skipped;
  if (plan.schedule_kind == planner::ScheduleKind::searched) j["order_moves"] = plan.order_moves;
  j["solve_status"] = planner::to_string(plan.solve_status);
  j["plan_ms"] = plan.solve_ms;
  nlohmann::json peak;
  for (const auto& [role, bytes] : plan.peak_by_role()) peak[std::string(graph::role_name(role))] = bytes;
  j["bytes_by_role_at_peak"] = peak;
  if (with_buffers) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& b : plan.buffers) {
      list.push_back({{"tensor", b.name},
                      {"role", graph::role_name(b.role)},
                      {"offset", b.offset},
                      {"size_bytes", b.size_bytes},
                      {"first_op", b.first_op},
                      {"last_op", b.last_op},
                      {"persistent", b.persistent},
                      {"shape", graph.tensor(b.root).shape.dims}});
    }
    j["buffers"] = list;
    if (!plan.host_buffers.empty()) {
      nlohmann::json host = nlohmann::json::array();
      for (const auto& b : plan.host_buffers) {
        host.push_back({{"tensor", b.name}, {"role", graph::role_name(b.role)}, {"offset", b.offset}, {"size_bytes", b.size_bytes}});
      }
      j["host_buffers"] = host;
    }
  }
  return j;
}

}  // namespace memplan::tools
