#include "memplan/train/run.h"

#include "memplan/train/adapters.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <utility>

#include "memplan/models/model_source.h"
#include "memplan/planner/fit.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/weights.h"
#include "memplan/train/stop_signals.h"

namespace memplan::train {
namespace {

// PEFT's names for the run's modules: a Hugging Face rotary decoder's layers sit under "model.".
AdapterNaming adapter_naming(const TrainSpec& spec) {
  AdapterNaming naming;
  naming.base_model = spec.label();
  if (spec.model.config && spec.model.config->family == models::HfFamily::llama) naming.module_prefix = "model.";
  return naming;
}


TrainError input_error(std::string message) { return {TrainError::Kind::input, std::move(message), {}}; }
TrainError run_error(std::string message) { return {TrainError::Kind::run, std::move(message), {}}; }

// The export is written when training ends: a folder that cannot take it is said up front.
Status check_export_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Error{"--export-onnx " + path + " is a folder; name the .onnx file to write"};
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return Error{"--export-onnx " + path + ": the folder " + parent.string() +
                 " does not exist; create it or name a file in an existing folder"};
  }
  return Status::success();
}

// The model as it trains: a decoder config's sequence resolved (config_train_seq).
Result<models::ModelOptions> resolved_model(const TrainSpec& spec) {
  models::ModelOptions model = spec.model;
  if (model.config && !model.config->vision()) {
    auto seq = config_train_seq(*model.config, model.zoo.seq);
    if (!seq) return seq.error();
    model.zoo.seq = seq.value();
  }
  return model;
}

// The data-parallel shape of the step on `world` ranks (rank and world set per process).
graph::DataParallelConfig parallel_config(const TrainSpec& spec, int world, int rank) {
  graph::DataParallelConfig dp;
  dp.world = world;
  dp.rank = rank;
  dp.zero = spec.zero;
  dp.bucket_bytes = spec.bucket_bytes;
  dp.prefetch = spec.prefetch;
  dp.expert_parallel = models::expert_parallel_of(spec.model).degree;
  return dp;
}

int tensor_parallel_degree(const TrainSpec& spec) { return models::tensor_parallel_of(spec.model).degree; }

// --tensor-parallel T needs a multiple of T ranks, and a decoder (model_options refuses others).
Status check_tensor_parallel(const TrainSpec& spec, int world) {
  const int t = tensor_parallel_degree(spec);
  if (t == 1) {
    if (models::tensor_parallel_of(spec.model).sequence_parallel) {
      return Error{"--sequence-parallel splits the rows tensor parallelism leaves whole: give --tensor-parallel T (2 or more) too"};
    }
    return Status::success();
  }
  if (!spec.onnx.path.empty()) return Error{"--tensor-parallel splits the decoders' layers, not an --onnx graph"};
  if (world % t != 0 || world == 1) {
    return Error{"--tensor-parallel " + std::to_string(t) + " splits each layer over " + std::to_string(t) + " ranks, but " +
                 std::to_string(world) + (world == 1 ? " process runs" : " ranks run") + ": launch a multiple of " +
                 std::to_string(t) + " (mpirun -np " + std::to_string(t) + ")"};
  }
  return Status::success();
}

// --expert-parallel E splits each mixture layer's experts over groups of E data-parallel ranks:
// the data ranks must divide into such groups, and the model must have experts (its builder says
// when the degree does not divide them).
Status check_expert_parallel(const TrainSpec& spec, int replicas) {
  const int e = models::expert_parallel_of(spec.model).degree;
  if (e == 1) return Status::success();
  if (!spec.onnx.path.empty()) return Error{"--expert-parallel splits a mixture of experts' experts, not an --onnx graph"};
  if (replicas % e != 0 || replicas == 1) {
    return Error{"--expert-parallel " + std::to_string(e) + " splits the experts over groups of " + std::to_string(e) +
                 " data-parallel ranks, but " + std::to_string(replicas) + (replicas == 1 ? " runs" : " run") +
                 ": launch a multiple of " + std::to_string(e) + " data-parallel ranks (mpirun -np " +
                 std::to_string(e * tensor_parallel_degree(spec)) + ")"};
  }
  return Status::success();
}

