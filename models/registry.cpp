#include "memplan/models/registry.h"

namespace memplan::models {

const std::vector<ModelInfo>& model_registry() {
  static const std::vector<ModelInfo> kModels = [] {
    std::vector<ModelInfo> models = {
        {"mlp", "MLP on Fashion-MNIST (784-256-256-10 by default)", true, false, 128},
        {"cnn", "small ResNet (16/32/64 channels) on Fashion-MNIST", true, true, 64},
        {"gpt", "character-level GPT-2-style decoder (2 blocks, width 128, context 64)", true, false, 32},
    };
    for (const ZooModel& z : zoo_models()) models.push_back({z.name, z.summary, false, z.vision, z.default_batch});
    return models;
  }();
  return kModels;
}

const ModelInfo* find_model(const std::string& name) {
  for (const ModelInfo& m : model_registry()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

bool has_attention(const std::string& name) {
  if (name == "gpt") return true;
  const ZooModel* zoo = find_zoo_model(name);
  return zoo != nullptr && !zoo->config_file.empty();  // every shipped config is a transformer
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelInfo& m : model_registry()) names.push_back(m.name);
  return names;
}

std::vector<std::string> trainable_model_names() {
  std::vector<std::string> names;
  for (const ModelInfo& m : model_registry()) {
    if (m.trainable) names.push_back(m.name);
  }
  return names;
}

TrainDefaults train_defaults(const std::string& model) {
  // cnn, measured on 2 shared cores: batch 128 lr 2e-3 4 epochs 88.9% (706 s); batch 64 lr 1e-3
  // 4 epochs 89.7% (491 s); the fifth epoch is for the 90% target.
  if (model == "cnn") return {5, 64, 1e-3};
  if (model == "gpt") return {0, 32, 3e-3, 3000};
  return {};
}

graph::TensorParallel tensor_parallel_of(const ModelOptions& options) {
  return options.name == "gpt" && !options.config ? options.gpt.tensor_parallel : options.zoo.tensor_parallel;
}

void set_tensor_parallel(ModelOptions& options, graph::TensorParallel tp) {
  options.gpt.tensor_parallel = tp;
  options.zoo.tensor_parallel = tp;
}

graph::ExpertParallel expert_parallel_of(const ModelOptions& options) { return options.zoo.expert_parallel; }

void set_expert_parallel(ModelOptions& options, graph::ExpertParallel ep) { options.zoo.expert_parallel = ep; }

graph::Graph build_forward_or_throw(const ModelOptions& options, std::int64_t batch) {
  if (options.config) return build_hf_forward(*options.config, batch, options.zoo, options.training);
  if ((options.name == "mlp" || options.name == "cnn") && tensor_parallel_of(options).active()) {
    throw graph::GraphError("--tensor-parallel splits the decoders' attention and MLP layers (gpt and the zoo's and "
                            "configs' decoders); " + options.name + " has none");
  }
  if (options.zoo.expert_parallel.active() && (options.name == "mlp" || options.name == "cnn" || options.name == "gpt")) {
    throw graph::GraphError("--expert-parallel splits a mixture of experts' experts; " + options.name + " has none");
  }
  if (options.name == "mlp") return build_mlp(options.mlp, batch);
  if (options.name == "cnn") return build_cnn(options.cnn, batch, options.training);
  if (options.name == "gpt") return build_gpt(options.gpt, batch, options.training);
  if (find_zoo_model(options.name) != nullptr) return build_zoo_forward_or_throw(options.name, batch, options.zoo);
  std::string known;
  for (const std::string& name : model_names()) known += (known.empty() ? "" : ", ") + name;
  throw graph::GraphError("unknown model '" + options.name + "' (models: " + known + ")");
}

Result<graph::Graph> build_forward(const ModelOptions& options, std::int64_t batch) {
  if (!options.config && find_model(options.name) == nullptr) {
    std::string known;
    for (const std::string& name : model_names()) known += (known.empty() ? "" : ", ") + name;
    return Error{"unknown model '" + options.name + "' (models: " + known + ")"};
  }
  try {
    return build_forward_or_throw(options, batch);
  } catch (const graph::GraphError& e) {
    return Error{"model '" + options.name + "': " + e.what()};
  }
}

}  // namespace memplan::models
