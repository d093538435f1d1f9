// Activation checkpointing: the chain DP against brute force, the graph rewrite (recompute ops
// before their backward readers, bitwise-identical training), budgets and their errors, and the
// CLI flags.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/common/rng.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/planner/chain_dp.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/order_free_bound.h"
#include "test_util.h"

namespace memplan {
namespace {

using planner::ChainSegment;
using planner::ChainStage;
using planner::CheckpointStrategy;

// --- the chain DP -----------------------------------------------------------------------

// Every segmentation of the chain into stored / recomputed segments: the least recompute FLOPs
// whose modelled peak fits `limit`, computed from the family's definition directly.
double brute_force(const std::vector<ChainStage>& stages, Bytes limit) {
  const int n = static_cast<int>(stages.size());
  double best = std::numeric_limits<double>::infinity();
  for (unsigned cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
    std::vector<std::pair<int, int>> ranges;
    int first = 0;
    for (int i = 0; i < n; ++i) {
      if (i == n - 1 || (cuts >> i) & 1u) {
        ranges.emplace_back(first, i);
        first = i + 1;
      }
    }
    for (unsigned kinds = 0; kinds < (1u << ranges.size()); ++kinds) {
      Bytes kept = 0, peak = 0;
      double flops = 0;
      for (std::size_t s = 0; s < ranges.size(); ++s) {
        const bool recompute = (kinds >> s) & 1u;
        Bytes all = 0;
        for (int j = ranges[s].first; j <= ranges[s].second; ++j) {
          all += stages[static_cast<std::size_t>(j)].boundary_bytes + stages[static_cast<std::size_t>(j)].internal_bytes;
          if (recompute) flops += stages[static_cast<std::size_t>(j)].forward_flops;
        }
        peak = std::max(peak, kept + all);
        kept += recompute ? stages[static_cast<std::size_t>(ranges[s].second)].boundary_bytes : all;
      }
      if (peak <= limit) best = std::min(best, flops);
    }
  }
  return best;
}

std::vector<ChainStage> random_chain(Rng& rng, int n) {
  std::vector<ChainStage> stages(static_cast<std::size_t>(n));
  for (ChainStage& s : stages) {
    s.forward_flops = static_cast<double>(1 + rng.below(20));
    s.boundary_bytes = static_cast<Bytes>(1 + rng.below(6));
    s.internal_bytes = static_cast<Bytes>(rng.below(12));
  }
  return stages;
}

TEST(ChainDp, EqualsBruteForceOnSmallRandomChains) {
  Rng rng(7);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(7));
    const std::vector<ChainStage> stages = random_chain(rng, n);
    Bytes total = 0;
    for (const ChainStage& s : stages) total += s.all_bytes();
    const Bytes limit = static_cast<Bytes>(rng.below(static_cast<std::uint64_t>(total + 2)));
    const double expected = brute_force(stages, limit);
    const planner::ChainSolution got = planner::solve_chain(stages, limit);
    if (std::isinf(expected)) {
      EXPECT_TRUE(got.segments.empty()) << "trial " << trial;
      ++infeasible;
      continue;
    }
    ++feasible;
    ASSERT_FALSE(got.segments.empty()) << "trial " << trial << ": brute force fits in " << limit;
    EXPECT_EQ(got.recompute_flops, expected) << "trial " << trial;
    // The returned segmentation really has the cost and peak it claims.
    const planner::ChainSolution check = planner::evaluate_chain(stages, got.segments);
    EXPECT_EQ(check.recompute_flops, got.recompute_flops);
    EXPECT_LE(check.peak_bytes, limit);
  }
  EXPECT_GT(feasible, 50);
  EXPECT_GT(infeasible, 5);
}

TEST(ChainDp, HandWorkedChain) {
  // Three stages (flops, boundary, internal), 10 bytes each. Storing everything peaks at 30.
  // At a limit of 20: recomputing stage 0 alone peaks at 2 + 10 + 10 = 22 during stage 2's
  // backward, stage 1 alone at 10 + 2 + 10 = 22, stage 2 saves nothing; recomputing stages 0
  // and 1 (together, or each from its own boundary) peaks at 20 or 14 for 5 + 7 = 12 FLOPs.
  const std::vector<ChainStage> stages = {{5, 2, 8}, {7, 2, 8}, {100, 2, 8}};
  EXPECT_EQ(planner::solve_chain(stages, 30).recompute_flops, 0.0);
  const planner::ChainSolution s = planner::solve_chain(stages, 20);
  EXPECT_EQ(s.recompute_flops, 12.0);
  ASSERT_FALSE(s.segments.empty());
  EXPECT_FALSE(s.segments.back().recompute);
  EXPECT_EQ(s.segments.back().first, 2);
  EXPECT_LE(s.peak_bytes, 20);
  EXPECT_TRUE(planner::solve_chain(stages, 9).segments.empty());
}

