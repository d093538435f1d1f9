#include "memplan/train/classifier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "memplan/common/rng.h"
#include "memplan/models/model_source.h"
#include "memplan/runtime/devices.h"

namespace memplan::train {

std::vector<float> one_hot_rows(const std::int32_t* labels, std::int64_t count, std::int64_t classes) {
  std::vector<float> rows(static_cast<std::size_t>(count * classes), 0.0f);
  for (std::int64_t i = 0; i < count; ++i) {
    if (labels[i] >= 0 && labels[i] < classes) rows[static_cast<std::size_t>(i * classes + labels[i])] = 1.0f;
  }
  return rows;
}

void stage_images(const models::ImageDataset& data, std::span<const std::int64_t> items, const ClassifierIo& io,
                  std::vector<float>& out) {
  const std::int64_t in = data.features(), fed = io.features(data);
  out.resize(items.size() * static_cast<std::size_t>(fed));
  for (std::size_t i = 0; i < items.size(); ++i) {
    const float* image = &data.images[static_cast<std::size_t>(items[i] * in)];
    float* slot = &out[i * static_cast<std::size_t>(fed)];
    if (io.resamples()) {
      models::resample_gray(image, data.rows, data.cols, io.channels, io.height, io.width, slot);
    } else {
      std::memcpy(slot, image, static_cast<std::size_t>(in) * sizeof(float));
    }
  }
}

BatchFeeder::BatchFeeder(const models::ImageDataset& data, std::int64_t batch, std::uint64_t seed, ClassifierIo io)
    : data_(data), batch_(batch), seed_(seed), io_(std::move(io)) {
  order_.resize(static_cast<std::size_t>(data.count));
  y_.resize(static_cast<std::size_t>(batch));
}

void BatchFeeder::shuffle_for_epoch(std::int64_t epoch) {
  for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<std::int64_t>(i);
  Rng rng(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch) + 1);
  for (std::size_t i = order_.size(); i > 1; --i) {
    std::swap(order_[i - 1], order_[rng.below(i)]);
  }
  epoch_ = epoch;
}

void BatchFeeder::feed(std::int64_t step_index, runtime::Executor& executor) {
  const std::int64_t epoch = step_index / steps_per_epoch();
  if (epoch != epoch_) shuffle_for_epoch(epoch);
  const std::int64_t first = (step_index % steps_per_epoch()) * batch_;
  const std::int64_t features = io_.features(data_);
  for (std::int64_t i = 0; i < batch_; ++i) {
    y_[static_cast<std::size_t>(i)] = data_.labels[static_cast<std::size_t>(order_[static_cast<std::size_t>(first + i)])];
  }
  const graph::Graph& g = executor.graph();
  const std::int64_t rows = batch_ / world_, first_row = rows * rank_;
  // This rank's rows only: resampling the whole global batch on every rank would repeat the work.
  stage_images(data_, std::span<const std::int64_t>(order_).subspan(static_cast<std::size_t>(first + first_row),
                                                                   static_cast<std::size_t>(rows)),
               io_, x_);
  // Images (and one-hot targets) in the graph's dtype: rounded once here under mixed precision.
  executor.set_input_values(g.find(io_.input), std::span<const float>(x_.data(), static_cast<std::size_t>(rows * features)));
  if (io_.one_hot) {
    one_hot_ = one_hot_rows(y_.data() + first_row, rows, io_.classes);
    executor.set_input_values(g.find(io_.labels), one_hot_);
  } else {
    executor.set_input(g.find(io_.labels), y_.data() + first_row, static_cast<Bytes>(rows) * sizeof(std::int32_t));
  }
}

graph::DType working_dtype(const graph::Graph& graph) {
  const std::vector<TensorId> params = graph.parameters();
  return params.empty() ? graph::DType::f32 : graph.tensor(params.front()).dtype;
}

