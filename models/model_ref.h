// A model as a user names it — a registry or zoo name, a Hugging Face config.json, or an ONNX
// file — with the sizes and dtype asked, and the one place it becomes something to plan: the CLI,
// the Python package (through the CLI) and the benches all resolve a ModelRef here. Not the step's
// other choices (optimizer, offload, rewrites): those belong to planner::StepDescription.
//
// Messages name each field as the CLI flag that sets it (`seq` is "--seq"); the Python package
// takes the same names as keywords (`seq=`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/tensor.h"
#include "memplan/graph/optimizer.h"
#include "memplan/import/onnx_import.h"
#include "memplan/models/attention.h"
#include "memplan/models/gpt.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/llama.h"
#include "memplan/models/registry.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/step_size.h"

namespace memplan::models {

struct ModelRef {
  // The model: `config` (a config.json path) or `onnx` (an ONNX file path) when given, else `name`
  // (model_names(): the trainable reference models and the zoo). At most one of config and onnx.
  std::string name = "mlp";
  std::string config;
  std::string onnx;
  // Sizes; 0 takes the model's own (the registry's default batch, a config's positions, ...).
  std::int64_t batch = 0;
  std::int64_t seq = 0;         // language models
  std::int64_t target_seq = 0;  // an encoder-decoder's decoder length; 0: seq
  std::int64_t image_size = 0;  // vision models
  std::int64_t vocab = 0;       // text models: the GPT's default is its default text's, as train builds it
  std::vector<std::int64_t> hidden = {256, 256};  // the MLP's widths
  graph::DType dtype = graph::DType::f32;         // the working dtype (mixed precision at bf16/f16)
  std::optional<AttentionKind> attention;         // transformers; unset: fused
  // ONNX: the loss the step trains with, on the graph output `output` (empty: the first).
  import::LossKind loss = import::LossKind::cross_entropy;
  std::string output;
  std::optional<double> moe_capacity_factor;  // a mixture-of-experts config's slots per expert
  int tensor_parallel = 1;                    // ranks each decoder layer is split over
  int expert_parallel = 1;                    // data ranks each mixture layer's experts are split over
  bool sequence_parallel = false;
  bool list_unread_config_keys = false;  // a note listing the config's keys memplan does not read

  // What the user called the model: the file for config and ONNX, else the name.
  std::string label() const;
};

// A reference resolved: the step of its model at its batch (dtype set; optimizer as given), ready
// for planner::plan_step, and what the user should be told about it.
struct ResolvedModel {
  planner::StepDescription step;
  std::optional<HfConfig> config;  // the config read, for a config reference
  // Lines for the user (the CLI writes them to stderr, so --json stays one document): the
  // config's unread keys when asked, what a mixture of experts assumes of the routing.
  std::vector<std::string> notes;
};

// Resolves `ref` into its step, checking every field against the model it names: an Error names
// the field (as its flag) that cannot work and what would. Sizes too large to represent are
// refused with the largest that works (planner/step_size.h).
Result<ResolvedModel> resolve_model(const ModelRef& ref, const graph::OptimizerConfig& optimizer = {});

// The registry's options for a name reference (not config or ONNX), after the same checks.
Result<ModelOptions> registry_options(const ModelRef& ref);

// The decoder a serving plan needs (serve/serve_plan.h): the GPT-2 form or the rotary decoder's,
// at the reference's sequence length (its own when 0) and dtype. Decoders only: gpt, the zoo's
// GPT-2 and LLaMA-family models, and decoder configs.
struct ServedDecoder {
  GptConfig gpt;                     // when llama is empty
  std::optional<LlamaConfig> llama;  // the rotary decoders
  std::int64_t seq = 0;
  std::vector<std::string> notes;
};
Result<ServedDecoder> served_decoder(const ModelRef& ref);

// The config a config reference names, with --moe-capacity-factor applied and, when asked, a
// note listing its unread keys; an Error names the file and the field.
Result<HfConfig> read_ref_config(const ModelRef& ref, std::vector<std::string>& notes);
// An encoder-decoder (T5) adds its relative position bias onto the attention scores, so its
// attention is materialized: fused asked of `model` is an Error, anything else passes.
Status check_encoder_decoder_attention(bool encoder_decoder, std::optional<AttentionKind> asked, const std::string& model);

// How sizes are named to a ModelRef's user: as the flags that set them ("--seq 4096").
planner::SizeNaming ref_size_naming();
// planner::check_step_size with the sizes named that way.
Status check_step_size_named(const planner::StepDescription& step);

}  // namespace memplan::models
