// Mixed precision on the CPU: the 16-bit conversions against independent references (the
// compiler's _Float16, and bf16's nearest neighbours worked out in double), a forward graph at a
// working dtype keeping in f32 what its rows compute in f32, the f32 copies that ops split by rows
// compute exactly what the whole op computes, the master copies starting as their parameters do,
// and a plan without room for the copies refused before anything runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "memplan/dist/communicator.h"
#include "memplan/graph/autograd.h"
#include "memplan/graph/builder.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/graph/training_step.h"
#include "memplan/kernels/half.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/llama.h"
#include "memplan/models/model_source.h"
#include "memplan/planner/device_profile.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/trainer.h"
#include "memplan/runtime/weights.h"

namespace memplan {
namespace {

using graph::DType;
using kernels::bf16_to_f32;
using kernels::f16_to_f32;
using kernels::f32_to_bf16;
using kernels::f32_to_f16;

std::uint16_t bits_of(_Float16 h) {
  std::uint16_t u;
  std::memcpy(&u, &h, sizeof u);
  return u;
}
_Float16 half_of(std::uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, sizeof h);
  return h;
}
bool is_nan16(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// Every f16 value widens as the compiler's _Float16 does (NaN to a NaN), and narrows back to itself.
TEST(HalfConversion, EveryF16WidensExactlyAndComesBack) {
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    const float mine = f16_to_f32(h);
    const float compiler = static_cast<float>(half_of(h));
    if (is_nan16(h)) {
      EXPECT_TRUE(std::isnan(mine)) << std::hex << u;
      EXPECT_TRUE(is_nan16(f32_to_f16(mine))) << std::hex << u;
      continue;
    }
    ASSERT_EQ(kernels::float_bits(mine), kernels::float_bits(compiler)) << std::hex << u;
    ASSERT_EQ(f32_to_f16(mine), h) << std::hex << u;
  }
}

// f32 to f16 rounds as the compiler does (to nearest, ties to even; overflow to infinity; the
// subnormal range), on the edges and on a million random bit patterns.
TEST(HalfConversion, F32NarrowsToF16AsTheCompilerDoes) {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 1e6f, -1e6f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               5.960464477539063e-8f, 2.9802322387695312e-8f, 2.98023259e-8f, 8.940697e-8f, 6.1035156e-5f,
                               6.1035152e-5f, 1.00048828125f, 1.000732421875f, 1.0009765625f, 3.0517578125e-5f};
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) values.push_back(kernels::bits_float(rng()));
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(is_nan16(f32_to_f16(f)));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), bits_of(static_cast<_Float16>(f))) << f << " bits " << std::hex << kernels::float_bits(f);
  }
}

// The bf16 nearest to f worked out in double: the two bf16 values around f, the nearer one, a tie
// going to the even one; overflow past the largest finite bf16 (by half an ulp or more) to infinity.
std::uint16_t nearest_bf16(float f) {
  const std::uint32_t u = kernels::float_bits(f);
  const auto down = static_cast<std::uint16_t>(u >> 16);  // toward zero
  const auto up = static_cast<std::uint16_t>(down + 1);   // away from zero (the next magnitude)
  const double lo = std::fabs(double(bf16_to_f32(down)));
  const double hi = (up & 0x7fffu) == 0x7f80u ? std::ldexp(1.0, 128) : std::fabs(double(bf16_to_f32(up)));
  const double x = std::fabs(double(f));
  if (x - lo < hi - x) return down;
  if (x - lo > hi - x) return up;
  return (down & 1u) == 0 ? down : up;
}

TEST(HalfConversion, F32NarrowsToTheNearestBf16TiesToEven) {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.005859375f, 1.001953125f, 3.3895314e38f, 3.4028235e38f,
                               -3.4028235e38f, 1e-40f, std::numeric_limits<float>::infinity()};
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) values.push_back(kernels::bits_float(rng()));
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    if (std::isinf(f)) {
      EXPECT_EQ(f32_to_bf16(f), static_cast<std::uint16_t>(kernels::float_bits(f) >> 16));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), nearest_bf16(f)) << f << " bits " << std::hex << kernels::float_bits(f);
  }
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    if (std::isnan(bf16_to_f32(h))) continue;
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(h)), h) << std::hex << u;
  }
}

