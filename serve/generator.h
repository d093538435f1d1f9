// Batched generation with a KV cache for the reference GPT and the rotary decoders (a --config's
// llama, mistral, qwen, gemma, phi3, olmo2, gpt_neox, falcon or mixture of experts): the decode step (one token for each
// of `max_running` slots, models/gpt_decode.h) planned once into an arena through
// planner::plan_step, a KV pool allocated once, and a continuous-batching loop over requests: a
// waiting request is admitted when a slot is free and the pool has room for it; when a running
// sequence needs a block and none is free, the most recently admitted one is preempted (its
// blocks freed, its tokens recomputed when it is admitted again), as vLLM does. Prompts are
// prefilled through the same step, one position per step. Sampling draws from a stream per
// (request, token), so outputs do not depend on which sequences share a step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/models/gpt_decode.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/weights.h"
#include "memplan/serve/kv_cache.h"

namespace memplan::serve {

using models::DecoderModel;  // the decoders a Generator runs (models/gpt_decode.h)

struct GenerationRequest {
  std::vector<std::int32_t> prompt;  // token ids; at least one, at most the model's context
  std::int64_t max_tokens = 64;      // generation also stops when the context is full
};

struct GeneratorOptions {
  KvLayout layout = KvLayout::paged;
  Bytes kv_memory = 0;             // the pool: whole blocks of this many bytes at most
  std::int64_t block_size = 16;    // positions per block
  std::int64_t max_running = 32;   // slots of the decode step: sequences advanced per step
  double temperature = 0.0;        // 0: the most likely token
  std::uint64_t seed = 0;
};

struct GenerationReport {
  std::vector<std::vector<std::int32_t>> outputs;  // per request, the generated tokens
  std::string outputs_sha256;  // of every output (length, then tokens as little-endian i32), in request order
  std::int64_t generated_tokens = 0;
  std::int64_t steps = 0;
  double seconds = 0.0;
  double tokens_per_s = 0.0;  // generated tokens per second of the loop
  std::int64_t running_peak = 0;
  std::int64_t preemptions = 0;
  std::int64_t copy_on_write = 0;
  std::int64_t shared_prefix_tokens = 0;
  // At the peak of KV use (the step whose cache holds the most token bytes, the first such):
  // bytes reserved by running sequences, bytes holding tokens, and the waste between them.
  Bytes kv_reserved_bytes_at_peak = 0;
  Bytes kv_token_bytes_at_peak = 0;
  double kv_waste_ratio = 0.0;       // 1 - token bytes / reserved bytes, at that step
  double kv_waste_ratio_mean = 0.0;  // the same, averaged over every step
  std::int64_t device_allocations_during_decode = 0;
};

class Generator {
 public:
  // Plans the decode step for `config` on `device` and allocates its arena and the KV pool; the
  // weights are uninitialised until initialize_weights() or load_weights(). Errors name the bad
  // option (a block size of 0, KV memory below one block or, contiguous, below one slab).
  static Result<std::unique_ptr<Generator>> create(const DecoderModel& model, runtime::Device& device,
                                                   const GeneratorOptions& options);
  ~Generator();

  // build_gpt's initialisation from `seed` (same names, same streams, so the same weights as a
  // training graph initialised with that seed).
  void initialize_weights(std::uint64_t seed);
  // The weights of a run saved by `memplan train --model gpt --save` (or --config FILE --save).
  Status load_weights(const runtime::WeightsFile& file, const std::string& source);

  // Every request to completion. An Error for a request that can never run (longer than the
  // context, more blocks than the pool has) or a failed step.
  Result<GenerationReport> run(const std::vector<GenerationRequest>& requests);

  const planner::PlannedStep& step() const { return *step_; }
  const KvPoolShape& pool_shape() const { return pool_.shape(); }
  const DecoderModel& model() const { return model_; }
  std::int64_t max_running() const { return options_.max_running; }

 private:
  Generator(const DecoderModel& model, runtime::Device& device, const GeneratorOptions& options,
            std::unique_ptr<planner::PlannedStep> step, KvPool pool);
  DecoderModel model_;
  runtime::Device& device_;
  GeneratorOptions options_;
  std::unique_ptr<planner::PlannedStep> step_;
  KvPool pool_;
  std::unique_ptr<runtime::Executor> executor_;  // runs step_->graph
};

// Bytes of one pool block: every layer's keys and values for `block_size` positions.
Bytes kv_block_bytes(const DecoderModel& model, std::int64_t block_size);

}  // namespace memplan::serve
