#include "tools/cli_util.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "memplan/common/atomic_file.h"
#include "memplan/common/byte_size.h"
#include "memplan/common/memory_files.h"
#include "memplan/graph/training_step.h"
#include "memplan/import/onnx_source.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/step_size.h"
#include "memplan/runtime/caching_allocator.h"

namespace memplan::tools {

CLI::Validator positive_finite() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::size_t used = 0;
        double v = 0.0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
          return "'" + value + "' is not a number";
        }
        if (used != value.size()) return "'" + value + "' is not a number";
        if (!std::isfinite(v) || v <= 0.0) return "must be a finite number > 0, got '" + value + "'";
        return {};
      },
      "NUMBER > 0");
}

CLI::Validator finite_in_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        std::size_t used = 0;
        double v = 0.0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
          return "'" + value + "' is not a number";
        }
        if (used != value.size()) return "'" + value + "' is not a number";
        if (!std::isfinite(v) || v < lo || v > hi) {
          std::ostringstream msg;
          msg << "must be a number in [" << lo << ", " << hi << "], got '" << value << "'";
          return msg.str();
        }
        return {};
      },
      "NUMBER");
}

CLI::Validator positive_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(value, &used);
        } catch (const std::exception&) {
          return "'" + value + "' is not an integer in range";
        }
        if (used != value.size()) return "'" + value + "' is not an integer";
        if (v < 1) return "must be at least 1, got '" + value + "'";
        return {};
      },
      "INTEGER >= 1");
}

void add_checkpoint_options(CLI::App& app, CheckpointFlags& flags, bool with_budget) {
  add_enum_option(app, "--checkpoint", flags.strategy, planner::kCheckpointStrategyNames,
                  "Activation checkpointing: none, sqrt (Chen et al.), optimal (least recomputation for the "
                  "budget), auto (the cheapest that fits the budget)");
  if (with_budget) {
    app.add_option("--budget", flags.budget,
                   "Arena budget for --checkpoint, e.g. 24GiB, 512MB or bytes (without it sqrt and optimal "
                   "minimise memory)")
        ->check(byte_size());
  }
}

Status apply_checkpoint_flags(const CheckpointFlags& flags, planner::PlanRequest& request) {
  request.checkpoint = flags.strategy;
  if (!flags.budget.empty()) {
    auto parsed = parse_byte_size(flags.budget);
    if (!parsed) return Error{"--budget: " + parsed.error().message};
    request.budget = parsed.value();
  }
  return Status::success();
}

