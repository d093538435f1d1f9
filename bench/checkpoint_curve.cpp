// The memory / recomputation trade-off of activation checkpointing, planning only: for the GPT
// and CNN reference models and GPT-2 124M, every point of the optimal strategy's frontier and
// sqrt's point, each measured as the planned arena of the rewritten training step (AdamW,
// greedy offset packing, the better of both schedules), and the extra FLOPs each needs at
// budgets from the smallest reachable arena to the arena without checkpointing. Checks first
// that every rewritten step plans and validates and that, at the budget sqrt lands on, optimal
// needs no more recomputation; prints a markdown table and writes
// bench/results/checkpoint_curve.json (--json-out FILE).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/planner/chain_dp.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::bench {
namespace {

struct Point {
  std::string strategy;
  Bytes arena = 0;
  double extra = 0.0;  // recompute FLOPs / FLOPs of the step without checkpointing
  int recompute_ops = 0;
  double modelled = 0.0;  // the chain DP's recompute FLOPs / the same
};

double mib(Bytes b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

graph::Graph training_step(const models::ModelOptions& model, std::int64_t batch) {
  graph::Graph g = models::build_forward(model, batch).value();
  graph::make_training_step(g, graph::OptimizerConfig{});
  return g;
}

// Plans the step with `segments` recomputed; exits on an invalid plan (a bug, not a result).
Point measure(const graph::Graph& step, const planner::CheckpointChain& chain,
              const std::vector<planner::ChainAction>& actions, const std::string& strategy, double base_flops,
              const planner::PlanOptions& options) {
  const graph::Graph g = planner::rematerialize(step, chain, actions);
  auto plan = planner::plan_memory(g, options);
  if (!plan || !planner::validate_plan(plan.value())) {
    std::fprintf(stderr, "FAILED: the %s step does not plan or validate\n", strategy.c_str());
    std::exit(1);
  }
  Point p{strategy, plan.value().arena_bytes, (planner::graph_flops(g) - base_flops) / base_flops, 0};
  for (const graph::Op& op : g.ops()) p.recompute_ops += op.phase == graph::Phase::recompute ? 1 : 0;
  return p;
}

// What the optimal strategy picks for a budget: the first point of the frontier (increasing
// modelled recomputation) whose planned arena fits, or nullptr.
const Point* cheapest_fitting(const std::vector<Point>& points, Bytes budget) {
  for (const Point& p : points) {
    if (p.arena <= budget) return &p;
  }
  return nullptr;
}

nlohmann::json run_model(const std::string& name, const models::ModelOptions& model, std::int64_t batch,
                         std::vector<std::vector<std::string>>& rows, bool& ok) {
  const graph::Graph step = training_step(model, batch);
  planner::PlanOptions options;
  options.solver = planner::SolverBudget::greedy_only();  // the greedy portfolio, as the strategies' search uses
  const planner::MemoryPlan none = planner::plan_memory(step, options).value();
  const double base_flops = planner::graph_flops(step);
  const planner::CheckpointChain chain = planner::find_checkpoint_chain(step);

  const double t0 = time_ms([] {});
  std::vector<Point> frontier;
  const double ms = time_ms([&] {
    for (const planner::ChainSchedule& s : planner::chain_frontier_nested(chain.stages)) {
      frontier.push_back(measure(step, chain, s.actions, "optimal", base_flops, options));
      frontier.back().modelled = s.recompute_flops / base_flops;
    }
  }) + t0;
  const Point sqrt = measure(step, chain,
                             planner::segments_to_actions(planner::sqrt_segments(static_cast<int>(chain.stages.size()))),
                             "sqrt", base_flops, options);
  Bytes least = sqrt.arena;
  for (const Point& p : frontier) least = std::min(least, p.arena);

  // At the budget sqrt lands on, optimal must need no more recomputation.
  const Point* at_sqrt = cheapest_fitting(frontier, sqrt.arena);
  if (!at_sqrt || at_sqrt->extra > sqrt.extra) {
    std::fprintf(stderr, "FAILED: %s: at sqrt's arena %.1f MiB optimal needs %s\n", name.c_str(), mib(sqrt.arena),
                 at_sqrt ? (fmt(100 * at_sqrt->extra, 1) + "% extra FLOPs, sqrt " + fmt(100 * sqrt.extra, 1) + "%").c_str()
                         : "more memory");
    ok = false;
  }

  nlohmann::json j;
  j["model"] = name;
  j["batch"] = batch;
  j["stages"] = chain.stages.size();
  j["ops"] = step.num_ops();
  j["arena_none_bytes"] = none.arena_bytes;
  j["persistent_bytes"] = none.persistent_bytes;
  j["transient_none_bytes"] = none.transient_bytes;
  j["minimum_arena_bytes"] = least;
  j["frontier_plans_ms"] = ms;
  j["sqrt"] = {{"arena_bytes", sqrt.arena}, {"extra_flops_fraction", sqrt.extra}, {"recompute_ops", sqrt.recompute_ops}};
  j["optimal_at_sqrt_budget"] = at_sqrt ? nlohmann::json{{"arena_bytes", at_sqrt->arena}, {"extra_flops_fraction", at_sqrt->extra}}
                                        : nlohmann::json(nullptr);
  nlohmann::json points = nlohmann::json::array();
  for (const Point& p : frontier) {
    points.push_back({{"arena_bytes", p.arena}, {"extra_flops_fraction", p.extra}, {"modelled_extra_flops_fraction", p.modelled}});
  }
  j["optimal_frontier"] = points;

  // The curve: budgets evenly spaced from the least reachable arena to the arena without checkpointing.
  auto cell = [](const Point* p) { return p ? "+" + fmt(100.0 * p->extra, 1) + "%" : std::string("does not fit"); };
  const std::vector<Point> sqrt_only = {sqrt};
  nlohmann::json curve = nlohmann::json::array();
  const int steps = 8;
  for (int i = 0; i <= steps; ++i) {
    const Bytes budget = least + (none.arena_bytes - least) * i / steps;
    const Point* o = cheapest_fitting(frontier, budget);
    const Point* s = cheapest_fitting(sqrt_only, budget);
    rows.push_back({name, fmt(mib(budget), 1), fmt(100.0 * double(budget) / double(none.arena_bytes), 0) + "%", cell(s), cell(o)});
    curve.push_back({{"budget_bytes", budget},
                     {"sqrt_extra_flops_fraction", s ? nlohmann::json(s->extra) : nlohmann::json(nullptr)},
                     {"optimal_extra_flops_fraction", o ? nlohmann::json(o->extra) : nlohmann::json(nullptr)}});
  }
  j["curve"] = curve;
  // One third of the transient region (activations, gradients, temporaries) without checkpointing.
  const Bytes third = none.persistent_bytes + none.transient_bytes / 3;
  const Point* o = cheapest_fitting(frontier, third);
  j["one_third_transient"] = {{"budget_bytes", third},
                              {"optimal_extra_flops_fraction", o ? nlohmann::json(o->extra) : nlohmann::json(nullptr)},
                              {"minimum_transient_fraction", double(least - none.persistent_bytes) / double(none.transient_bytes)}};
  // One third of the activations live at the peak without checkpointing (the rest of the arena stays).
  Bytes activations = 0;
  for (const auto& [role, bytes] : none.peak_by_role()) activations += role == graph::Role::activation ? bytes : 0;
  const Bytes third_of_activations = none.arena_bytes - 2 * activations / 3;
  const Point* oa = cheapest_fitting(frontier, third_of_activations);
  j["one_third_activations"] = {{"activation_bytes_at_peak", activations},
                                {"budget_bytes", third_of_activations},
                                {"optimal_extra_flops_fraction", oa ? nlohmann::json(oa->extra) : nlohmann::json(nullptr)}};
  std::printf("%s: %zu stages, %d ops; no checkpointing %.1f MiB (persistent %.1f, transient %.1f); least %.1f MiB "
              "(transient %.0f%% of before); sqrt %.1f MiB at +%.1f%%; optimal at that budget %s; "
              "at a third of the transient region (%.1f MiB): %s; at a third of the peak's %.1f MiB of activations "
              "(%.1f MiB): %s; %zu frontier points planned in %.0f ms\n",
              name.c_str(), chain.stages.size(), step.num_ops(), mib(none.arena_bytes), mib(none.persistent_bytes),
              mib(none.transient_bytes), mib(least), 100.0 * double(least - none.persistent_bytes) / double(none.transient_bytes),
              mib(sqrt.arena), 100 * sqrt.extra, at_sqrt ? cell(at_sqrt).c_str() : "-", mib(third),
              o ? cell(o).c_str() : "does not fit", mib(activations), mib(third_of_activations),
              oa ? cell(oa).c_str() : "does not fit", frontier.size(), ms);
  return j;
}

}  // namespace
}  // namespace memplan::bench

