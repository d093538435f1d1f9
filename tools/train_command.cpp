// memplan train: the flags as a train::TrainSpec, the library's run (train/run.h), its report
// rendered as text or JSON.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "memplan/common/byte_size.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_ref.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/executor.h"
#include "memplan/train/run.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/memory_report.h"
#include "tools/profile_report.h"

namespace memplan::tools {
namespace {

struct TrainFlags {
  std::string model = "mlp";
  std::int64_t epochs = 5;
  std::int64_t steps = 0;  // overrides epochs when set
  std::int64_t batch = 128;
  double lr = 1e-3;
  graph::OptimizerKind optimizer = graph::OptimizerKind::adamw;
  double momentum = 0.9;
  double weight_decay = 0.0;
  runtime::LrSchedule schedule;
  std::uint64_t seed = 0;
  graph::DType dtype = graph::DType::f32;
  bool tf32 = false;
  bool offload_optimizer = false;
  graph::FusedLoss fused_loss = graph::FusedLoss::auto_;
  LoraFlags lora;  // --lora, --lora-targets, --lora-dropout, --lora-dtype, --freeze
  std::string data;  // default per model: Fashion-MNIST or the fortunes
  std::vector<std::int64_t> hidden = {256, 256};
  models::GptConfig gpt;  // vocab comes from the text
  std::int64_t vocab = 0;  // --vocab: a text model's vocabulary instead of the text's (at least the text's)
  std::string save, load;
  std::string save_adapter, load_adapter;  // --save-adapter, --load-adapter: PEFT's adapter folders
  bool merge_lora = false;                 // --merge-lora
  train::CheckpointOptions checkpoints;  // --save-dir, --save-every, --keep, --on-save-error
  std::string on_save_error = "stop";
  // An ONNX classifier instead of --model (train/session.h: load_onnx_run_data).
  std::string onnx;
  import::LossKind loss = import::LossKind::cross_entropy;
  std::string output;
  std::string export_onnx;  // the trained weights written back into a copy of the file
  // A Hugging Face config instead of --model (train/session.h: load_run_data): the file, the
  // parsed config and the sequence asked with --seq (0: the default for configs).
  std::string config;
  std::optional<models::HfConfig> hf;
  std::int64_t config_seq = 0;
  std::int64_t target_seq = 0;  // --target-seq: an encoder-decoder config's target length (0: --seq)
  int threads = 0;
  runtime::ExecutionMode mode = runtime::ExecutionMode::planned;
  std::optional<kernels::DeviceKind> device;  // empty: auto (cuda when present, else cpu)
  std::vector<std::string> debug;
  std::string device_memory;  // empty: as much as the host gives
  bool json = false;
  bool quiet = false;
  bool verbose = false;  // --verbose: with --config, list the keys memplan does not read
  std::optional<double> moe_capacity_factor;  // --moe-capacity-factor: a mixture-of-experts --config's slots
  bool profile = false;
  std::optional<std::int64_t> eval_samples;  // empty: the whole test set, or 1024 validation sequences
  CheckpointFlags checkpoint;
  std::optional<planner::ScheduleKind> op_order;  // --schedule; empty: auto
  // Data parallel: one process per rank under mpirun (dist/communicator.h)
  int zero = 0;
  double bucket_mb = 25.0;
  int prefetch = 1;
  int tensor_parallel = 1;  // --tensor-parallel: consecutive ranks split each decoder layer
  bool sequence_parallel = false;  // --sequence-parallel
  int expert_parallel = 1;  // --expert-parallel: consecutive data ranks split each mixture layer's experts
};

// ", cosine schedule, 100 warm-up steps" after the learning rate; empty for a constant rate.
std::string schedule_label(const runtime::LrSchedule& s) {
  std::string out;
  if (s.kind != runtime::LrScheduleKind::constant) out += ", " + std::string(enum_name(runtime::kLrScheduleNames, s.kind)) + " schedule";
  if (s.warmup_steps > 0) out += ", " + std::to_string(s.warmup_steps) + " warm-up steps";
  return out;
}

std::string format_rate(double per_s, bool tokens) {
  std::ostringstream out;
  out.precision(0);
  out << std::fixed << per_s << (tokens ? " tokens/s" : " samples/s");
  return out.str();
}

// A float as the shortest decimal that reads back as it (the rate as typed, not 0.0030000000261).
double as_typed(float value) {
  for (int digits = 6; digits < 9; ++digits) {
    char text[32];
    std::snprintf(text, sizeof text, "%.*g", digits, double(value));
    const double typed = std::strtod(text, nullptr);
    if (static_cast<float>(typed) == value) return typed;
  }
  return double(value);
}

// Every line of a (possibly multi-line) message, as the command's own lines on stderr.
void print_error_lines(const std::string& message) {
  std::istringstream lines(message);
  for (std::string line; std::getline(lines, line);) std::cerr << "memplan train: " << line << "\n";
}

// The flags as the train library's spec: what the library validates is left to it.
Result<train::TrainSpec> train_spec(const TrainFlags& flags) {
  train::TrainSpec spec;
  spec.model.name = flags.hf ? flags.config : flags.model;
  spec.model.mlp.hidden = flags.hidden;
  spec.model.gpt = flags.gpt;
  if (flags.hf) {
    spec.model.config = *flags.hf;
    spec.model.zoo.attention = flags.gpt.attention;
    spec.model.zoo.seq = flags.config_seq;
    spec.model.zoo.target_seq = flags.target_seq;
  }
  models::set_tensor_parallel(spec.model, {flags.tensor_parallel, 0, flags.sequence_parallel});  // each rank's slice is set when it starts
  models::set_expert_parallel(spec.model, {flags.expert_parallel, 0});  // likewise each rank's share of the experts
  spec.onnx = {flags.onnx, flags.loss, flags.output, flags.export_onnx};
  spec.data = flags.data;
  spec.vocab = flags.vocab;
  spec.batch = flags.batch;
  spec.steps = flags.steps;
  spec.epochs = flags.epochs;
  spec.optimizer.kind = flags.optimizer;
  spec.optimizer.lr = static_cast<float>(flags.lr);
  spec.optimizer.momentum = static_cast<float>(flags.momentum);
  spec.optimizer.weight_decay = static_cast<float>(flags.weight_decay);
  spec.schedule = flags.schedule;
  spec.seed = flags.seed;
  spec.dtype = flags.dtype;
  spec.tf32 = flags.tf32;
  spec.offload_optimizer = flags.offload_optimizer;
  spec.fused_loss = flags.fused_loss;
  if (graph::is_8bit_adam(flags.optimizer) && flags.tensor_parallel > 1) {
    // A slice's 8-bit states are blocked over the slice, not the whole tensor: its checkpoints and
    // --save would not assemble them (fit and plan answer for it).
    return Error{"--optimizer " + std::string(graph::optimizer_name(flags.optimizer)) +
                 " with --tensor-parallel does not train yet (each rank's 8-bit blocks cover its own slice): train "
                 "with --optimizer adamw, or without --tensor-parallel"};
  }
  if (graph::is_8bit_adam(flags.optimizer) && flags.expert_parallel > 1) {
    return Error{"--optimizer " + std::string(graph::optimizer_name(flags.optimizer)) +
                 " with --expert-parallel does not train yet (each rank's 8-bit blocks cover its own experts): train "
                 "with --optimizer adamw, or without --expert-parallel"};
  }
  auto lora = lora_config(flags.lora, flags.dtype, flags.tensor_parallel);
  if (!lora) return lora.error();
  spec.lora = std::move(lora).value();
  if ((!flags.save_adapter.empty() || !flags.load_adapter.empty()) && spec.lora.rank == 0) {
    return Error{std::string(flags.save_adapter.empty() ? "--load-adapter" : "--save-adapter") +
                 " reads or writes LoRA adapters: add --lora RANK"};
  }
  if (flags.merge_lora && (spec.lora.rank == 0 || flags.save.empty())) {
    return Error{"--merge-lora writes --save's file with the LoRA adapters merged into their weights: give --lora RANK and --save FILE"};
  }
  spec.merge_lora = flags.merge_lora;
  spec.save_adapter = flags.save_adapter;
  spec.load_adapter = flags.load_adapter;
  auto quant = quant_config(flags.lora);
  if (!quant) return quant.error();
  const graph::QuantFormat format = quant.value().format;
  if (format == graph::QuantFormat::fp8 || format == graph::QuantFormat::gptq || format == graph::QuantFormat::awq) {
    return Error{"--quant " + std::string(enum_name(graph::kQuantFormatNames, format)) +
                 ": train runs nf4, fp4 and int8 weights; fp8, gptq and awq are planned by fit, plan and compare only"};
  }
  spec.quant = quant.value();
  if (flags.merge_lora && spec.quant.active()) {
    return Error{"--merge-lora: a --quant base cannot take merged adapters (the merged weight is not in its layout); save the "
                 "adapters with --save-adapter instead"};
  }
  spec.threads = flags.threads;
  spec.mode = flags.mode;
  spec.debug = runtime::DebugOptions::from_env();
  for (const std::string& d : flags.debug) {
    spec.debug.poison = spec.debug.poison || d == "poison";
    spec.debug.guards = spec.debug.guards || d == "guards";
    spec.debug.finite = spec.debug.finite || d == "finite";
  }
  spec.device = flags.device;
  if (!flags.device_memory.empty()) {
    auto parsed = parse_byte_size(flags.device_memory);
    if (!parsed) return Error{"--device-memory: " + parsed.error().message};
    spec.device_memory = parsed.value();
  }
  if (Status s = apply_checkpoint_flags(flags.checkpoint, spec.request); !s) return s.error();
  apply_schedule_flag(flags.op_order, spec.request);
  spec.zero = flags.zero;
  spec.bucket_bytes = static_cast<Bytes>(flags.bucket_mb * 1024.0 * 1024.0);
  spec.prefetch = flags.prefetch;
  spec.load = flags.load;
  spec.save = flags.save;
  spec.checkpoints = flags.checkpoints;
  spec.checkpoints.continue_on_error = flags.on_save_error == "continue";
  spec.profile = flags.profile;
  spec.eval_samples = flags.eval_samples;
  return spec;
}

nlohmann::json report_json(const train::TrainReport& r) {
  const train::TrainSpec& spec = r.spec;
  const runtime::TrainSummary& s = r.summary;
  nlohmann::json out;
  out["model"] = spec.label();
  if (!r.config_description.empty()) out["config"] = r.config_description;
  out["device"] = r.device;
  out["mode"] = runtime::mode_name(spec.mode);
  if (r.plan) {
    out["arena_bytes"] = r.plan->arena_bytes;
    out["lower_bound_bytes"] = r.plan->lower_bound_bytes;
    out["persistent_bytes"] = r.plan->persistent_bytes;
    out["schedule"] = planner::schedule_name(r.plan->schedule_kind);
    // The offloaded state, or paged 8-bit states, in host memory.
    if (spec.offload_optimizer || r.plan->host_bytes > 0) out["host_bytes"] = r.plan->host_bytes;
  }
  out["offload_optimizer"] = spec.offload_optimizer;
  add_rewrites_json(out, r.rewrites, r.plan ? &*r.plan : nullptr);
  out["dtype"] = std::string(graph::dtype_name(spec.dtype));
  out["tf32"] = spec.tf32;
  out["optimizer"] = std::string(graph::optimizer_name(spec.optimizer.kind));
  out["lr"] = as_typed(spec.optimizer.lr);
  out["lr_schedule"] = std::string(enum_name(runtime::kLrScheduleNames, spec.schedule.kind));
  out["warmup_steps"] = spec.schedule.warmup_steps;
  out["batch"] = spec.batch;
  out["seed"] = spec.seed;
  out["steps"] = s.first_step + s.steps;
  if (!spec.checkpoints.dir.empty()) {
    nlohmann::json saved = nlohmann::json::array();
    for (const train::SaveRecord& c : r.checkpoints_saved) {
      saved.push_back({{"step", c.step}, {"dir", c.dir}, {"bytes", c.bytes}, {"snapshot_seconds", c.snapshot_seconds},
                       {"write_seconds", c.write_seconds}});
    }
    out["checkpoints"] = {{"dir", spec.checkpoints.dir},
                          {"every", spec.checkpoints.every},
                          {"keep", spec.checkpoints.keep},
                          {"resumed_from", r.resumed_checkpoint.empty() ? nlohmann::json() : nlohmann::json(r.resumed_checkpoint)},
                          {"resumed_at_step", s.first_step},
                          {"snapshot_host_bytes", r.checkpoint_snapshot_bytes},
                          {"saved", saved}};
  }
  out["epochs"] = r.epochs;
  if (!s.losses.empty()) out["first_loss"] = s.losses.front();  // this run's first step
  out["final_loss"] = s.final_loss;
  if (r.test) {
    out["test_accuracy"] = r.test->accuracy;
    out["test_loss"] = r.test->mean_loss;
    out["test_images"] = r.test->images;
  }
  if (r.validation) {
    out["val_loss"] = r.validation->mean_loss;
    out["val_tokens"] = r.validation->tokens;
    out["unigram_entropy"] = r.unigram_entropy;
  }
  if (r.text_model) {
    out["vocab"] = r.vocab;
    out["text_characters"] = r.text_characters;
    out["context"] = r.context;
    out["tokens_per_s"] = r.samples_per_s;
  } else {
    out["samples_per_s"] = r.samples_per_s;
  }
  out["params_sha256"] = r.params_sha256;
  if (spec.dtype == graph::DType::f16) {
    out["loss_scale"] = s.loss_scale;
    out["skipped_steps"] = s.skipped_steps;
  }
  if (r.world > 1) {
    out["world"] = r.world;
    const int tp = models::tensor_parallel_of(spec.model).degree;
    if (tp > 1) {
      out["tensor_parallel"] = tp;  // consecutive ranks split each layer; the groups are data-parallel replicas
      out["data_parallel"] = r.world / tp;
      if (models::tensor_parallel_of(spec.model).sequence_parallel) out["sequence_parallel"] = true;
    }
    if (const int ep = models::expert_parallel_of(spec.model).degree; ep > 1) out["expert_parallel"] = ep;
    out["zero"] = spec.zero;
    out["bucket_mb"] = double(spec.bucket_bytes) / (1024.0 * 1024.0);
    if (spec.zero == 3) out["prefetch"] = spec.prefetch;
    nlohmann::json ranks = nlohmann::json::array();
    for (const train::RankMemory& m : r.ranks) {
      ranks.push_back({{"rank", m.rank}, {"arena_bytes", m.arena_bytes},
                       {"device_allocations_during_steps", m.device_allocations_during_steps}});
    }
    out["ranks"] = ranks;
  }
  out["step_time_ms_median"] = s.step_time_ms_median;
  out["train_seconds"] = s.total_seconds;
  out["device_allocations_during_steps"] = r.device_allocations_during_steps;
  out["device_bytes_at_setup"] = r.device_bytes_at_setup;
  out["threads"] = r.threads;
  out["cpu_pool"] = cpu_pool_json();
  if (r.checkpoint) out["checkpoint"] = checkpoint_json(*r.checkpoint);
  if (!spec.save.empty()) out["saved"] = spec.save;
  if (!spec.onnx.export_path.empty()) out["exported_onnx"] = spec.onnx.export_path;
  if (r.profile) out["profile"] = profile_json(*r.profile);
  return out;
}

void print_report(const train::TrainReport& r) {
  const train::TrainSpec& spec = r.spec;
  const runtime::TrainSummary& s = r.summary;
  print_out("model            %s (%s%s, lr %g%s, batch %lld, seed %llu)\n", spec.label().c_str(),
              spec.dtype == graph::DType::f32 ? "" : (std::string(graph::dtype_name(spec.dtype)) + " mixed precision, ").c_str(),
              std::string(graph::optimizer_name(spec.optimizer.kind)).c_str(), double(spec.optimizer.lr),
              schedule_label(spec.schedule).c_str(), static_cast<long long>(spec.batch),
              static_cast<unsigned long long>(spec.seed));
  print_out("steps            %lld (%.2f epochs) in %.1f s\n", static_cast<long long>(s.first_step + s.steps), r.epochs,
              s.total_seconds);
  if (!spec.checkpoints.dir.empty()) {
    const std::size_t saves = r.checkpoints_saved.size();
    const std::string saved = saves == 0 ? "no save" : std::to_string(saves) + (saves == 1 ? " save" : " saves") +
                                                        ", the last after step " + std::to_string(r.checkpoints_saved.back().step);
    print_out("checkpoints      %s: %s%s; %s (the newest %d kept; snapshots take %s of host memory)\n",
                spec.checkpoints.dir.c_str(), r.resumed_checkpoint.empty() ? "started afresh" : "resumed from ",
                r.resumed_checkpoint.c_str(), saved.c_str(), spec.checkpoints.keep,
                format_bytes(r.checkpoint_snapshot_bytes).c_str());
  }
  print_out("final loss       %.4f\n", s.final_loss);
  if (r.test) {
    print_out("test accuracy    %.2f%%  (test loss %.4f over %lld images)\n", 100.0 * r.test->accuracy, r.test->mean_loss,
                static_cast<long long>(r.test->images));
  }
  if (r.validation) {
    print_out("val loss         %.4f nats/char over %lld characters (unigram entropy of the text %.4f)\n",
                r.validation->mean_loss, static_cast<long long>(r.validation->tokens), r.unigram_entropy);
  }
  print_out("step time        %.3f ms median, %s\n", s.step_time_ms_median, format_rate(r.samples_per_s, r.text_model).c_str());
  print_out("params sha256    %s\n", r.params_sha256.c_str());
  if (spec.dtype == graph::DType::f16) {
    print_out("loss scale       %g after the last step; %lld of %lld steps skipped for overflowed fp16 gradients\n",
                s.loss_scale, static_cast<long long>(s.skipped_steps), static_cast<long long>(s.steps));
  }
  for (const train::RankMemory& m : r.ranks) {
    if (r.world < 2) break;
    print_out("rank %d           arena %s, %lld device allocations during steps\n", m.rank,
                format_bytes(m.arena_bytes).c_str(), static_cast<long long>(m.device_allocations_during_steps));
  }
  print_out("device allocations during steps: %lld (%s mode)\n", static_cast<long long>(r.device_allocations_during_steps),
              std::string(runtime::mode_name(spec.mode)).c_str());
  if (r.plan) print_out("\n%s", memory_summary(r.step, *r.plan).c_str());
  if (r.checkpoint) print_out("%s\n", checkpoint_line(*r.checkpoint).c_str());
  print_out("%s", rewrite_lines(r.rewrites).c_str());  // the order: in the memory summary above
  if (r.profile) print_out("\n%s", profile_text(*r.profile).c_str());
}

int run_train(const TrainFlags& flags) {
  auto spec = train_spec(flags);
  if (!spec) {
    std::cerr << "memplan train: " << spec.error().message << "\n";
    return kExitUsage;
  }
  // Progress and notes on stderr: rank 0 reports for the run (the library calls back on it only).
  std::optional<Progress> progress;
  double recent_ms = 0.0;
  bool text_model = false;
  std::int64_t samples_per_step = 0;
  train::TrainEvents events;
  if (!flags.quiet) {
    events.note = [](const std::string& line) { std::cerr << "memplan train: " << line << "\n"; };
  }
  events.start = [&](const train::TrainStart& start) {
    text_model = start.text_model;
    samples_per_step = start.samples_per_step;
    const train::TrainSpec& sp = spec.value();
    if (!flags.quiet) {
      std::fprintf(stderr, "memplan train: %s on %s, %lld steps of batch %lld, %s lr %g%s, device %s\n",
                   sp.label().c_str(), start.text_model ? "text" : "Fashion-MNIST", static_cast<long long>(start.steps),
                   static_cast<long long>(sp.batch), std::string(graph::optimizer_name(sp.optimizer.kind)).c_str(),
                   flags.lr, schedule_label(sp.schedule).c_str(), start.device.c_str());
    }
    progress.emplace("train", start.steps, !flags.quiet);
  };
  events.step = [&](const runtime::StepReport& r) {
    recent_ms = recent_ms == 0.0 ? r.step_ms : 0.95 * recent_ms + 0.05 * r.step_ms;
    std::ostringstream detail;
    detail.precision(4);
    detail << "loss " << r.loss << "  " << format_rate(double(samples_per_step) * 1000.0 / recent_ms, text_model);
    progress->update(r.step, detail.str());
  };
  auto report = train::run_training(spec.value(), nullptr, events, models::ref_size_naming());
  if (!report) {
    const train::TrainError& e = report.error();
    if (progress) std::cerr << "\n";
    if (e.kind == train::TrainError::Kind::over_budget) {
      std::cerr << "memplan train: " << unmet_budget_message(*e.unmet, spec.value().request.checkpoint) << "\n";
    } else {
      print_error_lines(e.message);
    }
    if (e.kind == train::TrainError::Kind::interrupted) return 128 + e.signal;  // 143 for SIGTERM, as the shell says
    return e.kind == train::TrainError::Kind::run ? kExitFailure : kExitUsage;
  }
  if (progress) progress->finish("");
  if (!report.value().reporting) return kExitOk;
  if (flags.json) {
    std::cout << report_json(report.value()).dump(2) << "\n";
  } else {
    print_report(report.value());
  }
  return kExitOk;
}

// The options whose presence decides the defaults and what applies to which model.
struct TrainOptions {
  CLI::Option* model = nullptr;
  CLI::Option* onnx = nullptr;
  CLI::Option* config = nullptr;
  CLI::Option* epochs = nullptr;
  CLI::Option* batch = nullptr;
  CLI::Option* lr = nullptr;
  CLI::Option* hidden = nullptr;
  std::vector<CLI::Option*> onnx_options;  // --loss, --output, --export-onnx
  std::vector<CLI::Option*> gpt_options;   // --seq first, --attention last
  CLI::Option* target_seq = nullptr;
};

// What to train: --model, --onnx or --config, and their options.
void add_model_flags(CLI::App& app, TrainFlags& flags, TrainOptions& o) {
  o.model = app.add_option("--model", flags.model, "Model to train")
                                  ->check(CLI::IsMember(models::trainable_model_names()))
                                  ->capture_default_str();
  o.onnx = app.add_option("--onnx", flags.onnx,
                  "Train an ONNX classifier (torch.onnx.export, opset 13-17) instead of --model, on Fashion-MNIST: "
                  "one float input of [B, 1, 28, 28] or [B, 784], its initializers as the starting weights")
      ->check(CLI::ExistingFile)
      ->excludes(o.model);
  o.config = app.add_option("--config", flags.config,
                  "Train a Hugging Face config.json instead of --model (model_type " + models::supported_model_types() +
                      ", bert excepted): the decoders on the text at byte "
                  "level (the text's bytes replace the vocabulary; --seq, default the config's positions up to " +
                      std::to_string(train::kDefaultConfigTrainSeq) +
                      "), or vit on Fashion-MNIST (num_channels 1, image_size 28). Other sizes as the file says")
      ->check(CLI::ExistingFile)
      ->excludes(o.model)
      ->excludes(o.onnx);
  o.onnx_options = {
      add_enum_option(app, "--loss", flags.loss, import::kLossKindNames,
                      "With --onnx: cross_entropy (logits [B, C] against the class) or mse (scores [B, 10] against one-hot targets)"),
      app.add_option("--output", flags.output, "With --onnx: the graph output the loss reads (default: the first)"),
      app.add_option("--export-onnx", flags.export_onnx,
                      "With --onnx: write a copy of the model with the trained weights (parameters and batch-norm "
                      "statistics) to this .onnx file when training ends")
          ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name the .onnx file to write") : std::string(); },
                                 "FILE")),
  };
  app.add_option("--data", flags.data,
                  "mlp, cnn: folder with the Fashion-MNIST IDX files (default " +
                      std::string(models::kFashionMnistDefaultDir) + "); gpt: a text file, or a folder of fortune files (default " +
                      models::kFortunesDefaultDir + ")");
  app.add_option("--vocab", flags.vocab,
                  "gpt and --config decoders: vocabulary size (default: the text's characters); the text may not hold more")
      ->check(positive_integer());
  o.hidden = app.add_option("--hidden", flags.hidden, "mlp: hidden widths, e.g. --hidden 256,256")
                     ->delimiter(',')
                     ->check(positive_integer())
                     ->capture_default_str();
  o.target_seq = app.add_option("--target-seq", flags.target_seq,
                                 "--config of an encoder-decoder (t5): characters per target, which the decoder predicts "
                                 "after the --seq characters the encoder reads (default: --seq)")
                      ->check(positive_integer());
  o.gpt_options = {
      app.add_option("--seq", flags.gpt.context, "gpt and --config decoders: characters per sequence (context)")
          ->check(positive_integer())
          ->capture_default_str(),
      app.add_option("--layers", flags.gpt.layers, "gpt: transformer blocks")->check(positive_integer())->capture_default_str(),
      app.add_option("--heads", flags.gpt.heads, "gpt: attention heads (must divide --width)")
          ->check(positive_integer())
          ->capture_default_str(),
      app.add_option("--width", flags.gpt.width, "gpt: residual stream width")->check(positive_integer())->capture_default_str(),
      app.add_option("--dropout", flags.gpt.dropout, "gpt: dropout probability")->check(finite_in_range(0.0, 0.95))->capture_default_str(),
      add_enum_option(app, "--attention", flags.gpt.attention, models::kAttentionKindNames,
                      "gpt and --config: fused (one attention op keeping the output and a log-sum-exp per row) or materialized "
                      "([B, heads, T, T] scores and probabilities stored)"),
  };
}

