#include "memplan/planner/fit.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "memplan/planner/step_size.h"

namespace memplan::planner {

Bytes master_copy_bytes(const MemoryPlan& plan) {
  Bytes bytes = 0;
  for (const PlannedBuffer& buffer : plan.buffers) bytes += buffer.master_copy ? buffer.size_bytes : 0;
  return bytes;
}

FitBreakdown fit_breakdown(const MemoryPlan& plan, const DeviceProfile& device) {
  FitBreakdown b;
  for (const auto& [role, bytes] : plan.peak_by_role()) {
    switch (role) {
      case graph::Role::parameter: b.parameters += bytes; break;
      case graph::Role::optimizer_state: b.optimizer_state += bytes; break;
      case graph::Role::gradient: b.gradients_at_peak += bytes; break;
      case graph::Role::communication: b.communication_at_peak += bytes; break;
      default: b.activations_at_peak += bytes; break;
    }
  }
  b.master_weights = master_copy_bytes(plan);
  b.optimizer_state -= b.master_weights;
  for (const PlannedBuffer& buffer : plan.buffers) b.host_snapshot += buffer.persistent ? buffer.size_bytes : 0;
  // Offloaded state is snapshotted too (the gradient copies are not state).
  for (const PlannedBuffer& buffer : plan.host_buffers) b.host_snapshot += buffer.role != graph::Role::gradient ? buffer.size_bytes : 0;
  b.host_offload = plan.host_bytes;
  b.workspace = plan.workspace_bytes;
  b.arena = plan.arena_bytes;
  b.runtime_overhead = device.overhead_bytes();
  b.total = device.total_bytes(b.arena);
  return b;
}

std::vector<NamedBytes> activations_at_peak_by_name(const MemoryPlan& plan) {
  const OpIndex peak_at = plan.peak_position();
  std::map<std::string, NamedBytes> groups;
  for (const PlannedBuffer& b : plan.buffers) {
    // The roles fit_breakdown counts as activations: not state, gradients or communication.
    if (b.persistent || b.role == graph::Role::gradient || b.role == graph::Role::communication || b.first_op > peak_at ||
        peak_at > b.last_op) {
      continue;
    }
    // Runs of digits between dots are layer indices: "layers.10.mlp.up" -> "layers.*.mlp.up".
    std::string key;
    for (std::size_t i = 0; i < b.name.size();) {
      const bool at_part = i == 0 || b.name[i - 1] == '.';
      std::size_t j = i;
      while (j < b.name.size() && std::isdigit(static_cast<unsigned char>(b.name[j]))) ++j;
      if (at_part && j > i && (j == b.name.size() || b.name[j] == '.')) {
        key += '*';
        i = j;
      } else {
        key += b.name[i++];
      }
    }
    NamedBytes& g = groups[key];
    g.name = key;
    g.bytes += b.size_bytes;
    ++g.count;
  }
  std::vector<NamedBytes> out;
  for (auto& [key, g] : groups) out.push_back(std::move(g));
  std::stable_sort(out.begin(), out.end(), [](const NamedBytes& a, const NamedBytes& b) { return a.bytes > b.bytes; });
  return out;
}

namespace {

// The strategies a suggestion chooses among, least recomputation first.
constexpr CheckpointStrategy kSuggestionOrder[] = {CheckpointStrategy::kNone, CheckpointStrategy::kSqrt,
                                                   CheckpointStrategy::kOptimal};

}  // namespace

Result<FitAnswer> answer_fit(const FitQuestion& question) {
  FitAnswer answer;
  const DeviceProfile& device = question.request.device;
  answer.device_memory = question.device_memory;
  answer.overheads = device.overheads;
  PlanRequest request = question.request;
  request.budget = device.arena_budget(question.device_memory);
  request.answer_only = false;
  request.find_minimum_arena = question.find_minimum_arena;

  auto planned = plan_step(question.step, request);
  if (!planned) return planned.error();
  ++answer.steps_planned;
  answer.planned = std::move(planned).value();
  const MemoryPlan& plan = answer.planned.plan;
  answer.breakdown = fit_breakdown(plan, device);
  // train --save-dir's snapshot holds what trains: the frozen base (as stored) is left out.
  const StepRewrites& rewrites = answer.planned.rewrites;
  answer.breakdown.host_snapshot -= rewrites.lora.frozen_bytes - rewrites.quant.full_bytes + rewrites.quant.data_bytes +
                                    rewrites.quant.constant_bytes;
  answer.host_fits = !question.host_memory || answer.breakdown.host_offload <= *question.host_memory;
  answer.fits = answer.planned.fits && device.fits(plan.arena_bytes, question.device_memory) && answer.host_fits;
  answer.headroom_bytes = question.device_memory - answer.breakdown.total;
  if (!answer.fits && answer.planned.checkpoint) answer.minimum = answer.planned.checkpoint->minimum;

  // Checkpointing trades activations only: when parameters, optimizer state, workspace and the
  // runtime's overheads alone exceed the memory, no batch fits under any strategy.
  // (The host region does not grow with the batch: when it does not fit, no batch does.)
  const bool persistent_too_big = !device.fits(plan.persistent_bytes, question.device_memory) || !answer.host_fits;
  std::vector<CheckpointStrategy> strategies = question.max_batch_strategies;
  if (!answer.fits && std::find(strategies.begin(), strategies.end(), request.checkpoint) == strategies.end()) {
    strategies.push_back(request.checkpoint);
  }
  // Batches whose step cannot be represented are not candidates (planner/step_size.h).
  // Data parallel: the search runs over the per-rank batch and answers the global one (a
  // multiple of the rank count).
  const std::int64_t world = question.step.parallel.active() ? question.step.parallel.world : 1;
  const std::int64_t batch_limit = strategies.empty() ? 1
      : std::max<std::int64_t>(largest_representable_batch(question.step, question.max_batch_limit) / world, 1);
  for (CheckpointStrategy strategy : strategies) {
    StrategyMaxBatch row{strategy, 0, 0};
    if (!persistent_too_big) {
      PlanRequest probe = request;
      probe.checkpoint = strategy;
      probe.answer_only = true;
      probe.any_fitting = true;  // whether it fits, not with how little recomputation
      auto fits_at = [&](std::int64_t batch) -> Result<BatchProbe> {
        StepDescription step = question.step;
        step.batch = batch * world;
        auto p = plan_step(step, probe);
        if (!p) return p.error();
        // optimal and auto fill the budget: their arena says nothing of the room left, the
        // frontier's least-arena estimate does (the search aims with it and decides by `fits`
        // alone, so it stays exact).
        const bool adaptive = strategy == CheckpointStrategy::kOptimal || strategy == CheckpointStrategy::kAuto;
        BatchProbe r{p.value().fits, std::nullopt};
        const std::optional<CheckpointOutcome>& cp = p.value().checkpoint;
        if (adaptive && cp && cp->least_arena_estimate) {
          r.slack_bytes = double(*probe.budget) - double(*cp->least_arena_estimate);
        } else if (!adaptive) {
          r.slack_bytes = double(*probe.budget) - double(p.value().plan.arena_bytes);
        }
        return r;
      };
      std::int64_t start = 0;  // the largest batch an earlier strategy fits
      for (const StrategyMaxBatch& done : answer.max_batch) start = std::max(start, done.max_batch / world);
      auto search = search_max_batch(ProbeAtBatch(fits_at), batch_limit, start);
      if (!search) return search.error();
      row.max_batch = search.value().max_batch * world;
      row.steps_planned = search.value().probes;
      answer.steps_planned += row.steps_planned;
    }
    answer.max_batch.push_back(row);
  }
  // The asked strategy's largest batch, planned as a run at it would be (the search's probes
  // answer only whether a batch fits, with any plan that does).
  for (const StrategyMaxBatch& row : answer.max_batch) {
    if (row.strategy != request.checkpoint || row.max_batch <= 0) continue;
    StepDescription step = question.step;
    step.batch = row.max_batch;
    PlanRequest at = request;
    at.find_minimum_arena = false;
    auto p = plan_step(step, at);
    if (!p) return p.error();
    ++answer.steps_planned;
    const Bytes arena = p.value().plan.arena_bytes;
    answer.max_batch_plan = MaxBatchPlan{row.max_batch, row.strategy, arena, device.total_bytes(arena),
                                         question.device_memory - device.total_bytes(arena)};
  }
  if (answer.fits) return answer;

  // Not fitting: for each searched strategy, the largest micro-batch that fits and divides the
  // requested batch (gradient accumulation then reproduces it exactly); the largest wins, ties to
  // the strategy listed first. Then the first strategy, least recomputation first, under which
  // the whole batch fits.
  const std::int64_t batch = question.step.batch;
  FitSuggestion s;
  s.persistent_state_too_big = persistent_too_big;
  if (!persistent_too_big) s.activation_room_bytes = question.device_memory - device.total_bytes(plan.persistent_bytes);
  for (const StrategyMaxBatch& row : answer.max_batch) {
    if (row.max_batch <= 0) continue;
    std::int64_t micro = std::min(row.max_batch, batch);
    while (batch % micro != 0 || micro % world != 0) --micro;  // micro = world always qualifies
    if (micro > s.micro_batch) {
      s.micro_batch = micro;
      s.checkpoint = row.strategy;
    }
  }
  if (s.micro_batch > 0) s.accumulation_steps = batch / s.micro_batch;
  // No strategy can fit the whole batch when even the least arena of all does not.
  // (A data-parallel step is not checkpointed: plan_step refuses it.)
  const bool some_strategy_fits = world == 1 && !persistent_too_big &&
                                  (!answer.minimum || answer.minimum->arena_bytes <= *request.budget);
  if (some_strategy_fits) {
    for (CheckpointStrategy strategy : kSuggestionOrder) {
      if (strategy == request.checkpoint || strategy == CheckpointStrategy::kNone) continue;
      bool fits = false;
      for (const StrategyMaxBatch& row : answer.max_batch) fits = fits || (row.strategy == strategy && row.max_batch >= batch);
      if (!fits) {
        PlanRequest probe = request;
        probe.checkpoint = strategy;
        probe.answer_only = true;
        auto p = plan_step(question.step, probe);
        if (!p) return p.error();
        ++answer.steps_planned;
        fits = p.value().fits;
      }
      if (fits) {
        s.whole_batch_checkpoint = strategy;
        break;
      }
    }
  }
  if (s.micro_batch == 0 && s.whole_batch_checkpoint) {
    s.micro_batch = batch;
    s.accumulation_steps = 1;
    s.checkpoint = *s.whole_batch_checkpoint;
  }
  answer.suggestion = s;
  return answer;
}

Result<BatchSearch> search_max_batch(const FitsAtBatch& fits_at, std::int64_t limit) {
  BatchSearch out;
  auto fits = [&](std::int64_t batch) -> Result<bool> {
    ++out.probes;
    return fits_at(batch);
  };
  Result<bool> first = fits(1);
  if (!first) return first.error();
  if (!first.value()) return out;  // max_batch 0
  std::int64_t lo = 1, hi = 2;     // lo fits; hi is untested
  while (hi <= limit) {
    Result<bool> f = fits(hi);
    if (!f) return f.error();
    if (!f.value()) break;
    lo = hi;
    if (hi == limit) break;
    hi = std::min(limit, hi * 2);
  }
  if (lo == limit) {
    out.max_batch = lo;
    return out;
  }
  // lo fits, hi does not (or hi > limit): bisect.
  hi = std::min(hi, limit + 1);
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    Result<bool> f = fits(mid);
    if (!f) return f.error();
    (f.value() ? lo : hi) = mid;
  }
  out.max_batch = lo;
  return out;
}