Status check_several_ranks(const TrainSpec& spec) {
  if (spec.device && *spec.device != kernels::DeviceKind::cpu) {
    return Error{"several ranks train on the CPU (MPI); drop --device " + std::string(kernels::device_kind_name(*spec.device)) +
                 " or run one process"};
  }
  // Rank 0 saves what every rank holds whole under stage 0; sharded state would need gathering.
  if (!spec.load.empty() || (!spec.save.empty() && spec.zero != 0)) {
    return Error{"with several ranks --save works with --zero 0 only, and --load not at all; --save-dir saves and "
                 "resumes every rank's shard at every stage"};
  }
  if (spec.mode != runtime::ExecutionMode::planned) return Error{"several ranks run --mode planned only"};
  if (spec.dtype == graph::DType::f16 && spec.zero != 0) {
    return Error{"--dtype fp16 scales the loss, which needs every rank to see every gradient: use --zero 0, or "
                 "--dtype bf16 (no loss scaling)"};
  }
  return Status::success();
}

// Why setup ran out of device memory, and what would fit, answered by planning alone (the same
// answer_fit as `memplan fit`, with this device's profile): the arena against what the device can
// give; the requested batch with activation checkpointing, when the run used none; and the
// largest batch under the run's own checkpoint strategy.
std::string out_of_memory_advice(const planner::StepDescription& step, const planner::PlanRequest& request,
                                 const runtime::Executor& executor, Bytes capacity) {
  std::ostringstream out;
  const planner::MemoryPlan* plan = executor.plan();
  if (plan == nullptr) {
    out << "the device has " << format_bytes(capacity) << " (--device-memory); --mode planned states the arena it "
        << "needs up front";
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
  out << "out of memory at setup: the arena needs " << format_bytes(arena) << " (" << arena << " bytes) but the device can give "
      << format_bytes(capacity) << " (" << capacity << " bytes, --device-memory)";
  auto answer = planner::answer_fit(question);
  if (!answer) return out.str() + "\n" + answer.error().message;
  const planner::FitAnswer& a = answer.value();
  const bool asked_for_checkpointing = request.checkpoint != planner::CheckpointStrategy::kNone || request.budget;
  if (!asked_for_checkpointing && a.suggestion && a.suggestion->whole_batch_checkpoint) {
    out << "\nbatch " << step.batch << " fits with activation checkpointing: add --checkpoint auto --budget "
        << question.request.device.arena_budget(capacity) << " (auto picks --checkpoint "
        << planner::checkpoint_strategy_name(*a.suggestion->whole_batch_checkpoint) << ")";
  }
  const std::string with = request.checkpoint == planner::CheckpointStrategy::kNone
                               ? ""
                               : " with --checkpoint " + std::string(planner::checkpoint_strategy_name(request.checkpoint));
  const std::int64_t max_batch = a.max_batch.empty() ? 0 : a.max_batch.front().max_batch;
  if (max_batch > 0) {
    out << "\nthe largest batch that fits" << with << " is " << max_batch << ": try --batch " << max_batch
        << " (found by planning alone, as 'memplan fit --max-batch' does)";
  } else {
    out << "\nnot even batch 1 fits" << with << "; try a smaller model ('memplan fit' shows where the bytes go)";
  }
  return out.str();
}

// The ranks of a run split each layer over groups of tensor_parallel consecutive ranks (rank r
// holds slice r % T), and the groups are data-parallel replicas of one another (Megatron-LM's
// layout): one communicator per kind of group. With expert parallelism the replicas form groups
// of `expert_parallel` consecutive ones that split the experts (replica d holds share d % E) and
// exchange tokens; replicas holding the same share sum their experts' gradients.
struct RankGroups {
  int tensor_parallel = 1;
  int replicas = 1;      // the data-parallel world
  int replica = 0;       // this rank's replica (its data-parallel rank)
  int slice = 0;         // this rank's slice of each layer
  int expert_parallel = 1;
  std::unique_ptr<dist::Communicator> tensor, data;  // both set when tensor_parallel > 1
  std::unique_ptr<dist::Communicator> expert, expert_data;  // both set when expert_parallel > 1
};

Result<RankGroups> rank_groups(const TrainSpec& spec, dist::Communicator& comm) {
  RankGroups groups;
  groups.tensor_parallel = tensor_parallel_degree(spec);
  const int t = groups.tensor_parallel;
  groups.replicas = comm.world_size() / t;
  groups.replica = comm.rank() / t;
  groups.slice = comm.rank() % t;
  groups.expert_parallel = models::expert_parallel_of(spec.model).degree;
  const int e = groups.expert_parallel;
  if (t > 1) {
    auto tensor = comm.split(groups.replica);
    if (!tensor) return tensor.error();
    auto data = comm.split(groups.slice);
    if (!data) return data.error();
    groups.tensor = std::move(tensor).value();
    groups.data = std::move(data).value();
  }
  if (e > 1) {
    // Colours over the whole world: the slice keeps tensor-parallel groups apart.
    auto expert = comm.split(groups.slice * groups.replicas + groups.replica / e);
    if (!expert) return expert.error();
    auto expert_data = comm.split(groups.slice * groups.replicas + groups.replica % e);
    if (!expert_data) return expert_data.error();
    groups.expert = std::move(expert).value();
    groups.expert_data = std::move(expert_data).value();
  }
  return groups;
}

SessionOptions session_options(const TrainSpec& spec, int world, int rank, dist::Communicator* comm) {
  SessionOptions options;
  options.batch = spec.batch;
  options.optimizer = spec.optimizer;
  options.schedule = spec.schedule;
  options.seed = spec.seed;
  options.dtype = spec.dtype;
  options.offload_optimizer = spec.offload_optimizer;
  options.fused_loss = spec.fused_loss;
  options.lora = spec.lora;
  options.quant = spec.quant;
  options.executor.mode = spec.mode;
  options.executor.debug = spec.debug;
  options.executor.communicator = comm;
  options.parallel = parallel_config(spec, world, rank);
  options.request = spec.request;
  return options;
}

// Notes the reporting rank passes to its caller.
struct Notes {
  const TrainEvents& events;
  bool reporting;
  void operator()(const std::string& line) const {
    if (reporting && events.note) events.note(line);
  }
};

void note_config(const TrainSpec& spec, const RunData& data, const Notes& note) {
  const models::HfConfig& c = *data.model.config;
  note("--config " + spec.model.name + ": " + c.describe());
  if (!data.text_model()) return;
  // The config as the user wrote it (the run's copy holds the text's vocabulary already).
  const models::HfConfig& given = spec.model.config ? *spec.model.config : c;
  const std::int64_t config_vocab = given.family == models::HfFamily::gpt2 ? given.gpt.vocab
                                    : given.family == models::HfFamily::t5  ? given.t5.vocab
                                                                            : given.llama.vocab;
  const std::int64_t characters = data.text->vocab_size();
  const std::int64_t vocab = data.model.gpt.vocab;
  note("no tokenizer: the text's " + std::to_string(characters) + " distinct bytes are the tokens, in a vocabulary of " +
       std::to_string(vocab) + (vocab == characters ? "" : " (--vocab)") + " in place of the config's " +
       std::to_string(config_vocab) + " tokens; " + std::to_string(data.model.gpt.context) + " characters per sequence (--seq)");
  if (const std::int64_t target = text_target(data.model); target > 0) {
    note("the decoder continues the encoder's text: " + std::to_string(target) +
         " characters per target (--target-seq), teacher-forced behind the source's last character");
  }
  if (c.family == models::HfFamily::llama) {
    const std::string moe = models::describe_moe_capacity(c.llama, spec.batch * data.model.gpt.context);
    if (!moe.empty()) note(moe);
  }
}

// Every rank's arena and allocations during steps, gathered on every rank (2 numbers a rank).
std::vector<RankMemory> gather_rank_memory(const runtime::Executor& executor, dist::Communicator& comm) {
  const int world = comm.world_size();
  std::vector<std::int64_t> numbers(static_cast<std::size_t>(2 * world));
  const planner::MemoryPlan* plan = executor.plan();
  const std::int64_t mine[2] = {plan != nullptr ? plan->arena_bytes : 0, executor.device_allocations_during_steps()};
  comm.all_gather_shards(mine, numbers.data(), 2 * world, dist::ElementType::i64);
  std::vector<RankMemory> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back({r, numbers[static_cast<std::size_t>(2 * r)], numbers[static_cast<std::size_t>(2 * r + 1)]});
  }
  return ranks;
}