TEST(ChainDp, FrontierTradesMemoryForRecomputation) {
  Rng rng(3);
  const std::vector<ChainStage> stages = random_chain(rng, 9);
  const auto frontier = planner::chain_frontier(stages);
  ASSERT_GE(frontier.size(), 2u);
  EXPECT_EQ(frontier.front().recompute_flops, 0.0);
  for (std::size_t i = 1; i < frontier.size(); ++i) {
    EXPECT_GT(frontier[i].recompute_flops, frontier[i - 1].recompute_flops);
    EXPECT_LT(frontier[i].peak_bytes, frontier[i - 1].peak_bytes);
    // Each point is optimal for its own peak (resolution 2000 > total bytes: exact).
    EXPECT_EQ(frontier[i].recompute_flops, brute_force(stages, frontier[i].peak_bytes));
  }
}

TEST(ChainDp, SqrtSegments) {
  const auto s = planner::sqrt_segments(9);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first, 0);
  EXPECT_EQ(s[0].last, 2);
  EXPECT_TRUE(s[0].recompute);
  EXPECT_TRUE(s[1].recompute);
  EXPECT_FALSE(s[2].recompute);
  EXPECT_EQ(s[2].last, 8);
}

// Every schedule of the nested family, as its recursion forms them.
std::vector<std::vector<planner::ChainAction>> nested_schedules(int s, int e) {
  using planner::ChainActionKind;
  std::vector<std::vector<planner::ChainAction>> out;
  const std::vector<std::vector<planner::ChainAction>> tail = s == e ? std::vector<std::vector<planner::ChainAction>>{{}}
                                                                     : nested_schedules(s + 1, e);
  for (const auto& rest : tail) {
    std::vector<planner::ChainAction> a = {{ChainActionKind::kForwardKeepAll, s}};
    a.insert(a.end(), rest.begin(), rest.end());
    a.push_back({ChainActionKind::kBackward, s});
    out.push_back(a);
  }
  for (int k = s + 1; k <= e; ++k) {
    for (const auto& right : nested_schedules(k, e)) {
      for (const auto& left : nested_schedules(s, k - 1)) {
        std::vector<planner::ChainAction> a;
        for (int i = s; i < k; ++i) a.push_back({ChainActionKind::kForward, i});
        a.insert(a.end(), right.begin(), right.end());
        a.insert(a.end(), left.begin(), left.end());
        out.push_back(a);
      }
    }
  }
  return out;
}

// The least recompute FLOPs among `schedules` whose simulated peak is within `limit` (infinity
// when none is).
double least_recompute_within(const std::vector<ChainStage>& stages,
                              const std::vector<std::vector<planner::ChainAction>>& schedules, Bytes limit) {
  double least = std::numeric_limits<double>::infinity();
  for (const auto& a : schedules) {
    const planner::ChainSchedule sim = planner::simulate_chain(stages, a);
    if (sim.peak_bytes <= limit) least = std::min(least, sim.recompute_flops);
  }
  return least;
}

TEST(ChainDp, NestedEqualsBruteForceAndNeverLosesToSingleLevel) {
  Rng rng(11);
  int feasible = 0, strictly_better = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(6));
    const std::vector<ChainStage> stages = random_chain(rng, n);
    const auto schedules = nested_schedules(0, n - 1);
    Bytes total = 0;
    for (const ChainStage& s : stages) total += s.all_bytes();
    const Bytes limit = static_cast<Bytes>(rng.below(static_cast<std::uint64_t>(total + 2)));
    const double expected = least_recompute_within(stages, schedules, limit);
    const planner::ChainSchedule got = planner::solve_chain_nested(stages, limit);
    if (std::isinf(expected)) {
      EXPECT_TRUE(got.actions.empty()) << "trial " << trial;
      continue;
    }
    ++feasible;
    ASSERT_FALSE(got.actions.empty()) << "trial " << trial;
    EXPECT_EQ(got.recompute_flops, expected) << "trial " << trial;
    EXPECT_LE(got.peak_bytes, limit);
    const double single = brute_force(stages, limit);
    EXPECT_LE(got.recompute_flops, single) << "trial " << trial;
    strictly_better += got.recompute_flops < single ? 1 : 0;
  }
  EXPECT_GT(feasible, 50);
  EXPECT_GT(strictly_better, 0) << "the nested family never helped: the test chains are too easy";
}

