// A training run as one library call: a TrainSpec says what to train and how, run_training
// checks it, picks the device, reads the data, plans, trains, evaluates and saves, and returns a
// TrainReport with every figure the run produced (each rank's arena gathered on rank 0).
// `memplan train` fills the spec from its flags and renders the report as text or JSON; a library
// user does the same without the CLI.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/byte_size.h"
#include "memplan/common/result.h"
#include "memplan/dist/communicator.h"
#include "memplan/graph/fusions.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/lora.h"
#include "memplan/graph/quantize.h"
#include "memplan/import/onnx_import.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/registry.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/step_size.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/trainer.h"
#include "memplan/train/checkpoints.h"
#include "memplan/train/session.h"

namespace memplan::train {

// An ONNX classifier trained on Fashion-MNIST in place of a registry model (load_onnx_run_data).
struct OnnxSpec {
  std::string path;  // empty: no ONNX model
  import::LossKind loss = import::LossKind::cross_entropy;
  std::string output;       // the graph output the loss reads; empty: the first
  std::string export_path;  // non-empty: the trained weights written into a copy of the file at the end
};

struct TrainSpec {
  // The model: a registry model (model.name with its knobs model.mlp, model.gpt) or a Hugging Face
  // config (model.config, model.name naming its file; model.zoo.seq the sequence a decoder trains
  // at, 0 for config_train_seq's default); or, when onnx.path is set, that ONNX classifier.
  models::ModelOptions model;
  OnnxSpec onnx;
  std::string data;        // empty: Debian's Fashion-MNIST, or the fortunes for text models
  std::int64_t vocab = 0;  // text models: the vocabulary instead of the text's characters (0: the text's)
  std::int64_t batch = 128;  // the global batch when several ranks train
  std::int64_t steps = 0;    // 0: `epochs` passes over the training set
  std::int64_t epochs = 5;
  graph::OptimizerConfig optimizer;
  runtime::LrSchedule schedule;  // over the run's steps
  std::uint64_t seed = 0;        // initialisation, dropout and the data order
  // f32, or mixed precision: bf16 or f16 activations, gradients and parameters' working copies,
  // f32 master weights and optimizer state (graph/mixed_precision.h).
  graph::DType dtype = graph::DType::f32;
  // fp32 GEMMs on a CUDA GPU may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation);
  // off by default, as in PyTorch. The CPU computes in fp32 whatever this says.
  bool tf32 = false;
  // Optimizer offload (graph::offload_optimizer): state and master weights in host memory; the
  // CPU device only (its update runs there).
  bool offload_optimizer = false;
  // The output projection and cross-entropy computed fused, chunk by chunk (graph/fusions.h).
  graph::FusedLoss fused_loss = graph::FusedLoss::auto_;
  graph::LoraConfig lora;  // --lora, --freeze: fine-tuning (graph/lora.h)
  graph::QuantConfig quant;  // --quant: the frozen linear weights stored quantized (graph/quantize.h)
  int threads = 0;               // CPU threads; 0: all cores
  runtime::ExecutionMode mode = runtime::ExecutionMode::planned;
  runtime::DebugOptions debug;
  // Empty: a CUDA GPU when one is present, else the CPU; several ranks train on the CPU.
  std::optional<kernels::DeviceKind> device;
  Bytes device_memory = 0;  // what the device may give the step; 0: all it has
  // Checkpoint strategy and arena budget (the device profile and guard bytes come from the device).
  planner::PlanRequest request;
  // Under several ranks (the communicator's world): ZeRO stage, gradient bucket bytes, and the
  // layers whose parameters ZeRO-3 gathers ahead.
  int zero = 0;
  Bytes bucket_bytes = Bytes{25} << 20;
  int prefetch = 1;
  std::string load;  // a run saved by `save` to continue from
  // LoRA adapters as PEFT writes them (train/adapters.h): read into the step before training,
  // written after it.
  std::string load_adapter, save_adapter;
  bool merge_lora = false;  // --save writes the adapters merged into their base weights
  std::string save;  // where the weights and optimizer state go when training ends
  // Periodic checkpoints into checkpoints.dir (train/checkpoints.h), and resuming from the
  // newest complete one there: the same spec run again continues where it stopped and ends with
  // the same parameters as a run never stopped. SIGTERM and SIGINT then stop cleanly after the
  // current step, with a checkpoint.
  CheckpointOptions checkpoints;
  bool profile = false;  // time every op (from the second step, when there are several)
  // Held-out examples evaluated when training ends: test images, or validation sequences for text
  // models. None: every test image, or up to kDefaultEvalSequences sequences; 0: no evaluation.
  std::optional<std::int64_t> eval_samples;

