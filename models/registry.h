// Every model memplan can build, by name, in one table: the trainable reference models (MLP, CNN,
// GPT, which `memplan train` feeds with real data) and the zoo of published architectures
// (planning only, models/zoo.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/models/cnn.h"
#include "memplan/models/gpt.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/mlp.h"
#include "memplan/models/zoo.h"

namespace memplan::models {

struct ModelOptions {
  std::string name = "mlp";
  MlpConfig mlp;  // used when name == "mlp"
  CnnConfig cnn;  // used when name == "cnn"
  GptConfig gpt;  // used when name == "gpt"
  ZooOptions zoo;  // used for the zoo models and configs (sequence length, image size, dtype)
  // A Hugging Face config (--config): when set, it is the model, built with `zoo`'s sizes, and
  // `name` only labels it.
  std::optional<HfConfig> config;
  // false builds the evaluation graph (batch norm from running statistics, no dropout).
  bool training = true;
};

struct ModelInfo {
  std::string name;
  std::string summary;
  bool trainable = false;  // `memplan train` has data and kernels for it; otherwise planning only
  bool vision = false;     // images in (--image-size); otherwise tokens (--seq), or features (mlp)
  std::int64_t default_batch = 8;
};

// The tensor-parallel slice `options` build (graph/tensor_parallel.h): the GPT's own config's,
// else the zoo's and configs' (ZooOptions). Setting it sets both.
graph::TensorParallel tensor_parallel_of(const ModelOptions& options);
void set_tensor_parallel(ModelOptions& options, graph::TensorParallel tp);
// The expert-parallel share `options` build (graph/expert_parallel.h; the zoo's and configs'
// mixtures of experts).
graph::ExpertParallel expert_parallel_of(const ModelOptions& options);
void set_expert_parallel(ModelOptions& options, graph::ExpertParallel ep);

const std::vector<ModelInfo>& model_registry();
// Whether the model has attention blocks (--attention applies): gpt and the zoo's transformers.
bool has_attention(const std::string& name);
const ModelInfo* find_model(const std::string& name);  // nullptr when unknown
std::vector<std::string> model_names();                // every model build_forward knows
std::vector<std::string> trainable_model_names();

// What `memplan train` uses when a flag is not given: each model has its own sensible defaults.
struct TrainDefaults {
  std::int64_t epochs = 5;
  std::int64_t batch = 128;
  double lr = 1e-3;
  std::int64_t steps = 0;  // when set, a step count replaces epochs (text models sample windows)
};
TrainDefaults train_defaults(const std::string& model);

// The forward graph (with loss and output) for `batch` samples, or an Error naming what is wrong
// with the options.
Result<graph::Graph> build_forward(const ModelOptions& options, std::int64_t batch);
// The same, throwing graph::GraphError instead (graph::SizeError when the sizes cannot be
// represented): for callers that tell a model too large from an inconsistent one.
graph::Graph build_forward_or_throw(const ModelOptions& options, std::int64_t batch);

}  // namespace memplan::models