void add_model_options(CLI::App& app, ModelFlags& flags, bool trainable_only, bool shapes) {
  CLI::Option* model = app.add_option("--model", flags.model,
                 trainable_only ? "Model: one of the trainable reference models"
                                : "Model: a trainable reference model or a zoo configuration (planning only)")
      ->check(CLI::IsMember(trainable_only ? models::trainable_model_names() : models::model_names()))
      ->capture_default_str();
  app.add_option("--batch", flags.batch, "Samples per step (default: the model's)")->check(positive_integer());
  add_enum_option(app, "--optimizer", flags.optimizer, graph::kOptimizerNames,
                  "sgd, momentum or adamw (decides the optimizer state)");
  app.add_option("--hidden", flags.hidden, "MLP hidden widths")->delimiter(',')->check(positive_integer())->capture_default_str();
  app.add_option("--onnx", flags.onnx,
                 "An ONNX model file (torch.onnx.export, opset 13-17) instead of --model: its forward graph, its "
                 "initializers as parameters, --batch as the first dimension of its inputs")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name an ONNX file") : std::string(); }, "FILE"))
      ->excludes(model);
  add_enum_option(app, "--loss", flags.loss, import::kLossKindNames,
                  "With --onnx: cross_entropy (logits [..., classes] against class labels) or mse on the output");
  app.add_option("--output", flags.output, "With --onnx: the graph output the loss reads (default: the first)");
  if (!shapes) return;
  app.add_option("--config", flags.config,
                 "A Hugging Face config.json (model_type " + models::supported_model_types() +
                     ") to plan instead of --model; the shipped ones are in models/configs")
      ->excludes("--model")
      ->check(CLI::Validator([](std::string& path) { return path.empty() ? std::string("a file path is required") : std::string(); },
                             "PATH"))
      ->each([&flags](const std::string& path) { flags.model = path; });
  app.add_flag("--verbose", flags.verbose,
               "With --config: list the config's keys memplan does not read (for its model_type none changes what "
               "memplan plans; a key that would and is not modelled is refused)");
  add_moe_capacity_option(app, flags.moe_capacity_factor);
  app.add_option("--seq", flags.seq, "Tokens per sequence (language models; default: the model's)")->check(positive_integer());
  app.add_option("--target-seq", flags.target_seq,
                 "Decoder tokens per sequence of an encoder-decoder --config (t5; default: --seq)")
      ->check(positive_integer());
  app.add_option("--vocab", flags.vocab,
                 "Vocabulary size of a text model (gpt, decoder configs; default: gpt's is its default text's, "
                 "as train builds it, a config's its own)")
      ->check(positive_integer());
  app.add_option("--image-size", flags.image_size, "Pixels per side (vision models; default: the model's)")
      ->check(positive_integer());
  add_enum_option(app, "--dtype", flags.dtype, graph::float_dtype_names(),
                  "fp32, or bf16/fp16 mixed precision: 16-bit weights, activations and gradients, fp32 master "
                  "weights and optimizer state (what train --dtype runs)");
  app.add_flag("--offload-optimizer", flags.offload_optimizer,
               "Optimizer offload (ZeRO-Offload): optimizer state and fp32 master weights in host memory, updated there "
               "from gradients copied out (planned as copies); the arena keeps weights, activations and gradients, and "
               "the host region is reported beside it");
  app.add_option("--tensor-parallel", flags.tensor_parallel,
                 "Tensor parallelism (Megatron-LM) over this many ranks: each holds 1/T of every attention and MLP "
                 "weight (heads, K/V heads and the MLP's hidden width split; row-parallel outputs summed by an "
                 "all-reduce planned in the arena) and 1/T of the vocabulary (embedding and loss). The step planned "
                 "is one rank's; decoders only (gpt, the zoo's and configs' decoders)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_flag("--sequence-parallel", flags.sequence_parallel,
               "With --tensor-parallel: sequence parallelism (Korthikanti et al.): the norms, dropouts and residual "
               "adds between the parallel layers run on 1/T of the token rows of each rank, the all-reduces become "
               "an all-gather before each column-parallel layer and a reduce-scatter after each row-parallel one "
               "(the same bytes moved); batch x sequence must divide by T");
  add_enum_option(app, "--attention", flags.attention, models::kAttentionKindNames,
                  "Transformers: fused (one attention op keeping the output and a log-sum-exp per row, as "
                  "PyTorch's scaled_dot_product_attention) or materialized ([B, heads, T, T] scores, softmax and "
                  "dropout stored); auto (the default) is fused",
                  "auto");
  add_fused_loss_option(app, flags.fused_loss);
}

void add_schedule_option(CLI::App& app, std::optional<planner::ScheduleKind>& schedule) {
  add_enum_option(app, "--schedule", schedule, planner::kScheduleNames,
                  "Op order: program (the order the step was built in: every update after the backward pass), "
                  "memory_aware (each update as soon as its gradient is final), searched (ops moved across the "
                  "peak of the lower of those two while that lowers it; the same results, bit for bit), or auto "
                  "(the default): all three planned, the lowest arena kept",
                  "auto");
}

void apply_schedule_flag(std::optional<planner::ScheduleKind> schedule, planner::PlanRequest& request) {
  request.choose_best_schedule = !schedule.has_value();
  if (schedule) request.schedule = *schedule;
}

