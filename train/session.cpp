#include "memplan/train/session.h"

#include "memplan/train/adapters.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <vector>

#include "memplan/common/atomic_file.h"
#include "memplan/common/sha256.h"
#include "memplan/dist/communicator.h"
#include "memplan/graph/tensor_parallel.h"
#include "memplan/import/onnx_source.h"
#include "memplan/kernels/half.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_source.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/weights.h"
#include "memplan/train/saved_run.h"

namespace memplan::train {

namespace {

// Configs trained on text: the decoders, and T5 (the encoder-decoder) continuing its source.
bool config_is_text(const models::HfConfig& c) {
  return c.family == models::HfFamily::gpt2 || c.family == models::HfFamily::llama || c.family == models::HfFamily::t5;
}

}  // namespace

Result<std::int64_t> config_train_seq(const models::HfConfig& c, std::int64_t asked) {
  const std::int64_t seq = asked > 0 ? asked : std::min(c.positions, kDefaultConfigTrainSeq);
  if (asked > 0 && c.learned_positions && asked > c.positions) {
    return Error{"--seq " + std::to_string(asked) + " is longer than the config's " + std::to_string(c.positions) +
                 " learned positions"};
  }
  return seq;
}

Result<RunData> load_run_data(models::ModelOptions model, const std::string& path, std::int64_t batch,
                              std::int64_t vocab) {
  RunData out;
  if (model.config && model.config->family == models::HfFamily::bert) {
    return Error{"--config " + model.name + " is a bert (masked language model): training it needs its tokenizer and "
                 "masking, which memplan does not have. train --config takes " + std::string(kTrainableConfigFamilies) +
                 "; fit, plan and compare take every family"};
  }
  if (model.name == "gpt" || (model.config && config_is_text(*model.config))) {
    if (model.config) {
      auto seq = config_train_seq(*model.config, model.zoo.seq);
      if (!seq) return seq.error();
      model.zoo.seq = seq.value();
      model.gpt.context = seq.value();  // the feeders and the evaluation read the context here
      // An encoder-decoder's target: --target-seq, else as long as its source.
      if (model.config->encoder_decoder() && model.zoo.target_seq <= 0) model.zoo.target_seq = seq.value();
    }
    const std::string source = path.empty() ? models::kFortunesDefaultDir : path;
    auto raw = models::read_text(source);
    if (!raw) return raw.error();
    auto data = models::make_text_dataset(raw.value(), model.gpt.context + text_target(model) + 1);
    if (!data) return Error{source + ": " + data.error().message + " (a shorter --seq may work)"};
    out.text = std::move(data).value();
    const std::int64_t found = out.text->vocab_size();
    if (vocab > 0 && found > vocab) {
      return Error{source + " holds " + std::to_string(found) + " distinct characters, more than --vocab " +
                   std::to_string(vocab) + ": use --vocab " + std::to_string(found) +
                   " or more, or leave it out to take the text's vocabulary"};
    }
    model.gpt.vocab = vocab > 0 ? vocab : found;  // ids past the text's characters are never fed
    if (model.config) {
      // No tokenizer: the text's bytes are the vocabulary, in place of the config's tokens.
      if (model.config->family == models::HfFamily::gpt2) model.config->gpt.vocab = model.gpt.vocab;
      else if (model.config->family == models::HfFamily::t5) model.config->t5.vocab = model.gpt.vocab;
      else model.config->llama.vocab = model.gpt.vocab;
    }
  } else {
    if (vocab > 0) return Error{"--vocab applies to text models (gpt and decoder configs), not " + model.name};
    const std::string source = path.empty() ? models::kFashionMnistDefaultDir : path;
    auto train_data = models::load_fashion_mnist(source, models::Split::train);
    if (!train_data) return train_data.error();
    auto test_data = models::load_fashion_mnist(source, models::Split::test);
    if (!test_data) return test_data.error();
    if (batch > train_data.value().count) {
      return Error{"--batch " + std::to_string(batch) + " is larger than the training set (" +
                   std::to_string(train_data.value().count) + " images)"};
    }
    out.train_images = std::move(train_data).value();
    out.test_images = std::move(test_data).value();
    if (model.config) {
      // A ViT takes the images as they are: one channel, the dataset's size, its classes.
      const models::VitConfig& v = model.config->vit;
      const std::int64_t image = model.zoo.image_size > 0 ? model.zoo.image_size : model.config->image_size;
      const std::int64_t rows = out.train_images->rows;
      if (v.channels != 1 || image != rows || out.train_images->cols != rows) {
        return Error{"--config " + model.name + " is a vit of " + std::to_string(v.channels) + "-channel " +
                     std::to_string(image) + "x" + std::to_string(image) + " images, but " + source + " holds 1-channel " +
                     std::to_string(rows) + "x" + std::to_string(out.train_images->cols) +
                     " images: set num_channels 1 and image_size " + std::to_string(rows) +
                     " (with a patch_size that divides it) in the config"};
      }
      if (v.classes < out.train_images->classes) {
        return Error{"--config " + model.name + " has num_labels " + std::to_string(v.classes) + ", fewer than the " +
                     std::to_string(out.train_images->classes) + " classes of " + source};
      }
      model.zoo.image_size = image;
    }
    model.mlp.inputs = out.train_images->features();
    model.mlp.classes = out.train_images->classes;
    model.cnn.image = out.train_images->rows;  // square images, one channel
    model.cnn.classes = out.train_images->classes;
  }
  out.model = std::move(model);
  return out;
}

Result<RunData> load_onnx_run_data(const std::string& onnx_path, import::LossKind loss, const std::string& output,
                                   const std::string& data_path, std::int64_t batch) {
  auto model = import::OnnxModel::load(onnx_path);
  if (!model) return model.error();
  OnnxRun run;
  run.model = std::move(model).value();
  run.options.loss = loss;
  run.options.output = output;
  import::ImportedGraph imported;
  try {
    import::ImportOptions at = run.options;
    at.batch = 1;
    at.keep_values = true;
    imported = run.model->build(at);
  } catch (const graph::GraphError& e) {
    const std::string what = e.what();  // messages about the whole file name it already
    return Error{what.starts_with(onnx_path) ? what : onnx_path + ": " + what};
  }
  // The file is checked before the data is read.
  const graph::Graph& g = imported.graph;
  constexpr std::int64_t kSide = 28;  // Fashion-MNIST: 28 x 28, one channel
  if (imported.inputs.size() != 1) {
    return Error{onnx_path + ": the model takes " + std::to_string(imported.inputs.size()) +
                 " inputs; train --onnx feeds one, Fashion-MNIST images of [B, C, H, W] or [B, 784]"};
  }
  const graph::TensorDesc& input = g.tensor(imported.inputs.front());
  const graph::Shape& in = input.shape;
  const bool flat = in == graph::Shape{1, kSide * kSide};
  const bool image = in.rank() == 4 && in[0] == 1 && in[1] >= 1 && in[2] >= 1 && in[3] >= 1;
  if ((!flat && !image) || input.dtype != graph::DType::f32) {
    return Error{onnx_path + ": the input '" + input.name + "' is " + std::string(graph::dtype_name(input.dtype)) + " " +
                 in.to_string() + " at batch 1; train --onnx feeds Fashion-MNIST: float images [B, C, H, W] (resampled "
                 "and repeated over the channels when not [B, 1, 28, 28]) or [B, 784]"};
  }
  // A model made for other images (torchvision's: 3 channels, 224 x 224) takes the gray images as
  // torchvision's Grayscale(C) and Resize((H, W)) would give them.
  if (image && in != graph::Shape{1, 1, kSide, kSide}) {
    run.io.channels = in[1];
    run.io.height = in[2];
    run.io.width = in[3];
  }
  const graph::TensorDesc& out = g.tensor(g.output);
  constexpr std::int64_t kClasses = 10;
  const bool mse = loss == import::LossKind::mse;
  if (out.shape.rank() != 2 || (mse ? out.shape[1] != kClasses : out.shape[1] < kClasses)) {
    return Error{onnx_path + ": the output '" + out.name + "' is " + out.shape.to_string() + " at batch 1; train --onnx " +
                 (mse ? "with --loss mse needs [B, 10] (scores against one-hot targets of the 10 classes)"
                      : "needs logits [B, C] with C >= 10 (the Fashion-MNIST classes)") +
                 " (--output picks another graph output)"};
  }
  run.io.input = input.name;
  run.io.labels = g.tensor(imported.labels).name;
  run.io.one_hot = mse;
  run.io.classes = out.shape[1];
  for (auto& [id, values] : imported.initial_values) run.initial.emplace_back(g.tensor(id).name, std::move(values));
  for (TensorId id : imported.constant_buffers) run.constants.insert(g.tensor(id).name);
  models::ModelOptions named;
  named.name = "onnx:" + std::filesystem::path(onnx_path).filename().string();
  auto data = load_run_data(std::move(named), data_path, batch);
  if (!data) return data.error();
  const models::ImageDataset& images = *data.value().train_images;
  if (images.rows != kSide || images.cols != kSide || images.classes > kClasses) {
    return Error{"the training images are " + std::to_string(images.rows) + " x " + std::to_string(images.cols) +
                 " with " + std::to_string(images.classes) + " classes; train --onnx expects Fashion-MNIST's 28 x 28 and 10"};
  }
  data.value().onnx = std::move(run);
  return data;
}

Result<std::unique_ptr<TrainingSession>> TrainingSession::plan(RunData data, const SessionOptions& options,
                                                               runtime::Device& device) {
  std::unique_ptr<TrainingSession> s(new TrainingSession(std::move(data), options));
  // One plan for every mode: planned runs at its offsets; naive and dynamic follow its schedule
  // and lifetimes. It is made for this device (its workspace inside the arena, guard gaps when
  // guards are checked), so the arena checked against a budget is the arena allocated.
  // An imported forward graph takes the registry model's place; plan_step turns either into the
  // training step (backward, optimizer, checkpointing, data parallel).
  graph::ModelSource source = s->data_.onnx ? import::onnx_source(s->data_.onnx->model, s->data_.onnx->options)
                                            : models::registry_source(s->data_.model);
  s->step_ = planner::StepDescription::of_source(std::move(source), options.batch, options.optimizer);
  s->step_.parallel = options.parallel;
  s->step_.dtype = options.dtype;
  s->step_.offload_optimizer = options.offload_optimizer;
  s->step_.fused_loss = options.fused_loss;
  s->step_.lora = options.lora;
  s->step_.quant = options.quant;
  if (options.offload_optimizer && device.kind() != kernels::DeviceKind::cpu) {
    return Error{"--offload-optimizer keeps optimizer state in host memory and updates it there, which memplan trains "
                 "on the CPU device only: add --device cpu (fit and plan answer for " + device.name() + ")"};
  }
  s->request_ = options.request;
  s->request_.device = runtime::device_profile(device);
  s->request_.guard_bytes = options.executor.debug.guards ? runtime::kGuardBytes : 0;
  auto planned = planner::plan_step(s->step_, s->request_);
  if (!planned) return planned.error();
  s->planned_ = std::move(planned).value();
  // A dtype this device has no kernel for is refused now, before any allocation or data.
  if (Status k = kernels::check_kernels_for(s->planned_.graph, device.kind()); !k) return k.error();
  if (s->planned_.fits) s->executor_ = std::make_unique<runtime::Executor>(s->planned_, device, options.executor);
  if (s->data_.text) {
    s->text_feeder_.emplace(*s->data_.text, options.batch, s->data_.model.gpt.context, options.seed,
                            text_target(s->data_.model));
    s->text_feeder_->shard(options.parallel.rank, options.parallel.world);
  } else {
    s->image_feeder_.emplace(*s->data_.train_images, options.batch, options.seed,
                             s->data_.onnx ? s->data_.onnx->io : ClassifierIo{});
    s->image_feeder_->shard(options.parallel.rank, options.parallel.world);
  }
  return s;
}

Status TrainingSession::setup() {
  MEMPLAN_CHECK(executor_ != nullptr, "setup() of a step that does not fit its budget");
  if (Status s = executor_->setup(); !s) return s;
  executor_->initialize_persistent(options_.seed);
  if (!data_.onnx) return Status::success();
  // An imported model starts from its initializers' values: every persistent tensor named after
  // one (a rank's shard holds its range of it).
  std::map<std::string, const std::vector<float>*> initial;
  for (const auto& [name, values] : data_.onnx->initial) initial.emplace(name, &values);
  const graph::Graph& g = executor_->graph();
  std::vector<float> shard;
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const graph::TensorDesc& desc = g.tensor(id);
    if (!graph::is_persistent(desc.role) || executor_->storage(id) == nullptr) continue;
    const std::string& name = desc.shard_of == kNoTensor ? desc.name : g.tensor(desc.shard_of).name;
    auto it = initial.find(name);
    if (it == initial.end()) continue;
    const std::vector<float>& values = *it->second;
    // f32 weights, or the i32 indices the import made for a Gather (a buffer, never sharded).
    const bool indices = desc.dtype == graph::DType::i32;
    if (desc.dtype != graph::DType::f32 && !indices) return Error{"'" + name + "' is not f32 in the step; ONNX weights load into f32 tensors"};
    if (desc.shard_of == kNoTensor) {
      MEMPLAN_CHECK(static_cast<std::int64_t>(values.size()) == desc.shape.numel(), "initializer '" << name << "' size");
      executor_->write_values(id, values.data());
    } else {
      MEMPLAN_CHECK(!indices, "indices '" << name << "' sharded");
      shard.assign(static_cast<std::size_t>(desc.shape.numel()), 0.0f);
      std::copy_n(values.begin() + desc.shard_offset, desc.shard_count, shard.begin());
      executor_->write_tensor(id, shard.data());
    }
  }
  return Status::success();
}

