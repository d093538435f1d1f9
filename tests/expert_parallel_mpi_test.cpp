// `memplan train --expert-parallel` (and --tensor-parallel on mixtures of experts) across processes under Open MPI's mpirun: ranks that split
// each mixture layer's experts, sending tokens to their experts' ranks and back by all-to-alls, end
// within 1e-5 (relative, per tensor) of one process on the same global batch; with groups that
// hold the same experts (4 ranks, --expert-parallel 2) too. Every rank plans the arena `fit`
// plans for the same flags and allocates nothing during steps; ZeRO stages 0-2 end with the same
// parameters. A Mixtral-style config and a DeepSeek-V3-style one (latent attention, a dense first
// layer, a shared expert, sigmoid scores limited to a group). Nothing is dropped
// (--moe-capacity-factor 0): with dropping, each rank's slots would follow its own tokens, a
// different model from one process's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli_util.h"
#include "tests/rank_runs.h"

namespace memplan {
namespace {

using testing::expect_parameters_close;
using testing::json_run;
using testing::mpirun;
using testing::run_cli;
using testing::run_cli_with_env;

struct MoeFiles {
  std::string dir, text, mixtral, deepseek, dense;
};

const MoeFiles& moe_files() {
  static const MoeFiles f = [] {
    MoeFiles out;
    out.dir = ::testing::TempDir() + "/ep_" + std::to_string(::getpid());
    std::filesystem::create_directories(out.dir);
    out.text = out.dir + "/text.txt";
    testing::write_97_byte_text(out.text);
    out.mixtral = out.dir + "/mixtral.json";  // 4 experts, 2 a token
    std::ofstream(out.mixtral) << R"({"model_type": "mixtral", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "num_local_experts": 4,
      "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
      "router_aux_loss_coef": 0.0})";
    out.deepseek = out.dir + "/deepseek.json";
    std::ofstream(out.deepseek) << R"({"model_type": "deepseek_v3", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 48, "q_lora_rank": 12,
      "kv_lora_rank": 10, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5, "n_routed_experts": 4,
      "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 1, "first_k_dense_replace": 1,
      "moe_layer_freq": 1, "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
      "routed_scaling_factor": 2.5, "norm_topk_prob": true, "vocab_size": 32000, "max_position_embeddings": 4096,
      "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false})";
    out.dense = out.dir + "/dense.json";
    std::ofstream(out.dense) << R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 32000,
      "max_position_embeddings": 4096, "rms_norm_eps": 1e-5})";
    return out;
  }();
  return f;
}


std::string moe_shape(const std::string& config) { return "--config " + config + " --seq 16 --batch 4 --optimizer sgd --moe-capacity-factor 0"; }

std::string train_args(const std::string& config) {
  return "train --json --quiet --threads 1 " + moe_shape(config) + " --steps 3 --device cpu --data " + moe_files().text;
}

// One process, then `ranks` ranks with `flags` (--expert-parallel E or --tensor-parallel T):
// parameters within 1e-5, every rank in fit's arena for the same flags, no allocation during steps.
nlohmann::json expect_split_as_one_process(const std::string& config, const std::string& label, int ranks, const std::string& flags) {
  SCOPED_TRACE(label + ": " + std::to_string(ranks) + " ranks," + flags);
  const std::string one = moe_files().dir + "/" + label + "_one.safetensors";
  std::string tag = flags;
  for (char& c : tag) c = c == ' ' || c == '-' ? '_' : c;
  const std::string split = moe_files().dir + "/" + label + "_" + std::to_string(ranks) + tag + ".safetensors";
  if (!std::filesystem::exists(one)) json_run("", train_args(config) + " --save " + one);
  const nlohmann::json out = json_run(mpirun(ranks), train_args(config) + flags + " --save " + split);
  expect_parameters_close(one, split, 1e-5);
  const nlohmann::json fit = json_run("", "fit " + moe_shape(config) + " --vocab 97 --devices " + std::to_string(ranks) + flags +
                                              " --device cpu --device-memory 1TiB --json");
  EXPECT_EQ(out["ranks"].size(), static_cast<std::size_t>(ranks)) << out.dump();
  for (const auto& rank : out["ranks"]) {
    EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << "fit and train disagree";
    EXPECT_EQ(rank["device_allocations_during_steps"], 0);
  }
  return fit;
}

// --expert-parallel `degree`: the experts split as fit says.
void expect_ranks_as_one_process(const std::string& config, const std::string& label, int ranks, int degree) {
  const nlohmann::json fit = expect_split_as_one_process(config, label, ranks, " --expert-parallel " + std::to_string(degree));
  EXPECT_EQ(fit.value("experts_per_rank", 0), 4 / degree);
}

