// memplan fit at real scale: how long the answer takes (the CLI end to end, as a user runs it),
// bytes per parameter for mixed-precision AdamW against the ZeRO paper's 16, and GPT activation
// bytes per layer against Korthikanti et al. 2022's sbh(34 + 5as/h) (materialized attention) and,
// with fused attention, against their selective-recompute sbh * 34 for GPT-2 XL and Llama-2-7B,
// each difference explained from the tensors the graph really stores for the backward pass.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "bench_util.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/zoo.h"

namespace memplan::bench {
namespace {

CliRun run_fit(const std::string& args, const std::string& cli = MEMPLAN_CLI_PATH) { return run_cli(cli, "fit " + args + " --json"); }

nlohmann::json fit_or_die(const std::string& args) {
  const CliRun r = run_fit(args);
  if (r.exit_code != 0) {
    std::fprintf(stderr, "memplan fit %s failed (exit %d)\n", args.c_str(), r.exit_code);
    std::exit(1);
  }
  return nlohmann::json::parse(r.output);
}

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "check failed: %s\n", what.c_str());
    std::exit(1);
  }
}

std::string gib(double bytes) { return fmt(bytes / double(1ull << 30), 3) + " GiB"; }

// The forward tensors of one layer of the zoo model's training step that the backward pass reads.
LayerActivations stored_per_layer(const std::string& model, std::int64_t batch, const models::ZooOptions& options,
                                  const std::string& layer) {
  return stored_for_backward(models::build_zoo_forward(model, batch, options).value(), layer);
}

}  // namespace
}  // namespace memplan::bench

