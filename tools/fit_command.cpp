// memplan fit: does a model's training step fit a memory budget, and what is the largest batch
// that does, by planning alone (nothing is allocated; the plan is the one execution would use).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "memplan/common/byte_size.h"
#include "memplan/graph/expert_parallel.h"
#include "memplan/graph/optimizer.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_ref.h"
#include "memplan/planner/fit.h"
#include "memplan/planner/levers.h"
#include "memplan/serve/serve_plan.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

struct FitFlags {
  ModelFlags model;
  std::string device_memory;
  std::string host_memory;  // --host-memory: checked against the offloaded state (empty: not checked)
  kernels::DeviceKind device = kernels::DeviceKind::cuda;
  std::string overhead;  // overrides the runtime overhead constants
  bool max_batch = false;
  bool minimum = false;
  bool json = false;
  CheckpointFlags checkpoint;     // --checkpoint; the arena budget is --device-memory minus the overheads
  std::optional<planner::ScheduleKind> schedule;  // --schedule; empty: auto
  bool checkpoint_given = false;  // --checkpoint on the command line: --max-batch searches it alone
  // --serve: how many sequences generation serves beside the weights (serve/serve_plan.h)
  bool serve = false;
  std::string kv_dtype = "same";  // --kv-dtype: same (--dtype), fp32, bf16, fp16, fp8 or int8
  std::int64_t block_size = 16;
  // --suggest: the cheapest combination of levers that fits (planner/levers.h)
  bool suggest = false;
  // --allow lora,quant: --suggest also plans the fine-tuning recipes the user accepts
  std::vector<std::string> allow;
  // Data parallel: one rank's step of --devices ranks (graph/data_parallel.h)
  int devices = 1;
  int zero = 0;
  double bucket_mb = 25.0;
  int prefetch = 1;
};

// --host-memory in bytes (the flag was checked when the question was made).
std::optional<Bytes> flags_host_memory(const FitFlags& flags) {
  if (flags.host_memory.empty()) return std::nullopt;
  auto bytes = parse_byte_size(flags.host_memory);
  return bytes ? std::optional<Bytes>(bytes.value()) : std::nullopt;
}

// The frozen parameters' bytes as stored: quantized weights at their layout's size.
Bytes frozen_bytes(const planner::StepRewrites& r) {
  return r.lora.frozen_bytes - r.quant.full_bytes + r.quant.data_bytes + r.quant.constant_bytes;
}

std::string strategy_name(planner::CheckpointStrategy s) { return std::string(planner::checkpoint_strategy_name(s)); }

std::string suggestion_text(const planner::FitAnswer& a, const FitFlags& flags, std::int64_t batch) {
  const planner::FitSuggestion& s = *a.suggestion;
  const std::string b = std::to_string(batch);
  if (s.micro_batch > 0) {
    if (s.accumulation_steps == 1) return "batch " + b + " fits with --checkpoint " + strategy_name(s.checkpoint);
    std::string text = "micro-batch " + std::to_string(s.micro_batch) + " x " + std::to_string(s.accumulation_steps) +
                       " gradient-accumulation steps (effective batch " +
                       std::to_string(s.micro_batch * s.accumulation_steps) + ") with --checkpoint " +
                       strategy_name(s.checkpoint);
    if (s.whole_batch_checkpoint) text += "; or the whole batch " + b + " with --checkpoint " + strategy_name(*s.whole_batch_checkpoint);
    return text;
  }
  if (!a.host_fits) {
    return "not even batch 1 fits: the offloaded optimizer state and gradient copies (" +
           format_bytes(a.breakdown.host_offload) + ") exceed --host-memory " + format_bytes(*flags_host_memory(flags)) +
           "; shard the optimizer state across more devices (--devices, --zero), or keep it on the device";
  }
  if (s.persistent_state_too_big) {
    return "not even batch 1 fits: the parameters and optimizer state (" + format_bytes(a.planned.plan.persistent_bytes) +
           ") and the runtime overhead alone exceed " + format_bytes(a.device_memory) +
           (flags.model.optimizer == graph::OptimizerKind::adamw
                ? "; --optimizer adamw8bit keeps about a quarter of AdamW's state, sgd none"
                : "") +
           "; otherwise shard the optimizer state across devices or pick a smaller model";
  }
  return "not even batch 1 fits with --checkpoint " + strategy_name(flags.checkpoint.strategy) +
         ": the activations of one sample need more than the " + format_bytes(s.activation_room_bytes) +
         " left after parameters, optimizer state and runtime overhead; try a shorter --seq or a smaller --image-size";
}

// The largest groups of what the activations at the peak hold (planner::activations_at_peak_by_name):
// a transformer's are all listed (some 20 per layer), so attention's saved tensors are named.
std::vector<planner::NamedBytes> top_activation_groups(const planner::FitAnswer& a) {
  std::vector<planner::NamedBytes> groups = planner::activations_at_peak_by_name(a.planned.plan);
  if (groups.size() > 24) groups.resize(24);
  return groups;
}

Result<planner::DeviceProfile> device_profile_of(const FitFlags& flags);

