// Fine-tuning rewrites of a forward graph: LoRA adapters on chosen linear layers (Hu et al.; as
// PEFT builds them) and frozen parameters. A frozen parameter trains nothing (TensorDesc::frozen):
// no gradient, no optimizer state, no master copy, and the backward pass keeps only what the
// trainable parameters' gradients read.
//
// An adapted linear y = x W^T becomes y + (alpha / r) * dropout(x) A^T B^T, with A [r, in]
// (uniform in +-1/sqrt(in), as PEFT's kaiming-uniform with a = sqrt(5)) and B [out, r] (zeros):
// training starts from the base model's outputs. Under LoRA every other parameter is frozen.
// Adapters are f32 by default, as PEFT keeps them: beside a 16-bit model the input is cast to f32
// for them and their sum rounded back once before it is added to the base output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memplan/graph/graph.h"

namespace memplan::graph {

struct LoraConfig {
  int rank = 0;        // 0: no adapters
  float alpha = 8.0f;  // the update is scaled by alpha / rank (PEFT's lora_alpha, default 8)
  float dropout = 0.0f;
  // The linear layers to adapt, by module name: a layer's weight "<path>.<name>.weight" matches
  // "<name>", a dotted tail of its path ("attn.proj"), or the short form of a PEFT name ("q" for
  // q_proj). "all-linear": every linear layer but the output head, as PEFT's all-linear.
  std::vector<std::string> targets = {"q", "v"};
  // The adapters' dtype; unset: f32.
  std::optional<DType> dtype;
  // Parameters frozen besides (with adapters or without: partial fine-tuning), by glob pattern
  // over parameter names ('*' matches any text): "layers.0.*", "*norm*".
  std::vector<std::string> freeze;

  bool active() const { return rank > 0 || !freeze.empty(); }
};

struct LoraReport {
  int adapted_layers = 0;          // linear layers given adapters
  std::int64_t adapter_params = 0;  // elements of every A and B
  std::int64_t frozen_params = 0;   // elements of the frozen parameters
  std::int64_t trainable_params = 0;
  Bytes adapter_bytes = 0;
  Bytes frozen_bytes = 0;
  std::vector<std::string> modules;  // the adapted modules' names, in graph order
  std::vector<std::string> skipped_narrow;  // all-linear: layers narrower than the rank, left out
};

// The module names a target may use in `forward`: every linear layer's weight path but the
// output head, without ".weight", in graph order.
std::vector<std::string> linear_modules(const Graph& forward);

// Adds adapters to `forward` (a forward graph, before autograd) and freezes what config says.
// Throws GraphError for a rank of 0 with targets, a rank above a layer's width, an unknown target
// (the message lists the modules there are), a pattern that freezes nothing, or a step left with
// nothing to train.
LoraReport apply_lora(Graph& forward, const LoraConfig& config);

}  // namespace memplan::graph
