// Tensor parallelism as graphs (graph/tensor_parallel.h): each rank's slice of the GPT and the
// rotary decoders (shapes, the collectives between the slices, what cannot split), the
// vocabulary-parallel cross-entropy's arithmetic against the whole vocabulary's (the kernels run
// slice by slice in one process), and the slices' layout helpers. Ranks against one process:
// tests/tensor_parallel_mpi_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "memplan/graph/tensor_parallel.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/gpt.h"
#include "memplan/models/llama.h"
#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/plan_step.h"

namespace memplan {
namespace {

using graph::OpKind;
using graph::RankGroup;

int count_group_ops(const graph::Graph& g, OpKind kind, RankGroup group = RankGroup::data) {
  int n = 0;
  for (const graph::Op& op : g.ops()) n += op.kind == kind && op.attrs.group == group ? 1 : 0;
  return n;
}

models::GptConfig small_gpt(int degree, int rank) {
  models::GptConfig c;
  c.vocab = 97;  // odd: the last slice holds padding
  c.context = 8;
  c.layers = 2;
  c.heads = 4;
  c.width = 32;
  c.tensor_parallel = {degree, rank};
  return c;
}

const graph::TensorDesc& tensor(const graph::Graph& g, const std::string& name) {
  const TensorId id = g.find(name);
  EXPECT_NE(id, kNoTensor) << name;
  return g.tensor(id);
}

TEST(TensorParallelGraph, GptSlicesEveryLayerAndSumsTheRowParallelOutputs) {
  const graph::Graph slice = models::build_gpt(small_gpt(2, 1), 2);
  // Column-parallel: rank 1 holds output features [16, 32) of q, k, v and the MLP's first layer.
  for (const char* name : {"h.0.attn.q.weight", "h.1.attn.v.weight"}) {
    const graph::TensorDesc& w = tensor(slice, name);
    EXPECT_EQ(w.shape, (graph::Shape{16, 32})) << name;
    EXPECT_EQ(w.tp_axis, 0) << name;
    EXPECT_EQ(w.tp_index, 1) << name;
    EXPECT_EQ(w.tp_parts, 2) << name;
  }
  EXPECT_EQ(tensor(slice, "h.0.attn.q.bias").shape, graph::Shape{16});
  EXPECT_EQ(tensor(slice, "h.0.mlp.fc.weight").shape, (graph::Shape{64, 32}));
  // Row-parallel: input features split, the bias whole (added after the sum).
  EXPECT_EQ(tensor(slice, "h.0.attn.proj.weight").shape, (graph::Shape{32, 16}));
  EXPECT_EQ(tensor(slice, "h.0.attn.proj.weight").tp_axis, 1);
  EXPECT_EQ(tensor(slice, "h.0.mlp.proj.weight").shape, (graph::Shape{32, 64}));
  EXPECT_EQ(tensor(slice, "h.0.attn.proj.bias").tp_axis, -1);
  EXPECT_EQ(tensor(slice, "ln_f.weight").tp_axis, -1);
  // The vocabulary: 97 rows padded to 2 x 49.
  const graph::TensorDesc& wte = tensor(slice, "wte.weight");
  EXPECT_EQ(wte.shape, (graph::Shape{49, 32}));
  EXPECT_EQ(wte.tp_whole, 97);
  EXPECT_EQ(graph::whole_shape(wte), (graph::Shape{97, 32}));
  EXPECT_EQ(graph::padded_whole_shape(wte), (graph::Shape{98, 32}));
  EXPECT_EQ(tensor(slice, "logits").shape, (graph::Shape{16, 49}));
  // Per layer: a sum after attention's projection and after the MLP's, one after the embedding;
  // an identity into attention, into the MLP, and into the head (whose gradients are summed).
  EXPECT_EQ(count_group_ops(slice, OpKind::all_reduce, RankGroup::tensor), 2 * 2 + 1);
  EXPECT_EQ(count_group_ops(slice, OpKind::tp_copy, RankGroup::tensor), 2 * 2 + 1);
  EXPECT_EQ(count_group_ops(slice, OpKind::all_gather, RankGroup::tensor), 1);  // the loss's statistics
  EXPECT_EQ(count_group_ops(slice, OpKind::vocab_parallel_loss, RankGroup::tensor), 1);
  EXPECT_EQ(count_group_ops(slice, OpKind::softmax_cross_entropy), 0);

  // One rank: the unsplit model, no tensor-parallel op at all.
  const graph::Graph whole = models::build_gpt(small_gpt(1, 0), 2);
  EXPECT_EQ(count_group_ops(whole, OpKind::all_reduce, RankGroup::tensor), 0);
  EXPECT_EQ(count_group_ops(whole, OpKind::tp_copy, RankGroup::tensor), 0);
  EXPECT_EQ(tensor(whole, "wte.weight").tp_axis, -1);
  EXPECT_EQ(tensor(whole, "h.0.attn.q.weight").shape, (graph::Shape{32, 32}));
}

TEST(TensorParallelGraph, TheBackwardSumsTheGradientOfEveryColumnParallelInput) {
  models::ModelOptions options;
  options.name = "gpt";
  options.gpt = small_gpt(2, 0);
  planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(options), 2);
  planner::PlanRequest request;
  auto planned = planner::plan_step(step, request);
  ASSERT_TRUE(planned) << planned.error().message;
  const graph::Graph& g = planned.value().graph;
  int forward = 0, backward = 0;
  for (const graph::Op& op : g.ops()) {
    if (op.kind != OpKind::all_reduce || op.attrs.group != RankGroup::tensor) continue;
    (op.phase == graph::Phase::forward ? forward : backward) += 1;
  }
  EXPECT_EQ(forward, 5);
  EXPECT_EQ(backward, 5);  // one per tp_copy: attention's and the MLP's inputs, the head's
  EXPECT_EQ(count_group_ops(g, OpKind::vocab_parallel_cross_entropy_backward, RankGroup::tensor), 1);
}

// Sequence parallelism: between the parallel layers (norms, residual adds, residual dropouts)
// each rank holds its own half of the 16 token rows; the gathered rows feed the column-parallel
// layers and the head, and the row-parallel outputs are reduce-scattered back to the halves.
TEST(SequenceParallelGraph, TheStreamBetweenTheParallelLayersHoldsThisRanksRows) {
  models::GptConfig c = small_gpt(2, 1);
  c.tensor_parallel.sequence_parallel = true;
  c.dropout = 0.1f;
  const graph::Graph g = models::build_gpt(c, 2);  // 2 x 8 = 16 rows
  EXPECT_EQ(tensor(g, "residual0").shape, (graph::Shape{16, 32}));  // the embeddings: whole on every rank
  for (const char* name : {"residual0.shard", "h.0.ln_1", "h.0.residual1", "h.1.residual2", "ln_f"}) {
    EXPECT_EQ(tensor(g, name).shape, (graph::Shape{8, 32})) << name;
  }
  for (const char* name : {"h.0.attn.in", "h.1.mlp.in", "head.in"}) {
    EXPECT_EQ(tensor(g, name).shape, (graph::Shape{16, 32})) << name;
  }
  EXPECT_EQ(tensor(g, "logits").shape, (graph::Shape{16, 49}));
  // Per layer two gathers and two reduce-scatters, a gather into the head and the loss's
  // statistics'; the embedding's sum stays an all-reduce. Identities (whose gradients are summed
  // over the ranks): one into the shards, one per parameter read on this rank's rows (per layer
  // two norms' weight and bias and two row-parallel biases; the final norm's weight and bias).
  const int on_rows = 2 * (2 * 2 + 2) + 2;
  EXPECT_EQ(count_group_ops(g, OpKind::all_gather, RankGroup::tensor), 2 * 2 + 2);
  EXPECT_EQ(count_group_ops(g, OpKind::reduce_scatter, RankGroup::tensor), 2 * 2);
  EXPECT_EQ(count_group_ops(g, OpKind::all_reduce, RankGroup::tensor), 1);
  EXPECT_EQ(count_group_ops(g, OpKind::tp_copy, RankGroup::tensor), 1 + on_rows);
  EXPECT_EQ(g.ops()[static_cast<std::size_t>(g.producer(g.find("h.0.ln_1.weight.rows")))].kind, OpKind::tp_copy);
  // A residual dropout on this rank's rows draws this rank's mask.
  EXPECT_NE(g.find("h.0.attn.proj.drop.rank1.mask"), kNoTensor);

  // The backward: a reduce-scatter per differentiated gather, a gather per reduce-scatter, a
  // second gather of each column-parallel input's rows for the weight gradients (the forward's
  // gathered rows are not kept for the backward), and the identities' sums (the embeddings' rows,
  // the norms' and biases' gradients).
  models::ModelOptions options;
  options.name = "gpt";
  options.gpt = c;
  auto planned = planner::plan_step(planner::StepDescription::of_source(models::registry_source(options), 2), {});
  ASSERT_TRUE(planned) << planned.error().message;
  const graph::Graph& step = planned.value().graph;
  int gathers = 0, scatters = 0, sums = 0;
  for (const graph::Op& op : step.ops()) {
    if (op.phase != graph::Phase::backward) continue;
    for (const char* gathered : {"h.0.attn.in", "h.1.mlp.in", "head.in"}) {
      for (TensorId in : op.inputs) EXPECT_NE(in, step.find(gathered)) << op.name << " reads the forward's gathered rows";
    }
    if (op.attrs.group != RankGroup::tensor) continue;
    gathers += op.kind == OpKind::all_gather ? 1 : 0;
    scatters += op.kind == OpKind::reduce_scatter ? 1 : 0;
    sums += op.kind == OpKind::all_reduce ? 1 : 0;
  }
  EXPECT_EQ(gathers, 2 * 2 + 2 * 2 + 1);
  EXPECT_EQ(scatters, 2 * 2 + 1);
  EXPECT_EQ(sums, 1 + on_rows);

  // Rows that do not split between the ranks.
  c.context = 7;
  try {
    models::build_gpt(c, 1);
    ADD_FAILURE() << "7 rows split over 2 ranks";
  } catch (const graph::GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("token rows"), std::string::npos) << e.what();
  }
}