// Test accuracy or validation loss, saving and exporting: what rank 0 does once training ends.
Result<bool, TrainError> finish_run(const TrainSpec& spec, const TrainingSession& session, TrainReport& report,
                                    const Notes& note) {
  // Evaluation reads whole parameters: every rank but ZeRO-3's holds them (rank 0 evaluates).
  const bool sliced = tensor_parallel_degree(spec) > 1 || models::expert_parallel_of(spec.model).degree > 1;
  if (spec.eval_samples == 0) {
    note("no evaluation (--eval-samples 0)");
  } else if (sliced) {
    note(std::string("no evaluation under ") + (tensor_parallel_degree(spec) > 1 ? "--tensor-parallel (each rank holds a slice of every layer)" : "--expert-parallel (each rank holds a share of the experts)") +
         "; --save writes the whole model, which 'memplan sample' and a single-process run read");
  } else if (report.world == 1 || spec.zero < 3) {
    auto evaluation = session.evaluate(spec.eval_samples);
    if (!evaluation) return run_error("evaluation failed: " + evaluation.error().message);
    report.test = evaluation.value().classifier;
    report.validation = evaluation.value().text;
  } else {
    note("no test evaluation under ZeRO-3 (parameters stay sharded across ranks)");
  }
  if (!spec.save_adapter.empty()) {
    if (Status saved = save_adapter(session.executor(), session.step().lora, adapter_naming(spec), spec.save_adapter); !saved) {
      return run_error("cannot save the adapter: " + saved.error().message);
    }
    note("saved the LoRA adapter (PEFT's files) to " + spec.save_adapter);
  }
  if (!spec.save.empty() && !sliced) {  // tensor parallel: saved by every rank together, before
    if (Status saved = spec.merge_lora ? session.save_merged(spec.save) : session.save(spec.save); !saved) {
      return run_error("cannot save: " + saved.error().message);
    }
    note(std::string(spec.merge_lora ? "saved the weights, the adapters merged into them, to " : "saved the weights to ") + spec.save);
  }
  if (!spec.onnx.export_path.empty()) {
    if (Status exported = session.export_onnx(spec.onnx.export_path); !exported) {
      return run_error("cannot export the ONNX model: " + exported.error().message);
    }
    note("wrote the trained model to " + spec.onnx.export_path);
  }
  return true;
}

