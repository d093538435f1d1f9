// Training an imported ONNX classifier on Fashion-MNIST (`memplan train --onnx`): it starts from
// the file's initializers, trains through the same plan_step pipeline as the zoo models, saves
// under the ONNX names, and --export-onnx writes a file whose re-import computes what the trained
// model computes. Needs Fashion-MNIST (scripts/test.sh installs it).
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "small_datasets.h"
#include "memplan/import/onnx_import.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/weights.h"
#include "memplan/train/session.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

std::string onnx_fixture(const std::string& name) { return std::string(MEMPLAN_TEST_DATA_DIR) + "/onnx/" + name; }

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("memplan_onnx_train_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// A small dataset in Fashion-MNIST's IDX format: 256 training and 64 test images.
const std::string& small_images() {
  static const std::string dir = [] {
    const fs::path d = scratch("fashion_mnist");
    testing::write_small_fashion_mnist(d, 256, 64);
    return d.string();
  }();
  return dir;
}

std::unique_ptr<train::TrainingSession> planned_session(const std::string& file, import::LossKind loss, float lr,
                                                       const std::string& images, runtime::Device& device) {
  auto data = train::load_onnx_run_data(file, loss, "", images, /*batch=*/16);
  EXPECT_TRUE(data.ok()) << data.error().message;
  train::SessionOptions options;
  options.batch = 16;
  options.seed = 3;
  options.optimizer.kind = graph::OptimizerKind::adamw;
  options.optimizer.lr = lr;
  auto session = train::TrainingSession::plan(std::move(data).value(), options, device);
  EXPECT_TRUE(session.ok()) << session.error().message;
  EXPECT_TRUE(session.value()->setup().ok());
  return std::move(session).value();
}

std::vector<float> values_of(const runtime::Executor& e, const std::string& name) {
  const TensorId id = e.graph().find(name);
  EXPECT_NE(id, kNoTensor) << name;
  std::vector<float> v(static_cast<std::size_t>(e.graph().tensor(id).shape.numel()));
  e.read_tensor(id, v.data());
  return v;
}

// The evaluation-form forward output of `model` at batch 4 on fixed images, its persistent
// tensors (weights, batch-norm statistics) given by name.
std::vector<float> forward_output(const import::OnnxModel& model,
                                  const std::function<std::vector<float>(const std::string&)>& weights) {
  graph::ModelSource source;
  source.training = false;
  source.build = [&model](std::int64_t batch, std::span<const std::int64_t>) {
    import::ImportOptions o;
    o.batch = batch;
    o.training = false;
    o.keep_values = false;
    return model.build(o).graph;
  };
  const planner::StepDescription step = planner::StepDescription::of_source(std::move(source), 4);
  runtime::CpuDevice device;
  auto planned = runtime::plan_step_for(step, device);
  EXPECT_TRUE(planned.ok());
  runtime::Executor exec(planned.value(), device);
  EXPECT_TRUE(exec.setup().ok());
  const graph::Graph& g = planned.value().graph;
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    if (!graph::is_persistent(g.tensor(id).role)) continue;
    const std::vector<float> v = weights(g.tensor(id).name);
    EXPECT_EQ(static_cast<std::int64_t>(v.size()), g.tensor(id).shape.numel()) << g.tensor(id).name;
    exec.write_tensor(id, v.data());
  }
  std::vector<float> images(4 * 28 * 28);
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 37) % 101) / 101.0f;
  const std::int32_t labels[4] = {0, 1, 2, 3};
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const graph::TensorDesc& d = g.tensor(id);
    if (d.role != graph::Role::input) continue;
    if (d.dtype == graph::DType::i32) {
      exec.set_input(id, labels, sizeof(labels));
    } else {
      exec.set_input(id, images.data(), static_cast<Bytes>(images.size() * sizeof(float)));
    }
  }
  EXPECT_TRUE(exec.run_step().ok());
  std::vector<float> out(static_cast<std::size_t>(g.tensor(g.output).shape.numel()));
  exec.read_tensor(g.output, out.data());
  return out;
}