void add_fused_loss_option(CLI::App& app, graph::FusedLoss& mode) {
  add_enum_option(app, "--fused-loss", mode, graph::kFusedLossNames,
                  "Training steps whose loss is a cross-entropy of logits h w^T (language models' heads): on computes "
                  "the product and the loss together a chunk of rows at a time, recomputing the chunks in the backward "
                  "pass, so the [tokens, vocabulary] logits and their gradient are never stored (Liger's, Cut "
                  "Cross-Entropy's idea; one more product of the head's size); off stores them; auto (the default) "
                  "fuses where that lowers the arena");
}

namespace {

// A size knob (graph/model_source.h) as the flag, or config field, that sets it.
std::string flag_name(const graph::SizeKnob& k, std::optional<std::int64_t> value) {
  const std::string v = value ? " " + std::to_string(*value) : "";
  if (k.key == "num_hidden_layers") return "num_hidden_layers" + v + (value ? " (the config's layer count)" : "");
  if (k.key == "hidden_count") return value ? "--hidden with " + std::to_string(*value) + " widths" : "the --hidden widths";
  if (k.key == "hidden" && k.position > 0) return "--hidden (width " + std::to_string(k.position) + ")" + v;
  static const std::pair<const char*, const char*> kFlags[] = {
      {"batch", "--batch"}, {"seq", "--seq"}, {"target_seq", "--target-seq"}, {"image_size", "--image-size"}, {"width", "--width"},
      {"layers", "--layers"}, {"hidden", "--hidden"}};
  for (const auto& [key, flag] : kFlags) {
    if (k.key == key) return flag + v;
  }
  return k.quantity + v;  // a knob no flag sets: its own name
}

// The sizes train takes from the data (the GPT's vocabulary), or --vocab.
Status apply_data_sizes(models::ModelOptions& model, const ModelFlags& flags) {
  Status s = models::set_data_sizes(model, flags.vocab);
  if (s) return s;
  return Error{flags.vocab > 0 ? "--vocab: " + s.error().message : s.error().message + "; or give --vocab N"};
}

Result<planner::StepDescription> onnx_step_description(const ModelFlags& flags) {
  if (flags.seq > 0 || flags.target_seq > 0 || flags.image_size > 0) {
    return Error{"--seq, --target-seq and --image-size do not apply to --onnx: the file fixes every size but the batch"};
  }
  if (flags.vocab > 0) return Error{"--vocab does not apply to --onnx: the file fixes every size but the batch"};
  if (flags.attention) return Error{"--attention does not apply to --onnx: the file's own attention ops are imported as they are"};
  if (flags.tensor_parallel > 1) {
    return Error{"--tensor-parallel does not apply to --onnx: an imported graph is planned whole on each rank (use "
                 "--devices for data parallelism)"};
  }
  if (!graph::is_floating(flags.dtype)) return Error{"--dtype: " + std::string(graph::dtype_name(flags.dtype)) + " is not a floating dtype"};
  auto model = import::OnnxModel::load(flags.onnx);
  if (!model) return Error{"--onnx: " + model.error().message};
  import::ImportOptions options;
  options.loss = flags.loss;
  options.output = flags.output;
  options.dtype = flags.dtype;
  graph::OptimizerConfig optimizer;
  optimizer.kind = flags.optimizer;
  planner::StepDescription step = planner::StepDescription::of_source(
      import::onnx_source(std::move(model).value(), options), flags.batch > 0 ? flags.batch : 1, optimizer);
  // An unsupported op or inconsistent shapes are the file's fault: said now, naming the node.
  try {
    (void)step.source->forward(1);
  } catch (const graph::SizeError&) {
  } catch (const graph::GraphError& e) {
    return Error{"--onnx: " + std::string(e.what())};
  }
  if (Status s = check_step_size_flags(step); !s) return s.error();
  return step;
}

// What a mixture of experts' plan assumes of the routing, said once on stderr (--json stays one
// document); nothing for other models.
void note_moe_capacity(const models::LlamaConfig& config, std::int64_t batch, std::int64_t seq) {
  const std::string moe = models::describe_moe_capacity(config, batch * seq);
  if (!moe.empty()) std::cerr << "note: " << moe << " (at batch " << batch << ")\n";
}

// The step of a --config model: its sizes checked against the config's family.
Result<planner::StepDescription> config_step_description(const ModelFlags& flags) {
  auto config = models::read_hf_config(flags.config);
  if (!config) return Error{"--config " + config.error().message};
  if (Status s = apply_moe_capacity(config.value(), flags.config, flags.moe_capacity_factor); !s) return s.error();
  const models::HfConfig& c = config.value();
  if (flags.verbose) note_unread_config_keys(flags.config, c);
  if (flags.seq > 0 && c.vision()) return Error{"--seq applies to language models; the config " + flags.config + " is a " + c.model_type};
  if (flags.image_size > 0 && !c.vision()) {
    return Error{"--image-size applies to vision models; the config " + flags.config + " is a " + c.model_type};
  }
  if (flags.target_seq > 0 && !c.encoder_decoder()) {
    return Error{"--target-seq applies to encoder-decoder configs (t5); the config " + flags.config + " is a " + c.model_type};
  }
  if (Status s = check_encoder_decoder_attention(c.encoder_decoder(), flags.attention, flags.config); !s) return s.error();
  if (flags.seq > 0 && c.learned_positions && flags.seq > c.positions) {
    return Error{"--seq " + std::to_string(flags.seq) + " exceeds the " + std::to_string(c.positions) +
                 " learned positions of " + flags.config};
  }
  if (flags.image_size > 0 && flags.image_size % c.patch_size != 0) {
    return Error{"--image-size " + std::to_string(flags.image_size) + " is not a multiple of the patch size " +
                 std::to_string(c.patch_size) + " of " + flags.config};
  }
  if (!graph::is_floating(flags.dtype)) return Error{"--dtype: " + std::string(graph::dtype_name(flags.dtype)) + " is not a floating dtype"};
  models::ModelOptions model;
  model.name = flags.config;
  model.config = c;
  model.zoo = {flags.seq, flags.image_size, flags.dtype};
  model.zoo.attention = flags.attention.value_or(models::AttentionKind::fused);  // every config is a transformer
  model.zoo.target_seq = flags.target_seq;
  models::set_tensor_parallel(model, {flags.tensor_parallel, 0, flags.sequence_parallel});
  if (Status s = apply_data_sizes(model, flags); !s) return s.error();
  graph::OptimizerConfig optimizer;
  optimizer.kind = flags.optimizer;
  graph::ModelSource source = models::registry_source(std::move(model));
  const std::int64_t batch = flags.batch > 0 ? flags.batch : source.default_batch;
  if (c.family == models::HfFamily::llama) note_moe_capacity(c.llama, batch, flags.seq > 0 ? flags.seq : c.positions);
  planner::StepDescription step = planner::StepDescription::of_source(std::move(source), batch, optimizer);
  auto problem = planner::find_step_size_problem(step);
  if (!problem) return step;
  std::string message = planner::describe(*problem, {flag_name, "flags"});
  if (flags.seq == 0 && problem->kind == planner::StepSizeProblem::Kind::too_large && problem->knob.key == "seq") {
    message += " (without --seq, the config's " + std::to_string(c.positions) + " positions are the sequence length)";
  }
  return Error{message};
}

}  // namespace

