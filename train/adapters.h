// LoRA adapters in and out as PEFT writes them: a folder with adapter_config.json (PEFT's
// LoraConfig: peft_type LORA, r, lora_alpha, lora_dropout, target_modules, ...) and
// adapter_model.safetensors, whose tensors are named "base_model.model.<module path>.lora_A.weight"
// and "...lora_B.weight" with shapes [r, in] and [out, r]. A run reads back only what its own
// adapters are: every name, shape and dtype is checked against the step before a byte is loaded.
#pragma once

#include <string>

#include "memplan/common/result.h"
#include "memplan/graph/lora.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/weights.h"

namespace memplan::train {

inline constexpr const char* kAdapterConfigName = "adapter_config.json";
inline constexpr const char* kAdapterWeightsName = "adapter_model.safetensors";

// How the step's module paths read in PEFT's names: `module_prefix` goes before each ("model."
// for the rotary decoders of Hugging Face configs, whose layers sit under the model's "model").
struct AdapterNaming {
  std::string module_prefix;
  std::string base_model;  // adapter_config.json's base_model_name_or_path
};

// Writes the adapters of `executor`'s step (every "<module>.lora_A.weight" and "lora_B" parameter)
// into `dir` (created if missing), each file whole or not at all.
Status save_adapter(const runtime::Executor& executor, const graph::LoraConfig& lora, const AdapterNaming& naming,
                    const std::string& dir);

// Reads the adapters in `dir` into `executor`'s step: the config's r and lora_alpha must be the
// run's, its target_modules modules of the step, and the file must hold exactly the step's adapters
// (names, shapes, dtypes). Returns the tensors loaded. Errors name the file and what is wrong.
Result<int> load_adapter(runtime::Executor& executor, const graph::LoraConfig& lora, const AdapterNaming& naming,
                         const std::string& dir);

// Merges each adapter into its base weight, W + (alpha / r) B A (in f32, rounded once to W's
// dtype), and drops the adapters and their optimizer state from `snapshot`: the file then loads
// into the model without --lora. An Error when a base weight is not in the snapshot in full
// precision (a quantized base).
Status merge_adapters(runtime::WeightsSnapshot& snapshot, const graph::LoraConfig& lora);

}  // namespace memplan::train