// The arrays convert as the scalars do, with a length that is no multiple of any vector width.
TEST(HalfConversion, ArraysConvertAsTheScalarsDo) {
  std::vector<float> x(100003);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (float& v : x) v = normal(rng);
  // Edges (overflow, subnormals, ties, infinities) and random bit patterns, in vector-sized runs.
  const float edges[] = {65504.0f, 65519.99f, 65520.0f, 1e6f, -1e6f, 5.960464477539063e-8f, 2.9802322387695312e-8f,
                         8.940697e-8f, 6.1035152e-5f, 1.00048828125f, 1.000732421875f, std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), 0.0f, -0.0f, 1e-30f};
  for (std::size_t i = 0; i < std::size(edges); ++i) x[i] = edges[i];
  std::mt19937 bits(17);
  for (std::size_t i = 20; i < 60000; ++i) {
    x[i] = kernels::bits_float(bits());
    if (std::isnan(x[i])) x[i] = 1.0f;
  }
  for (DType d : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> h(x.size());
    kernels::narrow_from_f32(d, x.data(), h.data(), static_cast<std::int64_t>(x.size()));
    std::vector<float> back(x.size());
    kernels::widen_to_f32(d, h.data(), back.data(), static_cast<std::int64_t>(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(h[i], d == DType::bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i])) << i;
      ASSERT_EQ(kernels::float_bits(back[i]), kernels::float_bits(d == DType::bf16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i])));
    }
  }
}

graph::Graph registry_forward(const std::string& name, std::int64_t batch) {
  models::ModelOptions options;
  options.name = name;
  EXPECT_TRUE(models::set_data_sizes(options, 0).ok());
  return models::build_forward(options, batch).value();
}

// At bf16, inputs, parameters and activations are 16-bit; the loss, attention's log-sum-exp and
// normalisation statistics stay f32 as their rows compute them; token ids stay i32.
TEST(WorkingDType, SixteenBitsWhereTheRowsAllowAndF32WhereTheyComputeIt) {
  const graph::Graph f32 = registry_forward("gpt", 2);
  const graph::Graph g = graph::with_working_dtype(f32, DType::bf16);
  ASSERT_EQ(g.num_ops(), f32.num_ops());
  ASSERT_EQ(g.num_tensors(), f32.num_tensors());
  EXPECT_EQ(g.tensor(g.loss).dtype, DType::f32);
  EXPECT_EQ(g.tensor(g.output).dtype, DType::bf16);
  int stats = 0;
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const graph::TensorDesc& t = g.tensor(id);
    EXPECT_NE(f32.find(t.name), kNoTensor) << t.name;  // the same tensors
    if (t.dtype == DType::i32) continue;
    const int producer = g.producer(id);
    const graph::OpKind kind = producer < 0 ? graph::OpKind::count_ : g.ops()[static_cast<std::size_t>(producer)].kind;
    const bool f32_row = kind == graph::OpKind::attention_lse || kind == graph::OpKind::layer_norm_stats ||
                         kind == graph::OpKind::softmax_cross_entropy;
    stats += f32_row ? 1 : 0;
    EXPECT_EQ(t.dtype, f32_row ? DType::f32 : DType::bf16) << t.name;
  }
  EXPECT_GT(stats, 2);
  const std::vector<TensorId> params = g.parameters();
  ASSERT_EQ(params.size(), f32.parameters().size());
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_EQ(g.tensor(params[i]).name, f32.tensor(f32.parameters()[i]).name);
}

// --- ops split by rows ----------------------------------------------------------------------------

// Adds the op under test to x (a weight it needs is the parameter "w", made at x's dtype).
using MakeOp = std::function<TensorId(graph::Builder& b, TensorId x, DType dtype)>;

