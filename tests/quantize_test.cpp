// graph/quantize.h: frozen linear weights stored as the quantization libraries lay them out,
// counted to the byte against the layouts' formulas written out here; the products dequantize in
// planned scratch and never keep a full-precision copy; only the input gets a gradient.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/graph/lora.h"
#include "memplan/graph/quantize.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/gpt.h"

namespace memplan::graph {
namespace {

// The layouts from their definitions (bitsandbytes' quantize_4bit and its nested QuantState for
// double quantization, LLM.int8's row scales, e4m3 with one scale, GPTQ/AWQ's packed int4 with a
// zero and an fp16 scale per group), for one [out, in] weight.
Bytes expected_bytes(QuantFormat f, bool dq, std::int64_t group, std::int64_t out, std::int64_t in) {
  const std::int64_t n = out * in;
  const std::int64_t blocks = (n + 63) / 64;
  switch (f) {
    case QuantFormat::nf4:
    case QuantFormat::fp4:
      return (n + 1) / 2 + (dq ? blocks + (blocks + 255) / 256 * 4 + 4 : blocks * 4);
    case QuantFormat::int8: return n + out * 4;
    case QuantFormat::fp8: return n + 4;
    case QuantFormat::gptq: return n / 2 + (in / group) * out / 2 + (in / group) * out * 2 + in * 4;
    case QuantFormat::awq: return n / 2 + (in / group) * out / 2 + (in / group) * out * 2;
    case QuantFormat::none: break;
  }
  return -1;
}

TEST(Quantize, EveryLayoutIsCountedToTheByte) {
  struct Shape2 {
    std::int64_t out, in;
  };
  for (const Shape2 s : {Shape2{11008, 4096}, Shape2{4096, 4096}, Shape2{128, 96}, Shape2{7, 18}}) {
    for (QuantFormat f : {QuantFormat::nf4, QuantFormat::fp4, QuantFormat::int8, QuantFormat::fp8, QuantFormat::gptq, QuantFormat::awq}) {
      for (bool dq : {false, true}) {
        if (dq && f != QuantFormat::nf4 && f != QuantFormat::fp4) continue;
        const std::int64_t group = s.in % 32 == 0 ? 32 : 2;
        if ((f == QuantFormat::gptq || f == QuantFormat::awq) && (s.out % 2 != 0)) continue;
        const QuantLayout layout = quant_layout(QuantConfig{f, dq, group}, s.out, s.in);
        EXPECT_EQ(layout.total(), expected_bytes(f, dq, group, s.out, s.in))
            << enum_name(kQuantFormatNames, f) << (dq ? " dq " : " ") << s.out << "x" << s.in;
      }
    }
  }
  EXPECT_THROW(quant_layout(QuantConfig{QuantFormat::gptq, false, 100}, 128, 128), GraphError);
}

Graph qlora_gpt(QuantFormat f, bool dq = false) {
  models::GptConfig c;
  c.vocab = 32;
  c.context = 16;
  Graph g = models::build_gpt(c, 2);
  LoraConfig lora;
  lora.rank = 4;
  apply_lora(g, lora);
  quantize_frozen_linears(g, QuantConfig{f, dq, 32});
  return g;
}

TEST(Quantize, FrozenLinearsKeepNoFullPrecisionWeightAndOnlyTheInputGetsAGradient) {
  Graph g = qlora_gpt(QuantFormat::nf4, true);
  // No [out, in] weight of a quantized layer is left, the adapters and the tied embedding are.
  EXPECT_EQ(g.find("h.0.attn.q.weight"), kNoTensor);
  EXPECT_NE(g.find("h.0.attn.q.weight.quant"), kNoTensor);
  EXPECT_NE(g.find("h.0.attn.q.weight.absmax2"), kNoTensor);
  EXPECT_NE(g.find("h.0.attn.q.lora_A.weight"), kNoTensor);
  EXPECT_NE(g.find("wte.weight"), kNoTensor) << "the embedding (and the tied head) stay at the working dtype";
  int products = 0;
  for (const Op& op : g.ops()) products += op.kind == OpKind::quant_matmul;
  EXPECT_EQ(products, 2 * 6) << "q, k, v, attn.proj, mlp.fc, mlp.proj in 2 layers";
  make_training_step(g, OptimizerConfig{});
  int backward = 0;
  for (const Op& op : g.ops()) {
    if (op.kind != OpKind::quant_matmul || op.phase != Phase::backward) continue;
    ++backward;
    EXPECT_FALSE(op.attrs.trans_b) << "the input's gradient dy W";
  }
  EXPECT_GT(backward, 0);
  for (TensorId p : g.parameters()) {
    const TensorDesc& d = g.tensor(p);
    EXPECT_EQ(d.grad == kNoTensor, d.frozen) << d.name;
  }
  // Every tensor the products read or make is an activation, a gradient or a storage tensor: no
  // dequantized [out, in] weight lives in the graph (it exists only in the op's scratch).
  for (const TensorDesc& t : g.tensors()) {
    if (t.role == Role::activation || t.role == Role::gradient) {
      EXPECT_FALSE(t.shape == Shape({128, 128}) && t.name.find("weight") != std::string::npos) << t.name;
    }
  }
  // The tile the kernels dequantize into is the op's scratch: 64 rows of the weight, in f32.
  OpAttrs attrs;
  attrs.shape = {512, 128};
  const TensorDesc& x = g.tensor(g.find("x"));
  const TensorDesc* operands[] = {&x};
  EXPECT_EQ(op_info(OpKind::quant_matmul).scratch(std::span<const TensorDesc* const>(operands), attrs), 64 * 128 * 4);
}

TEST(Quantize, AppliesOnlyToFrozenLinearsAndNamesWhatWouldWork) {
  models::GptConfig c;
  c.vocab = 32;
  c.context = 16;
  Graph g = models::build_gpt(c, 2);
  try {
    quantize_frozen_linears(g, QuantConfig{QuantFormat::nf4, false, 128});
    FAIL() << "nothing frozen, nothing to quantize";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("add --lora RANK (QLoRA) or --freeze PATTERN"), std::string::npos) << e.what();
  }
  try {
    quantize_frozen_linears(g, QuantConfig{QuantFormat::int8, true, 128});
    FAIL() << "double quantization of int8";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("--double-quant applies to --quant nf4 and fp4"), std::string::npos) << e.what();
  }
}

