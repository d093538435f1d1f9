// The trainable reference models by name, as the CLI selects them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/models/cnn.h"
#include "memplan/models/gpt.h"
#include "memplan/models/mlp.h"

namespace memplan::models {

struct ModelOptions {
  std::string name = "mlp";
  MlpConfig mlp;  // used when name == "mlp"
  CnnConfig cnn;  // used when name == "cnn"
  GptConfig gpt;  // used when name == "gpt"
  // false builds the evaluation graph (batch norm from running statistics, no dropout).
  bool training = true;
};

std::vector<std::string> trainable_model_names();
// Every model build_forward knows (the trainable ones plus those `memplan train` cannot feed yet).
std::vector<std::string> model_names();

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

}  // namespace memplan::models
