// The model zoo and `memplan fit` on it: parameter counts against the published figures,
// mixed-precision accounting, exact batch search on zoo models, the fit CLI's arena against the
// planned executor for the trainable models, and flag errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "tests/test_util.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/models/zoo.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/runtime/executor.h"

namespace memplan {
namespace {

using testing::run_cli;
using testing::parameter_count;

TEST(Zoo, ParameterCountsMatchThePublishedModels) {
  // Hugging Face / timm / torchvision parameter counts of the reference checkpoints (sources in
  // tests/hf_config_test.cpp, which checks the shipped configs themselves).
  const std::vector<std::pair<const char*, std::int64_t>> published = {
      {"gpt2", 124'439'808},          {"gpt2-medium", 354'823'168},     {"gpt2-large", 774'030'080},
      {"gpt2-xl", 1'557'611'200},     {"llama-1b", 1'235'814'400},      {"llama3.1-8b", 8'030'261'248},
      {"llama2-7b", 6'738'415'616},   {"llama2-13b", 13'015'864'320},   {"llama2-70b", 68'976'648'192},
      {"mistral-7b", 7'241'732'096},  {"qwen2.5-7b", 7'615'616'512},
      {"qwen3-0.6b", 596'049'920}, {"qwen3-8b", 8'190'735'360}, {"gemma-2b", 2'506'172'416},
      {"gemma-7b", 8'537'680'896},    {"gemma2-9b", 9'241'705'984},    {"gemma3-1b", 999'885'952}, {"deepseek-v3", 671'026'419'200}, {"opt-125m", 125'239'296}, {"santacoder", 1'124'886'528},    {"phi3-mini", 3'821'079'552},     {"olmo2-7b", 7'298'617'344},
      {"pythia-160m", 162'322'944},   {"pythia-6.9b", 6'857'302'016},   {"falcon-7b", 6'921'720'704},
      {"mixtral-8x7b", 46'702'792'704}, {"qwen1.5-moe", 14'315'784'192}, {"qwen3-30b-a3b", 30'532'122'624},
      {"t5-small", 60'506'624},       {"t5-base", 222'903'552},         {"flan-t5-base", 247'577'856},
      {"flan-t5-xl", 2'849'757'184},  {"bert-base", 109'514'298},
      {"vit-b16", 86'567'656},        {"resnet50", 25'557'032},
  };
  ASSERT_EQ(published.size(), models::zoo_models().size());
  for (const auto& [name, count] : published) {
    models::ZooOptions options;
    const bool vision = models::find_zoo_model(name)->vision;
    if (!vision) options.seq = 16;  // parameters do not depend on the sequence length
    auto g = models::build_zoo_forward(name, 1, options);
    ASSERT_TRUE(g.ok()) << name << ": " << g.error().message;
    EXPECT_EQ(parameter_count(g.value()), count) << name;
  }
}

TEST(Zoo, MixedPrecisionKeepsFp32MasterWeightsAndOptimizerState) {
  // Per parameter with AdamW: fp32 4 (weight) + 4 + 4 (m, v) persistent; mixed precision
  // 2 (bf16 weight) + 4 (fp32 master) + 4 + 4 = 14 persistent, and 2-byte gradients: the
  // 16 bytes per parameter of the ZeRO paper's accounting, counted with the gradient.
  for (const auto& [dtype, bytes_per_param, grad_bytes] :
       {std::tuple{graph::DType::f32, 12, 4}, std::tuple{graph::DType::bf16, 14, 2}, std::tuple{graph::DType::f16, 14, 2}}) {
    graph::Graph g = models::build_zoo_forward("gpt2", 1, {32, 0, dtype}).value();
    graph::make_training_step(g, graph::OptimizerConfig{});
    const std::int64_t params = parameter_count(g);
    const planner::MemoryPlan plan = planner::plan_memory(g, {.solver = planner::SolverBudget::greedy_only()}).value();
    // Every persistent tensor starts on a 256-byte boundary: at most 255 bytes of padding each.
    const auto persistent_tensors = static_cast<Bytes>(g.tensors_with_role(graph::Role::parameter).size() +
                                                       g.tensors_with_role(graph::Role::optimizer_state).size());
    EXPECT_GE(plan.persistent_bytes, bytes_per_param * params) << graph::dtype_name(dtype);
    EXPECT_LE(plan.persistent_bytes, bytes_per_param * params + 255 * persistent_tensors) << graph::dtype_name(dtype);
    for (TensorId p : g.parameters()) {
      ASSERT_NE(g.tensor(p).grad, kNoTensor);
      EXPECT_EQ(g.tensor(g.tensor(p).grad).size_bytes(), grad_bytes * g.tensor(p).shape.numel()) << g.tensor(p).name;
    }
  }
}

nlohmann::json fit_json(const std::string& args) {
  const auto r = run_cli("fit " + args + " --json", false);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json{};
}

TEST(Zoo, FitArenaEqualsWhatThePlannedExecutorAllocates) {
  for (const auto& [model, batch] : {std::pair{"mlp", 7}, std::pair{"cnn", 3}, std::pair{"gpt", 2}}) {
    const auto j = fit_json(std::string("--model ") + model + " --batch " + std::to_string(batch) +
                            " --budget 1TiB --device cpu");
    ASSERT_TRUE(j.contains("arena_bytes"));
    models::ModelOptions options;
    options.name = model;
    ASSERT_TRUE(models::set_data_sizes(options, 0).ok());  // the GPT's vocabulary, as fit plans it
    // The step as train builds it (the planner's rewrites included), planned for the device that runs it.
    runtime::CpuDevice device;
    auto planned = runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(options), batch), device, {});
    ASSERT_TRUE(planned.ok()) << planned.error().message;
    runtime::Executor exec(planned.value(), device);
    ASSERT_TRUE(exec.setup().ok());
    EXPECT_EQ(j["arena_bytes"].get<Bytes>(), exec.device_bytes_at_setup()) << model;
  }
}

struct MaxBatchCase {
  const char* args;  // model and shape flags
  const char* budget;
};

class ZooMaxBatch : public ::testing::TestWithParam<MaxBatchCase> {};

TEST_P(ZooMaxBatch, FitsAndOneMoreDoesNot) {
  const MaxBatchCase& c = GetParam();
  const std::string common = std::string(c.args) + " --device cuda --checkpoint none --budget " + c.budget;
  const auto j = fit_json(common + " --max-batch");
  ASSERT_TRUE(j.contains("max_batch")) << c.args;
  const std::int64_t max_batch = j["max_batch"].get<std::int64_t>();
  ASSERT_GT(max_batch, 0) << c.args;
  EXPECT_EQ(j["max_batch_by_checkpoint"].size(), 1u) << "--checkpoint given: that strategy alone";
  EXPECT_EQ(j["max_batch_by_checkpoint"]["none"].get<std::int64_t>(), max_batch);
  EXPECT_TRUE(fit_json(common + " --batch " + std::to_string(max_batch))["fits"].get<bool>()) << c.args;
  const auto over = fit_json(common + " --batch " + std::to_string(max_batch + 1));
  EXPECT_FALSE(over["fits"].get<bool>()) << c.args;
  // Not fitting: the suggestion is a micro-batch that fits and divides the requested batch.
  const std::int64_t micro = over["suggestion"]["micro_batch"].get<std::int64_t>();
  EXPECT_GE(micro, 1);
  EXPECT_LE(micro, max_batch);
  EXPECT_EQ(micro * over["suggestion"]["gradient_accumulation_steps"].get<std::int64_t>(), max_batch + 1);
}

INSTANTIATE_TEST_SUITE_P(Models, ZooMaxBatch,
                         ::testing::Values(MaxBatchCase{"--model gpt2 --seq 64", "3GiB"},
                                           MaxBatchCase{"--model resnet50 --image-size 64", "1500MB"},
                                           MaxBatchCase{"--model llama-1b --seq 32 --dtype bf16 --optimizer sgd", "9GiB"}));

TEST(Zoo, MaxBatchPerCheckpointStrategySideBySide) {
  const std::string common = "--model gpt --device cpu --budget 40MiB";
  const auto j = fit_json(common + " --max-batch");
  ASSERT_TRUE(j.contains("max_batch_by_checkpoint"));
  const auto& per = j["max_batch_by_checkpoint"];
  ASSERT_EQ(per.size(), 3u) << per.dump();
  for (const char* strategy : {"none", "sqrt", "optimal"}) {
    ASSERT_TRUE(per.contains(strategy)) << strategy;
    const std::int64_t mb = per[strategy].get<std::int64_t>();
    ASSERT_GT(mb, 0) << strategy;
    const std::string with = common + " --checkpoint " + strategy + " --batch ";
    EXPECT_TRUE(fit_json(with + std::to_string(mb))["fits"].get<bool>()) << strategy;
    EXPECT_FALSE(fit_json(with + std::to_string(mb + 1))["fits"].get<bool>()) << strategy;
  }
  // Recomputing activations never lowers the largest batch.
  EXPECT_GE(per["optimal"].get<std::int64_t>(), per["none"].get<std::int64_t>());
}

TEST(Zoo, FlagsThatCannotWorkAreUsageErrors) {
  for (const char* args : {"--model gpt2 --dtype fp8", "--model resnet50 --seq 128",
                           "--model gpt2 --image-size 224", "--model gpt2 --seq 2048", "--model bert-base --seq 513",
                           "--model vit-b16 --image-size 100", "--model gpt2 --checkpoint maybe",
                           "--model gpt3 --batch 1"}) {
    const auto r = run_cli(std::string("fit --budget 80GiB ") + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_FALSE(r.output.empty()) << args;
  }
}

}  // namespace
}  // namespace memplan
