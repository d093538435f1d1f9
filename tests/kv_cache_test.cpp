// Generation with a KV cache: the block managers' bookkeeping worked by hand (lazy blocks, slabs,
// prefix sharing and copy-on-write, waste), the decode step's plan (the caches outside the arena),
// cached greedy generation against the full-context model token for token, contiguous and paged
// caches giving the same tokens under preemption and prefix sharing, zero allocations per step,
// and the options and requests a generator refuses.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <cmath>

#include "memplan/models/gpt_decode.h"
#include "memplan/models/llama.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/devices.h"
#include "memplan/serve/generator.h"
#include "memplan/serve/kv_cache.h"
#include "memplan/train/language_model.h"

namespace memplan::serve {
namespace {

KvPoolShape pool(std::int64_t blocks, std::int64_t block_size = 4) {
  KvPoolShape s;
  s.layers = 2;
  s.width = 8;
  s.block_size = block_size;
  s.blocks = blocks;
  return s;  // token: 2 * 2 * 8 * 4 = 128 bytes; block of 4: 512 bytes
}

TEST(KvPoolShape, BytesOfATokenABlockAndThePool) {
  const KvPoolShape s = pool(10);
  EXPECT_EQ(s.token_bytes(), 128);
  EXPECT_EQ(s.block_bytes(), 512);
  EXPECT_EQ(s.pool_bytes(), 5120);
  EXPECT_EQ(KvPoolShape::blocks_in(1023, 512), 1);
  EXPECT_EQ(KvPoolShape::blocks_in(511, 512), 0);
  // Multi-head latent attention: one cache a layer; a block copy moves that one cache's rows.
  KvPoolShape latent = pool(10);
  latent.caches = 1;
  EXPECT_EQ(latent.token_bytes(), 64);
  runtime::CpuDevice cpu;
  KvPool kv = KvPool::allocate(cpu, latent).value();
  EXPECT_EQ(static_cast<std::byte*>(kv.cache(1, false)) - static_cast<std::byte*>(kv.cache(0, false)), 10 * 4 * 8 * 4);  // one cache of 10 blocks of 4 rows of 8
  auto* rows = static_cast<float*>(kv.cache(1, false));
  const std::int64_t block_floats = latent.block_size * latent.width;
  for (std::int64_t i = 0; i < block_floats; ++i) rows[3 * block_floats + i] = float(i);
  kv.copy_block(3, 7);
  for (std::int64_t i = 0; i < block_floats; ++i) ASSERT_EQ(rows[7 * block_floats + i], float(i));
}

TEST(KvCacheManager, PagedTakesBlocksAsASequenceGrowsAndFreesThemAtTheEnd) {
  KvCacheManager m(KvLayout::paged, pool(6), /*context=*/16);
  EXPECT_EQ(m.table_width(), 4);
  ASSERT_EQ(m.admit(1, {1, 2, 3, 4, 5}), std::optional<std::int64_t>(0));
  EXPECT_EQ(m.free_blocks(), 6);  // nothing taken until written
  for (std::int64_t pos = 0; pos < 5; ++pos) {
    ASSERT_TRUE(m.ensure(1, pos, nullptr));
    m.filled(1, pos + 1);
  }
  EXPECT_EQ(m.free_blocks(), 4);
  EXPECT_EQ(m.block_table(1), (std::vector<std::int32_t>{0, 1, -1, -1}));
  EXPECT_EQ(m.reserved_bytes(), 2 * 512);
  EXPECT_EQ(m.token_bytes(), 5 * 128);
  m.release(1);
  EXPECT_EQ(m.free_blocks(), 6);
  EXPECT_EQ(m.reserved_bytes(), 0);
}

TEST(KvCacheManager, PagedAdmitsOnlyWhatThePoolCanStillPromise) {
  KvCacheManager m(KvLayout::paged, pool(3), 16);
  ASSERT_TRUE(m.admit(1, std::vector<std::int32_t>(8, 1)).has_value());  // promised 2 blocks
  EXPECT_FALSE(m.admit(2, std::vector<std::int32_t>(5, 2)).has_value());  // needs 2, 1 left unpromised
  ASSERT_TRUE(m.admit(3, std::vector<std::int32_t>(3, 3)).has_value());  // needs 1
  ASSERT_TRUE(m.ensure(1, 0, nullptr));
  ASSERT_TRUE(m.ensure(3, 0, nullptr));
  ASSERT_TRUE(m.ensure(1, 4, nullptr));
  EXPECT_EQ(m.free_blocks(), 0);
  EXPECT_FALSE(m.ensure(3, 4, nullptr)) << "a fourth block does not exist";
}

TEST(KvCacheManager, ContiguousReservesAWholeContextPerSequence) {
  KvCacheManager m(KvLayout::contiguous, pool(9), 16);  // slabs of 4 blocks: 2 slabs, 1 block unused
  EXPECT_EQ(m.slabs(), 2);
  ASSERT_TRUE(m.admit(1, {1, 2}).has_value());
  ASSERT_TRUE(m.admit(2, {3}).has_value());
  EXPECT_FALSE(m.admit(3, {4}).has_value());
  EXPECT_EQ(m.block_table(2), (std::vector<std::int32_t>{4, 5, 6, 7}));
  for (std::int64_t pos = 0; pos < 2; ++pos) {
    ASSERT_TRUE(m.ensure(1, pos, nullptr));
    m.filled(1, pos + 1);
  }
  EXPECT_EQ(m.reserved_bytes(), 8 * 512);
  EXPECT_EQ(m.token_bytes(), 2 * 128);
  m.release(1);
  ASSERT_TRUE(m.admit(3, {4}).has_value());
  EXPECT_EQ(m.block_table(3), (std::vector<std::int32_t>{0, 1, 2, 3}));
}

TEST(KvCacheManager, SharesCompletePromptBlocksAndCopiesASharedBlockOnWrite) {
  runtime::CpuDevice device;
  KvPool kv = KvPool::allocate(device, pool(8)).value();
  // Block 0 of layer 0's key cache gets a recognisable value, to see it copied.
  std::vector<float> marker(4 * 8, 7.0f);
  device.copy_from_host(kv.cache(0, false), marker.data(), 4 * 8 * sizeof(float));
  KvCacheManager m(KvLayout::paged, kv.shape(), 16);
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5, 6};
  ASSERT_EQ(m.admit(1, prompt), std::optional<std::int64_t>(0));
  for (std::int64_t pos = 0; pos < 6; ++pos) {
    ASSERT_TRUE(m.ensure(1, pos, &kv));
    m.filled(1, pos + 1);
  }
  // A prompt with the same first block shares it; the partial second block differs.
  EXPECT_EQ(m.admit(2, {1, 2, 3, 4, 9}), std::optional<std::int64_t>(4));
  EXPECT_EQ(m.block_table(2)[0], m.block_table(1)[0]);
  // The same whole prompt shares both blocks but computes its last position itself: a copy.
  EXPECT_EQ(m.admit(3, prompt), std::optional<std::int64_t>(5));
  EXPECT_EQ(m.block_table(3)[1], m.block_table(1)[1]);
  ASSERT_TRUE(m.ensure(3, 5, &kv));
  EXPECT_NE(m.block_table(3)[1], m.block_table(1)[1]);
  EXPECT_EQ(m.counters().copy_on_write, 1);
  EXPECT_EQ(m.counters().shared_prefix_tokens, 9);
  // Sequence 1's second block (block 1) was copied; block 0 (shared, never written) was not.
  std::vector<float> copied(4 * 8);
  const std::int32_t copy = m.block_table(3)[1];
  device.copy_to_host(copied.data(), static_cast<float*>(kv.cache(0, false)) + copy * 4 * 8, copied.size() * sizeof(float));
  std::vector<float> original(4 * 8);
  device.copy_to_host(original.data(), static_cast<float*>(kv.cache(0, false)) + m.block_table(1)[1] * 4 * 8,
                      original.size() * sizeof(float));
  EXPECT_EQ(copied, original);
  // Blocks return when their last holder ends, and keep their prefix until they are taken again.
  m.release(1);
  m.release(2);
  m.release(3);
  EXPECT_EQ(m.free_blocks(), 8);
  EXPECT_EQ(m.reserved_bytes(), 0);
  EXPECT_EQ(m.admit(4, prompt), std::optional<std::int64_t>(5));
  EXPECT_EQ(m.free_blocks(), 6);
  m.release(4);
  // Two sequences that take all 8 blocks overwrite them: the prefix is gone.
  for (SeqId id : {5, 6}) {
    ASSERT_TRUE(m.admit(id, std::vector<std::int32_t>(16, static_cast<std::int32_t>(20 + id))).has_value());
    for (std::int64_t pos = 0; pos < 16; ++pos) {
      ASSERT_TRUE(m.ensure(id, pos, &kv));
      m.filled(id, pos + 1);
    }
  }
  EXPECT_EQ(m.free_blocks(), 0);
  m.release(5);
  m.release(6);
  EXPECT_EQ(m.admit(7, prompt), std::optional<std::int64_t>(0));
}

models::GptConfig small_gpt() {
  models::GptConfig c;
  c.vocab = 24;
  c.context = 40;
  c.layers = 2;
  c.heads = 2;
  c.width = 32;
  return c;
}

TEST(DecodeStep, CachesLiveOutsideThePlannedArena) {
  models::DecodeShape shape;
  shape.slots = 4;
  shape.block_size = 8;
  shape.pool_blocks = 100;
  const graph::Graph g = models::build_gpt_decode(small_gpt(), shape);
  runtime::CpuDevice device;
  auto step = runtime::plan_step_for(planner::StepDescription::of_graph(g), device).value();
  const TensorId cache = step.graph.find(models::kv_cache_name(1, true));
  ASSERT_NE(cache, kNoTensor);
  EXPECT_EQ(step.graph.tensor(cache).shape, (graph::Shape{100, 8, 32}));
  EXPECT_EQ(step.plan.buffer_of_tensor[static_cast<std::size_t>(cache)], -1);
  const Bytes caches = 2 * 2 * 100 * 8 * 32 * 4;
  EXPECT_LT(step.plan.arena_bytes, caches) << "the arena would hold the caches";
  // An executor refuses to run with a cache left unbound.
  runtime::Executor executor(step, device);
  auto s = executor.setup();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("was not bound"), std::string::npos) << s.error().message;
}

