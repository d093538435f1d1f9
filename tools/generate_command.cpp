// memplan generate: batched generation with a KV cache for a GPT saved by `memplan train --model
// gpt --save`: prompts from a file or drawn from the validation text, a continuous-batching loop
// over a contiguous or paged KV cache (serve/generator.h), and what it cost.
#include <algorithm>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "memplan/common/byte_size.h"
#include "memplan/common/input_file.h"
#include "memplan/common/rng.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/model_ref.h"
#include "memplan/models/text_dataset.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/weights.h"
#include "memplan/serve/generator.h"
#include "memplan/train/language_model.h"
#include "tools/cli_util.h"
#include "tools/memory_report.h"
#include "tools/commands.h"

namespace memplan::tools {
namespace {

struct GenerateFlags {
  std::string load;
  std::string prompts_file;
  std::int64_t prompts = 0;
  std::string data = models::kFortunesDefaultDir;
  std::int64_t max_tokens = 64;
  double temperature = 0.8;
  std::uint64_t seed = 0;
  serve::KvLayout kv = serve::KvLayout::paged;
  std::string kv_memory = "64MiB";
  std::int64_t block_size = 16;
  std::int64_t max_running = 32;
  int threads = 1;
  bool json = false;
};

// The bytes of `text` as token ids of `vocab`; an Error names the first byte it lacks.
Result<std::vector<std::int32_t>> encode(const std::vector<unsigned char>& vocab, std::string_view text) {
  std::vector<std::int32_t> ids;
  for (char ch : text) {
    const auto it = std::find(vocab.begin(), vocab.end(), static_cast<unsigned char>(ch));
    if (it == vocab.end()) {
      return Error{"byte " + std::to_string(int(static_cast<unsigned char>(ch))) + " is not in the model's vocabulary of " +
                   std::to_string(vocab.size()) + " characters"};
    }
    ids.push_back(static_cast<std::int32_t>(it - vocab.begin()));
  }
  return ids;
}

// Prompts, one per line of the file (blank lines skipped).
Result<std::vector<std::string>> prompts_from_file(const std::string& path) {
  auto text = read_regular_file(path, Bytes{64} << 20, "prompt file");
  if (!text) return text.error();
  std::vector<std::string> prompts;
  std::istringstream lines(text.value());
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) return Error{path + " holds no prompt (one per line, blank lines skipped)"};
  return prompts;
}

// `count` prompts cut from the validation text at places and lengths (1 .. context/2) drawn from `seed`.
Result<std::vector<std::string>> prompts_from_text(const std::string& data, std::int64_t count, std::int64_t context,
                                                   std::uint64_t seed) {
  auto text = models::read_text(data);
  if (!text) return text.error();
  auto dataset = models::make_text_dataset(text.value(), context + 1);
  if (!dataset) return dataset.error();
  const std::vector<std::int32_t>& val = dataset.value().val;
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<std::string> prompts;
  const std::int64_t longest = std::max<std::int64_t>(1, context / 2);
  for (std::int64_t i = 0; i < count; ++i) {
    const auto length = static_cast<std::int64_t>(1 + rng.below(static_cast<std::uint64_t>(longest)));
    const auto start = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(static_cast<std::int64_t>(val.size()) - length + 1)));
    prompts.push_back(dataset.value().decode(std::vector<std::int32_t>(val.begin() + start, val.begin() + start + length)));
  }
  return prompts;
}

std::string one_line(const std::string& text) {
  std::string out;
  for (char ch : text) out += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  return out;
}

