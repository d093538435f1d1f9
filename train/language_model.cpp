#include "memplan/train/language_model.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "memplan/common/check.h"
#include "memplan/common/rng.h"
#include "memplan/models/model_source.h"
#include "memplan/planner/step_size.h"
#include "memplan/train/classifier.h"
#include "memplan/runtime/devices.h"

namespace memplan::train {

void split_source_target(const std::vector<std::int32_t>& x, const std::vector<std::int32_t>& labels, std::int64_t rows,
                         std::int64_t source, std::int64_t target, SourceTarget& out) {
  const std::int64_t span = source + target - 1;
  MEMPLAN_CHECK(static_cast<std::int64_t>(x.size()) == rows * span && labels.size() == x.size(), "source/target windows");
  out.x.resize(static_cast<std::size_t>(rows * source));
  out.decoder_x.resize(static_cast<std::size_t>(rows * target));
  out.labels.resize(out.decoder_x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = x.begin() + r * span, row_labels = labels.begin() + r * span;
    std::copy(row, row + source, out.x.begin() + r * source);
    std::copy(row + source - 1, row + span, out.decoder_x.begin() + r * target);
    std::copy(row_labels + source - 1, row_labels + span, out.labels.begin() + r * target);
  }
}

std::int64_t text_target(const models::ModelOptions& model) {
  return model.config && model.config->encoder_decoder() ? model.zoo.target_seq : 0;
}

TextFeeder::TextFeeder(const models::TextDataset& data, std::int64_t batch, std::int64_t context, std::uint64_t seed,
                       std::int64_t target)
    : data_(data), batch_(batch), context_(context), seed_(seed), target_(target) {}

std::int64_t TextFeeder::steps_per_epoch() const {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(data_.train.size()) / (batch_ * (context_ + target_)));
}

namespace {
void set_ids(runtime::Executor& executor, const char* name, const std::vector<std::int32_t>& ids, std::int64_t first,
             std::int64_t count) {
  executor.set_input(executor.graph().find(name), ids.data() + first, static_cast<Bytes>(count) * sizeof(std::int32_t));
}
}  // namespace

void TextFeeder::feed(std::int64_t step_index, runtime::Executor& executor) {
  const std::int64_t rows = batch_ / world_, first_row = rows * rank_;
  if (target_ == 0) {
    models::sample_text_batch(data_.train, batch_, context_, seed_, step_index, x_, labels_);
    set_ids(executor, "x", x_, first_row * context_, rows * context_);
    set_ids(executor, "labels", labels_, first_row * context_, rows * context_);
    return;
  }
  models::sample_text_batch(data_.train, batch_, context_ + target_ - 1, seed_, step_index, x_, labels_);
  split_source_target(x_, labels_, batch_, context_, target_, split_);
  set_ids(executor, "x", split_.x, first_row * context_, rows * context_);
  set_ids(executor, "decoder_x", split_.decoder_x, first_row * target_, rows * target_);
  set_ids(executor, "labels", split_.labels, first_row * target_, rows * target_);
}

double unigram_entropy(const std::vector<std::int32_t>& tokens, std::int64_t vocab) {
  std::vector<double> counts(static_cast<std::size_t>(vocab), 0.0);
  for (std::int32_t t : tokens) counts[static_cast<std::size_t>(t)] += 1.0;
  double h = 0.0;
  for (double c : counts) {
    if (c > 0) {
      const double p = c / double(tokens.size());
      h -= p * std::log(p);
    }
  }
  return h;
}

namespace {

// An executor for the evaluation graph that reads `trained`'s parameters in place.
Status bind_trained_weights(runtime::Executor& exec, const runtime::Executor& trained) {
  const graph::Graph& g = exec.graph();
  for (TensorId p = 0; p < g.num_tensors(); ++p) {
    if (!graph::is_persistent(g.tensor(p).role)) continue;
    const TensorId trained_id = trained.graph().find(g.tensor(p).name);
    if (trained_id == kNoTensor) return Error{"tensor '" + g.tensor(p).name + "' is not in the trained graph"};
    exec.bind_external(p, trained.storage(trained_id));
  }
  return exec.setup();
}

}  // namespace