// Logits of the decode step fed one position per step for one sequence (slot 0, its blocks in
// reverse order to exercise the table; slot 1 empty), against the full-context graph's logits at
// every position: the same weights (initialised by name from one seed), the same math up to
// rounding.
// The decode step runs on `device` (the CPU when null), the full-context graph on the CPU.
// Parameters that start constant (biases at zero, norm weights at one) get values of their own,
// the same for the same name in any graph: a step that leaves one out, or applies it elsewhere,
// then computes other logits.
void vary_constant_parameters(runtime::Executor& executor, const graph::Graph& g) {
  for (int id = 0; id < g.num_tensors(); ++id) {
    const graph::TensorDesc& t = g.tensor(id);
    if (t.role != graph::Role::parameter ||
        (t.init.kind != graph::InitSpec::Kind::zeros && t.init.kind != graph::InitSpec::Kind::ones)) {
      continue;
    }
    std::vector<float> values(static_cast<std::size_t>(t.shape.numel()));
    executor.read_values(id, values.data());
    const double phase = double(std::hash<std::string>{}(t.name) % 1000);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += 0.2f * static_cast<float>(std::sin(phase + double(i)));
    executor.write_values(id, values.data());
  }
}

void expect_decode_matches_full(const graph::Graph& full, const graph::Graph& decode, std::int64_t layers,
                                std::int64_t kv_width, std::int64_t block_size, std::int64_t vocab,
                                runtime::Device* decode_device = nullptr, std::int64_t caches = 2) {
  const std::int64_t T = full.tensor(full.find("x")).shape[1];
  runtime::CpuDevice cpu;
  auto full_step = runtime::plan_step_for(planner::StepDescription::of_graph(full), cpu).value();
  runtime::Executor reference(full_step, cpu);
  ASSERT_TRUE(reference.setup());
  reference.initialize_persistent(11);
  vary_constant_parameters(reference, full_step.graph);
  std::vector<std::int32_t> x(static_cast<std::size_t>(T)), labels(static_cast<std::size_t>(T), 0);
  for (std::int64_t t = 0; t < T; ++t) x[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7 + 3) % vocab);
  reference.set_input(full_step.graph.find("x"), x.data(), T * 4);
  reference.set_input(full_step.graph.find("labels"), labels.data(), T * 4);
  ASSERT_TRUE(reference.run_step());
  std::vector<float> expected(static_cast<std::size_t>(T * vocab));
  reference.read_tensor(full_step.graph.output, expected.data());

  runtime::Device& device = decode_device != nullptr ? *decode_device : cpu;
  auto step = runtime::plan_step_for(planner::StepDescription::of_graph(decode), device).value();
  const graph::Graph& g = step.graph;
  const std::int64_t mb = (T + block_size - 1) / block_size;
  KvPoolShape ps;
  ps.layers = layers;
  ps.width = kv_width;
  ps.caches = caches;
  ps.block_size = block_size;
  ps.blocks = g.tensor(g.find(models::kv_cache_name(0, false))).shape[0];
  KvPool kv = KvPool::allocate(device, ps).value();
  runtime::Executor executor(step, device);
  for (std::int64_t l = 0; l < layers; ++l) {
    for (std::int64_t c = 0; c < caches; ++c) executor.bind_external(g.find(models::kv_cache_name(l, c == 1)), kv.cache(l, c == 1));
  }
  ASSERT_TRUE(executor.setup());
  executor.initialize_persistent(11);
  vary_constant_parameters(executor, g);
  std::vector<std::int32_t> table(static_cast<std::size_t>(2 * mb), -1);
  for (std::int64_t i = 0; i < mb; ++i) table[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(ps.blocks - 1 - i);
  std::vector<float> logits(static_cast<std::size_t>(2 * vocab));
  double worst = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<std::int32_t> tokens = {x[static_cast<std::size_t>(t)], 0}, positions = {static_cast<std::int32_t>(t), 0};
    executor.set_input(g.find("tokens"), tokens.data(), 8);
    executor.set_input(g.find("positions"), positions.data(), 8);
    executor.set_input(g.find("block_table"), table.data(), static_cast<Bytes>(table.size() * 4));
    ASSERT_TRUE(executor.run_step());
    executor.read_tensor(g.output, logits.data());
    for (std::int64_t v = 0; v < vocab; ++v) {
      worst = std::max(worst, double(std::abs(logits[static_cast<std::size_t>(v)] - expected[static_cast<std::size_t>(t * vocab + v)])));
    }
  }
  EXPECT_LT(worst, 1e-4) << "largest logit difference between cached and full-context attention";
  EXPECT_EQ(executor.device_allocations_during_steps(), 0);
}