Status check_encoder_decoder_attention(bool encoder_decoder, std::optional<models::AttentionKind> asked,
                                       const std::string& model) {
  if (!encoder_decoder || asked != models::AttentionKind::fused) return Status::success();
  return Error{"--attention fused does not apply to " + model + ": T5's relative position bias adds onto the attention "
               "scores, so its attention is materialized (leave out --attention)"};
}

Status check_step_size_flags(const planner::StepDescription& step) {
  if (auto problem = planner::find_step_size_problem(step)) return Error{planner::describe(*problem, flag_naming())};
  return Status::success();
}

planner::SizeNaming flag_naming() { return {flag_name, "flags"}; }

Result<models::ModelOptions> model_options(const ModelFlags& flags) {
  const models::ModelInfo* info = models::find_model(flags.model);
  if (info == nullptr) return Error{"--model: unknown model '" + flags.model + "'"};
  const bool language = !info->vision && flags.model != "mlp";
  if (flags.seq > 0 && !language) return Error{"--seq applies to language models; '" + flags.model + "' takes none"};
  if (flags.image_size > 0 && !info->vision) {
    return Error{"--image-size applies to vision models (cnn, vit-b16, resnet50), not '" + flags.model + "'"};
  }
  if (!graph::is_floating(flags.dtype)) return Error{"--dtype: " + std::string(graph::dtype_name(flags.dtype)) + " is not a floating dtype"};
  const models::ZooModel* zoo = models::find_zoo_model(flags.model);
  const bool encoder_decoder = zoo != nullptr && zoo->encoder_decoder;
  if (flags.target_seq > 0 && !encoder_decoder) {
    return Error{"--target-seq applies to encoder-decoder models (t5-small, t5-base, flan-t5-base, flan-t5-xl, a t5 "
                 "--config), not '" + flags.model + "'"};
  }
  if (Status s = check_encoder_decoder_attention(encoder_decoder, flags.attention, flags.model); !s) return s.error();
  if (flags.attention && !models::has_attention(flags.model)) {
    return Error{"--attention applies to transformers (gpt, the zoo's models but resnet50, and --config), not '" +
                 flags.model + "'"};
  }
  models::ModelOptions model;
  model.name = flags.model;
  model.mlp.hidden = flags.hidden;
  if (flags.seq > 0) model.gpt.context = flags.seq;
  if (flags.image_size > 0) model.cnn.image = flags.image_size;
  model.zoo = {flags.seq, flags.image_size, flags.dtype};
  model.zoo.attention = model.gpt.attention = flags.attention.value_or(models::AttentionKind::fused);
  model.zoo.target_seq = flags.target_seq;
  models::set_tensor_parallel(model, {flags.tensor_parallel, 0, flags.sequence_parallel});
  if (Status s = apply_data_sizes(model, flags); !s) return s.error();
  return model;
}