Result<runtime::LoadReport> TrainingSession::resume(const std::string& path) {
  auto loaded = load_run(*executor_, path);
  if (!loaded) return loaded.error();
  first_step_ = loaded.value().step;
  return loaded;
}

Status TrainingSession::resume_checkpoint(const runtime::WeightsFile& shard, const std::string& source) {
  auto loaded = runtime::load_weights(*executor_, shard, source, /*frozen_from_seed=*/true);
  if (!loaded) return loaded.error();
  if (!loaded.value().fresh_state.empty() || !loaded.value().converted.empty()) {
    return Error{source + ": does not hold this run's state as it is (" +
                 (loaded.value().fresh_state.empty() ? loaded.value().converted.front() + " converted"
                                                     : loaded.value().fresh_state.front() + " missing") +
                 "); give another --save-dir to start afresh"};
  }
  first_step_ = loaded.value().step;
  return Status::success();
}

std::int64_t TrainingSession::steps_per_epoch() const {
  return text_feeder_ ? text_feeder_->steps_per_epoch() : image_feeder_->steps_per_epoch();
}

std::int64_t TrainingSession::samples_per_step() const {
  return data_.text ? options_.batch * (data_.model.gpt.context + text_target(data_.model)) : options_.batch;
}

Result<runtime::TrainSummary> TrainingSession::run(std::int64_t steps, const runtime::ProgressFn& progress) {
  if (Status s = runtime::check_lr_schedule(options_.schedule, steps); !s) return s.error();
  const std::int64_t first = first_step_;
  auto summary = runtime::train(
      *executor_, steps,
      [&](std::int64_t i, runtime::Executor& e) {
        if (text_feeder_) {
          text_feeder_->feed(first + i, e);
        } else {
          image_feeder_->feed(first + i, e);
        }
      },
      progress, options_.schedule);
  if (summary) first_step_ = first + summary.value().steps;
  return summary;
}