int main(int argc, char** argv) {
  using namespace memplan;
  std::string out = std::string(MEMPLAN_SOURCE_DIR) + "/bench/results/checkpoint_curve.json";
  bool skip_gpt2 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json-out") == 0 && i + 1 < argc) out = argv[++i];
    else if (std::strcmp(argv[i], "--no-gpt2") == 0) skip_gpt2 = true;
    else {
      std::fprintf(stderr, "usage: bench_checkpoint_curve [--json-out FILE] [--no-gpt2]\n");
      return 2;
    }
  }
  models::ModelOptions gpt;  // the reference GPT as memplan train builds it (fortunes: 96 symbols)
  gpt.name = "gpt";
  models::ModelOptions cnn;
  cnn.name = "cnn";
  models::ModelOptions gpt2;
  gpt2.name = "gpt";
  gpt2.gpt.vocab = 50257;
  gpt2.gpt.context = 1024;
  gpt2.gpt.layers = 12;
  gpt2.gpt.heads = 12;
  gpt2.gpt.width = 768;

  std::vector<std::vector<std::string>> rows;
  nlohmann::json results = nlohmann::json::array();
  bool ok = true;
  results.push_back(bench::run_model("gpt", gpt, 32, rows, ok));
  results.push_back(bench::run_model("cnn", cnn, 64, rows, ok));
  if (!skip_gpt2) results.push_back(bench::run_model("gpt2-124M", gpt2, 8, rows, ok));
  std::printf("\n");
  bench::print_table({"model", "arena budget (MiB)", "of no checkpointing", "sqrt extra FLOPs", "optimal extra FLOPs"}, rows);
  bench::write_json(out, {{"benchmark", "checkpoint_curve"}, {"optimizer", "adamw"}, {"models", results}});
  return ok ? 0 : 1;
}