int run_fit_serve(const FitFlags& flags) {
  auto fail = [](const std::string& message) {
    std::cerr << "memplan fit --serve: " << message << "\n";
    return kExitUsage;
  };
  auto decoder = models::served_decoder(flags.model);
  if (!decoder) return fail(decoder.error().message);
  print_notes(decoder.value().notes);
  serve::ServeQuestion q;
  q.model = decoder.value().gpt;
  q.llama = decoder.value().llama;
  q.seq = decoder.value().seq;
  if (flags.kv_dtype == "fp8" || flags.kv_dtype == "int8") {
    q.kv_dtype = graph::DType::u8;
    q.kv_quant = flags.kv_dtype == "fp8" ? serve::KvQuant::fp8 : serve::KvQuant::int8;
  } else if (flags.kv_dtype == "same") {
    q.kv_dtype = flags.model.dtype;
  } else {
    q.kv_dtype = parse_enum(graph::float_dtype_names(), flags.kv_dtype, "dtype").value();
  }
  if (!flags.model.lora.lora.empty() || !flags.model.lora.freeze.empty()) {
    return fail("--lora and --freeze describe training; --serve plans the model as it serves (merge adapters into the "
                "weights, or plan them with fit)");
  }
  auto weights_quant = quant_config(flags.model.lora);
  if (!weights_quant) return fail(weights_quant.error().message);
  q.weights_quant = weights_quant.value();
  q.block_size = flags.block_size;
  auto memory = parse_byte_size(flags.device_memory);
  if (!memory) return fail("--device-memory: " + memory.error().message);
  q.device_memory = memory.value();
  auto profile = device_profile_of(flags);
  if (!profile) return fail(profile.error().message);
  q.device = profile.value();
  auto answered = serve::answer_serve(q);
  if (!answered) return fail(answered.error().message);
  const serve::ServeAnswer& a = answered.value();
  const std::string kv_name = q.kv_quant == serve::KvQuant::none ? std::string(graph::dtype_name(q.kv_dtype)) : flags.kv_dtype;
  const std::string weights_name = q.weights_quant.active()
                                       ? std::string(enum_name(graph::kQuantFormatNames, q.weights_quant.format)) + " (linear layers; the rest " +
                                             std::string(graph::dtype_name(flags.model.dtype)) + ")"
                                       : std::string(graph::dtype_name(flags.model.dtype));
  if (flags.json) {
    nlohmann::json j{{"model", flags.model.label()}, {"seq", a.seq}, {"dtype", graph::dtype_name(flags.model.dtype)},
                     {"kv_dtype", kv_name}, {"block_size", q.block_size},
                     {"weights_quant", std::string(enum_name(graph::kQuantFormatNames, q.weights_quant.format))},
                     {"kv_scale_bytes", a.kv_scale_bytes},
                     {"device", kernels::device_kind_name(flags.device)}, {"device_memory_bytes", q.device_memory},
                     {"max_sequences", a.max_sequences}, {"kv_blocks", a.kv_blocks}, {"paged_sequences", a.paged_sequences},
                     {"kv_bytes_per_token", a.kv_bytes_per_token}, {"kv_bytes_per_sequence", a.kv_bytes_per_sequence},
                     {"kv_block_bytes", a.kv_block_bytes}, {"decode_slots", a.slots}, {"plans_made", a.plans_made},
                     {"sliding_window", a.sliding_window}, {"windowed_layers", a.windowed_layers},
                     {"kv_values_per_layer", a.kv_values_per_layer}, {"latent_kv_cache", a.latent}};
    j["breakdown"] = {{"weights", a.weights_bytes},
                      {"decode_arena", a.decode_arena_bytes},
                      {"decode_activations_and_workspace", a.decode_arena_bytes - a.weights_bytes},
                      {"kv_cache", a.kv_bytes},
                      {"kv_scales", a.kv_scale_bytes},
                      {"runtime_overhead", a.runtime_overhead_bytes},
                      {"total", a.total_bytes}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  print_out("%s serving sequences of %lld positions, weights %s, KV cache %s, on %s with %s of memory\n\n",
              flags.model.label().c_str(), static_cast<long long>(a.seq), weights_name.c_str(),
              kv_name.c_str(), std::string(kernels::device_kind_name(flags.device)).c_str(),
              format_bytes(q.device_memory).c_str());
  auto row = [](const std::string& label, Bytes bytes) {
    print_out("  %-40s %14s  %16lld B\n", label.c_str(), format_bytes(bytes).c_str(), static_cast<long long>(bytes));
  };
  row("weights", a.weights_bytes);
  row("decode step activations + workspace", a.decode_arena_bytes - a.weights_bytes);
  row("decode arena (exact, " + std::to_string(a.slots) + " slots)", a.decode_arena_bytes);
  row("KV cache (" + std::to_string(a.max_sequences) + " x " + std::to_string(a.seq) + " positions)", a.kv_bytes);
  if (a.kv_scale_bytes > 0) row("KV scales (fp8: k_scale, v_scale a layer)", a.kv_scale_bytes);
  row("runtime overhead", a.runtime_overhead_bytes);
  row("total", a.total_bytes);
  print_out("\n  KV per position %s, per sequence %s\n", format_bytes(a.kv_bytes_per_token).c_str(),
              format_bytes(a.kv_bytes_per_sequence).c_str());
  if (a.latent) {
    print_out("  multi-head latent attention: a position keeps %lld values a layer (kv_lora_rank %lld + qk_rope %lld), "
              "one row read as every head's key and value\n",
              static_cast<long long>(a.kv_values_per_layer), static_cast<long long>(q.llama->mla.kv_lora_rank),
              static_cast<long long>(q.llama->mla.qk_rope));
  }
  if (a.windowed_layers > 0) {
    print_out("  sliding window: %lld of %lld layers keep only the last %lld positions' keys and values\n",
              static_cast<long long>(a.windowed_layers), static_cast<long long>(q.llama->layers),
              static_cast<long long>(a.sliding_window));
  }
  print_out("  contiguous: at most %lld concurrent sequences of %lld positions\n", static_cast<long long>(a.max_sequences),
              static_cast<long long>(a.seq));
  print_out("  paged: %lld KV blocks of %lld positions (%s each) beside the same decode step: %lld full-length sequences, "
              "more when they are shorter\n",
              static_cast<long long>(a.kv_blocks), static_cast<long long>(q.block_size), format_bytes(a.kv_block_bytes).c_str(),
              static_cast<long long>(a.paged_sequences));
  return a.max_sequences > 0 ? kExitOk : kExitFailure;
}

Result<planner::DeviceProfile> device_profile_of(const FitFlags& flags) {
  auto profile = planner::documented_device_profile(kernels::device_kind_name(flags.device));
  if (!profile) return profile.error();
  if (!flags.overhead.empty()) {
    Result<Bytes> custom = flags.overhead == "0" ? Result<Bytes>(Bytes{0}) : parse_byte_size(flags.overhead);
    if (!custom) return Error{"--overhead: " + custom.error().message};
    profile.value().overheads = {{"runtime overhead (--overhead)", custom.value()}};
  }
  return profile;
}

// The question the flags ask: the step (data parallel under --devices), the device and its
// overheads, the checkpoint strategy, and which strategies --max-batch compares.
Result<planner::FitQuestion> fit_question(const FitFlags& flags) {
  auto step = step_description(flags.model);
  if (!step) return step.error();
  auto memory = parse_byte_size(flags.device_memory);
  if (!memory) return Error{"--device-memory: " + memory.error().message};
  planner::FitQuestion question;
  question.step = step.value();
  const int tp = flags.model.tensor_parallel;
  if (flags.devices % tp != 0) {
    return Error{"--devices " + std::to_string(flags.devices) + " is not a multiple of --tensor-parallel " + std::to_string(tp) +
                 ": each data-parallel replica spans " + std::to_string(tp) + " devices"};
  }
  const int replicas = flags.devices / tp;  // the data-parallel world
  const int ep = flags.model.expert_parallel;
  if (ep > 1 && (replicas % ep != 0 || replicas == 1)) {
    return Error{"--expert-parallel " + std::to_string(ep) + " splits the experts over groups of " + std::to_string(ep) +
                 " data-parallel devices, but --devices " + std::to_string(flags.devices) +
                 (tp > 1 ? " with --tensor-parallel " + std::to_string(tp) : std::string()) + " gives " +
                 std::to_string(replicas) + ": give --devices a multiple of " + std::to_string(ep * tp)};
  }
  if (replicas > 1) {
    // Without --batch, the model's default batch need not divide among the replicas: the first
    // global batch is then one sample per replica (what --max-batch starts from anyway).
    if (flags.model.batch == 0 && question.step.batch % replicas != 0) question.step.batch = replicas;
    question.step.parallel.world = replicas;
    question.step.parallel.rank = 0;  // every rank plans the same arena
    question.step.parallel.zero = flags.zero;
    question.step.parallel.bucket_bytes = static_cast<Bytes>(flags.bucket_mb * 1024.0 * 1024.0);
    question.step.parallel.prefetch = flags.prefetch;
    question.step.parallel.expert_parallel = ep;
    if (auto problem = planner::global_batch_problem(question.step)) return Error{planner::describe(*problem, models::ref_size_naming())};
  }
  question.device_memory = memory.value();
  if (!flags.host_memory.empty()) {
    auto host = parse_byte_size(flags.host_memory);
    if (!host) return Error{"--host-memory: " + host.error().message};
    question.host_memory = host.value();
  }
  auto profile = device_profile_of(flags);
  if (!profile) return profile.error();
  question.request.device = profile.value();
  CheckpointFlags strategy_only = flags.checkpoint;
  strategy_only.budget.clear();  // fit's budget is the device's memory
  if (Status s = apply_checkpoint_flags(strategy_only, question.request); !s) return s.error();
  apply_schedule_flag(flags.schedule, question.request);
  question.find_minimum_arena = flags.minimum;
  if (flags.max_batch) {
    question.max_batch_strategies = flags.checkpoint_given
                                        ? std::vector<planner::CheckpointStrategy>{question.request.checkpoint}
                                        : std::vector<planner::CheckpointStrategy>{planner::CheckpointStrategy::kNone,
                                                                                   planner::CheckpointStrategy::kSqrt,
                                                                                   planner::CheckpointStrategy::kOptimal};
  }
  return question;
}

nlohmann::json fit_json(const FitFlags& flags, const planner::FitQuestion& question, const planner::FitAnswer& a,
                        const std::string& suggestion) {
  const planner::FitBreakdown& b = a.breakdown;
  const std::int64_t batch = question.step.batch;
  nlohmann::json j{{"model", flags.model.label()}, {"batch", batch}, {"optimizer", graph::optimizer_name(flags.model.optimizer)},
                   {"dtype", graph::dtype_name(flags.model.dtype)}, {"checkpoint_strategy", strategy_name(flags.checkpoint.strategy)},
                   {"parameter_count", a.planned.parameter_count()},
                   {"device", kernels::device_kind_name(flags.device)}, {"device_memory_bytes", a.device_memory}, {"fits", a.fits},
                   {"total_bytes", b.total}, {"arena_bytes", b.arena}, {"headroom_bytes", a.headroom_bytes},
                   {"lower_bound_bytes", a.planned.plan.lower_bound_bytes}};
  j["budget_bytes"] = a.device_memory;  // the name before --device-memory, kept for a release
  if (flags.model.tensor_parallel > 1) {
    j["tensor_parallel"] = flags.model.tensor_parallel;  // each layer split over this many of the devices
    j["data_parallel"] = flags.devices / flags.model.tensor_parallel;
    if (flags.model.sequence_parallel) j["sequence_parallel"] = true;
  }
  if (flags.model.expert_parallel > 1) {
    const graph::ExpertShare share = graph::expert_share(a.planned.graph);
    j["expert_parallel"] = flags.model.expert_parallel;
    j["experts_per_rank"] = share.local_experts;  // of each mixture layer's `experts`
    j["experts"] = share.experts;
    j["expert_parameter_bytes"] = share.bytes;
  }
  if (flags.devices > 1) {
    j["devices"] = flags.devices;  // the bytes are one device's (every rank plans the same arena)
    j["zero"] = flags.zero;
    j["bucket_mb"] = flags.bucket_mb;
    if (flags.zero == 3) j["prefetch"] = flags.prefetch;
  }
  j["breakdown"] = {{"parameters", b.parameters}, {"gradients", b.gradients_at_peak},
                    {"master_weights", b.master_weights}, {"optimizer_state", b.optimizer_state},
                    {"activations", b.activations_at_peak},
                    {"communication", b.communication_at_peak},
                    {"workspace", b.workspace}, {"runtime_overhead", b.runtime_overhead}, {"arena", b.arena}};
  if (a.planned.rewrites.lora.frozen_params > 0) {
    const Bytes frozen = frozen_bytes(a.planned.rewrites);
    j["breakdown"]["frozen_parameters"] = frozen;
    j["breakdown"]["trained_parameters"] = b.parameters - frozen;
    if (a.planned.rewrites.quant.quantized_layers > 0) {
      j["breakdown"]["quantized_weights"] = a.planned.rewrites.quant.data_bytes;
      j["breakdown"]["quantization_constants"] = a.planned.rewrites.quant.constant_bytes;
    }
    j["breakdown"]["lora_adapters"] = a.planned.rewrites.lora.adapter_bytes;
  }
  if (graph::is_8bit_adam(flags.model.optimizer)) {
    const graph::EightBitStates e = graph::eight_bit_states(a.planned.graph);
    j["breakdown"]["optimizer_8bit"] = {{"quantized_tensors", e.quantized_updates}, {"code_bytes", e.code_bytes},
                                        {"paged_host_bytes", e.paged_bytes}, {"absmax_bytes", e.absmax_bytes},
                                        {"f32_tensors", e.f32_updates}, {"f32_state_bytes", e.f32_state_bytes}};
    if (e.paged_bytes > 0) j["host_bytes"] = b.host_offload;  // the paged states (and any offloaded state)
  }
  j["host_snapshot_bytes"] = b.host_snapshot;  // train --save-dir's copy of the state, in host memory
  if (flags.model.offload_optimizer) {
    j["offload_optimizer"] = true;
    j["host_bytes"] = b.host_offload;  // the offloaded state and gradient copies, in host memory
    if (a.planned.plan.host_bytes > 0) j["host_region"] = {{"bytes", b.host_offload}, {"buffers", a.planned.plan.host_buffers.size()}};
  }
  if (auto host = flags_host_memory(flags)) {
    j["host_memory_bytes"] = *host;
    j["host_fits"] = a.host_fits;
  }
  nlohmann::json o = nlohmann::json::array();
  for (const auto& item : a.overheads) o.push_back({{"what", item.what}, {"bytes", item.bytes}});
  j["runtime_overheads"] = o;
  nlohmann::json groups = nlohmann::json::array();
  for (const planner::NamedBytes& g : top_activation_groups(a)) {
    groups.push_back({{"tensor", g.name}, {"bytes", g.bytes}, {"buffers", g.count}});
  }
  j["activations_at_peak_by_tensor"] = groups;
  if (!a.max_batch.empty()) {
    nlohmann::json per = nlohmann::json::object();
    for (const planner::StrategyMaxBatch& row : a.max_batch) {
      per[strategy_name(row.strategy)] = row.max_batch;
      if (row.strategy == question.request.checkpoint) j["max_batch"] = row.max_batch;
    }
    j["max_batch_by_checkpoint"] = per;
    // Two plans are described: say which figures are whose.
    j["described_plan"] = "batch " + std::to_string(batch) +
                          ", the batch asked: arena_bytes, total_bytes, headroom_bytes and breakdown are its";
  }
  if (a.max_batch_plan) {
    const planner::MaxBatchPlan& m = *a.max_batch_plan;
    j["max_batch_plan"] = {{"batch", m.batch}, {"checkpoint_strategy", strategy_name(m.strategy)},
                           {"arena_bytes", m.arena_bytes}, {"total_bytes", m.total_bytes},
                           {"headroom_bytes", m.headroom_bytes}};
  }
  j["plans_made"] = a.steps_planned;
  if (a.minimum) {
    j["minimum_arena"] = {{"strategy", strategy_name(a.minimum->strategy)}, {"arena_bytes", a.minimum->arena_bytes},
                          {"total_bytes", question.request.device.total_bytes(a.minimum->arena_bytes)}};
  }
  if (a.planned.checkpoint && question.request.checkpoint != planner::CheckpointStrategy::kNone) {
    j["checkpoint"] = checkpoint_json(*a.planned.checkpoint);
  }
  add_rewrites_json(j, a.planned.rewrites, &a.planned.plan);
  nlohmann::json sj = nullptr;
  if (a.suggestion) {
    const planner::FitSuggestion& s = *a.suggestion;
    if (s.micro_batch > 0) {
      sj = {{"micro_batch", s.micro_batch}, {"gradient_accumulation_steps", s.accumulation_steps},
            {"effective_batch", s.micro_batch * s.accumulation_steps}, {"checkpoint", strategy_name(s.checkpoint)}};
      if (s.whole_batch_checkpoint && s.accumulation_steps > 1) sj["whole_batch_checkpoint"] = strategy_name(*s.whole_batch_checkpoint);
    } else {
      sj = {{"micro_batch", 0}, {"note", suggestion}};
    }
  }
  j["suggestion"] = sj;
  return j;
}

void print_fit(const FitFlags& flags, const planner::FitQuestion& question, const planner::FitAnswer& a,
               const std::string& suggestion) {
  const planner::FitBreakdown& b = a.breakdown;
  const std::int64_t batch = question.step.batch;
  print_out("%s (%lld parameters), batch %lld, %s, %s, on %s with %s of memory: %s\n\n", flags.model.label().c_str(),
              static_cast<long long>(a.planned.parameter_count()), static_cast<long long>(batch),
              std::string(graph::dtype_name(flags.model.dtype)).c_str(),
              std::string(graph::optimizer_name(flags.model.optimizer)).c_str(),
              std::string(kernels::device_kind_name(flags.device)).c_str(),
              format_bytes(a.device_memory).c_str(), a.fits ? "FITS" : "DOES NOT FIT");
  // The 8-bit AdamW states, for the breakdown and the host line (one walk over the step's ops).
  const bool eight_bit = graph::is_8bit_adam(flags.model.optimizer);
  const graph::EightBitStates states = eight_bit ? graph::eight_bit_states(a.planned.graph) : graph::EightBitStates{};
  const int tp = flags.model.tensor_parallel, replicas = flags.devices / tp;
  if (tp > 1) {
    print_out("per device: one rank of %d: tensor-parallel %d (each layer's heads, MLP width and vocabulary split %d "
              "ways%s) x data-parallel %d, ZeRO-%d, global batch %lld (%lld per replica)\n\n",
              flags.devices, tp, tp, flags.model.sequence_parallel ? "; sequence-parallel: norms and dropouts on 1/T of the rows" : "",
              replicas, flags.zero, static_cast<long long>(batch), static_cast<long long>(batch / replicas));
  } else if (flags.devices > 1) {
    print_out("per device: one rank of %d data-parallel ranks, ZeRO-%d, global batch %lld (%lld per rank)\n\n",
                flags.devices, flags.zero, static_cast<long long>(batch), static_cast<long long>(batch / flags.devices));
  }
  const graph::ExpertShare experts = graph::expert_share(a.planned.graph);
  if (flags.model.expert_parallel > 1) {
    print_out("experts: %lld of each mixture layer's %lld on this rank (expert-parallel %d; tokens sent to their experts' "
              "ranks and back by two all-to-alls a layer)\n\n",
              static_cast<long long>(experts.local_experts), static_cast<long long>(experts.experts), flags.model.expert_parallel);
  }
  auto row = [](const char* label, Bytes bytes) {
    print_out("  %-28s %14s  %16lld B\n", label, format_bytes(bytes).c_str(), static_cast<long long>(bytes));
  };
  // --max-batch describes a second plan below: name this one.
  if (!a.max_batch.empty()) print_out("plan at batch %lld, the batch asked:\n", static_cast<long long>(batch));
  row("parameters", b.parameters);
  if (flags.model.expert_parallel > 1) {
    const std::string label = "experts (" + std::to_string(experts.local_experts) + " of " + std::to_string(experts.experts) +
                              " a layer, this rank's)";
    print_out("    %-40s %14s\n", label.c_str(), format_bytes(experts.bytes).c_str());
  }
  const graph::LoraReport& lora = a.planned.rewrites.lora;
  const graph::QuantReport& quant = a.planned.rewrites.quant;
  const Bytes frozen = frozen_bytes(a.planned.rewrites);
  if (lora.frozen_params > 0) {
    print_out("    %-40s %14s\n", "frozen (no gradient or optimizer state)", format_bytes(frozen).c_str());
    if (quant.quantized_layers > 0) {
      const std::string label = "  quantized weights (" + std::string(enum_name(graph::kQuantFormatNames, a.planned.rewrites.quant_format)) + ")";
      print_out("    %-40s %14s\n", label.c_str(), format_bytes(quant.data_bytes).c_str());
      print_out("    %-40s %14s\n", "  their scales and constants", format_bytes(quant.constant_bytes).c_str());
    }
    if (lora.adapted_layers > 0) print_out("    %-40s %14s\n", "LoRA adapters (trained)", format_bytes(lora.adapter_bytes).c_str());
    print_out("    %-40s %14s\n", "trained", format_bytes(b.parameters - frozen).c_str());
  }
  row("gradients (at the peak)", b.gradients_at_peak);
  if (b.master_weights > 0) row("master weights (fp32)", b.master_weights);
  row("optimizer state", b.optimizer_state);
  if (eight_bit) {
    const graph::EightBitStates& e = states;
    const std::string where = e.paged_bytes > 0 ? " on the device" : "";
    print_out("    %-40s %14s\n", ("8-bit moments" + where + " (u8, " + std::to_string(e.quantized_updates) + " tensors)").c_str(),
              format_bytes(e.code_bytes - e.paged_bytes).c_str());
    print_out("    %-40s %14s\n", "  block absmax (f32 per 256)", format_bytes(e.absmax_bytes).c_str());
    if (e.f32_updates > 0) {
      print_out("    %-40s %14s\n", ("f32 moments (" + std::to_string(e.f32_updates) + " tensors under 4,096)").c_str(),
                format_bytes(e.f32_state_bytes).c_str());
    }
  }
  row("activations (at the peak)", b.activations_at_peak);
  for (const planner::NamedBytes& g : top_activation_groups(a)) {
    print_out("    %-40s %14s  x%d\n", g.name.c_str(), format_bytes(g.bytes).c_str(), g.count);
  }
  if (flags.devices > 1) row("communication (at the peak)", b.communication_at_peak);
  // A 16-bit step's workspace holds the fp32 copies its widened ops compute in, after the
  // device's own scratch (CUDA's cuBLAS workspace).
  const bool widened = flags.model.dtype != graph::DType::f32 && question.request.device.widens_16bit;
  const bool scratch = question.request.device.workspace_bytes > 0;
  row(!widened ? "workspace (in the arena)" : scratch ? "workspace (scratch, fp32 copies)" : "workspace (fp32 op copies)",
      b.workspace);
  row("arena (exact)", b.arena);
  for (const auto& item : a.overheads) row(("+ " + item.what).c_str(), item.bytes);
  row("total", b.total);
  print_out("  %-28s %14s\n", "headroom", a.headroom_bytes >= 0 ? format_bytes(a.headroom_bytes).c_str()
                                                                  : ("-" + format_bytes(-a.headroom_bytes)).c_str());
  if (flags.model.offload_optimizer) {
    const std::optional<Bytes> host = flags_host_memory(flags);
    print_out("  %-28s %14s  %16lld B%s%s\n", "host: offloaded state", format_bytes(b.host_offload).c_str(),
              static_cast<long long>(b.host_offload), flags.devices > 1 ? " per rank" : "",
              !host ? "" : a.host_fits ? (" (fits --host-memory " + format_bytes(*host) + ")").c_str()
                                       : (" (over --host-memory " + format_bytes(*host) + ")").c_str());
    print_out("    (optimizer state, fp32 master weights and the gradients copied out for the CPU's update)\n");
  }
  if (flags.model.optimizer == graph::OptimizerKind::paged_adamw8bit && !flags.model.offload_optimizer) {
    const graph::EightBitStates& e = states;
    print_out("  %-28s %14s  %16lld B%s\n", "host: paged 8-bit states", format_bytes(e.paged_bytes).c_str(),
              static_cast<long long>(e.paged_bytes), flags.devices > 1 ? " per rank" : "");
    print_out("    (the u8 moments of parameters of 100,000 elements or more, in host-visible memory)\n");
  }
  print_out("  host memory for train --save-dir: %s%s (the state's copy, written while training goes on)\n",
              format_bytes(b.host_snapshot).c_str(), flags.devices > 1 ? " per rank" : "");
  if (a.minimum) {
    print_out("  %-28s %14s  with --checkpoint %s\n", "least arena of any strategy", format_bytes(a.minimum->arena_bytes).c_str(),
                strategy_name(a.minimum->strategy).c_str());
  }
  if (!a.max_batch.empty()) {
    print_out("\nlargest batch that fits (exact: it fits, one more does not)\n  %-12s", "checkpoint");
    for (const auto& r : a.max_batch) print_out(" %10s", strategy_name(r.strategy).c_str());
    print_out("\n  %-12s", "max batch");
    for (const auto& r : a.max_batch) print_out(" %10lld", static_cast<long long>(r.max_batch));
    print_out("\n  %-12s", "plans made");
    for (const auto& r : a.max_batch) print_out(" %10lld", static_cast<long long>(r.steps_planned));
    print_out("\n");
    if (a.max_batch_plan) {
      const planner::MaxBatchPlan& m = *a.max_batch_plan;
      print_out("  largest batch %lld (--checkpoint %s), its plan: arena %s, total %s, headroom %s\n",
                static_cast<long long>(m.batch), strategy_name(m.strategy).c_str(), format_bytes(m.arena_bytes).c_str(),
                format_bytes(m.total_bytes).c_str(), format_bytes(m.headroom_bytes).c_str());
    }
  }
  if (a.planned.checkpoint && question.request.checkpoint != planner::CheckpointStrategy::kNone) {
    print_out("%s\n", checkpoint_line(*a.planned.checkpoint).c_str());
  }
  print_out("%s", rewrite_lines(a.planned.rewrites, &a.planned.plan).c_str());
  if (a.suggestion) print_out("suggestion: %s\n", suggestion.c_str());
  if (!a.fits) {
    print_out("fit --suggest plans every combination of checkpointing, ZeRO stage, --tensor-parallel, "
              "--offload-optimizer and micro-batches on --devices %d and names the cheapest that fits\n", flags.devices);
  }
}

// The step of the flags' model with `levers` pulled at `batch` (one pass's global batch), for
// planner/levers.h: the model's tensor-parallel slice, the replicas of --devices, offload. Steps
// are built once per slice and offload (the model source is the costly part) and re-batched.
planner::StepWithLevers step_with_levers(const FitFlags& flags) {
  auto built = std::make_shared<std::map<std::pair<int, bool>, planner::StepDescription>>();
  return [flags, built](const planner::Levers& levers, std::int64_t batch) -> Result<planner::StepDescription> {
    const auto key = std::make_pair(levers.tensor_parallel, levers.offload_optimizer);
    auto it = built->find(key);
    if (it == built->end()) {
      ModelFlags model = flags.model;
      model.tensor_parallel = levers.tensor_parallel;
      model.sequence_parallel = model.sequence_parallel && levers.tensor_parallel > 1;  // it goes with the slices
      model.offload_optimizer = levers.offload_optimizer;
      auto step = step_description(model, /*notes=*/false);  // the asked step's notes were printed
      if (!step) return step.error();
      it = built->emplace(key, std::move(step).value()).first;
    }
    planner::StepDescription step = it->second;
    step.batch = batch;
    const int replicas = flags.devices / levers.tensor_parallel;
    if (replicas > 1) {
      step.parallel.world = replicas;
      step.parallel.rank = 0;
      step.parallel.zero = levers.zero;
      step.parallel.bucket_bytes = static_cast<Bytes>(flags.bucket_mb * 1024.0 * 1024.0);
      step.parallel.prefetch = flags.prefetch;
      step.parallel.expert_parallel = flags.model.expert_parallel;
      if (auto problem = planner::global_batch_problem(step)) return Error{planner::describe(*problem, models::ref_size_naming())};
    }
    return step;
  };
}

// The levers the flags pull, as planner/levers.h names them.
planner::Levers levers_of(const FitFlags& flags) {
  planner::Levers levers;
  levers.checkpoint = flags.checkpoint.strategy;
  levers.zero = flags.devices / flags.model.tensor_parallel > 1 ? flags.zero : 0;
  levers.tensor_parallel = flags.model.tensor_parallel;
  levers.offload_optimizer = flags.model.offload_optimizer;
  return levers;
}

bool pulls_levers(const planner::Levers& l) {
  return l.checkpoint != planner::CheckpointStrategy::kNone || l.zero > 0 || l.tensor_parallel > 1 || l.offload_optimizer ||
         l.micro_batch > 0;
}

nlohmann::json savings_json(const std::vector<planner::LeverSaving>& savings) {
  nlohmann::json out = nlohmann::json::array();
  for (const planner::LeverSaving& s : savings) {
    nlohmann::json j{{"lever", s.lever}, {"released", s.released}};
    if (s.why_not.empty()) {
      j["total_without_bytes"] = s.total_without;
      j["saved_bytes"] = s.saved;
    } else {
      j["not_planned"] = s.why_not;
    }
    out.push_back(j);
  }
  return out;
}

void print_savings(const std::vector<planner::LeverSaving>& savings) {
  if (savings.empty()) return;
  print_out("\nwhat each lever saves one rank (the step planned again with it released):\n");
  for (const planner::LeverSaving& s : savings) {
    if (!s.why_not.empty()) {
      print_out("  %-24s  not planned with %s: %s\n", s.lever.c_str(), s.released.c_str(), s.why_not.c_str());
      continue;
    }
    print_out("  %-24s %s %10s   (%s: %s)\n", s.lever.c_str(), s.saved >= 0 ? "saves" : "costs",
              format_bytes(s.saved >= 0 ? s.saved : -s.saved).c_str(), s.released.c_str(), format_bytes(s.total_without).c_str());
  }
}

// A candidate's levers as flags. With --sequence-parallel its tensor-parallel candidates were
// planned with sequence parallelism too (step_with_levers), and they say so.
std::string levers_text(const planner::LeverCandidate& c, bool sequence_parallel) {
  std::string text = planner::describe(c.levers, c.accumulation_steps);
  if (sequence_parallel && c.levers.tensor_parallel > 1) {
    const std::string tp = "--tensor-parallel " + std::to_string(c.levers.tensor_parallel);
    if (const auto at = text.find(tp); at != std::string::npos) text.insert(at + tp.size(), " --sequence-parallel");
  }
  return text;
}

nlohmann::json candidate_json(const planner::LeverCandidate& c, bool sequence_parallel) {
  nlohmann::json j{{"levers", levers_text(c, sequence_parallel)},
                   {"tensor_parallel", c.levers.tensor_parallel},
                   {"sequence_parallel", sequence_parallel && c.levers.tensor_parallel > 1},
                   {"zero", c.levers.zero},
                   {"offload_optimizer", c.levers.offload_optimizer},
                   {"checkpoint", strategy_name(c.levers.checkpoint)},
                   {"micro_batch", c.levers.micro_batch},
                   {"accumulation_steps", c.accumulation_steps},
                   {"fits", c.fits}};
  if (!c.why_not.empty()) j["not_planned"] = c.why_not;
  if (c.total_bytes > 0) j["total_bytes"] = c.total_bytes;
  if (c.host_bytes > 0) j["host_bytes"] = c.host_bytes;
  if (c.fits) {
    j["recompute_fraction"] = c.recompute_fraction;
    j["estimated_step_seconds"] = c.seconds;
    j["cost"] = {{"flops", c.cost.flops}, {"tensor_parallel_bytes", c.cost.tensor_parallel_bytes},
                 {"data_parallel_bytes", c.cost.data_parallel_bytes}, {"host_bytes", c.cost.host_bytes}};
  }
  return j;
}

std::string fmt_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, s < 10 ? "%.2f s" : "%.0f s", s);
  return text;
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * fraction);
  return text;
}