// Transformers repeat their layers: intervals holding the same stages share one row of the DP's
// table (planner/chain_dp.cpp). Chains drawn from two or three stage kinds (most intervals then
// repeat one another; two kinds may differ in their boundaries alone) must still give brute
// force's least recomputation at every limit, and frontiers whose points simulate to their costs.
TEST(ChainDp, NestedEqualsBruteForceOnChainsOfRepeatedStages) {
  Rng rng(13);
  int feasible = 0, shared = 0;
  const int trials = testing::kSanitized ? 40 : 120;  // brute force is slow under the sanitizers
  for (int trial = 0; trial < trials; ++trial) {
    const int n = 2 + static_cast<int>(rng.below(5));
    std::vector<ChainStage> kinds = random_chain(rng, 1 + static_cast<int>(rng.below(3)));
    if (kinds.size() > 1) {  // a kind told apart from the first by its boundary alone
      kinds[1] = kinds[0];
      kinds[1].boundary_bytes = kinds[0].boundary_bytes + 1 + static_cast<Bytes>(rng.below(3));
      kinds[1].internal_bytes = std::max<Bytes>(0, kinds[0].all_bytes() - kinds[1].boundary_bytes);
    }
    std::vector<ChainStage> stages;
    for (int i = 0; i < n; ++i) stages.push_back(kinds[rng.below(kinds.size())]);
    for (int i = 1; i < n; ++i) shared += stages[static_cast<std::size_t>(i)].all_bytes() == stages[0].all_bytes() ? 1 : 0;
    const auto schedules = nested_schedules(0, n - 1);
    Bytes total = 0;
    for (const ChainStage& s : stages) total += s.all_bytes();
    for (Bytes limit = 0; limit <= total; limit += 1 + total / 7) {
      const double expected = least_recompute_within(stages, schedules, limit);
      const planner::ChainSchedule got = planner::solve_chain_nested(stages, limit);
      if (std::isinf(expected)) {
        EXPECT_TRUE(got.actions.empty()) << "trial " << trial << " limit " << limit;
        continue;
      }
      ++feasible;
      ASSERT_FALSE(got.actions.empty()) << "trial " << trial << " limit " << limit;
      EXPECT_EQ(got.recompute_flops, expected) << "trial " << trial << " limit " << limit;
      EXPECT_EQ(planner::simulate_chain(stages, got.actions).peak_bytes, got.peak_bytes);
    }
    for (const planner::ChainSchedule& point : planner::chain_frontier_nested(stages)) {
      EXPECT_EQ(planner::simulate_chain(stages, point.actions).recompute_flops, point.recompute_flops) << "trial " << trial;
    }
  }
  EXPECT_GT(feasible, trials * 5 / 2);
  EXPECT_GT(shared, trials * 5 / 6) << "the chains hardly repeat a stage: the shared rows go untested";
}

TEST(ChainDp, SingleLevelSchedulesSimulateToTheirModelledPeak) {
  Rng rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(8));
    const std::vector<ChainStage> stages = random_chain(rng, n);
    std::vector<ChainSegment> segments;
    for (int first = 0; first < n;) {
      const int last = std::min(n - 1, first + static_cast<int>(rng.below(3)));
      segments.push_back({first, last, rng.below(2) == 1});
      first = last + 1;
    }
    const planner::ChainSolution model = planner::evaluate_chain(stages, segments);
    const planner::ChainSchedule sim = planner::simulate_chain(stages, planner::segments_to_actions(segments));
    EXPECT_EQ(sim.peak_bytes, model.peak_bytes) << "trial " << trial;
    EXPECT_EQ(sim.recompute_flops, model.recompute_flops) << "trial " << trial;
  }
}

TEST(ChainDp, NestedFrontierIsStrict) {
  Rng rng(3);
  const std::vector<ChainStage> stages = random_chain(rng, 9);
  const auto frontier = planner::chain_frontier_nested(stages);
  ASSERT_GE(frontier.size(), 2u);
  EXPECT_EQ(frontier.front().recompute_flops, 0.0);
  for (std::size_t i = 1; i < frontier.size(); ++i) {
    EXPECT_GT(frontier[i].recompute_flops, frontier[i - 1].recompute_flops);
    EXPECT_LT(frontier[i].peak_bytes, frontier[i - 1].peak_bytes);
    EXPECT_EQ(frontier[i].recompute_flops, planner::solve_chain_nested(stages, frontier[i].peak_bytes).recompute_flops);
  }
  // Never above the single-level frontier at the same peak.
  for (const auto& single : planner::chain_frontier(stages)) {
    EXPECT_LE(planner::solve_chain_nested(stages, single.peak_bytes).recompute_flops, single.recompute_flops);
  }
}