TEST(DecodeStep, GptLogitsEqualTheFullContextModelsAtEveryPosition) {
  models::GptConfig c = small_gpt();
  c.context = 12;
  models::DecodeShape shape;
  shape.slots = 2;
  shape.block_size = 4;
  shape.pool_blocks = 5;
  expect_decode_matches_full(models::build_gpt(c, 1, false), models::build_gpt_decode(c, shape), c.layers, c.width, 4,
                             c.vocab);
}

TEST(DecodeStep, LlamaLogitsWithRotaryAndGroupedHeadsEqualTheFullContextModels) {
  models::LlamaConfig c;
  c.vocab = 20;
  c.context = 10;
  c.layers = 2;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 48;
  models::DecodeShape shape;
  shape.slots = 2;
  shape.block_size = 4;
  shape.pool_blocks = 4;
  expect_decode_matches_full(models::build_llama(c, 1), models::build_llama_decode(c, shape), c.layers, 2 * 8, 4, c.vocab);
  // Qwen3's layout: heads of 16 channels over a width of 32 (queries 64 wide), each head's queries
  // and keys RMS-normalised.
  c.head_dim = 16;
  c.qk_norm = models::LlamaConfig::QkNorm::per_head;
  expect_decode_matches_full(models::build_llama(c, 1), models::build_llama_decode(c, shape), c.layers, 2 * 16, 4, c.vocab);
  // Gemma's: one K/V head, a GELU-gated MLP, embeddings scaled by sqrt(width), tied.
  c.qk_norm = models::LlamaConfig::QkNorm::none;
  c.kv_heads = 1;
  c.gate = models::LlamaConfig::Gate::gelu;
  c.scale_embeddings = true;
  c.tied_head = true;
  expect_decode_matches_full(models::build_llama(c, 1), models::build_llama_decode(c, shape), c.layers, 16, 4, c.vocab);
}