// The tensor-parallel degrees --suggest tries: 1, 2, 4, 8 (one node) that divide the devices.
std::vector<int> suggested_degrees(int devices) {
  std::vector<int> out;
  for (int t : {1, 2, 4, 8}) {
    if (devices % t == 0) out.push_back(t);
  }
  return out;
}

// A fine-tuning recipe --allow accepts, as its flags, and the levers that fit it.
struct Recipe {
  std::string flags;
  planner::SuggestAnswer answer;
  std::string why_not;  // the recipe cannot be planned for this model (no linear layers, ...)
};

planner::SuggestQuestion suggest_question(const FitFlags& flags, const planner::FitQuestion& asked, std::int64_t batch) {
  planner::SuggestQuestion q;
  q.step = step_with_levers(flags);
  q.batch = batch;
  q.devices = flags.devices;
  q.tensor_parallel_degrees = suggested_degrees(flags.devices);
  q.device_memory = asked.device_memory;
  q.host_memory = asked.host_memory;
  q.request = asked.request;
  return q;
}

// The recipes --allow names that the flags do not already ask for: 8-bit AdamW states, LoRA (rank
// 8 on q and v) and QLoRA (the same with the base in NF4 and double quantization), each searched
// as --suggest does.
Result<std::vector<Recipe>> fine_tuning_recipes(const FitFlags& flags, const planner::FitQuestion& asked, std::int64_t batch) {
  std::vector<Recipe> out;
  const bool lora = std::find(flags.allow.begin(), flags.allow.end(), "lora") != flags.allow.end();
  const bool quant = std::find(flags.allow.begin(), flags.allow.end(), "quant") != flags.allow.end();
  const bool has_lora = !flags.model.lora.lora.empty();
  const bool eight_bit = std::find(flags.allow.begin(), flags.allow.end(), "8bit") != flags.allow.end();
  if (eight_bit && flags.model.optimizer == graph::OptimizerKind::adamw) {
    FitFlags recipe = flags;
    recipe.model.optimizer = graph::OptimizerKind::adamw8bit;
    auto answered = planner::suggest_levers(suggest_question(recipe, asked, batch));
    if (!answered) return answered.error();
    out.push_back({"--optimizer adamw8bit", std::move(answered).value()});
  }
  for (int r = 0; r < 2; ++r) {
    const bool with_quant = r == 1;
    if ((with_quant && !quant) || (!with_quant && !lora)) continue;
    if (has_lora && (!with_quant || flags.model.lora.quant != graph::QuantFormat::none)) continue;  // asked already
    FitFlags recipe = flags;
    if (!has_lora) recipe.model.lora.lora = "8";
    std::string text = has_lora ? "" : "--lora 8 --lora-targets q,v";
    if (with_quant) {
      recipe.model.lora.quant = graph::QuantFormat::nf4;
      recipe.model.lora.double_quant = true;
      text += std::string(text.empty() ? "" : " ") + "--quant nf4 --double-quant";
    }
    if (auto s = step_description(recipe.model); !s) {
      out.push_back({text, {}, s.error().message});
      continue;
    }
    auto answered = planner::suggest_levers(suggest_question(recipe, asked, batch));
    if (!answered) return answered.error();
    out.push_back({text, std::move(answered).value()});
  }
  return out;
}