// The nested recurrence filled the plain way (every (s, t, m) cell, one thread): the table the
// DP stores more compactly (rows end at their saturation) and fills on several threads.
std::vector<double> dense_nested_costs(const std::vector<ChainStage>& stages, Bytes width, Bytes quantum) {
  const int n = static_cast<int>(stages.size());
  auto units = [&](Bytes b) { return (b + quantum - 1) / quantum; };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> c(static_cast<std::size_t>(n * n * width), inf);
  auto at = [&](int s, int t, Bytes m) -> double& { return c[static_cast<std::size_t>((s * n + t) * width + m)]; };
  for (int len = 1; len <= n; ++len) {
    for (int s = 0; s + len - 1 < n; ++s) {
      const int t = s + len - 1;
      for (Bytes m = 0; m < width; ++m) {
        const ChainStage& first = stages[static_cast<std::size_t>(s)];
        const Bytes all = units(first.all_bytes());
        double best = inf;
        if (m >= all) best = first.forward_flops + (s == t ? 0.0 : at(s + 1, t, m - all));
        double run = 0.0;
        for (int k = s + 1; k <= t; ++k) {
          run += stages[static_cast<std::size_t>(k - 1)].forward_flops;
          const Bytes kept = units(stages[static_cast<std::size_t>(k - 1)].boundary_bytes);
          if (m >= kept) best = std::min(best, run + at(k, t, m - kept) + at(s, k - 1, m));
        }
        at(s, t, m) = best;
      }
    }
  }
  std::vector<double> whole(static_cast<std::size_t>(width));
  for (Bytes m = 0; m < width; ++m) whole[static_cast<std::size_t>(m)] = at(0, n - 1, m);
  return whole;
}

TEST(ChainDp, NestedOnALongChainMatchesThePlainRecurrence) {
  Rng rng(29);
  std::vector<ChainStage> stages(70);
  double all_flops = 0.0;
  Bytes total = 0;
  for (ChainStage& s : stages) {
    s.forward_flops = static_cast<double>(1 + rng.below(1000));
    s.boundary_bytes = static_cast<Bytes>(1000 + rng.below(4000));
    s.internal_bytes = static_cast<Bytes>(rng.below(40000));
    all_flops += s.forward_flops;
    total += s.all_bytes();
  }
  // About 1000 memory units: wide enough that the longer intervals are filled on several threads.
  const Bytes quantum = total / 1000;
  Bytes width = 1;
  for (const ChainStage& s : stages) width += (s.all_bytes() + quantum - 1) / quantum;
  const std::vector<double> expected = dense_nested_costs(stages, width, quantum);
  int feasible = 0;
  for (Bytes m = 0; m < width; m += width / 16) {
    const planner::ChainSchedule got = planner::solve_chain_nested(stages, m * quantum, quantum);
    const double want = expected[static_cast<std::size_t>(m)];
    if (std::isinf(want)) {
      EXPECT_TRUE(got.actions.empty()) << "m " << m;
      continue;
    }
    ++feasible;
    ASSERT_FALSE(got.actions.empty()) << "m " << m;
    EXPECT_NEAR(got.recompute_flops, want - all_flops, 1e-6 * want) << "m " << m;
    EXPECT_LE(got.peak_bytes, m * quantum) << "m " << m;
  }
  EXPECT_GE(feasible, 8);
}

// --- the graph rewrite ------------------------------------------------------------------

struct ModelCase {
  const char* name;
  models::ModelOptions model;
  std::int64_t batch;
};

models::ModelOptions mlp() {
  models::ModelOptions o;
  o.name = "mlp";
  o.mlp = {32, {24, 24, 24, 24}, 5};
  return o;
}

models::ModelOptions cnn(std::int64_t blocks_per_stage) {
  models::ModelOptions o;
  o.name = "cnn";
  o.cnn.image = 8;
  o.cnn.widths = {4, 8};
  o.cnn.blocks_per_stage = blocks_per_stage;
  o.cnn.classes = 5;
  return o;
}

models::ModelOptions gpt() {
  models::ModelOptions o;
  o.name = "gpt";
  o.gpt.vocab = 11;
  o.gpt.context = 8;
  o.gpt.layers = 3;
  o.gpt.heads = 2;
  o.gpt.width = 8;
  o.gpt.dropout = 0.1f;  // the recomputed masks must be the same masks
  return o;
}

void PrintTo(const ModelCase& m, std::ostream* os) { *os << m.name; }
}  // namespace
}  // namespace memplan

namespace memplan::planner {
void PrintTo(CheckpointStrategy s, std::ostream* os) { *os << checkpoint_strategy_name(s); }
}  // namespace memplan::planner