// How long, how fast, from which seed.
void add_optimizer_flags(CLI::App& app, TrainFlags& flags, TrainOptions& o) {
  o.epochs = app.add_option("--epochs", flags.epochs, "Passes over the training set (default per model: mlp 5, cnn 5; gpt counts steps: 3000)")
                     ->check(positive_integer());
  app.add_option("--steps", flags.steps, "Number of steps (instead of --epochs)")
      ->check(positive_integer())
      ->excludes(o.epochs);
  o.batch = app.add_option("--batch", flags.batch, "Samples per step (default per model: mlp 128, cnn 64, gpt 32 sequences)")
                    ->check(positive_integer());
  o.lr = app.add_option("--lr", flags.lr, "Learning rate (default per model: mlp 1e-3, cnn 1e-3, gpt 3e-3)")
                 ->check(positive_finite());
  add_enum_option(app, "--optimizer", flags.optimizer, graph::kOptimizerNames, "sgd, momentum, adamw, adamw8bit (bitsandbytes' block-wise 8-bit moments) or paged_adamw8bit (the same, large tensors' moments in host memory)");
  app.add_option("--momentum", flags.momentum, "Momentum (optimizer momentum)")
      ->check(finite_in_range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--weight-decay", flags.weight_decay, "Weight decay (decoupled for adamw)")
      ->check(finite_in_range(0.0, 1.0))
      ->capture_default_str();
  add_enum_option(app, "--lr-schedule", flags.schedule.kind, runtime::kLrScheduleNames,
                  "How the learning rate moves over the run's steps: constant, or cosine (from --lr down to 0 at the last "
                  "step, as PyTorch's CosineAnnealingLR with T_max = the steps)");
  app.add_option("--warmup", flags.schedule.warmup_steps,
                  "Steps of linear warm-up before the schedule: the learning rate times (s + 1) / N at step s < N")
      ->check(whole_number(std::uint64_t{INT64_MAX}))
      ->capture_default_str();
  add_enum_option(app, "--dtype", flags.dtype, graph::float_dtype_names(),
                  "fp32, or bf16/fp16 mixed precision: 16-bit working weights, activations and gradients; fp32 master "
                  "weights and optimizer state, updated in fp32 and rounded once; losses and normalisation statistics in "
                  "fp32. The CPU stores 16 bits and computes in fp32");
  app.add_flag("--tf32", flags.tf32,
               "On a CUDA GPU, let fp32 GEMMs use TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation): faster, "
               "less exact. Off by default, as in PyTorch; no effect on the CPU or at bf16/fp16");
  app.add_option("--seed", flags.seed, "Seed for initialisation and shuffling")
      ->check(whole_number())
      ->capture_default_str();
  app.add_flag("--offload-optimizer", flags.offload_optimizer, "Optimizer offload (ZeRO-Offload): optimizer state and fp32 master weights in host memory, updated there from gradients copied out; the device keeps weights, activations and gradients. Same bits as without it; trains on the CPU device (fit and plan answer for CUDA)");
  add_fused_loss_option(app, flags.fused_loss);
  add_lora_options(app, flags.lora);
}

// Where and how the step runs, what it saves, and the ranks under mpirun.
void add_run_flags(CLI::App& app, TrainFlags& flags) {
  app.add_option("--save", flags.save,
                  "Write the trained weights (and optimizer state) to this safetensors file when training ends; "
                  "the previous file stays intact until the new one is complete");
  app.add_option("--load", flags.load,
                  "Start from the weights in this safetensors file (saved by --save with the same model flags)")
      ->check(CLI::ExistingFile);
  app.add_option("--save-adapter", flags.save_adapter,
                 "With --lora: write the trained adapters to this folder as PEFT writes them (adapter_config.json, "
                 "adapter_model.safetensors with base_model.model.<module>.lora_A.weight names)")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name a folder") : std::string(); }, "DIR"));
  app.add_flag("--merge-lora", flags.merge_lora,
               "With --lora and --save: the adapters merged into their base weights, W + (alpha / r) B A, so the file "
               "loads into the model without --lora (train --load, sample); a quantized base cannot take them");
  app.add_option("--load-adapter", flags.load_adapter,
                 "With --lora: start the adapters from this PEFT adapter folder (its r and lora_alpha must be --lora's, "
                 "its target modules --lora-targets')")
      ->check(CLI::ExistingDirectory);
  CLI::Option* save_dir =
      app.add_option("--save-dir", flags.checkpoints.dir,
                     "Checkpoint the whole run into this folder (created if missing) every --save-every steps and at the "
                     "end: weights, optimizer state, the step, the loss scaler; every rank its own shard. Run the same "
                     "command again to resume from the newest complete checkpoint, exactly (it ends with the same params "
                     "sha256). SIGTERM or SIGINT then finish the step, save and exit (143 for SIGTERM); a second one exits "
                     "at once. Saves are written while training goes on")
          ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name a folder") : std::string(); },
                                 "DIR"));
  app.add_option("--save-every", flags.checkpoints.every,
                  "With --save-dir: steps between checkpoints (0: only at the end and on a signal)")
      ->check(whole_number(std::uint64_t{INT64_MAX}))
      ->capture_default_str()
      ->needs(save_dir);
  app.add_option("--keep", flags.checkpoints.keep, "With --save-dir: the newest complete checkpoints kept")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str()
      ->needs(save_dir);
  app.add_option("--on-save-error", flags.on_save_error,
                  "With --save-dir: when a checkpoint cannot be written (disk full, folder not writable): stop (the previous "
                  "checkpoint stays loadable) or continue without it")
      ->check(CLI::IsMember({"stop", "continue"}))
      ->capture_default_str()
      ->needs(save_dir);
  app.add_option("--eval-samples", flags.eval_samples,
                  "Held-out examples to evaluate when training ends: the first N test images (default all), or N "
                  "validation sequences of --seq characters spread over the split (default 1024); 0 skips the evaluation")
      ->check(whole_number(std::uint64_t{INT64_MAX}));
  app.add_option("--threads", flags.threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  add_enum_option(app, "--mode", flags.mode, runtime::kExecutionModeNames,
                  "planned: one arena allocated once, tensors at planned offsets; naive: one device allocation per tensor; dynamic: a PyTorch-style caching allocator");
  add_enum_option(app, "--device", flags.device, kernels::kDeviceKindNames,
                  "Where to train: cpu, cuda, or auto (cuda when a GPU is present, else cpu; says which on stderr)", "auto");
  app.add_option("--debug", flags.debug,
                  "Debug checks, comma-separated: poison (NaN-fill dead buffers, stop at the first op reading NaN), "
                  "guards (guard bytes after every buffer, checked after every op), finite (stop at the first op that reads or "
                  "writes NaN or infinity, naming it and the tensor). Also MEMPLAN_DEBUG=...")
      ->delimiter(',')
      ->check(CLI::IsMember({"poison", "guards", "finite"}));
  app.add_option("--device-memory", flags.device_memory,
                  "Memory the device may give the training step, e.g. 64MiB (default: all the host has). A step "
                  "that needs more stops at setup with the arena size and the largest batch that fits")
      ->check(byte_size());
  app.add_flag("--json", flags.json, "Print one JSON object with the results on stdout");
  app.add_flag("--quiet", flags.quiet, "No progress output on stderr");
  app.add_flag("--verbose", flags.verbose,
               "With --config: list the config's keys memplan does not read (for its model_type none changes the step)");
  add_moe_capacity_option(app, flags.moe_capacity_factor);
  app.add_flag("--profile", flags.profile,
                "Time every op (mean per step, after the first step): per op kind, share of the step, GFLOP/s "
                "(FLOPs as the plan counts them), the five slowest ops; with --json every op under \"profile\"");
  add_checkpoint_options(app, flags.checkpoint);
  add_schedule_option(app, flags.op_order);
  app.add_option("--zero", flags.zero,
                  "Under mpirun: ZeRO stage 0 (data parallel, gradients all-reduced), 1 (optimizer state sharded), 2 "
                  "(gradients too), 3 (parameters too)")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app.add_option("--bucket-mb", flags.bucket_mb, "Under mpirun: gradient bucket size in MiB (reduced as soon as full)")
      ->check(positive_finite())
      ->check(CLI::Range(1.0 / 1024.0, 1024.0 * 1024.0))
      ->capture_default_str();
  app.add_option("--prefetch", flags.prefetch, "Under mpirun with --zero 3: layers whose parameters are gathered ahead")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--tensor-parallel", flags.tensor_parallel,
                 "Under mpirun: tensor parallelism (Megatron-LM) over groups of this many consecutive ranks, each "
                 "holding 1/T of every attention and MLP weight and of the vocabulary; the groups are data-parallel "
                 "replicas (ZeRO shards within each slice's replicas). gpt and decoder --configs; --save gathers the "
                 "whole model")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_flag("--sequence-parallel", flags.sequence_parallel,
               "With --tensor-parallel: sequence parallelism: norms, dropouts and residual adds run on each rank's "
               "1/T of the token rows (an all-gather before each column-parallel layer, a reduce-scatter after each "
               "row-parallel one); batch x sequence must divide by T");
  app.add_option("--expert-parallel", flags.expert_parallel,
                 "Under mpirun: expert parallelism over groups of this many consecutive data-parallel ranks, each "
                 "holding experts/E of every mixture layer's experts; tokens go to their experts' ranks and back by "
                 "an all-to-all, expert gradients are summed over the ranks holding the same experts. Mixture-of-"
                 "experts --configs; --save gathers the whole model")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
}

