#include "memplan/models/zoo.h"

#include "memplan/models/encoder.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"
#include "memplan/models/resnet.h"

namespace memplan::models {
namespace {

GptConfig gpt2(std::int64_t layers, std::int64_t width, std::int64_t heads) {
  GptConfig c;
  c.vocab = 50257;
  c.context = 1024;
  c.max_positions = 1024;
  c.layers = layers;
  c.width = width;
  c.heads = heads;
  c.dropout = 0.1f;
  c.tied_head = true;
  return c;
}

// Llama 3.2 1B: grouped-query attention (8 K/V heads), tied embeddings, rope theta 500000.
LlamaConfig llama_1b() {
  LlamaConfig c;
  c.vocab = 128256;
  c.context = 2048;
  c.layers = 16;
  c.width = 2048;
  c.heads = 32;
  c.kv_heads = 8;
  c.ffn = 8192;
  c.rope_base = 500000.0f;
  c.tied_head = true;
  return c;
}

// Llama 2 7B: multi-head attention, a separate lm_head.
LlamaConfig llama2_7b() {
  LlamaConfig c;
  c.vocab = 32000;
  c.context = 4096;
  c.layers = 32;
  c.width = 4096;
  c.heads = 32;
  c.kv_heads = 32;
  c.ffn = 11008;
  c.rope_base = 10000.0f;
  c.tied_head = false;
  return c;
}

}  // namespace

const std::vector<ZooModel>& zoo_models() {
  static const std::vector<ZooModel> kModels = {
      {"gpt2", "GPT-2 124M: 12 layers, width 768, 12 heads, 1024 positions", false, 1024, 1024, 0, 8},
      {"gpt2-medium", "GPT-2 350M: 24 layers, width 1024, 16 heads", false, 1024, 1024, 0, 8},
      {"gpt2-large", "GPT-2 774M: 36 layers, width 1280, 20 heads", false, 1024, 1024, 0, 8},
      {"gpt2-xl", "GPT-2 1.5B: 48 layers, width 1600, 25 heads", false, 1024, 1024, 0, 8},
      {"llama-1b", "Llama-3.2-1B-style: 16 layers, width 2048, 32 heads, 8 K/V heads, SwiGLU 8192, RMSNorm, rotary",
       false, 2048, 0, 0, 8},
      {"llama2-7b", "Llama-2-7B-style: 32 layers, width 4096, 32 heads, SwiGLU 11008, RMSNorm, rotary", false, 4096,
       0, 0, 8},
      {"bert-base", "BERT-base with the MLM head: 12 layers, width 768, 12 heads, 512 positions", false, 512, 512, 0,
       8},
      {"vit-b16", "ViT-B/16: 16x16 patches, 12 layers, width 768, 12 heads, class token, 1000 classes", true, 0, 0,
       224, 32},
      {"resnet50", "ResNet-50: bottlenecks 3-4-6-3, batch norm, 1000 classes", true, 0, 0, 224, 32},
  };
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

Result<GptConfig> zoo_gpt_config(const std::string& name, const ZooOptions& options) {
  if (name != "gpt2" && name != "gpt2-medium" && name != "gpt2-large" && name != "gpt2-xl") {
    return Error{"'" + name + "' is not a GPT-2 zoo model (gpt2, gpt2-medium, gpt2-large, gpt2-xl)"};
  }
  GptConfig c = name == "gpt2"          ? gpt2(12, 768, 12)
                : name == "gpt2-medium" ? gpt2(24, 1024, 16)
                : name == "gpt2-large"  ? gpt2(36, 1280, 20)
                                        : gpt2(48, 1600, 25);
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
  if (name != "llama-1b" && name != "llama2-7b") return Error{"'" + name + "' is not a LLaMA zoo model (llama-1b, llama2-7b)"};
  LlamaConfig c = name == "llama-1b" ? llama_1b() : llama2_7b();
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
  const std::int64_t seq = options.seq > 0 ? options.seq : model->default_seq;
  const std::int64_t image = options.image_size > 0 ? options.image_size : model->default_image;
  if (!graph::is_floating(options.dtype)) throw graph::GraphError("the zoo's dtype must be fp32, bf16 or fp16");
  if (name.rfind("gpt2", 0) == 0) {
    GptConfig c = name == "gpt2"          ? gpt2(12, 768, 12)
                  : name == "gpt2-medium" ? gpt2(24, 1024, 16)
                  : name == "gpt2-large"  ? gpt2(36, 1280, 20)
                                          : gpt2(48, 1600, 25);
    c.context = seq;
    c.dtype = options.dtype;
    c.attention = options.attention;
    return build_gpt(c, batch);
  }
  if (name == "llama-1b" || name == "llama2-7b") {
    LlamaConfig c = name == "llama-1b" ? llama_1b() : llama2_7b();
    c.context = seq;
    c.dtype = options.dtype;
    c.attention = options.attention;
    return build_llama(c, batch);
  }
  if (name == "bert-base") {
    BertConfig c;
    c.seq = seq;
    c.encoder.dtype = options.dtype;
    c.encoder.attention = options.attention;
    return build_bert(c, batch);
  }
  if (name == "vit-b16") {
    VitConfig c;
    c.image = image;
    c.encoder.dropout = 0.0f;  // timm's ViT-B/16 default
    c.encoder.dtype = options.dtype;
    c.encoder.attention = options.attention;
    return build_vit(c, batch);
  }
  ResnetConfig c;
  c.image = image;
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