namespace {

// Evaluates items [first, first + batch) with a forward graph of exactly that batch.
Status evaluate_range(const std::function<planner::StepDescription(std::int64_t)>& eval_step, const ClassifierIo& io,
                      const runtime::Executor& trained, const models::ImageDataset& data, runtime::Device& device,
                      std::int64_t batch, std::int64_t first, std::int64_t count, std::int64_t& correct,
                      double& loss_sum) {
  planner::StepDescription step = eval_step(batch);
  step.dtype = working_dtype(trained.graph());  // the trained tensors' dtype, read in place
  auto planned = runtime::plan_step_for(step, device);
  if (!planned) return planned.error();
  const graph::Graph& g = planned.value().graph;
  runtime::Executor exec(planned.value(), device, runtime::ExecutorOptions{trained.mode()});
  // Parameters and non-parameter state (batch-norm running statistics) come from training.
  for (TensorId p = 0; p < g.num_tensors(); ++p) {
    if (!graph::is_persistent(g.tensor(p).role)) continue;
    const TensorId trained_id = trained.graph().find(g.tensor(p).name);
    MEMPLAN_CHECK(trained_id != kNoTensor, "tensor '" << g.tensor(p).name << "' not in the trained graph");
    exec.bind_external(p, trained.storage(trained_id));
  }
  if (Status s = exec.setup(); !s) return s;
  const std::int64_t classes = g.tensor(g.output).shape[1];
  std::vector<float> logits(static_cast<std::size_t>(batch * classes)), images;
  std::vector<std::int64_t> items(static_cast<std::size_t>(batch));
  for (std::int64_t start = first; start < first + count; start += batch) {
    for (std::int64_t i = 0; i < batch; ++i) items[static_cast<std::size_t>(i)] = start + i;
    stage_images(data, items, io, images);
    exec.set_input_values(g.find(io.input), images);
    if (io.one_hot) {
      const std::vector<float> target = one_hot_rows(&data.labels[static_cast<std::size_t>(start)], batch, io.classes);
      exec.set_input_values(g.find(io.labels), target);
    } else {
      exec.set_input(g.find(io.labels), &data.labels[static_cast<std::size_t>(start)],
                     batch * static_cast<Bytes>(sizeof(std::int32_t)));
    }
    if (Status s = exec.run_step(); !s) return s;
    exec.read_values(g.output, logits.data());
    loss_sum += double(exec.read_scalar(g.loss)) * double(batch);
    for (std::int64_t i = 0; i < batch; ++i) {
      const float* row = &logits[static_cast<std::size_t>(i * classes)];
      const auto predicted = std::max_element(row, row + classes) - row;
      if (predicted == data.labels[static_cast<std::size_t>(start + i)]) ++correct;
    }
  }
  return Status::success();
}

}  // namespace

Result<Evaluation> evaluate_classifier(const models::ModelOptions& model,
                                       const runtime::Executor& trained,
                                       const models::ImageDataset& data, runtime::Device& device,
                                       std::int64_t max_images,
                                       const graph::LoraConfig& lora, const graph::QuantConfig& quant) {
  models::ModelOptions eval_model = model;
  eval_model.training = false;  // running statistics, no dropout
  return evaluate_classifier(
      [&eval_model, &lora, &quant](std::int64_t batch) {
        planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(eval_model), batch);
        step.lora = lora;
        step.lora.dropout = 0.0f;  // evaluation: no dropout
        step.quant = quant;
        return step;
      }, ClassifierIo{},
      trained, data, device, max_images);
}

Result<Evaluation> evaluate_classifier(const std::function<planner::StepDescription(std::int64_t batch)>& eval_step,
                                       const ClassifierIo& io, const runtime::Executor& trained,
                                       const models::ImageDataset& data, runtime::Device& device,
                                       std::int64_t max_images) {
  const std::int64_t count = std::min(data.count, max_images);
  if (count < 1) return Error{"no test images to evaluate"};
  // Batches of up to 1000 images, fewer when resampled images are large (16M values at most).
  const std::int64_t batch = std::min({std::int64_t{1000}, count, std::max<std::int64_t>(1, (std::int64_t{16} << 20) / io.features(data))});
  const std::int64_t full = count / batch * batch;
  std::int64_t correct = 0;
  double loss_sum = 0.0;
  if (Status s = evaluate_range(eval_step, io, trained, data, device, batch, 0, full, correct, loss_sum); !s) {
    return s.error();
  }
  if (full < count) {
    const std::int64_t tail = count - full;
    if (Status s = evaluate_range(eval_step, io, trained, data, device, tail, full, tail, correct, loss_sum); !s) {
      return s.error();
    }
  }
  return Evaluation{double(correct) / double(count), loss_sum / double(count), count};
}

}  // namespace memplan::train