// The decoder's other settings, each family's combination: the step's logits equal the full
// model's, so the decode graph follows the same settings as the training graph.
TEST(DecodeStep, EveryDecoderFamilysSettingsGiveTheFullContextModelsLogits) {
  using Config = models::LlamaConfig;
  models::DecodeShape shape;
  shape.slots = 2;
  shape.block_size = 4;
  shape.pool_blocks = 4;
  auto base = [] {
    Config c;
    c.vocab = 20;
    c.context = 10;
    c.layers = 2;
    c.width = 32;
    c.heads = 4;
    c.kv_heads = 4;
    c.ffn = 48;
    return c;
  };
  auto check = [&](const Config& c, const std::string& family) {
    SCOPED_TRACE(family);
    expect_decode_matches_full(models::build_llama(c, 1), models::build_llama_decode(c, shape), c.layers,
                               c.kv_heads * c.head_size(), 4, c.vocab);
  };
  Config qwen2 = base();  // biases on q, k and v
  qwen2.kv_heads = 2;
  qwen2.qkv_bias = true;
  check(qwen2, "qwen2");
  Config neox = base();  // LayerNorm, a plain GELU MLP with biases, parallel residual, a quarter of each head rotating
  neox.norm = Config::Norm::layer;
  neox.gated_mlp = false;
  neox.mlp_bias = true;
  neox.gate = Config::Gate::gelu;
  neox.qkv_bias = neox.o_bias = true;
  neox.parallel_residual = true;
  neox.rotary_dims = 2;
  check(neox, "gpt_neox");
  Config falcon = neox;  // one norm feeding both branches, one K/V head, no biases
  falcon.shared_norm = true;
  falcon.kv_heads = 1;
  falcon.mlp_bias = falcon.qkv_bias = falcon.o_bias = false;
  falcon.rotary_dims = 0;
  check(falcon, "falcon");
  Config olmo2 = base();  // norms on the sublayers' outputs only, queries and keys normalised whole
  olmo2.pre_norm = false;
  olmo2.post_norm = true;
  olmo2.qk_norm = Config::QkNorm::whole;
  check(olmo2, "olmo2");
  Config sandwich = base();  // norms before and after each sublayer
  sandwich.post_norm = true;
  check(sandwich, "pre and post norms");
  Config gemma2 = sandwich;  // Gemma-2: its own score scale, soft-capped scores and logits (caps
  gemma2.query_scale = 5.0f;  // small enough to bend the scores and logits of weights at 0.02)
  gemma2.attn_softcap = 1e-5f;
  gemma2.final_softcap = 0.05f;
  check(gemma2, "gemma2");
  // Mixtures of experts: the decode step gives every expert a slot for each of its tokens, so it
  // equals the full model when that drops nothing either (capacity factor 0).
  Config mixtral = base();  // 4 experts, 2 per token, renormalised
  mixtral.moe.experts = 4;
  mixtral.moe.top_k = 2;
  mixtral.moe.capacity_factor = 0.0;
  check(mixtral, "mixtral");
  Config qwen2_moe = mixtral;  // a dense first layer, experts of their own width, a gated shared expert
  qwen2_moe.moe.normalize_top_k = false;
  qwen2_moe.moe.expert_ffn = 20;
  qwen2_moe.moe.shared_ffn = 24;
  qwen2_moe.moe.dense_layers = {0};
  qwen2_moe.qkv_bias = true;
  check(qwen2_moe, "qwen2_moe");
}

