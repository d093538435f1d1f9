// Glue between the character-level GPT and its text: batch feeding, validation loss computed by
// a forward-only graph that reads the trained weights in place, and text generation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/models/registry.h"
#include "memplan/models/text_dataset.h"
#include "memplan/runtime/executor.h"

namespace memplan::train {

// Feeds windows of the training text at positions drawn from (seed, step).
class TextFeeder {
 public:
  TextFeeder(const models::TextDataset& data, std::int64_t batch, std::int64_t context, std::uint64_t seed);
  // Steps that draw as many tokens as the training split holds.
  std::int64_t steps_per_epoch() const;
  void feed(std::int64_t step_index, runtime::Executor& executor);

 private:
  const models::TextDataset& data_;
  std::int64_t batch_, context_;
  std::uint64_t seed_;
  std::vector<std::int32_t> x_, labels_;
};

// The unigram entropy of `tokens` in nats: the loss of a model that knows only character
// frequencies, the scale a language model's loss is read against.
double unigram_entropy(const std::vector<std::int32_t>& tokens, std::int64_t vocab);

struct TextEvaluation {
  double mean_loss = 0.0;  // nats per character
  std::int64_t tokens = 0;
};

// Mean next-character cross-entropy over up to `max_windows` evenly spaced, non-overlapping
// windows of `tokens`, with the parameters of `trained` (evaluation graph: no dropout).
Result<TextEvaluation> evaluate_language_model(const models::ModelOptions& model, const runtime::Executor& trained,
                                               const std::vector<std::int32_t>& tokens, runtime::Device& device,
                                               std::int64_t max_windows);

struct SampleOptions {
  std::int64_t tokens = 200;
  double temperature = 0.8;  // 0: always the most likely character
  std::uint64_t seed = 0;
};

// Continues `prompt` (token ids, may be empty) with `options.tokens` tokens drawn from a
// batch-1 evaluation graph run by `executor`; returns the new tokens only.
Result<std::vector<std::int32_t>> generate(runtime::Executor& executor, std::vector<std::int32_t> prompt,
                                           const SampleOptions& options);

// What a saved GPT needs besides its weights to be rebuilt and to decode its tokens: the
// configuration and the vocabulary, as safetensors metadata (strings).
std::map<std::string, std::string> gpt_metadata(const models::GptConfig& config, const models::TextDataset& data);
struct SavedGpt {
  models::GptConfig config;
  std::vector<unsigned char> vocab;  // id -> byte
};
Result<SavedGpt> parse_gpt_metadata(const std::map<std::string, std::string>& metadata, const std::string& source);

}  // namespace memplan::train