// Plans, sets up and resumes the session for `device`.
Result<std::unique_ptr<TrainingSession>, TrainError> start_session(const TrainSpec& spec, RunData data,
                                                                   const SessionOptions& options, runtime::Device& device,
                                                                   const Notes& note) {
  auto planned = TrainingSession::plan(std::move(data), options, device);
  if (!planned) return input_error(planned.error().message);
  std::unique_ptr<TrainingSession> session = std::move(planned).value();
  if (!session->planned().fits) {
    return TrainError{TrainError::Kind::over_budget,
                      "the step's arena cannot meet the budget of " + std::to_string(session->planned().budget.value_or(0)) +
                          " bytes",
                      session->planned()};
  }
  if (Status s = session->setup(); !s) {
    std::string message = s.error().message;
    if (spec.device_memory > 0) {
      message += "\n" + out_of_memory_advice(session->step(), session->request(), session->executor(), spec.device_memory);
    }
    return run_error(message);
  }
  if (!spec.load.empty()) {
    auto loaded = session->resume(spec.load);
    if (!loaded) return input_error(loaded.error().message);
    if (!loaded.value().converted.empty()) {
      note("converted " + std::to_string(loaded.value().converted.size()) + " tensors saved at another precision, exactly (" +
           loaded.value().converted.front() + (loaded.value().converted.size() > 1 ? ", ..." : "") + ")");
    }
    note("loaded " + std::to_string(loaded.value().loaded) + " tensors from " + spec.load + ", resuming after step " +
         std::to_string(loaded.value().step) +
         (loaded.value().fresh_state.empty() ? "" : " (optimizer state starts fresh: not in the file)"));
  }
  if (!spec.load_adapter.empty()) {
    auto loaded = load_adapter(session->executor(), session->step().lora, adapter_naming(spec), spec.load_adapter);
    if (!loaded) return input_error("--load-adapter: " + loaded.error().message);
    note("loaded " + std::to_string(loaded.value()) + " adapter tensors from " + spec.load_adapter);
  }
  return session;
}


// Periodic checkpoints around a session (spec.checkpoints.dir set): resuming the newest complete
// checkpoint, saving between steps, and stopping cleanly on SIGTERM or SIGINT.
class CheckpointedRun {
 public:
  static Result<std::unique_ptr<CheckpointedRun>, TrainError> open(const TrainSpec& spec, TrainingSession& session,
                                                                   dist::Communicator& comm, const Notes& note) {
    std::unique_ptr<CheckpointedRun> run(new CheckpointedRun(spec, comm));
    run->checkpointer_.note = [note](const std::string& line) { note(line); };
    if (Status s = run->checkpointer_.prepare(); !s) return input_error(s.error().message);
    auto search = find_resume_point(spec.checkpoints.dir, run_identity(spec, comm.world_size()), comm);
    if (!search) return input_error(search.error().message);
    for (const std::string& skipped : search.value().skipped) note("skipping checkpoint " + skipped);
    if (const std::optional<ResumePoint>& found = search.value().found) {
      if (Status s = session.resume_checkpoint(found->shard, found->shard_path); !s) return input_error(s.error().message);
      run->checkpointer_.resumed_at(found->step);
      run->resumed_ = found->dir;
      note("resuming from " + found->dir + ": " + std::to_string(found->step) + " of " + std::to_string(spec.steps) +
           " steps done");
    } else {
      note("no checkpoint in " + spec.checkpoints.dir + " yet: starting afresh, saving every " +
           std::to_string(spec.checkpoints.every) + " steps");
    }
    return run;
  }

