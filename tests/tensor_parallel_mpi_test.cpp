// `memplan train --tensor-parallel` across processes under Open MPI's mpirun: ranks that split
// every layer end within 1e-5 (relative, per tensor) of one process on the same batch (the GPT, with
// a vocabulary that does not divide, and a grouped-query rotary decoder config; with and without
// --sequence-parallel), every rank in the arena `fit` plans for the same flags, allocating nothing
// during steps; with data-parallel replicas of the slices every ZeRO stage ends with the same
// parameters. --save gathers the slices into the file one process writes; --save-dir resumes every
// rank's slices exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/runtime/safetensors.h"
#include "tests/cli_util.h"
#include "tests/rank_runs.h"

namespace memplan {
namespace {

using testing::expect_parameters_close;
using testing::mpirun;
using testing::run_cli;
using testing::run_cli_with_env;

struct Files {
  std::string dir, text, llama;
};

// A text of 97 distinct bytes (the GPT's vocabulary: 2 slices of 49, one row of padding) and a
// small Llama layout with grouped-query attention (4 heads, 2 K/V heads: one of each per rank).
const Files& files() {
  static const Files f = [] {
    Files out;
    out.dir = ::testing::TempDir() + "/tp_" + std::to_string(::getpid());
    std::filesystem::create_directories(out.dir);
    out.text = out.dir + "/text.txt";
    testing::write_97_byte_text(out.text);
    out.llama = out.dir + "/llama.json";
    std::ofstream(out.llama) << R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 32000,
      "max_position_embeddings": 4096, "rms_norm_eps": 1e-5})";
    return out;
  }();
  return f;
}

nlohmann::json train_json(const std::string& launcher, const std::string& args) {
  return testing::json_run(launcher, "train --json --quiet --threads 1 " + args);
}

nlohmann::json fit_json(const std::string& args) {
  const auto r = run_cli("fit " + args + " --device cpu --device-memory 1TiB --json", false);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

// The GPT (SGD for 3 steps) in one process and on two ranks with `split` flags: parameters within
// 1e-5, every rank in the arena fit plans for the same flags, allocating nothing during steps.
// SGD: as tests/data_parallel_mpi_test.cpp says, an update proportional to the gradient keeps the
// reduction order's rounding as small as it is. Returns the split run's answer.
nlohmann::json expect_gpt_on_two_ranks_as_one_process(const std::string& label, const std::string& split) {
  const std::string shape = "--model gpt --batch 4 --seq 16 --optimizer sgd";
  const std::string args = shape + " --steps 3 --data " + files().text;
  const std::string one = files().dir + "/" + label + "_one.safetensors", two = files().dir + "/" + label + "_two.safetensors";
  train_json("", args + " --device cpu --save " + one);
  const nlohmann::json out = train_json(mpirun(2), args + " " + split + " --save " + two);
  expect_parameters_close(one, two, 1e-5);
  const nlohmann::json fit = fit_json(shape + " --vocab 97 " + split);
  EXPECT_EQ(fit["tensor_parallel"], 2);
  EXPECT_EQ(out.value("sequence_parallel", false), fit.value("sequence_parallel", false));
  EXPECT_EQ(out.value("sequence_parallel", false), split.find("--sequence-parallel") != std::string::npos);
  EXPECT_EQ(out["ranks"].size(), 2u) << out.dump();
  for (const auto& rank : out["ranks"]) {
    EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << "fit and train disagree";
    EXPECT_EQ(rank["device_allocations_during_steps"], 0);
  }
  return out;
}

// The grouped-query Llama config, likewise (parameters and allocations).
void expect_llama_on_two_ranks_as_one_process(const std::string& label, const std::string& split) {
  const std::string args = "--config " + files().llama + " --seq 16 --batch 4 --optimizer sgd --steps 3 --data " + files().text;
  const std::string one = files().dir + "/" + label + "_one.safetensors", two = files().dir + "/" + label + "_two.safetensors";
  train_json("", args + " --device cpu --save " + one);
  const nlohmann::json out = train_json(mpirun(2), args + " " + split + " --save " + two);
  expect_parameters_close(one, two, 1e-5);
  for (const auto& rank : out["ranks"]) EXPECT_EQ(rank["device_allocations_during_steps"], 0);
}

TEST(TensorParallelMpi, GptOnTwoRanksEndsWithinOneIn100000OfOneProcess) {
  const nlohmann::json out = expect_gpt_on_two_ranks_as_one_process("gpt", "--tensor-parallel 2");
  EXPECT_EQ(out["tensor_parallel"], 2);
  EXPECT_EQ(out["data_parallel"], 1);
}

// A rotary decoder (Llama's layout, grouped-query attention) split over two ranks: one query head
// group and one K/V head each, the SwiGLU's hidden width halved.
TEST(TensorParallelMpi, GroupedQueryDecoderOnTwoRanksEndsWithinOneIn100000OfOneProcess) {
  expect_llama_on_two_ranks_as_one_process("llama", "--tensor-parallel 2");
}

// Sequence parallelism moves where rows live, not the arithmetic: the GPT and the grouped-query
// decoder on two ranks end within 1e-5 of one process, every GPT rank in the arena fit plans.
TEST(TensorParallelMpi, SequenceParallelRanksEndWithinOneIn100000OfOneProcess) {
  expect_gpt_on_two_ranks_as_one_process("sp_gpt", "--tensor-parallel 2 --sequence-parallel");
  if (testing::kSanitized) return;  // one model is enough there
  expect_llama_on_two_ranks_as_one_process("sp_llama", "--tensor-parallel 2 --sequence-parallel");
}

// Four ranks: two replicas of a two-way split. ZeRO shards each slice's state over its replicas;
// every stage ends with the same parameters (gathered whole), in the arena fit plans for four
// devices. Under the sanitizers (each run several times slower) stage 3 alone: every sharded
// collective, in both groups.
TEST(TensorParallelMpi, ReplicasOfTheSlicesEndWithTheSameParametersAtEveryZeroStage) {
  const std::string shape = "--model gpt --batch 4 --seq 16 --vocab 97";
  std::string digest;
  for (int zero = testing::kSanitized ? 3 : 0; zero <= 3; ++zero) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const std::string flags = shape + " --tensor-parallel 2 --zero " + std::to_string(zero);
    const nlohmann::json out = train_json(mpirun(4), flags + " --steps 2 --data " + files().text);
    EXPECT_EQ(out["world"], 4);
    EXPECT_EQ(out["data_parallel"], 2);
    const nlohmann::json fit = fit_json(flags + " --devices 4");
    ASSERT_EQ(out["ranks"].size(), 4u) << out.dump();
    for (const auto& rank : out["ranks"]) {
      EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << "fit and train disagree";
      EXPECT_EQ(rank["device_allocations_during_steps"], 0);
    }
    if (digest.empty()) {
      digest = out["params_sha256"];
    } else {
      EXPECT_EQ(out["params_sha256"], digest) << "differs from ZeRO-0";
    }
  }
}