graph::Graph one_op_graph(DType dtype, std::int64_t rows, std::int64_t cols, const MakeOp& make) {
  graph::Graph g;
  graph::Builder b(g);
  g.output = make(b, b.input("x", {rows, cols}, dtype), dtype);
  return g;
}

// The op's output at bf16 as bits, and the f32 op's output on the same (widened) values, narrowed.
std::pair<std::vector<std::uint16_t>, std::vector<std::uint16_t>> sixteen_bit_and_reference(
    std::int64_t rows, std::int64_t cols, const MakeOp& make) {
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(normal(rng)));  // exactly representable at bf16
  std::vector<std::uint16_t> results[2];
  for (int wide = 0; wide < 2; ++wide) {
    const DType dtype = wide ? DType::f32 : DType::bf16;
    graph::Graph g = one_op_graph(dtype, rows, cols, make);
    runtime::CpuDevice device;
    runtime::Executor exec(g, testing::plan_for(g, device), device);
    EXPECT_TRUE(exec.setup().ok());
    exec.initialize_persistent(9);
    if (const TensorId w = g.find("w"); w != kNoTensor) {
      std::vector<float> weights(static_cast<std::size_t>(g.tensor(w).shape.numel()));
      for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = 0.0078125f * float(int(i % 37) - 18);  // exact at bf16
      exec.write_values(w, weights.data());
    }
    exec.set_input_values(g.find("x"), x);
    EXPECT_TRUE(exec.run_step().ok());
    std::vector<float> out(static_cast<std::size_t>(g.tensor(g.output).shape.numel()));
    exec.read_values(g.output, out.data());
    results[wide].resize(out.size());
    kernels::narrow_from_f32(DType::bf16, out.data(), results[wide].data(), static_cast<std::int64_t>(out.size()));
  }
  return {results[0], results[1]};
}

// Large enough that the copies are made a slice of rows at a time, and the result is bit for bit
// the f32 op's: elementwise, row statistics with a whole weight, a product with a whole B, and a
// sum over the rows.
TEST(RowSlices, SplitOpsComputeWhatTheWholeOpComputes) {
  const std::int64_t rows = 3001, cols = 256;
  struct Case {
    const char* name;
    MakeOp make;
  };
  const Case cases[] = {
      {"gelu", [](graph::Builder& b, TensorId x, DType) { return b.gelu(x, "y"); }},
      {"matmul",
       [cols](graph::Builder& b, TensorId x, DType d) {
         return b.matmul(x, b.parameter("w", {cols, 96}, {graph::InitSpec::Kind::uniform, 0.1f}, d), false, false, "y");
       }},
      {"softmax", [](graph::Builder& b, TensorId x, DType) { return b.softmax(x, false, "y"); }},
      // A sum over rows: every slice after the first adds into the whole output, in row order.
      {"reduce_rows",
       [](graph::Builder& b, TensorId x, DType) {
         return b.graph().add_op(graph::OpKind::reduce_rows, {x}, {}, "y", graph::Role::temporary, graph::Phase::forward);
       }},
  };
  for (const Case& c : cases) {
    graph::Graph g = one_op_graph(DType::bf16, rows, cols, c.make);
    const graph::Op& op = g.ops().back();
    const graph::Widening w = graph::op_widening(g, op);
    EXPECT_EQ(w.rows, rows) << c.name;
    EXPECT_LT(w.rows_per_slice, rows / 2) << c.name << ": the test needs several slices";
    EXPECT_LT(w.bytes, 2 * graph::kWidenSliceBytes) << c.name;
    const auto [mine, reference] = sixteen_bit_and_reference(rows, cols, c.make);
    ASSERT_EQ(mine.size(), reference.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) differ += mine[i] != reference[i] ? 1 : 0;
    EXPECT_EQ(differ, 0u) << c.name << ": " << differ << " of " << mine.size() << " values differ";
  }
}