Result<runtime::TrainSummary> TrainingSession::run_until(std::int64_t total, const runtime::ProgressFn& progress,
                                                          std::function<Result<bool>(std::int64_t)> after_step) {
  if (Status s = runtime::check_lr_schedule(options_.schedule, total); !s) return s.error();
  runtime::TrainLoop loop{std::min(first_step_, total), total, options_.schedule, std::move(after_step)};
  auto summary = runtime::train(
      *executor_, loop,
      [&](std::int64_t i, runtime::Executor& e) {
        if (text_feeder_) {
          text_feeder_->feed(i, e);
        } else {
          image_feeder_->feed(i, e);
        }
      },
      progress);
  if (summary) first_step_ = loop.first + summary.value().steps;
  return summary;
}

Result<SessionEvaluation> TrainingSession::evaluate(std::optional<std::int64_t> max_samples) const {
  // The evaluation graph reads the trained tensors where they are (on the GPU after a CUDA run),
  // so it runs on a device of the same kind, without the training device's memory cap.
  auto made = runtime::make_device(executor_->device_kind());
  if (!made) return made.error();
  runtime::Device& eval_device = *made.value();
  SessionEvaluation out;
  if (data_.text) {
    auto r = evaluate_language_model(data_.model, *executor_, data_.text->val, eval_device,
                                     max_samples.value_or(kDefaultEvalSequences), step_.lora, step_.quant);
    if (!r) return r.error();
    out.text = r.value();
  } else {
    const std::int64_t max_images = max_samples.value_or(std::numeric_limits<std::int64_t>::max());
    auto r = data_.onnx ? evaluate_classifier(
                              [run = &*data_.onnx](std::int64_t batch) {
                                import::ImportOptions eval = run->options;
                                eval.training = false;  // the forward graph as it is, no training step
                                return planner::StepDescription::of_source(import::onnx_source(run->model, eval), batch);
                              },
                              data_.onnx->io, *executor_, *data_.test_images, eval_device, max_images)
                        : evaluate_classifier(data_.model, *executor_, *data_.test_images, eval_device, max_images,
                                              step_.lora, step_.quant);
    if (!r) return r.error();
    out.classifier = r.value();
  }
  return out;
}

