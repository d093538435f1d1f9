// Tensor parallelism's activation memory per rank against Korthikanti et al. 2022 ("Reducing
// Activation Recomputation in Large Transformer Models", eq. 2): one layer of a GPT keeps
// sbh(10 + 24/t + 5as/(ht)) bytes for its backward pass on each of t tensor-parallel ranks,
// without sequence parallelism or recomputation (16-bit activations, 1-byte dropout masks).
// The bench builds each rank's training step, sums the forward tensors of one layer that a
// backward op reads, and explains every byte of difference from the formula by a named tensor;
// it also prints the whole step's arena per rank from `plan_step`. GPT-2 XL's width (h = 1600)
// and sequence (s = 1024) at b = 8, bf16, dropout 0.1, materialized attention (the paper's
// softmax, its dropout and their mask are [a, s, s] per sample). GPT-2 XL's 25 heads split over no
// t in {2, 4, 8} (Megatron-LM needs a multiple of t, as memplan does), so the layer has 32 heads of
// 50 channels: the formula's terms see a only through 5as/(ht).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "bench_util.h"
#include "memplan/graph/tensor_parallel.h"
#include "memplan/models/gpt.h"
#include "memplan/models/registry.h"
#include "memplan/models/model_source.h"
#include "memplan/planner/plan_step.h"

namespace memplan::bench {
namespace {

constexpr std::int64_t s = 1024, b = 8, h = 1600, a = 32, V = 50257, kLayers = 3;
const std::string kLayer = "h.1.";  // a middle layer: neither the embedding's nor the head's neighbour

models::GptConfig layer_config(int t, bool sequence_parallel = false) {
  models::GptConfig c;
  c.vocab = V;
  c.context = s;
  c.max_positions = 1024;
  c.layers = kLayers;
  c.heads = a;
  c.width = h;
  c.dropout = 0.1f;
  c.dtype = graph::DType::bf16;
  c.attention = models::AttentionKind::materialized;
  c.tensor_parallel = {t, 0, sequence_parallel && t > 1};
  return c;
}

// The forward tensors of layer kLayer that a backward op reads, on one rank.
LayerActivations stored_per_layer(int t, bool sequence_parallel = false) {
  return stored_for_backward(models::build_gpt(layer_config(t, sequence_parallel), b), kLayer);
}

// The arena of one rank's whole step (AdamW, mixed precision) as plan_step plans it.
std::int64_t arena_per_rank(int t, bool sequence_parallel = false) {
  models::ModelOptions options;
  options.name = "gpt";
  options.gpt = layer_config(t, sequence_parallel);
  planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(options), b);
  step.dtype = graph::DType::bf16;
  auto planned = planner::plan_step(step, planner::PlanRequest{});
  if (!planned) {
    std::fprintf(stderr, "plan_step at t=%d: %s\n", t, planned.error().message.c_str());
    std::exit(1);
  }
  return planned.value().plan.arena_bytes;
}

}  // namespace
}  // namespace memplan::bench

