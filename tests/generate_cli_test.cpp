// `memplan generate` end to end on a small GPT and small decoder configs trained for a few steps:
// contiguous and paged KV caches give the same tokens, no allocation during decode, and the
// inputs it refuses (exit 2).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "small_datasets.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

struct GenerateCli : ::testing::Test {
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("memplan_generate_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 200; ++i) text << "the quick brown fox jumps over the lazy dog " << i << "\n";
    text.close();
    testing::write_small_fashion_mnist(dir / "images", 64, 16);
    weights = (dir / "gpt.safetensors").string();
    auto r = testing::run_cli("train --model gpt --layers 1 --width 32 --heads 2 --seq 32 --batch 4 --threads 1 --quiet "
                              "--steps 20 --data " + (dir / "text.txt").string() + " --save " + weights);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  static std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir / name;
    std::ofstream(p) << bytes;
    return p.string();
  }
  // The reports of `command` (with --json) run with --kv paged and with --kv contiguous; an empty
  // object, and a failure, for a run that fails.
  static std::pair<nlohmann::json, nlohmann::json> paged_and_contiguous(const std::string& command) {
    auto run = [&](const char* layout) {
      auto r = testing::run_cli(command + " --kv " + layout, false);
      EXPECT_EQ(r.exit_code, 0) << layout << ": " << r.output;
      return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
    };
    return {run("paged"), run("contiguous")};
  }
  static inline fs::path dir;
  static inline std::string weights;
};

TEST_F(GenerateCli, ContiguousAndPagedGiveTheSameTokensWithNoAllocationDuringDecode) {
  const std::string prompts = write("prompts.txt", "the quick\nthe lazy dog\n\nbrown fox 1\nthe quick\n");
  const std::string common = "generate --load " + weights + " --prompts-file " + prompts +
                             " --max-tokens 12 --temperature 0.8 --seed 5 --block-size 4 --max-running 3 --kv-memory 40KiB --json";
  const auto [p, c] = paged_and_contiguous(common);
  ASSERT_FALSE(p.empty() || c.empty());
  EXPECT_EQ(p.at("requests").get<int>(), 4) << "the blank line is skipped";
  EXPECT_EQ(p.at("outputs_sha256"), c.at("outputs_sha256"));
  EXPECT_EQ(p.at("outputs"), c.at("outputs"));
  EXPECT_EQ(p.at("generated_tokens").get<int>(), 48);
  EXPECT_EQ(p.at("device_allocations_during_decode").get<int>(), 0);
  EXPECT_EQ(c.at("device_allocations_during_decode").get<int>(), 0);
  // 40 KiB of 1 KiB blocks (2 * 1 layer * 32 * 4 B * 4 positions): contiguous holds 5 slabs of 8 blocks.
  EXPECT_EQ(p.at("kv_blocks").get<int>(), 40);
  EXPECT_GE(p.at("running_peak").get<int>(), c.at("running_peak").get<int>());
  for (const char* key : {"tokens_per_s", "kv_waste_ratio", "preemptions"}) EXPECT_TRUE(p.contains(key)) << key;
  EXPECT_GT(p.at("shared_prefix_tokens").get<int>(), 0) << "the repeated prompt shares its blocks";
  // Prompts drawn from the validation text.
  auto drawn = testing::run_cli("generate --load " + weights + " --prompts 6 --data " + (dir / "text.txt").string() +
                                " --max-tokens 4 --kv-memory 64KiB --block-size 4 --json", false);
  ASSERT_EQ(drawn.exit_code, 0) << drawn.output;
  EXPECT_EQ(nlohmann::json::parse(drawn.output).at("generated_tokens").get<int>(), 24);
}

