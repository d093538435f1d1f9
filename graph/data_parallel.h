// Data parallelism with ZeRO sharding as a rewrite of one rank's training step: the forward graph
// (built at the per-rank batch) gets its backward pass, then collectives, then the optimizer
// updates of what this rank owns. Every rank builds the same graph up to its rank's offsets, so
// every rank plans the same arena. Stages (ZeRO, Rajbhandari et al. 2020):
//   0: gradients all-reduced in buckets; every rank updates every parameter (DDP);
//   1: optimizer state sharded: each rank updates its shard of each parameter, then all-gathers;
//   2: gradients reduce-scattered into the owner's shard (a bucket's full buffer dies there);
//   3: parameters sharded too: all-gathered before each layer's forward and again before its
//      backward (`prefetch` layers ahead), the gathered copy dying after its last use.
// Buckets (bucket_bytes, as PyTorch DDP) are filled in the order gradients become final and
// reduced as soon as their last gradient is. Shards follow dist/shard.h.
#pragma once

#include <cstdint>

#include "memplan/common/types.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/optimizer.h"

namespace memplan::graph {

struct DataParallelConfig {
  int world = 1;  // ranks
  int rank = 0;   // this graph's rank
  int zero = 0;   // ZeRO stage 0..3
  Bytes bucket_bytes = Bytes{25} << 20;
  int prefetch = 1;  // stage 3: layers gathered ahead of the one running
  // Expert parallelism (graph/expert_parallel.h): the data ranks form groups of this many
  // consecutive ranks that split the experts; rank r holds share r % expert_parallel, and an
  // expert's gradients are summed over the world / expert_parallel ranks holding the same share
  // (sharded over those by ZeRO). 1: every rank holds every expert.
  int expert_parallel = 1;

  bool active() const { return world > 1; }
};

// Turns a forward graph with `graph.loss` set into rank `config.rank`'s training step, in place.
// With world 1 this is make_training_step. The loss becomes the mean of every rank's loss (an
// all_reduce), so it reads as a single process's on the global batch. Throws GraphError on a
// config out of range.
void make_data_parallel_training_step(Graph& graph, const OptimizerConfig& optimizer, const DataParallelConfig& config);

}  // namespace memplan::graph