// The table's gradient is split by the table's rows, with every position read for each slice
// (KernelCall::first_row): a vocabulary-sized f32 copy is never made, and the result is the f32
// sum of each id's rows in position order, rounded once.
TEST(RowSlices, TheEmbeddingGradientIsSummedASliceOfTheTableAtATime) {
  const std::int64_t vocab = 3001, dim = 256, positions = 700;
  graph::Graph g;
  graph::Builder b(g);
  const TensorId dy = b.input("dy", {positions, dim}, DType::bf16);
  const TensorId ids = b.input("ids", {positions}, DType::i32);
  graph::OpAttrs attrs;
  attrs.shape = {vocab, dim};
  g.add_op(graph::OpKind::embedding_backward, {dy, ids}, attrs, "dtable", graph::Role::temporary, graph::Phase::backward);
  const graph::Op& op = g.ops().back();
  const graph::Widening w = graph::op_widening(g, op);
  EXPECT_EQ(w.rows, vocab);
  EXPECT_LT(w.rows_per_slice, vocab / 2) << "the test needs several slices";
  EXPECT_LT(w.bytes, positions * dim * 4 + 2 * graph::kWidenSliceBytes) << "dy whole, the table a slice";

  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> dy_bits(static_cast<std::size_t>(positions * dim));
  for (auto& v : dy_bits) v = f32_to_bf16(normal(rng));
  std::vector<std::int32_t> id(static_cast<std::size_t>(positions));
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::int32_t>(i % 3 == 0 ? 7 : rng() % vocab);  // repeats
  std::vector<std::uint16_t> out(static_cast<std::size_t>(vocab * dim), 0xffff);
  std::vector<std::byte> workspace(static_cast<std::size_t>(w.bytes));
  const graph::Shape& dy_shape = g.tensor(dy).shape;
  const graph::Shape& id_shape = g.tensor(ids).shape;
  const graph::Shape& out_shape = g.tensor(op.outputs[0]).shape;
  const std::vector<kernels::TensorRef> in = {{dy_bits.data(), &dy_shape, DType::bf16}, {id.data(), &id_shape, DType::i32}};
  const std::vector<kernels::TensorRef> outs = {{out.data(), &out_shape, DType::bf16}};
  kernels::KernelCall call{op.kind, &op.attrs, in, outs, {}, 1};
  call.workspace = workspace;
  kernels::find_kernel(op.kind, kernels::DeviceKind::cpu, DType::bf16)(call);

  std::vector<float> sum(static_cast<std::size_t>(vocab * dim), 0.0f);  // the reference, in position order
  for (std::int64_t i = 0; i < positions; ++i) {
    for (std::int64_t j = 0; j < dim; ++j) sum[static_cast<std::size_t>(id[i] * dim + j)] += bf16_to_f32(dy_bits[static_cast<std::size_t>(i * dim + j)]);
  }
  std::size_t differ = 0;
  for (std::size_t k = 0; k < sum.size(); ++k) differ += out[k] != f32_to_bf16(sum[k]) ? 1 : 0;
  EXPECT_EQ(differ, 0u) << differ << " of " << sum.size() << " values differ";
}

// A transposed product reduces over rows: it is computed whole.
TEST(RowSlices, AProductOverRowsIsNotSplit) {
  graph::Graph g = one_op_graph(DType::bf16, 300, 64, [](graph::Builder& b, TensorId x, DType) {
    return b.matmul(x, x, true, false, "gram");
  });
  const graph::Widening w = graph::op_widening(g, g.ops().back());
  EXPECT_EQ(w.rows, 0);
  EXPECT_EQ(w.bytes, 2 * 300 * 64 * 4 + 64 * 64 * 4);
}

// --- training steps -------------------------------------------------------------------------------

