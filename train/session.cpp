#include "memplan/train/session.h"

#include <span>
#include <vector>

#include "memplan/common/sha256.h"
#include "memplan/dist/communicator.h"
#include "memplan/runtime/devices.h"
#include "memplan/train/saved_run.h"

namespace memplan::train {

Result<RunData> load_run_data(models::ModelOptions model, const std::string& path, std::int64_t batch) {
  RunData out;
  if (model.name == "gpt") {
    const std::string source = path.empty() ? models::kFortunesDefaultDir : path;
    auto raw = models::read_text(source);
    if (!raw) return raw.error();
    auto data = models::make_text_dataset(raw.value(), model.gpt.context + 1);
    if (!data) return Error{source + ": " + data.error().message + " (a shorter --seq may work)"};
    out.text = std::move(data).value();
    model.gpt.vocab = out.text->vocab_size();
  } else {
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
    model.mlp.inputs = out.train_images->features();
    model.mlp.classes = out.train_images->classes;
    model.cnn.image = out.train_images->rows;  // square images, one channel
    model.cnn.classes = out.train_images->classes;
  }
  out.model = std::move(model);
  return out;
}

Result<std::unique_ptr<TrainingSession>> TrainingSession::plan(RunData data, const SessionOptions& options,
                                                               runtime::Device& device) {
  std::unique_ptr<TrainingSession> s(new TrainingSession(std::move(data), options));
  // One plan for every mode: planned runs at its offsets; naive and dynamic follow its schedule
  // and lifetimes. It is made for this device (its workspace inside the arena, guard gaps when
  // guards are checked), so the arena checked against a budget is the arena allocated.
  s->step_ = planner::StepDescription::of_model(s->data_.model, options.batch, options.optimizer);
  s->step_.parallel = options.parallel;
  s->request_ = options.request;
  s->request_.device = runtime::device_profile(device);
  s->request_.guard_bytes = options.executor.debug.guards ? runtime::kGuardBytes : 0;
  auto planned = planner::plan_step(s->step_, s->request_);
  if (!planned) return planned.error();
  s->planned_ = std::move(planned).value();
  if (s->planned_.fits) s->executor_ = std::make_unique<runtime::Executor>(s->planned_, device, options.executor);
  if (s->data_.text) {
    s->text_feeder_.emplace(*s->data_.text, options.batch, s->data_.model.gpt.context, options.seed);
    s->text_feeder_->shard(options.parallel.rank, options.parallel.world);
  } else {
    s->image_feeder_.emplace(*s->data_.train_images, options.batch, options.seed);
    s->image_feeder_->shard(options.parallel.rank, options.parallel.world);
  }
  return s;
}

Status TrainingSession::setup() {
  MEMPLAN_CHECK(executor_ != nullptr, "setup() of a step that does not fit its budget");
  if (Status s = executor_->setup(); !s) return s;
  executor_->initialize_persistent(options_.seed);
  return Status::success();
}

Result<runtime::LoadReport> TrainingSession::resume(const std::string& path) {
  auto loaded = load_run(*executor_, path);
  if (!loaded) return loaded.error();
  first_step_ = loaded.value().step;
  return loaded;
}

std::int64_t TrainingSession::steps_per_epoch() const {
  return text_feeder_ ? text_feeder_->steps_per_epoch() : image_feeder_->steps_per_epoch();
}

std::int64_t TrainingSession::samples_per_step() const {
  return data_.text ? options_.batch * data_.model.gpt.context : options_.batch;
}

Result<runtime::TrainSummary> TrainingSession::run(std::int64_t steps, const runtime::ProgressFn& progress) {
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
      progress);
  if (summary) first_step_ = first + summary.value().steps;
  return summary;
}

Result<SessionEvaluation> TrainingSession::evaluate() const {
  runtime::CpuDevice eval_device;
  SessionEvaluation out;
  if (data_.text) {
    auto r = evaluate_language_model(data_.model, *executor_, data_.text->val, eval_device, /*max_windows=*/1024);
    if (!r) return r.error();
    out.text = r.value();
  } else {
    auto r = evaluate_classifier(data_.model, *executor_, *data_.test_images, eval_device);
    if (!r) return r.error();
    out.classifier = r.value();
  }
  return out;
}

std::string TrainingSession::params_sha256() const {
  const graph::Graph& g = executor_->graph();
  bool sharded = false;
  for (TensorId p : g.parameters()) sharded = sharded || g.tensor(p).shard_of != kNoTensor;
  if (!sharded) return executor_->params_sha256();
  dist::Communicator* comm = options_.executor.communicator;
  MEMPLAN_CHECK(comm != nullptr, "sharded parameters without a communicator");
  Sha256 hash;
  std::vector<float> shard, full;
  for (TensorId p : g.parameters()) {
    const graph::TensorDesc& desc = g.tensor(p);
    if (executor_->storage(p) == nullptr) continue;
    shard.resize(static_cast<std::size_t>(desc.shape.numel()));
    executor_->read_tensor(p, shard.data());
    const std::int64_t numel = desc.shard_of == kNoTensor ? desc.shape.numel() : g.tensor(desc.shard_of).shape.numel();
    full.resize(static_cast<std::size_t>(numel));
    if (desc.shard_of == kNoTensor) {
      full = shard;
    } else {
      comm->all_gather_shards(shard.data(), full.data(), numel, dist::ElementType::f32);
    }
    hash.update(std::as_bytes(std::span<const float>(full)));
  }
  return hash.finish_hex();
}

Status TrainingSession::save(const std::string& path) const {
  return save_run(*executor_, path, data_.model, graph::optimizer_name(options_.optimizer.kind),
                  data_.text ? &*data_.text : nullptr);
}

}  // namespace memplan::train
