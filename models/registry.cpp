#include "memplan/models/registry.h"

namespace memplan::models {

std::vector<std::string> trainable_model_names() { return {"mlp", "cnn", "gpt"}; }

std::vector<std::string> model_names() { return {"mlp", "cnn", "gpt"}; }  // the zoo: models/zoo.h

TrainDefaults train_defaults(const std::string& model) {
  // cnn, measured on 2 shared cores: batch 128 lr 2e-3 4 epochs 88.9% (706 s); batch 64 lr 1e-3
  // 4 epochs 89.7% (491 s); the fifth epoch is for the 90% target.
  if (model == "cnn") return {5, 64, 1e-3};
  if (model == "gpt") return {0, 32, 3e-3, 3000};
  return {};
}

Result<graph::Graph> build_forward(const ModelOptions& options, std::int64_t batch) {
  try {
    if (options.name == "mlp") return build_mlp(options.mlp, batch);
    if (options.name == "cnn") return build_cnn(options.cnn, batch, options.training);
    if (options.name == "gpt") return build_gpt(options.gpt, batch, options.training);
  } catch (const graph::GraphError& e) {
    return Error{"model '" + options.name + "': " + e.what()};
  }
  std::string known;
  for (const std::string& name : model_names()) known += (known.empty() ? "" : ", ") + name;
  return Error{"unknown model '" + options.name + "' (models: " + known + ")"};
}

}  // namespace memplan::models