// The question: Llama-2-7B, bf16, LoRA r8 on q and v, with nf4 and with nf4 + double
// quantization. The frozen base is the bf16 embedding, head and norms plus each linear layer's
// layout; double quantization saves 301,980,800 bytes on the linear layers (litgpt measured 0.30 GB).
TEST(Quantize, Llama2SevenBQloraBasesAreTheLayoutFormula) {
  const std::string fit = "fit --model llama2-7b --dtype bf16 --lora 8 --lora-targets q,v --batch 1 --seq 512 --device-memory 40GiB --json";
  auto run = [&](const std::string& extra) {
    const auto r = testing::run_cli(fit + extra, false);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  };
  const auto lora = run(""), nf4 = run(" --quant nf4"), dq = run(" --quant nf4 --double-quant");
  // Llama-2-7B: 32 layers of q, k, v, o [4096, 4096] and gate, up [11008, 4096], down [4096, 11008].
  Bytes linear_bf16 = 0, linear_nf4 = 0, linear_dq = 0;
  for (int layer = 0; layer < 32; ++layer) {
    for (auto [out, in] : {std::pair{4096, 4096}, {4096, 4096}, {4096, 4096}, {4096, 4096}, {11008, 4096}, {11008, 4096}, {4096, 11008}}) {
      linear_bf16 += std::int64_t{out} * in * 2;
      linear_nf4 += expected_bytes(QuantFormat::nf4, false, 0, out, in);
      linear_dq += expected_bytes(QuantFormat::nf4, true, 0, out, in);
    }
  }
  const Bytes base = lora["breakdown"]["frozen_parameters"];
  EXPECT_EQ(nf4["breakdown"]["frozen_parameters"].get<Bytes>(), base - linear_bf16 + linear_nf4);
  EXPECT_EQ(dq["breakdown"]["frozen_parameters"].get<Bytes>(), base - linear_bf16 + linear_dq);
  EXPECT_EQ(linear_nf4 - linear_dq, 301980800);
  EXPECT_EQ(nf4["breakdown"]["frozen_parameters"].get<Bytes>() - dq["breakdown"]["frozen_parameters"].get<Bytes>(), 301980800);
  EXPECT_EQ(nf4["quantized"]["quantized_layers"], 224);
  EXPECT_EQ(nf4["quantized"]["full_precision_bytes"], linear_bf16);
  // What trains is the same in all three.
  EXPECT_EQ(nf4["breakdown"]["optimizer_state"], lora["breakdown"]["optimizer_state"]);
  EXPECT_LT(dq["total_bytes"].get<Bytes>(), nf4["total_bytes"].get<Bytes>());
  EXPECT_LT(nf4["total_bytes"].get<Bytes>(), lora["total_bytes"].get<Bytes>());
}

