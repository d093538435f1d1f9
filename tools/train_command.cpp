// memplan train: build the training step for a reference model, run it on real data, report.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "graph/training_step.h"
#include "kernels/kernel.h"
#include "models/fashion_mnist.h"
#include "models/registry.h"
#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"
#include "tools/classifier.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

struct TrainFlags {
  std::string model = "mlp";
  std::int64_t epochs = 5;
  std::int64_t steps = 0;  // overrides epochs when set
  std::int64_t batch = 128;
  double lr = 1e-3;
  std::string optimizer = "adamw";
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::uint64_t seed = 0;
  std::string data = models::kFashionMnistDefaultDir;
  std::vector<std::int64_t> hidden = {256, 256};
  int threads = 0;
  std::string mode = "planned";
  std::vector<std::string> debug;
  bool json = false;
  bool quiet = false;
};

std::string format_rate(double samples_per_s) {
  std::ostringstream out;
  out.precision(0);
  out << std::fixed << samples_per_s << " samples/s";
  return out.str();
}

int run_train(const TrainFlags& flags) {
  kernels::set_cpu_threads(flags.threads);
  auto optimizer_kind = graph::parse_optimizer_kind(flags.optimizer);
  if (!optimizer_kind) {
    std::cerr << "memplan train: " << optimizer_kind.error().message << "\n";
    return kExitUsage;
  }
  for (std::int64_t width : flags.hidden) {
    if (width <= 0) {
      std::cerr << "memplan train: --hidden widths must be positive, got " << width << "\n";
      return kExitUsage;
    }
  }

  auto train_data = models::load_fashion_mnist(flags.data, models::Split::train);
  if (!train_data) {
    std::cerr << "memplan train: " << train_data.error().message << "\n";
    return kExitUsage;
  }
  auto test_data = models::load_fashion_mnist(flags.data, models::Split::test);
  if (!test_data) {
    std::cerr << "memplan train: " << test_data.error().message << "\n";
    return kExitUsage;
  }
  if (flags.batch > train_data.value().count) {
    std::cerr << "memplan train: --batch " << flags.batch << " is larger than the training set ("
              << train_data.value().count << " images)\n";
    return kExitUsage;
  }

  models::ModelOptions model;
  model.name = flags.model;
  model.mlp.hidden = flags.hidden;
  model.mlp.inputs = train_data.value().features();
  model.mlp.classes = train_data.value().classes;
  model.cnn.image = train_data.value().rows;  // square images, one channel
  model.cnn.classes = train_data.value().classes;
  auto forward = models::build_forward(model, flags.batch);
  if (!forward) {
    std::cerr << "memplan train: " << forward.error().message << "\n";
    return kExitUsage;
  }
  graph::Graph step = std::move(forward).value();
  graph::OptimizerConfig opt;
  opt.kind = optimizer_kind.value();
  opt.lr = static_cast<float>(flags.lr);
  opt.momentum = static_cast<float>(flags.momentum);
  opt.weight_decay = static_cast<float>(flags.weight_decay);
  graph::make_training_step(step, opt);

  runtime::ExecutorOptions exec_options;
  exec_options.mode = runtime::parse_mode(flags.mode).value();
  exec_options.debug = runtime::DebugOptions::from_env();
  for (const std::string& d : flags.debug) {
    exec_options.debug.poison = exec_options.debug.poison || d == "poison";
    exec_options.debug.guards = exec_options.debug.guards || d == "guards";
  }
  runtime::CpuDevice device;
  runtime::Executor executor(step, device, exec_options);
  if (Status s = executor.setup(); !s) {
    std::cerr << "memplan train: " << s.error().message << "\n";
    return kExitFailure;
  }
  executor.initialize_persistent(flags.seed);

  BatchFeeder feeder(train_data.value(), flags.batch, flags.seed);
  const std::int64_t steps = flags.steps > 0 ? flags.steps : flags.epochs * feeder.steps_per_epoch();
  if (!flags.quiet) {
    std::fprintf(stderr, "memplan train: %s on Fashion-MNIST, %lld steps of batch %lld, %s lr %g, device %s (%d threads)\n",
                 flags.model.c_str(), static_cast<long long>(steps), static_cast<long long>(flags.batch),
                 flags.optimizer.c_str(), flags.lr, device.name().c_str(), kernels::cpu_threads());
  }
  Progress progress("train", steps, !flags.quiet);
  double recent_ms = 0.0;
  auto summary = runtime::train(
      executor, steps, [&](std::int64_t i, runtime::Executor& e) { feeder.feed(i, e); },
      [&](const runtime::StepReport& r) {
        recent_ms = recent_ms == 0.0 ? r.step_ms : 0.95 * recent_ms + 0.05 * r.step_ms;
        std::ostringstream detail;
        detail.precision(4);
        detail << "loss " << r.loss << "  " << format_rate(double(flags.batch) * 1000.0 / recent_ms);
        progress.update(r.step, detail.str());
      });
  if (!summary) {
    std::cerr << "\nmemplan train: " << summary.error().message << "\n";
    return kExitFailure;
  }
  const runtime::TrainSummary& s = summary.value();
  progress.finish("");

  auto eval = evaluate_classifier(model, executor, test_data.value(), device);
  if (!eval) {
    std::cerr << "memplan train: evaluation failed: " << eval.error().message << "\n";
    return kExitFailure;
  }
  const double samples_per_s = double(flags.batch) * 1000.0 / s.step_time_ms_median;
  if (flags.json) {
    nlohmann::json out;
    out["model"] = flags.model;
    out["device"] = device.name();
    out["mode"] = flags.mode;
    if (const planner::MemoryPlan* plan = executor.plan()) {
      out["arena_bytes"] = plan->arena_bytes;
      out["lower_bound_bytes"] = plan->lower_bound_bytes;
      out["persistent_bytes"] = plan->persistent_bytes;
      out["schedule"] = planner::schedule_name(plan->schedule_kind);
    }
    out["optimizer"] = flags.optimizer;
    out["lr"] = flags.lr;
    out["batch"] = flags.batch;
    out["seed"] = flags.seed;
    out["steps"] = s.steps;
    out["epochs"] = double(s.steps) / double(feeder.steps_per_epoch());
    out["final_loss"] = s.final_loss;
    out["test_accuracy"] = eval.value().accuracy;
    out["test_loss"] = eval.value().mean_loss;
    out["params_sha256"] = executor.params_sha256();
    out["step_time_ms_median"] = s.step_time_ms_median;
    out["samples_per_s"] = samples_per_s;
    out["train_seconds"] = s.total_seconds;
    out["device_allocations_during_steps"] = executor.device_allocations_during_steps();
    out["device_bytes_at_setup"] = executor.device_bytes_at_setup();
    out["threads"] = kernels::cpu_threads();
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("model            %s (%s, lr %g, batch %lld, seed %llu)\n", flags.model.c_str(),
                flags.optimizer.c_str(), flags.lr, static_cast<long long>(flags.batch),
                static_cast<unsigned long long>(flags.seed));
    std::printf("steps            %lld (%.2f epochs) in %.1f s\n", static_cast<long long>(s.steps),
                double(s.steps) / double(feeder.steps_per_epoch()), s.total_seconds);
    std::printf("final loss       %.4f\n", s.final_loss);
    std::printf("test accuracy    %.2f%%  (test loss %.4f)\n", 100.0 * eval.value().accuracy,
                eval.value().mean_loss);
    std::printf("step time        %.3f ms median, %s\n", s.step_time_ms_median, format_rate(samples_per_s).c_str());
    std::printf("params sha256    %s\n", executor.params_sha256().c_str());
    std::printf("device allocations during steps: %lld (%s mode)\n",
                static_cast<long long>(executor.device_allocations_during_steps()), flags.mode.c_str());
    if (const planner::MemoryPlan* plan = executor.plan()) std::printf("\n%s", memory_summary(step, *plan).c_str());
  }
  return kExitOk;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* app = root.add_subcommand(
      "train", "Train a reference model on real data (default: the MLP on Fashion-MNIST).");
  app->add_option("--model", flags->model, "Model to train")
      ->check(CLI::IsMember(models::trainable_model_names()))
      ->capture_default_str();
  auto* epochs = app->add_option("--epochs", flags->epochs, "Passes over the training set (default per model: mlp 5, cnn 5)")
                     ->check(positive_integer());
  app->add_option("--steps", flags->steps, "Number of steps (instead of --epochs)")
      ->check(positive_integer())
      ->excludes(epochs);
  auto* batch = app->add_option("--batch", flags->batch, "Samples per step (default per model: mlp 128, cnn 64)")
                    ->check(positive_integer());
  auto* lr = app->add_option("--lr", flags->lr, "Learning rate (default per model: mlp 1e-3, cnn 1e-3)")
                 ->check(positive_finite());
  app->add_option("--optimizer", flags->optimizer, "sgd, momentum or adamw")
      ->check(CLI::IsMember({"sgd", "momentum", "adamw"}))
      ->capture_default_str();
  app->add_option("--momentum", flags->momentum, "Momentum (optimizer momentum)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--weight-decay", flags->weight_decay, "Weight decay (decoupled for adamw)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option("--seed", flags->seed, "Seed for initialisation and shuffling")->capture_default_str();
  app->add_option("--data", flags->data, "Folder with the Fashion-MNIST IDX files")->capture_default_str();
  app->add_option("--hidden", flags->hidden, "MLP hidden widths, e.g. --hidden 256,256")
      ->delimiter(',')
      ->check(positive_integer())
      ->capture_default_str();
  app->add_option("--threads", flags->threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app->add_option("--mode", flags->mode,
                  "planned: one arena allocated once, tensors at planned offsets; naive: one device allocation per tensor; dynamic: a PyTorch-style caching allocator")
      ->check(CLI::IsMember({"planned", "naive", "dynamic"}))
      ->capture_default_str();
  app->add_option("--debug", flags->debug,
                  "Debug checks, comma-separated: poison (NaN-fill dead buffers, stop at the first op reading NaN), "
                  "guards (guard bytes after every buffer, checked after every op). Also MEMPLAN_DEBUG=...")
      ->delimiter(',')
      ->check(CLI::IsMember({"poison", "guards"}));
  app->add_flag("--json", flags->json, "Print one JSON object with the results on stdout");
  app->add_flag("--quiet", flags->quiet, "No progress output on stderr");
  return Command{app, [flags, epochs, batch, lr] {
    TrainFlags resolved = *flags;  // flags left out take the model's defaults
    const models::TrainDefaults defaults = models::train_defaults(resolved.model);
    if (epochs->count() == 0) resolved.epochs = defaults.epochs;
    if (batch->count() == 0) resolved.batch = defaults.batch;
    if (lr->count() == 0) resolved.lr = defaults.lr;
    return run_train(resolved);
  }};
}

}  // namespace memplan::tools