namespace {

Result<planner::StepDescription> registry_step_description(const ModelFlags& flags) {
  auto model = model_options(flags);
  if (!model) return model.error();
  graph::OptimizerConfig optimizer;
  optimizer.kind = flags.optimizer;
  graph::ModelSource source = models::registry_source(std::move(model).value());
  const std::int64_t batch = flags.batch > 0 ? flags.batch : source.default_batch;
  if (auto llama = models::zoo_llama_config(flags.model, {flags.seq}); llama.ok()) {
    note_moe_capacity(llama.value(), batch, llama.value().context);
  }
  planner::StepDescription step = planner::StepDescription::of_source(std::move(source), batch, optimizer);
  if (Status s = check_step_size_flags(step); !s) return s.error();
  return step;
}

}  // namespace

Result<planner::StepDescription> step_description(const ModelFlags& flags) {
  if (flags.sequence_parallel && flags.tensor_parallel < 2) {
    return Error{"--sequence-parallel splits the rows tensor parallelism leaves whole: give --tensor-parallel T (2 or more) too"};
  }
  auto step = !flags.onnx.empty()     ? onnx_step_description(flags)
              : !flags.config.empty() ? config_step_description(flags)
                                      : registry_step_description(flags);
  if (step) step.value().dtype = flags.dtype;  // mixed precision: every source's forward graph at --dtype
  if (step) step.value().offload_optimizer = flags.offload_optimizer;
  if (step) step.value().fused_loss = flags.fused_loss;
  return step;
}


namespace {
std::string mib(Bytes bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}
std::string mib_exact(Bytes bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f MiB (%lld B)", static_cast<double>(bytes) / (1024.0 * 1024.0),
                static_cast<long long>(bytes));
  return text;
}
}  // namespace