// What sequence parallelism saves: a layer's norms, residual dropouts and their inputs are kept
// for the backward pass on this rank's rows only, so one rank's step plans a smaller arena.
TEST(SequenceParallelGraph, EachRankKeepsItsShareOfTheNormsAndDropouts) {
  auto arena = [](bool sequence_parallel) {
    models::ModelOptions options;
    options.name = "gpt";
    options.gpt = small_gpt(2, 0);
    options.gpt.context = 64;
    options.gpt.dropout = 0.1f;
    options.gpt.tensor_parallel.sequence_parallel = sequence_parallel;
    auto planned = planner::plan_step(planner::StepDescription::of_source(models::registry_source(options), 8), {});
    EXPECT_TRUE(planned) << planned.error().message;
    return planned ? planned.value().plan.arena_bytes : Bytes{0};
  };
  EXPECT_LT(arena(true), arena(false));
}

TEST(TensorParallelGraph, ParameterCountIsTheModelsWhateverTheSplit) {
  auto count = [](int degree) {
    models::ModelOptions options;
    options.name = "gpt";
    options.gpt = small_gpt(degree, 0);
    auto planned = planner::plan_step(planner::StepDescription::of_source(models::registry_source(options), 2), {});
    EXPECT_TRUE(planned) << planned.error().message;
    return planned ? planned.value().parameter_count() : 0;
  };
  EXPECT_EQ(count(2), count(1));
  EXPECT_EQ(count(4), count(1));  // 97 rows padded to 4 x 25: the padding is not the model's
}

