// fit --serve's planner: KV bytes per position of GPT-2 124M worked by hand, the weights as
// published, the answer's sequence count exact (it fits, one more does not), the paged blocks
// filling what the decode step leaves, and the CLI's JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/zoo.h"
#include "memplan/serve/serve_plan.h"

namespace memplan::serve {
namespace {

ServeQuestion gpt2_question(Bytes memory) {
  ServeQuestion q;
  q.model = models::zoo_gpt_config("gpt2", {}).value();
  q.seq = 1024;
  q.kv_dtype = graph::DType::f16;
  q.block_size = 16;
  q.device_memory = memory;
  q.device = planner::documented_device_profile("cpu").value();
  return q;
}

TEST(ServePlan, Gpt2KvBytesAndWeightsByHand) {
  const Bytes memory = Bytes{4} << 30;
  const ServeAnswer a = answer_serve(gpt2_question(memory)).value();
  // K and V, 12 layers, 768 values, 2 bytes: 36,864 bytes per position; 36 MiB per 1024 positions.
  EXPECT_EQ(a.kv_bytes_per_token, 36864);
  EXPECT_EQ(a.kv_bytes_per_sequence, 37748736);
  EXPECT_EQ(a.kv_block_bytes, 16 * 36864);
  // GPT-2 124M: 124,439,808 parameters (tied head), fp32.
  EXPECT_EQ(a.weights_bytes, Bytes{124439808} * 4);
  ASSERT_GT(a.max_sequences, 0);
  EXPECT_EQ(a.kv_bytes, a.max_sequences * 37748736);
  EXPECT_LE(a.decode_arena_bytes + a.kv_bytes, memory);
  // One more sequence does not fit: its arena is at least this one's.
  EXPECT_GT(a.decode_arena_bytes + (a.max_sequences + 1) * 37748736, memory);
  // (4 GiB - 497,759,232 bytes of weights) / 36 MiB = 100.6: at most 100, a few fewer for activations.
  EXPECT_GT(a.max_sequences, 90);
  EXPECT_LE(a.max_sequences, 100);
  // Paged blocks fill what the same decode step leaves.
  const Bytes room = memory - a.decode_arena_bytes;
  EXPECT_LE(a.kv_blocks * a.kv_block_bytes, room);
  EXPECT_GT((a.kv_blocks + 1) * a.kv_block_bytes, room);
  EXPECT_EQ(a.paged_sequences, a.kv_blocks / 64);
  EXPECT_GE(a.paged_sequences, a.max_sequences);
}

TEST(ServePlan, HalvingTheKvDtypeServesMoreAndTooLittleMemoryServesNone) {
  ServeQuestion q = gpt2_question(Bytes{2} << 30);
  const ServeAnswer f16 = answer_serve(q).value();
  q.kv_dtype = graph::DType::f32;
  const ServeAnswer f32 = answer_serve(q).value();
  EXPECT_EQ(f32.kv_bytes_per_token, 2 * f16.kv_bytes_per_token);
  EXPECT_GT(f16.max_sequences, f32.max_sequences);
  q.device_memory = Bytes{400} << 20;  // below the fp32 weights
  const ServeAnswer none = answer_serve(q).value();
  EXPECT_EQ(none.max_sequences, 0);
  EXPECT_EQ(none.kv_blocks, 0);
  q.seq = 2048;
  EXPECT_FALSE(answer_serve(q));
}

TEST(ServePlan, LlamaCachesOnlyItsKeyValueHeads) {
  ServeQuestion q = gpt2_question(Bytes{16} << 30);
  q.llama = models::zoo_llama_config("llama-1b", {}).value();
  q.seq = 2048;
  // Llama 3.2 1B: 16 layers, 8 K/V heads of 64: 2 * 16 * 512 * 2 bytes = 32 KiB per position.
  const ServeAnswer a = answer_serve(q).value();
  EXPECT_EQ(a.kv_bytes_per_token, 32768);
  EXPECT_EQ(a.kv_bytes_per_sequence, 2048 * 32768);
  EXPECT_GT(a.max_sequences, 0);
  EXPECT_LE(a.decode_arena_bytes + a.kv_bytes, q.device_memory);
  EXPECT_GT(a.decode_arena_bytes + a.kv_bytes + a.kv_bytes_per_sequence, q.device_memory);
  // Llama-2-7B, no grouping: 2 * 32 * 4096 * 2 bytes = 512 KiB per position.
  q.llama = models::zoo_llama_config("llama2-7b", {}).value();
  q.seq = 4096;
  EXPECT_EQ(answer_serve(q).value().kv_bytes_per_token, 524288);
}

ServeQuestion config_question(const std::string& file, std::int64_t seq) {
  ServeQuestion q = gpt2_question(Bytes{80} << 30);
  auto config = models::read_hf_config(std::string(MEMPLAN_CONFIG_DIR) + "/" + file);
  EXPECT_TRUE(config.ok()) << config.error().message;
  q.llama = config.value().llama;
  q.llama->context = seq;
  q.llama->dtype = graph::DType::bf16;
  q.kv_dtype = graph::DType::bf16;
  q.seq = seq;
  return q;
}

// A layer with a sliding window keeps its window's keys and values only. Mistral-7B (every layer,
// 4096; 8 K/V heads of 128: 4,096 bytes a layer-position in bf16): 8192 positions hold 4096 in each
// of 32 layers. Gemma-2-9B (every other of 42 layers from the first; 8 K/V heads of 256: 8,192
// bytes a layer-position): 21 layers of 8192 and 21 of 4096. Paged in blocks of 16, a windowed
// layer's 4096 positions span at most ceil(4095 / 16) + 1 = 257 blocks.
TEST(ServePlan, SlidingWindowLayersKeepOnlyTheirWindow) {
  const ServeAnswer mistral = answer_serve(config_question("mistral-7b-v0.1.json", 8192)).value();
  EXPECT_EQ(mistral.kv_bytes_per_token, 32 * 4096);
  EXPECT_EQ(mistral.kv_bytes_per_sequence, Bytes{32} * 4096 * 4096);
  EXPECT_EQ(mistral.windowed_layers, 32);
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(mistral.paged_sequences, mistral.kv_blocks / 257);
  EXPECT_EQ(mistral.kv_bytes, mistral.max_sequences * mistral.kv_bytes_per_sequence);

  const ServeAnswer gemma = answer_serve(config_question("gemma-2-9b.json", 8192)).value();
  EXPECT_EQ(gemma.kv_bytes_per_token, 42 * 8192);
  EXPECT_EQ(gemma.kv_bytes_per_sequence, Bytes{21} * 8192 * 8192 + Bytes{21} * 4096 * 8192);
  EXPECT_EQ(gemma.windowed_layers, 21);
  EXPECT_EQ(gemma.paged_sequences, gemma.kv_blocks * 42 / (21 * 512 + 21 * 257));

  // Within the window nothing changes; a config without one (Qwen2.5, use_sliding_window false) neither.
  const ServeAnswer short_seq = answer_serve(config_question("mistral-7b-v0.1.json", 4096)).value();
  EXPECT_EQ(short_seq.kv_bytes_per_sequence, Bytes{32} * 4096 * 4096);
  EXPECT_EQ(short_seq.windowed_layers, 0);
  EXPECT_EQ(short_seq.paged_sequences, short_seq.kv_blocks / 256);
  const ServeAnswer qwen = answer_serve(config_question("qwen2.5-7b.json", 8192)).value();
  EXPECT_EQ(qwen.windowed_layers, 0);
  EXPECT_EQ(qwen.kv_bytes_per_sequence, qwen.kv_bytes_per_token * 8192);
}

// Multi-head latent attention caches the latent and the rotary key, nothing per head: DeepSeek-V3
// (published config: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64) keeps 512 + 64 = 576 values
// a position a layer, 61 * 576 * 2 = 70,272 bytes a position in bf16; full keys and values of its
// 128 heads (192 and 128 channels) would take 61 * 128 * (192 + 128) * 2 = 4,997,120.
TEST(ServePlan, LatentAttentionCachesTheLatentAndTheRotaryKey) {
  ServeQuestion q = config_question("deepseek-v3.json", 4096);
  const models::LlamaConfig& c = *q.llama;
  ASSERT_EQ(c.layers, 61);
  ASSERT_EQ(c.mla.kv_lora_rank, 512);
  ASSERT_EQ(c.mla.qk_rope, 64);
  // Enough memory for the weights, so the decode step is planned and sequences are counted.
  q.device_memory = Bytes{2} << 40;
  const ServeAnswer a = answer_serve(q).value();
  EXPECT_TRUE(a.latent);
  EXPECT_EQ(a.kv_values_per_layer, 512 + 64);
  EXPECT_EQ(a.kv_bytes_per_token, 61 * (512 + 64) * 2);
  EXPECT_EQ(a.kv_bytes_per_sequence, Bytes{4096} * 61 * 576 * 2);
  EXPECT_GT(a.max_sequences, 0);
  EXPECT_LE(q.device.total_bytes(a.decode_arena_bytes) + a.kv_bytes, q.device_memory);
  EXPECT_GT(q.device.total_bytes(a.decode_arena_bytes) + a.kv_bytes + a.kv_bytes_per_sequence, q.device_memory);
  // int8: one f32 scale a position and layer for the one row; fp8: one scale a layer.
  q.kv_quant = KvQuant::int8;
  q.kv_dtype = graph::DType::u8;
  EXPECT_EQ(answer_serve(q).value().kv_bytes_per_token, 61 * (576 + 4));
  q.kv_quant = KvQuant::fp8;
  EXPECT_EQ(answer_serve(q).value().kv_scale_bytes, 61 * 4);
}

TEST(ServePlan, FitServeDeepSeekV3SaysItsLatentCache) {
  auto r = testing::run_cli("fit --serve --model deepseek-v3 --seq 4096 --dtype bf16 --device-memory 80GiB --json",
                            /*merge_stderr=*/false);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j.at("kv_bytes_per_token").get<std::int64_t>(), 61 * (512 + 64) * 2);
  EXPECT_EQ(j.at("kv_values_per_layer").get<std::int64_t>(), 576);
  EXPECT_TRUE(j.at("latent_kv_cache").get<bool>());
  EXPECT_EQ(j.at("max_sequences").get<std::int64_t>(), 0) << "671B parameters in bf16 do not fit one 80 GiB device";
  auto text = testing::run_cli("fit --serve --model deepseek-v3 --seq 4096 --dtype bf16 --device-memory 80GiB");
  EXPECT_NE(text.output.find("a position keeps 576 values a layer (kv_lora_rank 512 + qk_rope 64)"), std::string::npos)
      << text.output;
}

TEST(ServePlan, FitServeCliAnswersInJson) {
  auto r = testing::run_cli("fit --serve --model gpt2 --seq 512 --kv-dtype bf16 --device cpu --device-memory 2GiB --json",
                            /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j.at("kv_bytes_per_sequence").get<std::int64_t>(), 512 * 36864);
  EXPECT_GT(j.at("max_sequences").get<std::int64_t>(), 0);
  EXPECT_GT(j.at("kv_blocks").get<std::int64_t>(), 0);
  auto bad = testing::run_cli("fit --serve --model resnet50 --device-memory 2GiB");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("llama-1b"), std::string::npos) << bad.output;
}


