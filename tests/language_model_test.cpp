// train/language_model: the text feeder, unigram entropy, validation loss, generation, the GPT
// metadata a saved model is rebuilt from, and GptSampler (open, encode, load, generate). A tiny
// GPT trained once on a text of period 7 ("abcdefg" repeated) gives answers known in advance:
// low validation loss, and greedy generation that continues the alphabet.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include "memplan/graph/training_step.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/trainer.h"
#include "memplan/runtime/weights.h"
#include "memplan/train/language_model.h"
#include "memplan/train/saved_run.h"
#include "test_util.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

models::TextDataset alphabet_text() {
  std::string text;
  for (int i = 0; i < 120; ++i) text += "abcdefg";
  return models::make_text_dataset(text, 9).value();
}

models::ModelOptions alphabet_gpt(const models::TextDataset& data) {
  models::ModelOptions model;
  model.name = "gpt";
  model.gpt.vocab = data.vocab_size();
  model.gpt.context = 8;
  model.gpt.layers = 2;
  model.gpt.heads = 2;
  model.gpt.width = 16;
  return model;
}

// One GPT trained through TextFeeder for the whole suite, and one at its initial weights.
class LanguageModel : public ::testing::Test {
 protected:
  struct Run {
    Run(const models::ModelOptions& model, std::int64_t batch)
        : graph([&] {
            graph::Graph g = models::build_forward(model, batch).value();
            graph::OptimizerConfig opt;
            opt.lr = 1e-2f;
            graph::make_training_step(g, opt);
            return g;
          }()),
          run(graph) {
      run.executor.initialize_persistent(3);
    }
    graph::Graph graph;
    testing::CpuRun run;
  };

  static void SetUpTestSuite() {
    data_ = std::make_unique<models::TextDataset>(alphabet_text());
    model_ = std::make_unique<models::ModelOptions>(alphabet_gpt(*data_));
    initial_ = std::make_unique<Run>(*model_, 4);
    trained_ = std::make_unique<Run>(*model_, 4);
    train::TextFeeder feeder(*data_, 4, model_->gpt.context, /*seed=*/1);
    auto summary = runtime::train(
        trained_->run.executor, 80, [&](std::int64_t i, runtime::Executor& e) { feeder.feed(i, e); }, nullptr);
    MEMPLAN_CHECK(summary.ok(), summary.error().message);
    training_loss_ = summary.value().final_loss;
  }
  static void TearDownTestSuite() {
    trained_.reset();
    initial_.reset();
    model_.reset();
    data_.reset();
  }

  static std::unique_ptr<models::TextDataset> data_;
  static std::unique_ptr<models::ModelOptions> model_;
  static std::unique_ptr<Run> initial_, trained_;
  static float training_loss_;
};

std::unique_ptr<models::TextDataset> LanguageModel::data_;
std::unique_ptr<models::ModelOptions> LanguageModel::model_;
std::unique_ptr<LanguageModel::Run> LanguageModel::initial_, LanguageModel::trained_;
float LanguageModel::training_loss_ = 0.0f;

TEST_F(LanguageModel, TextFeederStagesTheWindowsOfSampleTextBatch) {
  graph::Graph g = models::build_forward(*model_, 3).value();
  g.retained.push_back(g.find("x"));
  g.retained.push_back(g.find("labels"));
  testing::CpuRun run(g);
  train::TextFeeder feeder(*data_, 3, 8, /*seed=*/5);
  EXPECT_EQ(feeder.steps_per_epoch(), static_cast<std::int64_t>(data_->train.size()) / 24);
  for (std::int64_t step : {0, 1, 9}) {
    feeder.feed(step, run.executor);
    ASSERT_TRUE(run.executor.run_step().ok());
    std::vector<std::int32_t> x(24), labels(24), want_x, want_labels;
    run.executor.read_tensor(g.find("x"), x.data());
    run.executor.read_tensor(g.find("labels"), labels.data());
    models::sample_text_batch(data_->train, 3, 8, 5, step, want_x, want_labels);
    EXPECT_EQ(x, want_x) << "step " << step;
    EXPECT_EQ(labels, want_labels) << "step " << step;
  }
  // A text shorter than one batch of windows still has a step per epoch.
  EXPECT_EQ(train::TextFeeder(*data_, 1000, 8, 5).steps_per_epoch(), 1);
}

