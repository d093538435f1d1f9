// A training run of a reference model on its real data, as `memplan train` runs it and a library
// user can: read the data (Fashion-MNIST or a text), complete the model from it (classes, image
// size, vocabulary), plan the step for the device through plan_step, set up the executor,
// resume from a saved run, train with the model's feeder, evaluate and save. The CLI parses
// flags and renders; everything it computes is here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/import/onnx_import.h"
#include "memplan/models/fashion_mnist.h"
#include "memplan/models/registry.h"
#include "memplan/models/text_dataset.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/trainer.h"
#include "memplan/runtime/weights.h"
#include "memplan/train/classifier.h"
#include "memplan/train/language_model.h"

namespace memplan::train {

// A classifier imported from an ONNX file (train --onnx): the model, how it is imported (loss,
// output), its initializers' values (the starting weights, by ONNX name) and what its graph
// calls its image input and labels.
struct OnnxRun {
  std::shared_ptr<const import::OnnxModel> model;
  import::ImportOptions options;  // loss and output; batch and training are set per build
  std::vector<std::pair<std::string, std::vector<float>>> initial;  // initializer name -> values
  std::set<std::string> constants;  // of those, buffers made from constants (not written back)
  ClassifierIo io;
};

// The data a reference model trains on, and the model completed from it.
struct RunData {
  models::ModelOptions model;
  std::optional<OnnxRun> onnx;  // set: the model is this imported graph, not `model`'s
  std::optional<models::ImageDataset> train_images, test_images;  // mlp, cnn
  std::optional<models::TextDataset> text;                         // gpt
  bool text_model() const { return text.has_value(); }
};

// Reads the data `model` trains on from `path` (empty: Debian's Fashion-MNIST, or the fortunes
// for the GPT) and completes the model from it. Errors name the file or the flag that cannot
// work (input errors).
//
// A Hugging Face config (model.config) trains as well: a decoder (gpt2, llama, mistral, qwen2)
// on the text, at byte level (the text's bytes replace the config's vocabulary: there is no
// tokenizer), model.zoo.seq characters per sequence (0: the config's positions, at most
// kDefaultConfigTrainSeq); a vit on Fashion-MNIST when it takes 1-channel images of the
// dataset's size. bert is refused (masked-LM training needs its tokenizer and masking).
//
// `vocab` > 0 (--vocab) sets a text model's vocabulary instead of the text's, which must not hold
// more distinct characters than that; 0 takes the text's.
Result<RunData> load_run_data(models::ModelOptions model, const std::string& path, std::int64_t batch,
                              std::int64_t vocab = 0);

inline constexpr std::int64_t kDefaultConfigTrainSeq = 256;
// The sequence a decoder config trains at: `asked` (--seq; learned positions cap it), or 0 for
// the config's positions up to kDefaultConfigTrainSeq.
Result<std::int64_t> config_train_seq(const models::HfConfig& config, std::int64_t asked);
inline constexpr const char* kTrainableConfigFamilies =
    "the decoders (gpt2 and the rotary decoders) and t5 (on text, at byte level) and vit (on Fashion-MNIST: "
    "num_channels 1, image_size 28)";

// The same for an ONNX classifier of Fashion-MNIST: `onnx_path` must take one float input of
// [B, 1, 28, 28] or [B, 784] and give [B, classes] logits (cross_entropy) or scores (mse, fed
// one-hot targets) with at least the dataset's classes. Errors name the file and what would work.
Result<RunData> load_onnx_run_data(const std::string& onnx_path, import::LossKind loss, const std::string& output,
                                   const std::string& data_path, std::int64_t batch);

struct SessionOptions {
  std::int64_t batch = 128;
  graph::OptimizerConfig optimizer;
  runtime::LrSchedule schedule;  // over the steps of each run() call
  std::uint64_t seed = 0;  // initialisation and shuffling
  // The working dtype: f32, or bf16/f16 for mixed precision (planner::StepDescription::dtype).
  graph::DType dtype = graph::DType::f32;
  // Optimizer offload (planner::StepDescription::offload_optimizer): the CPU device only.
  bool offload_optimizer = false;
  graph::FusedLoss fused_loss = graph::FusedLoss::auto_;  // planner::StepDescription::fused_loss
  graph::LoraConfig lora;  // planner::StepDescription::lora
  graph::QuantConfig quant;  // planner::StepDescription::quant
  // executor.communicator: the ranks of a data-parallel run; executor.tensor_communicator: those
  // of a tensor-parallel one (graph/tensor_parallel.h), the model's slice set in the data's model.
  runtime::ExecutorOptions executor;
  // Data parallel (graph/data_parallel.h): world, this process's rank, ZeRO stage, buckets,
  // prefetch; `batch` is then the global batch, each rank feeding its slice of it.
  graph::DataParallelConfig parallel;
  // Checkpoint strategy and arena budget; the device profile and guard bytes are set from the
  // device and executor.debug.guards.
  planner::PlanRequest request;
};

// Validation sequences the GPT and decoders evaluate by default, spread evenly over the split.
inline constexpr std::int64_t kDefaultEvalSequences = 1024;

struct SessionEvaluation {
  std::optional<Evaluation> classifier;  // image models: test accuracy and loss
  std::optional<TextEvaluation> text;    // the GPT: validation loss
};

class TrainingSession {
 public:
  // Plans the step for `device`; nothing is allocated yet. An Error is an input error (a model
  // option that cannot be built); a budget that cannot be met is planned().fits == false.
  static Result<std::unique_ptr<TrainingSession>> plan(RunData data, const SessionOptions& options,
                                                       runtime::Device& device);