// Each 16-bit parameter starts as the rounding of its f32 master copy, which holds the values the
// f32 step starts from.
TEST(MasterCopies, StartAsTheParametersDoBeforeRounding) {
  for (DType d : {DType::bf16, DType::f16}) {
    graph::Graph f32 = registry_forward("mlp", 4);
    graph::Graph g = graph::with_working_dtype(f32, d);
    graph::make_training_step(f32, graph::OptimizerConfig{});
    graph::make_training_step(g, graph::OptimizerConfig{});
    runtime::CpuDevice device;
    runtime::Executor wide(f32, testing::plan_for(f32, device), device), narrow(g, testing::plan_for(g, device), device);
    ASSERT_TRUE(wide.setup().ok());
    ASSERT_TRUE(narrow.setup().ok());
    wide.initialize_persistent(21);
    narrow.initialize_persistent(21);
    for (TensorId p : g.parameters()) {
      const graph::TensorDesc& desc = g.tensor(p);
      const TensorId master = g.find(desc.name + ".master");
      ASSERT_NE(master, kNoTensor) << desc.name;
      EXPECT_EQ(g.tensor(master).master_of, p);
      const auto n = static_cast<std::size_t>(desc.shape.numel());
      std::vector<float> reference(n), master_values(n), working(n);
      wide.read_values(f32.find(desc.name), reference.data());
      narrow.read_values(master, master_values.data());
      narrow.read_values(p, working.data());
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(master_values[i], reference[i]) << desc.name << "[" << i << "]";
        const float rounded = d == DType::bf16 ? bf16_to_f32(f32_to_bf16(reference[i])) : f16_to_f32(f32_to_f16(reference[i]));
        ASSERT_EQ(working[i], rounded) << desc.name << "[" << i << "]";
      }
    }
  }
}

// A plan made for a device with 16-bit arithmetic has no room for the CPU's f32 copies: the CPU
// executor says so at setup, before allocating anything.
TEST(MixedPrecisionPlans, ACpuRefusesAPlanWithoutRoomForItsCopies) {
  graph::Graph g = graph::with_working_dtype(registry_forward("mlp", 8), DType::bf16);
  graph::make_training_step(g, graph::OptimizerConfig{});
  planner::PlanRequest request;
  request.device.widens_16bit = false;
  auto planned = planner::plan_step(planner::StepDescription::of_graph(g), request);
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(planned.value().plan.workspace_bytes, 0);
  runtime::CpuDevice device;
  runtime::Executor exec(planned.value(), device);
  const Status s = exec.setup();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("kernel workspace"), std::string::npos) << s.error().message;
  EXPECT_EQ(device.stats().allocations, 0);
  // With the CPU's profile the plan holds the copies, and the step runs.
  runtime::Executor ok(g, testing::plan_for(g, device), device);
  EXPECT_GE(testing::plan_for(g, device).workspace_bytes, graph::widening_scratch_bytes(g));
  ASSERT_TRUE(ok.setup().ok());
}

// --- fp16 loss scaling ----------------------------------------------------------------------------

// An fp16 MLP training step with its loss scaled (plan_step adds the check and orders the updates
// after it), set up on the CPU with its parameters initialised.
struct Fp16Step {
  runtime::CpuDevice device;
  planner::PlannedStep planned;
  std::unique_ptr<runtime::Executor> exec;
  explicit Fp16Step(graph::OptimizerKind optimizer) {
    models::ModelOptions model;
    model.mlp.hidden = {32};
    planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(model), 8);
    step.dtype = DType::f16;
    step.optimizer.kind = optimizer;
    step.optimizer.lr = 1e-2f;
    planned = runtime::plan_step_for(step, device).value();
    exec = std::make_unique<runtime::Executor>(planned, device);
    EXPECT_TRUE(exec->setup().ok());
    exec->initialize_persistent(4);
    std::vector<float> x(8 * 784);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 13) / 13.0f;
    const std::int32_t labels[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    exec->set_input_values(planned.graph.find("x"), x);
    exec->set_input(planned.graph.find("labels"), labels, sizeof labels);
  }
};