namespace {

}  // namespace

std::vector<std::byte> TrainingSession::whole_of(const graph::TensorDesc& desc, std::span<const std::byte> local) const {
  const Bytes es = graph::dtype_size(desc.dtype);
  MEMPLAN_CHECK(es == 2 || es == 4, "'" << desc.name << "' is a slice of " << es << "-byte elements");
  const dist::ElementType type = es == 2 ? dist::ElementType::u16 : dist::ElementType::f32;  // moved, never summed
  // Every rank's part, in rank order, from the tensor-parallel group or the expert-parallel one.
  auto gather = [&](std::span<const std::byte> part, int parts) {
    dist::Communicator* c = parts > 0 ? options_.executor.tensor_communicator : options_.executor.expert_communicator;
    MEMPLAN_CHECK(c != nullptr, "'" << desc.name << "' is split over " << (parts > 0 ? "tensor" : "expert")
                                    << "-parallel ranks, but the session has no communicator for them");
    const auto n = static_cast<std::size_t>(parts > 0 ? parts : -parts);
    std::vector<std::byte> all(part.size() * n);
    c->all_gather_shards(part.data(), all.data(), static_cast<std::int64_t>(part.size() * n) / es, type);
    return all;
  };
  return graph::gather_whole(desc, local, gather);
}