  // Between steps: a save due, a finished save committed, a signal agreed on.
  Result<bool> after_step(const runtime::Executor& executor, std::int64_t done) {
    return checkpointer_.after_step(executor, done, StopSignals::received() != 0);
  }

  // After the loop: the last step saved. A signal that arrived stops the run here (no
  // evaluation); otherwise the handlers go, and a signal during evaluation ends the process.
  Result<bool, TrainError> finish(const runtime::Executor& executor, std::int64_t done, std::int64_t total) {
    if (Status s = checkpointer_.save_and_wait(executor, done); !s) return run_error(s.error().message);
    // Agreed, so no rank goes on to the evaluation's collectives while another stops.
    const int signal = StopSignals::received();
    const bool stop = checkpointer_.any_rank(signal != 0);
    signals_.reset();
    if (!stop && done == total) return true;
    const std::string where = checkpointer_.saved().empty() ? resumed_ : checkpointer_.saved().back().dir;
    TrainError e{TrainError::Kind::interrupted,
                 std::string("stopped by ") + signal_name(signal == 0 ? SIGTERM : signal) + " after step " + std::to_string(done) +
                     " of " + std::to_string(total) + "; " + where + " holds it: run the same command again to resume",
                 std::nullopt, signal == 0 ? SIGTERM : signal};
    return e;
  }

  void fill(TrainReport& report, const runtime::Executor& executor) const {
    report.resumed_checkpoint = resumed_;
    // fp16 loss scaling: the steps skipped over the whole run, its resumed part included.
    report.summary.skipped_steps = executor.skipped_steps();
    report.checkpoints_saved = checkpointer_.saved();
    report.checkpoint_snapshot_bytes = checkpointer_.snapshot_bytes();
  }

 private:
  CheckpointedRun(const TrainSpec& spec, dist::Communicator& comm)
      : checkpointer_(spec.checkpoints, run_identity(spec, comm.world_size()), spec.steps, comm) {
    signals_.emplace();
  }

  Checkpointer checkpointer_;
  std::optional<StopSignals> signals_;
  std::string resumed_;
};

}  // namespace

