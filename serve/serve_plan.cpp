// answer_serve (serve/serve_plan.h): the planner's batch search (planner::search_max_batch) over
// the decode step's slot count, each candidate planned through planner::plan_step.
#include "memplan/serve/serve_plan.h"

#include <algorithm>
#include <string>

#include "memplan/models/gpt_decode.h"
#include "memplan/planner/fit.h"
#include "memplan/planner/plan_step.h"

namespace memplan::serve {
namespace {

struct Planned {
  Bytes arena = 0, weights = 0;
};

Result<Planned> plan_decode(const ServeQuestion& q, std::int64_t slots) {
  models::DecodeShape shape;
  shape.slots = slots;
  shape.block_size = q.block_size;
  shape.pool_blocks = 1;  // the caches are external: their size does not change the arena
  graph::Graph g;
  try {
    g = q.llama ? models::build_llama_decode(*q.llama, shape) : models::build_gpt_decode(q.model, shape);
  } catch (const graph::GraphError& e) {
    return Error{e.what()};
  }
  if (q.weights_quant.active()) {
    for (TensorId p : g.parameters()) g.mutable_tensor(p).frozen = true;  // serving trains nothing
    try {
      graph::quantize_frozen_linears(g, q.weights_quant);
    } catch (const graph::GraphError& e) {
      return Error{e.what()};
    }
  }
  Bytes weights = 0;
  for (TensorId p : g.parameters()) weights += g.tensor(p).size_bytes();
  planner::PlanRequest request;
  request.device = q.device;
  request.find_minimum_arena = false;
  auto step = planner::plan_step(planner::StepDescription::of_graph(std::move(g)), request);
  if (!step) return step.error();
  return Planned{step.value().plan.arena_bytes, weights};
}

}  // namespace

Result<ServeAnswer> answer_serve(const ServeQuestion& q) {
  ServeAnswer a;
  const std::int64_t context = q.llama ? q.llama->context : q.model.context;
  a.seq = q.seq > 0 ? q.seq : context;
  if (a.seq > context) {
    return Error{"--seq " + std::to_string(a.seq) + " is longer than the model's context of " + std::to_string(context)};
  }
  if (q.block_size < 1 || q.block_size > context) {
    return Error{"the KV block size must be between 1 and the context (" + std::to_string(context) + ")"};
  }
  // Keys and values of one position in every layer: the K/V heads' width (grouped-query
  // attention caches NKV heads, not NH); multi-head latent attention caches one row of
  // kv_lora_rank + qk_rope values, read as every head's key and value (one "head", one cache).
  const models::DecoderModel decoder = q.llama ? models::DecoderModel(*q.llama) : models::DecoderModel(q.model);
  const std::int64_t layers = decoder.layers();
  const std::int64_t caches = decoder.caches_per_layer();
  const std::int64_t kv_width = decoder.kv_width();
  const std::int64_t kv_heads = q.llama ? (q.llama->mla.active() ? 1 : q.llama->kv_heads) : q.model.heads;
  a.kv_values_per_layer = caches * kv_width;
  a.latent = caches == 1;
  Bytes layer_position_bytes = caches * kv_width * graph::dtype_size(q.kv_dtype);
  if (q.kv_quant == KvQuant::int8) layer_position_bytes += caches * kv_heads * 4;  // a scale per head and cache
  if (q.kv_quant == KvQuant::fp8) a.kv_scale_bytes = layers * caches * 4;          // one scale per cache and layer
  a.kv_bytes_per_token = layers * layer_position_bytes;
  a.kv_block_bytes = a.kv_bytes_per_token * q.block_size;
  // A windowed layer keeps the window's last positions only (the rest is never read again); paged,
  // those span at most ceil((W - 1) / block) + 1 of its blocks, the window rarely aligned to them,
  // the older blocks freed as it moves. Layer-blocks: one layer's share of a block.
  const auto blocks_of = [&](std::int64_t positions) { return (positions + q.block_size - 1) / q.block_size; };
  std::int64_t layer_blocks_per_sequence = 0;
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::int64_t kept = q.llama ? q.llama->kv_positions(l, a.seq) : a.seq;
    a.kv_bytes_per_sequence += kept * layer_position_bytes;
    if (kept < a.seq) {
      ++a.windowed_layers;
      layer_blocks_per_sequence += std::min(blocks_of(a.seq), blocks_of(q.llama->sliding_window - 1) + 1);
    } else {
      layer_blocks_per_sequence += blocks_of(a.seq);
    }
  }
  if (a.windowed_layers > 0) a.sliding_window = q.llama->sliding_window;
  a.runtime_overhead_bytes = q.device.overhead_bytes();
  auto total = [&](std::int64_t n, const Planned& p) {
    return q.device.total_bytes(p.arena) + a.kv_scale_bytes + n * a.kv_bytes_per_sequence;
  };
  // The largest n with total(n) <= memory, by the planner's batch search (total grows with n);
  // n * KV alone exceeding the memory bounds it. `best` keeps the decode step of the largest n
  // that fit, or of one slot (the search's first probe) when none does.
  Planned best;
  auto fits = [&](std::int64_t n) -> Result<bool> {
    auto p = plan_decode(q, n);
    if (!p) return p.error();
    const bool fit = total(n, p.value()) <= q.device_memory;
    if (n == 1 || fit) best = p.value();  // probes after the first that fit only grow
    return fit;
  };
  const std::int64_t limit = std::max<std::int64_t>(1, q.device_memory / a.kv_bytes_per_sequence);
  auto search = planner::search_max_batch(planner::FitsAtBatch(fits), limit);
  if (!search) return search.error();
  a.plans_made = search.value().probes;
  a.max_sequences = search.value().max_batch;
  a.slots = std::max<std::int64_t>(a.max_sequences, 1);
  a.weights_bytes = best.weights;
  a.decode_arena_bytes = best.arena;
  a.kv_bytes = a.max_sequences * a.kv_bytes_per_sequence;
  a.total_bytes = q.device.total_bytes(best.arena) + a.kv_scale_bytes + a.kv_bytes;
  const Bytes room = q.device_memory - q.device.total_bytes(best.arena) - a.kv_scale_bytes;
  a.kv_blocks = room > 0 ? room / a.kv_block_bytes : 0;
  a.paged_sequences = a.kv_blocks * layers / layer_blocks_per_sequence;
  return a;
}

}  // namespace memplan::serve