// Multi-head latent attention (DeepSeek-V2/V3) served from its latent cache: one row of
// kv_lora_rank + qk_rope values a position, kv_b_proj absorbed into the queries and applied to the
// attention's output. Its logits equal the training graph's, which expands the latent into every
// head's keys and values; so the absorbed order of products, the rotary key ahead of the latent
// in the row and the score scale (over qk_nope + qk_rope, not the row) are checked at once.
models::LlamaConfig small_mla() {
  models::LlamaConfig c;
  c.vocab = 20;
  c.context = 10;
  c.layers = 2;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 4;
  c.ffn = 48;
  c.mla.q_lora_rank = 12;
  c.mla.kv_lora_rank = 10;
  c.mla.qk_nope = 6;
  c.mla.qk_rope = 4;
  c.mla.v_head = 5;
  return c;
}

TEST(DecodeStep, LatentAttentionFromItsLatentCacheGivesTheFullContextModelsLogits) {
  models::DecodeShape shape;
  shape.slots = 2;
  shape.block_size = 4;
  shape.pool_blocks = 4;
  models::LlamaConfig c = small_mla();
  const models::DecoderModel model(c);
  EXPECT_EQ(model.caches_per_layer(), 1);
  EXPECT_EQ(model.kv_width(), 10 + 4);
  expect_decode_matches_full(models::build_llama(c, 1), models::build_llama_decode(c, shape), c.layers, 14, 4, c.vocab,
                             nullptr, 1);
  // DeepSeek-V2-Lite's layout: queries projected directly (q_lora_rank 0), a mixture of experts
  // after a dense first layer.
  c.mla.q_lora_rank = 0;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.capacity_factor = 0.0;
  c.moe.shared_ffn = 16;
  c.moe.dense_layers = {0};
  expect_decode_matches_full(models::build_llama(c, 1), models::build_llama_decode(c, shape), c.layers, 14, 4, c.vocab,
                             nullptr, 1);
}