// The check gates every update: in both schedules no update runs before it.
TEST(LossScaling, EveryUpdateIsScheduledAfterTheOverflowCheck) {
  Fp16Step s(graph::OptimizerKind::adamw);
  const graph::Graph& g = s.planned.graph;
  const TensorId flag = graph::grads_finite_flag(g);
  ASSERT_NE(flag, kNoTensor);
  const int check = g.producer(flag);
  int seen = 0;
  bool checked = false;
  for (int op : s.planned.plan.schedule) {
    checked = checked || op == check;
    if (g.ops()[static_cast<std::size_t>(op)].phase == graph::Phase::optimizer) {
      EXPECT_TRUE(checked) << g.ops()[static_cast<std::size_t>(op)].name << " runs before the check";
      ++seen;
    }
  }
  EXPECT_GT(seen, 0);
  EXPECT_EQ(s.exec->loss_scale(), 65536.0);
}

// A scale so large that the gradients overflow fp16: the step changes no weight, the scale halves
// and the skip is counted; once the scale is back in range, steps update again.
TEST(LossScaling, AnOverflowedStepChangesNoWeightAndHalvesTheScale) {
  for (graph::OptimizerKind optimizer : {graph::OptimizerKind::adamw, graph::OptimizerKind::sgd}) {
    Fp16Step s(optimizer);
    const std::string initial = s.exec->params_sha256();
    s.exec->set_loss_scale(std::ldexp(1.0, 40));
    auto feed = [](std::int64_t, runtime::Executor&) {};
    auto summary = runtime::train(*s.exec, 2, feed, {}, {});
    ASSERT_TRUE(summary.ok()) << summary.error().message;
    EXPECT_EQ(summary.value().skipped_steps, 2);
    EXPECT_EQ(s.exec->loss_scale(), std::ldexp(1.0, 38));
    EXPECT_EQ(s.exec->params_sha256(), initial) << "a skipped step changed the weights";
    // Enough halvings bring the scale into fp16's range; then the weights move.
    auto more = runtime::train(*s.exec, 40, feed, {}, {});
    ASSERT_TRUE(more.ok()) << more.error().message;
    EXPECT_LT(more.value().skipped_steps, 40);
    EXPECT_LT(s.exec->loss_scale(), std::ldexp(1.0, 38));
    EXPECT_NE(s.exec->params_sha256(), initial);
    EXPECT_EQ(s.exec->skipped_steps(), 2 + more.value().skipped_steps);
  }
}

// Loss scaling across ranks that each hold a shard of the gradients is refused when planning.
TEST(LossScaling, ShardedGradientsAreRefusedWhenPlanning) {
  models::ModelOptions model;
  model.mlp.hidden = {32};
  planner::StepDescription step = planner::StepDescription::of_source(models::registry_source(model), 8);
  step.dtype = DType::f16;
  step.parallel.world = 2;
  step.parallel.zero = 1;
  auto planned = planner::plan_step(step, {});
  ASSERT_FALSE(planned.ok());
  EXPECT_NE(planned.error().message.find("every rank to see every gradient"), std::string::npos) << planned.error().message;
  step.parallel.zero = 0;
  EXPECT_TRUE(planner::plan_step(step, {}).ok());
}

// --- saved runs across precisions ------------------------------------------------------------------

struct MlpStep {
  runtime::CpuDevice device;
  graph::Graph graph;
  std::unique_ptr<runtime::Executor> exec;
  explicit MlpStep(DType dtype) {
    graph = graph::with_working_dtype(registry_forward("mlp", 4), dtype);
    graph::make_training_step(graph, graph::OptimizerConfig{});
    exec = std::make_unique<runtime::Executor>(graph, testing::plan_for(graph, device), device);
    EXPECT_TRUE(exec->setup().ok());
  }
  std::vector<float> values(const std::string& name) const {
    const TensorId id = graph.find(name);
    EXPECT_NE(id, kNoTensor) << name;
    std::vector<float> v(static_cast<std::size_t>(graph.tensor(id).shape.numel()));
    exec->read_values(id, v.data());
    return v;
  }
};