RunIdentity run_identity(const TrainSpec& spec, int world) {
  auto number = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", v);
    return std::string(text);
  };
  RunIdentity id;
  if (!spec.onnx.path.empty()) {
    id.emplace_back("--onnx", spec.onnx.path);
    id.emplace_back("--loss", std::string(enum_name(import::kLossKindNames, spec.onnx.loss)));
  } else if (spec.model.config) {
    id.emplace_back("--config", spec.model.name + " (" + spec.model.config->describe() + ")");
    id.emplace_back("--seq", std::to_string(spec.model.zoo.seq));
    if (spec.model.config->encoder_decoder()) id.emplace_back("--target-seq", std::to_string(spec.model.zoo.target_seq));
  } else {
    id.emplace_back("--model", spec.model.name);
    if (spec.model.name == "mlp") {
      std::string widths;
      for (std::int64_t w : spec.model.mlp.hidden) widths += (widths.empty() ? "" : ",") + std::to_string(w);
      id.emplace_back("--hidden", widths);
    }
    if (spec.model.name == "gpt") {
      const models::GptConfig& g = spec.model.gpt;
      id.emplace_back("--seq", std::to_string(g.context));
      id.emplace_back("--layers", std::to_string(g.layers));
      id.emplace_back("--heads", std::to_string(g.heads));
      id.emplace_back("--width", std::to_string(g.width));
      id.emplace_back("--dropout", number(g.dropout));
      id.emplace_back("--attention", std::string(models::attention_kind_name(g.attention)));
    }
  }
  if (spec.lora.active()) {  // fine-tuning changes which parameters exist and which train
    auto joined = [](const std::vector<std::string>& items) {
      std::string text;
      for (const std::string& item : items) text += (text.empty() ? "" : ",") + item;
      return text;
    };
    id.emplace_back("--lora", spec.lora.rank > 0 ? std::to_string(spec.lora.rank) + ":" + number(spec.lora.alpha) : "(none)");
    if (spec.lora.rank > 0) {
      id.emplace_back("--lora-targets", joined(spec.lora.targets));
      id.emplace_back("--lora-dropout", number(spec.lora.dropout));
      id.emplace_back("--lora-dtype", spec.lora.dtype ? std::string(graph::dtype_name(*spec.lora.dtype)) : "fp32");
    }
    id.emplace_back("--freeze", joined(spec.lora.freeze));
    if (spec.quant.active()) {
      id.emplace_back("--quant", std::string(enum_name(graph::kQuantFormatNames, spec.quant.format)));
      id.emplace_back("--double-quant", spec.quant.double_quant ? "yes" : "no");
    }
  }
  id.emplace_back("--data", spec.data.empty() ? "(default)" : spec.data);
  id.emplace_back("--vocab", spec.vocab > 0 ? std::to_string(spec.vocab) : "(the text's)");
  id.emplace_back("--batch", std::to_string(spec.batch));
  id.emplace_back("--dtype", std::string(graph::dtype_name(spec.dtype)));
  id.emplace_back("--optimizer", std::string(graph::optimizer_name(spec.optimizer.kind)));
  id.emplace_back("--lr", number(spec.optimizer.lr));
  id.emplace_back("--momentum", number(spec.optimizer.momentum));
  id.emplace_back("--weight-decay", number(spec.optimizer.weight_decay));
  id.emplace_back("--lr-schedule", std::string(enum_name(runtime::kLrScheduleNames, spec.schedule.kind)));
  id.emplace_back("--warmup", std::to_string(spec.schedule.warmup_steps));
  // The schedule's length moves every learning rate, unless it is constant after the warm-up.
  if (spec.schedule.kind != runtime::LrScheduleKind::constant) id.emplace_back("--steps", std::to_string(spec.steps));
  id.emplace_back("--seed", std::to_string(spec.seed));
  id.emplace_back("mpirun -np", std::to_string(world));
  if (tensor_parallel_degree(spec) > 1) id.emplace_back("--tensor-parallel", std::to_string(tensor_parallel_degree(spec)));
  if (models::tensor_parallel_of(spec.model).sequence_parallel) id.emplace_back("--sequence-parallel", "on");
  id.emplace_back("--zero", std::to_string(spec.zero));
  return id;
}

std::string TrainSpec::label() const { return !onnx.path.empty() ? onnx.path : model.name; }

Status check_train_spec(const TrainSpec& spec, int world, const planner::SizeNaming& naming) {
  if (!spec.onnx.export_path.empty()) {
    if (Status s = check_export_path(spec.onnx.export_path); !s) return s;
  }
  if (Status s = check_tensor_parallel(spec, world); !s) return s;
  const int replicas = world / tensor_parallel_degree(spec);  // the data-parallel world
  if (Status s = check_expert_parallel(spec, replicas); !s) return s;
  if (world > 1) {
    if (Status s = check_several_ranks(spec); !s) return s;
  }
  for (std::int64_t width : spec.model.mlp.hidden) {
    if (width <= 0) return Error{"--hidden widths must be positive, got " + std::to_string(width)};
  }
  if (spec.onnx.path.empty()) {
    // Sizes are checked before any data is read; the text's vocabulary is at most 256 bytes.
    auto model = resolved_model(spec);
    if (!model) return model.error();
    models::ModelOptions sizes = std::move(model).value();
    const std::int64_t vocab = spec.vocab > 0 ? spec.vocab : 256;
    sizes.gpt.vocab = vocab;
    if (sizes.config) sizes.config->gpt.vocab = sizes.config->llama.vocab = vocab;
    planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(sizes), spec.batch, spec.optimizer);
    step.parallel = parallel_config(spec, replicas, 0);
    if (auto problem = planner::find_step_size_problem(step)) return Error{planner::describe(*problem, naming)};
  } else {
    if (spec.vocab > 0) return Error{"--vocab applies to text models (gpt and decoder configs), not --onnx"};
    planner::StepDescription step;  // the file's model is read later; the global batch is checked now
    step.batch = spec.batch;
    step.parallel = parallel_config(spec, replicas, 0);
    if (auto problem = planner::global_batch_problem(step)) return Error{planner::describe(*problem, naming)};
  }
  if (!spec.checkpoints.dir.empty()) {
    if (!spec.load.empty()) {
      return Error{"--load starts a run from saved weights and --save-dir resumes a run's own checkpoints: use one "
                   "(a run resumed with --load can save with --save)"};
    }
    if (spec.checkpoints.every < 0 || spec.checkpoints.keep < 1) {
      return Error{"--save-every must be 0 or more and --keep at least 1"};
    }
    std::error_code ec;
    if (std::filesystem::exists(spec.checkpoints.dir, ec) && !std::filesystem::is_directory(spec.checkpoints.dir, ec)) {
      return Error{"--save-dir " + spec.checkpoints.dir + " is a file; name a folder (created if missing)"};
    }
  }
  if (!spec.load.empty()) {
    // A file that cannot be a weights file is refused before the data is read.
    if (Status s = runtime::check_weights_file(spec.load); !s) return Error{"--load: " + s.error().message};
  }
  return Status::success();
}