  const RunData& data() const { return data_; }
  const planner::StepDescription& step() const { return step_; }
  const planner::PlanRequest& request() const { return request_; }
  const planner::PlannedStep& planned() const { return planned_; }
  runtime::Executor& executor() { return *executor_; }
  const runtime::Executor& executor() const { return *executor_; }

  // Allocates (the arena, in planned mode) and initialises the parameters from the seed.
  Status setup();
  // Loads the weights (and optimizer state) of a run saved by save(); the data continues after
  // the saved step.
  Result<runtime::LoadReport> resume(const std::string& path);
  // Loads a periodic checkpoint's shard (train/checkpoints.h): every persistent tensor this rank
  // holds, the step and the loss scaler, so run_until continues the run exactly.
  Status resume_checkpoint(const runtime::WeightsFile& shard, const std::string& source);

  std::int64_t steps_per_epoch() const;
  std::int64_t samples_per_step() const;  // images, or tokens for the GPT
  // Trains `steps` steps from where the run stands, feeding the model's data; the learning rate
  // follows options.schedule over these steps (check_lr_schedule first: an Error otherwise).
  Result<runtime::TrainSummary> run(std::int64_t steps, const runtime::ProgressFn& progress);
  // Trains from where the run stands to step `total` of a run of `total` steps: the data and the
  // schedule as the run that was never stopped would have them (a resumed checkpoint).
  // `after_step` as runtime::TrainLoop's.
  Result<runtime::TrainSummary> run_until(std::int64_t total, const runtime::ProgressFn& progress,
                                          std::function<Result<bool>(std::int64_t)> after_step);
  std::int64_t steps_done() const { return first_step_; }
  // Test accuracy (image models) or validation loss (the GPT), with a forward graph of its own
  // planned for a device of the training device's kind, without its memory limit (that limit is
  // for the training step).
  // `max_samples`: at most this many test images or validation sequences (default: every image,
  // kDefaultEvalSequences sequences).
  Result<SessionEvaluation> evaluate(std::optional<std::int64_t> max_samples = std::nullopt) const;
  // Under tensor or expert parallelism a collective (every rank calls it; the first writes): the
  // file holds the whole tensors, as one process's run would.
  Status save(const std::string& path) const;
  // The same with the LoRA adapters merged into their base weights (train/adapters.h: merge_adapters).
  Status save_merged(const std::string& path) const;
  // An ONNX run: a copy of the imported file with every initializer replaced by its trained
  // values (parameters and batch-norm statistics), written to `path` all or nothing.
  Status export_onnx(const std::string& path) const;

  // SHA-256 of every parameter's full bytes in the model's order: Executor::params_sha256 for a
  // single process, and the same digest of the gathered parameters when ZeRO-3 shards them (a
  // collective: every rank calls it), so runs at every stage compare; tensor- and expert-parallel
  // slices are gathered whole too.
  std::string params_sha256() const;

 private:
  // The whole tensor of a parameter split over tensor- or expert-parallel ranks from every rank's
  // `local` bytes (a collective over those ranks), cropped to the model's size: what one process holds.
  std::vector<std::byte> whole_of(const graph::TensorDesc& desc, std::span<const std::byte> local) const;

  TrainingSession(RunData data, const SessionOptions& options) : data_(std::move(data)), options_(options) {}

  RunData data_;
  SessionOptions options_;
  planner::StepDescription step_;
  planner::PlanRequest request_;
  planner::PlannedStep planned_;
  std::unique_ptr<runtime::Executor> executor_;  // runs planned_
  std::optional<BatchFeeder> image_feeder_;
  std::optional<TextFeeder> text_feeder_;
  std::int64_t first_step_ = 0;  // data continues where a resumed run stopped
};

}  // namespace memplan::train
