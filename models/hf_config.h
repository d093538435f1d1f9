// Hugging Face transformers `config.json` files read onto memplan's model builders: the families
// gpt2, the rotary decoders (llama, mistral, qwen2, qwen3, gemma, gemma2, phi3, olmo2, gpt_neox,
// falcon, and the mixtures of experts mixtral, qwen2_moe, qwen3_moe), bert, vit and the encoder-decoder
// t5, from the fields those configs carry. Architecture only: no weights, no tokenizer, and not a general
// PretrainedConfig (fields that change no tensor are checked for their type and otherwise left).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/models/encoder.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"
#include "memplan/models/t5.h"
#include "memplan/models/zoo.h"

namespace memplan::models {

// The builder a config maps onto. Every decoder-only family but gpt2 is a setting of the rotary
// decoder (HfFamily::llama, models/llama.h): mistral's sliding window is a mask over the same
// scores, qwen2 adds biases to q, k and v, qwen3 and olmo2 normalise queries and keys, gemma
// gates with GELU and scales its embeddings, phi3 fuses projections (the same tensors), gpt_neox
// and falcon take LayerNorms, plain GELU MLPs and parallel residuals; mixtral, qwen2_moe and
// qwen3_moe replace the MLP by a mixture of experts (LlamaConfig::Moe); gemma2 is gemma with norms
// after the sublayers too and soft-capped attention scores and logits.
// t5 is the encoder-decoder (models/t5.h).
enum class HfFamily : std::uint8_t { gpt2, llama, bert, vit, t5 };

// "gpt2, llama, mistral, ..., bert, vit": the model_type values the reader takes.
std::string supported_model_types();

struct HfConfig {
  std::string model_type;  // as written in the file
  HfFamily family = HfFamily::gpt2;
  // The builder configuration of `family` (the others stay at their defaults). Sequence length,
  // image size and dtype are the builder's defaults until build_hf_forward applies ZooOptions.
  GptConfig gpt;
  LlamaConfig llama;
  BertConfig bert;
  VitConfig vit;
  T5Config t5;
  // Language models: the positions the model was made for (n_positions, max_position_embeddings),
  // the sequence length when none is asked for. Learned position tables (gpt2, bert) also cap it.
  std::int64_t positions = 0;
  bool learned_positions = false;
  std::int64_t image_size = 0;  // vit: the default image size; 0 for language models
  std::int64_t patch_size = 0;  // vit: image sizes are multiples of it
  // torch_dtype (or dtype) as written, "" when absent. It is the dtype the weights are stored in;
  // like from_pretrained without torch_dtype="auto", planning uses --dtype (fp32 by default).
  std::string torch_dtype;
  // The file's keys the reader did not read, sorted: for this model_type none of them changes a
  // tensor memplan plans (architectures, token ids, initializer_range, use_cache, ...); a key that
  // would change memory and is not modelled is refused instead. `--verbose` lists them.
  std::vector<std::string> unread_keys;
  // The file's text as read: a run trained from it saves it, so that generation rebuilds the model.
  std::string text;
  // What the file describes that the plan leaves out ("the vision tower (vision_config) and the
  // multimodal projector" for a multimodal config whose text decoder is planned); "" for none.
  std::string not_counted;

  bool vision() const { return family == HfFamily::vit; }
  // An encoder-decoder: its decoder's length is ZooOptions::target_seq (--target-seq).
  bool encoder_decoder() const { return family == HfFamily::t5; }
  // "llama: 32 layers, width 4096, 32 heads (8 K/V), SwiGLU 14336, vocab 128256, rotary"
  std::string describe() const;
};

// Reads the text of a config.json. Errors name `source` and the field: a missing or mistyped
// field, a negative or zero size, heads that do not divide the width, sizes whose parameter bytes
// cannot be represented (a weight over graph::kMaxTensorBytes), an unknown model_type (the
// message lists the supported ones), text that is not JSON.
Result<HfConfig> parse_hf_config(std::string_view json_text, const std::string& source);
// The same for a file (a regular file of at most 16 MiB, read through common/input_file.h).
Result<HfConfig> read_hf_config(const std::string& path);

// The forward graph (with loss and output) for `batch` samples. options.seq / image_size of 0
// take the config's positions / image size (an encoder-decoder's target_seq of 0: its seq);
// options.dtype sets parameters and activations.
// training == false builds the evaluation form (no dropout). Throws graph::GraphError
// (graph::SizeError for sizes that cannot be represented), as the builders do.
graph::Graph build_hf_forward(const HfConfig& config, std::int64_t batch, const ZooOptions& options,
                              bool training = true);

// The config files shipped with memplan (models/configs/*.json), embedded into the library at
// build time so an installed memplan needs no data files. Sorted by file name.
struct ShippedConfig {
  std::string_view file;  // "llama-2-7b.json"
  std::string_view text;
};
const std::vector<ShippedConfig>& shipped_configs();
// A shipped config by file name, parsed; an Error when there is none of that name.
Result<HfConfig> shipped_config(std::string_view file);

}  // namespace memplan::models