TEST(TensorParallelGraph, RotaryDecodersSplitQueryAndKeyValueHeads) {
  models::LlamaConfig c;
  c.vocab = 100;
  c.context = 8;
  c.layers = 1;
  c.width = 64;
  c.heads = 8;
  c.kv_heads = 2;
  c.ffn = 96;
  c.tensor_parallel = {2, 0};
  const graph::Graph g = models::build_llama(c, 2);
  EXPECT_EQ(tensor(g, "layers.0.self_attn.q_proj.weight").shape, (graph::Shape{32, 64}));
  EXPECT_EQ(tensor(g, "layers.0.self_attn.k_proj.weight").shape, (graph::Shape{8, 64}));  // one K/V head of 8
  EXPECT_EQ(tensor(g, "layers.0.self_attn.o_proj.weight").shape, (graph::Shape{64, 32}));
  EXPECT_EQ(tensor(g, "layers.0.mlp.gate_proj.weight").shape, (graph::Shape{48, 64}));
  EXPECT_EQ(tensor(g, "layers.0.mlp.down_proj.weight").shape, (graph::Shape{64, 48}));
  EXPECT_EQ(tensor(g, "lm_head.weight").shape, (graph::Shape{50, 64}));
  EXPECT_EQ(count_group_ops(g, OpKind::all_reduce, RankGroup::tensor), 2 + 1);

  // More ranks than K/V heads: refused, naming what does not split.
  c.tensor_parallel = {4, 0};
  try {
    models::build_llama(c, 2);
    ADD_FAILURE() << "4 ranks over 2 K/V heads";
  } catch (const graph::GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tensor-parallel"), std::string::npos) << e.what();
  }
  // A mixture of experts splits each expert's hidden width as the dense MLP's (rank 1: columns
  // [48, 96) of the gate and up projections, inputs [48, 96) of the down one); the router stays
  // whole; the combined partial outputs are summed. Not under sequence parallelism.
  c.tensor_parallel = {2, 1};
  c.moe.experts = 4;
  c.moe.capacity_factor = 0.0;
  const graph::Graph moe = models::build_llama(c, 2);
  EXPECT_EQ(tensor(moe, "layers.0.mlp.experts.gate_proj.weight").shape, (graph::Shape{4, 48, 64}));
  EXPECT_EQ(tensor(moe, "layers.0.mlp.experts.gate_proj.weight").tp_axis, 1);
  EXPECT_EQ(tensor(moe, "layers.0.mlp.experts.down_proj.weight").shape, (graph::Shape{4, 64, 48}));
  EXPECT_EQ(tensor(moe, "layers.0.mlp.experts.down_proj.weight").tp_axis, 2);
  EXPECT_EQ(tensor(moe, "layers.0.mlp.gate.weight").shape, (graph::Shape{4, 64}));
  EXPECT_EQ(tensor(moe, "layers.0.mlp.gate.weight").tp_axis, -1);
  EXPECT_NE(moe.find("layers.0.mlp.combine.sum"), kNoTensor);
  EXPECT_NE(moe.find("layers.0.mlp.gates.shared"), kNoTensor) << "the gates enter the split experts through tp_copy";
  c.tensor_parallel.sequence_parallel = true;
  EXPECT_THROW(models::build_llama(c, 2), graph::GraphError);
}

