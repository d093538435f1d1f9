// 8-bit AdamW (graph/optimizer.h, kernels/shared/optimizers.h) against bitsandbytes' published
// algorithm, written out here: its two dynamic maps (create_dynamic_map, computed as torch
// computes them, in f32), one block-wise update after another from a reference that dequantizes,
// updates in double and searches the map linearly, the states counted to the byte on Llama-2-7B,
// and training on the CPU (fit's arena, no allocations during steps, the same bits in every mode,
// resumed exactly).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/graph/optimizer.h"
#include "memplan/kernels/kernel.h"
#include "memplan/kernels/shared/quant.h"

namespace memplan::adam8bit_test {
namespace {

using graph::DType;
using graph::OpKind;
using testing::run_cli;

// torch.linspace(start, end, steps) in f32: start + step * i below the halfway point, end - step *
// (steps - 1 - i) from it, step = (end - start) / (steps - 1) in f32.
std::vector<float> linspace_f32(float start, float end, int steps) {
  const float step = (end - start) / static_cast<float>(steps - 1);
  std::vector<float> out(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    out[static_cast<std::size_t>(i)] = i < steps / 2 ? start + step * static_cast<float>(i)
                                                     : end - step * static_cast<float>(steps - 1 - i);
  }
  return out;
}

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for each decade i
// of 7, the midpoints of linspace(0.1, 1, 2^i + 1) (signed, with their negatives) or of
// linspace(0.1, 1, 2^(i+1) + 1) (unsigned), times 10^(i-6); then 0 and 1; sorted.
std::vector<float> dynamic_map(bool is_signed) {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    const std::vector<float> b = linspace_f32(0.1f, 1.0f, items);
    const float scale = static_cast<float>(std::pow(10.0, i - 6));
    for (std::size_t k = 0; k + 1 < b.size(); ++k) {
      const float mean = (b[k] + b[k + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return data;
}

TEST(Adam8bit, TheDynamicMapsAreBitsandbytes) {
  for (const bool is_signed : {true, false}) {
    const std::vector<float> ref = dynamic_map(is_signed);
    ASSERT_EQ(ref.size(), 256u);
    for (unsigned code = 0; code < 256; ++code) {
      const float v = kernels::dynamic_map_value(code, is_signed);
      EXPECT_NEAR(v, ref[code], 3e-7 * std::fabs(ref[code])) << (is_signed ? "signed" : "unsigned") << " code " << code;
      if (code > 0) {
        EXPECT_GT(v, kernels::dynamic_map_value(code - 1, is_signed)) << "ascending, no value twice";
      }
    }
  }
  // Values from the definition by hand: the smallest positives (decade 0's midpoints: 0.55 signed,
  // 0.325 unsigned, times 1e-6) and the largest below 1 (decade 6: 1 - 0.9 / 64 / 2 and / 128 / 2).
  EXPECT_FLOAT_EQ(kernels::dynamic_map_value(128, true), 5.5e-7f);
  EXPECT_FLOAT_EQ(kernels::dynamic_map_value(126, true), -5.5e-7f);
  EXPECT_EQ(kernels::dynamic_map_value(127, true), 0.0f);
  EXPECT_FLOAT_EQ(kernels::dynamic_map_value(254, true), 0.99296875f);
  EXPECT_EQ(kernels::dynamic_map_value(0, true), -kernels::dynamic_map_value(254, true));
  EXPECT_FLOAT_EQ(kernels::dynamic_map_value(1, false), 3.25e-7f);
  EXPECT_FLOAT_EQ(kernels::dynamic_map_value(254, false), 0.996484375f);
  EXPECT_EQ(kernels::dynamic_map_value(0, false), 0.0f);
  EXPECT_EQ(kernels::dynamic_map_value(255, false), 1.0f);
}

// The reference state of one parameter, and bitsandbytes' block-wise step on it in double.
struct State {
  std::vector<float> p;
  std::vector<std::uint8_t> m_codes, v_codes;
  std::vector<float> m_absmax, v_absmax;
};

unsigned nearest_by_scan(const std::vector<float>& map, double x) {
  unsigned best = 0;
  for (unsigned c = 1; c < 256; ++c) {
    if (std::fabs(double(map[c]) - x) < std::fabs(double(map[best]) - x)) best = c;
  }
  return best;
}

void reference_step(State& s, const std::vector<float>& g, int t, const graph::OpAttrs& a) {
  const std::vector<float> signed_map = dynamic_map(true), unsigned_map = dynamic_map(false);
  const double c1 = 1.0 - std::pow(double(a.beta1), t), c2 = std::sqrt(1.0 - std::pow(double(a.beta2), t));
  const std::size_t n = s.p.size();
  for (std::size_t begin = 0; begin < n; begin += 256) {
    const std::size_t end = std::min(n, begin + 256), b = begin / 256;
    std::vector<double> m(end - begin), v(end - begin);
    double m_max = 0.0, v_max = 0.0;
    for (std::size_t i = begin; i < end; ++i) {
      const double gi = g[i];
      m[i - begin] = a.beta1 * double(signed_map[s.m_codes[i]]) * s.m_absmax[b] + (1.0 - a.beta1) * gi;
      v[i - begin] = a.beta2 * double(unsigned_map[s.v_codes[i]]) * s.v_absmax[b] + (1.0 - a.beta2) * gi * gi;
      m_max = std::max(m_max, std::fabs(m[i - begin]));
      v_max = std::max(v_max, v[i - begin]);
    }
    s.m_absmax[b] = static_cast<float>(m_max);
    s.v_absmax[b] = static_cast<float>(v_max);
    for (std::size_t i = begin; i < end; ++i) {
      const double mi = m[i - begin], vi = v[i - begin];
      double p = s.p[i] - double(a.lr) * c2 / c1 * mi / (std::sqrt(vi) + double(a.eps) * c2);
      p *= 1.0 - double(a.lr) * double(a.weight_decay);
      s.p[i] = static_cast<float>(p);
      // A block of zeros: bitsandbytes divides 0 by 0 there; memplan stores the codes of 0, whose
      // value is 0 under the block's absmax of 0 whichever code it is.
      s.m_codes[i] = static_cast<std::uint8_t>(nearest_by_scan(signed_map, m_max > 0.0 ? mi / m_max : 0.0));
      s.v_codes[i] = static_cast<std::uint8_t>(nearest_by_scan(unsigned_map, v_max > 0.0 ? vi / v_max : 0.0));
    }
  }
}

// memplan's CPU kernel for the same step (adamw8bit_update: param, codes, absmax in place).
void kernel_step(State& s, std::vector<float>& g, int t, const graph::OpAttrs& a) {
  const std::int64_t n = static_cast<std::int64_t>(s.p.size());
  const graph::Shape shape{n}, blocks{(n + 255) / 256};
  const std::vector<kernels::TensorRef> in{{g.data(), &shape, DType::f32}};
  const std::vector<kernels::TensorRef> up{{s.p.data(), &shape, DType::f32},
                                           {s.m_codes.data(), &shape, DType::u8},
                                           {s.v_codes.data(), &shape, DType::u8},
                                           {s.m_absmax.data(), &blocks, DType::f32},
                                           {s.v_absmax.data(), &blocks, DType::f32}};
  const kernels::KernelFn fn = kernels::find_kernel(OpKind::adamw8bit_update, kernels::DeviceKind::cpu);
  ASSERT_NE(fn, nullptr);
  kernels::KernelCall call{OpKind::adamw8bit_update, &a, in, {}, up};
  call.step = t;
  fn(call);
}

void expect_same_state(const State& kernel, const State& ref, int t) {
  ASSERT_EQ(kernel.m_codes.size(), ref.m_codes.size());
  int code_mismatches = 0;
  for (std::size_t i = 0; i < ref.p.size(); ++i) {
    EXPECT_NEAR(kernel.p[i], ref.p[i], 2e-6 * std::max(1.0f, std::fabs(ref.p[i]))) << "step " << t << " element " << i;
    code_mismatches += kernel.m_codes[i] != ref.m_codes[i] || kernel.v_codes[i] != ref.v_codes[i];
  }
  EXPECT_EQ(code_mismatches, 0) << "step " << t << ": codes differ from the nearest map values";
  for (std::size_t b = 0; b < ref.m_absmax.size(); ++b) {
    EXPECT_NEAR(kernel.m_absmax[b], ref.m_absmax[b], 1e-6 * ref.m_absmax[b]) << "step " << t << " block " << b;
    EXPECT_NEAR(kernel.v_absmax[b], ref.v_absmax[b], 1e-6 * ref.v_absmax[b]) << "step " << t << " block " << b;
  }
}

// Three steps from zero states on 5,000 elements (a last block of 136), weight decay on: the
// first quantizes the moments, the later ones dequantize them, so codes, absmax and parameters
// all carry from step to step.
TEST(Adam8bit, BlockwiseStepsMatchThePublishedAlgorithm) {
  constexpr std::size_t n = 5000;
  graph::OpAttrs a;
  a.lr = 1e-2f;
  a.beta1 = 0.9f;
  a.beta2 = 0.999f;
  a.eps = 1e-8f;
  a.weight_decay = 0.01f;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State ref;
  for (std::size_t i = 0; i < n; ++i) ref.p.push_back(normal(rng));
  ref.m_codes.assign(n, 0);
  ref.v_codes.assign(n, 0);
  ref.m_absmax.assign((n + 255) / 256, 0.0f);
  ref.v_absmax.assign((n + 255) / 256, 0.0f);
  State mine = ref;
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> g(n);
    // Gradients of different scales per block, one block all zero: its absmax stays 0.
    for (std::size_t i = 0; i < n; ++i) g[i] = (i / 256 == 3) ? 0.0f : normal(rng) * std::pow(10.0f, float(i / 256 % 5) - 3.0f);
    reference_step(ref, g, t, a);
    kernel_step(mine, g, t, a);
    expect_same_state(mine, ref, t);
  }
  EXPECT_EQ(mine.m_absmax[3], 0.0f);
  EXPECT_EQ(mine.m_codes[3 * 256], 127) << "a zero block keeps the zero code";
  // The moments are stored in 8 bits but the step itself used f32 moments: the parameters moved.
  EXPECT_NE(mine.p[0], ref.p[0] + 1.0f);
}

nlohmann::json json_of(const std::string& args) {
  const auto r = run_cli(args, false);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return nlohmann::json::parse(r.output);
}

// Llama-2-7B's parameters, each its element count: embedding and head [32000, 4096]; per layer of
// 32 q, k, v, o [4096, 4096], gate, up, down 4096 x 11008, two norms [4096]; a final norm.
std::vector<std::int64_t> llama2_7b_parameters() {
  std::vector<std::int64_t> out{32000 * 4096, 32000 * 4096, 4096};
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) out.push_back(4096 * 4096);
    for (int i = 0; i < 3; ++i) out.push_back(4096 * 11008);
    out.push_back(4096);
    out.push_back(4096);
  }
  return out;
}

// Each parameter of at least 4,096 elements keeps 2 bytes an element (m and v codes) and an f32
// absmax per block of 256 for each; the paged optimizer moves the codes of those of 100,000 or
// more to host memory. fit's breakdown states these bytes exactly.
TEST(Adam8bit, StatesAreCountedToTheByte) {
  const std::string fit = "fit --model llama2-7b --dtype bf16 --batch 1 --seq 64 --device-memory 400GiB --json --optimizer ";
  Bytes codes = 0, absmax = 0, paged = 0, params = 0;
  for (const std::int64_t n : llama2_7b_parameters()) {
    ASSERT_GE(n, graph::kAdam8bitMinElements);
    codes += 2 * n;
    absmax += 2 * 4 * ((n + 255) / 256);
    paged += n >= 100000 ? 2 * n : 0;
    params += n;
  }
  ASSERT_EQ(params, 6738415616);
  const auto adamw = json_of(fit + "adamw");
  const auto eight = json_of(fit + "adamw8bit");
  const auto paged_run = json_of(fit + "paged_adamw8bit");
  EXPECT_EQ(adamw["breakdown"]["optimizer_state"], 8 * params);
  EXPECT_EQ(eight["breakdown"]["optimizer_state"], codes + absmax);
  EXPECT_EQ(eight["breakdown"]["optimizer_8bit"]["code_bytes"], codes);
  EXPECT_EQ(eight["breakdown"]["optimizer_8bit"]["absmax_bytes"], absmax);
  EXPECT_EQ(eight["breakdown"]["optimizer_8bit"]["f32_tensors"], 0);
  EXPECT_EQ(eight["breakdown"]["master_weights"], adamw["breakdown"]["master_weights"]) << "the fp32 master stays";
  // The arena starts every buffer at a multiple of 256 bytes: a norm's absmax (16 blocks, 64 bytes)
  // takes 256 there.
  Bytes absmax_padding = 0;
  for (const std::int64_t n : llama2_7b_parameters()) {
    const Bytes bytes = 4 * ((n + 255) / 256);
    absmax_padding += 2 * ((bytes + 255) / 256 * 256 - bytes);
  }
  EXPECT_EQ(absmax_padding, 65 * 2 * (256 - 64));
  EXPECT_EQ(adamw["total_bytes"].get<Bytes>() - eight["total_bytes"].get<Bytes>(), 8 * params - codes - absmax - absmax_padding);
  EXPECT_EQ(paged_run["breakdown"]["optimizer_8bit"]["paged_host_bytes"], paged);
  EXPECT_EQ(paged_run["host_bytes"], paged);
  EXPECT_EQ(paged_run["breakdown"]["optimizer_state"], codes - paged + absmax) << "the device keeps the rest";
}

// The reference GPT's biases and norms (128 elements) are under 4,096: they keep f32 moments.
TEST(Adam8bit, SmallParametersKeepF32States) {
  const auto r = json_of("fit --model gpt --batch 4 --device cpu --device-memory 1GiB --optimizer adamw8bit --json");
  const auto& e = r["breakdown"]["optimizer_8bit"];
  EXPECT_GT(e["f32_tensors"].get<int>(), 0);
  EXPECT_GT(e["quantized_tensors"].get<int>(), 0);
  EXPECT_EQ(r["breakdown"]["optimizer_state"].get<Bytes>(),
            e["code_bytes"].get<Bytes>() + e["absmax_bytes"].get<Bytes>() + e["f32_state_bytes"].get<Bytes>());
  const auto text = run_cli("fit --model gpt --batch 4 --device cpu --device-memory 1GiB --optimizer adamw8bit", false);
  EXPECT_NE(text.output.find("8-bit moments (u8,"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("tensors under 4,096)"), std::string::npos) << text.output;
}

// fit --suggest --allow 8bit plans the step as asked with 8-bit moments, with the levers that fit
// it, and its figure is fit's for --optimizer adamw8bit.
TEST(Adam8bit, SuggestPlansTheEightBitRecipeWhenAllowed) {
  const auto j = json_of("fit --model gpt2 --batch 4 --seq 256 --device-memory 4GiB --suggest --allow 8bit --json");
  ASSERT_TRUE(j.contains("fine_tuning_recipes")) << j.dump();
  const auto& recipes = j["fine_tuning_recipes"];
  ASSERT_EQ(recipes.size(), 1u);
  EXPECT_EQ(recipes[0]["recipe"], "--optimizer adamw8bit");
  ASSERT_TRUE(recipes[0]["fits"].get<bool>()) << recipes.dump();
  const auto eight = json_of("fit --model gpt2 --batch 4 --seq 256 --device-memory 4GiB --optimizer adamw8bit --json");
  EXPECT_EQ(recipes[0]["best"]["total_bytes"], eight["total_bytes"]);
  ASSERT_TRUE(j["fits"].get<bool>());
  EXPECT_GT(recipes[0]["saved_bytes"].get<Bytes>(), 0);
  // Already 8-bit: nothing to propose.
  const auto asked = json_of("fit --model gpt2 --batch 4 --seq 256 --device-memory 4GiB --optimizer adamw8bit --suggest --allow 8bit --json");
  EXPECT_TRUE(asked["fine_tuning_recipes"].empty()) << asked.dump();
}

// train on the CPU: the loss falls, fit plans the arena train allocates, nothing is allocated
// during steps, and planned, naive and the paged variant give the same bits.
TEST(Adam8bit, TrainsOnTheCpuWithFitsArenaAndTheSameBitsInEveryMode) {
  const std::string run = "train --model gpt --optimizer adamw8bit --steps 30 --batch 8 --eval-samples 64 --seed 3 --json";
  const auto planned = json_of(run + " --threads 1");
  EXPECT_EQ(planned["optimizer"], "adamw8bit");
  EXPECT_EQ(planned["device_allocations_during_steps"], 0);
  EXPECT_LT(planned["final_loss"].get<double>(), planned["first_loss"].get<double>() - 0.3);
  const auto fit = json_of("fit --model gpt --optimizer adamw8bit --batch 8 --device cpu --device-memory 1GiB --json");
  EXPECT_EQ(planned["arena_bytes"], fit["arena_bytes"]);
  const auto adamw = json_of("train --model gpt --steps 30 --batch 8 --eval-samples 64 --seed 3 --threads 1 --json");
  EXPECT_NE(adamw["params_sha256"], planned["params_sha256"]) << "the 8-bit moments change the steps";
  if (testing::kSanitized) return;
  EXPECT_EQ(json_of(run + " --threads 1 --mode naive")["params_sha256"], planned["params_sha256"]);
  EXPECT_EQ(json_of(run + " --threads 2")["params_sha256"], planned["params_sha256"]) << "blocks are independent";
}

// paged_adamw8bit: the MLP's first layer [784, 512] (401,408 elements) has its codes in host
// memory, as fit counts them; the steps are adamw8bit's, bit for bit.
TEST(Adam8bit, PagedStatesLiveInHostMemoryAndStepAsOnTheDevice) {
  const std::string run = "train --model mlp --hidden 512 --steps 20 --batch 16 --seed 3 --threads 1 --json --optimizer ";
  const auto paged = json_of(run + "paged_adamw8bit");
  const auto device = json_of(run + "adamw8bit");
  const Bytes codes = 2 * 784 * 512;
  EXPECT_EQ(paged["host_bytes"], codes);
  EXPECT_FALSE(device.contains("host_bytes"));
  EXPECT_EQ(device["arena_bytes"].get<Bytes>() - paged["arena_bytes"].get<Bytes>(), codes) << "the arena holds the rest";
  EXPECT_EQ(paged["params_sha256"], device["params_sha256"]);
  EXPECT_EQ(paged["device_allocations_during_steps"], 0);
  const auto fit = json_of("fit --model mlp --hidden 512 --batch 16 --device cpu --device-memory 1GiB --json --optimizer paged_adamw8bit");
  EXPECT_EQ(fit["host_bytes"], codes);
  EXPECT_EQ(fit["arena_bytes"], paged["arena_bytes"]);
}

// bf16: the update applies to the f32 master and rounds into the bf16 working copy.
TEST(Adam8bit, TrainsInBf16WithMasterWeights) {
  const std::string run =
      "train --model gpt --dtype bf16 --optimizer adamw8bit --steps 20 --batch 8 --eval-samples 64 --seed 3 --threads 1 --json";
  const auto planned = json_of(run);
  EXPECT_EQ(planned["device_allocations_during_steps"], 0);
  EXPECT_LT(planned["final_loss"].get<double>(), planned["first_loss"].get<double>());
  if (testing::kSanitized) return;
  EXPECT_EQ(json_of(run + " --mode naive")["params_sha256"], planned["params_sha256"]);
}

// Tensor-parallel slices would each block their own 8-bit states: train refuses the pair by name.
TEST(Adam8bit, TrainRefusesTensorParallelSlices) {
  const auto r = run_cli("train --model gpt --optimizer adamw8bit --tensor-parallel 2 --steps 1", true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--optimizer adamw8bit with --tensor-parallel does not train yet"), std::string::npos) << r.output;
}

// The u8 codes and the absmax are state a checkpoint keeps: 10 steps, saved, and 10 more resumed
// give the bits of 20 uninterrupted.
TEST(Adam8bit, CheckpointsResumeExactly) {
  const auto dir = std::filesystem::temp_directory_path() / ("memplan_adam8bit_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string base = "train --model gpt --optimizer adamw8bit --batch 8 --eval-samples 16 --seed 5 --threads 1 --json";
  const auto whole = json_of(base + " --steps 20");
  const auto first = json_of(base + " --steps 10 --save-dir " + dir.string() + " --save-every 10");
  ASSERT_EQ(first["checkpoints"]["saved"].size(), 1u) << first.dump();
  const auto resumed = json_of(base + " --steps 20 --save-dir " + dir.string() + " --save-every 10");
  EXPECT_EQ(resumed["checkpoints"]["resumed_at_step"], 10);
  EXPECT_EQ(resumed["params_sha256"], whole["params_sha256"]) << "the 8-bit states were saved and loaded whole";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace memplan::adam8bit_test
