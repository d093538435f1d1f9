// `memplan train` across processes: two ranks under Open MPI's mpirun (as root where CI runs, with
// more ranks than cores allowed) train the MLP, the CNN and the GPT at every ZeRO stage. Checked:
// every stage ends with the same parameters (params_sha256), every rank allocates nothing during
// steps and allocates the arena `fit --devices 2` plans, and two ranks end where one process on
// the same global batch does (within 1e-5 relative; the reduction order differs), batch norm's
// statistics included.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/runtime/safetensors.h"
#include "tests/cli_util.h"
#include "tests/rank_runs.h"

namespace memplan {
namespace {

using testing::run_cli;
using testing::run_cli_with_env;

using testing::mpirun;

// Small data so a run takes well under a second: a Fashion-MNIST in IDX format (uncompressed;
// the reader takes both) with 64 training and 32 test images, and a text of exactly 96 distinct
// characters (fit plans it with --vocab 96, so it plans the step `train` runs).
void write_be32(std::ofstream& f, std::uint32_t v) {
  const unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                              static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
  f.write(reinterpret_cast<const char*>(b), 4);
}

void write_idx(const std::string& dir, const std::string& prefix, std::uint32_t count) {
  std::ofstream images(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary);
  write_be32(images, 0x00000803);
  write_be32(images, count);
  write_be32(images, 28);
  write_be32(images, 28);
  for (std::uint32_t i = 0; i < count * 28 * 28; ++i) images.put(static_cast<char>((i * 2654435761u) >> 24));
  std::ofstream labels(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary);
  write_be32(labels, 0x00000801);
  write_be32(labels, count);
  for (std::uint32_t i = 0; i < count; ++i) labels.put(static_cast<char>(i % 10));
}

struct SmallData {
  std::string images, text;
};

const SmallData& small_data() {
  static const SmallData data = [] {
    SmallData d;
    // One set per test process: ctest runs these tests side by side, and a file rewritten while
    // another process's ranks read it makes both fail.
    const std::string dir = ::testing::TempDir() + "/dp_data_" + std::to_string(::getpid());
    d.images = dir + "/fashion_mnist";
    std::filesystem::create_directories(d.images);
    write_idx(d.images, "train", 64);
    write_idx(d.images, "t10k", 32);
    d.text = dir + "/text.txt";
    std::ofstream text(d.text, std::ios::binary);
    for (int line = 0; line < 40; ++line) {
      for (int c = 32; c < 127; ++c) text.put(static_cast<char>(32 + (c * (line + 3)) % 95));
      text.put('\n');
    }
    return d;
  }();
  return data;
}

struct Model {
  const char* name;
  const char* shape;  // what fit and train share
  const char* flags;  // train only: a few steps
  bool text = false;
};

const Model kMlp{"mlp", "--model mlp --hidden 32 --batch 16", "--steps 3"};
const Model kCnn{"cnn", "--model cnn --batch 8", "--steps 2"};
const Model kGpt{"gpt", "--model gpt --batch 4 --seq 16 --vocab 96", "--steps 3", true};

void PrintTo(const Model& m, std::ostream* os) { *os << m.name; }

std::string data_flag(const Model& m) { return " --data " + (m.text ? small_data().text : small_data().images); }

nlohmann::json train_json(const std::string& launcher, const std::string& args) {
  return testing::json_run(launcher, "train --json --quiet --threads 1 " + args);
}

class StagesAgree : public ::testing::TestWithParam<Model> {};

// Every stage ends with the same parameters, no rank allocates during steps, and the arena
// `fit --devices 2 --zero S` plans for one rank is the one every rank of the run allocates (one
// plan_step for both).
TEST_P(StagesAgree, EveryStageEndsWithTheSameParametersInTheArenaFitPlans) {
  const Model& m = GetParam();
  std::string digest;
  std::int64_t arena0 = 0;
  // Under the sanitizers stages 0 and 3 (the all-reduce and every sharded collective); the normal
  // build runs all four.
  for (int zero = 0; zero <= 3; zero += testing::kSanitized ? 3 : 1) {
    const std::string dp = " --zero " + std::to_string(zero);
    const auto fit_run = run_cli("fit " + std::string(m.shape) + dp + " --devices 2 --device cpu --device-memory 1TiB --json", false);
    ASSERT_EQ(fit_run.exit_code, 0) << fit_run.output;
    const nlohmann::json fit = nlohmann::json::parse(fit_run.output);
    EXPECT_EQ(fit["devices"], 2);
    EXPECT_TRUE(fit["breakdown"].contains("communication"));
    const nlohmann::json out = train_json(mpirun(2), std::string(m.shape) + " " + m.flags + data_flag(m) + dp);
    ASSERT_TRUE(out.contains("ranks")) << out.dump();
    EXPECT_EQ(out["world"], 2);
    EXPECT_EQ(out["zero"], zero);
    ASSERT_EQ(out["ranks"].size(), 2u);
    for (const auto& rank : out["ranks"]) {
      EXPECT_EQ(rank["device_allocations_during_steps"], 0) << "zero " << zero << ": " << rank.dump();
      EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << m.name << " zero " << zero << ": fit and train disagree";
    }
    EXPECT_EQ(out["device_bytes_at_setup"], out["arena_bytes"]) << "rank 0 allocates exactly its arena";
    if (zero == 0) {
      digest = out["params_sha256"];
      arena0 = out["arena_bytes"];
    } else {
      EXPECT_EQ(out["params_sha256"], digest) << m.name << ": ZeRO-" << zero << " differs from ZeRO-0";
      // Sharding leaves less to hold per rank: the optimizer state is in every arena here.
      EXPECT_LT(out["arena_bytes"].get<std::int64_t>(), arena0) << "zero " << zero;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StagesAgree, ::testing::Values(kMlp, kCnn, kGpt),
                         [](const auto& p) { return std::string(p.param.name); });

// bf16 across ranks: gradients travel at 16 bits and are summed in f32 (all-reduce at stage 0;
// reduce-scatter, and parameters gathered at 16 bits, at stage 3: every collective between them),
// and both stages end with the same bits, in the arena fit plans, allocating nothing during steps.
TEST(DataParallelMixedPrecision, Bf16StagesEndWithTheSameParametersInTheArenaFitPlans) {
  for (const Model& m : {kMlp, kGpt}) {
    std::string digest;
    for (int zero : {0, 3}) {
      const std::string args = std::string(m.shape) + " --dtype bf16 --zero " + std::to_string(zero);
      const auto fit_run = run_cli("fit " + args + " --devices 2 --device cpu --device-memory 1TiB --json", false);
      ASSERT_EQ(fit_run.exit_code, 0) << fit_run.output;
      const nlohmann::json fit = nlohmann::json::parse(fit_run.output);
      const nlohmann::json out = train_json(mpirun(2), args + " " + m.flags + data_flag(m));
      ASSERT_EQ(out["ranks"].size(), 2u) << out.dump();
      EXPECT_EQ(out["dtype"], "bf16");
      for (const auto& rank : out["ranks"]) {
        EXPECT_EQ(rank["device_allocations_during_steps"], 0) << m.name << " zero " << zero;
        EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << m.name << " zero " << zero << ": fit and train disagree";
      }
      if (digest.empty()) {
        digest = out["params_sha256"];
      } else {
        EXPECT_EQ(out["params_sha256"], digest) << m.name << ": bf16 ZeRO-" << zero << " differs from ZeRO-0";
      }
    }
  }
}

// Activation checkpointing on every rank's step: recomputation changes no bit at any stage (at
// ZeRO-3 a recomputed layer gathers its parameters again, a collective in the backward), the
// arena is the one fit plans for the same flags, and the least arena (optimal) is smaller than
// without checkpointing.
// Optimizer offload under ranks (graph::offload_optimizer): each rank's shard of the state in its
// host region, updated there; the bits of the run without it at stages 1 and 3 (bf16: master
// copies offloaded too), every rank in the arena and host region fit plans. Under the sanitizers
// stage 3 only (every sharded collective).
TEST(DataParallelOffload, ShardedStateInHostMemoryGivesTheSameBits) {
  for (int zero = testing::kSanitized ? 3 : 1; zero <= 3; zero += 2) {
    const std::string args = std::string(kGpt.shape) + " --dtype bf16 --zero " + std::to_string(zero);
    const nlohmann::json without = train_json(mpirun(2), args + " " + kGpt.flags + data_flag(kGpt));
    const nlohmann::json with = train_json(mpirun(2), args + " --offload-optimizer " + kGpt.flags + data_flag(kGpt));
    EXPECT_EQ(with["params_sha256"], without["params_sha256"]) << "zero " << zero;
    const auto fit_run = run_cli("fit " + args + " --offload-optimizer --devices 2 --device cpu --device-memory 1TiB --json", false);
    ASSERT_EQ(fit_run.exit_code, 0) << fit_run.output;
    const nlohmann::json fit = nlohmann::json::parse(fit_run.output);
    EXPECT_EQ(with["host_bytes"], fit["host_bytes"]) << "zero " << zero;
    ASSERT_EQ(with["ranks"].size(), 2u) << with.dump();
    for (const auto& rank : with["ranks"]) {
      EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << "zero " << zero;
      EXPECT_EQ(rank["device_allocations_during_steps"], 0) << "zero " << zero;
    }
  }
}

TEST(DataParallelCheckpointing, EveryStageAndStrategyEndsWithTheSameParametersInTheArenaFitPlans) {
  // Sequences long enough for activations, not the optimizer's state, to set the peak.
  const Model gpt{"gpt", "--model gpt --batch 8 --seq 64 --vocab 96", "--steps 2", true};
  // Under the sanitizers (every run several times slower) the GPT alone, at stage 0 with optimal
  // and stage 3 with sqrt.
  const std::vector<Model> models = testing::kSanitized ? std::vector<Model>{gpt} : std::vector<Model>{gpt, kCnn};
  const std::vector<int> stages = testing::kSanitized ? std::vector<int>{0, 3} : std::vector<int>{0, 2, 3};
  for (const Model& m : models) {
    for (int zero : stages) {
      const std::string dp = std::string(m.shape) + " --zero " + std::to_string(zero);
      const nlohmann::json plain = train_json(mpirun(2), dp + " " + m.flags + data_flag(m));
      for (const char* strategy : {"sqrt", "optimal"}) {
        if (testing::kSanitized && (std::string(strategy) == "sqrt") != (zero == 3)) continue;
        SCOPED_TRACE(std::string(m.name) + " zero " + std::to_string(zero) + " --checkpoint " + strategy);
        const std::string args = dp + " --checkpoint " + strategy;
        const nlohmann::json out = train_json(mpirun(2), args + " " + m.flags + data_flag(m));
        ASSERT_EQ(out["ranks"].size(), 2u) << out.dump();
        EXPECT_EQ(out["params_sha256"], plain["params_sha256"]) << "recomputation changed the result";
        ASSERT_TRUE(out.contains("checkpoint")) << out.dump();
        EXPECT_GT(out["checkpoint"]["recompute_ops"].get<int>(), 0);
        // optimal (no budget: the least arena) saves; sqrt's evenly spaced segments need not here
        // (the loss's all-reduce adds stages to the chain, and a segment then spans both layers).
        if (std::string(strategy) == "optimal") {
          EXPECT_LT(out["arena_bytes"].get<std::int64_t>(), plain["arena_bytes"].get<std::int64_t>());
        } else {
          EXPECT_LE(out["arena_bytes"].get<std::int64_t>(), plain["arena_bytes"].get<std::int64_t>());
        }
        for (const auto& rank : out["ranks"]) EXPECT_EQ(rank["device_allocations_during_steps"], 0);
        if (std::string(strategy) == "sqrt") {  // budget-free: fit plans the same step
          const auto fit_run = run_cli("fit " + args + " --devices 2 --device cpu --device-memory 1TiB --json", false);
          ASSERT_EQ(fit_run.exit_code, 0) << fit_run.output;
          const nlohmann::json fit = nlohmann::json::parse(fit_run.output);
          for (const auto& rank : out["ranks"]) EXPECT_EQ(rank["arena_bytes"], fit["arena_bytes"]) << "fit and train disagree";
        }
      }
    }
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Two ranks on the global batch end where one process does. The CNN's batch normalisation is
// synchronised (statistics and their backward sums over both ranks' samples), so it too follows
// one process's trajectory, running statistics included.
class OneProcessAgrees : public ::testing::TestWithParam<Model> {};

TEST_P(OneProcessAgrees, TwoRanksEndWithinOneIn100000OfOneProcess) {
  const Model& m = GetParam();
  const std::string dir = ::testing::TempDir();
  const std::string one = dir + "/dp_one_" + m.name + ".safetensors";
  const std::string two = dir + "/dp_two_" + m.name + ".safetensors";
  // Plain SGD: an update proportional to the gradient keeps the reduction-order rounding as small
  // as it is. AdamW divides each gradient by its own running magnitude, so a gradient that is
  // rounding noise (the attention keys' bias: zero in exact arithmetic) takes +-lr steps whose
  // sign the summation order decides; that is AdamW's arithmetic, not data parallelism's.
  const std::string args = std::string(m.shape) + " " + m.flags + data_flag(m) + " --optimizer sgd";
  train_json("", args + " --device cpu --save " + one);
  train_json(mpirun(2), args + " --zero 0 --save " + two);
  const std::string a_bytes = read_file(one), b_bytes = read_file(two);
  auto a = runtime::parse_safetensors(a_bytes, one);
  auto b = runtime::parse_safetensors(b_bytes, two);
  ASSERT_TRUE(a && b);
  // Relative to each tensor, and to the whole parameter vector. The attention keys' bias is
  // checked in the whole only: its exact gradient is zero (softmax ignores a shift shared by a
  // row), so what it holds is rounding noise whose bits the summation order decides.
  int compared = 0;
  double diff = 0.0, norm = 0.0;
  for (const runtime::SafetensorsEntry& ta : a.value().tensors) {
    const runtime::SafetensorsEntry* tb = b.value().find(ta.name);
    ASSERT_NE(tb, nullptr) << ta.name;
    ASSERT_EQ(ta.data.size(), tb->data.size()) << ta.name;
    if (ta.name.find(".adam_") != std::string::npos) continue;  // parameters only
    const auto n = ta.data.size() / sizeof(float);
    std::vector<float> x(n), y(n);
    std::memcpy(x.data(), ta.data.data(), ta.data.size());
    std::memcpy(y.data(), tb->data.data(), tb->data.size());
    double tensor_diff = 0.0, tensor_norm = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      tensor_diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      tensor_norm += double(x[i]) * x[i];
    }
    if (ta.name.find(".k.bias") == std::string::npos) {
      EXPECT_LE(std::sqrt(tensor_diff), 1e-5 * std::sqrt(tensor_norm)) << m.name << ": " << ta.name;
    }
    diff += tensor_diff;
    norm += tensor_norm;
    ++compared;
  }
  EXPECT_GE(compared, 4);
  EXPECT_GT(diff, 0.0) << "the reduction order differs, so some bits should too: is the second run distributed?";
  EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm));
}

INSTANTIATE_TEST_SUITE_P(Models, OneProcessAgrees, ::testing::Values(kMlp, kCnn, kGpt),
                         [](const auto& p) { return std::string(p.param.name); });

TEST(DataParallelCli, AGlobalBatchThatDoesNotDivideIsAUsageError) {
  const auto r = run_cli_with_env(mpirun(2), "train --quiet --model mlp --hidden 8 --batch 5 --steps 1" + data_flag(kMlp));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("multiple of 2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace memplan