// Latent attention splits its heads: q_b_proj's and kv_b_proj's output heads, o_proj's input
// heads; the down projections and their norms stay whole.
TEST(TensorParallelGraph, LatentAttentionSplitsItsHeads) {
  models::LlamaConfig c;
  c.vocab = 50;
  c.context = 8;
  c.layers = 1;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 4;
  c.ffn = 48;
  c.mla = {12, 10, 6, 4, 5};  // q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head
  c.tensor_parallel = {2, 0};
  const graph::Graph g = models::build_llama(c, 2);
  EXPECT_EQ(tensor(g, "layers.0.self_attn.q_b_proj.weight").shape, (graph::Shape{2 * 10, 12}));
  EXPECT_EQ(tensor(g, "layers.0.self_attn.kv_b_proj.weight").shape, (graph::Shape{2 * 11, 10}));
  EXPECT_EQ(tensor(g, "layers.0.self_attn.o_proj.weight").shape, (graph::Shape{32, 2 * 5}));
  EXPECT_EQ(tensor(g, "layers.0.self_attn.o_proj.weight").tp_axis, 1);
  EXPECT_EQ(tensor(g, "layers.0.self_attn.q_a_proj.weight").shape, (graph::Shape{12, 32}));
  EXPECT_EQ(tensor(g, "layers.0.self_attn.kv_a_proj_with_mqa.weight").shape, (graph::Shape{14, 32}));
  EXPECT_EQ(tensor(g, "layers.0.self_attn.kv_a_proj_with_mqa.weight").tp_axis, -1);
  EXPECT_EQ(count_group_ops(g, OpKind::tp_copy, RankGroup::tensor), 3 + 2)
      << "q latent, k_pe and kv latent; the MLP's and the vocabulary head's inputs";
}