std::string TrainingSession::params_sha256() const {
  const graph::Graph& g = executor_->graph();
  bool sharded = false, sliced = false;
  for (TensorId p : g.parameters()) {
    sharded = sharded || g.tensor(p).shard_of != kNoTensor;
    sliced = sliced || g.tensor(p).tp_axis >= 0 || g.tensor(p).ep_parts > 1;
  }
  if (!sharded && !sliced) return executor_->params_sha256();
  dist::Communicator* comm = options_.executor.communicator;
  MEMPLAN_CHECK(!sharded || comm != nullptr, "sharded parameters without a communicator");
  Sha256 hash;
  std::vector<float> shard, full;
  std::vector<std::byte> bytes;
  for (TensorId p : g.parameters()) {
    const graph::TensorDesc& desc = g.tensor(p);
    if (executor_->storage(p) == nullptr) continue;
    shard.resize(static_cast<std::size_t>(desc.shape.numel()));
    executor_->read_values(p, shard.data());  // 16-bit values widened exactly, gathered as f32
    const graph::TensorDesc& local = desc.shard_of == kNoTensor ? desc : g.tensor(desc.shard_of);
    const std::int64_t numel = local.shape.numel();
    full.resize(static_cast<std::size_t>(numel));
    if (desc.shard_of == kNoTensor) {
      full = shard;
    } else {
      // An expert's weights are sharded over the ranks holding the same experts.
      dist::Communicator* shards = local.ep_parts > 1 ? options_.executor.expert_data_communicator : comm;
      MEMPLAN_CHECK(shards != nullptr, "expert shards without a communicator");
      shards->all_gather_shards(shard.data(), full.data(), numel, dist::ElementType::f32);
    }
    // The digest is over the parameter's bytes at its own dtype, as Executor::params_sha256's,
    // over the whole tensor of a tensor-parallel slice (as one process holds it).
    bytes.resize(static_cast<std::size_t>(numel * graph::dtype_size(desc.dtype)));
    kernels::narrow_from_f32(desc.dtype, full.data(), bytes.data(), numel);
    if (local.tp_axis >= 0 || local.ep_parts > 1) bytes = whole_of(local, bytes);
    hash.update(bytes);
  }
  return hash.finish_hex();
}

