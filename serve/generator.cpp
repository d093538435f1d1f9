// Generator (serve/generator.h): the decode step, the KV pool and the continuous-batching loop.
#include "memplan/serve/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>

#include "memplan/common/check.h"
#include "memplan/common/rng.h"
#include "memplan/common/sha256.h"
#include "memplan/models/gpt_decode.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/weights.h"

namespace memplan::serve {
namespace {

KvPoolShape pool_shape_of(const DecoderModel& model, std::int64_t block_size, std::int64_t blocks) {
  KvPoolShape s;
  s.layers = model.layers();
  s.width = model.kv_width();
  s.caches = model.caches_per_layer();
  s.block_size = block_size;
  s.blocks = blocks;
  s.element_bytes = graph::dtype_size(model.dtype());
  return s;
}

std::string bytes_text(Bytes b) { return std::to_string(b) + " bytes"; }

// The next token from one row of logits: the first most likely at temperature 0, else drawn
// from softmax(logits / temperature) with the request's own stream for this token.
std::int32_t pick(const float* row, std::int64_t vocab, double temperature, std::uint64_t seed, std::int64_t request,
                  std::int64_t index, std::vector<double>& probs) {
  if (temperature == 0.0) return static_cast<std::int32_t>(std::max_element(row, row + vocab) - row);
  Rng rng(splitmix64_mix(seed * kSplitMix64Gamma + splitmix64_mix(static_cast<std::uint64_t>(request) << 32 ^
                                                                   static_cast<std::uint64_t>(index))));
  const float top = *std::max_element(row, row + vocab);
  double total = 0.0;
  for (std::int64_t v = 0; v < vocab; ++v) {
    probs[static_cast<std::size_t>(v)] = std::exp((double(row[v]) - double(top)) / temperature);
    total += probs[static_cast<std::size_t>(v)];
  }
  double u = double(rng.uniform01()) * total;
  for (std::int64_t v = 0; v < vocab; ++v) {
    u -= probs[static_cast<std::size_t>(v)];
    if (u <= 0.0) return static_cast<std::int32_t>(v);
  }
  return static_cast<std::int32_t>(vocab - 1);
}

}  // namespace

Bytes kv_block_bytes(const DecoderModel& model, std::int64_t block_size) {
  return pool_shape_of(model, block_size, 1).block_bytes();
}

Result<std::unique_ptr<Generator>> Generator::create(const DecoderModel& model, runtime::Device& device,
                                                     const GeneratorOptions& options) {
  const std::int64_t context = model.context();
  if (options.block_size < 1) return Error{"the KV block size must be at least 1 position (vLLM uses 16)"};
  if (options.block_size > context) {
    return Error{"a KV block of " + std::to_string(options.block_size) + " positions is longer than the model's context of " +
                 std::to_string(context)};
  }
  if (options.max_running < 1) return Error{"at least one sequence must run at a time"};
  const Bytes block = kv_block_bytes(model, options.block_size);
  const std::int64_t blocks = KvPoolShape::blocks_in(options.kv_memory, block);
  if (blocks < 1) {
    return Error{"the KV memory of " + bytes_text(options.kv_memory) + " holds no block: one block of " +
                 std::to_string(options.block_size) + " positions takes " + bytes_text(block) + " with this model"};
  }
  const std::int64_t slab_blocks = (context + options.block_size - 1) / options.block_size;
  if (options.layout == KvLayout::contiguous && blocks < slab_blocks) {
    return Error{"the contiguous KV cache reserves the whole context (" + std::to_string(context) +
                 " positions, " + bytes_text(slab_blocks * block) + ") per sequence, more than the KV memory of " +
                 bytes_text(options.kv_memory)};
  }
  if (!graph::is_floating(model.dtype()) || model.dtype() != graph::DType::f32) {
    return Error{"generation runs f32 models"};
  }
  models::DecodeShape shape;
  shape.slots = options.max_running;
  shape.block_size = options.block_size;
  shape.pool_blocks = blocks;
  graph::Graph decode;
  try {
    decode = model.build_decode(shape);
  } catch (const graph::GraphError& e) {
    return Error{e.what()};
  }
  // The decode step is planned like every step: one pipeline, forward only.
  auto planned = runtime::plan_step_for(planner::StepDescription::of_graph(std::move(decode)), device);
  if (!planned) return planned.error();
  auto step = std::make_unique<planner::PlannedStep>(std::move(planned).value());
  auto pool = KvPool::allocate(device, pool_shape_of(model, options.block_size, blocks));
  if (!pool) return pool.error();
  std::unique_ptr<Generator> g(new Generator(model, device, options, std::move(step), std::move(pool).value()));
  const graph::Graph& graph = g->step_->graph;
  for (std::int64_t l = 0; l < model.layers(); ++l) {
    for (std::int64_t c = 0; c < model.caches_per_layer(); ++c) {
      g->executor_->bind_external(graph.find(models::kv_cache_name(l, c == 1)), g->pool_.cache(l, c == 1));
    }
  }
  if (Status s = g->executor_->setup(); !s) return s.error();
  return g;
}

Generator::Generator(const DecoderModel& model, runtime::Device& device, const GeneratorOptions& options,
                     std::unique_ptr<planner::PlannedStep> step, KvPool pool)
    : model_(model), device_(device), options_(options), step_(std::move(step)), pool_(std::move(pool)) {
  executor_ = std::make_unique<runtime::Executor>(*step_, device_);
}

Generator::~Generator() = default;

void Generator::initialize_weights(std::uint64_t seed) { executor_->initialize_persistent(seed); }

Status Generator::load_weights(const runtime::WeightsFile& file, const std::string& source) {
  auto loaded = runtime::load_weights(*executor_, file, source);
  if (!loaded) return loaded.error();
  return Status::success();
}

Result<GenerationReport> Generator::run(const std::vector<GenerationRequest>& requests) {
  const std::int64_t T = model_.context(), V = model_.vocab(), B = options_.max_running;
  const KvPoolShape& ps = pool_.shape();
  const std::int64_t bs = ps.block_size;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const auto n = static_cast<std::int64_t>(requests[r].prompt.size());
    const std::string which = "request " + std::to_string(r + 1);
    if (n < 1) return Error{which + " has an empty prompt"};
    if (n > T) {
      return Error{which + ": its prompt of " + std::to_string(n) + " tokens is longer than the model's context of " +
                   std::to_string(T)};
    }
    if (requests[r].max_tokens < 1) return Error{which + ": max_tokens must be at least 1"};
    for (std::int32_t t : requests[r].prompt) {
      if (t < 0 || t >= V) return Error{which + ": token id " + std::to_string(t) + " is outside the vocabulary"};
    }
    // A sequence never holds more positions than the context (the last token sampled is not fed).
    const std::int64_t longest = std::min(n + requests[r].max_tokens - 1, T);
    if (options_.layout == KvLayout::paged && (longest + bs - 1) / bs + 1 > ps.blocks) {
      return Error{which + " grows to " + std::to_string(longest) + " positions: " + std::to_string((longest + bs - 1) / bs + 1) +
                   " blocks of " + std::to_string(bs) + " with a copy, more than the pool's " + std::to_string(ps.blocks)};
    }
  }

