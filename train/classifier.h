// Glue between image classifiers and their data: batch feeding with a seeded shuffle, and
// test-set accuracy computed by a forward-only graph that reads the trained weights in place.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/models/fashion_mnist.h"
#include "memplan/models/registry.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/executor.h"

namespace memplan::train {

// The names a classifier's graph gives its image input and its labels, and how labels are fed:
// i32 class indices [batch], or (one_hot) f32 rows [batch, classes] holding 1 at the class, the
// target of an mean-squared-error loss.
struct ClassifierIo {
  std::string input = "x";
  std::string labels = "labels";
  bool one_hot = false;
  std::int64_t classes = 0;  // one_hot: the width of a target row
  // The input's image [channels, height, width] when the dataset's gray images are resampled to
  // it (models::resample_gray: an imported model made for other images); 0: fed as they are.
  std::int64_t channels = 0, height = 0, width = 0;
  bool resamples() const { return channels > 0; }
  // Values of one fed image.
  std::int64_t features(const models::ImageDataset& data) const {
    return resamples() ? channels * height * width : data.features();
  }
};

// The images `items` of `data` as the graph's input takes them (io.resamples(): resampled) into
// `out`, one after the other.
void stage_images(const models::ImageDataset& data, std::span<const std::int64_t> items, const ClassifierIo& io,
                  std::vector<float>& out);

// Feeds batches of a dataset in an order reshuffled every epoch from the seed (Fisher-Yates on
// a platform-independent RNG, so a seed means the same order everywhere).
class BatchFeeder {
 public:
  BatchFeeder(const models::ImageDataset& data, std::int64_t batch, std::uint64_t seed, ClassifierIo io = {});
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
  ClassifierIo io_;
  std::vector<float> one_hot_;
};

// Labels [count] as one-hot rows [count, classes] (labels outside [0, classes) give a zero row).
std::vector<float> one_hot_rows(const std::int32_t* labels, std::int64_t count, std::int64_t classes);

struct Evaluation {
  double accuracy = 0.0;
  double mean_loss = 0.0;
  std::int64_t images = 0;  // how many were evaluated
};

// The working dtype of a trained graph (graph/mixed_precision.h): its parameters' (f32 without any).
graph::DType working_dtype(const graph::Graph& graph);

// Runs the model's forward graph over the dataset's first `max_images` images (all of them by
// default) with the parameters of `trained`.
// A fine-tuned model (`lora`, `quant`) is evaluated with its adapters and quantized weights.
Result<Evaluation> evaluate_classifier(const models::ModelOptions& model,
                                       const runtime::Executor& trained,
                                       const models::ImageDataset& data, runtime::Device& device,
                                       std::int64_t max_images = std::numeric_limits<std::int64_t>::max(),
                                       const graph::LoraConfig& lora = {}, const graph::QuantConfig& quant = {});

// The same for any classifier graph: `eval_step(batch)` describes its forward graph at that batch
// in evaluation form (not a training step), `io` names its input and labels. Persistent tensors
// (parameters, batch-norm statistics) are read from `trained` by name.
Result<Evaluation> evaluate_classifier(const std::function<planner::StepDescription(std::int64_t batch)>& eval_step,
                                       const ClassifierIo& io, const runtime::Executor& trained,
                                       const models::ImageDataset& data, runtime::Device& device,
                                       std::int64_t max_images = std::numeric_limits<std::int64_t>::max());

}  // namespace memplan::train
