// The MLP against PyTorch: same weights and batch must give the same loss, every gradient and
// the parameters after one AdamW step (data from tests/golden/make_mlp_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/mlp.h"
#include "test_util.h"

namespace memplan {
namespace {

using testing::expect_close;

TEST(GoldenMlp, LossGradientsAndAdamWStepMatchPyTorch) {
  const nlohmann::json golden = testing::load_golden("mlp_golden.json");
  const auto sizes = golden["sizes"].get<std::vector<std::int64_t>>();
  models::MlpConfig config;
  config.inputs = sizes.front();
  config.hidden.assign(sizes.begin() + 1, sizes.end() - 1);
  config.classes = sizes.back();
  graph::Graph g = models::build_mlp(config, golden["batch"].get<std::int64_t>());
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::adamw;
  opt.lr = golden["adamw"]["lr"].get<float>();
  opt.beta1 = golden["adamw"]["beta1"].get<float>();
  opt.beta2 = golden["adamw"]["beta2"].get<float>();
  opt.eps = golden["adamw"]["eps"].get<float>();
  opt.weight_decay = golden["adamw"]["weight_decay"].get<float>();
  graph::make_training_step(g, opt);
  for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);

  testing::CpuRun run(g);
  run.executor.initialize_persistent(0);  // zeroes the AdamW state; the weights come from PyTorch
  for (TensorId p : g.parameters()) {
    const auto values = golden["initial"][g.tensor(p).name].get<std::vector<float>>();
    ASSERT_EQ(static_cast<std::int64_t>(values.size()), g.tensor(p).shape.numel()) << g.tensor(p).name;
    run.executor.write_tensor(p, values.data());
  }
  const auto x = golden["x"].get<std::vector<float>>();
  const auto labels = golden["labels"].get<std::vector<std::int32_t>>();
  run.executor.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  run.executor.set_input(g.find("labels"), labels.data(), static_cast<Bytes>(labels.size() * 4));
  ASSERT_TRUE(run.executor.run_step().ok());

  EXPECT_NEAR(run.executor.read_scalar(g.loss), golden["loss"].get<float>(), 1e-5f);
  for (TensorId p : g.parameters()) {
    const std::string& name = g.tensor(p).name;
    expect_close(testing::read_floats(run.executor, g.tensor(p).grad),
                 golden["grad"][name].get<std::vector<float>>(), "grad " + name, 1e-6f, 1e-4f);
    expect_close(testing::read_floats(run.executor, p), golden["after_step"][name].get<std::vector<float>>(),
                 "after AdamW step " + name, 1e-6f, 1e-5f);
  }
}

}  // namespace
}  // namespace memplan
