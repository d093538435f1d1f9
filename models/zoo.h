// The model zoo: named published models for planning at real scale (shapes only; `memplan fit`,
// `plan` and `compare` use them; they are not trained here). Each transformer is a Hugging Face
// config.json shipped with memplan (models/configs, read by models/hf_config.h: one source of
// truth); ResNet-50 is built in code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/expert_parallel.h"
#include "memplan/graph/tensor_parallel.h"
#include "memplan/models/attention.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"

namespace memplan::models {

struct ZooOptions {
  std::int64_t seq = 0;         // tokens per sequence for language models; 0 = the model's default
  std::int64_t image_size = 0;  // pixels per side for vision models; 0 = the model's default
  graph::DType dtype = graph::DType::f32;  // parameters and activations (16-bit: mixed precision)
  AttentionKind attention = AttentionKind::fused;  // transformers (models/attention.h)
  std::int64_t target_seq = 0;  // an encoder-decoder's decoder tokens per sequence; 0 = seq
  // The decoders' slice on one of several tensor-parallel ranks (graph/tensor_parallel.h); other
  // families refuse an active one.
  graph::TensorParallel tensor_parallel;
  // The mixtures of experts' share on one of several expert-parallel ranks
  // (graph/expert_parallel.h); models without experts refuse an active one.
  graph::ExpertParallel expert_parallel;
};

struct ZooModel {
  std::string name;
  std::string summary;         // e.g. "GPT-2 124M (gpt2.json): gpt2: 12 layers, width 768, ..."
  bool vision = false;         // takes --image-size (otherwise --seq)
  bool encoder_decoder = false;  // also takes --target-seq (T5)
  std::int64_t default_seq = 0;    // language models
  std::int64_t max_seq = 0;        // learned positions (0: no limit, rotary)
  std::int64_t default_image = 0;  // vision models
  std::int64_t default_batch = 8;
  std::string config_file;         // the shipped config it is built from ("" for ResNet-50)
  std::int64_t image_multiple = 1;  // image sizes are multiples of it (ViT's patch)
};

const std::vector<ZooModel>& zoo_models();
std::vector<std::string> zoo_model_names();
const ZooModel* find_zoo_model(const std::string& name);  // nullptr when not a zoo model

// The forward graph (with loss and output) of a zoo model at a batch size, or an Error naming
// what is wrong (unknown model, a sequence longer than its positions, an image size that does
// not divide into patches).
Result<graph::Graph> build_zoo_forward(const std::string& name, std::int64_t batch, const ZooOptions& options);
// The configuration of a GPT-2 zoo model (gpt2, gpt2-medium, gpt2-large, gpt2-xl) at the
// options' sequence length and dtype: what the serving planner (serve/serve_plan.h) takes; an
// Error for any other name.
Result<GptConfig> zoo_gpt_config(const std::string& name, const ZooOptions& options);
// The same for the LLaMA-style zoo models (llama-1b, llama2-7b); rotary positions have no limit,
// so options.seq (when set) is the context.
Result<LlamaConfig> zoo_llama_config(const std::string& name, const ZooOptions& options);
// The same, throwing graph::GraphError (graph::SizeError for sizes that cannot be represented).
graph::Graph build_zoo_forward_or_throw(const std::string& name, std::int64_t batch, const ZooOptions& options);

}  // namespace memplan::models