std::string unmet_budget_message(const planner::PlannedStep& step, planner::CheckpointStrategy asked) {
  std::string message = "budget " + mib_exact(step.budget.value_or(0)) + " is below what checkpoint " +
                        std::string(planner::checkpoint_strategy_name(asked)) + " can reach";
  if (step.checkpoint && step.checkpoint->minimum) {
    const planner::MinimumArena& least = *step.checkpoint->minimum;
    char overhead[64];
    std::snprintf(overhead, sizeof overhead, "%.1f", 100.0 * least.extra_flops_fraction);
    message += "; the minimum feasible arena is " + mib_exact(least.arena_bytes) + ", reached with --checkpoint " +
               std::string(planner::checkpoint_strategy_name(least.strategy)) + " (recompute +" + overhead +
               "% FLOPs); use a budget of at least that, a smaller batch or a smaller model";
  }
  return message;
}

std::string checkpoint_line(const planner::CheckpointOutcome& outcome) {
  char overhead[32];
  std::snprintf(overhead, sizeof overhead, "%.1f", 100.0 * outcome.extra_flops_fraction);
  return "checkpoint " + std::string(planner::checkpoint_strategy_name(outcome.chosen)) + ": arena " +
         mib(outcome.arena_bytes_without) + " -> " + mib(outcome.arena_bytes_with) + ", recompute +" + overhead + "% FLOPs";
}

std::string loss_fusion_line(const planner::LossFusionReport& report) {
  const graph::LossFusion& f = report.fusion;
  const std::string mode = "(--fused-loss " + std::string(graph::fused_loss_name(report.mode)) + ")";
  // Not applicable: said where --fused-loss on asked for it (auto stays quiet; JSON has why_not).
  if (!f.fused) return f.why_not.empty() || report.mode != graph::FusedLoss::on ? "" : "fused loss: not applied " + mode + ": " + f.why_not;
  const std::string bounds = report.unfused_lower_bound > 0
                                 ? "; arena lower bound " + format_bytes(report.fused_lower_bound) + " fused, " +
                                       format_bytes(report.unfused_lower_bound) + " unfused"
                                 : "";
  const std::string logits = "'" + f.logits + "' [" + std::to_string(f.rows) + ", " + std::to_string(f.vocab) + "]";
  if (!report.used) {
    const bool same = report.fused_lower_bound == report.unfused_lower_bound;
    return "fused loss: not used " + mode + ": storing the logits " + logits + (same ? " plans the same (the step peaks where they are not live)" : " plans less") + bounds;
  }
  return "fused loss: used " + mode + ": the logits " + logits + " are never stored, " + std::to_string(std::min(f.chunk_rows, f.rows)) +
         " rows at a time (" + format_bytes(graph::loss_chunk_scratch_bytes(f.rows, f.vocab, f.chunk_rows)) + " of scratch)" + bounds;
}

nlohmann::json loss_fusion_json(const planner::LossFusionReport& report) {
  const graph::LossFusion& f = report.fusion;
  nlohmann::json j{{"mode", graph::fused_loss_name(report.mode)}, {"used", report.used}};
  if (f.fused) {
    j["logits"] = f.logits;
    j["rows"] = f.rows;
    j["vocab"] = f.vocab;
    j["chunk_rows"] = std::min(f.chunk_rows, f.rows);
    j["scratch_bytes"] = graph::loss_chunk_scratch_bytes(f.rows, f.vocab, f.chunk_rows);
  }
  if (report.unfused_lower_bound > 0) {
    j["fused_lower_bound_bytes"] = report.fused_lower_bound;
    j["unfused_lower_bound_bytes"] = report.unfused_lower_bound;
  }
  if (!f.fused && !f.why_not.empty()) j["why_not"] = f.why_not;
  return j;
}

std::string swiglu_line(const graph::SwigluFusion& swiglu) {
  if (swiglu.pairs == 0) return "";
  return "swiglu: " + std::to_string(swiglu.pairs) + " silu-then-product pairs run as one op each: " + format_bytes(swiglu.bytes) +
         " of SiLU outputs recomputed in the backward pass, not stored (the same bits)";
}

