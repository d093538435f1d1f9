// answer_serve (serve/serve_plan.h): a search over the decode step's slot count, each candidate
// planned through planner::plan_step.
#include "memplan/serve/serve_plan.h"

#include <algorithm>
#include <string>

#include "memplan/models/gpt_decode.h"
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
  // attention caches NKV heads, not NH).
  const std::int64_t layers = q.llama ? q.llama->layers : q.model.layers;
  const std::int64_t kv_width = q.llama ? q.llama->kv_heads * (q.llama->width / q.llama->heads) : q.model.width;
  a.kv_bytes_per_token = 2 * layers * kv_width * graph::dtype_size(q.kv_dtype);
  a.kv_bytes_per_sequence = a.kv_bytes_per_token * a.seq;
  a.kv_block_bytes = a.kv_bytes_per_token * q.block_size;
  a.runtime_overhead_bytes = q.device.overhead_bytes();
  auto total = [&](std::int64_t n, const Planned& p) { return q.device.total_bytes(p.arena) + n * a.kv_bytes_per_sequence; };
  // The largest n with total(n) <= memory: doubling, then bisection (total grows with n).
  auto one = plan_decode(q, 1);
  if (!one) return one.error();
  ++a.plans_made;
  Planned best = one.value();
  if (total(1, best) <= q.device_memory) {
    std::int64_t lo = 1, hi = 2;
    Planned at_lo = best;
    for (;;) {
      if (hi > q.device_memory / a.kv_bytes_per_sequence + 1) break;  // n * KV alone exceeds the memory
      auto p = plan_decode(q, hi);
      if (!p) return p.error();
      ++a.plans_made;
      if (total(hi, p.value()) > q.device_memory) break;
      lo = hi;
      at_lo = p.value();
      hi *= 2;
    }
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      auto p = plan_decode(q, mid);
      if (!p) return p.error();
      ++a.plans_made;
      if (total(mid, p.value()) <= q.device_memory) {
        lo = mid;
        at_lo = p.value();
      } else {
        hi = mid;
      }
    }
    a.max_sequences = lo;
    best = at_lo;
  }
  a.slots = std::max<std::int64_t>(a.max_sequences, 1);
  a.weights_bytes = best.weights;
  a.decode_arena_bytes = best.arena;
  a.kv_bytes = a.max_sequences * a.kv_bytes_per_sequence;
  a.total_bytes = q.device.total_bytes(best.arena) + a.kv_bytes;
  const Bytes room = q.device_memory - q.device.total_bytes(best.arena);
  a.kv_blocks = room > 0 ? room / a.kv_block_bytes : 0;
  a.paged_sequences = a.kv_blocks / ((a.seq + q.block_size - 1) / q.block_size);
  return a;
}

}  // namespace memplan::serve