TEST(TensorParallelGraph, ModelsWithoutAttentionOrMlpLayersRefuseIt) {
  for (const char* name : {"mlp", "cnn"}) {
    models::ModelOptions options;
    options.name = name;
    models::set_tensor_parallel(options, {2, 0});
    auto built = models::build_forward(options, 2);
    ASSERT_FALSE(built) << name;
    EXPECT_NE(built.error().message.find("--tensor-parallel"), std::string::npos) << built.error().message;
    // The source a planner sees refuses alike.
    EXPECT_THROW(models::registry_source(options).forward(2), graph::GraphError) << name;
  }
}

// --- the vocabulary-parallel cross-entropy, slice by slice -------------------------------------------

kernels::TensorRef ref(std::vector<float>& v, const graph::Shape& shape) { return {v.data(), &shape, graph::DType::f32}; }
kernels::TensorRef ref(std::vector<std::int32_t>& v, const graph::Shape& shape) {
  return {v.data(), &shape, graph::DType::i32};
}

void run(OpKind kind, const graph::OpAttrs& attrs, std::vector<kernels::TensorRef> in, std::vector<kernels::TensorRef> out,
         std::int64_t first_row = 0) {
  kernels::KernelFn fn = kernels::find_kernel(kind, kernels::DeviceKind::cpu);
  ASSERT_NE(fn, nullptr) << graph::op_name(kind);
  kernels::KernelCall call{kind, &attrs, in, out, {}};
  call.first_row = first_row;
  fn(call);
}

// The loss and gradient from two slices of the vocabulary equal the whole vocabulary's: 5 rows of
// 7 classes, slices of 4 columns (the second's last is padding, filled with a logit large enough
// to change the loss if it were counted), labels in both slices.
TEST(VocabParallelCrossEntropy, SlicesCombineToTheWholeVocabularysLossAndGradient) {
  const std::int64_t rows = 5, classes = 7, world = 2, slice = 4;
  std::vector<float> logits(rows * classes);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.7f * float(i)) * 3.0f;
  std::vector<std::int32_t> labels = {0, 6, 3, 4, 1};
  const graph::Shape whole_shape{rows, classes}, label_shape{rows}, scalar{}, slice_shape{rows, slice};
  std::vector<float> loss(1), dloss = {1.5f}, dwhole(rows * classes);
  graph::OpAttrs plain;
  run(OpKind::softmax_cross_entropy, plain, {ref(logits, whole_shape), ref(labels, label_shape)}, {ref(loss, scalar)});
  run(OpKind::softmax_cross_entropy_backward, plain,
      {ref(dloss, scalar), ref(logits, whole_shape), ref(labels, label_shape)}, {ref(dwhole, whole_shape)});

  const graph::Shape gathered_shape{world, rows, 2};
  std::vector<float> gathered(world * rows * 2);
  std::vector<std::vector<float>> slices(world, std::vector<float>(rows * slice, 40.0f));
  std::vector<graph::OpAttrs> attrs(world);
  for (std::int64_t r = 0; r < world; ++r) {
    attrs[r].world = world;
    attrs[r].group = RankGroup::tensor;
    attrs[r].start = r * slice;
    attrs[r].length = std::min(slice, classes - r * slice);
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < attrs[r].length; ++j) slices[r][i * slice + j] = logits[i * classes + r * slice + j];
    }
    std::vector<float> stats(rows * 2);
    const graph::Shape stats_shape{rows, 2};
    run(OpKind::vocab_parallel_stats, attrs[r], {ref(slices[r], slice_shape), ref(labels, label_shape)},
        {ref(stats, stats_shape)});
    std::copy(stats.begin(), stats.end(), gathered.begin() + r * rows * 2);  // what the all_gather lays out
  }
  for (std::int64_t r = 0; r < world; ++r) {
    std::vector<float> sliced_loss(1);
    run(OpKind::vocab_parallel_loss, attrs[r],
        {ref(gathered, gathered_shape), ref(slices[r], slice_shape), ref(labels, label_shape)}, {ref(sliced_loss, scalar)});
    EXPECT_NEAR(sliced_loss[0], loss[0], 1e-6f * std::fabs(loss[0])) << "rank " << r;
    // The gradient, in two calls of rows [0, 2) and [2, 5) (the widening adapter's row slices).
    std::vector<float> dslice(rows * slice, -1.0f);
    for (const auto& [first, count] : {std::pair<std::int64_t, std::int64_t>{0, 2}, {2, 3}}) {
      const graph::Shape part{count, slice}, part_labels{count};
      std::vector<float> part_logits(slices[r].begin() + first * slice, slices[r].begin() + (first + count) * slice);
      std::vector<std::int32_t> part_ids(labels.begin() + first, labels.begin() + first + count);
      std::vector<float> out(count * slice);
      run(OpKind::vocab_parallel_cross_entropy_backward, attrs[r],
          {ref(dloss, scalar), ref(part_logits, part), ref(part_ids, part_labels), ref(gathered, gathered_shape)},
          {ref(out, part)}, first);
      std::copy(out.begin(), out.end(), dslice.begin() + first * slice);
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < slice; ++j) {
        const std::int64_t column = r * slice + j;
        const float want = column < classes ? dwhole[i * classes + column] : 0.0f;  // padding: no gradient
        EXPECT_NEAR(dslice[i * slice + j], want, 1e-6f) << "rank " << r << " row " << i << " column " << column;
      }
    }
  }
}