// The CUDA kernels (kv_cache_write, decode_attention) in the GPT's decode step against the
// full-context model on the CPU; runs where a GPU is present. (The LLaMA-style blocks have no
// CUDA kernels (rms_norm, concat), so the rotary path of the CUDA decode kernels and the latent
// ones are compiled but not run here.)
TEST(DecodeStep, CudaKernelsMatchTheFullContextModels) {
  if (!kernels::built_with_cuda()) GTEST_SKIP() << "memplan was built without CUDA (no nvcc found)";
  if (!runtime::cuda_device_present()) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA decode kernels need one";
  auto gpu = runtime::make_device(kernels::DeviceKind::cuda).value();
  models::GptConfig c = small_gpt();
  c.context = 12;
  models::DecodeShape shape;
  shape.slots = 2;
  shape.block_size = 4;
  shape.pool_blocks = 5;
  expect_decode_matches_full(models::build_gpt(c, 1, false), models::build_gpt_decode(c, shape), c.layers, c.width, 4,
                             c.vocab, gpu.get());
}

// Greedy tokens of the full-context model (batch-1 evaluation graph), recomputing everything.
std::vector<std::int32_t> uncached(const models::GptConfig& c, std::uint64_t seed, const std::vector<std::int32_t>& prompt,
                                   std::int64_t tokens) {
  runtime::CpuDevice device;
  models::ModelOptions model;
  model.name = "gpt";
  model.gpt = c;
  model.training = false;
  auto step = runtime::plan_step_for(planner::StepDescription::of_source(models::registry_source(model), 1), device).value();
  runtime::Executor executor(step, device);
  EXPECT_TRUE(executor.setup());
  executor.initialize_persistent(seed);
  train::SampleOptions options;
  options.tokens = tokens;
  options.temperature = 0.0;
  return train::generate(executor, prompt, options).value();
}

