// LoRA and --freeze as a user meets them: fit counts adapters, their gradients and optimizer state
// to the byte and gives the frozen base none; train fine-tunes the GPT on the CPU with the arena
// fit planned, allocating nothing during steps, the same bits in planned and naive mode; bad
// flags exit 2 naming the flag and what would work.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memplan::lora_cli_test {
namespace {

using testing::run_cli;

nlohmann::json json_of(const std::string& args) {
  const auto r = run_cli(args, false);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return nlohmann::json::parse(r.output);
}

// The reference GPT: 2 layers of width 128 (q, v each [128, 128]).
constexpr std::int64_t kQvAdapterParams = 2 * 2 * 8 * (128 + 128);

TEST(LoraCli, FitCountsAdaptersTheirGradientsAndStateAndNothingForTheFrozenBase) {
  const auto full = json_of("fit --model gpt --batch 4 --device cpu --device-memory 1GiB --json");
  const auto lora = json_of("fit --model gpt --batch 4 --device cpu --device-memory 1GiB --lora 8 --json");
  const auto& ft = lora["fine_tuning"];
  ASSERT_FALSE(ft.is_null()) << lora.dump();
  EXPECT_EQ(ft["adapted_layers"], 4);
  EXPECT_EQ(ft["adapter_parameters"], kQvAdapterParams);
  EXPECT_EQ(ft["trainable_parameters"], kQvAdapterParams);
  EXPECT_EQ(ft["adapter_bytes"], kQvAdapterParams * 4);
  const std::int64_t base = full["breakdown"]["parameters"];
  EXPECT_EQ(ft["frozen_bytes"], base) << "every base parameter is frozen";
  EXPECT_EQ(lora["breakdown"]["parameters"], base + kQvAdapterParams * 4);
  EXPECT_EQ(lora["breakdown"]["frozen_parameters"], base);
  EXPECT_EQ(lora["breakdown"]["trained_parameters"], kQvAdapterParams * 4);
  // AdamW keeps m and v for the adapters only.
  EXPECT_EQ(lora["breakdown"]["optimizer_state"], 2 * kQvAdapterParams * 4);
  EXPECT_EQ(full["breakdown"]["optimizer_state"], 2 * base);
  EXPECT_LT(lora["arena_bytes"].get<std::int64_t>(), full["arena_bytes"].get<std::int64_t>());
  // The text names the frozen base and the adapters.
  const auto text = run_cli("fit --model gpt --batch 4 --device cpu --device-memory 1GiB --lora 8", false);
  EXPECT_NE(text.output.find("frozen (no gradient or optimizer state)"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("fine-tuning: LoRA adapters on 4 linear layers (q, v), 8192 parameters"), std::string::npos)
      << text.output;
}

// plan and compare take the same flags and plan the same step: the arena fit states.
TEST(LoraCli, PlanAndCompareTakeTheSameStep) {
  const auto fit = json_of("fit --model gpt --lora 8 --batch 4 --device cpu --device-memory 1GiB --json");
  const auto plan = json_of("plan --model gpt --lora 8 --batch 4 --json");
  const auto compare = json_of("compare --model gpt --lora 8 --batch 4 --json");
  EXPECT_EQ(plan["fine_tuning"]["trainable_parameters"], kQvAdapterParams);
  EXPECT_EQ(compare["fine_tuning"]["trainable_parameters"], kQvAdapterParams);
  EXPECT_EQ(plan["arena_bytes"], fit["arena_bytes"]);
  EXPECT_EQ(compare["planned_arena_bytes"], fit["arena_bytes"]);
}

TEST(LoraCli, FreezeWithoutAdaptersTrainsTheRest) {
  const auto full = json_of("fit --model gpt --batch 4 --device cpu --device-memory 1GiB --json");
  const auto part = json_of("fit --model gpt --batch 4 --device cpu --device-memory 1GiB --freeze 'h.0.*,wte.*' --json");
  const auto& ft = part["fine_tuning"];
  EXPECT_EQ(ft["adapted_layers"], 0);
  EXPECT_GT(ft["frozen_parameters"].get<std::int64_t>(), 0);
  EXPECT_EQ(part["breakdown"]["optimizer_state"].get<std::int64_t>(),
            2 * (full["breakdown"]["parameters"].get<std::int64_t>() - ft["frozen_bytes"].get<std::int64_t>()));
}

TEST(LoraCli, TrainFineTunesWithFitsArenaNoAllocationsAndTheSameBitsInEveryMode) {
  const std::string run = "train --model gpt --lora 8 --steps 40 --batch 8 --eval-samples 64 --seed 3 --threads 1 --json";
  const auto planned = json_of(run);
  EXPECT_EQ(planned["fine_tuning"]["trainable_parameters"], kQvAdapterParams);
  EXPECT_EQ(planned["device_allocations_during_steps"], 0);
  EXPECT_LT(planned["final_loss"].get<double>(), planned["first_loss"].get<double>()) << "the adapters learn";
  EXPECT_LT(planned["val_loss"].get<double>(), planned["first_loss"].get<double>() - 0.1)
      << "the evaluation runs the adapters too (without them it scores the frozen base)";
  const auto fit = json_of("fit --model gpt --lora 8 --batch 8 --device cpu --device-memory 1GiB --json");
  EXPECT_EQ(planned["arena_bytes"], fit["arena_bytes"]) << "fit plans the arena train allocates";
  const auto naive = json_of(run + " --mode naive");
  EXPECT_EQ(naive["params_sha256"], planned["params_sha256"]) << "planned and naive give the same bits";
  // The frozen base stays as initialised: a run of the base model alone has other parameters.
  const auto base = json_of("train --model gpt --steps 40 --batch 8 --eval-samples 64 --seed 3 --threads 1 --json");
  EXPECT_NE(base["params_sha256"], planned["params_sha256"]);
}

// QLoRA on the CPU: the frozen base in NF4 (with double quantization), dequantized a tile at a time
// inside each product; the adapters learn, fit plans train's arena, the modes agree bitwise.
TEST(LoraCli, QloraTrainsOnTheCpuWithFitsArena) {
  for (const std::string quant : {"--quant nf4", "--quant nf4 --double-quant", "--quant int8"}) {
    const std::string run = "train --model gpt --lora 8 " + quant + " --steps 40 --batch 8 --eval-samples 64 --seed 3 --threads 1 --json";
    const auto planned = json_of(run);
    EXPECT_EQ(planned["fine_tuning"]["trainable_parameters"], kQvAdapterParams) << quant;
    EXPECT_EQ(planned["quantized"]["quantized_layers"], 12) << quant;
    EXPECT_EQ(planned["device_allocations_during_steps"], 0) << quant;
    EXPECT_LT(planned["final_loss"].get<double>(), planned["first_loss"].get<double>()) << quant;
    EXPECT_LT(planned["val_loss"].get<double>(), planned["first_loss"].get<double>() - 0.1) << quant;
    const auto fit = json_of("fit --model gpt --lora 8 " + quant + " --batch 8 --device cpu --device-memory 1GiB --json");
    EXPECT_EQ(planned["arena_bytes"], fit["arena_bytes"]) << quant;
    if (testing::kSanitized) continue;
    EXPECT_EQ(json_of(run + " --mode naive")["params_sha256"], planned["params_sha256"]) << quant;
  }
  // Formats memplan plans but does not run are refused by train, by name.
  const auto gptq = run_cli("train --model gpt --lora 8 --quant gptq --steps 1", true);
  EXPECT_EQ(gptq.exit_code, 2);
  EXPECT_NE(gptq.output.find("--quant gptq: train runs nf4, fp4 and int8 weights"), std::string::npos) << gptq.output;
}

// fit --suggest --allow lora,quant: when the job may fine-tune instead, each recipe is planned with
// the levers that fit it and says what it saves.
TEST(LoraCli, SuggestPlansTheFineTuningRecipesTheUserAllows) {
  const auto j = json_of("fit --model gpt2 --batch 4 --seq 256 --device-memory 2GiB --suggest --allow lora,quant --json");
  ASSERT_TRUE(j.contains("fine_tuning_recipes")) << j.dump();
  const auto& recipes = j["fine_tuning_recipes"];
  ASSERT_EQ(recipes.size(), 2u);
  EXPECT_EQ(recipes[0]["recipe"], "--lora 8 --lora-targets q,v");
  EXPECT_EQ(recipes[1]["recipe"], "--lora 8 --lora-targets q,v --quant nf4 --double-quant");
  for (const auto& r : recipes) ASSERT_TRUE(r["fits"].get<bool>()) << r.dump();
  // Each recipe's figure is fit's for its flags with the levers it names (none needed here).
  const auto lora = json_of("fit --model gpt2 --batch 4 --seq 256 --device-memory 2GiB --lora 8 --json");
  const auto qlora = json_of("fit --model gpt2 --batch 4 --seq 256 --device-memory 2GiB --lora 8 --quant nf4 --double-quant --json");
  EXPECT_EQ(recipes[0]["best"]["total_bytes"], lora["total_bytes"]);
  EXPECT_EQ(recipes[1]["best"]["total_bytes"], qlora["total_bytes"]);
  EXPECT_LT(qlora["total_bytes"].get<std::int64_t>(), lora["total_bytes"].get<std::int64_t>());
  if (j["fits"].get<bool>()) {
    EXPECT_EQ(recipes[1]["saved_bytes"].get<std::int64_t>(), j["best"]["total_bytes"].get<std::int64_t>() - qlora["total_bytes"].get<std::int64_t>());
  }
  const auto alone = run_cli("fit --model gpt2 --device-memory 2GiB --allow lora", true);
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_NE(alone.output.find("--allow names the recipes --suggest may propose: add --suggest"), std::string::npos) << alone.output;
  const auto bogus = run_cli("fit --model gpt2 --device-memory 2GiB --suggest --allow magic", true);
  EXPECT_EQ(bogus.exit_code, 2);
  EXPECT_NE(bogus.output.find("--allow"), std::string::npos) << bogus.output;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_text(const std::filesystem::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// Adapters out and in as PEFT writes them: the config's fields, the tensors' PEFT names and shapes
// (listed here), and a run that loads them scores exactly what the saving run scored.
TEST(LoraCli, AdaptersAreSavedAndLoadedAsPeftWritesThem) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("memplan_adapter_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto saved = json_of("train --model gpt --lora 8 --steps 20 --batch 8 --eval-samples 64 --seed 3 --threads 1 --json --save-adapter " +
                             dir.string());
  const auto config = nlohmann::json::parse(read_text(dir / "adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 8);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["target_modules"], nlohmann::json::array({"q", "v"}));
  const std::string file = read_text(dir / "adapter_model.safetensors");
  ASSERT_GT(file.size(), 8u);
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const auto header = nlohmann::json::parse(file.substr(8, n));
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(t["dtype"], "F32") << name;
    shapes[name] = t["shape"].get<std::vector<std::int64_t>>();
  }
  std::map<std::string, std::vector<std::int64_t>> expected;
  for (const char* layer : {"0", "1"}) {
    for (const char* m : {"q", "v"}) {
      const std::string module = std::string("base_model.model.h.") + layer + ".attn." + m;
      expected[module + ".lora_A.weight"] = {8, 128};
      expected[module + ".lora_B.weight"] = {128, 8};
    }
  }
  EXPECT_EQ(shapes, expected);
  // Loaded into a run of the same base (same seed) that changes nothing (SGD at 1e-30), the
  // adapters score bit for bit what the saving run scored; without them the base scores worse.
  const std::string reload = "train --model gpt --lora 8 --steps 1 --optimizer sgd --lr 1e-30 --batch 8 --eval-samples 64 --seed 3 "
                             "--threads 1 --json";
  const auto loaded = json_of(reload + " --load-adapter " + dir.string());
  EXPECT_EQ(loaded["val_loss"].get<double>(), saved["val_loss"].get<double>());
  EXPECT_GT(json_of(reload)["val_loss"].get<double>(), saved["val_loss"].get<double>() + 0.1);
  // Adapter files are input too: each defect is refused by name.
  const std::string good_config = read_text(dir / "adapter_config.json");
  struct Defect {
    const char* what;
    std::function<void()> apply;
    const char* says;
  };
  const Defect defects[] = {
      {"unknown module", [&] { write_text(dir / "adapter_config.json", std::regex_replace(good_config, std::regex("\"v\""), "\"o_proj\"")); },
       "target_modules names 'o_proj', which this run does not adapt (it adapts q, v"},
      {"another rank", [&] { write_text(dir / "adapter_config.json", std::regex_replace(good_config, std::regex("\"r\": 8"), "\"r\": 4")); },
       "r is 4 and this run's --lora rank is 8: give --lora 4"},
      {"rsLoRA's scaling", [&] { write_text(dir / "adapter_config.json", std::regex_replace(good_config, std::regex("\"bias\": \"none\""), "\"bias\": \"none\", \"use_rslora\": true")); },
       "use_rslora is true (updates scaled by alpha / sqrt(r)); memplan's scale by alpha / r"},
      {"trained biases", [&] { write_text(dir / "adapter_config.json", std::regex_replace(good_config, std::regex("\"bias\": \"none\""), "\"bias\": \"lora_only\"")); },
       "bias is \"lora_only\"; memplan's adapters train no biases"},
      {"a header that lies about sizes", [&] {
         std::string bad = file;
         const std::size_t at = bad.find("[8,128]");
         ASSERT_NE(at, std::string::npos);
         bad.replace(at, 7, "[9,128]");
         write_text(dir / "adapter_model.safetensors", bad);
       }, "adapter_model.safetensors"},
  };
  for (const Defect& d : defects) {
    SCOPED_TRACE(d.what);
    write_text(dir / "adapter_config.json", good_config);
    write_text(dir / "adapter_model.safetensors", file);
    d.apply();
    const auto r = run_cli(reload + " --load-adapter " + dir.string(), true);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(d.says), std::string::npos) << r.output;
  }
  const auto no_lora = run_cli("train --model gpt --steps 1 --save-adapter " + dir.string(), true);
  EXPECT_EQ(no_lora.exit_code, 2);
  EXPECT_NE(no_lora.output.find("--save-adapter reads or writes LoRA adapters: add --lora RANK"), std::string::npos) << no_lora.output;
  fs::remove_all(dir);
}

// A fine-tuning run's checkpoint holds what trains (adapters and their optimizer state), not the
// frozen base, which the resumed run makes again from its seed: the resume ends with the same
// bits as a run never stopped, and fit counts the snapshot's host memory to the byte.
TEST(LoraCli, CheckpointsHoldWhatTrainsAndResumeExactly) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("memplan_lora_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string run = "train --model gpt --lora 8 --quant nf4 --batch 8 --eval-samples 16 --seed 3 --threads 1 --json";
  const auto whole = json_of(run + " --steps 12");
  const auto first = json_of(run + " --steps 6 --save-dir " + dir.string() + " --save-every 6");
  ASSERT_EQ(first["checkpoints"]["saved"].size(), 1u) << first.dump();
  const std::int64_t bytes = first["checkpoints"]["saved"][0]["bytes"];
  // Adapters (8,192 f32) and AdamW's m and v for them, plus the header: no frozen base in it.
  EXPECT_GT(bytes, 3 * kQvAdapterParams * 4);
  EXPECT_LT(bytes, 3 * kQvAdapterParams * 4 + 16384) << "the checkpoint holds the frozen base";
  const auto fit = json_of("fit --model gpt --lora 8 --quant nf4 --batch 8 --device cpu --device-memory 1GiB --json");
  EXPECT_EQ(fit["host_snapshot_bytes"], first["checkpoints"]["snapshot_host_bytes"]);
  const auto resumed = json_of(run + " --steps 12 --save-dir " + dir.string() + " --save-every 6");
  EXPECT_EQ(resumed["checkpoints"]["resumed_at_step"], 6);
  EXPECT_EQ(resumed["params_sha256"], whole["params_sha256"]) << "the resume continues as the run never stopped";
  fs::remove_all(dir);
}

// --merge-lora: --save's file holds W + (alpha / r) B A in place of each base weight and no
// adapters, so the model without --lora loads it and scores what the adapted model scored.
TEST(LoraCli, MergedWeightsLoadIntoTheModelWithoutAdapters) {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("memplan_merged_" + std::to_string(::getpid()) + ".safetensors");
  const auto adapted = json_of("train --model gpt --lora 8 --steps 20 --batch 8 --eval-samples 64 --seed 3 --threads 1 --json --save " +
                               file.string() + " --merge-lora");
  const std::string header = read_text(file);
  EXPECT_EQ(header.find("lora_"), std::string::npos) << "no adapter left in the merged file";
  const auto plain = json_of("train --model gpt --load " + file.string() +
                             " --steps 1 --optimizer sgd --lr 1e-30 --batch 8 --eval-samples 64 --seed 9 --threads 1 --json");
  EXPECT_NEAR(plain["val_loss"].get<double>(), adapted["val_loss"].get<double>(), 1e-4);
  const auto quantized = run_cli("train --model gpt --lora 8 --quant nf4 --steps 1 --save " + file.string() + " --merge-lora", true);
  EXPECT_EQ(quantized.exit_code, 2) << quantized.output;
  EXPECT_NE(quantized.output.find("a --quant base cannot take merged adapters"), std::string::npos) << quantized.output;
  const auto no_save = run_cli("train --model gpt --lora 8 --steps 1 --merge-lora", true);
  EXPECT_EQ(no_save.exit_code, 2);
  EXPECT_NE(no_save.output.find("--merge-lora writes --save's file"), std::string::npos) << no_save.output;
  fs::remove(file);
}

// A rotary decoder's q, k and v have no bias: their products go straight into a reshape into
// heads, which must read the adapted sum. The adapters then change what the model computes, in
// training and in the evaluation (which scored the frozen base when the reshape read the product).
TEST(LoraCli, AdaptersOfBiasFreeProjectionsChangeTheEvaluation) {
  namespace fs = std::filesystem;
  const fs::path config = fs::temp_directory_path() / ("memplan_tiny_llama_" + std::to_string(::getpid()) + ".json");
  write_text(config, R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 32})");
  const auto j = json_of("train --config " + config.string() +
                         " --seq 32 --batch 4 --steps 30 --eval-samples 32 --seed 3 --threads 1 --lora 4 --lora-targets q,v --json");
  EXPECT_LT(j["final_loss"].get<double>(), j["first_loss"].get<double>() - 0.05);
  EXPECT_LT(j["val_loss"].get<double>(), j["first_loss"].get<double>() - 0.05) << "the evaluation runs the adapters";
  fs::remove(config);
}

TEST(LoraCli, BadFlagsExitTwoNamingTheFlag) {
  struct Case {
    const char* flags;
    const char* message;
  } cases[] = {
      {"--lora 0", "--lora: '0': the rank must be at least 1"},
      {"--lora -4", "--lora: '-4': the rank must be at least 1"},
      {"--lora eight", "--lora: 'eight': give RANK or RANK:ALPHA"},
      {"--lora 8:0", "--lora: '8:0': ALPHA must be a number > 0"},
      {"--lora-targets q", "--lora-targets applies with --lora RANK"},
      {"--lora 8 --lora-targets q,gate", "LoRA target 'gate' names no linear layer of this model; its linear layers are fc, k, proj, q, v (or all-linear)"},
      {"--lora 512", "LoRA rank 512 exceeds the width of 'h.0.attn.q' [128, 128]: give a rank of at most 128"},
      {"--freeze 'nope*'", "--freeze pattern 'nope*' matches no parameter"},
      {"--lora 8 --lora-dtype bf16", "--lora-dtype: bf16 not in {fp32,working}"},
      {"--quant nf4", "--quant quantizes frozen linear weights, and none is frozen: add --lora RANK (QLoRA) or --freeze PATTERN"},
      {"--lora 8 --quant int8 --double-quant", "--double-quant applies to --quant nf4 and fp4"},
      {"--lora 8 --quant nf4 --group-size 64", "--group-size applies to --quant gptq and awq"},
      {"--lora 8 --tensor-parallel 2", "--lora and --freeze do not combine with --tensor-parallel yet"},
  };
  for (const Case& c : cases) {
    for (const char* command : {"fit --device-memory 1GiB", "plan", "train --steps 1"}) {
      const auto r = run_cli(std::string(command) + " --model gpt " + c.flags, true);
      EXPECT_EQ(r.exit_code, 2) << command << " " << c.flags << "\n" << r.output;
      EXPECT_NE(r.output.find(c.message), std::string::npos) << command << " " << c.flags << "\n" << r.output;
    }
  }
}

}  // namespace
}  // namespace memplan::lora_cli_test
