// memplan sample: continue a prompt with a GPT saved by `memplan train --model gpt --save`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "memplan/kernels/kernel.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/weights.h"
#include "memplan/train/language_model.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace memplan::tools {
namespace {

struct SampleFlags {
  std::string load;
  std::string prompt;
  train::SampleOptions options;
  int threads = 1;
};

int run_sample(const SampleFlags& flags) {
  kernels::set_cpu_threads(flags.threads);
  auto file = runtime::read_weights_file(flags.load);
  if (!file) {
    std::cerr << "memplan sample: " << file.error().message << "\n";
    return kExitUsage;
  }
  auto saved = train::parse_gpt_metadata(file.value().view.metadata, flags.load);
  if (!saved) {
    std::cerr << "memplan sample: " << saved.error().message << "\n";
    return kExitUsage;
  }
  const std::vector<unsigned char>& vocab = saved.value().vocab;
  std::vector<std::int32_t> prompt;
  for (char ch : flags.prompt) {
    const auto it = std::find(vocab.begin(), vocab.end(), static_cast<unsigned char>(ch));
    if (it == vocab.end()) {
      std::cerr << "memplan sample: the prompt has a character the model never saw in training (byte "
                << int(static_cast<unsigned char>(ch)) << "); its vocabulary has " << vocab.size() << " characters\n";
      return kExitUsage;
    }
    prompt.push_back(static_cast<std::int32_t>(it - vocab.begin()));
  }
  models::ModelOptions model;
  model.name = "gpt";
  model.gpt = saved.value().config;
  model.training = false;
  auto forward = models::build_forward(model, 1);
  if (!forward) {
    std::cerr << "memplan sample: " << forward.error().message << "\n";
    return kExitUsage;
  }
  const graph::Graph g = std::move(forward).value();
  runtime::CpuDevice device;
  runtime::Executor executor(g, device);
  if (Status s = executor.setup(); !s) {
    std::cerr << "memplan sample: " << s.error().message << "\n";
    return kExitFailure;
  }
  auto loaded = runtime::load_weights(executor, file.value(), flags.load);
  if (!loaded) {
    std::cerr << "memplan sample: " << loaded.error().message << "\n";
    return kExitUsage;
  }
  auto generated = train::generate(executor, prompt, flags.options);
  if (!generated) {
    std::cerr << "memplan sample: " << generated.error().message << "\n";
    return kExitFailure;
  }
  std::string text = flags.prompt;
  for (std::int32_t id : generated.value()) text.push_back(static_cast<char>(vocab[static_cast<std::size_t>(id)]));
  std::cout << text << "\n";
  return kExitOk;
}

}  // namespace

Command add_sample_command(CLI::App& root) {
  auto flags = std::make_shared<SampleFlags>();
  CLI::App* app = root.add_subcommand("sample", "Generate text with a GPT saved by 'memplan train --model gpt --save FILE'.");
  app->add_option("--load", flags->load, "The safetensors file written by train --save")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--prompt", flags->prompt, "Text to continue (default: none; generation starts from scratch)");
  app->add_option("--tokens", flags->options.tokens, "Characters to generate")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--temperature", flags->options.temperature,
                  "Sampling temperature: 0 picks the most likely character, 1 samples the model's distribution as it is")
      ->check(finite_in_range(0.0, 100.0))
      ->capture_default_str();
  app->add_option("--seed", flags->options.seed, "Seed for sampling")->check(whole_number())->capture_default_str();
  app->add_option("--threads", flags->threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  return Command{app, [flags] { return run_sample(*flags); }};
}

}  // namespace memplan::tools
