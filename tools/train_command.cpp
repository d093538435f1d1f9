// memplan train: build the training step for a reference model, run it on real data, report.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "memplan/common/byte_size.h"
#include "memplan/dist/communicator.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/fit.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/step_size.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/weights.h"
#include "memplan/train/session.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/memory_report.h"
#include "tools/profile_report.h"

namespace memplan::tools {
namespace {

// What run_train uses from the train library (feeders, evaluation, --save and --load).
using train::unigram_entropy;

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
  std::string data;  // default per model: Fashion-MNIST or the fortunes
  std::vector<std::int64_t> hidden = {256, 256};
  models::GptConfig gpt;  // vocab comes from the text
  std::int64_t vocab = 0;  // --vocab: a text model's vocabulary instead of the text's (at least the text's)
  std::string save, load;
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
  int threads = 0;
  runtime::ExecutionMode mode = runtime::ExecutionMode::planned;
  std::optional<kernels::DeviceKind> device;  // empty: auto (cuda when present, else cpu)
  std::vector<std::string> debug;
  std::string device_memory;  // empty: as much as the host gives
  bool json = false;
  bool quiet = false;
  bool profile = false;
  CheckpointFlags checkpoint;
  // Data parallel: one process per rank under mpirun (dist/communicator.h)
  int zero = 0;
  double bucket_mb = 25.0;
  int prefetch = 1;
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

// Why setup ran out of device memory, and what would fit, answered by planning alone (the same
// answer_fit as `memplan fit`, with this device's profile): the arena against what the device
// can give; the requested batch with activation checkpointing, when the run used none; and the
// largest batch under the run's own checkpoint strategy.
std::string out_of_memory_advice(const planner::StepDescription& step,
                                 const planner::PlanRequest& request, const runtime::Executor& executor, Bytes capacity) {
  std::ostringstream out;
  const planner::MemoryPlan* plan = executor.plan();
  if (plan == nullptr) {
    out << "memplan train: the device has " << format_bytes(capacity) << " (--device-memory); --mode planned "
        << "states the arena it needs up front\n";
    return out.str();
  }
  planner::FitQuestion question;
  question.step = step;
  question.request = request;
  question.request.budget.reset();
  question.request.device.overheads.clear();  // --device-memory caps what the device hands out: the arena
  question.device_memory = capacity;
  question.max_batch_strategies = {request.checkpoint};
  question.max_batch_limit = std::max<std::int64_t>(step.batch - 1, 1);
  const Bytes arena = question.request.device.total_bytes(plan->arena_bytes);
  out << "memplan train: out of memory at setup: the arena needs " << format_bytes(arena) << " (" << arena
      << " bytes) but the device can give " << format_bytes(capacity) << " (" << capacity << " bytes, --device-memory)\n";
  auto answer = planner::answer_fit(question);
  if (!answer) return out.str() + "memplan train: " + answer.error().message + "\n";
  const planner::FitAnswer& a = answer.value();
  const bool asked_for_checkpointing = request.checkpoint != planner::CheckpointStrategy::kNone || request.budget;
  if (!asked_for_checkpointing && a.suggestion && a.suggestion->whole_batch_checkpoint) {
    out << "memplan train: batch " << step.batch << " fits with activation checkpointing: add --checkpoint auto"
        << " --budget " << question.request.device.arena_budget(capacity) << " (auto picks --checkpoint "
        << planner::checkpoint_strategy_name(*a.suggestion->whole_batch_checkpoint) << ")\n";
  }
  const std::string with = request.checkpoint == planner::CheckpointStrategy::kNone
                               ? ""
                               : " with --checkpoint " + std::string(planner::checkpoint_strategy_name(request.checkpoint));
  const std::int64_t max_batch = a.max_batch.empty() ? 0 : a.max_batch.front().max_batch;
  if (max_batch > 0) {
    out << "memplan train: the largest batch that fits" << with << " is " << max_batch << ": try --batch " << max_batch
        << " (found by planning alone, as 'memplan fit --max-batch' does)\n";
  } else {
    out << "memplan train: not even batch 1 fits" << with
        << "; try a smaller model ('memplan fit' shows where the bytes go)\n";
  }
  return out.str();
}

// --export-onnx is written when training ends: a folder that cannot take it is said up front.
Status check_export_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Error{"--export-onnx " + path + " is a folder; name the .onnx file to write"};
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return Error{"--export-onnx " + path + ": the folder " + parent.string() + " does not exist; create it or name a file in an existing folder"};
  }
  return Status::success();
}