// A Hugging Face config serves as its zoo name does; Mistral-7B's grouped K/V heads by hand:
// keys and values, 32 layers, 8 K/V heads of 128 values, 2 bytes each = 131,072 bytes a position.
TEST(ServePlan, FitServeReadsConfigsAndEveryLlamaFamilyModel) {
  const std::string config = std::string(MEMPLAN_CONFIG_DIR) + "/llama-3.2-1b.json";
  auto by_config = testing::run_cli("fit --serve --config " + config + " --seq 512 --dtype bf16 --device cpu --device-memory 8GiB --json",
                                    /*merge_stderr=*/false);
  auto by_name = testing::run_cli("fit --serve --model llama-1b --seq 512 --dtype bf16 --device cpu --device-memory 8GiB --json",
                                  /*merge_stderr=*/false);
  ASSERT_EQ(by_config.exit_code, 0) << by_config.output;
  ASSERT_EQ(by_name.exit_code, 0) << by_name.output;
  const nlohmann::json a = nlohmann::json::parse(by_config.output);
  const nlohmann::json b = nlohmann::json::parse(by_name.output);
  EXPECT_EQ(a.at("max_sequences"), b.at("max_sequences"));
  EXPECT_EQ(a.at("kv_blocks"), b.at("kv_blocks"));
  auto mistral = testing::run_cli("fit --serve --model mistral-7b --seq 1024 --dtype bf16 --device-memory 80GiB --json",
                                  /*merge_stderr=*/false);
  ASSERT_EQ(mistral.exit_code, 0) << mistral.output;
  EXPECT_EQ(nlohmann::json::parse(mistral.output).at("kv_bytes_per_token").get<std::int64_t>(), 131072);
  auto encoder = testing::run_cli("fit --serve --config " + std::string(MEMPLAN_CONFIG_DIR) +
                                  "/bert-base-uncased.json --device-memory 8GiB");
  EXPECT_EQ(encoder.exit_code, 2);
  EXPECT_NE(encoder.output.find("decoder"), std::string::npos) << encoder.output;
}

}  // namespace
}  // namespace memplan::serve
