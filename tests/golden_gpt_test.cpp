// The GPT against PyTorch: same weights and token batch must give the same logits, loss and
// every parameter gradient (data from tests/golden/make_gpt_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "memplan/graph/autograd.h"
#include "memplan/models/gpt.h"
#include "test_util.h"

namespace memplan {
namespace {

using testing::expect_close;

// Both attention forms against the same data (PyTorch's reference computes attention unfused).
class GoldenGpt : public ::testing::TestWithParam<models::AttentionKind> {};

std::string attention_name(const ::testing::TestParamInfo<models::AttentionKind>& param) {
  return std::string(models::attention_kind_name(param.param));
}

TEST_P(GoldenGpt, LogitsLossAndEveryGradientMatchPyTorch) {
  std::ifstream in(std::string(MEMPLAN_TEST_DATA_DIR) + "/gpt_golden.json");
  ASSERT_TRUE(in.good()) << "missing tests/data/gpt_golden.json";
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto& c = golden["config"];
  models::GptConfig config;
  config.vocab = c["vocab"].get<std::int64_t>();
  config.context = c["context"].get<std::int64_t>();
  config.layers = c["layers"].get<std::int64_t>();
  config.heads = c["heads"].get<std::int64_t>();
  config.width = c["width"].get<std::int64_t>();
  config.tied_head = c["tied_head"].get<bool>();
  config.dropout = 0.0f;
  config.attention = GetParam();
  const auto batch = golden["batch"].get<std::int64_t>();

  graph::Graph g = models::build_gpt(config, batch, /*training=*/true);
  graph::append_backward(g, g.loss);
  for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);
  ASSERT_EQ(g.parameters().size(), golden["weights"].size()) << "the model and the script disagree on parameters";

  testing::CpuRun run(g);
  run.executor.initialize_persistent(0);
  for (TensorId p : g.parameters()) {
    const std::string& name = g.tensor(p).name;
    ASSERT_TRUE(golden["weights"].contains(name)) << name;
    const auto values = golden["weights"][name].get<std::vector<float>>();
    ASSERT_EQ(static_cast<std::int64_t>(values.size()), g.tensor(p).shape.numel()) << name;
    run.executor.write_tensor(p, values.data());
  }
  const auto x = golden["x"].get<std::vector<std::int32_t>>();
  const auto labels = golden["labels"].get<std::vector<std::int32_t>>();
  run.executor.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * 4));
  run.executor.set_input(g.find("labels"), labels.data(), static_cast<Bytes>(labels.size() * 4));
  ASSERT_TRUE(run.executor.run_step().ok());

  EXPECT_NEAR(run.executor.read_scalar(g.loss), golden["loss"].get<float>(), 1e-5f);
  expect_close(testing::read_floats(run.executor, g.output), golden["logits"].get<std::vector<float>>(), "logits", 1e-5f,
               1e-4f);
  for (TensorId p : g.parameters()) {
    const std::string& name = g.tensor(p).name;
    expect_close(testing::read_floats(run.executor, g.tensor(p).grad), golden["grad"][name].get<std::vector<float>>(),
                 "d loss / d " + name, 1e-5f, 1e-3f);
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, GoldenGpt,
                         ::testing::Values(models::AttentionKind::fused, models::AttentionKind::materialized),
                         attention_name);

}  // namespace
}  // namespace memplan
