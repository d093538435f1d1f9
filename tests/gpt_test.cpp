// The GPT model and its character dataset: shapes and parameter count, loss at initialisation
// near ln(V), learning a tiny repeated text, dropout changing with the step but not between
// identical runs, and the text dataset's vocabulary, split and batches.
#include <gtest/gtest.h>

#include <cmath>

#include "memplan/graph/builder.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/gpt.h"
#include "memplan/models/text_dataset.h"
#include "test_util.h"

namespace memplan {
namespace {

models::GptConfig tiny() {
  models::GptConfig c;
  c.vocab = 7;
  c.context = 8;
  c.layers = 2;
  c.heads = 2;
  c.width = 16;
  return c;
}

TEST(Gpt, ShapesAndParameterCount) {
  const models::GptConfig c = tiny();
  const graph::Graph g = models::build_gpt(c, 3);
  EXPECT_EQ(g.tensor(g.output).shape, (graph::Shape{3 * c.context, c.vocab}));
  std::int64_t params = 0;
  for (TensorId p : g.parameters()) params += g.tensor(p).shape.numel();
  const std::int64_t C = c.width;
  const std::int64_t per_layer = 4 * C + 4 * (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C);
  EXPECT_EQ(params, c.vocab * C + c.context * C + c.layers * per_layer + 2 * C);
  EXPECT_THROW(models::build_gpt([] { auto x = tiny(); x.heads = 3; return x; }(), 1), graph::GraphError);
}

TEST(Gpt, LearnsARepeatedTextAndStartsNearUniform) {
  const models::GptConfig c = tiny();
  const std::int64_t batch = 4;
  graph::Graph g = models::build_gpt(c, batch);
  graph::OptimizerConfig opt;
  opt.lr = 1e-2f;
  graph::make_training_step(g, opt);
  testing::CpuRun run(g);
  run.executor.initialize_persistent(3);
  std::vector<std::int32_t> text;
  for (int i = 0; i < 200; ++i) text.push_back(static_cast<std::int32_t>((i * 3) % c.vocab));  // period 7
  std::vector<std::int32_t> x, y;
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    models::sample_text_batch(text, batch, c.context, 1, step, x, y);
    run.executor.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
    run.executor.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
    ASSERT_TRUE(run.executor.run_step().ok());
    (step == 0 ? first : last) = run.executor.read_scalar(g.loss);
  }
  EXPECT_NEAR(first, std::log(float(c.vocab)), 0.2f);
  EXPECT_LT(last, 0.2f) << "a deterministic sequence must become predictable";
}

TEST(Gpt, DropoutMasksAreDeterministicPerStepAndChangeBetweenSteps) {
  graph::Graph g;
  graph::Builder b(g);
  const TensorId x = b.input("x", {64, 64});
  const TensorId y = b.dropout(x, 0.25f, "drop");
  g.retained.push_back(y);
  g.retained.push_back(g.find("drop.mask"));
  std::vector<float> ones(64 * 64, 1.0f);
  auto masks = [&](int steps) {
    testing::CpuRun run(g);
    std::vector<std::vector<float>> out;
    for (int s = 0; s < steps; ++s) {
      run.executor.set_input(x, ones.data(), static_cast<Bytes>(ones.size() * 4));
      EXPECT_TRUE(run.executor.run_step().ok());
      out.push_back(testing::read_floats(run.executor, y));
    }
    return out;
  };
  const auto a = masks(2), again = masks(2);
  EXPECT_EQ(a, again);
  EXPECT_NE(a[0], a[1]);
  std::int64_t dropped = 0;
  for (float v : a[0]) {
    ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f) << v;
    dropped += v == 0.0f;
  }
  EXPECT_NEAR(double(dropped) / double(a[0].size()), 0.25, 0.03);
}

TEST(TextDataset, VocabularySplitAndBatches) {
  auto data = models::make_text_dataset("abracadabra, abracadabra!\n", 2).value();
  EXPECT_EQ(data.decode({0, 1, 2}), "\n !");
  EXPECT_EQ(data.vocab_size(), 9);
  EXPECT_EQ(data.train.size() + data.val.size(), 26u);
  EXPECT_EQ(data.decode(data.train).substr(0, 5), "abrac");
  std::vector<std::int32_t> x, y;
  models::sample_text_batch(data.train, 3, 4, 7, 0, x, y);
  ASSERT_EQ(x.size(), 12u);
  for (std::size_t i = 0; i + 1 < 4; ++i) EXPECT_EQ(y[i], x[i + 1]) << "labels are the next tokens";
  EXPECT_FALSE(models::make_text_dataset("short", 4).ok());
  EXPECT_FALSE(models::read_fortunes("/nonexistent-folder").ok());
}

TEST(TextDataset, FortunesWhenInstalled) {
  auto text = models::read_fortunes(models::kFortunesDefaultDir);
  if (!text.ok()) GTEST_SKIP() << text.error().message;
  auto data = models::make_text_dataset(text.value(), 64).value();
  EXPECT_GT(data.train.size(), 1000000u);
  EXPECT_LE(data.vocab_size(), 256);
}

}  // namespace
}  // namespace memplan