// Two windows of source 3 and target 2 (span 4): the encoder reads the first 3 tokens, the
// decoder the source's last token and the first target token, and predicts the 2 target tokens.
TEST(SourceTarget, TheDecoderReadsTheTargetShiftedRightBehindTheSourcesLastToken) {
  const std::vector<std::int32_t> x = {10, 11, 12, 13, 20, 21, 22, 23};       // [2, 4]
  const std::vector<std::int32_t> labels = {11, 12, 13, 14, 21, 22, 23, 24};  // x shifted by one
  train::SourceTarget split;
  train::split_source_target(x, labels, 2, 3, 2, split);
  EXPECT_EQ(split.x, (std::vector<std::int32_t>{10, 11, 12, 20, 21, 22}));
  EXPECT_EQ(split.decoder_x, (std::vector<std::int32_t>{12, 13, 22, 23}));
  EXPECT_EQ(split.labels, (std::vector<std::int32_t>{13, 14, 23, 24}));
}

TEST(UnigramEntropy, IsTheEntropyOfTheTokenFrequenciesInNats) {
  EXPECT_NEAR(train::unigram_entropy({0, 1, 2, 3, 4, 5, 6}, 7), std::log(7.0), 1e-12);
  EXPECT_NEAR(train::unigram_entropy({0, 0, 0, 1}, 5), -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
  EXPECT_EQ(train::unigram_entropy({2, 2, 2}, 3), 0.0);
}

TEST_F(LanguageModel, ValidationLossIsNearUniformBeforeTrainingAndLowAfter) {
  runtime::CpuDevice device;
  auto before = train::evaluate_language_model(*model_, initial_->run.executor, data_->val, device, 1024);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_NEAR(before.value().mean_loss, std::log(7.0), 0.3);
  auto after = train::evaluate_language_model(*model_, trained_->run.executor, data_->val, device, 1024);
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_LT(after.value().mean_loss, 0.3) << "training loss " << training_loss_;
  EXPECT_LT(after.value().mean_loss, train::unigram_entropy(data_->train, data_->vocab_size()) / 4);
}

TEST_F(LanguageModel, ValidationCoversWholeBatchesOfWindowsAndRefusesAShortText) {
  runtime::CpuDevice device;
  const std::int64_t available = (static_cast<std::int64_t>(data_->val.size()) - 1) / 8;
  ASSERT_EQ(available, 10);  // 84 validation characters
  auto all = train::evaluate_language_model(*model_, initial_->run.executor, data_->val, device, 1024);
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ(all.value().tokens, 10 * 8);
  auto some = train::evaluate_language_model(*model_, initial_->run.executor, data_->val, device, 7);
  ASSERT_TRUE(some.ok()) << some.error().message;
  EXPECT_EQ(some.value().tokens, 7 * 8);
  std::vector<std::int32_t> long_text;
  for (int i = 0; i < 40 * 8 + 1; ++i) long_text.push_back(i % 7);
  auto batched = train::evaluate_language_model(*model_, initial_->run.executor, long_text, device, 1024);
  ASSERT_TRUE(batched.ok()) << batched.error().message;
  EXPECT_EQ(batched.value().tokens, 32 * 8) << "40 windows, evaluated in whole batches of 32";

  const std::vector<std::int32_t> short_text(8, 0);
  auto refused = train::evaluate_language_model(*model_, initial_->run.executor, short_text, device, 1024);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("shorter than one sequence of 8"), std::string::npos)
      << refused.error().message;
}

