#include "memplan/models/zoo.h"

#include <map>
#include <mutex>

#include "memplan/common/check.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/resnet.h"

namespace memplan::models {
namespace {

// The zoo's names for the shipped configs. default_seq 0 takes the config's positions. Rotary
// models whose configs allow far longer contexts (131072 positions) default to a length people
// train them at: Llama-3.1-8B its pretraining context 8192, Mistral-7B its sliding window 4096,
// Qwen2.5-7B 4096, Llama-3.2-1B 2048; --seq sets any other.
struct ZooEntry {
  const char* name;
  const char* config_file;
  const char* title;
  std::int64_t default_seq;
  std::int64_t default_batch;
};
constexpr ZooEntry kEntries[] = {
    {"gpt2", "gpt2.json", "GPT-2 124M", 0, 8},
    {"gpt2-medium", "gpt2-medium.json", "GPT-2 355M", 0, 8},
    {"gpt2-large", "gpt2-large.json", "GPT-2 774M", 0, 8},
    {"gpt2-xl", "gpt2-xl.json", "GPT-2 1.5B", 0, 8},
    {"llama-1b", "llama-3.2-1b.json", "Llama-3.2-1B", 2048, 8},
    {"llama3.1-8b", "llama-3.1-8b.json", "Llama-3.1-8B", 8192, 8},
    {"llama2-7b", "llama-2-7b.json", "Llama-2-7B", 0, 8},
    {"llama2-13b", "llama-2-13b.json", "Llama-2-13B", 0, 8},
    {"llama2-70b", "llama-2-70b.json", "Llama-2-70B", 0, 8},
    {"mistral-7b", "mistral-7b-v0.1.json", "Mistral-7B-v0.1", 4096, 8},
    {"qwen2.5-7b", "qwen2.5-7b.json", "Qwen2.5-7B", 4096, 8},
    {"qwen3-0.6b", "qwen3-0.6b.json", "Qwen3-0.6B", 4096, 8},
    {"qwen3-8b", "qwen3-8b.json", "Qwen3-8B", 4096, 8},
    {"gemma-2b", "gemma-2b.json", "Gemma-2B", 0, 8},
    {"gemma-7b", "gemma-7b.json", "Gemma-7B", 0, 8},
    {"gemma2-9b", "gemma-2-9b.json", "Gemma-2-9B", 4096, 8},
    {"gemma3-1b", "gemma-3-1b-it.json", "Gemma-3-1B-it (five local layers to one global)", 4096, 8},
    {"phi3-mini", "phi-3-mini-4k.json", "Phi-3-mini-4k", 0, 8},
    {"olmo2-7b", "olmo-2-7b.json", "OLMo-2-1124-7B", 0, 8},
    {"pythia-160m", "pythia-160m.json", "Pythia-160M (GPT-NeoX)", 0, 8},
    {"pythia-6.9b", "pythia-6.9b.json", "Pythia-6.9B (GPT-NeoX)", 0, 8},
    {"falcon-7b", "falcon-7b.json", "Falcon-7B", 0, 8},
    {"opt-125m", "opt-125m.json", "OPT-125M (learned positions)", 0, 8},
    {"santacoder", "santacoder.json", "SantaCoder 1.1B (GPT-BigCode, multi-query)", 0, 8},
    {"mixtral-8x7b", "mixtral-8x7b.json", "Mixtral-8x7B (mixture of experts)", 4096, 8},
    {"qwen1.5-moe", "qwen1.5-moe-a2.7b.json", "Qwen1.5-MoE-A2.7B (mixture of experts)", 4096, 8},
    {"qwen3-30b-a3b", "qwen3-30b-a3b.json", "Qwen3-30B-A3B (mixture of experts)", 4096, 8},
    {"deepseek-v3", "deepseek-v3.json", "DeepSeek-V3 (latent attention, 256 experts)", 4096, 8},
    {"t5-small", "t5-small.json", "T5-small (encoder-decoder)", 0, 8},
    {"t5-base", "t5-base.json", "T5-base (encoder-decoder)", 0, 8},
    {"flan-t5-base", "flan-t5-base.json", "Flan-T5-base (encoder-decoder)", 0, 8},
    {"flan-t5-xl", "flan-t5-xl.json", "Flan-T5-XL (encoder-decoder)", 0, 8},
    {"bert-base", "bert-base-uncased.json", "BERT-base with the MLM head", 0, 8},
    {"vit-b16", "vit-base-patch16-224.json", "ViT-B/16", 0, 32},
};

// Shipped configs parse once; a shipped config that does not parse is a defect of the build.
const HfConfig& parsed(const std::string& file) {
  static std::mutex mutex;
  static std::map<std::string, HfConfig> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(file);
  if (it == cache.end()) {
    Result<HfConfig> c = shipped_config(file);
    MEMPLAN_CHECK(c.ok(), c.error().message);
    it = cache.emplace(file, std::move(c).value()).first;
  }
  return it->second;
}

}  // namespace

const std::vector<ZooModel>& zoo_models() {
  static const std::vector<ZooModel> kModels = [] {
    std::vector<ZooModel> models;
    for (const ZooEntry& e : kEntries) {
      const HfConfig& c = parsed(e.config_file);
      ZooModel m;
      m.name = e.name;
      m.summary = std::string(e.title) + " (" + e.config_file + "): " + c.describe();
      m.vision = c.vision();
      m.encoder_decoder = c.encoder_decoder();
      m.default_seq = c.vision() ? 0 : (e.default_seq > 0 ? e.default_seq : c.positions);
      m.max_seq = c.learned_positions ? c.positions : 0;
      m.default_image = c.image_size;
      m.image_multiple = c.vision() ? c.patch_size : 1;
      m.default_batch = e.default_batch;
      m.config_file = e.config_file;
      models.push_back(std::move(m));
    }
    ZooModel resnet;
    resnet.name = "resnet50";
    resnet.summary = "ResNet-50: bottlenecks 3-4-6-3, batch norm, 1000 classes";
    resnet.vision = true;
    resnet.default_image = 224;
    resnet.default_batch = 32;
    models.push_back(std::move(resnet));
    return models;
  }();
  return kModels;
}

std::vector<std::string> zoo_model_names() {
  std::vector<std::string> names;
  for (const ZooModel& m : zoo_models()) names.push_back(m.name);
  return names;
}

const ZooModel* find_zoo_model(const std::string& name) {
  for (const ZooModel& m : zoo_models()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

namespace {
// The shipped config of a zoo model of `family`, or an Error naming the zoo's models of it.
Result<const HfConfig*> zoo_config_of(const std::string& name, HfFamily family, const char* what) {
  const ZooModel* model = find_zoo_model(name);
  if (model != nullptr && !model->config_file.empty()) {
    const HfConfig& c = parsed(model->config_file);
    if (c.family == family) return &c;
  }
  std::string known;
  for (const ZooModel& m : zoo_models()) {
    if (!m.config_file.empty() && parsed(m.config_file).family == family) known += (known.empty() ? "" : ", ") + m.name;
  }
  return Error{"'" + name + "' is not a " + what + " zoo model (" + known + ")"};
}
}  // namespace

Result<GptConfig> zoo_gpt_config(const std::string& name, const ZooOptions& options) {
  auto config = zoo_config_of(name, HfFamily::gpt2, "GPT-2");
  if (!config) return config.error();
  GptConfig c = config.value()->gpt;
  c.context = config.value()->positions;
  if (options.seq > c.max_positions) {
    return Error{name + " has " + std::to_string(c.max_positions) + " learned positions; --seq " +
                 std::to_string(options.seq) + " is longer"};
  }
  if (options.seq > 0) c.context = options.seq;
  c.dtype = options.dtype;
  c.dropout = 0.0f;
  return c;
}

Result<LlamaConfig> zoo_llama_config(const std::string& name, const ZooOptions& options) {
  auto config = zoo_config_of(name, HfFamily::llama, "LLaMA-family");
  if (!config) return config.error();
  LlamaConfig c = config.value()->llama;
  const ZooModel* model = find_zoo_model(name);
  c.context = model->default_seq > 0 ? model->default_seq : config.value()->positions;
  if (options.seq > 0) c.context = options.seq;
  c.dtype = options.dtype;
  return c;
}

graph::Graph build_zoo_forward_or_throw(const std::string& name, std::int64_t batch, const ZooOptions& options) {
  const ZooModel* model = find_zoo_model(name);
  if (model == nullptr) {
    std::string known;
    for (const std::string& n : zoo_model_names()) known += (known.empty() ? "" : ", ") + n;
    throw graph::GraphError("unknown zoo model '" + name + "' (zoo: " + known + ")");
  }
  if (!graph::is_floating(options.dtype)) throw graph::GraphError("the zoo's dtype must be fp32, bf16 or fp16");
  if (!model->config_file.empty()) {
    ZooOptions o = options;
    if (o.seq <= 0) o.seq = model->default_seq;
    return build_hf_forward(parsed(model->config_file), batch, o);
  }
  if (options.tensor_parallel.active()) {
    throw graph::GraphError("--tensor-parallel splits the decoders' attention and MLP layers; " + name + " has none");
  }
  if (options.expert_parallel.active()) {
    throw graph::GraphError("--expert-parallel splits a mixture of experts' experts; " + name + " has none");
  }
  ResnetConfig c;
  c.image = options.image_size > 0 ? options.image_size : model->default_image;
  c.dtype = options.dtype;
  return build_resnet(c, batch);
}

Result<graph::Graph> build_zoo_forward(const std::string& name, std::int64_t batch, const ZooOptions& options) {
  try {
    return build_zoo_forward_or_throw(name, batch, options);
  } catch (const graph::GraphError& e) {
    return Error{find_zoo_model(name) == nullptr ? std::string(e.what()) : "model '" + name + "': " + e.what()};
  }
}

}  // namespace memplan::models