int main() {
  using namespace memplan;
  using namespace memplan::bench;
  const double sbh = double(s * b * h), sb = double(s * b);
  nlohmann::json out;
  out["s"] = s;
  out["b"] = b;
  out["h"] = h;
  out["a"] = a;
  nlohmann::json per_t = nlohmann::json::array();
  std::vector<std::vector<std::string>> summary;
  for (int t : {1, 2, 4, 8}) {
    const LayerActivations stored = stored_per_layer(t);
    const double paper = sbh * (10.0 + 24.0 / t + 5.0 * double(a) * double(s) / (double(h) * t));
    // The differences, each a stored tensor's: the dropout masks hold the keep-scale in the
    // activation dtype (2 bytes, the paper 1): +1 byte per element for the attention mask of
    // this rank's heads (as^2b/t) and the two residual-branch masks, which every rank keeps whole
    // (2sbh); the layer norms keep f32 (mean, rstd) per row, 8 bytes per row each (2 x 8sb), on
    // every rank.
    const double attention_mask = double(a) * double(s) * double(s) * double(b) / t;
    const double explained = paper + attention_mask + 2.0 * sbh + 16.0 * sb;
    if (stored.total != explained) {
      std::fprintf(stderr, "t=%d: measured %.0f bytes, explained %.0f (difference %.0f)\n", t, stored.total, explained,
                   stored.total - explained);
      for (const auto& [what, bytes] : stored.bytes) std::fprintf(stderr, "  %s %.0f (%.4f sbh)\n", what.c_str(), bytes, bytes / sbh);
      return 1;
    }
    std::printf("\n## t = %d: one rank's layer %s (s=%lld b=%lld h=%lld a=%lld, bf16, materialized attention)\n\n", t,
                kLayer.c_str(), static_cast<long long>(s), static_cast<long long>(b), static_cast<long long>(h),
                static_cast<long long>(a));
    std::vector<std::vector<std::string>> rows;
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& [what, bytes] : stored.bytes) {
      rows.push_back({what, fmt(bytes / sbh, 4)});
      tensors.push_back({{"tensor", what}, {"bytes", bytes}});
    }
    print_table({"stored for backward", "bytes / sbh"}, rows);
    std::puts("");
    print_table({"", "bytes", "bytes / sbh"},
                {{"Korthikanti sbh(10 + 24/t + 5as/(ht))", fmt(paper, 0), fmt(paper / sbh, 4)},
                 {"+ attention dropout mask of this rank's heads at 2 bytes (as^2b/t)", fmt(attention_mask, 0),
                  fmt(attention_mask / sbh, 4)},
                 {"+ two residual dropout masks at 2 bytes, whole on every rank (2sbh)", fmt(2.0 * sbh, 0), "2.0000"},
                 {"+ two layer-norm f32 (mean, rstd) rows, whole on every rank (16sb)", fmt(16.0 * sb, 0), fmt(16.0 / double(h), 4)},
                 {"= explained", fmt(explained, 0), fmt(explained / sbh, 4)},
                 {"memplan graph (measured)", fmt(stored.total, 0), fmt(stored.total / sbh, 4)}});
    const std::int64_t arena = arena_per_rank(t);
    summary.push_back({std::to_string(t), fmt(paper / sbh, 3), fmt(stored.total / sbh, 3), fmt(stored.total / double(1ull << 20), 1),
                       fmt(double(arena) / double(1ull << 30), 2)});
    per_t.push_back({{"t", t}, {"paper_bytes", paper}, {"explained_bytes", explained}, {"measured_bytes", stored.total},
                     {"arena_bytes_per_rank", arena}, {"stored", tensors}});
  }
  std::printf("\n## Summary: per-rank activation bytes of one layer, and the %lld-layer step's arena per rank\n\n",
              static_cast<long long>(kLayers));
  print_table({"t", "paper / sbh", "measured / sbh", "measured MiB", "arena per rank GiB (AdamW, bf16)"}, summary);
  out["per_tensor_parallel_degree"] = per_t;

  // With sequence parallelism (--sequence-parallel) the paper's per-rank bytes are
  // sbh(34/t + 5as/(ht)): the norms, residual dropouts and their inputs on 1/t of the rows too.
  // The same three differences, now all on 1/t of the rows. The column-parallel blocks' inputs
  // are kept as this rank's rows and gathered again for the backward pass, as Megatron-LM does.
  nlohmann::json per_t_sp = nlohmann::json::array();
  std::vector<std::vector<std::string>> summary_sp;
  for (int t : {2, 4, 8}) {
    const LayerActivations stored = stored_per_layer(t, true);
    const double paper = sbh * (34.0 / t + 5.0 * double(a) * double(s) / (double(h) * t));
    const double attention_mask = double(a) * double(s) * double(s) * double(b) / t;
    const double explained = paper + attention_mask + 2.0 * sbh / t + 16.0 * sb / t;
    if (stored.total != explained) {
      std::fprintf(stderr, "sequence-parallel t=%d: measured %.0f bytes, explained %.0f (difference %.0f)\n", t, stored.total,
                   explained, stored.total - explained);
      for (const auto& [what, bytes] : stored.bytes) std::fprintf(stderr, "  %s %.0f (%.4f sbh)\n", what.c_str(), bytes, bytes / sbh);
      return 1;
    }
    std::printf("\n## t = %d, --sequence-parallel: one rank's layer %s\n\n", t, kLayer.c_str());
    print_table({"", "bytes", "bytes / sbh"},
                {{"Korthikanti sbh(34/t + 5as/(ht))", fmt(paper, 0), fmt(paper / sbh, 4)},
                 {"+ attention dropout mask of this rank's heads at 2 bytes (as^2b/t)", fmt(attention_mask, 0),
                  fmt(attention_mask / sbh, 4)},
                 {"+ two residual dropout masks at 2 bytes, this rank's rows (2sbh/t)", fmt(2.0 * sbh / t, 0), fmt(2.0 / t, 4)},
                 {"+ two layer-norm f32 (mean, rstd), this rank's rows (16sb/t)", fmt(16.0 * sb / t, 0), fmt(16.0 / double(h) / t, 4)},
                 {"= explained", fmt(explained, 0), fmt(explained / sbh, 4)},
                 {"memplan graph (measured)", fmt(stored.total, 0), fmt(stored.total / sbh, 4)}});
    const std::int64_t arena = arena_per_rank(t, true);
    summary_sp.push_back({std::to_string(t), fmt(paper / sbh, 3), fmt(stored.total / sbh, 3),
                          fmt(stored.total / double(1ull << 20), 1), fmt(double(arena) / double(1ull << 30), 2)});
    per_t_sp.push_back({{"t", t}, {"paper_bytes", paper}, {"explained_bytes", explained}, {"measured_bytes", stored.total},
                        {"arena_bytes_per_rank", arena}});
  }
  std::printf("\n## Summary with --sequence-parallel\n\n");
  print_table({"t", "paper / sbh", "measured / sbh", "measured MiB", "arena per rank GiB (AdamW, bf16)"}, summary_sp);
  out["sequence_parallel_per_degree"] = per_t_sp;
  write_json(std::string(MEMPLAN_SOURCE_DIR) + "/bench/results/tensor_parallel.json", out);
  return 0;
}
