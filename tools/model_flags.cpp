#include "tools/model_flags.h"

#include <cctype>
#include <charconv>
#include <utility>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "memplan/models/registry.h"
#include "tools/cli_util.h"

namespace memplan::tools {

void add_model_options(CLI::App& app, ModelFlags& flags, bool trainable_only, bool shapes) {
  CLI::Option* model = app.add_option("--model", flags.name,
                 trainable_only ? "Model: one of the trainable reference models"
                                : "Model: a trainable reference model or a zoo configuration (planning only)")
      ->check(CLI::IsMember(trainable_only ? models::trainable_model_names() : models::model_names()))
      ->capture_default_str();
  app.add_option("--batch", flags.batch, "Samples per step (default: the model's)")->check(positive_integer());
  add_enum_option(app, "--optimizer", flags.optimizer, graph::kOptimizerNames,
                  "sgd, momentum, adamw, adamw8bit (bitsandbytes' block-wise 8-bit moments) or paged_adamw8bit (the same, large tensors' moments in host-visible memory): decides the optimizer state");
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
                             "PATH"));
  app.add_flag("--verbose", flags.list_unread_config_keys,
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
  app.add_option("--expert-parallel", flags.expert_parallel,
                 "Expert parallelism over this many data-parallel devices (of --devices): each holds experts/E of "
                 "every mixture layer's experts and runs them on every device's tokens, sent and returned by two "
                 "all-to-alls planned in the arena; expert gradients are summed (and ZeRO-sharded) over the devices "
                 "holding the same experts. The step planned is one rank's; mixtures of experts only")
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
  add_lora_options(app, flags.lora);
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


void add_moe_capacity_option(CLI::App& app, std::optional<double>& factor) {
  app.add_option("--moe-capacity-factor", factor,
                 "With a mixture-of-experts --config (mixtral, qwen2_moe, qwen3_moe): slots per expert as a multiple of "
                 "its balanced share (tokens x experts per token / experts). Tokens routed beyond an expert's slots are "
                 "dropped for it, as GShard and Switch do; 0 gives every expert a slot for every token (nothing dropped). "
                 "Default 1: a balanced load")
      ->check(finite_in_range(0.0, 1e6));
}


namespace {

// "RANK" or "RANK:ALPHA" as (rank, alpha); an Error says what would work.
Result<std::pair<int, float>> parse_lora_spec(const std::string& text) {
  const std::size_t colon = text.find(':');
  const std::string rank_text = text.substr(0, colon);
  std::int64_t rank = 0;
  const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
  if (rank_text.empty() || ec != std::errc() || end != rank_text.data() + rank_text.size()) {
    if (!rank_text.empty() && rank_text[0] == '-' && ec == std::errc()) return Error{"the rank must be at least 1"};
    return Error{"give RANK or RANK:ALPHA, e.g. --lora 8 or --lora 16:32"};
  }
  if (rank < 1) return Error{"the rank must be at least 1"};
  if (rank > (std::int64_t{1} << 20)) return Error{"a rank above 1048576 is wider than any layer"};
  float alpha = graph::LoraConfig{}.alpha;
  if (colon != std::string::npos) {
    const std::string alpha_text = text.substr(colon + 1);
    char* stop = nullptr;
    const double a = std::strtod(alpha_text.c_str(), &stop);
    if (alpha_text.empty() || *stop != '\0' || !std::isfinite(a) || a <= 0.0 || a > 1e30) {
      return Error{"ALPHA must be a number > 0, e.g. --lora 16:32"};
    }
    alpha = static_cast<float>(a);
  }
  return std::pair<int, float>{static_cast<int>(rank), alpha};
}

// Module names and freeze patterns: letters, digits and _ . - (and * in patterns).
CLI::Validator name_list_item(bool glob) {
  return CLI::Validator(
      [glob](std::string& value) -> std::string {
        if (value.empty()) return "an empty name";
        for (char c : value) {
          const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' || (glob && c == '*');
          if (!ok) return "'" + value + "' holds a character a " + std::string(glob ? "parameter pattern" : "module name") + " does not";
        }
        if (value[0] == '-') return "'" + value + "' is not a name";
        return {};
      },
      glob ? "PATTERN" : "NAME");
}

}  // namespace

void add_lora_options(CLI::App& app, LoraFlags& flags, bool with_quant) {
  app.add_option("--lora", flags.lora,
                 "LoRA fine-tuning: adapters of rank RANK (scaled by ALPHA / RANK; ALPHA 8 by default, as PEFT's) on "
                 "the --lora-targets layers, every other parameter frozen (no gradient, optimizer state or master copy)")
      ->type_name("RANK[:ALPHA]")
      ->check(CLI::Validator(
          [](std::string& value) {
            auto spec = parse_lora_spec(value);
            return spec ? std::string() : "'" + value + "': " + spec.error().message;
          },
          "RANK[:ALPHA]"));
  app.add_option("--lora-targets", flags.targets,
                 "With --lora: the linear layers to adapt, by module name as PEFT names them (q,k,v,o,gate,up,down for "
                 "q_proj...down_proj; a GPT's q,k,v,attn.proj,mlp.fc,mlp.proj), or all-linear (every linear layer but "
                 "the output head); default q,v")
      ->delimiter(',')
      ->check(name_list_item(false));
  app.add_option("--lora-dropout", flags.dropout, "With --lora: dropout on the adapters' input (PEFT's lora_dropout)")
      ->check(finite_in_range(0.0, 0.999))
      ->capture_default_str();
  app.add_option("--lora-dtype", flags.dtype,
                 "With --lora: the adapters' dtype, fp32 (as PEFT keeps them; a 16-bit step casts their input up and "
                 "their output down) or working (the step's --dtype)")
      ->check(CLI::IsMember({"fp32", "working"}))
      ->capture_default_str();
  app.add_option("--freeze", flags.freeze,
                 "Freeze the parameters whose names match PATTERN ('*' matches any text; several comma-separated): "
                 "partial fine-tuning, with or without --lora")
      ->delimiter(',')
      ->check(name_list_item(true))
      ->type_name("PATTERN");
  if (!with_quant) return;
  add_enum_option(app, "--quant", flags.quant, graph::kQuantFormatNames,
                  "Store the frozen linear layers' weights quantized, as the libraries lay them out (QLoRA with --lora): "
                  "nf4 or fp4 (bitsandbytes: 4-bit codes, an f32 scale per 64), int8 (LLM.int8: f32 row scales), fp8 "
                  "(e4m3, one scale), gptq or awq (packed int4, fp16 scales and packed zeros per --group-size input "
                  "channels; gptq adds g_idx). Each product dequantizes a tile of rows at a time in planned scratch; "
                  "embeddings, the output head and norms stay at --dtype");
  app.add_flag("--double-quant", flags.double_quant,
               "With --quant nf4 or fp4: the block scales quantized again (u8 codes, an f32 scale per 256 of them and an "
               "offset), as QLoRA's double quantization");
  app.add_option("--group-size", flags.group_size, "With --quant gptq or awq: input channels per scale and zero (default 128)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
}

Result<graph::QuantConfig> quant_config(const LoraFlags& flags) {
  graph::QuantConfig config;
  config.format = flags.quant;
  config.double_quant = flags.double_quant;
  const bool grouped = flags.quant == graph::QuantFormat::gptq || flags.quant == graph::QuantFormat::awq;
  if (flags.double_quant && flags.quant != graph::QuantFormat::nf4 && flags.quant != graph::QuantFormat::fp4) {
    return Error{"--double-quant applies to --quant nf4 and fp4"};
  }
  if (flags.group_size > 0 && !grouped) return Error{"--group-size applies to --quant gptq and awq"};
  config.group_size = flags.group_size > 0 ? flags.group_size : 128;
  return config;
}

Result<graph::LoraConfig> lora_config(const LoraFlags& flags, graph::DType working, int tensor_parallel) {
  if ((!flags.lora.empty() || !flags.freeze.empty()) && tensor_parallel > 1) {
    return Error{"--lora and --freeze do not combine with --tensor-parallel yet: plan one rank's fine-tuning without it"};
  }
  graph::LoraConfig config;
  config.freeze = flags.freeze;
  if (flags.lora.empty()) {
    if (!flags.targets.empty()) return Error{"--lora-targets applies with --lora RANK"};
    if (flags.dropout != 0.0) return Error{"--lora-dropout applies with --lora RANK"};
    return config;
  }
  auto spec = parse_lora_spec(flags.lora);
  if (!spec) return Error{"--lora " + flags.lora + ": " + spec.error().message};
  config.rank = spec.value().first;
  config.alpha = spec.value().second;
  if (!flags.targets.empty()) config.targets = flags.targets;
  config.dropout = static_cast<float>(flags.dropout);
  if (flags.dtype == "working") config.dtype = working;
  return config;
}

void print_notes(const std::vector<std::string>& notes) {
  for (const std::string& note : notes) std::cerr << note << "\n";
}

Result<planner::StepDescription> step_description(const ModelFlags& flags, bool notes) {
  graph::OptimizerConfig optimizer;
  optimizer.kind = flags.optimizer;
  auto resolved = models::resolve_model(flags, optimizer);
  if (!resolved) return resolved.error();
  if (notes) print_notes(resolved.value().notes);
  planner::StepDescription step = std::move(resolved.value().step);
  step.offload_optimizer = flags.offload_optimizer;
  step.fused_loss = flags.fused_loss;
  auto lora = lora_config(flags.lora, flags.dtype, flags.tensor_parallel);
  if (!lora) return lora.error();
  step.lora = std::move(lora).value();
  auto quant = quant_config(flags.lora);
  if (!quant) return quant.error();
  step.quant = quant.value();
  return step;
}

}  // namespace memplan::tools
