// train/classifier: the image batch feeder (every item once per epoch, in an order drawn from
// the seed and the epoch, any step fed first) and classifier evaluation (argmax accuracy and
// mean loss over every item, the tail batch included, with the trained weights read in place).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "memplan/models/registry.h"
#include "memplan/train/classifier.h"
#include "test_util.h"

namespace memplan {
namespace {

constexpr std::int32_t kNumberedClasses = 5;

// Items that name themselves: every pixel of image i is i (exact in float), its label i % 5.
models::ImageDataset numbered_images(std::int64_t count) {
  models::ImageDataset data;
  data.count = count;
  data.rows = 1;
  data.cols = 3;
  data.classes = kNumberedClasses;
  for (std::int64_t i = 0; i < count; ++i) {
    data.images.insert(data.images.end(), 3, static_cast<float>(i));
    data.labels.push_back(static_cast<std::int32_t>(i % kNumberedClasses));
  }
  return data;
}

// A batch-`batch` linear classifier over numbered_images whose inputs stay readable after a step.
graph::Graph feeder_probe_graph(std::int64_t batch) {
  models::ModelOptions model;
  model.mlp = {3, {}, kNumberedClasses};
  graph::Graph g = models::build_forward(model, batch).value();
  g.retained.push_back(g.find("x"));
  g.retained.push_back(g.find("labels"));
  return g;
}

// The items `feeder` stages for `step`, in batch order; checks each label came with its image.
std::vector<std::int64_t> fed_items(train::BatchFeeder& feeder, std::int64_t step, testing::CpuRun& run) {
  const graph::Graph& g = run.executor.graph();
  feeder.feed(step, run.executor);
  EXPECT_TRUE(run.executor.run_step().ok());
  const std::vector<float> x = testing::read_floats(run.executor, g.find("x"));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(g.tensor(g.find("labels")).shape.numel()));
  run.executor.read_tensor(g.find("labels"), labels.data());
  std::vector<std::int64_t> items;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const auto item = static_cast<std::int64_t>(x[3 * i]);
    EXPECT_EQ(x[3 * i + 2], x[3 * i]) << "all of an item's pixels are copied";
    EXPECT_EQ(labels[i], item % kNumberedClasses) << "item " << item << " came with another item's label";
    items.push_back(item);
  }
  return items;
}

std::vector<std::int64_t> epoch_items(train::BatchFeeder& feeder, std::int64_t epoch, testing::CpuRun& run) {
  std::vector<std::int64_t> items;
  for (std::int64_t s = 0; s < feeder.steps_per_epoch(); ++s) {
    const std::vector<std::int64_t> batch = fed_items(feeder, epoch * feeder.steps_per_epoch() + s, run);
    items.insert(items.end(), batch.begin(), batch.end());
  }
  return items;
}

TEST(BatchFeeder, EachEpochFeedsEveryItemOnceInAnOrderDrawnFromTheSeed) {
  const models::ImageDataset data = numbered_images(12);
  const graph::Graph g = feeder_probe_graph(4);
  testing::CpuRun run(g);
  train::BatchFeeder feeder(data, 4, /*seed=*/7);
  ASSERT_EQ(feeder.steps_per_epoch(), 3);
  const std::vector<std::int64_t> first = epoch_items(feeder, 0, run), second = epoch_items(feeder, 1, run);
  std::vector<std::int64_t> all(12);
  std::iota(all.begin(), all.end(), 0);
  for (const auto* epoch : {&first, &second}) {
    std::vector<std::int64_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all) << "an epoch feeds every item exactly once";
  }
  EXPECT_NE(first, all) << "the order is shuffled";
  EXPECT_NE(first, second) << "every epoch is reshuffled";

  train::BatchFeeder same(data, 4, 7), other(data, 4, 8);
  EXPECT_EQ(epoch_items(same, 0, run), first) << "the same seed gives the same order";
  EXPECT_NE(epoch_items(other, 0, run), first) << "another seed gives another order";
}

TEST(BatchFeeder, AnyStepCanBeFedFirstSoAResumedRunSeesTheSameData) {
  const models::ImageDataset data = numbered_images(12);
  const graph::Graph g = feeder_probe_graph(4);
  testing::CpuRun run(g);
  train::BatchFeeder sequential(data, 4, 3);
  std::vector<std::vector<std::int64_t>> batches;
  for (std::int64_t s = 0; s < 8; ++s) batches.push_back(fed_items(sequential, s, run));
  for (std::int64_t s : {7, 4, 0, 5}) {
    train::BatchFeeder resumed(data, 4, 3);
    EXPECT_EQ(fed_items(resumed, s, run), batches[static_cast<std::size_t>(s)]) << "step " << s;
  }
}