int run_suggest(const FitFlags& flags, const planner::FitQuestion& asked) {
  planner::SuggestQuestion q = suggest_question(flags, asked, asked.step.batch);
  if (!flags.json) q.progress = [](const std::string& line) { std::cerr << "fit --suggest: " << line << "\n"; };
  auto answered = planner::suggest_levers(q);
  if (!answered) {
    std::cerr << "memplan fit: " << answered.error().message << "\n";
    return kExitUsage;
  }
  const planner::SuggestAnswer& a = answered.value();
  std::vector<planner::LeverSaving> savings;
  if (a.best && pulls_levers(a.best->levers)) {
    auto s = planner::lever_savings(q.step, a.best->levers, q.batch, q.devices, q.request, q.device_memory);
    if (!s) {
      std::cerr << "memplan fit: " << s.error().message << "\n";
      return kExitUsage;
    }
    savings = std::move(s).value();
  }
  auto recipes = fine_tuning_recipes(flags, asked, q.batch);
  if (!recipes) {
    std::cerr << "memplan fit: " << recipes.error().message << "\n";
    return kExitUsage;
  }
  const bool asked_fits = a.best.has_value();
  const Bytes asked_bytes = asked_fits ? a.best->total_bytes : 0;
  const planner::CostModel& m = q.costs;
  if (flags.json) {
    nlohmann::json recipe_rows = nlohmann::json::array();
    for (const Recipe& r : recipes.value()) {
      nlohmann::json row{{"recipe", r.flags}, {"fits", r.answer.best.has_value()}};
      if (!r.why_not.empty()) row["not_planned"] = r.why_not;
      if (r.answer.best) {
        row["best"] = candidate_json(*r.answer.best, flags.model.sequence_parallel);
        if (asked_fits) row["saved_bytes"] = asked_bytes - r.answer.best->total_bytes;
      }
      recipe_rows.push_back(row);
    }
    nlohmann::json candidates = nlohmann::json::array();
    for (const planner::LeverCandidate& c : a.candidates) candidates.push_back(candidate_json(c, flags.model.sequence_parallel));
    nlohmann::json j{{"model", flags.model.label()}, {"batch", q.batch}, {"devices", q.devices},
                     {"device_memory_bytes", q.device_memory}, {"fits", a.best.has_value()}, {"candidates", candidates},
                     {"steps_planned", a.steps_planned},
                     {"cost_model", {{"flops_per_s", m.flops_per_s}, {"nvlink_bytes_per_s", m.nvlink_bytes_per_s},
                                     {"network_bytes_per_s", m.network_bytes_per_s}, {"host_bytes_per_s", m.host_bytes_per_s},
                                     {"gpus_per_node", m.gpus_per_node}}}};
    if (a.best) j["best"] = candidate_json(*a.best, flags.model.sequence_parallel);
    j["lever_savings"] = savings_json(savings);
    if (!flags.allow.empty()) j["fine_tuning_recipes"] = recipe_rows;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  print_out("%s, global batch %lld on %d device(s) of %s: the levers that fit, each combination planned (%lld plans)\n",
            flags.model.label().c_str(), static_cast<long long>(q.batch), q.devices,
            format_bytes(q.device_memory).c_str(), static_cast<long long>(a.steps_planned));
  print_out("ranked by an estimated step time per rank: FLOPs at %.0f TFLOP/s, tensor-parallel traffic at %.0f GB/s "
            "(NVLink), the replicas' at %.0f GB/s (%s), host copies at %.0f GB/s (effective rates of H100 nodes of %d GPUs)\n\n",
            m.flops_per_s / 1e12, m.nvlink_bytes_per_s / 1e9, m.data_parallel_bytes_per_s(q.devices) / 1e9,
            q.devices <= m.gpus_per_node ? "NVLink, one node" : "the network between nodes", m.host_bytes_per_s / 1e9,
            m.gpus_per_node);
  print_out("  %-70s %-5s %12s %10s %9s\n", "levers", "fits", "per rank", "est. step", "recompute");
  for (const planner::LeverCandidate& c : a.candidates) {
    if (!c.why_not.empty() && c.total_bytes == 0) {
      print_out("  %-70s %-5s %s\n", levers_text(c, flags.model.sequence_parallel).c_str(), "-", c.why_not.c_str());
      continue;
    }
    const std::string seconds = c.fits ? fmt_seconds(c.seconds) : "-";
    const std::string recompute = c.fits ? percent(c.recompute_fraction) : "-";
    print_out("  %-70s %-5s %12s %10s %9s%s\n", levers_text(c, flags.model.sequence_parallel).c_str(), c.fits ? "yes" : "no",
              format_bytes(c.total_bytes).c_str(), seconds.c_str(), recompute.c_str(),
              c.why_not.empty() ? "" : ("  (" + c.why_not + ")").c_str());
  }
  if (!a.best) {
    print_out("\nno combination fits: more devices (--devices), a smaller --batch or --seq, or a device with more memory%s\n",
              flags.allow.empty() ? "; or, if the job may fine-tune instead, --allow lora,quant,8bit" : "");
  } else {
    print_out("\nbest: %s (per rank %s, est. %s a step)\n", levers_text(*a.best, flags.model.sequence_parallel).c_str(),
              format_bytes(a.best->total_bytes).c_str(), fmt_seconds(a.best->seconds).c_str());
    print_savings(savings);
  }
  if (!recipes.value().empty()) print_out("\nfine-tuning recipes (--allow), each with its best levers:\n");
  for (const Recipe& r : recipes.value()) {
    if (!r.why_not.empty()) {
      print_out("  %-56s not planned: %s\n", r.flags.c_str(), r.why_not.c_str());
      continue;
    }
    if (!r.answer.best) {
      print_out("  %-56s does not fit with any combination\n", r.flags.c_str());
      continue;
    }
    const Bytes total = r.answer.best->total_bytes;
    // Each side's best is the fastest combination that fits, so a recipe can hold more than the
    // step as asked does with other levers (offload, say).
    const std::string saved = !asked_fits            ? ", where the step as asked does not fit"
                              : asked_bytes >= total ? (", saves " + format_bytes(asked_bytes - total) + " against the step as asked")
                                                     : (", " + format_bytes(total - asked_bytes) +
                                                        " more than the step as asked with its own best levers");
    print_out("  %-56s fits: %s (per rank %s%s)\n", r.flags.c_str(), levers_text(*r.answer.best, flags.model.sequence_parallel).c_str(),
              format_bytes(total).c_str(), saved.c_str());
  }
  return kExitOk;
}

int run_fit(const FitFlags& asked) {
  FitFlags flags = asked;
  // --tensor-parallel T alone: T devices, one replica.
  if (flags.devices == 1) flags.devices = flags.model.tensor_parallel;
  if (flags.serve) {
    if (flags.model.tensor_parallel > 1) {
      std::cerr << "memplan fit --serve: --tensor-parallel plans training steps; serving plans one device's caches\n";
      return kExitUsage;
    }
    return run_fit_serve(flags);
  }
  auto question = fit_question(flags);
  if (!question) {
    std::cerr << "memplan fit: " << question.error().message << "\n";
    return kExitUsage;
  }
  if (!flags.allow.empty() && !flags.suggest) {
    std::cerr << "memplan fit: --allow names the recipes --suggest may propose: add --suggest\n";
    return kExitUsage;
  }
  if (flags.suggest) return run_suggest(flags, question.value());
  auto answered = planner::answer_fit(question.value());
  if (!answered) {
    std::cerr << "memplan fit: " << answered.error().message << "\n";
    return kExitUsage;
  }
  const planner::FitAnswer& a = answered.value();
  const std::string suggestion = a.suggestion ? suggestion_text(a, flags, question.value().step.batch) : "";
  // What each lever pulled saves (a plan per lever released): for the batch asked, not a search.
  std::vector<planner::LeverSaving> savings;
  if (!flags.max_batch && pulls_levers(levers_of(flags))) {
    auto s = planner::lever_savings(step_with_levers(flags), levers_of(flags), question.value().step.batch, flags.devices,
                                    question.value().request, question.value().device_memory);
    if (!s) {
      std::cerr << "memplan fit: " << s.error().message << "\n";
      return kExitUsage;
    }
    savings = std::move(s).value();
  }
  if (flags.json) {
    nlohmann::json j = fit_json(flags, question.value(), a, suggestion);
    if (!savings.empty()) j["lever_savings"] = savings_json(savings);
    std::cout << j.dump(2) << "\n";
  } else {
    print_fit(flags, question.value(), a, suggestion);
    print_savings(savings);
  }
  return kExitOk;
}

}  // namespace