// A decoder config trained with --save generates through its own decode step: the saved run holds
// the config, the sequence length and the vocabulary. Each family's step gives the same tokens
// with contiguous and paged caches, allocating nothing while it decodes.
TEST_F(GenerateCli, ConfigDecodersGenerateFromTheirSavedRuns) {
  const std::map<std::string, std::string> configs = {
      {"mixtral", R"({"model_type": "mixtral", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 24, "num_local_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 4096})"},
      {"gemma2", R"({"model_type": "gemma2", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48, "vocab_size": 256000,
        "max_position_embeddings": 8192, "query_pre_attn_scalar": 8, "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 3.0})"},
      {"gpt_neox", R"({"model_type": "gpt_neox", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 48, "vocab_size": 50304, "max_position_embeddings": 2048, "rotary_pct": 0.25})"},
      {"gpt2", R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 50257, "n_positions": 24})"},
  };
  const std::string prompts = write("config_prompts.txt", "the quick\nthe lazy\n");
  for (const auto& [name, json] : configs) {
    SCOPED_TRACE(name);
    // Under the sanitizers two of the four (the same generator and loader, other decode steps).
    if (testing::kSanitized && name != "mixtral" && name != "gemma2") continue;
    const std::string saved = (dir / (name + ".safetensors")).string();
    auto trained = testing::run_cli("train --config " + write(name + ".json", json) + " --seq 16 --batch 4 --threads 1 --quiet "
                                    "--steps 10 --data " + (dir / "text.txt").string() + " --save " + saved);
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const std::string common = "generate --load " + saved + " --prompts-file " + prompts +
                               " --max-tokens 6 --block-size 4 --max-running 2 --kv-memory 64KiB --json";
    const auto [p, c] = paged_and_contiguous(common);
    ASSERT_FALSE(p.empty() || c.empty());
    EXPECT_EQ(p.at("generated_tokens").get<int>(), 12);
    EXPECT_EQ(p.at("outputs_sha256"), c.at("outputs_sha256"));
    EXPECT_EQ(p.at("device_allocations_during_decode").get<int>(), 0);
    // The saved sequence length is the context: a prompt longer than 16 characters is refused.
    auto long_prompt = testing::run_cli("generate --load " + saved + " --prompts-file " +
                                        write("long16.txt", std::string(17, 'o') + "\n"));
    EXPECT_EQ(long_prompt.exit_code, 2) << long_prompt.output;
    EXPECT_NE(long_prompt.output.find("more than the model's context of 16"), std::string::npos) << long_prompt.output;
  }
  // A saved classifier is no decoder.
  const std::string mlp = (dir / "mlp.safetensors").string();
  ASSERT_EQ(testing::run_cli("train --model mlp --steps 1 --batch 8 --threads 1 --quiet --data " + (dir / "images").string() +
                             " --save " + mlp).exit_code,
            0);
  auto refused = testing::run_cli("generate --load " + mlp + " --prompts-file " + prompts);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("not a decoder saved by 'memplan train --model gpt --save' or 'memplan train --config FILE --save'"),
            std::string::npos)
      << refused.output;
}

TEST_F(GenerateCli, RefusesInputsItCannotServeWithExitTwo) {
  const std::string base = "generate --load " + weights;
  struct Case {
    std::string args, message;
  };
  const std::string empty = write("empty.txt", "\n\n");
  const std::string long_prompt = write("long.txt", std::string(33, 'o') + "\n");
  const std::string ok = write("ok.txt", "the\n");
  for (const Case& c : std::vector<Case>{
           {" --prompts-file " + empty, "holds no prompt"},
           {" --prompts-file " + long_prompt, "more than the model's context of 32"},
           {" --prompts-file " + ok + " --kv-memory 1000", "holds no block"},
           {" --prompts-file " + ok + " --block-size 0", "--block-size"},
           {" --prompts-file " + ok + " --kv contiguous --kv-memory 4KiB", "whole context"},
           {"", "--prompts-file FILE"},
           {" --prompts-file " + ok + " --kv sliding", "--kv"}}) {
    auto r = testing::run_cli(base + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << ": " << r.output;
  }
}

}  // namespace
}  // namespace memplan
