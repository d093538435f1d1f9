// Expert parallelism as graphs (graph/expert_parallel.h): each rank's share of a mixture layer's
// experts, the all-to-alls around them (and their gradients), expert gradients reduced over the
// ranks holding the same experts while every other gradient is reduced over all data ranks, ZeRO
// sharding the experts over those ranks, and what cannot split. Ranks against one process:
// tests/expert_parallel_mpi_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "memplan/graph/data_parallel.h"
#include "memplan/graph/expert_parallel.h"
#include "memplan/models/llama.h"
#include "tests/test_util.h"

namespace memplan {
namespace {

using graph::OpKind;
using graph::RankGroup;

models::LlamaConfig small_moe(int degree, int rank) {
  models::LlamaConfig c;
  c.vocab = 20;
  c.context = 8;
  c.layers = 2;
  c.width = 16;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 24;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.capacity_factor = 0.0;
  c.expert_parallel = {degree, rank};
  return c;
}

int ops_over(const graph::Graph& g, OpKind kind, RankGroup group, graph::Phase phase) {
  int n = 0;
  for (const graph::Op& op : g.ops()) n += op.kind == kind && op.attrs.group == group && op.phase == phase ? 1 : 0;
  return n;
}

TEST(ExpertParallelGraph, EachRankHoldsItsShareOfTheExpertsAndExchangesTokens) {
  const graph::Graph whole = models::build_llama(small_moe(1, 0), 2);
  const graph::Graph share = models::build_llama(small_moe(2, 1), 2);
  EXPECT_EQ(testing::count_ops(whole, OpKind::all_to_all), 0);
  for (const char* which : {"gate_proj", "up_proj", "down_proj"}) {
    const std::string name = std::string("layers.1.mlp.experts.") + which + ".weight";
    const graph::TensorDesc& w = share.tensor(share.find(name));
    const graph::TensorDesc& full = whole.tensor(whole.find(name));
    EXPECT_EQ(w.shape[0], 2) << name;  // experts 2 and 3 of 4
    EXPECT_EQ(w.shape[1], full.shape[1]) << name;
    EXPECT_EQ(w.tp_axis, -1) << name;  // no tensor-parallel slice
    EXPECT_EQ(w.ep_parts, 2) << name;
    EXPECT_EQ(w.ep_index, 1) << name;
    EXPECT_EQ(graph::whole_shape(w), full.shape) << name;
    EXPECT_EQ(full.ep_parts, 1) << name;
  }
  // The router and everything else stays whole.
  EXPECT_EQ(share.tensor(share.find("layers.0.mlp.gate.weight")).shape, whole.tensor(whole.find("layers.0.mlp.gate.weight")).shape);
  // Two exchanges a mixture layer, over the expert group of 2: this rank's experts get both
  // ranks' slots (16 tokens each, nothing dropped), [2 experts, 2 x 16 slots, 16].
  EXPECT_EQ(ops_over(share, OpKind::all_to_all, RankGroup::expert, graph::Phase::forward), 4);
  const graph::TensorDesc& local = share.tensor(share.find("layers.0.mlp.to_experts"));
  EXPECT_EQ(local.shape, (graph::Shape{2, 32, 16}));
  EXPECT_EQ(share.tensor(share.find("layers.0.mlp.from_experts")).shape, (graph::Shape{4, 16, 16}));
  EXPECT_EQ(graph::expert_share(share).local_experts, 2);
  EXPECT_EQ(graph::expert_share(share).experts, 4);
  EXPECT_EQ(graph::expert_share(share).tensors, 6);
  EXPECT_EQ(graph::expert_share(whole).tensors, 0);
}

TEST(ExpertParallelGraph, ExpertGradientsAreReducedOverTheRanksHoldingTheSameExperts) {
  graph::Graph g = models::build_llama(small_moe(2, 1), 2);
  graph::OptimizerConfig sgd;
  sgd.kind = graph::OptimizerKind::sgd;
  graph::DataParallelConfig dp;
  dp.world = 4;
  dp.rank = 3;
  dp.expert_parallel = 2;
  dp.bucket_bytes = Bytes{1} << 30;  // one bucket a group
  graph::make_data_parallel_training_step(g, sgd, dp);
  // The gradient of each exchange is the same exchange, in backward.
  EXPECT_EQ(ops_over(g, OpKind::all_to_all, RankGroup::expert, graph::Phase::backward), 4);
  int expert_sums = 0, data_sums = 0;
  for (const graph::Op& op : g.ops()) {
    if (op.kind != OpKind::all_reduce || op.phase != graph::Phase::backward) continue;
    EXPECT_FLOAT_EQ(op.attrs.alpha, 0.25f) << op.name << ": the global batch's mean, whichever ranks sum";
    if (op.attrs.group == RankGroup::expert_data) {
      ++expert_sums;
      EXPECT_EQ(op.attrs.world, 2) << op.name;  // ranks 1 and 3 hold experts 2 and 3
    } else {
      ++data_sums;
      EXPECT_EQ(op.attrs.group, RankGroup::data) << op.name;
      EXPECT_EQ(op.attrs.world, 4) << op.name;
    }
  }
  EXPECT_EQ(expert_sums, 1);
  EXPECT_EQ(data_sums, 1);
  // ZeRO-3 shards an expert over those 2 ranks: [2, 24, 16] -> 384 elements each.
  graph::Graph sharded = models::build_llama(small_moe(2, 1), 2);
  dp.zero = 3;
  graph::make_data_parallel_training_step(sharded, sgd, dp);
  const graph::TensorDesc& shard = sharded.tensor(sharded.find("layers.0.mlp.experts.up_proj.weight.shard"));
  EXPECT_EQ(shard.shape, graph::Shape{2 * 24 * 16 / 2});
  EXPECT_GT(ops_over(sharded, OpKind::all_gather, RankGroup::expert_data, graph::Phase::forward), 0);
}

TEST(ExpertParallelGraph, SplitsThatCannotBeMadeSaySo) {
  try {
    models::build_llama(small_moe(3, 0), 2);
    ADD_FAILURE() << "4 experts over 3 ranks built";
  } catch (const graph::GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("choose an --expert-parallel that divides them (2, 4)"), std::string::npos) << e.what();
  }
  models::LlamaConfig dense = small_moe(2, 0);
  dense.moe.experts = 0;
  EXPECT_THROW(models::build_llama(dense, 2), graph::GraphError);
  EXPECT_THROW(models::build_llama(small_moe(2, 2), 2), graph::GraphError);  // no rank 2 of 2
  graph::Graph g = models::build_llama(small_moe(2, 0), 2);
  graph::DataParallelConfig dp;
  dp.world = 3;
  dp.expert_parallel = 2;
  EXPECT_THROW(graph::make_data_parallel_training_step(g, graph::OptimizerConfig{}, dp), graph::GraphError);
}

}  // namespace
}  // namespace memplan