Status TrainingSession::save_merged(const std::string& path) const {
  if (options_.executor.tensor_communicator != nullptr) return Error{"--merge-lora under --tensor-parallel is not supported"};
  if (options_.executor.expert_communicator != nullptr) return Error{"--merge-lora under --expert-parallel is not supported"};
  runtime::WeightsSnapshot snapshot = runtime::snapshot_weights(
      *executor_, run_metadata(data_.model, graph::optimizer_name(options_.optimizer.kind), data_.text ? &*data_.text : nullptr));
  if (Status s = merge_adapters(snapshot, step_.lora); !s) return s;
  return runtime::write_weights(snapshot, path);
}

Status TrainingSession::save(const std::string& path) const {
  if (data_.text && data_.model.gpt.vocab != data_.text->vocab_size()) {
    // A saved GPT maps each token id to a character of its text (sample reads them back).
    return Error{"a model whose vocabulary (" + std::to_string(data_.model.gpt.vocab) + ", --vocab) differs from its text's " +
                 std::to_string(data_.text->vocab_size()) + " characters cannot be saved for sampling; leave out --vocab"};
  }
  if (options_.executor.tensor_communicator == nullptr && options_.executor.expert_communicator == nullptr) {
    return save_run(*executor_, path, data_.model, graph::optimizer_name(options_.optimizer.kind),
                    data_.text ? &*data_.text : nullptr);
  }
  // Tensor or expert parallel: every rank sends its slices, the first rank writes the whole
  // tensors, so the file is the one a single process would write (and loads, samples and trains
  // as it).
  const graph::Graph& g = executor_->graph();
  runtime::WeightsSnapshot snapshot = runtime::snapshot_weights(
      *executor_, run_metadata(data_.model, graph::optimizer_name(options_.optimizer.kind), data_.text ? &*data_.text : nullptr));
  std::string data;
  for (runtime::WeightsSnapshot::Tensor& t : snapshot.tensors) {
    const std::string_view bytes = std::string_view(snapshot.data).substr(t.offset, t.bytes);
    const graph::TensorDesc& desc = g.tensor(g.find(t.name));
    t.offset = data.size();
    if (desc.tp_axis < 0 && desc.ep_parts <= 1) {
      data.append(bytes);
      continue;
    }
    const std::vector<std::byte> whole = whole_of(desc, std::as_bytes(std::span<const char>(bytes)));
    t.shape = graph::whole_shape(desc).dims;
    t.bytes = whole.size();
    data.append(reinterpret_cast<const char*>(whole.data()), whole.size());
  }
  // One writer: the first slice of the first replica (each replica's group gathers alike).
  const dist::Communicator* tensor_group = options_.executor.tensor_communicator;
  const dist::Communicator* replicas = options_.executor.communicator;
  if ((tensor_group != nullptr && tensor_group->rank() != 0) || (replicas != nullptr && replicas->rank() != 0)) {
    return Status::success();
  }
  snapshot.data = std::move(data);
  return runtime::write_weights(snapshot, path);
}

Status TrainingSession::export_onnx(const std::string& path) const {
  MEMPLAN_CHECK(data_.onnx.has_value(), "export_onnx of a model not imported from ONNX");
  const graph::Graph& g = executor_->graph();
  std::vector<std::pair<std::string, std::vector<float>>> trained;
  for (const auto& [name, initial] : data_.onnx->initial) {
    if (data_.onnx->constants.count(name) > 0) continue;  // the graph's constants, not the file's initializers
    const TensorId id = g.find(name);
    if (id == kNoTensor || executor_->storage(id) == nullptr || g.tensor(id).shard_of != kNoTensor) {
      return Error{"'" + name + "' is not held whole by this process (sharded parameters are not exported)"};
    }
    std::vector<float> values(initial.size());
    executor_->read_tensor(id, values.data());
    trained.emplace_back(name, std::move(values));
  }
  auto bytes = data_.onnx->model->with_initializers(trained);
  if (!bytes) return bytes.error();
  return write_file_atomically(path, bytes.value());
}

}  // namespace memplan::train