int run_generate(const GenerateFlags& flags) {
  auto fail = [](const std::string& message, int code) {
    std::cerr << "memplan generate: " << message << "\n";
    return code;
  };
  if (flags.prompts_file.empty() == (flags.prompts == 0)) {
    return fail("give prompts with --prompts-file FILE (one per line) or --prompts N (drawn from the validation text)",
                kExitUsage);
  }
  kernels::set_cpu_threads(flags.threads);
  auto file = runtime::read_weights_file(flags.load);
  if (!file) return fail(file.error().message, kExitUsage);
  auto saved = train::parse_decoder_metadata(file.value().view.metadata, flags.load);
  if (!saved) return fail(saved.error().message, kExitUsage);
  const models::DecoderModel& model = saved.value().model;
  const std::int64_t context = model.context();
  auto texts = flags.prompts_file.empty() ? prompts_from_text(flags.data, flags.prompts, context, flags.seed)
                                          : prompts_from_file(flags.prompts_file);
  if (!texts) return fail(texts.error().message, kExitUsage);
  std::vector<serve::GenerationRequest> requests;
  for (std::size_t i = 0; i < texts.value().size(); ++i) {
    const std::string& text = texts.value()[i];
    auto ids = encode(saved.value().vocab, text);
    if (!ids) return fail("prompt " + std::to_string(i + 1) + ": " + ids.error().message, kExitUsage);
    if (static_cast<std::int64_t>(ids.value().size()) > context) {
      return fail("prompt " + std::to_string(i + 1) + " has " + std::to_string(ids.value().size()) +
                      " characters, more than the model's context of " + std::to_string(context),
                  kExitUsage);
    }
    requests.push_back({std::move(ids).value(), flags.max_tokens});
  }
  serve::GeneratorOptions options;
  options.layout = flags.kv;
  options.kv_memory = parse_byte_size(flags.kv_memory).value();
  options.block_size = flags.block_size;
  options.max_running = flags.max_running;
  options.temperature = flags.temperature;
  options.seed = flags.seed;
  runtime::CpuDevice device;
  auto generator = serve::Generator::create(model, device, options);
  if (!generator) return fail(generator.error().message, kExitUsage);
  if (Status s = generator.value()->load_weights(file.value(), flags.load); !s) return fail(s.error().message, kExitUsage);
  auto ran = generator.value()->run(requests);
  if (!ran) return fail(ran.error().message, kExitUsage);
  const serve::GenerationReport& r = ran.value();
  const serve::KvPoolShape& pool = generator.value()->pool_shape();
  const Bytes arena = generator.value()->step().plan.arena_bytes;
  if (flags.json) {
    nlohmann::json j = {{"requests", requests.size()},
                        {"kv", serve::kv_layout_name(flags.kv)},
                        {"block_size", pool.block_size},
                        {"kv_pool_bytes", pool.pool_bytes()},
                        {"kv_blocks", pool.blocks},
                        {"max_running", flags.max_running},
                        {"decode_arena_bytes", arena},
                        {"generated_tokens", r.generated_tokens},
                        {"steps", r.steps},
                        {"seconds", r.seconds},
                        {"tokens_per_s", r.tokens_per_s},
                        {"running_peak", r.running_peak},
                        {"kv_reserved_bytes_at_peak", r.kv_reserved_bytes_at_peak},
                        {"kv_token_bytes_at_peak", r.kv_token_bytes_at_peak},
                        {"kv_waste_ratio", r.kv_waste_ratio},
                        {"kv_waste_ratio_mean", r.kv_waste_ratio_mean},
                        {"preemptions", r.preemptions},
                        {"copy_on_write", r.copy_on_write},
                        {"shared_prefix_tokens", r.shared_prefix_tokens},
                        {"device_allocations_during_decode", r.device_allocations_during_decode},
                        {"outputs_sha256", r.outputs_sha256}};
    nlohmann::json outputs = nlohmann::json::array();
    for (const auto& out : r.outputs) {
      std::string text;
      for (std::int32_t id : out) text.push_back(static_cast<char>(saved.value().vocab[static_cast<std::size_t>(id)]));
      outputs.push_back(text);
    }
    j["outputs"] = outputs;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  for (std::size_t i = 0; i < r.outputs.size(); ++i) {
    std::string text;
    for (std::int32_t id : r.outputs[i]) text.push_back(static_cast<char>(saved.value().vocab[static_cast<std::size_t>(id)]));
    std::cout << "[" << i + 1 << "] " << one_line(texts.value()[i]) << " => " << one_line(text) << "\n";
  }
  std::cout << "\n"
            << requests.size() << " requests, " << r.generated_tokens << " tokens in " << r.steps << " steps, "
            << r.seconds << " s: " << r.tokens_per_s << " tokens/s\n"
            << "KV cache: " << serve::kv_layout_name(flags.kv) << ", " << pool.blocks << " blocks of " << pool.block_size
            << " positions (" << format_bytes(pool.pool_bytes()) << "), allocated once; decode step arena "
            << format_bytes(arena) << "\n"
            << "running sequences: peak " << r.running_peak << " of " << flags.max_running << " slots; preemptions "
            << r.preemptions << "; prompt positions shared " << r.shared_prefix_tokens << ", copy-on-write "
            << r.copy_on_write << "\n"
            << "KV at peak: " << format_bytes(r.kv_token_bytes_at_peak) << " holding tokens of "
            << format_bytes(r.kv_reserved_bytes_at_peak) << " reserved (waste " << r.kv_waste_ratio * 100.0
            << "%; over all steps " << r.kv_waste_ratio_mean * 100.0 << "%)\n"
            << "device allocations during decode: " << r.device_allocations_during_decode << "\n"
            << "outputs sha256: " << r.outputs_sha256 << "\n";
  return kExitOk;
}

}  // namespace

Command add_generate_command(CLI::App& root) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* app = root.add_subcommand(
      "generate", "Generate for many prompts at once with a KV cache (contiguous or paged) and continuous batching.");
  app->add_option("--load", flags->load,
                  "The safetensors file written by 'memplan train --model gpt --save', or by 'memplan train --config "
                  "FILE --save' for a decoder config (a model_type of " + models::supported_model_types() +
                      " but bert, vit and t5)")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--prompts-file", flags->prompts_file, "Prompts, one per line (blank lines skipped)");
  app->add_option("--prompts", flags->prompts,
                  "Draw N prompts (1 to context/2 characters) from the validation text of --data instead")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app->add_option("--data", flags->data, "Text for --prompts: a file, or a folder of fortune files")->capture_default_str();
  app->add_option("--max-tokens", flags->max_tokens, "Tokens to generate per prompt (fewer when the context fills)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--temperature", flags->temperature,
                  "Sampling temperature: 0 picks the most likely character")
      ->check(finite_in_range(0.0, 100.0))
      ->capture_default_str();
  app->add_option("--seed", flags->seed, "Seed for sampling (and for --prompts)")->check(whole_number())->capture_default_str();
  add_enum_option(*app, "--kv", flags->kv, serve::kKvLayoutNames,
                  "KV cache layout: contiguous (a whole-context slab per sequence) or paged (blocks as it grows)");
  app->add_option("--kv-memory", flags->kv_memory, "Memory for the KV cache pool, e.g. 64MiB, allocated once")
      ->check(byte_size())
      ->capture_default_str();
  app->add_option("--block-size", flags->block_size, "Positions per KV block")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  app->add_option("--max-running", flags->max_running, "Sequences one decode step advances (its batch)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}))
      ->capture_default_str();
  app->add_option("--threads", flags->threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  app->add_flag("--json", flags->json, "Print the report as JSON");
  return Command{app, [flags] { return run_generate(*flags); }};
}

}  // namespace memplan::tools