TEST(OnnxTrain, StartsFromTheInitializersAndExportsWhatItTrained) {
  runtime::CpuDevice device;
  const std::string file = onnx_fixture("fmnist_cnn.onnx");
  auto session = planned_session(file, import::LossKind::cross_entropy, 1e-2f, small_images(), device);
  const train::OnnxRun& run = *session->data().onnx;
  ASSERT_FALSE(run.initial.empty());
  // The step starts from the file's weights, not from the seed's.
  for (const auto& [name, values] : run.initial) EXPECT_EQ(values_of(session->executor(), name), values) << name;
  ASSERT_TRUE(session->run(5, {}).ok());
  const auto& [first_name, first_initial] = run.initial.front();
  EXPECT_NE(values_of(session->executor(), first_name), first_initial) << "training moved no weight";

  const fs::path out = scratch("trained.onnx");
  ASSERT_TRUE(session->export_onnx(out.string()).ok());
  auto reloaded = import::OnnxModel::load(out.string());
  ASSERT_TRUE(reloaded.ok()) << reloaded.error().message;
  import::ImportOptions o;
  o.batch = 4;
  const import::ImportedGraph reimported = reloaded.value()->build(o);
  // Every initializer of the exported file holds the trained values.
  std::map<std::string, std::vector<float>> exported;
  for (const auto& [id, values] : reimported.initial_values) exported[reimported.graph.tensor(id).name] = values;
  ASSERT_EQ(exported.size(), run.initial.size());
  for (const auto& [name, values] : exported) EXPECT_EQ(values, values_of(session->executor(), name)) << name;
  // The re-imported model computes what the trained one computes, bit for bit.
  const std::vector<float> trained =
      forward_output(*run.model, [&](const std::string& name) { return values_of(session->executor(), name); });
  const std::vector<float> from_file = forward_output(*reloaded.value(), [&](const std::string& name) { return exported.at(name); });
  ASSERT_EQ(trained.size(), 40u);
  EXPECT_EQ(trained, from_file);
  // ... and not what the untrained file computes.
  std::map<std::string, std::vector<float>> initial(run.initial.begin(), run.initial.end());
  EXPECT_NE(forward_output(*run.model, [&](const std::string& name) { return initial.at(name); }), trained);
  fs::remove(out);
}

TEST(OnnxTrain, MseOnFlatImagesFeedsOneHotTargets) {
  runtime::CpuDevice device;
  auto session = planned_session(onnx_fixture("fmnist_mlp.onnx"), import::LossKind::mse, 1e-3f, "", device);  // Fashion-MNIST
  EXPECT_TRUE(session->data().onnx->io.one_hot);
  auto summary = session->run(300, {});
  ASSERT_TRUE(summary.ok());
  auto eval = session->evaluate();
  ASSERT_TRUE(eval.ok()) << eval.error().message;
  // 300 steps of 16 images beat chance (10%) by far; the loss is the mean squared error to
  // one-hot rows, below the 0.09 of predicting 0.1 for every class.
  EXPECT_GT(eval.value().classifier->accuracy, 0.4);
  EXPECT_LT(eval.value().classifier->mean_loss, 0.08);
}

TEST(OnnxTrainCli, TrainsSavesUnderOnnxNamesAndAgreesAcrossModes) {
  const fs::path saved = scratch("run.safetensors"), exported = scratch("cli.onnx");
  const std::string base = "train --onnx " + onnx_fixture("fmnist_cnn.onnx") + " --data " + small_images() +
                           " --steps 4 --batch 16 --seed 1 --json --quiet";
  auto planned = testing::run_cli(base + " --save " + saved.string() + " --export-onnx " + exported.string(), false);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const auto a = nlohmann::json::parse(planned.output);
  EXPECT_EQ(a["steps"], 4);
  EXPECT_TRUE(a.contains("test_accuracy"));
  EXPECT_EQ(a["device_allocations_during_steps"], 0);
  for (const char* mode : {"naive", "dynamic"}) {
    auto other = testing::run_cli(base + " --mode " + mode, false);
    ASSERT_EQ(other.exit_code, 0) << other.output;
    EXPECT_EQ(nlohmann::json::parse(other.output)["params_sha256"], a["params_sha256"]) << mode;
  }
  auto checkpointed = testing::run_cli(base + " --checkpoint sqrt", false);
  ASSERT_EQ(checkpointed.exit_code, 0) << checkpointed.output;
  EXPECT_EQ(nlohmann::json::parse(checkpointed.output)["params_sha256"], a["params_sha256"]);

  // --save names the tensors after the ONNX initializers.
  auto file = runtime::read_weights_file(saved.string());
  ASSERT_TRUE(file.ok()) << file.error().message;
  std::set<std::string> names;
  for (const auto& t : file.value().view.tensors) names.insert(t.name);
  auto model = import::OnnxModel::load(onnx_fixture("fmnist_cnn.onnx"));
  ASSERT_TRUE(model.ok());
  const import::ImportedGraph imported = model.value()->build({});
  for (const auto& [id, values] : imported.initial_values) {
    EXPECT_TRUE(names.count(imported.graph.tensor(id).name)) << imported.graph.tensor(id).name;
  }
  // The exported file trains again (and resumes from the trained weights).
  auto again = testing::run_cli("train --onnx " + exported.string() + " --data " + small_images() +
                                     " --steps 1 --batch 16 --json --quiet",
                                 false);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(nlohmann::json::parse(again.output).contains("test_accuracy"));
  fs::remove(saved);
  fs::remove(exported);
}

