// Turns the executor's per-op clock readings into a step profile (see step_profile.h).
#include "memplan/runtime/step_profile.h"

#include <algorithm>
#include <array>

#include "memplan/common/check.h"

namespace memplan::runtime {

using graph::OpKind;

StepProfile make_step_profile(const graph::Graph& graph, const std::vector<int>& schedule, const ProfileRecord& record) {
  MEMPLAN_CHECK(record.op_ns.size() == schedule.size(), "profile record does not match the schedule");
  StepProfile p;
  p.steps = record.steps;
  if (record.steps <= 0) return p;
  const double per_step = 1e-6 / double(record.steps);  // ns summed over steps -> ms per step
  p.step_ms = record.step_ns * per_step;
  std::array<KindTime, graph::kOpKindCount> kinds{};
  for (std::size_t pos = 0; pos < schedule.size(); ++pos) {
    const graph::Op& op = graph.ops()[static_cast<std::size_t>(schedule[pos])];
    OpTime t;
    t.op_index = schedule[pos];
    t.name = op.name;
    t.kind = op.kind;
    t.ms = record.op_ns[pos] * per_step;
    t.flops = graph::op_flops(graph, op);
    if (pos < record.timed_in.size()) t.timed_in = record.timed_in[pos];
    p.ops_ms += t.ms;
    p.flops += t.flops;
    KindTime& k = kinds[static_cast<std::size_t>(op.kind)];
    k.kind = op.kind;
    k.ops += 1;
    k.ms += t.ms;
    k.flops += t.flops;
    if (t.timed_in >= 0) {
      k.timed_elsewhere += 1;
      const graph::OpKind within = graph.ops()[static_cast<std::size_t>(schedule[static_cast<std::size_t>(t.timed_in)])].kind;
      if (std::find(k.timed_in.begin(), k.timed_in.end(), within) == k.timed_in.end()) k.timed_in.push_back(within);
    }
    p.ops.push_back(std::move(t));
  }
  p.other_ms = p.step_ms - p.ops_ms;
  const double denom = p.step_ms > 0.0 ? p.step_ms : 1.0;
  for (OpTime& t : p.ops) t.share = t.ms / denom;
  for (KindTime& k : kinds) {
    if (k.ops == 0) continue;
    k.share = k.ms / denom;
    p.kinds.push_back(k);
  }
  // Ties broken by kind and op index, so equal times list in a fixed order.
  std::stable_sort(p.kinds.begin(), p.kinds.end(), [](const KindTime& a, const KindTime& b) { return a.ms > b.ms; });
  std::vector<int> order(p.ops.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return p.ops[static_cast<std::size_t>(a)].ms > p.ops[static_cast<std::size_t>(b)].ms;
  });
  order.resize(std::min<std::size_t>(order.size(), 5));
  p.slowest = std::move(order);
  return p;
}

}  // namespace memplan::runtime