TEST_F(LanguageModel, GenerateDrawsFromTheSeedAndNeedsABatchOneGraph) {
  models::ModelOptions eval = *model_;
  eval.training = false;
  const graph::Graph one = models::build_forward(eval, 1).value();
  testing::CpuRun run(one);
  run.executor.initialize_persistent(3);  // near-uniform predictions: every seed its own text
  train::SampleOptions options;
  options.tokens = 40;
  options.temperature = 1.0;
  options.seed = 11;
  const auto a = train::generate(run.executor, {0, 1}, options).value();
  const auto b = train::generate(run.executor, {0, 1}, options).value();
  options.seed = 12;
  const auto c = train::generate(run.executor, {0, 1}, options).value();
  EXPECT_EQ(a.size(), 40u) << "the new tokens only";
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (std::int32_t t : a) EXPECT_TRUE(t >= 0 && t < 7) << t;

  options.temperature = 0.0;  // the most likely token: the seed does not matter
  options.seed = 1;
  const auto greedy = train::generate(run.executor, {}, options).value();
  options.seed = 2;
  EXPECT_EQ(train::generate(run.executor, {}, options).value(), greedy);

  const graph::Graph four = models::build_forward(eval, 4).value();
  testing::CpuRun batched(four);
  auto refused = train::generate(batched.executor, {0}, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("batch 1"), std::string::npos) << refused.error().message;
}

TEST(GptMetadata, RoundTripsTheConfigurationAndVocabulary) {
  std::string text;
  for (int i = 0; i < 10; ++i) text += "hello, world\n\x01\xff";  // bytes outside ASCII too
  const models::TextDataset data = models::make_text_dataset(text, 4).value();
  models::GptConfig config;
  config.vocab = data.vocab_size();
  config.context = 16;
  config.layers = 3;
  config.heads = 2;
  config.width = 24;
  config.dropout = 0.1f;
  config.tied_head = false;
  const auto metadata = train::gpt_metadata(config, data);
  EXPECT_EQ(metadata.at("memplan.model"), "gpt");
  auto saved = train::parse_gpt_metadata(metadata, "m.safetensors");
  ASSERT_TRUE(saved.ok()) << saved.error().message;
  const models::GptConfig& c = saved.value().config;
  EXPECT_EQ(c.vocab, config.vocab);
  EXPECT_EQ(c.context, 16);
  EXPECT_EQ(c.layers, 3);
  EXPECT_EQ(c.heads, 2);
  EXPECT_EQ(c.width, 24);
  EXPECT_FALSE(c.tied_head);
  EXPECT_EQ(c.dropout, 0.0f) << "generation never drops";
  EXPECT_EQ(saved.value().vocab, data.vocab);
}

TEST(GptMetadata, RefusesWhatDoesNotDescribeAGptAndNamesTheSource) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "abc";
  const models::TextDataset data = models::make_text_dataset(text, 3).value();
  models::GptConfig config;
  config.vocab = data.vocab_size();
  const auto good = train::gpt_metadata(config, data);
  auto with = [&](const std::string& key, const std::string& value) {
    auto m = good;
    m[key] = value;
    return m;
  };
  auto without = [&](const std::string& key) {
    auto m = good;
    m.erase(key);
    return m;
  };
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {without("memplan.model"), "not a GPT"},
      {with("memplan.model", "mlp"), "'mlp'"},
      {without("memplan.config"), "lacks"},
      {without("memplan.vocab_hex"), "lacks"},
      {with("memplan.config", "not json"), "not a GPT configuration"},
      {with("memplan.config", R"({"vocab":3,"context":-1,"layers":1,"heads":1,"width":4,"tied_head":true})"),
       "not a GPT configuration"},
      {with("memplan.config", R"({"vocab":3,"context":8,"layers":1,"heads":1,"width":4})"), "not a GPT configuration"},
      {with("memplan.vocab_hex", "616"), "odd length"},
      {with("memplan.vocab_hex", "61zz63"), "not hexadecimal"},
      {with("memplan.vocab_hex", "6162"), "2 characters but the model 3"},
  };
  for (const auto& [metadata, expected] : cases) {
    auto r = train::parse_gpt_metadata(metadata, "bad.safetensors");
    ASSERT_FALSE(r.ok()) << expected;
    EXPECT_EQ(r.error().message.rfind("bad.safetensors: ", 0), 0u) << r.error().message;
    EXPECT_NE(r.error().message.find(expected), std::string::npos) << r.error().message;
  }
}