Result<TextEvaluation> evaluate_language_model(const models::ModelOptions& model, const runtime::Executor& trained,
                                               const std::vector<std::int32_t>& tokens, runtime::Device& device,
                                               std::int64_t max_windows, const graph::LoraConfig& lora,
                                               const graph::QuantConfig& quant) {
  // A window: T tokens and their successors, or an encoder-decoder's source and target
  // (split_source_target), whose successors are the target.
  const std::int64_t target = text_target(model);
  const std::int64_t T = target > 0 ? model.gpt.context + target - 1 : model.gpt.context;
  const std::int64_t available = (static_cast<std::int64_t>(tokens.size()) - 1) / T;
  if (available < 1) return Error{"the validation text is shorter than one sequence of " + std::to_string(T)};
  std::int64_t windows = std::min(available, max_windows);
  const std::int64_t batch = std::min<std::int64_t>(32, windows);
  windows = windows / batch * batch;
  const std::int64_t stride = available / windows * T;  // evenly spread over the whole split

  models::ModelOptions eval_model = model;
  eval_model.training = false;
  planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(eval_model), batch);
  step.dtype = working_dtype(trained.graph());  // the trained tensors' dtype, read in place
  step.lora = lora;
  step.lora.dropout = 0.0f;  // evaluation: no dropout
  step.quant = quant;
  auto planned = runtime::plan_step_for(step, device);
  if (!planned) return planned.error();
  const graph::Graph& g = planned.value().graph;
  runtime::Executor exec(planned.value(), device, runtime::ExecutorOptions{trained.mode()});
  if (Status s = bind_trained_weights(exec, trained); !s) return s.error();

  std::vector<std::int32_t> x(static_cast<std::size_t>(batch * T)), labels(x.size());
  double loss_sum = 0.0;
  for (std::int64_t w = 0; w < windows; w += batch) {
    for (std::int64_t i = 0; i < batch; ++i) {
      const auto start = static_cast<std::size_t>((w + i) * stride);
      for (std::int64_t t = 0; t < T; ++t) {
        x[static_cast<std::size_t>(i * T + t)] = tokens[start + static_cast<std::size_t>(t)];
        labels[static_cast<std::size_t>(i * T + t)] = tokens[start + static_cast<std::size_t>(t) + 1];
      }
    }
    if (target > 0) {
      SourceTarget split;
      split_source_target(x, labels, batch, model.gpt.context, target, split);
      set_ids(exec, "x", split.x, 0, static_cast<std::int64_t>(split.x.size()));
      set_ids(exec, "decoder_x", split.decoder_x, 0, static_cast<std::int64_t>(split.decoder_x.size()));
      set_ids(exec, "labels", split.labels, 0, static_cast<std::int64_t>(split.labels.size()));
    } else {
      set_ids(exec, "x", x, 0, static_cast<std::int64_t>(x.size()));
      set_ids(exec, "labels", labels, 0, static_cast<std::int64_t>(labels.size()));
    }
    if (Status s = exec.run_step(); !s) return s.error();
    loss_sum += double(exec.read_scalar(g.loss));
  }
  return TextEvaluation{loss_sum / double(windows / batch), windows * (target > 0 ? target : T)};
}