Command add_fit_command(CLI::App& root) {
  auto flags = std::make_shared<FitFlags>();
  CLI::App* app = root.add_subcommand(
      "fit", "Does a training step fit a device's memory, and what is the largest batch that does? Planning only.");
  add_model_options(*app, flags->model, /*trainable_only=*/false, /*shapes=*/true);
  add_checkpoint_options(*app, flags->checkpoint, /*with_budget=*/false);
  add_schedule_option(*app, flags->schedule);
  app->add_option("--device-memory,--budget", flags->device_memory,
                  "The device's memory, e.g. 80GiB, 24GB, 16000MiB, or bytes (--budget: the older name, kept for a release)")
      ->required()
      ->check(byte_size());
  app->add_option("--host-memory", flags->host_memory,
                  "The host memory a rank may use, e.g. 512GiB: with --offload-optimizer the offloaded state must fit it "
                  "too (not checked when absent)")
      ->check(byte_size());
  add_enum_option(*app, "--device", flags->device, kernels::kDeviceKindNames,
                  "cuda (the cuBLAS workspace inside the arena; CUDA context and library handles outside) or cpu");
  app->add_option("--overhead", flags->overhead, "Runtime overhead outside the arena, replacing the built-in constants")
      ->check(byte_size(/*allow_zero=*/true));
  app->add_flag("--max-batch", flags->max_batch,
                "Also search the largest batch that fits (exact: it fits, one more does not) for each checkpoint "
                "strategy side by side, or for --checkpoint alone when given");
  app->add_flag("--minimum", flags->minimum,
                "When the batch does not fit, also find the least arena any checkpoint strategy reaches and the "
                "strategy that reaches it (a plan per point of the optimal strategy's frontier: seconds for "
                "billion-parameter models)");
  app->add_flag("--json", flags->json, "Print the answer as JSON");
  app->add_flag("--serve", flags->serve,
                "Serving instead of training (the GPT and LLaMA decoders): weights, the decode step's arena and a KV cache of --seq "
                "positions per sequence; the most concurrent sequences (contiguous) and KV blocks (paged) that fit");
app->add_option("--kv-dtype", flags->kv_dtype,
                  "--serve: the KV cache's dtype: same (--dtype), fp32, bf16, fp16, or 8 bits a value: fp8 (e4m3, an f32 "
                  "scale for the keys and one for the values of each layer) or int8 (an f32 scale per position and K/V "
                  "head, for keys and values)")
      ->check(CLI::IsMember({"same", "fp32", "bf16", "fp16", "fp8", "int8"}))
      ->capture_default_str();
  app->add_option("--block-size", flags->block_size, "--serve: positions per KV block (paged)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  app->add_flag("--suggest", flags->suggest,
                "Propose the cheapest combination of levers that fits --devices devices at --batch: activation "
                "checkpointing, ZeRO stage, tensor-parallel degree (1, 2, 4, 8 dividing --devices), optimizer offload, "
                "micro-batch with gradient accumulation. Each combination is planned; the fitting ones are ranked by "
                "an estimated step time (FLOPs, collective and host bytes at an H100 node's rates), and the best's "
                "levers are each released once to show what it saves");
  app->add_option("--allow", flags->allow,
                  "With --suggest: fine-tuning recipes the job may change to, each planned with the same levers: lora "
                  "(LoRA rank 8 on q and v, the base frozen), quant (QLoRA: lora with the base in NF4 with double "
                  "quantization), 8bit (AdamW's moments in bitsandbytes' block-wise 8 bits: --optimizer adamw8bit); "
                  "each line says what it saves against the step as asked")
      ->delimiter(',')
      ->check(CLI::IsMember({"lora", "quant", "8bit"}));
  app->add_option("--devices", flags->devices,
                  "Devices (ranks): plan one rank's step, --batch being the global batch; data-parallel replicas of "
                  "--tensor-parallel devices each (default: --tensor-parallel)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--zero", flags->zero,
                  "With --devices: ZeRO stage 0 (gradients all-reduced), 1 (optimizer state sharded), 2 (gradients "
                  "too), 3 (parameters too)")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app->add_option("--bucket-mb", flags->bucket_mb, "With --devices: gradient bucket size in MiB")
      ->check(positive_finite())
      ->check(CLI::Range(1.0 / 1024.0, 1024.0 * 1024.0))
      ->capture_default_str();
  app->add_option("--prefetch", flags->prefetch, "With --devices and --zero 3: layers whose parameters are gathered ahead")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  return Command{app, [flags, app] {
                   flags->checkpoint_given = app->get_option("--checkpoint")->count() > 0;
                   return run_fit(*flags);
                 }};
}

}  // namespace memplan::tools