  // What the run is called in reports: the ONNX file, the config file or the model's name.
  std::string label() const;
};

// Why a run stopped without a report. `input`: the spec, its files or its data cannot work (fix
// them and rerun); `over_budget`: the step cannot meet request.budget (`unmet` holds the plan that
// says how close it came); `run`: setting up or training failed (out of device memory, a
// non-finite loss, a file that could not be written).
// `interrupted`: a signal stopped the run cleanly after a step, its checkpoint saved
// (checkpoints.dir); running the same spec again resumes it.
struct TrainError {
  enum class Kind : std::uint8_t { input, over_budget, run, interrupted };
  Kind kind = Kind::input;
  std::string message;  // may span several lines (setup's out-of-memory advice)
  std::optional<planner::PlannedStep> unmet;  // over_budget
  int signal = 0;                             // interrupted: SIGTERM or SIGINT
};

// Checks what can be checked before anything is read or allocated, for a run of `world` ranks:
// sizes (the step representable at the asked batch, sequence and widths; the global batch
// dividing among the ranks), paths, and what several ranks support. `naming` says how sizes
// are named in messages (a CLI names its flags).
Status check_train_spec(const TrainSpec& spec, int world,
                        const planner::SizeNaming& naming = planner::quantity_naming());

// What a run tells its caller while it runs, on the reporting rank only (rank 0).
struct TrainStart {
  std::int64_t first_step = 0;  // steps a resumed checkpoint had done
  std::int64_t steps = 0;
  std::int64_t steps_per_epoch = 0;
  std::int64_t samples_per_step = 0;  // images, or tokens for text models
  bool text_model = false;
  std::string device;  // the device's name, with the CPU's thread count
};
struct TrainEvents {
  std::function<void(const std::string& line)> note;  // the device auto picked, a resume, a save
  std::function<void(const TrainStart&)> start;       // after setup, before the first step
  std::function<void(const runtime::StepReport&)> step;
};

struct RankMemory {
  int rank = 0;
  Bytes arena_bytes = 0;
  std::int64_t device_allocations_during_steps = 0;
};

struct TrainReport {
  // False on every rank but 0 of a several-rank run: rank 0's report speaks for the run; the
  // others hold their own figures and no evaluation.
  bool reporting = true;
  TrainSpec spec;  // as run: the defaults filled in (steps, the sequence of a config)
  std::string config_description;  // a config's one-line summary; empty otherwise
  std::string device;
  bool text_model = false;
  graph::Graph step;  // the training step as executed (after checkpointing)
  std::optional<planner::MemoryPlan> plan;  // planned mode
  std::optional<planner::CheckpointOutcome> checkpoint;
  planner::StepRewrites rewrites;  // what the step's graph went through (graph/fusions.h)
  runtime::TrainSummary summary;  // this process's steps: summary.first_step were done before
  // checkpoints.dir: the checkpoint resumed (empty: none), the saves this process committed,
  // and the host memory the largest snapshot took (outside the arena).
  std::string resumed_checkpoint;
  std::vector<SaveRecord> checkpoints_saved;
  Bytes checkpoint_snapshot_bytes = 0;
  double epochs = 0.0;           // passes over the training set the steps made
  double samples_per_s = 0.0;    // at the median step time; tokens for text models
  std::optional<Evaluation> test;               // image models: test accuracy and loss
  std::optional<TextEvaluation> validation;     // text models: validation loss
  double unigram_entropy = 0.0;                 // text models: the loss to read validation against
  // Text models: the model's vocabulary (--vocab, or else the text's characters), the distinct
  // characters the text holds, and the sequence length.
  std::int64_t vocab = 0, text_characters = 0, context = 0;
  std::string params_sha256;
  int world = 1;
  std::vector<RankMemory> ranks;  // world > 1: every rank's arena and allocations during steps
  std::int64_t device_allocations_during_steps = 0;
  Bytes device_bytes_at_setup = 0;
  int threads = 0;
  std::optional<runtime::StepProfile> profile;  // spec.profile
};

// The flags a checkpoint of `spec` on `world` ranks records and a resuming run must repeat:
// what changes the model, its data, the arithmetic or the schedule (CLI flag names).
RunIdentity run_identity(const TrainSpec& spec, int world);

// Runs `spec` on the ranks of `comm` (nullptr: dist::make_cpu_communicator, the ranks of mpirun
// or this process alone). Every rank calls it; rank 0's report speaks for the run.
Result<TrainReport, TrainError> run_training(const TrainSpec& spec, dist::Communicator* comm = nullptr,
                                             const TrainEvents& events = {},
                                             const planner::SizeNaming& naming = planner::quantity_naming());

}  // namespace memplan::train