Result<std::vector<std::int32_t>> generate(runtime::Executor& executor, std::vector<std::int32_t> prompt,
                                           const SampleOptions& options) {
  const graph::Graph& g = executor.graph();
  const graph::TensorDesc& logits_desc = g.tensor(g.output);
  const std::int64_t T = g.tensor(g.find("x")).shape[1];
  const std::int64_t V = logits_desc.shape[1];
  if (logits_desc.shape[0] != T) return Error{"text generation needs a graph of batch 1"};
  if (prompt.empty()) prompt.push_back(0);
  Rng rng(options.seed * 0x9e3779b97f4a7c15ULL + 0x5a17);
  std::vector<std::int32_t> context(static_cast<std::size_t>(T), 0), labels(static_cast<std::size_t>(T), 0);
  std::vector<float> logits(static_cast<std::size_t>(T * V));
  std::vector<double> probs(static_cast<std::size_t>(V));
  std::vector<std::int32_t> text = prompt, generated;
  for (std::int64_t n = 0; n < options.tokens; ++n) {
    // The last T tokens at positions 0..len-1; causal attention makes the padding after them irrelevant.
    const auto len = static_cast<std::int64_t>(std::min<std::size_t>(text.size(), static_cast<std::size_t>(T)));
    std::fill(context.begin(), context.end(), 0);
    std::copy(text.end() - len, text.end(), context.begin());
    executor.set_input(g.find("x"), context.data(), static_cast<Bytes>(context.size() * sizeof(std::int32_t)));
    executor.set_input(g.find("labels"), labels.data(), static_cast<Bytes>(labels.size() * sizeof(std::int32_t)));
    if (Status s = executor.run_step(); !s) return s.error();
    executor.read_values(g.output, logits.data());
    const float* row = &logits[static_cast<std::size_t>((len - 1) * V)];
    std::int32_t next = 0;
    if (options.temperature == 0.0) {
      next = static_cast<std::int32_t>(std::max_element(row, row + V) - row);
    } else {
      const float top = *std::max_element(row, row + V);
      double total = 0.0;
      for (std::int64_t v = 0; v < V; ++v) {
        probs[static_cast<std::size_t>(v)] = std::exp((double(row[v]) - double(top)) / options.temperature);
        total += probs[static_cast<std::size_t>(v)];
      }
      double u = double(rng.uniform01()) * total;
      next = static_cast<std::int32_t>(V - 1);
      for (std::int64_t v = 0; v < V; ++v) {
        u -= probs[static_cast<std::size_t>(v)];
        if (u <= 0.0) {
          next = static_cast<std::int32_t>(v);
          break;
        }
      }
    }
    text.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

namespace {

std::string hex_of(const std::vector<unsigned char>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The vocabulary (id -> byte) a run saved as metadata memplan.vocab_hex.
Result<std::vector<unsigned char>> vocab_from_hex(const std::string& hex, const std::string& source) {
  if (hex.empty() || hex.size() % 2 != 0) return Error{source + ": metadata memplan.vocab_hex is empty or has an odd length"};
  std::vector<unsigned char> vocab;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return Error{source + ": metadata memplan.vocab_hex is not hexadecimal"};
    vocab.push_back(static_cast<unsigned char>(hi * 16 + lo));
  }
  return vocab;
}

}  // namespace

std::map<std::string, std::string> config_decoder_metadata(const models::ModelOptions& model, const models::TextDataset& data) {
  MEMPLAN_CHECK(model.config.has_value(), "config_decoder_metadata of a model without a config");
  return {{"memplan.model", model.name},
          {"memplan.hf_config", model.config->text},
          {"memplan.context", std::to_string(model.gpt.context)},
          {"memplan.vocab_hex", hex_of(data.vocab)}};
}

Result<SavedDecoder> parse_decoder_metadata(const std::map<std::string, std::string>& metadata, const std::string& source) {
  auto get = [&](const char* key) -> const std::string* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  const std::string* model = get("memplan.model");
  const std::string* config_text = get("memplan.hf_config");
  if (config_text == nullptr) {
    if (model == nullptr || *model != "gpt") {
      return Error{source + ": not a decoder saved by 'memplan train --model gpt --save' or 'memplan train --config FILE "
                            "--save' (metadata memplan.model is " +
                   (model ? "'" + *model + "'" : std::string("missing")) + ", and there is no memplan.hf_config)"};
    }
    auto gpt = parse_gpt_metadata(metadata, source);
    if (!gpt) return gpt.error();
    return SavedDecoder{gpt.value().config, std::move(gpt.value().vocab)};
  }
  auto parsed = models::parse_hf_config(*config_text, source + " (metadata memplan.hf_config)");
  if (!parsed) return parsed.error();
  models::HfConfig c = std::move(parsed).value();
  if (c.family != models::HfFamily::gpt2 && c.family != models::HfFamily::llama) {
    return Error{source + ": the saved config is a " + c.model_type + ", not a decoder that generates text"};
  }
  const std::string* context_text = get("memplan.context");
  const std::string* vocab_hex = get("memplan.vocab_hex");
  if (context_text == nullptr || vocab_hex == nullptr) return Error{source + ": metadata lacks memplan.context or memplan.vocab_hex"};
  std::int64_t context = 0;
  try {
    std::size_t used = 0;
    context = std::stoll(*context_text, &used);
    if (used != context_text->size()) context = 0;
  } catch (const std::exception&) {
    context = 0;
  }
  if (context < 1 || (c.learned_positions && context > c.positions)) {
    return Error{source + ": metadata memplan.context '" + context_text->substr(0, 40) + "' is not a sequence length the config takes"};
  }
  auto vocab = vocab_from_hex(*vocab_hex, source);
  if (!vocab) return vocab.error();
  const auto V = static_cast<std::int64_t>(vocab.value().size());
  if (c.family == models::HfFamily::gpt2) {
    c.gpt.vocab = V;
  } else {
    c.llama.vocab = V;
  }
  // The file, not the user, chose these sizes: a hostile one must not make a graph too large to hold.
  models::ModelOptions sizes;
  sizes.name = source;
  sizes.config = c;
  sizes.zoo.seq = context;
  sizes.training = false;
  if (Status s = planner::check_step_size(planner::StepDescription::of_source(models::registry_source(sizes), 1)); !s) {
    return Error{source + ": the saved config describes a model that cannot be represented: " + s.error().message};
  }
  if (c.family == models::HfFamily::gpt2) {
    c.gpt.context = context;
    c.gpt.dropout = 0.0f;  // generation never drops
    return SavedDecoder{c.gpt, std::move(vocab).value()};
  }
  c.llama.context = context;
  return SavedDecoder{c.llama, std::move(vocab).value()};
}

std::map<std::string, std::string> gpt_metadata(const models::GptConfig& config, const models::TextDataset& data) {
  nlohmann::json c = {{"vocab", config.vocab},   {"context", config.context}, {"layers", config.layers},
                      {"heads", config.heads},   {"width", config.width},     {"dropout", config.dropout},
                      {"tied_head", config.tied_head}};
  return {{"memplan.model", "gpt"}, {"memplan.config", c.dump()}, {"memplan.vocab_hex", hex_of(data.vocab)}};
}

Result<SavedGpt> parse_gpt_metadata(const std::map<std::string, std::string>& metadata, const std::string& source) {
  auto get = [&](const char* key) -> const std::string* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  const std::string* model = get("memplan.model");
  if (model == nullptr || *model != "gpt") {
    return Error{source + ": not a GPT saved by 'memplan train --model gpt --save' (metadata memplan.model is " +
                 (model ? "'" + *model + "'" : std::string("missing")) + ")"};
  }
  const std::string* config_text = get("memplan.config");
  const std::string* vocab_hex = get("memplan.vocab_hex");
  if (config_text == nullptr || vocab_hex == nullptr) return Error{source + ": metadata lacks memplan.config or memplan.vocab_hex"};
  nlohmann::json c = nlohmann::json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
  SavedGpt saved;
  auto integer = [&](const char* key, std::int64_t& out) {
    if (!c.is_object() || !c.contains(key) || !c[key].is_number_integer() || c[key].get<std::int64_t>() <= 0) return false;
    out = c[key].get<std::int64_t>();
    return true;
  };
  if (!integer("vocab", saved.config.vocab) || !integer("context", saved.config.context) ||
      !integer("layers", saved.config.layers) || !integer("heads", saved.config.heads) ||
      !integer("width", saved.config.width) || !c.contains("tied_head") || !c["tied_head"].is_boolean()) {
    return Error{source + ": metadata memplan.config is not a GPT configuration: " + *config_text};
  }
  saved.config.tied_head = c["tied_head"].get<bool>();
  saved.config.dropout = 0.0f;  // generation never drops
  auto vocab = vocab_from_hex(*vocab_hex, source);
  if (!vocab) return vocab.error();
  saved.vocab = std::move(vocab).value();
  if (static_cast<std::int64_t>(saved.vocab.size()) != saved.config.vocab) {
    return Error{source + ": the vocabulary has " + std::to_string(saved.vocab.size()) + " characters but the model " +
                 std::to_string(saved.config.vocab)};
  }
  // The file, not the user, chose these sizes: a hostile one must not make a graph too large to hold.
  models::ModelOptions sizes;
  sizes.name = "gpt";
  sizes.gpt = saved.config;
  sizes.gpt.attention = models::AttentionKind::materialized;  // the larger form: sample may pick either
  sizes.training = false;
  if (Status s = planner::check_step_size(planner::StepDescription::of_source(models::registry_source(sizes), 1)); !s) {
    return Error{source + ": metadata memplan.config describes a model that cannot be represented: " + s.error().message};
  }
  return saved;
}

Result<GptSampler> GptSampler::open(const std::string& path) {
  auto file = runtime::read_weights_file(path);
  if (!file) return file.error();
  auto saved = parse_gpt_metadata(file.value().view.metadata, path);
  if (!saved) return saved.error();
  GptSampler sampler;
  sampler.path_ = path;
  sampler.file_ = std::move(file).value();
  sampler.saved_ = std::move(saved).value();
  return sampler;
}

Result<std::vector<std::int32_t>> GptSampler::encode(std::string_view prompt) const {
  const std::vector<unsigned char>& vocab = saved_.vocab;
  std::vector<std::int32_t> ids;
  for (char ch : prompt) {
    const auto it = std::find(vocab.begin(), vocab.end(), static_cast<unsigned char>(ch));
    if (it == vocab.end()) {
      return Error{"the prompt has a character the model never saw in training (byte " +
                   std::to_string(int(static_cast<unsigned char>(ch))) + "); its vocabulary has " +
                   std::to_string(vocab.size()) + " characters"};
    }
    ids.push_back(static_cast<std::int32_t>(it - vocab.begin()));
  }
  return ids;
}

std::string GptSampler::decode(const std::vector<std::int32_t>& ids) const {
  std::string text;
  for (std::int32_t id : ids) text.push_back(static_cast<char>(saved_.vocab[static_cast<std::size_t>(id)]));
  return text;
}

Status GptSampler::load(runtime::Device& device, Fault* fault) {
  MEMPLAN_CHECK(file_.bytes != nullptr, "GptSampler::load() after a successful load()");
  auto fail = [&](Fault why, const Error& error) -> Status {
    executor_.reset();
    graph_.reset();
    if (fault != nullptr) *fault = why;
    return error;
  };
  models::ModelOptions model;
  model.name = "gpt";
  model.gpt = saved_.config;
  model.training = false;
  planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(model), 1);
  // Generation computes at the precision the model trained at: a mixed-precision run saved its
  // 16-bit working copies beside their f32 master copies.
  for (const runtime::SafetensorsEntry& e : file_.view.tensors) {
    const std::string suffix = ".master";
    if (e.name.size() <= suffix.size() || e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    if (const runtime::SafetensorsEntry* working = file_.view.find(e.name.substr(0, e.name.size() - suffix.size()))) {
      step.dtype = working->dtype;
      break;
    }
  }
  auto planned = runtime::plan_step_for(step, device);
  if (!planned) return fail(Fault::input, planned.error());
  graph_ = std::make_unique<graph::Graph>(std::move(planned.value().graph));
  executor_ = std::make_unique<runtime::Executor>(*graph_, std::move(planned.value().plan), device);
  if (Status s = executor_->setup(); !s) return fail(Fault::device, s.error());
  auto loaded = runtime::load_weights(*executor_, file_, path_);
  if (!loaded) return fail(Fault::input, loaded.error());
  file_ = {};  // the weights live in the executor now
  return Status::success();
}

Result<std::vector<std::int32_t>> GptSampler::generate(const std::vector<std::int32_t>& prompt,
                                                       const SampleOptions& options) {
  MEMPLAN_CHECK(executor_ != nullptr, "GptSampler::generate() before load()");
  return train::generate(*executor_, prompt, options);
}

}  // namespace memplan::train