// A bf16 run loads into fp32 from its f32 master copies, and an fp32 run into bf16 (its master
// copies the f32 values, its working copies their rounding): nothing is lost either way.
TEST(SavedRuns, LoadAcrossPrecisionsExactly) {
  const std::string path = (std::filesystem::temp_directory_path() / ("memplan_mixed_" + std::to_string(::getpid()) + ".safetensors")).string();
  for (const auto& [from, to] : {std::pair{DType::bf16, DType::f32}, std::pair{DType::f32, DType::bf16}, std::pair{DType::bf16, DType::f16}}) {
    MlpStep saved(from), loaded(to);
    saved.exec->initialize_persistent(31);
    ASSERT_TRUE(runtime::save_weights(*saved.exec, path, {}).ok());
    auto file = runtime::read_weights_file(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto report = runtime::load_weights(*loaded.exec, file.value(), path);
    ASSERT_TRUE(report.ok()) << report.error().message;
    EXPECT_FALSE(report.value().converted.empty());
    EXPECT_TRUE(report.value().fresh_state.empty());
    for (TensorId p : loaded.graph.parameters()) {
      const std::string& name = loaded.graph.tensor(p).name;
      // The exact values: the f32 parameter, or the f32 master copy of a 16-bit one.
      const std::vector<float> exact = saved.values(from == DType::f32 ? name : name + ".master");
      const std::vector<float> got = loaded.values(to == DType::f32 ? name : name + ".master");
      EXPECT_EQ(got, exact) << name;
      if (to != DType::f32) {
        const std::vector<float> working = loaded.values(name);
        for (std::size_t i = 0; i < exact.size(); ++i) {
          const float rounded = to == DType::bf16 ? bf16_to_f32(f32_to_bf16(exact[i])) : f16_to_f32(f32_to_f16(exact[i]));
          ASSERT_EQ(working[i], rounded) << name << "[" << i << "]";
        }
      }
    }
  }
  std::filesystem::remove(path);
}

// A step with an op its device has no kernel for at the op's dtype is refused when it is planned
// (TrainingSession::plan), naming the op, its kind and dtype, and what would run instead. The
// CUDA backend has no kernel for LLaMA's ops (and none at all in a build without CUDA); the CPU
// has every kernel at every dtype.
TEST(KernelCoverage, AStepWithAnOpTheDeviceCannotRunIsRefusedNamingTheOp) {
  models::LlamaConfig c;
  c.vocab = 50;
  c.context = 8;
  c.layers = 1;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 48;
  graph::Graph g = graph::with_working_dtype(models::build_llama(c, 2), DType::bf16);
  graph::append_backward(g, g.loss);
  EXPECT_TRUE(kernels::check_kernels_for(g, kernels::DeviceKind::cpu).ok());

  const graph::Op* first = nullptr;  // the table's answer, op by op
  for (const graph::Op& op : g.ops()) {
    if (kernels::find_kernel(op.kind, kernels::DeviceKind::cuda, graph::op_dtype(g, op)) == nullptr) {
      first = &op;
      break;
    }
  }
  ASSERT_NE(first, nullptr) << "every LLaMA op has a CUDA kernel now: pick a step the CUDA backend cannot run";
  const Status s = kernels::check_kernels_for(g, kernels::DeviceKind::cuda);
  ASSERT_FALSE(s.ok());
  const std::string& message = s.error().message;
  const std::string want = "op '" + first->name + "' (" + std::string(graph::op_name(first->kind)) + ") has no " +
                           std::string(graph::dtype_name(graph::op_dtype(g, *first))) + " kernel on cuda";
  EXPECT_EQ(message.rfind(want, 0), 0u) << message;
  EXPECT_NE(message.find("use --device cpu"), std::string::npos) << message;
}

// A device with 16-bit GEMMs of its own (CUDA: tensor cores) plans no f32 copies for them; the
// CPU, which widens every 16-bit op, plans copies of the GEMM's operands. The plan's workspace is
// the device's own scratch plus the copies.
TEST(MixedPrecisionPlans, NativeSixteenBitOpsTakeNoWideningCopies) {
  graph::Graph g;
  graph::Builder b(g);
  const TensorId x = b.input("x", {64, 32}, DType::bf16);
  const TensorId w = b.parameter("w", {32, 48}, {graph::InitSpec::Kind::normal, 0.1f}, DType::bf16);
  g.output = b.matmul(x, w, false, false, "y");
  auto plan_on = [&](const char* kind) {
    planner::PlanRequest request;
    request.device = planner::documented_device_profile(kind).value();
    auto planned = planner::plan_step(planner::StepDescription::of_graph(g), request);
    EXPECT_TRUE(planned.ok());
    return planned.ok() ? planned.value().plan.workspace_bytes : Bytes{-1};
  };
  EXPECT_EQ(plan_on("cuda"), planner::kCudaWorkspaceBytes);
  EXPECT_EQ(plan_on("cpu"), (64 * 32 + 32 * 48 + 64 * 48) * 4);  // every operand's f32 copy (64-byte multiples)
}

// A communicator of one rank that records what crosses the wire.
class RecordingCommunicator final : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string_view backend() const override { return "recording"; }
  void all_reduce_sum(void* data, std::int64_t count, dist::ElementType type) override {
    sent.push_back(type);
    inner.all_reduce_sum(data, count, type);
  }
  void reduce_scatter_sum(const void* in, void* out, std::int64_t chunk, dist::ElementType type) override {
    sent.push_back(type);
    inner.reduce_scatter_sum(in, out, chunk, type);
  }
  void all_gather_shards(const void* in, void* out, std::int64_t numel, dist::ElementType type) override {
    sent.push_back(type);
    inner.all_gather_shards(in, out, numel, type);
  }
  void all_to_all(const void* in, void* out, std::int64_t chunk, dist::ElementType type) override {
    sent.push_back(type);
    inner.all_to_all(in, out, chunk, type);
  }
  void broadcast(void*, std::int64_t, dist::ElementType, int) override {}
  void barrier() override {}
  std::vector<dist::ElementType> sent;
  dist::SingleProcessCommunicator inner;
};

