// The GPT's decode step for generation with a KV cache: one new token for each of `slots`
// sequences, attending over keys and values cached in a pool of fixed-size blocks that each slot
// reaches through its block table. A static graph (planned into an arena like any step); only the
// caches are external, bound by whoever owns the pool (serve/kv_cache.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "memplan/graph/graph.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"

namespace memplan::models {

struct DecodeShape {
  std::int64_t slots = 1;        // B: sequences advanced per step
  std::int64_t block_size = 16;  // BS: positions per cache block
  std::int64_t pool_blocks = 1;  // NB: blocks in the pool, per layer
  // MB: block-table entries per slot, enough for the model's context.
  std::int64_t table_width(std::int64_t context) const { return (context + block_size - 1) / block_size; }
};

// Names of layer `l`'s cache tensors, each [NB, BS, C] (C = the K/V width of one position); a
// multi-head latent attention layer has the key cache only, [NB, BS, kv_lora_rank + qk_rope].
std::string kv_cache_name(std::int64_t layer, bool value);

// Inputs "tokens" [B] i32, "positions" [B] i32 (the position each slot's token takes), and
// "block_table" [B, MB] i32 (entry i: the pool block holding positions i*BS .. i*BS+BS-1; -1 in
// entry 0 marks an empty slot, whose outputs are zero and which writes nothing); output "logits"
// [B, V]. Parameters are build_gpt's (same names and shapes), so a trained GPT's weights load as
// they are. Each layer writes its new key and value into its caches at the slot's position.
graph::Graph build_gpt_decode(const GptConfig& config, const DecodeShape& shape);

// The same step for the rotary decoder (models/llama.h) in any of its settings: rotary positions
// applied to queries and keys at each slot's position (the cache holds rotated keys), grouped-query
// K/V heads (caches [NB, BS, NKV*HD]), norms, MLP and residuals through llama_parts as the training
// graph has them; parameters named as build_llama names them.
graph::Graph build_llama_decode(const LlamaConfig& config, const DecodeShape& shape);

// A decoder generation runs: the reference GPT (and gpt2 configs) or the rotary decoder, with what
// a KV cache and a decode loop need to know of it.
struct DecoderModel {
  DecoderModel(const GptConfig& config) : gpt(config) {}      // NOLINT: either converts
  DecoderModel(const LlamaConfig& config) : llama(config) {}  // NOLINT
  std::optional<GptConfig> gpt;
  std::optional<LlamaConfig> llama;

  std::int64_t context() const { return gpt ? gpt->context : llama->context; }
  std::int64_t vocab() const { return gpt ? gpt->vocab : llama->vocab; }
  std::int64_t layers() const { return gpt ? gpt->layers : llama->layers; }
  // Caches per layer: a key and a value cache, or one for multi-head latent attention (its row
  // [rotary key, latent] is both).
  std::int64_t caches_per_layer() const { return llama && llama->mla.active() ? 1 : 2; }
  // Values per position and layer in each cache.
  std::int64_t kv_width() const {
    if (gpt) return gpt->width;
    if (llama->mla.active()) return llama->mla.kv_lora_rank + llama->mla.qk_rope;
    return llama->kv_heads * llama->head_size();
  }
  graph::DType dtype() const { return gpt ? gpt->dtype : llama->dtype; }
  // build_gpt_decode or build_llama_decode; throws graph::GraphError as they do.
  graph::Graph build_decode(const DecodeShape& shape) const {
    return gpt ? build_gpt_decode(*gpt, shape) : build_llama_decode(*llama, shape);
  }
};

}  // namespace memplan::models