int main() {
  using namespace memplan;
  using namespace memplan::bench;
  nlohmann::json out;

  // --- 1. timing --------------------------------------------------------------------------
  struct TimedCase {
    std::string label, args;
    double target_ms;
  };
  // target_ms 0: reported, no target (the search and suggestion plan many batches).
  std::vector<TimedCase> timed = {
      {"gpt2-xl b8 s1024 fp32, 192GiB", "--model gpt2-xl --batch 8 --seq 1024 --dtype fp32 --budget 192GiB", 1000},
      {"gpt2-xl b8 s1024 bf16, 141GB", "--model gpt2-xl --batch 8 --seq 1024 --dtype bf16 --budget 141GB", 1000},
      {"gpt2-xl b8 s1024 bf16, 80GiB (no fit: search + suggestion)",
       "--model gpt2-xl --batch 8 --seq 1024 --dtype bf16 --budget 80GiB", 0},
      {"llama2-7b --max-batch bf16 adamw 80GiB (3 strategies)",
       "--model llama2-7b --dtype bf16 --budget 80GiB --max-batch", 5000},
      {"llama2-7b --max-batch bf16 sgd s1024 80GiB",
       "--model llama2-7b --dtype bf16 --optimizer sgd --seq 1024 --budget 80GiB --checkpoint none --max-batch", 5000},
      // Every checkpoint strategy side by side: each probe of sqrt and optimal plans rewritten graphs.
      {"gpt2 --max-batch s256 16GiB (3 strategies)", "--model gpt2 --seq 256 --budget 16GiB --max-batch", 0},
      {"gpt2-xl --max-batch bf16 80GiB (3 strategies)", "--model gpt2-xl --dtype bf16 --budget 80GiB --max-batch", 0},
      // The decoder families' settings (issue: --max-batch under 10 s up to 47B parameters).
      {"phi3-mini --max-batch bf16 80GiB (3 strategies)", "--model phi3-mini --dtype bf16 --budget 80GiB --max-batch", 10000},
      {"pythia-6.9b --max-batch bf16 141GB (3 strategies)", "--model pythia-6.9b --dtype bf16 --budget 141GB --max-batch", 10000},
      {"falcon-7b --max-batch bf16 141GB (3 strategies)", "--model falcon-7b --dtype bf16 --budget 141GB --max-batch", 10000},
      {"olmo2-7b --max-batch bf16 141GB (3 strategies)", "--model olmo2-7b --dtype bf16 --budget 141GB --max-batch", 10000},
      // Mixtures of experts: persistent state of 14 bytes a parameter needs several GPUs' memory.
      {"mixtral-8x7b --max-batch bf16 1TiB (3 strategies)", "--model mixtral-8x7b --dtype bf16 --budget 1TiB --max-batch", 10000},
      {"qwen1.5-moe --max-batch bf16 320GiB (3 strategies)", "--model qwen1.5-moe --dtype bf16 --budget 320GiB --max-batch", 10000},
      {"qwen3-30b-a3b --max-batch bf16 640GiB (3 strategies)", "--model qwen3-30b-a3b --dtype bf16 --budget 640GiB --max-batch", 10000},
      // Data parallel at scale: 64 ranks of ZeRO-3 at sequence 4096, each strategy's batch search
      // on the per-rank step (issue: a positive largest batch under checkpointing in under 10 s).
      {"llama2-70b --max-batch bf16 64 ranks zero3 s4096 80GiB (3 strategies)",
       "--model llama2-70b --dtype bf16 --devices 64 --zero 3 --seq 4096 --device-memory 80GiB --max-batch", 10000},
      // QLoRA at 70B: the frozen base in NF4, adapters on q and v (issue: under 10 s).
      {"llama2-70b --max-batch bf16 LoRA r8 NF4 s2048 80GiB (3 strategies)",
       "--model llama2-70b --dtype bf16 --lora 8 --quant nf4 --seq 2048 --device-memory 80GiB --max-batch", 10000},
      // The encoder-decoder: Flan-T5-XL at the T5 paper's 512 source and 114 target tokens.
      {"flan-t5-xl --max-batch bf16 s512 t114 80GiB (3 strategies)",
       "--model flan-t5-xl --dtype bf16 --seq 512 --target-seq 114 --budget 80GiB --max-batch", 10000},
  };
  // Every shipped Hugging Face config (models/configs), by its zoo name at its default shape: one
  // plan each, under a second.
  for (const models::ZooModel& z : models::zoo_models()) {
    if (!z.config_file.empty()) timed.push_back({z.name + " (" + z.config_file + "), defaults, fits", "--model " + z.name + " --budget 1000TiB", 1000});
  }
  // MEMPLAN_FIT_CASE=text times only the cases whose label contains it (one case against a baseline).
  if (const char* only = std::getenv("MEMPLAN_FIT_CASE"); only != nullptr) {
    std::erase_if(timed, [&](const TimedCase& c) { return c.label.find(only) == std::string::npos; });
  }
  // MEMPLAN_BASELINE_CLI=/path/to/an/older/memplan times the same commands with that binary in
  // the same run, for a ratio that the machine's load does not skew (its answers must agree).
  const char* baseline_env = std::getenv("MEMPLAN_BASELINE_CLI");
  const std::string baseline = baseline_env != nullptr ? baseline_env : "";
  std::vector<std::vector<std::string>> rows;
  nlohmann::json timing = nlohmann::json::array();
  for (const TimedCase& c : timed) {
    const nlohmann::json j = fit_or_die(c.args);  // check first: a max batch must fit, one more must not
    if (c.args.find("--max-batch") != std::string::npos && j["max_batch"].get<std::int64_t>() > 0) {
      const std::int64_t mb = j["max_batch"].get<std::int64_t>();
      std::string base = c.args.substr(0, c.args.find(" --max-batch"));
      if (base.find("--checkpoint") == std::string::npos) base += " --checkpoint none";
      check(fit_or_die(base + " --batch " + std::to_string(mb))["fits"].get<bool>(), c.label + ": max batch fits");
      check(!fit_or_die(base + " --batch " + std::to_string(mb + 1))["fits"].get<bool>(),
            c.label + ": max batch + 1 does not fit");
    }
    // Three runs each, alternating with the baseline; one when a run takes over 10 s.
    std::vector<double> ms, base_ms;
    for (int i = 0; i < 3; ++i) {
      ms.push_back(run_fit(c.args).ms);
      if (!baseline.empty()) {
        const CliRun b = run_fit(c.args, baseline);
        check(b.exit_code == 0, c.label + ": the baseline ran");
        const nlohmann::json bj = nlohmann::json::parse(b.output);
        check(bj["total_bytes"] == j["total_bytes"] && bj.value("max_batch_by_checkpoint", nlohmann::json()) ==
                                                          j.value("max_batch_by_checkpoint", nlohmann::json()),
              c.label + ": the baseline gives the same answer");
        base_ms.push_back(b.ms);
      }
      if (ms.back() > 10'000) break;
    }
    const double m = median(ms);
    const double base_m = base_ms.empty() ? 0.0 : median(base_ms);
    std::string answer = j["fits"].get<bool>() ? "FITS" : "DOES NOT FIT";
    if (j.contains("max_batch_by_checkpoint")) answer += "; max batch " + j["max_batch_by_checkpoint"].dump();
    if (!j["fits"].get<bool>() && j["suggestion"].contains("micro_batch")) {
      answer += "; suggest micro " + std::to_string(j["suggestion"]["micro_batch"].get<std::int64_t>());
    }
    rows.push_back({c.label, fmt(m, 0), base_ms.empty() ? "-" : fmt(base_m, 0),
                    base_ms.empty() ? "-" : fmt(base_m / m, 2), c.target_ms > 0 ? fmt(c.target_ms, 0) : "-",
                    c.target_ms <= 0 ? "-" : m < c.target_ms ? "yes" : "NO", answer,
                    gib(double(j["arena_bytes"].get<std::int64_t>()))});
    timing.push_back({{"case", c.label}, {"args", c.args}, {"median_ms", m}, {"target_ms", c.target_ms},
                      {"answer", answer}, {"arena_bytes", j["arena_bytes"]}, {"plans_made", j.value("plans_made", 1)}});
    if (!base_ms.empty()) timing.back()["baseline_median_ms"] = base_m;
  }
  std::puts("## memplan fit, end to end (median of up to 3 runs of the CLI)\n");
  print_table({"case", "ms", "baseline ms", "baseline / ms", "target ms", "under target", "answer", "arena at --batch"}, rows);
  out["timing"] = timing;

  // --- 2. bytes per parameter, mixed-precision AdamW vs ZeRO's 16 --------------------------
  rows.clear();
  nlohmann::json per_param = nlohmann::json::array();
  for (const char* model : {"gpt2-xl", "llama2-7b"}) {
    for (const char* dtype : {"fp32", "bf16"}) {
      graph::Graph g =
          models::build_zoo_forward(model, 1, {64, 0, graph::parse_float_dtype(dtype).value()}).value();
      graph::make_training_step(g, graph::OptimizerConfig{});
      double params = 0, weights = 0, grads = 0, master = 0, moments = 0;
      for (TensorId p : g.parameters()) {
        params += double(g.tensor(p).shape.numel());
        weights += double(g.tensor(p).size_bytes());
        grads += double(g.tensor(g.tensor(p).grad).size_bytes());
      }
      for (TensorId s : g.tensors_with_role(graph::Role::optimizer_state)) {
        const std::string& n = g.tensor(s).name;
        (n.size() > 7 && n.compare(n.size() - 7, 7, ".master") == 0 ? master : moments) += double(g.tensor(s).size_bytes());
      }
      const double total = (weights + grads + master + moments) / params;
      if (std::string(dtype) == "bf16") check(total == 16.0, std::string(model) + " mixed AdamW is 16 B/param");
      rows.push_back({model, dtype, fmt(weights / params, 2), fmt(grads / params, 2), fmt(master / params, 2),
                      fmt(moments / params, 2), fmt(total, 2), std::string(dtype) == "bf16" ? "16 (ZeRO, 2+2+12)" : "16 (4+4+8)"});
      per_param.push_back({{"model", model}, {"dtype", dtype}, {"weights", weights / params}, {"gradients", grads / params},
                           {"master", master / params}, {"adam_moments", moments / params}, {"total", total}});
    }
  }
  std::puts("\n## Bytes per parameter, AdamW (the graph's tensors)\n");
  print_table({"model", "dtype", "weights", "gradients", "fp32 master", "m + v", "total", "published"}, rows);
  out["bytes_per_parameter"] = per_param;

  // --- 3. GPT activations per layer vs Korthikanti et al. 2022 ------------------------------
  // s = sequence, b = batch, h = width, a = heads; 16-bit activations as in the paper.
  const std::int64_t s = 1024, b = 8, h = 1600, a = 25;
  models::ZooOptions materialized{s, 0, graph::DType::bf16};
  materialized.attention = models::AttentionKind::materialized;
  const LayerActivations mat = stored_per_layer("gpt2-xl", b, materialized, "h.10.");
  const std::map<std::string, double>& stored = mat.bytes;
  const double ours = mat.total;
  const double sbh = double(s * b * h);
  const double paper = sbh * (34.0 + 5.0 * double(a) * double(s) / double(h));
  // Our differences, each from a stored tensor: dropout masks hold the keep-scale in the
  // activation dtype (2 bytes, the paper 1): +1 byte per element for the attention mask (as^2b)
  // and the two residual-branch masks (2sbh); layer norms keep f32 (mean, rstd) per row, 8
  // bytes per row each (2 x 8sb).
  const double explained = paper + double(a) * double(s) * double(s) * double(b) + 2.0 * sbh + 16.0 * double(s * b);
  check(ours == explained, "per-layer activations = paper + the differences explained");
  std::printf("\n## GPT-2 XL activations per layer (s=%lld b=%lld h=%lld a=%lld, bf16), layer h.10\n\n",
              static_cast<long long>(s), static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(a));
  rows.clear();
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& [what, bytes] : stored) {
    rows.push_back({what, fmt(bytes / sbh, 3)});
    tensors.push_back({{"tensor", what}, {"bytes", bytes}});
  }
  print_table({"stored for backward", "bytes / sbh"}, rows);
  std::puts("");
  print_table({"", "bytes", "bytes / sbh"},
              {{"Korthikanti sbh(34 + 5as/h)", fmt(paper, 0), fmt(paper / sbh, 3)},
               {"+ attention dropout mask at 2 bytes (as^2b)", fmt(double(a * s * s * b), 0), fmt(double(a * s * s * b) / sbh, 3)},
               {"+ two residual dropout masks at 2 bytes (2sbh)", fmt(2 * sbh, 0), "2.000"},
               {"+ two layer-norm f32 (mean, rstd) rows (16sb)", fmt(16.0 * double(s * b), 0), fmt(16.0 / double(h), 3)},
               {"= explained", fmt(explained, 0), fmt(explained / sbh, 3)},
               {"memplan graph (measured)", fmt(ours, 0), fmt(ours / sbh, 3)}});
  out["korthikanti"] = {{"s", s}, {"b", b}, {"h", h}, {"a", a}, {"paper_bytes", paper}, {"explained_bytes", explained},
                        {"measured_bytes", ours}, {"stored", tensors}};

  // --- 4. fused attention vs Korthikanti et al.'s selective-recompute case sbh * 34 ------------
  // With fused attention nothing of size a*s^2 is stored (the 5as/h term is gone); what remains
  // differs from 34 sbh only by the named tensors below.
  nlohmann::json fused_json = nlohmann::json::array();
  struct FusedCase {
    std::string model, layer;
    std::int64_t s, b, h, a, ffn;
    bool dropout, swiglu;
  };
  for (const FusedCase& c : {FusedCase{"gpt2-xl", "h.10.", 1024, 8, 1600, 25, 6400, true, false},
                             FusedCase{"llama2-7b", "layers.10.", 4096, 1, 4096, 32, 11008, false, true}}) {
    models::ZooOptions fused{c.s, 0, graph::DType::bf16};
    fused.attention = models::AttentionKind::fused;
    const LayerActivations act = stored_per_layer(c.model, c.b, fused, c.layer);
    const double sbh_c = double(c.s * c.b * c.h), sb = double(c.s * c.b);
    const double formula = 34.0 * sbh_c;
    std::vector<std::pair<std::string, double>> diffs;
    // FlashAttention keeps the attention output O for the backward's rowwise dot(dO, O); the paper
    // counts the context only as the output projection's input (the merged copy).
    diffs.push_back({"+ attention output O, read by attention_backward_dot (attn.fused, 2sbh)", 2.0 * sbh_c});
    diffs.push_back({"+ log-sum-exp per row, f32 (attn.fused.lse, 4asb)", 4.0 * double(c.a) * sb});
    if (c.dropout) {
      diffs.push_back({"+ two residual dropout masks at 2 bytes, the paper 1 (2sbh)", 2.0 * sbh_c});
      diffs.push_back({"+ two layer-norm f32 (mean, rstd) rows (16sb)", 16.0 * sb});
    } else {
      diffs.push_back({"- no dropout: the paper's two residual masks (2sbh)", -2.0 * sbh_c});
    }
    if (c.swiglu) {
      // SwiGLU keeps gate (SiLU's input), SiLU's output, up and their product: four [sb, ffn]
      // tensors where GPT's MLP keeps two [sb, 4h] (GELU's input and output).
      diffs.push_back({"+ SwiGLU: gate, act, up, glu [sb, ffn] (8sb*ffn) instead of fc, gelu (16sbh)",
                       8.0 * sb * double(c.ffn) - 16.0 * sbh_c});
    }
    double explained_c = formula;
    for (const auto& [what, bytes] : diffs) explained_c += bytes;
    check(act.total == explained_c, c.model + ": fused per-layer activations = 34 sbh + the differences explained");
    std::printf("\n## %s activations per layer with fused attention (s=%lld b=%lld h=%lld a=%lld, bf16), layer %s\n\n",
                c.model.c_str(), static_cast<long long>(c.s), static_cast<long long>(c.b), static_cast<long long>(c.h),
                static_cast<long long>(c.a), c.layer.c_str());
    rows.clear();
    nlohmann::json tensors_c = nlohmann::json::array();
    for (const auto& [what, bytes] : act.bytes) {
      rows.push_back({what, fmt(bytes / sbh_c, 3)});
      tensors_c.push_back({{"tensor", what}, {"bytes", bytes}});
    }
    print_table({"stored for backward", "bytes / sbh"}, rows);
    std::puts("");
    rows = {{"Korthikanti selective recompute sbh * 34", fmt(formula, 0), "34.000"}};
    nlohmann::json diff_json = nlohmann::json::array();
    for (const auto& [what, bytes] : diffs) {
      rows.push_back({what, fmt(bytes, 0), fmt(bytes / sbh_c, 3)});
      diff_json.push_back({{"difference", what}, {"bytes", bytes}});
    }
    rows.push_back({"= explained", fmt(explained_c, 0), fmt(explained_c / sbh_c, 3)});
    rows.push_back({"memplan graph (measured)", fmt(act.total, 0), fmt(act.total / sbh_c, 3)});
    print_table({"", "bytes", "bytes / sbh"}, rows);
    fused_json.push_back({{"model", c.model}, {"layer", c.layer}, {"s", c.s}, {"b", c.b}, {"h", c.h}, {"a", c.a},
                          {"formula_bytes", formula}, {"differences", diff_json}, {"explained_bytes", explained_c},
                          {"measured_bytes", act.total}, {"stored", tensors_c}});
  }
  out["korthikanti_fused"] = fused_json;
  // A run of some cases keeps the whole run's file.
  const bool some = std::getenv("MEMPLAN_FIT_CASE") != nullptr;
  write_json(std::string(MEMPLAN_SOURCE_DIR) + "/bench/results/" + (some ? "fit_cases.json" : "fit.json"), out);
  return 0;
}
