// Glue between the character-level GPT and its text: batch feeding, validation loss computed by
// a forward-only graph that reads the trained weights in place, text generation, and a saved
// GPT rebuilt from its file for generation (GptSampler).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/models/gpt_decode.h"
#include "memplan/models/registry.h"
#include "memplan/models/text_dataset.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/weights.h"

namespace memplan::train {

// An encoder-decoder's windows of text (target > 0): rows of x and labels [rows, S + T - 1] (labels
// x shifted by one, as sample_text_batch draws them) as its inputs: the encoder reads the first S
// tokens, the decoder the target shifted right behind the source's last token, x[S-1, S+T-1), and
// predicts the next T tokens, labels[S-1, S+T-1). The decoder continues the encoder's text.
struct SourceTarget {
  std::vector<std::int32_t> x, decoder_x, labels;  // [rows, S], [rows, T], [rows * T]
};
void split_source_target(const std::vector<std::int32_t>& x, const std::vector<std::int32_t>& labels, std::int64_t rows,
                         std::int64_t source, std::int64_t target, SourceTarget& out);
// The decoder length an encoder-decoder config trains at (ZooOptions::target_seq, resolved by
// load_run_data); 0 for every other model.
std::int64_t text_target(const models::ModelOptions& model);

// Feeds windows of the training text at positions drawn from (seed, step): `context` tokens and
// their successors, or for an encoder-decoder (target > 0) `context` source tokens and `target`
// target tokens (split_source_target).
class TextFeeder {
 public:
  TextFeeder(const models::TextDataset& data, std::int64_t batch, std::int64_t context, std::uint64_t seed,
             std::int64_t target = 0);
  // Steps that draw as many tokens as the training split holds.
  std::int64_t steps_per_epoch() const;
  void feed(std::int64_t step_index, runtime::Executor& executor);
  // Data parallel: rank `rank` of `world` gets its equal slice of the global batch's sequences.
  void shard(int rank, int world) { rank_ = rank; world_ = world; }

 private:
  int rank_ = 0, world_ = 1;
  const models::TextDataset& data_;
  std::int64_t batch_, context_;
  std::uint64_t seed_;
  std::int64_t target_;
  std::vector<std::int32_t> x_, labels_;
  SourceTarget split_;
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
// A fine-tuned model (`lora`, `quant`) is evaluated with its adapters and quantized weights.
Result<TextEvaluation> evaluate_language_model(const models::ModelOptions& model, const runtime::Executor& trained,
                                               const std::vector<std::int32_t>& tokens, runtime::Device& device,
                                               std::int64_t max_windows, const graph::LoraConfig& lora = {},
                                               const graph::QuantConfig& quant = {});

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

// A decoder config trained on text (`memplan train --config FILE --save`): the config file's text,
// the sequence length and the vocabulary (its text's bytes), as metadata.
std::map<std::string, std::string> config_decoder_metadata(const models::ModelOptions& model, const models::TextDataset& data);
// A saved decoder, rebuilt for generation: the GPT of `train --model gpt`, or a config's (a gpt2
// config as a GPT, the rotary decoders as the LLaMA-style decoder), at the saved vocabulary and
// sequence length.
struct SavedDecoder {
  models::DecoderModel model;
  std::vector<unsigned char> vocab;  // id -> byte
};
Result<SavedDecoder> parse_decoder_metadata(const std::map<std::string, std::string>& metadata, const std::string& source);

// A GPT saved by `memplan train --model gpt --save`, rebuilt for generation: open() reads the
// file and the configuration and vocabulary in its metadata; load() builds the batch-1
// evaluation graph on a device and copies the saved weights in; generate() continues prompts.
class GptSampler {
 public:
  // What a failed load() is due to: the input (the saved configuration builds no model, or the
  // file's tensors do not fit it) or the device (setup: out of memory, a missing kernel).
  enum class Fault { input, device };

  static Result<GptSampler> open(const std::string& path);

  const SavedGpt& saved() const { return saved_; }
  // How load() builds attention (the weights are the same either way); fused unless set.
  void set_attention(models::AttentionKind kind) { saved_.config.attention = kind; }
  // The token ids of `prompt`; an Error names the first byte the vocabulary lacks.
  Result<std::vector<std::int32_t>> encode(std::string_view prompt) const;
  // The text of token ids below the vocabulary size.
  std::string decode(const std::vector<std::int32_t>& ids) const;

  // Once, after open(); `device` must outlive the sampler. On an Error, `fault` (when given) says
  // what it is due to, and load() may be called again (on another device).
  Status load(runtime::Device& device, Fault* fault = nullptr);
  // generate() above with the loaded model; returns the new tokens only.
  Result<std::vector<std::int32_t>> generate(const std::vector<std::int32_t>& prompt, const SampleOptions& options);

 private:
  GptSampler() = default;
  std::string path_;
  runtime::WeightsFile file_;  // released once load() has copied the weights
  SavedGpt saved_;
  std::unique_ptr<graph::Graph> graph_;
  std::unique_ptr<runtime::Executor> executor_;  // runs *graph_, so it is destroyed first
};

}  // namespace memplan::train