Status refuse_onnx_options(const TrainOptions& o) {
  for (const CLI::Option* option : o.onnx_options) {
    if (option->count() > 0) return Error{option->get_name() + " applies to --onnx models only"};
  }
  return Status::success();
}

// A --config read, and what it fixes: the model's sizes (only --seq for decoders and --attention
// apply), and the defaults of the reference model trained on the same data.
Status resolve_config(const TrainFlags& given, const TrainOptions& o, TrainFlags& resolved) {
  models::ModelRef ref;
  ref.config = given.config;
  ref.moe_capacity_factor = given.moe_capacity_factor;
  ref.list_unread_config_keys = given.verbose;
  std::vector<std::string> notes;
  auto parsed = models::read_ref_config(ref, notes);
  if (!parsed) return parsed.error();
  print_notes(notes);
  resolved.hf = std::move(parsed).value();
  resolved.model = resolved.hf->vision() ? "cnn" : "gpt";
  if (o.hidden->count() > 0) return Error{"--hidden sets the MLP's widths; a --config fixes the model"};
  const CLI::Option* seq = o.gpt_options.front();
  const CLI::Option* attention = o.gpt_options.back();
  for (const CLI::Option* option : o.gpt_options) {
    const bool applies = option == attention || (option == seq && !resolved.hf->vision());
    if (option->count() > 0 && !applies) {
      return Error{option->get_name() + (option == seq ? " applies to language models; " : " applies to --model gpt; ") +
                   given.config + " is a " + resolved.hf->model_type + " config, which fixes the model's sizes"};
    }
  }
  resolved.config_seq = seq->count() > 0 ? given.gpt.context : 0;
  if (o.target_seq->count() > 0 && !resolved.hf->encoder_decoder()) {
    return Error{"--target-seq applies to encoder-decoder configs (t5); " + given.config + " is a " + resolved.hf->model_type};
  }
  const std::optional<models::AttentionKind> asked =
      attention->count() > 0 ? std::optional(given.gpt.attention) : std::nullopt;
  if (Status s = models::check_encoder_decoder_attention(resolved.hf->encoder_decoder(), asked, given.config); !s) return s;
  return refuse_onnx_options(o);
}