// Swin's constants (a Gather's i32 indices, the shifted-window mask) are buffers of the graph:
// they start from the file's values, train in every mode to the same bits, and are not written
// back as initializers; the exported file trains again.
TEST(OnnxTrainCli, SwinTrainsAndExportsWithoutItsConstantBuffers) {
  const fs::path exported = scratch("swin.onnx");
  const std::string base = "train --onnx " + onnx_fixture("tiny_swin.onnx") + " --data " + small_images() +
                           " --steps 2 --batch 4 --seed 1 --eval-samples 0 --json --quiet";
  auto planned = testing::run_cli(base + " --export-onnx " + exported.string(), false);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const auto a = nlohmann::json::parse(planned.output);
  auto naive = testing::run_cli(base + " --mode naive", false);
  ASSERT_EQ(naive.exit_code, 0) << naive.output;
  EXPECT_EQ(nlohmann::json::parse(naive.output)["params_sha256"], a["params_sha256"]);
  auto again = testing::run_cli("train --onnx " + exported.string() + " --data " + small_images() +
                                    " --steps 1 --batch 4 --eval-samples 0 --json --quiet",
                                false);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(std::isfinite(nlohmann::json::parse(again.output)["final_loss"].get<double>()));
  fs::remove(exported);
}

// A model made for other images (tiny_vgg: 3 x 16 x 16, as torchvision's take 3 x 224 x 224) trains
// on the gray 28 x 28 images resampled and repeated over the channels, the same bits in every mode.
TEST(OnnxTrainCli, AModelForOtherImagesTrainsOnTheResampledImages) {
  const std::string base = "train --onnx " + onnx_fixture("tiny_vgg.onnx") + " --data " + small_images() +
                           " --steps 3 --batch 8 --seed 1 --json";
  auto planned = testing::run_cli(base, false);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const auto a = nlohmann::json::parse(planned.output);
  EXPECT_TRUE(a.contains("test_accuracy"));
  EXPECT_EQ(a["device_allocations_during_steps"], 0);
  for (const char* mode : {"naive", "dynamic"}) {
    auto other = testing::run_cli(base + " --mode " + mode, false);
    ASSERT_EQ(other.exit_code, 0) << other.output;
    EXPECT_EQ(nlohmann::json::parse(other.output)["params_sha256"], a["params_sha256"]) << mode;
  }
  const auto noted = testing::run_cli("train --onnx " + onnx_fixture("tiny_vgg.onnx") + " --data " + small_images() +
                                      " --steps 1 --batch 8 --eval-samples 0");
  EXPECT_NE(noted.output.find("the model takes 3 x 16 x 16 images: the 28 x 28 gray images are resampled bilinearly and "
                              "repeated over the channels"),
            std::string::npos)
      << noted.output;
}

TEST(OnnxTrainCli, BadFilesPathsAndFlagsAreUsageErrors) {
  const fs::path dir = scratch("");
  const std::string cnn = onnx_fixture("fmnist_cnn.onnx");
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {"train --onnx " + cnn + " --steps 1 --export-onnx /nonexistent-memplan/out.onnx", "does not exist"},
      {"train --onnx " + cnn + " --steps 1 --export-onnx " + dir.string(), "is a folder"},
      {"train --steps 1 --export-onnx " + (dir / "x.onnx").string(), "--export-onnx applies to --onnx"},
      {"train --steps 1 --loss mse", "--loss applies to --onnx"},
      {"train --onnx " + cnn + " --model mlp --steps 1", "excludes"},
      {"train --onnx " + cnn + " --hidden 8 --steps 1", "--hidden"},
      {"train --onnx /nonexistent-memplan/model.onnx --steps 1", "model.onnx"},
      {"train --onnx " + onnx_fixture("tiny_gpt.onnx") + " --steps 1", "float images [B, C, H, W]"},
      {"train --onnx " + onnx_fixture("fmnist_cnn.onnx") + " --output nope --steps 1", "nope"},
      {"train --onnx " + onnx_fixture("fmnist_cnn.onnx") + " --steps 1 --data /nonexistent/memplan-data", "--data"},
  };
  for (const Case& c : cases) {
    const auto r = testing::run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace memplan