class GptSamplerTest : public LanguageModel {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("memplan_gpt_sampler_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    path = (dir / "gpt.safetensors").string();
    ASSERT_TRUE(train::save_run(trained_->run.executor, path, *model_, "adamw", data_.get()).ok());
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
  std::string path;
};

TEST_F(GptSamplerTest, ContinuesTheAlphabetItWasTrainedOn) {
  runtime::CpuDevice device;  // outlives the sampler, whose executor runs on it
  auto opened = train::GptSampler::open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  train::GptSampler& sampler = opened.value();
  EXPECT_EQ(sampler.saved().config.layers, 2);
  EXPECT_EQ(sampler.saved().vocab, data_->vocab);
  auto prompt = sampler.encode("cde");
  ASSERT_TRUE(prompt.ok()) << prompt.error().message;
  EXPECT_EQ(prompt.value(), (std::vector<std::int32_t>{2, 3, 4}));
  EXPECT_EQ(sampler.decode(prompt.value()), "cde");
  ASSERT_TRUE(sampler.load(device).ok());
  train::SampleOptions options;
  options.tokens = 16;
  options.temperature = 0.0;
  auto generated = sampler.generate(prompt.value(), options);
  ASSERT_TRUE(generated.ok()) << generated.error().message;
  EXPECT_EQ(sampler.decode(generated.value()), "fgabcdefgabcdefg");
}

TEST_F(GptSamplerTest, SaysWhetherTheFileOrTheDeviceFailed) {
  // The devices outlive the samplers, whose executors run on them.
  runtime::CpuDevice tiny(1024);
  runtime::CpuDevice roomy;
  auto opened = train::GptSampler::open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  train::GptSampler& sampler = opened.value();
  auto unknown = sampler.encode("abz");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("never saw in training (byte 122)"), std::string::npos)
      << unknown.error().message;

  train::GptSampler::Fault fault = train::GptSampler::Fault::input;
  ASSERT_FALSE(sampler.load(tiny, &fault).ok());
  EXPECT_EQ(fault, train::GptSampler::Fault::device);
  EXPECT_TRUE(sampler.load(roomy, &fault).ok()) << "a failed load can be retried on another device";

  // Metadata that claims one layer for weights of two: the file is at fault.
  models::GptConfig one_layer = model_->gpt;
  one_layer.layers = 1;
  const auto metadata = train::gpt_metadata(one_layer, *data_);
  const std::string mismatched = (dir / "mismatched.safetensors").string();
  ASSERT_TRUE(runtime::save_weights(trained_->run.executor, mismatched, metadata).ok());
  auto other = train::GptSampler::open(mismatched);
  ASSERT_TRUE(other.ok()) << other.error().message;
  fault = train::GptSampler::Fault::device;
  auto loaded = other.value().load(roomy, &fault);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(fault, train::GptSampler::Fault::input);
  EXPECT_NE(loaded.error().message.find("does not match"), std::string::npos) << loaded.error().message;

  auto missing = train::GptSampler::open((dir / "missing.safetensors").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing.safetensors"), std::string::npos) << missing.error().message;
}

TEST_F(GptSamplerTest, RefusesAFileThatIsNotAGpt) {
  models::ModelOptions mlp;
  mlp.mlp = {4, {}, 3};
  const graph::Graph g = models::build_forward(mlp, 2).value();
  testing::CpuRun run(g);
  const std::string mlp_path = (dir / "mlp.safetensors").string();
  ASSERT_TRUE(train::save_run(run.executor, mlp_path, mlp, "sgd", nullptr).ok());
  auto opened = train::GptSampler::open(mlp_path);
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.error().message.find("not a GPT"), std::string::npos) << opened.error().message;
}

}  // namespace
}  // namespace memplan