TEST(ExpertParallelMpi, MixtralRanksEndWithinOneIn100000OfOneProcess) {
  expect_ranks_as_one_process(moe_files().mixtral, "mixtral", 2, 2);  // one expert group, each rank 2 experts
  expect_ranks_as_one_process(moe_files().mixtral, "mixtral", 4, 2);  // two groups: expert gradients summed over 2
  expect_ranks_as_one_process(moe_files().mixtral, "mixtral", 4, 4);  // one expert a rank
}

TEST(ExpertParallelMpi, DeepSeekStyleRanksEndWithinOneIn100000OfOneProcess) {
  expect_ranks_as_one_process(moe_files().deepseek, "deepseek", 4, 2);
}

// Tensor parallelism splits each expert's hidden width (and latent attention's heads) as the
// dense MLP's: the router and the latent down projections whole on every rank, their inputs to
// the split layers through tp_copy, the combined partial outputs summed. Two ranks, and two
// replicas of the slices, against one process.
TEST(TensorParallelMoeMpi, ExpertsAndLatentAttentionSplitByWidthEndWithinOneIn100000OfOneProcess) {
  expect_split_as_one_process(moe_files().mixtral, "mixtral", 2, " --tensor-parallel 2");
  expect_split_as_one_process(moe_files().deepseek, "deepseek", 2, " --tensor-parallel 2");
  const nlohmann::json fit = expect_split_as_one_process(moe_files().deepseek, "deepseek", 4, " --tensor-parallel 2");
  EXPECT_EQ(fit.value("tensor_parallel", 0), 2);
}

// Both at once, as DeepSeek-V3 trains: 4 ranks, each layer split over 2 of them and the experts
// over the 2 replicas of each slice; an expert's weights split both ways, gathered whole by --save.
TEST(TensorParallelMoeMpi, TensorAndExpertParallelTogetherEndWithinOneIn100000OfOneProcess) {
  for (const std::string& config : {moe_files().mixtral, moe_files().deepseek}) {
    const std::string label = config == moe_files().mixtral ? "mixtral" : "deepseek";
    const nlohmann::json fit = expect_split_as_one_process(config, label, 4, " --tensor-parallel 2 --expert-parallel 2");
    EXPECT_EQ(fit.value("experts_per_rank", 0), 2) << label;
  }
}

// ZeRO shards an expert's state over the ranks holding the same experts: stages 0-2 end with the
// same bits (they reduce the same sums), stage 3 gathers the experts from those ranks' shards and
// plans fit's arena.
TEST(ExpertParallelMpi, ZeroStagesShardTheExpertsOverTheRanksHoldingThem) {
  std::string first;
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(zero));
    const std::string flags = " --expert-parallel 2 --zero " + std::to_string(zero);
    const nlohmann::json out = json_run(mpirun(4), train_args(moe_files().mixtral) + flags);
    const nlohmann::json fit = json_run("", "fit " + moe_shape(moe_files().mixtral) + " --vocab 97 --devices 4" + flags +
                                                " --device cpu --device-memory 1TiB --json");
    for (const auto& rank : out["ranks"]) EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << "fit and train disagree";
    if (zero == 3) break;
    const std::string sha = out.value("params_sha256", "");
    if (first.empty()) first = sha;
    EXPECT_EQ(sha, first);
  }
}

TEST(ExpertParallelCli, SplitsThatCannotRunAreErrorsThatSayWhatWorks) {
  const std::string args = train_args(moe_files().mixtral);
  auto alone = run_cli(args + " --expert-parallel 2");
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_NE(alone.output.find("mpirun -np 2"), std::string::npos) << alone.output;
  auto odd = run_cli_with_env(mpirun(3), args + " --expert-parallel 2");
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_NE(odd.output.find("launch a multiple of 2"), std::string::npos) << odd.output;
  std::string three = args;  // a global batch of 3 for 3 ranks
  three.replace(three.find("--batch 4"), 9, "--batch 3");
  auto uneven = run_cli_with_env(mpirun(3), three + " --expert-parallel 3");
  EXPECT_NE(uneven.exit_code, 0);
  EXPECT_NE(uneven.output.find("cannot be split evenly over 3 expert-parallel ranks"), std::string::npos) << uneven.output;
  EXPECT_NE(uneven.output.find("(2, 4)"), std::string::npos) << uneven.output;
  auto dense = run_cli("fit --config " + moe_files().dense + " --seq 16 --devices 2 --expert-parallel 2 --device-memory 1TiB");
  EXPECT_EQ(dense.exit_code, 2) << dense.output;
  EXPECT_NE(dense.output.find("has none"), std::string::npos) << dense.output;
  auto devices = run_cli("fit " + moe_shape(moe_files().mixtral) + " --devices 6 --expert-parallel 4 --device-memory 1TiB");
  EXPECT_EQ(devices.exit_code, 2) << devices.output;
  EXPECT_NE(devices.output.find("a multiple of 4"), std::string::npos) << devices.output;
}

}  // namespace
}  // namespace memplan