// The flags with the model's defaults for those left out, after the checks of which flags apply
// to which model.
Result<TrainFlags> resolve_train_flags(const TrainFlags& given, const TrainOptions& o) {
  TrainFlags resolved = given;
  if (o.config->count() == 0 && o.target_seq->count() > 0) {
    return Error{"--target-seq applies to encoder-decoder configs (--config of a t5)"};
  }
  if (o.config->count() > 0) {
    if (Status s = resolve_config(given, o, resolved); !s) return s.error();
  } else if (o.onnx->count() > 0) {
    resolved.model = "cnn";  // an imported classifier takes the CNN's defaults (epochs, batch, lr)
    if (o.hidden->count() > 0) {
      return Error{"--hidden sets the MLP's widths; it does not apply to --onnx (the file fixes the model)"};
    }
  } else if (Status s = refuse_onnx_options(o); !s) {
    return s.error();
  }
  if (resolved.model != "mlp" && o.hidden->count() > 0) {
    return Error{"--hidden sets the MLP's widths; it does not apply to --model " + resolved.model};
  }
  for (const CLI::Option* option : o.gpt_options) {
    if (!resolved.hf && resolved.model != "gpt" && option->count() > 0) {
      return Error{option->get_name() + " applies to --model gpt, not " + (o.onnx->count() > 0 ? "--onnx" : resolved.model)};
    }
  }
  const models::TrainDefaults defaults = models::train_defaults(resolved.model);
  if (o.epochs->count() == 0) resolved.epochs = defaults.epochs;
  if (o.epochs->count() == 0 && resolved.steps == 0) resolved.steps = defaults.steps;
  if (o.batch->count() == 0) resolved.batch = defaults.batch;
  if (o.lr->count() == 0) resolved.lr = defaults.lr;
  return resolved;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* app = root.add_subcommand(
      "train", "Train a reference model on real data (default: the MLP on Fashion-MNIST).");
  auto options = std::make_shared<TrainOptions>();
  add_model_flags(*app, *flags, *options);
  add_optimizer_flags(*app, *flags, *options);
  add_run_flags(*app, *flags);
  return Command{app, [flags, options] {
    auto resolved = resolve_train_flags(*flags, *options);
    if (!resolved) {
      std::cerr << "memplan train: " << resolved.error().message << "\n";
      return kExitUsage;
    }
    return run_train(resolved.value());
  }};
}

}  // namespace memplan::tools