Result<TrainReport, TrainError> run_training(const TrainSpec& spec_in, dist::Communicator* comm, const TrainEvents& events,
                                             const planner::SizeNaming& naming) {
  kernels::set_cpu_threads(spec_in.threads);
  std::unique_ptr<dist::Communicator> own_comm;
  if (comm == nullptr) {
    auto made = dist::make_cpu_communicator();
    if (!made) return run_error(made.error().message);
    own_comm = std::move(made).value();
    comm = own_comm.get();
  }
  const int world = comm->world_size();
  const int rank = comm->rank();
  const Notes note{events, rank == 0};
  if (Status s = check_train_spec(spec_in, world, naming); !s) return input_error(s.error().message);
  TrainSpec spec = spec_in;
  spec.model = resolved_model(spec_in).value();  // check_train_spec resolved it once already
  auto grouped = rank_groups(spec, *comm);
  if (!grouped) return run_error(grouped.error().message);
  const RankGroups& groups = grouped.value();
  if (groups.tensor_parallel > 1) {
    graph::TensorParallel tp = models::tensor_parallel_of(spec.model);
    tp.degree = groups.tensor_parallel;
    tp.rank = groups.slice;
    models::set_tensor_parallel(spec.model, tp);
  }
  if (groups.expert_parallel > 1) {
    models::set_expert_parallel(spec.model, {groups.expert_parallel, groups.replica % groups.expert_parallel});
  }

  // The device first: a missing GPU is reported before any data is read.
  const kernels::DeviceKind kind =
      spec.device ? *spec.device : world > 1 ? kernels::DeviceKind::cpu : runtime::auto_device_kind();
  auto made = runtime::make_device(kind, spec.device_memory);
  if (!made) {
    return input_error("--device " + std::string(spec.device ? kernels::device_kind_name(*spec.device) : "auto") + ": " +
                       made.error().message);
  }
  const std::unique_ptr<runtime::Device> device = std::move(made).value();
  if (spec.tf32 && !runtime::allow_tf32(*device, true)) {
    note("--tf32 changes nothing on " + device->name() + ": it computes fp32 GEMMs in fp32");
  }
  if (!spec.device) {
    note(std::string("--device auto: ") + (device->kind() == kernels::DeviceKind::cuda
                                               ? "a CUDA GPU is present, training on it"
                                               : "no CUDA GPU present, training on the CPU"));
  }
  auto data = spec.onnx.path.empty()
                  ? load_run_data(spec.model, spec.data, spec.batch, spec.vocab)
                  : load_onnx_run_data(spec.onnx.path, spec.onnx.loss, spec.onnx.output, spec.data, spec.batch);
  if (!data) return input_error(data.error().message);
  const bool text_model = data.value().text_model();
  if (text_model && !spec.save.empty() && data.value().model.gpt.vocab != data.value().text->vocab_size()) {
    return input_error("--save keeps a GPT whose vocabulary is its text's characters (sample reads them back); --vocab " +
                       std::to_string(spec.vocab) + " differs from the text's " +
                       std::to_string(data.value().text->vocab_size()) + ": leave out --vocab or --save");
  }
  if (data.value().model.config) note_config(spec, data.value(), note);
  if (data.value().onnx && data.value().onnx->io.resamples()) {
    const ClassifierIo& io = data.value().onnx->io;
    note("the model takes " + std::to_string(io.channels) + " x " + std::to_string(io.height) + " x " + std::to_string(io.width) +
         " images: the " + std::to_string(data.value().train_images->rows) + " x " +
         std::to_string(data.value().train_images->cols) + " gray images are resampled bilinearly" +
         (io.channels > 1 ? " and repeated over the channels" : "") + " (torchvision's Grayscale and Resize)");
  }

  SessionOptions options = groups.tensor_parallel == 1 ? session_options(spec, world, rank, comm)
                                                       : session_options(spec, groups.replicas, groups.replica, groups.data.get());
  options.executor.tensor_communicator = groups.tensor.get();
  options.executor.expert_communicator = groups.expert.get();
  options.executor.expert_data_communicator = groups.expert_data.get();
  auto started = start_session(spec, std::move(data).value(), options, *device, note);
  if (!started) return started.error();
  TrainingSession& session = *started.value();
  runtime::Executor& executor = session.executor();
  const std::int64_t steps_per_epoch = session.steps_per_epoch();
  if (spec.steps <= 0) spec.steps = spec.epochs * steps_per_epoch;
  if (Status s = runtime::check_lr_schedule(spec.schedule, spec.steps); !s) return input_error(s.error().message);
  std::unique_ptr<CheckpointedRun> checkpoints;
  if (!spec.checkpoints.dir.empty()) {
    auto opened = CheckpointedRun::open(spec, session, *comm, note);
    if (!opened) return opened.error();
    checkpoints = std::move(opened).value();
  }
  TrainStart start{session.steps_done(), spec.steps, steps_per_epoch, session.samples_per_step(), text_model, device->name()};
  if (device->kind() == kernels::DeviceKind::cpu) start.device += " (" + std::to_string(kernels::cpu_threads()) + " threads)";
  if (rank == 0 && events.start) events.start(start);

  // The profile leaves out the first step (first touches of the arena, threads starting) unless
  // it is the only one.
  const std::int64_t first_step = checkpoints ? std::min(session.steps_done(), spec.steps) : 0;
  if (spec.profile && spec.steps - first_step == 1) executor.set_profiling(true);
  const runtime::ProgressFn on_step = [&](const runtime::StepReport& r) {
    if (spec.profile && r.step == first_step + 1 && spec.steps - first_step > 1) executor.set_profiling(true);
    if (rank == 0 && events.step) events.step(r);
  };
  auto summary = checkpoints ? session.run_until(spec.steps, on_step,
                                                 [&](std::int64_t done) { return checkpoints->after_step(executor, done); })
                             : session.run(spec.steps, on_step);
  if (summary && checkpoints) {
    auto finished = checkpoints->finish(executor, session.steps_done(), spec.steps);
    if (!finished) return finished.error();
  }
  if (!summary) {
    std::string message = summary.error().message;
    if (!spec.debug.finite && message.find("non-finite") != std::string::npos) {
      message += "\nrerun with --debug finite to name the first op and tensor that became non-finite";
    }
    return run_error(message);
  }

  TrainReport report;
  report.reporting = rank == 0;
  report.world = world;
  report.ranks = gather_rank_memory(executor, *comm);
  report.params_sha256 = session.params_sha256();  // a collective under ZeRO-3 and tensor parallelism
  if ((groups.tensor_parallel > 1 || groups.expert_parallel > 1) && !spec.save.empty()) {
    // Every rank sends its slices; rank 0 writes the whole tensors.
    if (Status saved = session.save(spec.save); !saved) return run_error("cannot save: " + saved.error().message);
    note("saved the weights to " + spec.save + (groups.tensor_parallel > 1 ? " (whole tensors, gathered from the tensor-parallel slices)"
                                                                            : " (whole tensors, the experts gathered from every rank's share)"));
  }
  report.summary = std::move(summary).value();
  if (checkpoints) checkpoints->fill(report, executor);
  if (const planner::MemoryPlan* plan = executor.plan()) report.plan = *plan;
  report.rewrites = session.planned().rewrites;
  report.device_allocations_during_steps = executor.device_allocations_during_steps();
  report.device_bytes_at_setup = executor.device_bytes_at_setup();
  if (rank != 0) {
    report.spec = spec;
    return report;  // rank 0 reports for the run
  }
  if (auto finished = finish_run(spec, session, report, note); !finished) return finished.error();

  const RunData& trained = session.data();
  report.spec = spec;
  if (trained.model.config) report.config_description = trained.model.config->describe();
  report.device = device->name();
  report.text_model = text_model;
  report.step = session.planned().graph;
  report.checkpoint = session.planned().checkpoint;
  report.epochs = double(report.summary.first_step + report.summary.steps) / double(steps_per_epoch);
  const double median_ms = report.summary.step_time_ms_median;  // 0 when a resumed run had no step left
  report.samples_per_s = median_ms > 0.0 ? double(start.samples_per_step) * 1000.0 / median_ms : 0.0;
  if (trained.text) {
    report.unigram_entropy = unigram_entropy(trained.text->train, trained.text->vocab_size());
    report.vocab = trained.model.gpt.vocab;
    report.text_characters = trained.text->vocab_size();
    report.context = trained.model.gpt.context;
  }
  report.threads = kernels::cpu_threads();
  if (spec.profile) report.profile = executor.profile();
  return report;
}

}  // namespace memplan::train