namespace memplan {
namespace {

// The CNN four blocks a stage deep, enough for sqrt's segments to pay for their recomputation
// (with two, the inputs a block keeps are too small to).
const ModelCase kModels[] = {{"mlp", mlp(), 16}, {"cnn", cnn(4), 3}, {"gpt", gpt(), 2}};
// Two blocks a stage where depth is not the point: the frontier check plans every point.
const ModelCase kShallowModels[] = {{"mlp", mlp(), 16}, {"cnn", cnn(2), 3}, {"gpt", gpt(), 2}};

// The greedy packer alone keeps these tests fast; the exact search changes no decision tested here.
planner::PlanOptions fast() {
  planner::PlanOptions o;
  o.solver = planner::SolverBudget::greedy_only();
  return o;
}

graph::Graph training_step(const ModelCase& m) {
  graph::Graph g = models::build_forward(m.model, m.batch).value();
  graph::OptimizerConfig opt;
  opt.lr = 1e-2f;
  graph::make_training_step(g, opt);
  return g;
}

std::string train_sha(const graph::Graph& g, runtime::ExecutionMode mode, int steps) {
  testing::CpuRun run(g, mode);
  runtime::Executor& exec = run.executor;
  exec.initialize_persistent(42);
  Rng rng(9);
  const graph::TensorDesc& x_desc = g.tensor(g.find("x"));
  const auto classes = static_cast<std::uint64_t>(g.tensor(g.output).shape[1]);
  std::vector<float> x(static_cast<std::size_t>(x_desc.shape.numel()));
  std::vector<std::int32_t> ids(x.size());
  std::vector<std::int32_t> y(static_cast<std::size_t>(g.tensor(g.find("labels")).shape.numel()));
  for (int s = 0; s < steps; ++s) {
    for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
    for (auto& v : ids) v = static_cast<std::int32_t>(rng.below(classes));
    for (auto& v : y) v = static_cast<std::int32_t>(rng.below(classes));
    const bool token_ids = x_desc.dtype == graph::DType::i32;
    exec.set_input(g.find("x"), token_ids ? static_cast<const void*>(ids.data()) : x.data(), x_desc.size_bytes());
    exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
    EXPECT_TRUE(exec.run_step().ok());
  }
  return exec.params_sha256();
}

int count_recompute_ops(const graph::Graph& g) {
  int n = 0;
  for (const graph::Op& op : g.ops()) n += op.phase == graph::Phase::recompute ? 1 : 0;
  return n;
}

using StrategyCase = std::tuple<ModelCase, CheckpointStrategy>;
class CheckpointBitwise : public ::testing::TestWithParam<StrategyCase> {};

TEST_P(CheckpointBitwise, SameParametersWithAndWithoutCheckpointing) {
  const auto& [m, strategy] = GetParam();
  if (testing::kSanitized && std::string(m.name) == "cnn" && strategy == CheckpointStrategy::kOptimal) {
    GTEST_SKIP() << "under the sanitizers the CNN's optimal search (40 s there) is left to the normal build; its sqrt case runs";
  }
  const graph::Graph g = training_step(m);
  const auto outcome = planner::apply_checkpointing(g, {strategy, std::nullopt}, fast());
  ASSERT_TRUE(outcome.ok()) << outcome.error().message;
  const graph::Graph& c = outcome.value().graph;
  ASSERT_GT(count_recompute_ops(c), 0) << "nothing was recomputed: the comparison would prove nothing";
  EXPECT_GT(outcome.value().extra_flops_fraction, 0.0);
  EXPECT_LT(outcome.value().arena_bytes_with, outcome.value().arena_bytes_without);
  // Every recomputed tensor is named after the one it replaces and read by a backward op.
  for (const graph::Op& op : c.ops()) {
    if (op.phase == graph::Phase::recompute) {
      EXPECT_EQ(op.name.rfind("recompute:", 0), 0u) << op.name;
      EXPECT_NE(g.find(op.name.substr(10, op.name.find('#') - 10)), kNoTensor) << op.name;
    }
  }
  ASSERT_TRUE(planner::validate_plan(planner::plan_memory(c).value()).ok());
  const std::string reference = train_sha(g, runtime::ExecutionMode::planned, 3);
  EXPECT_EQ(train_sha(c, runtime::ExecutionMode::planned, 3), reference);
  EXPECT_EQ(train_sha(c, runtime::ExecutionMode::naive, 3), reference);
}

INSTANTIATE_TEST_SUITE_P(
    ModelsAndStrategies, CheckpointBitwise,
    ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values(CheckpointStrategy::kSqrt, CheckpointStrategy::kOptimal)),
    [](const auto& p) {
      return std::string(std::get<0>(p.param).name) + "_" +
             std::string(planner::checkpoint_strategy_name(std::get<1>(p.param)));
    });

TEST(Checkpoint, RecomputeOpsRunAfterTheForwardAndBeforeTheirBackwardReaders) {
  const graph::Graph g = training_step(kModels[2]);
  const graph::Graph c = planner::apply_checkpointing(g, {CheckpointStrategy::kSqrt, std::nullopt}, fast()).value().graph;
  int last_forward = -1, first_recompute = -1;
  for (int i = 0; i < c.num_ops(); ++i) {
    const graph::Op& op = c.ops()[static_cast<std::size_t>(i)];
    if (op.phase == graph::Phase::forward) last_forward = i;
    if (op.phase == graph::Phase::recompute && first_recompute < 0) first_recompute = i;
    for (TensorId t : op.inputs) {
      const int p = c.producer(t);
      EXPECT_LT(p, i) << op.name << " reads " << c.tensor(t).name << " before it is produced";
    }
  }
  EXPECT_GT(first_recompute, last_forward);
}

TEST(Checkpoint, NestedScheduleRunningAStageThreeTimesTrainsBitIdentically) {
  const graph::Graph g = training_step(kModels[2]);
  const planner::CheckpointChain chain = planner::find_checkpoint_chain(g);
  ASSERT_GE(chain.stages.size(), 6u) << "a 3-layer GPT should cut into several stages";
  std::optional<std::vector<planner::ChainAction>> nested;
  for (const auto& schedule : planner::chain_frontier_nested(chain.stages)) {
    std::vector<int> runs(chain.stages.size(), 0);
    for (const auto& a : schedule.actions) runs[static_cast<std::size_t>(a.stage)] += a.kind != planner::ChainActionKind::kBackward;
    if (*std::max_element(runs.begin(), runs.end()) >= 3) nested = schedule.actions;
  }
  ASSERT_TRUE(nested) << "no frontier schedule recomputes a stage twice";
  const graph::Graph c = planner::rematerialize(g, chain, *nested);
  EXPECT_NE(c.find("recompute:" + g.tensor(g.ops()[static_cast<std::size_t>(chain.last_op[0])].outputs[0]).name + "#2"), kNoTensor)
      << "the first stage's output is recomputed twice";
  ASSERT_TRUE(planner::validate_plan(planner::plan_memory(c, fast()).value()).ok());
  const std::string reference = train_sha(g, runtime::ExecutionMode::planned, 3);
  EXPECT_EQ(train_sha(c, runtime::ExecutionMode::planned, 3), reference);
  EXPECT_EQ(train_sha(c, runtime::ExecutionMode::naive, 3), reference);
}

TEST(Checkpoint, NoneAndAutoWithoutBudgetChangeNothing) {
  const graph::Graph g = training_step(kModels[0]);
  for (auto s : {CheckpointStrategy::kNone, CheckpointStrategy::kAuto}) {
    const auto o = planner::apply_checkpointing(g, {s, std::nullopt}, fast()).value();
    EXPECT_EQ(o.chosen, CheckpointStrategy::kNone);
    EXPECT_EQ(count_recompute_ops(o.graph), 0);
    EXPECT_EQ(o.arena_bytes_with, o.arena_bytes_without);
    EXPECT_EQ(o.extra_flops_fraction, 0.0);
  }
}

TEST(Checkpoint, OptimalMeetsABudgetAndAutoPicksTheCheapest) {
  const graph::Graph g = training_step(kModels[2]);
  const auto sqrt = planner::apply_checkpointing(g, {CheckpointStrategy::kSqrt, std::nullopt}, fast()).value();
  const Bytes budget = sqrt.arena_bytes_with;
  const auto opt = planner::apply_checkpointing(g, {CheckpointStrategy::kOptimal, budget}, fast());
  ASSERT_TRUE(opt.ok()) << opt.error().message;
  EXPECT_LE(opt.value().arena_bytes_with, budget);
  EXPECT_LE(opt.value().extra_flops_fraction, sqrt.extra_flops_fraction);
  const auto a = planner::apply_checkpointing(g, {CheckpointStrategy::kAuto, budget}, fast());
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_NE(a.value().chosen, CheckpointStrategy::kNone);
  EXPECT_LE(a.value().arena_bytes_with, budget);
  EXPECT_LE(a.value().extra_flops_fraction, opt.value().extra_flops_fraction);
  // A budget the step already fits needs no recomputation.
  const auto roomy = planner::apply_checkpointing(g, {CheckpointStrategy::kAuto, sqrt.arena_bytes_without}, fast()).value();
  EXPECT_EQ(roomy.chosen, CheckpointStrategy::kNone);
}

// optimal packs only the frontier points whose arena lower bound leaves them a chance; the
// answer must equal packing every point: without a budget the smallest arena (ties: less
// recomputation), with one the first point in recomputation order that fits.
TEST(Checkpoint, OptimalEqualsPackingEveryFrontierPoint) {
  for (const ModelCase& m : kShallowModels) {
    const graph::Graph g = training_step(m);
    const planner::CheckpointChain chain = planner::find_checkpoint_chain(g);
    const auto frontier = planner::chain_frontier_nested(chain.stages);
    ASSERT_GT(frontier.size(), 1u) << m.model.name;
    std::vector<Bytes> arenas;
    for (const auto& point : frontier) {
      const graph::Graph remat = planner::rematerialize(g, chain, point.actions);
      const Bytes arena = planner::plan_memory(remat, fast()).value().arena_bytes;
      const Bytes searched = planner::arena_lower_bound(remat, fast()).value();
      EXPECT_LE(searched, arena) << m.model.name;
      // The order-free bound is below the searched one, and the frontier's search computes it
      // from the step's skeleton to the same byte.
      const Bytes cheap = planner::order_free_lower_bound(remat, fast()).value();
      EXPECT_LE(cheap, searched) << m.model.name;
      EXPECT_EQ(planner::rematerialized_order_free_bound(g, chain, point.actions, fast()).value(), cheap) << m.model.name;
      // The search bounds points rewritten from the step without names: the same bytes.
      EXPECT_EQ(planner::arena_lower_bound(planner::rematerialize(g.without_names(), chain, point.actions), fast()).value(),
                planner::arena_lower_bound(remat, fast()).value())
          << m.model.name;
      arenas.push_back(arena);
    }
    const std::size_t least = static_cast<std::size_t>(std::min_element(arenas.begin(), arenas.end()) - arenas.begin());
    const auto unbounded = planner::apply_checkpointing(g, {CheckpointStrategy::kOptimal, std::nullopt}, fast()).value();
    EXPECT_EQ(unbounded.arena_bytes_with, arenas[least]) << m.model.name;
    // Every point's arena as a budget (every third under the sanitizers: each is a full search).
    const std::size_t stride = testing::kSanitized ? 3 : 1;
    for (std::size_t i = 0; i < frontier.size(); i += stride) {
      const Bytes budget = arenas[i];
      const std::size_t first = static_cast<std::size_t>(
          std::find_if(arenas.begin(), arenas.end(), [&](Bytes a) { return a <= budget; }) - arenas.begin());
      const auto fitted = planner::apply_checkpointing(g, {CheckpointStrategy::kOptimal, budget}, fast()).value();
      EXPECT_EQ(fitted.arena_bytes_with, arenas[first]) << m.model.name << " budget " << budget;
      const graph::Graph expected = planner::rematerialize(g, chain, frontier[first].actions);
      EXPECT_DOUBLE_EQ(fitted.extra_flops_fraction,
                       (planner::graph_flops(expected) - planner::graph_flops(g)) / planner::graph_flops(g))
          << m.model.name << " budget " << budget;
    }
  }
}

TEST(Checkpoint, BudgetBelowTheMinimumIsAnAnswerNamingTheMinimumAndItsStrategy) {
  const graph::Graph g = training_step(kModels[2]);
  const auto least = planner::apply_checkpointing(g, {CheckpointStrategy::kOptimal, std::nullopt}, fast()).value();
  const auto sqrt = planner::apply_checkpointing(g, {CheckpointStrategy::kSqrt, std::nullopt}, fast()).value();
  const Bytes least_arena = std::min({least.arena_bytes_with, sqrt.arena_bytes_with, least.arena_bytes_without});
  for (auto s : {CheckpointStrategy::kNone, CheckpointStrategy::kSqrt, CheckpointStrategy::kOptimal, CheckpointStrategy::kAuto}) {
    const auto r = planner::apply_checkpointing(g, {s, least.arena_bytes_with / 2}, fast());
    ASSERT_TRUE(r.ok()) << planner::checkpoint_strategy_name(s) << ": " << r.error().message;
    EXPECT_FALSE(r.value().fits) << planner::checkpoint_strategy_name(s);
    ASSERT_TRUE(r.value().minimum.has_value()) << planner::checkpoint_strategy_name(s);
    EXPECT_EQ(r.value().minimum->arena_bytes, least_arena) << planner::checkpoint_strategy_name(s);
    EXPECT_GT(r.value().arena_bytes_with, least.arena_bytes_with / 2);
  }
  // The minimum it names is reachable, with the strategy it names; a byte less is not.
  const auto none = planner::apply_checkpointing(g, {CheckpointStrategy::kNone, 1}, fast()).value();
  const planner::MinimumArena minimum = *none.minimum;
  const auto reached = planner::apply_checkpointing(g, {minimum.strategy, minimum.arena_bytes}, fast()).value();
  EXPECT_TRUE(reached.fits);
  EXPECT_EQ(reached.arena_bytes_with, minimum.arena_bytes);
  EXPECT_TRUE(planner::apply_checkpointing(g, {CheckpointStrategy::kAuto, minimum.arena_bytes}, fast()).value().fits);
  EXPECT_FALSE(planner::apply_checkpointing(g, {CheckpointStrategy::kAuto, minimum.arena_bytes - 1}, fast()).value().fits);
  // Without the search for the minimum the answer is the same "no", without a minimum.
  planner::CheckpointRequest quick{CheckpointStrategy::kNone, 1};
  quick.find_minimum = false;
  const auto q = planner::apply_checkpointing(g, quick, fast()).value();
  EXPECT_FALSE(q.fits);
  EXPECT_FALSE(q.minimum.has_value());
}

TEST(Checkpoint, ParseStrategyNames) {
  for (auto s : {CheckpointStrategy::kNone, CheckpointStrategy::kSqrt, CheckpointStrategy::kOptimal, CheckpointStrategy::kAuto}) {
    EXPECT_EQ(planner::parse_checkpoint_strategy(planner::checkpoint_strategy_name(s)).value(), s);
  }
  const auto bad = planner::parse_checkpoint_strategy("sqrt2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("none, sqrt, optimal or auto"), std::string::npos);
}

// --- the CLI ----------------------------------------------------------------------------

using testing::run_cli;

TEST(CheckpointCli, BadFlagsAreUsageErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"plan --model gpt --checkpoint sqrt2", "--checkpoint"},
      {"plan --model gpt --checkpoint optimal --budget 12XB", "--budget"},
      {"plan --model gpt --checkpoint optimal --budget -1", "--budget"},
      {"train --checkpoint fast --steps 1", "--checkpoint"},
      {"fit --budget 1GiB --checkpoint maybe", "--checkpoint"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << args << "\n" << r.output;
  }
}

TEST(CheckpointCli, PlanPrintsTheTradeInOneLine) {
  const auto r = run_cli("plan --model gpt --batch 4 --time-limit 0 --checkpoint sqrt", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // "checkpoint sqrt: arena X MiB -> Y MiB, recompute +Z% FLOPs" (no <regex>: it trips -Werror under ASan)
  const auto at = r.output.find("checkpoint sqrt: arena ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double before = 0, after = 0, extra = 0;
  char tail[8] = {};
  ASSERT_EQ(std::sscanf(r.output.c_str() + at, "checkpoint sqrt: arena %lf MiB -> %lf MiB, recompute +%lf%% %5s", &before,
                        &after, &extra, tail),
            4)
      << r.output.substr(at);
  EXPECT_STREQ(tail, "FLOPs");
  EXPECT_LT(after, before);
  EXPECT_GT(extra, 0.0);
}

TEST(CheckpointCli, BudgetBelowTheMinimumIsAUsageErrorNamingTheMinimum) {
  const auto r = run_cli("plan --model gpt --batch 4 --time-limit 0 --checkpoint auto --budget 1KiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("minimum feasible arena is"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reached with --checkpoint"), std::string::npos) << r.output;
}

TEST(CheckpointCli, PlanJsonMeetsTheBudget) {
  const auto none = nlohmann::json::parse(run_cli("plan --model gpt --batch 4 --time-limit 0 --json", false).output);
  const Bytes before = none["arena_bytes"].get<Bytes>();
  const auto r = run_cli("plan --model gpt --batch 4 --time-limit 0 --json --checkpoint auto --budget " +
                         std::to_string(before * 9 / 10), false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["checkpoint"]["arena_bytes_without"].get<Bytes>(), before);
  EXPECT_LE(j["arena_bytes"].get<Bytes>(), before * 9 / 10);
  EXPECT_EQ(j["checkpoint"]["arena_bytes_with"], j["arena_bytes"]);
  EXPECT_GT(j["checkpoint"]["recompute_ops"].get<int>(), 0);
  EXPECT_NE(j["checkpoint"]["strategy"], "none");
}

TEST(CheckpointCli, FitWithCheckpointingFitsWhereWithoutItDoesNot) {
  const auto none = nlohmann::json::parse(run_cli("plan --model gpt --batch 4 --time-limit 0 --json", false).output);
  const std::string budget = std::to_string(none["arena_bytes"].get<Bytes>() * 9 / 10);
  const auto without = nlohmann::json::parse(
      run_cli("fit --model gpt --batch 4 --device cpu --json --budget " + budget, false).output);
  EXPECT_FALSE(without["fits"].get<bool>());
  const auto r = run_cli("fit --model gpt --batch 4 --device cpu --json --checkpoint auto --budget " + budget, false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto with = nlohmann::json::parse(r.output);
  EXPECT_TRUE(with["fits"].get<bool>()) << r.output;
  EXPECT_GT(with["checkpoint"]["extra_flops_fraction"].get<double>(), 0.0);
}

TEST(CheckpointCli, TrainingWithCheckpointingGivesTheSameParameters) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("memplan_ckpt_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 100; ++i) text << "a stitch in time saves nine " << i << "\n";
  }
  const std::string model = "train --model gpt --layers 2 --width 16 --heads 2 --seq 8 --batch 2 --dropout 0.1 "
                            "--steps 3 --threads 1 --quiet --json --data " + (dir / "text.txt").string();
  const auto a = run_cli(model, false);
  const auto b = run_cli(model + " --checkpoint optimal", false);
  fs::remove_all(dir);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto ja = nlohmann::json::parse(a.output);
  const auto jb = nlohmann::json::parse(b.output);
  EXPECT_EQ(ja["params_sha256"], jb["params_sha256"]);
  EXPECT_FALSE(ja.contains("checkpoint"));
  ASSERT_TRUE(jb.contains("checkpoint"));
  EXPECT_LT(jb["arena_bytes"].get<Bytes>(), ja["arena_bytes"].get<Bytes>());
  EXPECT_EQ(jb["checkpoint"]["arena_bytes_with"], jb["arena_bytes"]);
}

}  // namespace
}  // namespace memplan