// fit --serve with quantized weights and an 8-bit KV cache: "how many sequences of Llama-3.1-8B
// in int4 on a 24 GB card". The weights are the bf16 model with each linear layer at its layout's
// size; the KV cache one byte a value, plus int8's per-position scales or fp8's per-layer ones.
TEST(Quantize, ServingCountsQuantizedWeightsAndEightBitCaches) {
  const std::string serve = "fit --config " + std::string(MEMPLAN_CONFIG_DIR) +
                            "/llama-3.1-8b.json --serve --seq 4096 --dtype bf16 --device-memory 24GiB --json";
  auto run = [&](const std::string& extra) {
    const auto r = testing::run_cli(serve + extra, false);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  };
  const auto bf16 = run(""), gptq = run(" --quant gptq --kv-dtype int8"), awq_fp8 = run(" --quant awq --kv-dtype fp8");
  Bytes linear_bf16 = 0, linear_gptq = 0, linear_awq = 0;
  for (int layer = 0; layer < 32; ++layer) {
    for (auto [out, in] : {std::pair{4096, 4096}, {1024, 4096}, {1024, 4096}, {4096, 4096}, {14336, 4096}, {14336, 4096}, {4096, 14336}}) {
      linear_bf16 += std::int64_t{out} * in * 2;
      linear_gptq += expected_bytes(QuantFormat::gptq, false, 128, out, in);
      linear_awq += expected_bytes(QuantFormat::awq, false, 128, out, in);
    }
  }
  const Bytes weights = bf16["breakdown"]["weights"];
  EXPECT_EQ(gptq["breakdown"]["weights"].get<Bytes>(), weights - linear_bf16 + linear_gptq);
  EXPECT_EQ(awq_fp8["breakdown"]["weights"].get<Bytes>(), weights - linear_bf16 + linear_awq);
  // Keys and values of a position: 32 layers x 8 K/V heads x 128 channels, twice.
  EXPECT_EQ(bf16["kv_bytes_per_token"], 32 * 2 * 8 * 128 * 2);
  EXPECT_EQ(gptq["kv_bytes_per_token"], 32 * (2 * 8 * 128 + 2 * 8 * 4));  // int8 values and an f32 scale a head
  EXPECT_EQ(awq_fp8["kv_bytes_per_token"], 32 * 2 * 8 * 128);
  EXPECT_EQ(awq_fp8["breakdown"]["kv_scales"], 32 * 2 * 4);  // k_scale and v_scale a layer
  EXPECT_GT(gptq["max_sequences"].get<std::int64_t>(), 2 * bf16["max_sequences"].get<std::int64_t>());
  // Adapters describe training: refused with --serve.
  const auto lora = testing::run_cli(serve + " --lora 8", true);
  EXPECT_EQ(lora.exit_code, 2);
  EXPECT_NE(lora.output.find("--serve plans the model as it serves"), std::string::npos) << lora.output;
}

}  // namespace
}  // namespace memplan::graph