  KvCacheManager manager(options_.layout, ps, T);
  struct State {
    std::vector<std::int32_t> tokens;  // prompt, then generated
    std::int64_t prompt_len = 0;
  };
  struct Running {
    std::int64_t request, slot, computed, order;
  };
  std::vector<State> state(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    state[r].tokens = requests[r].prompt;
    state[r].prompt_len = static_cast<std::int64_t>(requests[r].prompt.size());
  }
  std::deque<std::int64_t> waiting;
  for (std::size_t r = 0; r < requests.size(); ++r) waiting.push_back(static_cast<std::int64_t>(r));
  std::vector<Running> running;
  std::vector<std::int64_t> free_slots;
  for (std::int64_t s = B - 1; s >= 0; --s) free_slots.push_back(s);  // lowest slot first

  const graph::Graph& g = step_->graph;
  const TensorId tokens_id = g.find("tokens"), positions_id = g.find("positions"), table_id = g.find("block_table");
  const std::int64_t MB = manager.table_width();
  std::vector<std::int32_t> tokens_in(static_cast<std::size_t>(B)), positions_in(static_cast<std::size_t>(B));
  std::vector<std::int32_t> table_in(static_cast<std::size_t>(B * MB));
  std::vector<float> logits(static_cast<std::size_t>(B * V));
  std::vector<double> probs(static_cast<std::size_t>(V));