nlohmann::json swiglu_json(const graph::SwigluFusion& swiglu) {
  return {{"pairs", swiglu.pairs}, {"silu_bytes_not_stored", swiglu.bytes}};
}

std::string copies_line(const graph::CopyRecompute& copies) {
  if (copies.copies == 0) return "";
  return "layout copies: " + std::to_string(copies.copies) + " permuted tensors (" + format_bytes(copies.bytes) +
         ") copied again in the backward pass from inputs it keeps, not stored (the same bits)";
}

nlohmann::json copies_json(const graph::CopyRecompute& copies) {
  return {{"copies", copies.copies}, {"bytes_not_stored", copies.bytes}};
}

std::string order_line(const planner::MemoryPlan& plan) {
  if (plan.memory_aware_arena_bytes == 0 || plan.program_order_arena_bytes == 0) return "";
  auto arena = [](Bytes bytes, bool skipped) { return (skipped ? "at least " : "") + format_bytes(bytes); };
  std::string line = "op order: " + std::string(planner::schedule_name(plan.schedule_kind));
  if (plan.schedule_kind == planner::ScheduleKind::searched) {
    line += " (" + std::to_string(plan.order_moves) + " ops moved across the peak)";
  }
  line += ", the lowest arena of: memory-aware " + arena(plan.memory_aware_arena_bytes, false) + ", program " +
          arena(plan.program_order_arena_bytes, plan.program_order_skipped);
  if (plan.searched_order_arena_bytes > 0) {
    line += ", searched " + arena(plan.searched_order_arena_bytes, plan.searched_order_skipped);
  }
  return line;
}

nlohmann::json order_json(const planner::MemoryPlan& plan) {
  nlohmann::json j{{"used", planner::schedule_name(plan.schedule_kind)}};
  if (plan.schedule_kind == planner::ScheduleKind::searched) j["moves"] = plan.order_moves;
  // Where an order was not solved its bytes are its lower bound (0: not looked at).
  j["program_arena_bytes"] = plan.program_order_arena_bytes;
  j["memory_aware_arena_bytes"] = plan.memory_aware_arena_bytes;
  j["searched_arena_bytes"] = plan.searched_order_arena_bytes;
  j["program_skipped"] = plan.program_order_skipped;
  j["searched_skipped"] = plan.searched_order_skipped;
  return j;
}

std::string rewrite_lines(const planner::StepRewrites& step, const planner::MemoryPlan* plan) {
  std::string out;
  for (const std::string& line : {loss_fusion_line(step.loss_fusion), swiglu_line(step.swiglu), copies_line(step.copies),
                                  plan != nullptr ? order_line(*plan) : std::string()}) {
    if (!line.empty()) out += line + "\n";
  }
  return out;
}

void add_rewrites_json(nlohmann::json& j, const planner::StepRewrites& step, const planner::MemoryPlan* plan) {
  j["fused_loss"] = loss_fusion_json(step.loss_fusion);
  j["swiglu"] = swiglu_json(step.swiglu);
  j["copies_recomputed"] = copies_json(step.copies);
  if (plan != nullptr) j["op_order"] = order_json(*plan);
}

nlohmann::json checkpoint_json(const planner::CheckpointOutcome& outcome) {
  int recompute_ops = 0;
  for (const graph::Op& op : outcome.graph.ops()) recompute_ops += op.phase == graph::Phase::recompute ? 1 : 0;
  nlohmann::json j{{"strategy", planner::checkpoint_strategy_name(outcome.chosen)},
                   {"arena_bytes_without", outcome.arena_bytes_without},
                   {"arena_bytes_with", outcome.arena_bytes_with},
                   {"fits", outcome.fits},
                   {"extra_flops_fraction", outcome.extra_flops_fraction},
                   {"recompute_ops", recompute_ops}};
  if (outcome.minimum) {
    j["minimum"] = {{"strategy", planner::checkpoint_strategy_name(outcome.minimum->strategy)},
                    {"arena_bytes", outcome.minimum->arena_bytes},
                    {"extra_flops_fraction", outcome.minimum->extra_flops_fraction}};
  }
  return j;
}

