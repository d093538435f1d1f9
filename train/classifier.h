// Glue between image classifiers and their data: batch feeding with a seeded shuffle, and
// test-set accuracy computed by a forward-only graph that reads the trained weights in place.
#pragma once

#include <cstdint>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/models/fashion_mnist.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/executor.h"

namespace memplan::train {

// Feeds batches of a dataset in an order reshuffled every epoch from the seed (Fisher-Yates on
// a platform-independent RNG, so a seed means the same order everywhere).
class BatchFeeder {
 public:
  BatchFeeder(const models::ImageDataset& data, std::int64_t batch, std::uint64_t seed);
  std::int64_t steps_per_epoch() const { return data_.count / batch_; }
  void feed(std::int64_t step_index, runtime::Executor& executor);
  // Data parallel: the batch is the global one and this feeder gives rank `rank` of `world` its
  // equal slice of it, in the order a single process would see it.
  void shard(int rank, int world) { rank_ = rank; world_ = world; }

 private:
  void shuffle_for_epoch(std::int64_t epoch);
  int rank_ = 0, world_ = 1;
  const models::ImageDataset& data_;
  std::int64_t batch_;
  std::uint64_t seed_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> order_;
  std::vector<float> x_;
  std::vector<std::int32_t> y_;
};

struct Evaluation {
  double accuracy = 0.0;
  double mean_loss = 0.0;
};

// Runs the model's forward graph over the whole dataset with the parameters of `trained`.
Result<Evaluation> evaluate_classifier(const models::ModelOptions& model,
                                       const runtime::Executor& trained,
                                       const models::ImageDataset& data, runtime::Device& device);

}  // namespace memplan::train
