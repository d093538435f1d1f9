// How much serving fits on a device: the weights and the decode step's planned arena (planned by
// planner::plan_step like any step, forward only) beside a KV cache at its own dtype. Answers the
// largest number of concurrent sequences of `seq` positions with contiguous caches, and the KV
// blocks (paged) that fit beside the same decode step. Layers with a sliding window shorter than
// `seq` keep only the window's keys and values (Mistral, Phi-3, Gemma-2's alternate layers). Planning only: nothing is allocated.
#pragma once

#include <cstdint>

#include "memplan/common/result.h"
#include "memplan/graph/quantize.h"
#include "memplan/graph/tensor.h"
#include <optional>

#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"
#include "memplan/planner/device_profile.h"

namespace memplan::serve {

// An 8-bit KV cache and the scales it keeps beside its values: fp8 (e4m3) with one f32 scale for
// the keys and one for the values of each layer (vLLM's kv_cache_dtype fp8 with k_scale and
// v_scale), int8 with an f32 scale per position, K/V head and layer for the keys and again for
// the values (per-token, per-head quantization). none: kv_dtype as it is.
enum class KvQuant : std::uint8_t { none, fp8, int8 };

struct ServeQuestion {
  // The decoder: a GPT description, or a LLaMA-style one when `llama` is set (the weights at its dtype).
  models::GptConfig model;
  std::optional<models::LlamaConfig> llama;
  std::int64_t seq = 0;      // positions per sequence, prompt and output (<= the context; 0: the context)
  graph::DType kv_dtype = graph::DType::f32;  // with kv_quant: u8 (one byte a value)
  KvQuant kv_quant = KvQuant::none;
  // The weights' linear layers stored quantized (graph/quantize.h): serving trains nothing, so every
  // linear layer but the output head is quantized.
  graph::QuantConfig weights_quant;
  std::int64_t block_size = 16;
  Bytes device_memory = 0;
  planner::DeviceProfile device;
};

struct ServeAnswer {
  std::int64_t seq = 0;
  Bytes kv_bytes_per_token = 0;     // keys and values of one position, every layer, at kv_dtype (with per-position scales)
  // Values one position keeps in one layer: 2 * NKV * HD (keys and values), or for multi-head
  // latent attention kv_lora_rank + qk_rope (one row, the latent and the rotary key; latent true).
  std::int64_t kv_values_per_layer = 0;
  bool latent = false;
  Bytes kv_scale_bytes = 0;         // per-layer scales of an fp8 cache (a fixed amount, beside the arena)
  Bytes kv_bytes_per_sequence = 0;  // seq positions (contiguous), a windowed layer's capped at its window
  // Sliding windows (LlamaConfig::sliding_window) shorter than seq: the layers that keep only the
  // window's last positions, and the window (0 and 0 when every layer keeps every position).
  std::int64_t windowed_layers = 0;
  std::int64_t sliding_window = 0;
  Bytes kv_block_bytes = 0;
  // Contiguous: the most sequences whose decode step and caches fit (0: not even one).
  std::int64_t max_sequences = 0;
  // The decode step for max_sequences slots (one slot when none fits): weights and arena.
  std::int64_t slots = 1;
  Bytes weights_bytes = 0;      // parameters, in the arena's persistent region
  Bytes decode_arena_bytes = 0;  // the whole arena (weights, activations of one step, workspace)
  Bytes runtime_overhead_bytes = 0;
  Bytes kv_bytes = 0;  // max_sequences * kv_bytes_per_sequence
  // Paged, beside the same decode step: blocks, and sequences of seq positions they hold.
  std::int64_t kv_blocks = 0;
  std::int64_t paged_sequences = 0;
  Bytes total_bytes = 0;  // device total for the contiguous answer
  std::int64_t plans_made = 0;
};

// An Error for a description that builds no decode step, or seq / block size out of range.
Result<ServeAnswer> answer_serve(const ServeQuestion& question);

}  // namespace memplan::serve