// The 16-bit sums across ranks move 16 bits (u16) and add in f32, scaling once before the single
// rounding (alpha = 1/world of the mean): a reduce-scatter and an all-reduce of 13 values.
TEST(SixteenBitCollectives, SumsMove16BitsAndRoundOnce) {
  for (graph::OpKind kind : {graph::OpKind::reduce_scatter, graph::OpKind::all_reduce}) {
    graph::Graph g;
    graph::Builder b(g);
    const TensorId x = b.input("x", {13}, DType::bf16);
    graph::OpAttrs attrs;
    attrs.world = 1;
    attrs.alpha = 0.75f;
    g.add_op(kind, {x}, attrs, "summed", graph::Role::temporary, graph::Phase::backward);
    const graph::Op& op = g.ops().back();
    std::vector<std::uint16_t> in(13), out(13);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = f32_to_bf16(0.3f * float(i) - 1.7f);
    if (kind == graph::OpKind::all_reduce) out = in;  // in place: the output is a view of the input
    std::vector<std::byte> workspace(static_cast<std::size_t>(graph::op_widening(g, op).bytes));
    EXPECT_GE(workspace.size(), kind == graph::OpKind::all_reduce ? 2 * 13 * 2u : 13 * 2u);
    const graph::Shape& shape = g.tensor(x).shape;
    const std::vector<kernels::TensorRef> ins = {{in.data(), &shape, DType::bf16}};
    const std::vector<kernels::TensorRef> outs = {{out.data(), &shape, DType::bf16}};
    RecordingCommunicator comm;
    kernels::KernelCall call{op.kind, &op.attrs, ins, outs, {}, 1, &comm};
    call.workspace = workspace;
    kernels::find_kernel(kind, kernels::DeviceKind::cpu, DType::bf16)(call);
    ASSERT_FALSE(comm.sent.empty());
    for (dist::ElementType t : comm.sent) EXPECT_EQ(t, dist::ElementType::u16) << graph::op_name(kind);
    for (std::size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(out[i], f32_to_bf16(bf16_to_f32(in[i]) * 0.75f)) << graph::op_name(kind) << " [" << i << "]";
    }
  }
}

}  // namespace
}  // namespace memplan