// Periodic checkpoints hold every rank's slices: a run stopped after step 2 and started again
// ends with the parameters of the run never stopped.
TEST(TensorParallelMpi, ARunResumedFromItsCheckpointEndsAsTheUninterruptedOne) {
  const std::string args = "--model gpt --batch 4 --seq 16 --tensor-parallel 2 --data " + files().text;
  const std::string dir = files().dir + "/checkpoints";
  std::filesystem::remove_all(dir);
  const nlohmann::json whole = train_json(mpirun(2), args + " --steps 4");
  train_json(mpirun(2), args + " --steps 2 --save-dir " + dir + " --save-every 2");
  const nlohmann::json resumed = train_json(mpirun(2), args + " --steps 4 --save-dir " + dir + " --save-every 2");
  ASSERT_TRUE(resumed.contains("checkpoints")) << resumed.dump();
  EXPECT_EQ(resumed["checkpoints"]["resumed_at_step"], 2);
  EXPECT_EQ(resumed["params_sha256"], whole["params_sha256"]);
}

TEST(TensorParallelCli, RanksThatCannotSplitAreUsageErrorsThatSayWhatWorks) {
  // One process cannot split a layer.
  auto r = run_cli("train --model gpt --batch 4 --seq 16 --steps 1 --tensor-parallel 2 --data " + files().text);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("mpirun -np 2"), std::string::npos) << r.output;
  // Devices that do not make whole replicas.
  r = run_cli("fit --model gpt --devices 3 --tensor-parallel 2 --device-memory 80GiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not a multiple of --tensor-parallel 2"), std::string::npos) << r.output;
  // Heads that do not divide.
  r = run_cli("fit --model gpt --tensor-parallel 8 --device-memory 80GiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("heads"), std::string::npos) << r.output;
  // Sequence parallelism without tensor parallelism has nothing to split.
  r = run_cli("fit --model gpt --sequence-parallel --device-memory 80GiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tensor-parallel"), std::string::npos) << r.output;
  r = run_cli("train --model gpt --batch 4 --seq 16 --steps 1 --sequence-parallel --data " + files().text);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tensor-parallel"), std::string::npos) << r.output;
  // Token rows that do not split between the ranks.
  r = run_cli("fit --model gpt --batch 1 --seq 15 --tensor-parallel 2 --sequence-parallel --device-memory 80GiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("token rows"), std::string::npos) << r.output;
  // Models without attention or MLP layers.
  r = run_cli("fit --model cnn --tensor-parallel 2 --device-memory 80GiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("decoders"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace memplan