GenerationReport cached(const models::DecoderModel& c, std::uint64_t seed, const std::vector<GenerationRequest>& requests,
                        GeneratorOptions options) {
  runtime::CpuDevice device;
  auto generator = Generator::create(c, device, options);
  EXPECT_TRUE(generator) << generator.error().message;
  generator.value()->initialize_weights(seed);
  auto report = generator.value()->run(requests);
  EXPECT_TRUE(report) << report.error().message;
  return report.value();
}

TEST(Generator, CachedGreedyGenerationEqualsRecomputingTheWholeContext) {
  const models::GptConfig c = small_gpt();
  const std::vector<std::vector<std::int32_t>> prompts = {{3}, {5, 1, 7, 2, 2, 9}, {11, 4, 4, 0, 19, 23, 8, 1, 1, 6, 2}};
  std::vector<GenerationRequest> requests;
  for (const auto& p : prompts) requests.push_back({p, 40 - static_cast<std::int64_t>(p.size())});
  for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
    GeneratorOptions options;
    options.layout = layout;
    options.block_size = 8;
    options.max_running = 2;
    options.kv_memory = 3 * 5 * kv_block_bytes(c, 8);
    const GenerationReport report = cached(c, 42, requests, options);
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      EXPECT_EQ(report.outputs[r], uncached(c, 42, prompts[r], requests[r].max_tokens))
          << kv_layout_name(layout) << ", request " << r;
    }
    EXPECT_EQ(report.device_allocations_during_decode, 0);
  }
}

TEST(Generator, ContiguousAndPagedGiveTheSameTokensThroughPreemptionAndSharing) {
  const models::GptConfig c = small_gpt();
  std::vector<GenerationRequest> requests;
  const std::vector<std::int32_t> system = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // a common prefix
  for (std::int32_t r = 0; r < 10; ++r) {
    std::vector<std::int32_t> prompt = system;
    for (std::int32_t i = 0; i < r % 4; ++i) prompt.push_back((r * 7 + i) % 24);
    requests.push_back({prompt, 6 + (r * 5) % 20});
  }
  requests.push_back(requests[0]);  // an identical prompt: its last block is copied on write
  GeneratorOptions options;
  options.block_size = 4;
  options.max_running = 8;
  options.temperature = 0.9;
  options.seed = 3;
  options.layout = KvLayout::contiguous;
  options.kv_memory = 2 * 10 * kv_block_bytes(c, 4);  // two slabs of 10 blocks
  const GenerationReport contiguous = cached(c, 7, requests, options);
  options.layout = KvLayout::paged;  // the same 20 blocks, paged
  const GenerationReport paged = cached(c, 7, requests, options);
  EXPECT_EQ(paged.outputs_sha256, contiguous.outputs_sha256);
  EXPECT_EQ(paged.outputs, contiguous.outputs);
  EXPECT_EQ(contiguous.running_peak, 2);
  EXPECT_GT(paged.running_peak, contiguous.running_peak);
  EXPECT_GT(paged.preemptions, 0) << "the pool should run out and preempt";
  EXPECT_GT(paged.shared_prefix_tokens, 0);
  EXPECT_EQ(contiguous.preemptions, 0);
  EXPECT_LT(paged.kv_waste_ratio, contiguous.kv_waste_ratio);
  EXPECT_EQ(paged.device_allocations_during_decode, 0);
  EXPECT_EQ(contiguous.device_allocations_during_decode, 0);
  std::int64_t expected_tokens = 0;
  for (const auto& r : requests) expected_tokens += r.max_tokens;
  EXPECT_EQ(paged.generated_tokens, expected_tokens);
  // One at a time: the repeated prompt finds the first one's blocks (kept after it ended) and
  // copies its last block before writing its last prompt position.
  const std::vector<GenerationRequest> repeated = {requests[0], requests[0], requests[1]};
  options.max_running = 1;
  options.layout = KvLayout::contiguous;
  const GenerationReport one_contiguous = cached(c, 7, repeated, options);
  options.layout = KvLayout::paged;
  const GenerationReport one_paged = cached(c, 7, repeated, options);
  EXPECT_EQ(one_paged.outputs, one_contiguous.outputs);
  EXPECT_EQ(one_paged.copy_on_write, 1);
  EXPECT_EQ(one_paged.shared_prefix_tokens, static_cast<std::int64_t>(requests[0].prompt.size()) - 1 + 8)
      << "all but the last position of the repeat, and the common prefix's two full blocks for the third";
  // Another seed draws other tokens.
  options.seed = 4;
  EXPECT_NE(cached(c, 7, requests, options).outputs_sha256, paged.outputs_sha256);
}