Result<BatchSearch> search_max_batch(const ProbeAtBatch& probe_at, std::int64_t limit, std::int64_t start) {
  BatchSearch out;
  struct Point {
    std::int64_t batch;
    std::optional<double> slack;
  };
  auto probe = [&](std::int64_t batch) -> Result<BatchProbe> {
    ++out.probes;
    return probe_at(batch);
  };
  Point lo{0, std::nullopt};  // the largest batch known to fit
  std::optional<Point> hi;     // the smallest known not to
  std::vector<Point> measured;  // probes that measured their slack, latest last
  // A start that fits says batch 1 does too (the search assumes a batch that fits fits with
  // fewer samples), so batch 1 is probed only when there is no start or it does not fit.
  if (start > 1 && start <= limit) {
    Result<BatchProbe> r = probe(start);
    if (!r) return r.error();
    const Point point{start, r.value().slack_bytes};
    (r.value().fits ? lo : hi.emplace()) = point;
    if (point.slack) measured.push_back(point);
  }
  if (lo.batch == 0) {
    Result<BatchProbe> first = probe(1);
    if (!first) return first.error();
    if (!first.value().fits) return out;  // max_batch 0
    lo = Point{1, first.value().slack_bytes};
    if (lo.slack) measured.insert(measured.begin(), lo);
  }
  bool halve_next = false;  // the last probe left the bracket more than half its width
  while (lo.batch < limit && (!hi || hi->batch - lo.batch > 1)) {
    // Where the line through the two latest measured probes crosses zero slack (lo + 1 when lo
    // is already within a sample of it); without such a line, doubling, then bisection.
    std::int64_t next = 0;
    if (measured.size() >= 2) {
      const Point& p = measured[measured.size() - 2];
      const Point& q = measured.back();
      const double per_batch = (*p.slack - *q.slack) / double(q.batch - p.batch);  // bytes per sample
      if (per_batch > 0.0 && std::isfinite(per_batch)) {
        const double aim = double(q.batch) + std::floor(*q.slack / per_batch);
        next = aim >= double(limit) ? limit : std::max(aim <= 0.0 ? 0 : static_cast<std::int64_t>(aim), lo.batch + 1);
      }
    }
    if (next == 0) next = hi ? lo.batch + (hi->batch - lo.batch) / 2 : std::min(limit, lo.batch * 2);
    if (hi && (next >= hi->batch || halve_next)) next = lo.batch + (hi->batch - lo.batch) / 2;
    const std::int64_t width_before = hi ? hi->batch - lo.batch : 0;
    Result<BatchProbe> r = probe(next);
    if (!r) return r.error();
    const Point point{next, r.value().slack_bytes};
    (r.value().fits ? lo : hi.emplace()) = point;
    if (point.slack) measured.push_back(point);
    halve_next = width_before > 0 && 2 * (hi->batch - lo.batch) > width_before;
  }
  out.max_batch = lo.batch;
  return out;
}

}  // namespace memplan::planner
