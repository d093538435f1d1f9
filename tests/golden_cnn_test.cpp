// The CNN (a small ResNet) against PyTorch: same weights and batch must give the same
// training-mode logits and loss, every parameter gradient, the batch-norm running statistics
// after the step, and the evaluation-mode logits from those statistics (data from
// tests/golden/make_cnn_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "tests/test_util.h"
#include "memplan/graph/autograd.h"
#include "memplan/models/cnn.h"
#include "test_util.h"

namespace memplan {
namespace {

using testing::expect_close;

models::CnnConfig config_of(const nlohmann::json& golden) {
  const auto& c = golden["config"];
  models::CnnConfig config;
  config.image = c["image"].get<std::int64_t>();
  config.in_channels = c["in_channels"].get<std::int64_t>();
  config.widths = c["widths"].get<std::vector<std::int64_t>>();
  config.blocks_per_stage = c["blocks_per_stage"].get<std::int64_t>();
  config.classes = c["classes"].get<std::int64_t>();
  config.bn_momentum = c["bn_momentum"].get<float>();
  return config;
}

void set_inputs(runtime::Executor& e, const graph::Graph& g, const nlohmann::json& golden) {
  const auto x = golden["x"].get<std::vector<float>>();
  const auto labels = golden["labels"].get<std::vector<std::int32_t>>();
  e.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  e.set_input(g.find("labels"), labels.data(), static_cast<Bytes>(labels.size() * 4));
}

TEST(GoldenCnn, TrainingStepAndEvaluationMatchPyTorch) {
  const nlohmann::json golden = testing::load_golden("cnn_golden.json");
  const models::CnnConfig config = config_of(golden);
  const auto batch = golden["batch"].get<std::int64_t>();

  graph::Graph g = models::build_cnn(config, batch, /*training=*/true);
  graph::append_backward(g, g.loss);
  for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);
  ASSERT_EQ(g.parameters().size(), golden["initial"].size()) << "the model and the script disagree on parameters";

  testing::CpuRun train(g);
  train.executor.initialize_persistent(0);  // running statistics: mean 0, variance 1, as PyTorch
  for (TensorId p : g.parameters()) {
    ASSERT_TRUE(golden["initial"].contains(g.tensor(p).name)) << g.tensor(p).name;
    const auto values = golden["initial"][g.tensor(p).name].get<std::vector<float>>();
    ASSERT_EQ(static_cast<std::int64_t>(values.size()), g.tensor(p).shape.numel()) << g.tensor(p).name;
    train.executor.write_tensor(p, values.data());
  }
  set_inputs(train.executor, g, golden);
  ASSERT_TRUE(train.executor.run_step().ok());

  EXPECT_NEAR(train.executor.read_scalar(g.loss), golden["loss"].get<float>(), 1e-5f);
  expect_close(testing::read_floats(train.executor, g.output), golden["logits"].get<std::vector<float>>(), "logits",
               1e-5f, 1e-4f);
  for (TensorId p : g.parameters()) {
    const std::string& name = g.tensor(p).name;
    expect_close(testing::read_floats(train.executor, g.tensor(p).grad), golden["grad"][name].get<std::vector<float>>(),
                 "d loss / d " + name, 1e-5f, 1e-3f);
  }
  const auto& running = golden["running_after_step"];
  ASSERT_EQ(g.tensors_with_role(graph::Role::optimizer_state).size(), running.size());
  for (TensorId t : g.tensors_with_role(graph::Role::optimizer_state)) {
    const std::string& name = g.tensor(t).name;
    ASSERT_TRUE(running.contains(name)) << name;
    expect_close(testing::read_floats(train.executor, t), running[name].get<std::vector<float>>(), name, 1e-6f, 1e-4f);
  }

  // Evaluation graph: the trained weights and running statistics, bound by name.
  const graph::Graph eval = models::build_cnn(config, batch, /*training=*/false);
  runtime::CpuDevice device;
  runtime::Executor exec(eval, testing::plan_for(eval, device), device);
  for (TensorId t = 0; t < eval.num_tensors(); ++t) {
    if (graph::is_persistent(eval.tensor(t).role)) exec.bind_external(t, train.executor.storage(g.find(eval.tensor(t).name)));
  }
  ASSERT_TRUE(exec.setup().ok());
  set_inputs(exec, eval, golden);
  ASSERT_TRUE(exec.run_step().ok());
  expect_close(testing::read_floats(exec, eval.output), golden["eval_logits"].get<std::vector<float>>(), "eval logits",
               1e-5f, 1e-4f);
}

}  // namespace
}  // namespace memplan
