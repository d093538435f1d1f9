// The trainable reference models by name, as the CLI selects them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "graph/graph.h"
#include "models/mlp.h"

namespace memplan::models {

struct ModelOptions {
  std::string name = "mlp";
  MlpConfig mlp;  // used when name == "mlp"
};

std::vector<std::string> trainable_model_names();

// The forward graph (with loss and output) for `batch` samples, or an Error naming what is wrong
// with the options.
Result<graph::Graph> build_forward(const ModelOptions& options, std::int64_t batch);

}  // namespace memplan::models