  GenerationReport report;
  report.outputs.resize(requests.size());
  std::int64_t order = 0;
  double waste_sum = 0.0;  // over steps
  const std::int64_t allocations_before = device_.stats().allocations;
  const auto start = std::chrono::steady_clock::now();
  auto preempt = [&](std::size_t index) {
    const Running victim = running[index];
    manager.release(victim.request);
    free_slots.push_back(victim.slot);
    waiting.push_front(victim.request);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(index));
    ++report.preemptions;
  };
  while (!waiting.empty() || !running.empty()) {
    // Admit in arrival order while a slot and the pool's room last.
    while (!waiting.empty() && !free_slots.empty()) {
      const std::int64_t r = waiting.front();
      const std::optional<std::int64_t> cached = manager.admit(r, state[static_cast<std::size_t>(r)].tokens);
      if (!cached) break;
      waiting.pop_front();
      running.push_back(Running{r, free_slots.back(), *cached, order++});
      free_slots.pop_back();
    }
    if (running.empty()) {
      return Error{"request " + std::to_string(waiting.front() + 1) + " does not fit in the KV pool even alone"};
    }
    // Room for each sequence's next position, oldest first; the newest give way when blocks run out.
    for (std::size_t i = 0; i < running.size();) {
      bool preempted_self = false;
      while (!manager.ensure(running[i].request, running[i].computed, &pool_)) {
        const auto newest = static_cast<std::size_t>(
            std::max_element(running.begin(), running.end(), [](const Running& a, const Running& b) { return a.order < b.order; }) -
            running.begin());
        preempted_self = newest == i;
        preempt(newest);
        if (preempted_self) break;
      }
      if (!preempted_self) ++i;
    }
    if (running.empty()) return Error{"the KV pool cannot hold the running sequence's next position"};
    report.running_peak = std::max<std::int64_t>(report.running_peak, static_cast<std::int64_t>(running.size()));

    std::fill(tokens_in.begin(), tokens_in.end(), 0);
    std::fill(positions_in.begin(), positions_in.end(), 0);
    std::fill(table_in.begin(), table_in.end(), -1);
    for (const Running& s : running) {
      const auto slot = static_cast<std::size_t>(s.slot);
      tokens_in[slot] = state[static_cast<std::size_t>(s.request)].tokens[static_cast<std::size_t>(s.computed)];
      positions_in[slot] = static_cast<std::int32_t>(s.computed);
      const std::vector<std::int32_t>& table = manager.block_table(s.request);
      std::copy(table.begin(), table.end(), table_in.begin() + static_cast<std::ptrdiff_t>(slot * static_cast<std::size_t>(MB)));
    }
    executor_->set_input(tokens_id, tokens_in.data(), static_cast<Bytes>(tokens_in.size() * sizeof(std::int32_t)));
    executor_->set_input(positions_id, positions_in.data(), static_cast<Bytes>(positions_in.size() * sizeof(std::int32_t)));
    executor_->set_input(table_id, table_in.data(), static_cast<Bytes>(table_in.size() * sizeof(std::int32_t)));
    if (Status s = executor_->run_step(); !s) return s.error();
    executor_->read_tensor(g.output, logits.data());
    ++report.steps;

    for (Running& s : running) manager.filled(s.request, ++s.computed);
    const Bytes reserved = manager.reserved_bytes(), holding = manager.token_bytes();
    if (holding > report.kv_token_bytes_at_peak) {
      report.kv_reserved_bytes_at_peak = reserved;
      report.kv_token_bytes_at_peak = holding;
    }
    if (reserved > 0) waste_sum += 1.0 - double(holding) / double(reserved);
    for (std::size_t i = 0; i < running.size();) {
      Running& s = running[i];
      State& st = state[static_cast<std::size_t>(s.request)];
      bool done = false;
      if (s.computed == static_cast<std::int64_t>(st.tokens.size())) {
        const std::int64_t index = static_cast<std::int64_t>(st.tokens.size()) - st.prompt_len;
        st.tokens.push_back(pick(&logits[static_cast<std::size_t>(s.slot * V)], V, options_.temperature, options_.seed,
                                 s.request, index, probs));
        ++report.generated_tokens;
        done = index + 1 >= requests[static_cast<std::size_t>(s.request)].max_tokens ||
               static_cast<std::int64_t>(st.tokens.size()) > T;
      }
      if (done) {
        report.outputs[static_cast<std::size_t>(s.request)].assign(st.tokens.begin() + st.prompt_len, st.tokens.end());
        manager.release(s.request);
        free_slots.push_back(s.slot);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.device_allocations_during_decode = device_.stats().allocations - allocations_before;
  report.tokens_per_s = report.seconds > 0.0 ? double(report.generated_tokens) / report.seconds : 0.0;
  report.kv_waste_ratio = report.kv_reserved_bytes_at_peak > 0
                              ? 1.0 - double(report.kv_token_bytes_at_peak) / double(report.kv_reserved_bytes_at_peak)
                              : 0.0;
  report.kv_waste_ratio_mean = report.steps > 0 ? waste_sum / double(report.steps) : 0.0;
  report.copy_on_write = manager.counters().copy_on_write;
  report.shared_prefix_tokens = manager.counters().shared_prefix_tokens;
  Sha256 hash;
  for (const auto& out : report.outputs) {
    const auto n = static_cast<std::int64_t>(out.size());
    hash.update(&n, sizeof(n));
    hash.update(out.data(), out.size() * sizeof(std::int32_t));
  }
  report.outputs_sha256 = hash.finish_hex();
  return report;
}

}  // namespace memplan::serve