TEST(BatchFeeder, ItemsPastTheLastFullBatchWaitForALaterEpoch) {
  const models::ImageDataset data = numbered_images(10);
  const graph::Graph g = feeder_probe_graph(4);
  testing::CpuRun run(g);
  train::BatchFeeder feeder(data, 4, 1);
  ASSERT_EQ(feeder.steps_per_epoch(), 2);
  std::vector<std::int64_t> items = epoch_items(feeder, 0, run);
  std::sort(items.begin(), items.end());
  EXPECT_EQ(std::adjacent_find(items.begin(), items.end()), items.end()) << "no item twice in an epoch";
  EXPECT_EQ(items.size(), 8u);
}

// Image i is one-hot at pixel i % 4; its label is that pixel, except for every third image,
// whose label is the next class. `count` over 1000 makes evaluation run a tail batch.
models::ImageDataset one_hot_images(std::int64_t count) {
  models::ImageDataset data;
  data.count = count;
  data.rows = 2;
  data.cols = 2;
  data.classes = 4;
  data.images.assign(static_cast<std::size_t>(count * 4), 0.0f);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t hot = i % 4;
    data.images[static_cast<std::size_t>(i * 4 + hot)] = 1.0f;
    data.labels.push_back(static_cast<std::int32_t>(i % 3 == 0 ? (hot + 1) % 4 : hot));
  }
  return data;
}

// A trained linear classifier: logits = W x with W[(j + shift) % 4][j] = 1, no bias.
struct LinearClassifier {
  explicit LinearClassifier(std::int64_t shift) : graph(models::build_forward(options(), 8).value()), run(graph) {
    std::vector<float> w(16, 0.0f), b(4, 0.0f);
    for (std::int64_t j = 0; j < 4; ++j) w[static_cast<std::size_t>(((j + shift) % 4) * 4 + j)] = 1.0f;
    run.executor.write_tensor(graph.find("fc1.weight"), w.data());
    run.executor.write_tensor(graph.find("fc1.bias"), b.data());
  }
  static models::ModelOptions options() {
    models::ModelOptions model;
    model.mlp = {4, {}, 4};
    return model;
  }
  graph::Graph graph;
  testing::CpuRun run;
};

TEST(EvaluateClassifier, CountsArgmaxMatchesAndAveragesTheLossOverEveryItem) {
  const std::int64_t count = 1003;  // one batch of 1000 and a tail of 3
  const models::ImageDataset data = one_hot_images(count);
  const double mislabelled = 335;   // i % 3 == 0 for i < 1003
  const double e = std::exp(1.0);
  const double loss_right = std::log(e + 3.0) - 1.0, loss_wrong = std::log(e + 3.0);

  LinearClassifier identity(0);
  runtime::CpuDevice eval_device;
  auto r = train::evaluate_classifier(LinearClassifier::options(), identity.run.executor, data, eval_device);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_DOUBLE_EQ(r.value().accuracy, (double(count) - mislabelled) / double(count));
  EXPECT_NEAR(r.value().mean_loss, ((double(count) - mislabelled) * loss_right + mislabelled * loss_wrong) / double(count),
              1e-5);

  // Weights that predict the next class get exactly the mislabelled items right.
  LinearClassifier shifted(1);
  auto s = train::evaluate_classifier(LinearClassifier::options(), shifted.run.executor, data, eval_device);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_DOUBLE_EQ(s.value().accuracy, mislabelled / double(count));
  EXPECT_NEAR(s.value().mean_loss, (mislabelled * loss_right + (double(count) - mislabelled) * loss_wrong) / double(count),
              1e-5);
}

TEST(EvaluateClassifier, ReadsTheTrainedWeightsAsTheyAreNow) {
  const models::ImageDataset data = one_hot_images(40);
  LinearClassifier model(0);
  runtime::CpuDevice eval_device;
  const double before = train::evaluate_classifier(LinearClassifier::options(), model.run.executor, data, eval_device)
                            .value()
                            .accuracy;
  std::vector<float> w(16, 0.0f);
  for (std::int64_t j = 0; j < 4; ++j) w[static_cast<std::size_t>(((j + 2) % 4) * 4 + j)] = 1.0f;
  model.run.executor.write_tensor(model.graph.find("fc1.weight"), w.data());
  const double after = train::evaluate_classifier(LinearClassifier::options(), model.run.executor, data, eval_device)
                           .value()
                           .accuracy;
  EXPECT_DOUBLE_EQ(before, 26.0 / 40.0);  // 14 of 40 are mislabelled (i % 3 == 0)
  EXPECT_DOUBLE_EQ(after, 0.0) << "no label is two classes on";
}

}  // namespace
}  // namespace memplan
