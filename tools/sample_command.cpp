// memplan sample: continue a prompt with a GPT saved by `memplan train --model gpt --save`.
#include <iostream>
#include <memory>

#include "memplan/kernels/kernel.h"
#include "memplan/runtime/device.h"
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
  models::AttentionKind attention = models::AttentionKind::fused;
};

int run_sample(const SampleFlags& flags) {
  kernels::set_cpu_threads(flags.threads);
  runtime::CpuDevice device;  // outlives the sampler, whose executor runs on it
  auto opened = train::GptSampler::open(flags.load);
  if (!opened) {
    std::cerr << "memplan sample: " << opened.error().message << "\n";
    return kExitUsage;
  }
  train::GptSampler& sampler = opened.value();
  sampler.set_attention(flags.attention);
  auto prompt = sampler.encode(flags.prompt);
  if (!prompt) {
    std::cerr << "memplan sample: " << prompt.error().message << "\n";
    return kExitUsage;
  }
  train::GptSampler::Fault fault = train::GptSampler::Fault::input;
  if (Status s = sampler.load(device, &fault); !s) {
    std::cerr << "memplan sample: " << s.error().message << "\n";
    return fault == train::GptSampler::Fault::device ? kExitFailure : kExitUsage;
  }
  auto generated = sampler.generate(prompt.value(), flags.options);
  if (!generated) {
    std::cerr << "memplan sample: " << generated.error().message << "\n";
    return kExitFailure;
  }
  std::cout << flags.prompt + sampler.decode(generated.value()) << "\n";
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
  add_enum_option(*app, "--attention", flags->attention, models::kAttentionKindNames,
                  "fused (one attention op) or materialized ([1, heads, T, T] scores stored); the text is the same");
  return Command{app, [flags] { return run_sample(*flags); }};
}

}  // namespace memplan::tools