// A latent-attention decoder generates from its one cache a layer: paged with a shared prompt
// (copied on write) gives the contiguous layout's tokens, allocating nothing while decoding.
TEST(Generator, LatentAttentionGeneratesTheSameTokensContiguousAndPaged) {
  models::LlamaConfig c = small_mla();
  c.context = 24;
  const models::DecoderModel model(c);
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<GenerationRequest> requests = {{prompt, 10}, {prompt, 12}, {{4, 4, 2}, 15}};
  GeneratorOptions options;
  options.block_size = 4;
  options.max_running = 1;
  options.temperature = 0.9;  // drawn tokens follow small changes of the logits, where greedy ones may not
  options.seed = 3;
  options.layout = KvLayout::contiguous;
  options.kv_memory = 2 * 6 * kv_block_bytes(model, 4);
  EXPECT_EQ(kv_block_bytes(model, 4), 4 * c.layers * (10 + 4) * 4) << "one row of kv_lora_rank + qk_rope a layer";
  const GenerationReport contiguous = cached(model, 5, requests, options);
  options.layout = KvLayout::paged;
  const GenerationReport paged = cached(model, 5, requests, options);
  EXPECT_EQ(paged.outputs, contiguous.outputs);
  EXPECT_EQ(paged.copy_on_write, 1);
  EXPECT_EQ(paged.device_allocations_during_decode, 0);
  EXPECT_EQ(contiguous.device_allocations_during_decode, 0);
  EXPECT_EQ(contiguous.outputs[0].size(), 10u);
}

TEST(Generator, RefusesOptionsAndRequestsItCannotServe) {
  const models::GptConfig c = small_gpt();
  runtime::CpuDevice device;
  GeneratorOptions options;
  options.block_size = 0;
  options.kv_memory = 1 << 20;
  auto g = Generator::create(c, device, options);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().message.find("block size"), std::string::npos) << g.error().message;
  options.block_size = 16;
  options.kv_memory = kv_block_bytes(c, 16) - 1;
  g = Generator::create(c, device, options);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().message.find("holds no block"), std::string::npos) << g.error().message;
  options.layout = KvLayout::contiguous;
  options.kv_memory = 2 * kv_block_bytes(c, 16);  // a context of 40 needs 3 blocks
  g = Generator::create(c, device, options);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().message.find("whole context"), std::string::npos) << g.error().message;
  options.layout = KvLayout::paged;
  options.kv_memory = 8 * kv_block_bytes(c, 16);
  g = Generator::create(c, device, options);
  ASSERT_TRUE(g) << g.error().message;
  g.value()->initialize_weights(1);
  auto too_long = g.value()->run({{std::vector<std::int32_t>(41, 1), 4}});
  ASSERT_FALSE(too_long);
  EXPECT_NE(too_long.error().message.find("longer than the model's context"), std::string::npos);
  auto bad_token = g.value()->run({{{1, 24}, 4}});
  ASSERT_FALSE(bad_token);
  EXPECT_NE(bad_token.error().message.find("outside the vocabulary"), std::string::npos);
}

}  // namespace
}  // namespace memplan::serve