CLI::Validator whole_number(std::uint64_t max) {
  return CLI::Validator(
      [max](std::string& value) -> std::string {
        std::uint64_t v = 0;
        const char* end = value.data() + value.size();
        const auto [ptr, ec] = std::from_chars(value.data(), end, v);
        if (value.empty() || ec == std::errc::invalid_argument || ptr != end) {
          return "'" + value + "' is not a whole number (digits only)";
        }
        if (ec == std::errc::result_out_of_range || v > max) {
          return "'" + value + "' is larger than " + std::to_string(max);
        }
        return {};
      },
      "WHOLE NUMBER");
}

CLI::Validator alloc_conf() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto parsed = runtime::CachingAllocatorOptions::parse(value);
        return parsed ? std::string() : parsed.error().message;
      },
      "KEY:VALUE,...");
}

CLI::Validator byte_size(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& value) -> std::string {
        if (allow_zero && value == "0") return {};
        const Result<Bytes> parsed = parse_byte_size(value);
        return parsed ? std::string() : parsed.error().message;
      },
      allow_zero ? "SIZE|0" : "SIZE");
}

void print_out(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n > 0) {
    std::string text(static_cast<std::size_t>(n) + 1, '\0');
    std::vsnprintf(text.data(), text.size(), format, args);
    text.pop_back();
    std::cout << text;
  }
  va_end(args);
}

Progress::Progress(std::string label, std::int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}

void Progress::update(std::int64_t done, const std::string& detail) {
  if (!enabled_ || total_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total_);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld %s\033[K", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), detail.c_str());
  } else {
    const std::int64_t decile = done * 10 / total_;
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s %3lld%% %lld/%lld %s\n", label_.c_str(), static_cast<long long>(decile * 10),
                 static_cast<long long>(done), static_cast<long long>(total_), detail.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish(const std::string& detail) {
  if (!enabled_) return;
  if (tty_) std::fprintf(stderr, "\r%s done %s\033[K\n", label_.c_str(), detail.c_str());
  std::fflush(stderr);
}

bool write_report_file(std::string_view command, const std::string& path, std::string_view bytes) {
  if (write_memory_output(path, bytes)) return true;  // a report an in-process caller reads back
  if (Status s = write_file_atomically(path, bytes); !s) {
    std::cerr << "memplan " << command << ": cannot write " << s.error().message << "\n";
    return false;
  }
  return true;
}

void add_moe_capacity_option(CLI::App& app, std::optional<double>& factor) {
  app.add_option("--moe-capacity-factor", factor,
                 "With a mixture-of-experts --config (mixtral, qwen2_moe, qwen3_moe): slots per expert as a multiple of "
                 "its balanced share (tokens x experts per token / experts). Tokens routed beyond an expert's slots are "
                 "dropped for it, as GShard and Switch do; 0 gives every expert a slot for every token (nothing dropped). "
                 "Default 1: a balanced load")
      ->check(finite_in_range(0.0, 1e6));
}

Status apply_moe_capacity(models::HfConfig& config, const std::string& path, std::optional<double> factor) {
  if (!factor) return Status::success();
  if (config.llama.moe.experts <= 0) {
    return Error{"--moe-capacity-factor applies to mixtures of experts (mixtral, qwen2_moe, qwen3_moe); " + path + " is a " +
                 config.model_type + " without experts"};
  }
  config.llama.moe.capacity_factor = *factor;
  return Status::success();
}

void note_unread_config_keys(const std::string& path, const models::HfConfig& config) {
  std::string keys;
  for (const std::string& key : config.unread_keys) keys += (keys.empty() ? "" : ", ") + key;
  std::cerr << path << ": " << config.unread_keys.size() << " key" << (config.unread_keys.size() == 1 ? "" : "s")
            << " memplan does not read (for model_type " << config.model_type << " none changes what it plans)"
            << (keys.empty() ? "" : ": " + keys) << "\n";
}

}  // namespace memplan::tools