int run_train(const TrainFlags& flags) {
  kernels::set_cpu_threads(flags.threads);
  const std::string model_label = !flags.onnx.empty() ? flags.onnx : flags.hf ? flags.config : flags.model;
  if (!flags.export_onnx.empty()) {
    if (Status s = check_export_path(flags.export_onnx); !s) {
      std::cerr << "memplan train: " << s.error().message << "\n";
      return kExitUsage;
    }
  }
  // Under mpirun every process is one rank; alone, a process needs no MPI.
  auto made_comm = dist::make_cpu_communicator();
  if (!made_comm) {
    std::cerr << "memplan train: " << made_comm.error().message << "\n";
    return kExitFailure;
  }
  const std::unique_ptr<dist::Communicator> comm = std::move(made_comm).value();
  const int world = comm->world_size();
  const int rank = comm->rank();
  if (world > 1) {
    if (flags.batch % world != 0) {
      std::cerr << "memplan train: --batch " << flags.batch << " is the global batch and must divide among the " << world
                << " ranks: use a multiple of " << world << "\n";
      return kExitUsage;
    }
    if (flags.device && *flags.device != kernels::DeviceKind::cpu) {
      std::cerr << "memplan train: several ranks train on the CPU (MPI); drop --device " << kernels::device_kind_name(*flags.device)
                << " or run one process\n";
      return kExitUsage;
    }
    // Rank 0 saves what every rank holds whole under stage 0; sharded state would need gathering.
    if (!flags.load.empty() || (!flags.save.empty() && flags.zero != 0)) {
      std::cerr << "memplan train: with several ranks --save works with --zero 0 only, and --load not at all; run one "
                   "process to resume\n";
      return kExitUsage;
    }
    if (flags.mode != runtime::ExecutionMode::planned) {
      std::cerr << "memplan train: several ranks run --mode planned only\n";
      return kExitUsage;
    }
  }
  const bool quiet = flags.quiet || rank != 0;  // rank 0 reports for the run
  const std::string optimizer_label(graph::optimizer_name(flags.optimizer));
  const std::string device_name = flags.device ? std::string(kernels::device_kind_name(*flags.device)) : "auto";
  Bytes device_capacity = 0;  // 0: unlimited
  if (!flags.device_memory.empty()) {
    auto parsed = parse_byte_size(flags.device_memory);
    if (!parsed) {
      std::cerr << "memplan train: --device-memory: " << parsed.error().message << "\n";
      return kExitUsage;
    }
    device_capacity = parsed.value();
  }
  for (std::int64_t width : flags.hidden) {
    if (width <= 0) {
      std::cerr << "memplan train: --hidden widths must be positive, got " << width << "\n";
      return kExitUsage;
    }
  }

  // The device first: a missing GPU is reported before any data is read.
  const kernels::DeviceKind kind = flags.device ? *flags.device : world > 1 ? kernels::DeviceKind::cpu : runtime::auto_device_kind();
  auto made = runtime::make_device(kind, device_capacity);
  if (!made) {
    std::cerr << "memplan train: --device " << device_name << ": " << made.error().message << "\n";
    return kExitUsage;
  }
  const std::unique_ptr<runtime::Device> device_owner = std::move(made).value();
  runtime::Device& device = *device_owner;
  if (!flags.device && !quiet) {
    std::fprintf(stderr, "memplan train: --device auto: %s\n",
                 device.kind() == kernels::DeviceKind::cuda ? "a CUDA GPU is present, training on it"
                                                            : "no CUDA GPU present, training on the CPU");
  }
  models::ModelOptions model;
  model.name = flags.hf ? flags.config : flags.model;
  model.mlp.hidden = flags.hidden;
  model.gpt = flags.gpt;
  if (flags.hf) {
    model.config = *flags.hf;
    model.zoo.attention = flags.gpt.attention;
    if (!flags.hf->vision()) {
      auto seq = train::config_train_seq(*flags.hf, flags.config_seq);
      if (!seq) {
        std::cerr << "memplan train: " << seq.error().message << "\n";
        return kExitUsage;
      }
      model.zoo.seq = seq.value();
    }
  }
  if (flags.onnx.empty()) {
    // Sizes are checked before any data is read; the text's vocabulary is at most 256 bytes.
    models::ModelOptions sizes = model;
    const std::int64_t vocab = flags.vocab > 0 ? flags.vocab : 256;
    sizes.gpt.vocab = vocab;
    if (sizes.config) sizes.config->gpt.vocab = sizes.config->llama.vocab = vocab;
    planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(sizes), flags.batch);
    step.optimizer.kind = flags.optimizer;
    if (Status s = check_step_size_flags(step); !s) {
      std::cerr << "memplan train: " << s.error().message << "\n";
      return kExitUsage;
    }
  } else if (flags.vocab > 0) {
    std::cerr << "memplan train: --vocab applies to text models (gpt and decoder configs), not --onnx\n";
    return kExitUsage;
  }
  if (!flags.load.empty()) {
    // A file that cannot be a weights file is refused before the data is read.
    if (Status s = runtime::check_weights_file(flags.load); !s) {
      std::cerr << "memplan train: --load: " << s.error().message << "\n";
      return kExitUsage;
    }
  }
  auto data = flags.onnx.empty() ? train::load_run_data(model, flags.data, flags.batch, flags.vocab)
                                 : train::load_onnx_run_data(flags.onnx, flags.loss, flags.output, flags.data, flags.batch);
  if (!data) {
    std::cerr << "memplan train: " << data.error().message << "\n";
    return kExitUsage;
  }
  const bool text_model = data.value().text_model();
  if (text_model && !flags.save.empty() && data.value().model.gpt.vocab != data.value().text->vocab_size()) {
    std::cerr << "memplan train: --save keeps a GPT whose vocabulary is its text's characters (sample reads them back); "
              << "--vocab " << flags.vocab << " differs from the text's " << data.value().text->vocab_size()
              << ": leave out --vocab or --save\n";
    return kExitUsage;
  }
  if (flags.hf && !quiet) {
    const models::HfConfig& c = *data.value().model.config;
    std::fprintf(stderr, "memplan train: --config %s: %s\n", flags.config.c_str(), c.describe().c_str());
    if (text_model) {
      const std::int64_t vocab = flags.hf->family == models::HfFamily::gpt2 ? flags.hf->gpt.vocab : flags.hf->llama.vocab;
      std::fprintf(stderr, "memplan train: no tokenizer: the text's %lld bytes are the vocabulary in place of the config's %lld "
                   "tokens; %lld characters per sequence (--seq)\n",
                   static_cast<long long>(data.value().model.gpt.vocab), static_cast<long long>(vocab),
                   static_cast<long long>(data.value().model.gpt.context));
    }
  }
  train::SessionOptions options;
  options.batch = flags.batch;
  options.optimizer.kind = flags.optimizer;
  options.optimizer.lr = static_cast<float>(flags.lr);
  options.optimizer.momentum = static_cast<float>(flags.momentum);
  options.optimizer.weight_decay = static_cast<float>(flags.weight_decay);
  options.schedule = flags.schedule;
  options.seed = flags.seed;
  options.executor.mode = flags.mode;
  options.executor.debug = runtime::DebugOptions::from_env();
  for (const std::string& d : flags.debug) {
    options.executor.debug.poison = options.executor.debug.poison || d == "poison";
    options.executor.debug.guards = options.executor.debug.guards || d == "guards";
    options.executor.debug.finite = options.executor.debug.finite || d == "finite";
  }
  if (Status s = apply_checkpoint_flags(flags.checkpoint, options.request); !s) {
    std::cerr << "memplan train: " << s.error().message << "\n";
    return kExitUsage;
  }
  options.parallel.world = world;
  options.parallel.rank = rank;
  options.parallel.zero = flags.zero;
  options.parallel.bucket_bytes = static_cast<Bytes>(flags.bucket_mb * 1024.0 * 1024.0);
  options.parallel.prefetch = flags.prefetch;
  options.executor.communicator = comm.get();
  auto planned_session = train::TrainingSession::plan(std::move(data).value(), options, device);
  if (!planned_session) {
    std::cerr << "memplan train: " << planned_session.error().message << "\n";
    return kExitUsage;
  }
  train::TrainingSession& session = *planned_session.value();
  if (!session.planned().fits) {
    std::cerr << "memplan train: " << unmet_budget_message(session.planned(), session.request().checkpoint) << "\n";
    return kExitUsage;
  }
  const std::optional<planner::CheckpointOutcome>& checkpoint = session.planned().checkpoint;
  runtime::Executor& executor = session.executor();
  if (Status s = session.setup(); !s) {
    std::cerr << "memplan train: " << s.error().message << "\n";
    if (device_capacity > 0) {
      std::cerr << out_of_memory_advice(session.step(), session.request(), executor, device_capacity);
    }
    return kExitFailure;
  }
  if (!flags.load.empty()) {
    auto loaded = session.resume(flags.load);
    if (!loaded) {
      std::cerr << "memplan train: " << loaded.error().message << "\n";
      return kExitUsage;
    }
    if (!quiet) {
      std::fprintf(stderr, "memplan train: loaded %d tensors from %s, resuming after step %lld%s\n",
                   loaded.value().loaded, flags.load.c_str(), static_cast<long long>(loaded.value().step),
                   loaded.value().fresh_state.empty() ? "" : " (optimizer state starts fresh: not in the file)");
    }
  }

  const std::int64_t steps_per_epoch = session.steps_per_epoch();
  const std::int64_t steps = flags.steps > 0 ? flags.steps : flags.epochs * steps_per_epoch;
  const std::int64_t samples_per_step = session.samples_per_step();
  if (Status s = runtime::check_lr_schedule(flags.schedule, steps); !s) {
    std::cerr << "memplan train: " << s.error().message << "\n";
    return kExitUsage;
  }
  if (!quiet) {
    const std::string where = device.kind() == kernels::DeviceKind::cpu
                                  ? device.name() + " (" + std::to_string(kernels::cpu_threads()) + " threads)"
                                  : device.name();
    std::fprintf(stderr, "memplan train: %s on %s, %lld steps of batch %lld, %s lr %g%s, device %s\n",
                 model_label.c_str(), text_model ? "text" : "Fashion-MNIST", static_cast<long long>(steps),
                 static_cast<long long>(flags.batch), optimizer_label.c_str(), flags.lr,
                 schedule_label(flags.schedule).c_str(), where.c_str());
  }
  Progress progress("train", steps, !quiet);
  double recent_ms = 0.0;
  // The profile leaves out the first step (first touches of the arena, threads starting) unless
  // it is the only one.
  if (flags.profile && steps == 1) executor.set_profiling(true);
  auto summary = session.run(steps, [&](const runtime::StepReport& r) {
    if (flags.profile && r.step == 1 && steps > 1) executor.set_profiling(true);
    recent_ms = recent_ms == 0.0 ? r.step_ms : 0.95 * recent_ms + 0.05 * r.step_ms;
    std::ostringstream detail;
    detail.precision(4);
    detail << "loss " << r.loss << "  " << format_rate(double(samples_per_step) * 1000.0 / recent_ms, text_model);
    progress.update(r.step, detail.str());
  });
  if (!summary) {
    std::cerr << "\nmemplan train: " << summary.error().message << "\n";
    if (!options.executor.debug.finite && summary.error().message.find("non-finite") != std::string::npos) {
      std::cerr << "memplan train: rerun with --debug finite to name the first op and tensor that became "
                   "non-finite\n";
    }
    return kExitFailure;
  }
  const runtime::TrainSummary& s = summary.value();
  progress.finish("");

  // Every rank's arena and allocations during steps, gathered on rank 0 (2 numbers per rank).
  std::vector<std::int64_t> rank_numbers(static_cast<std::size_t>(2 * world));
  {
    const planner::MemoryPlan* plan = executor.plan();
    const std::int64_t mine[2] = {plan != nullptr ? plan->arena_bytes : 0, executor.device_allocations_during_steps()};
    comm->all_gather_shards(mine, rank_numbers.data(), 2 * world, dist::ElementType::i64);
  }
  const std::string params_sha256 = session.params_sha256();  // a collective under ZeRO-3
  if (rank != 0) return kExitOk;  // rank 0 reports for the run

  // Evaluation reads whole parameters: every rank but ZeRO-3's holds them (rank 0 evaluates).
  train::SessionEvaluation evaluated;
  if (world == 1 || flags.zero < 3) {
    auto evaluation = session.evaluate();
    if (!evaluation) {
      std::cerr << "memplan train: evaluation failed: " << evaluation.error().message << "\n";
      return kExitFailure;
    }
    evaluated = std::move(evaluation).value();
  } else if (!quiet) {
    std::fprintf(stderr, "memplan train: no test evaluation under ZeRO-3 (parameters stay sharded across ranks)\n");
  }
  const std::optional<train::Evaluation>& eval = evaluated.classifier;
  const std::optional<train::TextEvaluation>& val = evaluated.text;
  const std::optional<models::TextDataset>& text = session.data().text;
  if (!flags.save.empty()) {
    if (Status saved = session.save(flags.save); !saved) {
      std::cerr << "memplan train: cannot save: " << saved.error().message << "\n";
      return kExitFailure;
    }
    if (!quiet) std::fprintf(stderr, "memplan train: saved the weights to %s\n", flags.save.c_str());
  }
  if (!flags.export_onnx.empty()) {
    if (Status exported = session.export_onnx(flags.export_onnx); !exported) {
      std::cerr << "memplan train: cannot export the ONNX model: " << exported.error().message << "\n";
      return kExitFailure;
    }
    if (!quiet) std::fprintf(stderr, "memplan train: wrote the trained model to %s\n", flags.export_onnx.c_str());
  }
  const graph::Graph& step = session.planned().graph;
  const models::ModelOptions& trained_model = session.data().model;
  const double samples_per_s = double(samples_per_step) * 1000.0 / s.step_time_ms_median;
  const double epochs_done = double(s.steps) / double(steps_per_epoch);
  if (flags.json) {
    nlohmann::json out;
    out["model"] = model_label;
    if (trained_model.config) out["config"] = trained_model.config->describe();
    out["device"] = device.name();
    out["mode"] = runtime::mode_name(flags.mode);
    if (const planner::MemoryPlan* plan = executor.plan()) {
      out["arena_bytes"] = plan->arena_bytes;
      out["lower_bound_bytes"] = plan->lower_bound_bytes;
      out["persistent_bytes"] = plan->persistent_bytes;
      out["schedule"] = planner::schedule_name(plan->schedule_kind);
    }
    out["optimizer"] = optimizer_label;
    out["lr"] = flags.lr;
    out["lr_schedule"] = std::string(enum_name(runtime::kLrScheduleNames, flags.schedule.kind));
    out["warmup_steps"] = flags.schedule.warmup_steps;
    out["batch"] = flags.batch;
    out["seed"] = flags.seed;
    out["steps"] = s.steps;
    out["epochs"] = epochs_done;
    out["final_loss"] = s.final_loss;
    if (eval) {
      out["test_accuracy"] = eval->accuracy;
      out["test_loss"] = eval->mean_loss;
    }
    if (val) {
      out["val_loss"] = val->mean_loss;
      out["val_tokens"] = val->tokens;
      out["unigram_entropy"] = unigram_entropy(text->train, text->vocab_size());
      out["vocab"] = text->vocab_size();
      out["context"] = trained_model.gpt.context;
      out["tokens_per_s"] = samples_per_s;
    } else {
      out["samples_per_s"] = samples_per_s;
    }
    out["params_sha256"] = params_sha256;
    if (world > 1) {
      out["world"] = world;
      out["zero"] = flags.zero;
      out["bucket_mb"] = flags.bucket_mb;
      if (flags.zero == 3) out["prefetch"] = flags.prefetch;
      nlohmann::json ranks = nlohmann::json::array();
      for (int r = 0; r < world; ++r) {
        ranks.push_back({{"rank", r},
                         {"arena_bytes", rank_numbers[static_cast<std::size_t>(2 * r)]},
                         {"device_allocations_during_steps", rank_numbers[static_cast<std::size_t>(2 * r + 1)]}});
      }
      out["ranks"] = ranks;
    }
    out["step_time_ms_median"] = s.step_time_ms_median;
    out["train_seconds"] = s.total_seconds;
    out["device_allocations_during_steps"] = executor.device_allocations_during_steps();
    out["device_bytes_at_setup"] = executor.device_bytes_at_setup();
    out["threads"] = kernels::cpu_threads();
    out["cpu_pool"] = cpu_pool_json();
    if (checkpoint) out["checkpoint"] = checkpoint_json(*checkpoint);
    if (!flags.save.empty()) out["saved"] = flags.save;
    if (!flags.export_onnx.empty()) out["exported_onnx"] = flags.export_onnx;
    if (flags.profile) out["profile"] = profile_json(executor.profile());
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("model            %s (%s, lr %g%s, batch %lld, seed %llu)\n", model_label.c_str(),
                optimizer_label.c_str(), flags.lr, schedule_label(flags.schedule).c_str(), static_cast<long long>(flags.batch),
                static_cast<unsigned long long>(flags.seed));
    std::printf("steps            %lld (%.2f epochs) in %.1f s\n", static_cast<long long>(s.steps), epochs_done,
                s.total_seconds);
    std::printf("final loss       %.4f\n", s.final_loss);
    if (eval) {
      std::printf("test accuracy    %.2f%%  (test loss %.4f)\n", 100.0 * eval->accuracy, eval->mean_loss);
    }
    if (val) {
      std::printf("val loss         %.4f nats/char over %lld characters (unigram entropy of the text %.4f)\n",
                  val->mean_loss, static_cast<long long>(val->tokens), unigram_entropy(text->train, text->vocab_size()));
    }
    std::printf("step time        %.3f ms median, %s\n", s.step_time_ms_median,
                format_rate(samples_per_s, text_model).c_str());
    std::printf("params sha256    %s\n", params_sha256.c_str());
    for (int r = 0; world > 1 && r < world; ++r) {
      std::printf("rank %d           arena %s, %lld device allocations during steps\n", r,
                  format_bytes(rank_numbers[static_cast<std::size_t>(2 * r)]).c_str(),
                  static_cast<long long>(rank_numbers[static_cast<std::size_t>(2 * r + 1)]));
    }
    std::printf("device allocations during steps: %lld (%s mode)\n",
                static_cast<long long>(executor.device_allocations_during_steps()),
                std::string(runtime::mode_name(flags.mode)).c_str());
    if (const planner::MemoryPlan* plan = executor.plan()) std::printf("\n%s", memory_summary(step, *plan).c_str());
    if (checkpoint) std::printf("%s\n", checkpoint_line(*checkpoint).c_str());
    if (flags.profile) std::printf("\n%s", profile_text(executor.profile()).c_str());
  }
  return kExitOk;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* app = root.add_subcommand(
      "train", "Train a reference model on real data (default: the MLP on Fashion-MNIST).");
  CLI::Option* model_option = app->add_option("--model", flags->model, "Model to train")
                                  ->check(CLI::IsMember(models::trainable_model_names()))
                                  ->capture_default_str();
  CLI::Option* onnx = app->add_option("--onnx", flags->onnx,
                  "Train an ONNX classifier (torch.onnx.export, opset 13-17) instead of --model, on Fashion-MNIST: "
                  "one float input of [B, 1, 28, 28] or [B, 784], its initializers as the starting weights")
      ->check(CLI::ExistingFile)
      ->excludes(model_option);
  CLI::Option* config = app->add_option("--config", flags->config,
                  "Train a Hugging Face config.json instead of --model: gpt2, llama, mistral, qwen2 on the text at byte "
                  "level (the text's bytes replace the vocabulary; --seq, default the config's positions up to " +
                      std::to_string(train::kDefaultConfigTrainSeq) +
                      "), or vit on Fashion-MNIST (num_channels 1, image_size 28). Other sizes as the file says")
      ->check(CLI::ExistingFile)
      ->excludes(model_option)
      ->excludes(onnx);
  std::vector<CLI::Option*> onnx_options = {
      add_enum_option(*app, "--loss", flags->loss, import::kLossKindNames,
                      "With --onnx: cross_entropy (logits [B, C] against the class) or mse (scores [B, 10] against one-hot targets)"),
      app->add_option("--output", flags->output, "With --onnx: the graph output the loss reads (default: the first)"),
      app->add_option("--export-onnx", flags->export_onnx,
                      "With --onnx: write a copy of the model with the trained weights (parameters and batch-norm "
                      "statistics) to this .onnx file when training ends")
          ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name the .onnx file to write") : std::string(); },
                                 "FILE")),
  };
  auto* epochs = app->add_option("--epochs", flags->epochs, "Passes over the training set (default per model: mlp 5, cnn 5; gpt counts steps: 3000)")
                     ->check(positive_integer());
  app->add_option("--steps", flags->steps, "Number of steps (instead of --epochs)")
      ->check(positive_integer())
      ->excludes(epochs);
  auto* batch = app->add_option("--batch", flags->batch, "Samples per step (default per model: mlp 128, cnn 64, gpt 32 sequences)")
                    ->check(positive_integer());
  auto* lr = app->add_option("--lr", flags->lr, "Learning rate (default per model: mlp 1e-3, cnn 1e-3, gpt 3e-3)")
                 ->check(positive_finite());
  add_enum_option(*app, "--optimizer", flags->optimizer, graph::kOptimizerNames, "sgd, momentum or adamw");
  app->add_option("--momentum", flags->momentum, "Momentum (optimizer momentum)")
      ->check(finite_in_range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--weight-decay", flags->weight_decay, "Weight decay (decoupled for adamw)")
      ->check(finite_in_range(0.0, 1.0))
      ->capture_default_str();
  add_enum_option(*app, "--lr-schedule", flags->schedule.kind, runtime::kLrScheduleNames,
                  "How the learning rate moves over the run's steps: constant, or cosine (from --lr down to 0 at the last "
                  "step, as PyTorch's CosineAnnealingLR with T_max = the steps)");
  app->add_option("--warmup", flags->schedule.warmup_steps,
                  "Steps of linear warm-up before the schedule: the learning rate times (s + 1) / N at step s < N")
      ->check(whole_number(std::uint64_t{INT64_MAX}))
      ->capture_default_str();
  app->add_option("--seed", flags->seed, "Seed for initialisation and shuffling")
      ->check(whole_number())
      ->capture_default_str();
  app->add_option("--data", flags->data,
                  "mlp, cnn: folder with the Fashion-MNIST IDX files (default " +
                      std::string(models::kFashionMnistDefaultDir) + "); gpt: a text file, or a folder of fortune files (default " +
                      models::kFortunesDefaultDir + ")");
  app->add_option("--vocab", flags->vocab,
                  "gpt and --config decoders: vocabulary size (default: the text's characters); the text may not hold more")
      ->check(positive_integer());
  auto* hidden = app->add_option("--hidden", flags->hidden, "mlp: hidden widths, e.g. --hidden 256,256")
                     ->delimiter(',')
                     ->check(positive_integer())
                     ->capture_default_str();
  std::vector<CLI::Option*> gpt_options = {
      app->add_option("--seq", flags->gpt.context, "gpt and --config decoders: characters per sequence (context)")
          ->check(positive_integer())
          ->capture_default_str(),
      app->add_option("--layers", flags->gpt.layers, "gpt: transformer blocks")->check(positive_integer())->capture_default_str(),
      app->add_option("--heads", flags->gpt.heads, "gpt: attention heads (must divide --width)")
          ->check(positive_integer())
          ->capture_default_str(),
      app->add_option("--width", flags->gpt.width, "gpt: residual stream width")->check(positive_integer())->capture_default_str(),
      app->add_option("--dropout", flags->gpt.dropout, "gpt: dropout probability")->check(finite_in_range(0.0, 0.95))->capture_default_str(),
      add_enum_option(*app, "--attention", flags->gpt.attention, models::kAttentionKindNames,
                      "gpt and --config: fused (one attention op keeping the output and a log-sum-exp per row) or materialized "
                      "([B, heads, T, T] scores and probabilities stored)"),
  };
  app->add_option("--save", flags->save,
                  "Write the trained weights (and optimizer state) to this safetensors file when training ends; "
                  "the previous file stays intact until the new one is complete");
  app->add_option("--load", flags->load,
                  "Start from the weights in this safetensors file (saved by --save with the same model flags)")
      ->check(CLI::ExistingFile);
  app->add_option("--threads", flags->threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  add_enum_option(*app, "--mode", flags->mode, runtime::kExecutionModeNames,
                  "planned: one arena allocated once, tensors at planned offsets; naive: one device allocation per tensor; dynamic: a PyTorch-style caching allocator");
  add_enum_option(*app, "--device", flags->device, kernels::kDeviceKindNames,
                  "Where to train: cpu, cuda, or auto (cuda when a GPU is present, else cpu; says which on stderr)", "auto");
  app->add_option("--debug", flags->debug,
                  "Debug checks, comma-separated: poison (NaN-fill dead buffers, stop at the first op reading NaN), "
                  "guards (guard bytes after every buffer, checked after every op), finite (stop at the first op that reads or "
                  "writes NaN or infinity, naming it and the tensor). Also MEMPLAN_DEBUG=...")
      ->delimiter(',')
      ->check(CLI::IsMember({"poison", "guards", "finite"}));
  app->add_option("--device-memory", flags->device_memory,
                  "Memory the device may give the training step, e.g. 64MiB (default: all the host has). A step "
                  "that needs more stops at setup with the arena size and the largest batch that fits")
      ->check(byte_size());
  app->add_flag("--json", flags->json, "Print one JSON object with the results on stdout");
  app->add_flag("--quiet", flags->quiet, "No progress output on stderr");
  app->add_flag("--profile", flags->profile,
                "Time every op (mean per step, after the first step): per op kind, share of the step, GFLOP/s "
                "(FLOPs as the plan counts them), the five slowest ops; with --json every op under \"profile\"");
  add_checkpoint_options(*app, flags->checkpoint);
  app->add_option("--zero", flags->zero,
                  "Under mpirun: ZeRO stage 0 (data parallel, gradients all-reduced), 1 (optimizer state sharded), 2 "
                  "(gradients too), 3 (parameters too)")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app->add_option("--bucket-mb", flags->bucket_mb, "Under mpirun: gradient bucket size in MiB (reduced as soon as full)")
      ->check(positive_finite())
      ->check(CLI::Range(1.0 / 1024.0, 1024.0 * 1024.0))
      ->capture_default_str();
  app->add_option("--prefetch", flags->prefetch, "Under mpirun with --zero 3: layers whose parameters are gathered ahead")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  return Command{app, [flags, epochs, batch, lr, hidden, gpt_options, onnx, onnx_options, config] {
    TrainFlags resolved = *flags;  // flags left out take the model's defaults
    if (config->count() > 0) {
      auto parsed = models::read_hf_config(flags->config);
      if (!parsed) {
        std::cerr << "memplan train: --config " << parsed.error().message << "\n";
        return kExitUsage;
      }
      resolved.hf = std::move(parsed).value();
      // The defaults (epochs or steps, batch, lr) of the reference model trained on the same data.
      resolved.model = resolved.hf->vision() ? "cnn" : "gpt";
      if (hidden->count() > 0) {
        std::cerr << "memplan train: --hidden sets the MLP's widths; a --config fixes the model\n";
        return kExitUsage;
      }
      CLI::Option* seq = gpt_options[0];
      CLI::Option* attention = gpt_options.back();
      for (const CLI::Option* option : gpt_options) {
        const bool applies = option == attention || (option == seq && !resolved.hf->vision());
        if (option->count() > 0 && !applies) {
          std::cerr << "memplan train: " << option->get_name() << (option == seq ? " applies to language models; "
                                                                                  : " applies to --model gpt; ")
                    << flags->config << " is a " << resolved.hf->model_type << " config, which fixes the model's sizes\n";
          return kExitUsage;
        }
      }
      resolved.config_seq = seq->count() > 0 ? flags->gpt.context : 0;
      for (const CLI::Option* option : onnx_options) {
        if (option->count() > 0) {
          std::cerr << "memplan train: " << option->get_name() << " applies to --onnx models only\n";
          return kExitUsage;
        }
      }
    } else if (onnx->count() > 0) {
      resolved.model = "cnn";  // an imported classifier takes the CNN's defaults (epochs, batch, lr)
      if (hidden->count() > 0) {
        std::cerr << "memplan train: --hidden sets the MLP's widths; it does not apply to --onnx (the file fixes the model)\n";
        return kExitUsage;
      }
    } else {
      for (const CLI::Option* option : onnx_options) {
        if (option->count() > 0) {
          std::cerr << "memplan train: " << option->get_name() << " applies to --onnx models only\n";
          return kExitUsage;
        }
      }
    }
    if (resolved.model != "mlp" && hidden->count() > 0) {
      std::cerr << "memplan train: --hidden sets the MLP's widths; it does not apply to --model " << resolved.model << "\n";
      return kExitUsage;
    }
    for (const CLI::Option* option : gpt_options) {
      if (!resolved.hf && resolved.model != "gpt" && option->count() > 0) {
        std::cerr << "memplan train: " << option->get_name() << " applies to --model gpt, not "
                  << (onnx->count() > 0 ? "--onnx" : resolved.model) << "\n";
        return kExitUsage;
      }
    }
    const models::TrainDefaults defaults = models::train_defaults(resolved.model);
    if (epochs->count() == 0) resolved.epochs = defaults.epochs;
    if (epochs->count() == 0 && resolved.steps == 0) resolved.steps = defaults.steps;
    if (batch->count() == 0) resolved.batch = defaults.batch;
    if (lr->count() == 0) resolved.lr = defaults.lr;
    return run_train(resolved);
  }};
}

}  // namespace memplan::tools