// --- slices of whole tensors ------------------------------------------------------------------------

TEST(TensorParallelSlices, AssemblingTheSlicesGivesTheWholeTensorWithoutItsPadding) {
  for (int axis : {0, 1}) {
    // A [7, 3] (axis 0) or [3, 7] (axis 1) tensor in 3 slices of 3 along the axis: 2 rows of padding.
    graph::TensorDesc desc;
    desc.dtype = graph::DType::f32;
    desc.shape = graph::Shape{3, 3};  // one slice, either way
    desc.tp_axis = axis;
    desc.tp_parts = 3;
    desc.tp_whole = 7;
    const graph::Shape padded = graph::padded_whole_shape(desc);
    ASSERT_EQ(padded, (graph::Shape{axis == 0 ? 9 : 3, axis == 0 ? 3 : 9}));
    std::vector<float> whole(static_cast<std::size_t>(padded.numel()));
    for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = float(i);
    std::vector<std::byte> all;
    for (int r = 0; r < 3; ++r) {
      desc.tp_index = r;
      const std::vector<std::byte> s = graph::slice_of(desc, std::as_bytes(std::span<const float>(whole)));
      ASSERT_EQ(s.size(), 9 * sizeof(float));
      all.insert(all.end(), s.begin(), s.end());
    }
    const std::vector<std::byte> back = graph::assemble_slices(desc, all, /*crop=*/false);
    ASSERT_EQ(back.size(), whole.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(back.data(), whole.data(), back.size()), 0) << "axis " << axis;
    const std::vector<std::byte> cropped = graph::assemble_slices(desc, all, /*crop=*/true);
    ASSERT_EQ(cropped.size(), 21 * sizeof(float));
    std::vector<float> values(21);
    std::memcpy(values.data(), cropped.data(), cropped.size());
    for (std::int64_t i = 0; i < 21; ++i) {
      const std::int64_t row = axis == 0 ? i / 3 : i / 7, col = axis == 0 ? i % 3 : i % 7;
      const float want = axis == 0 ? whole[static_cast<std::size_t>(row * 3 + col)] : whole[static_cast<std::size_t>(row * 9 + col)];
      EXPECT_EQ(values[static_cast<std::size_t>(i)], want) << "axis " << axis << " element " << i;
    }
  }
}

}  // namespace
}  // namespace memplan
