// Fused CPU kernels (kernels/kernel.h: find_fused_kernel) give the bits of their two ops run one
// after the other, on geometries that take both product paths (narrow images through Eigen,
// wide ones through small_gemm), strides, dilations and 1x1 kernels, at several thread counts,
// and with the input gradient planned over the output gradient's samples already read; the
// executor fuses every pair of the reference CNN (moving col2im up over the optimizer update
// between), leaves a pair apart when the intermediate has another reader, and trains to the
// same parameters as without fusion.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "memplan/graph/training_step.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/executor.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::OpKind;
using testing::count_ops;
using graph::Shape;
using kernels::KernelCall;
using kernels::TensorRef;

struct Geometry {
  std::int64_t n, c, h, cout, k, stride, pad, dil;
};

std::vector<float> wave(std::int64_t n, float f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * f + 0.3f);
  return v;
}

KernelCall call(OpKind kind, const graph::OpAttrs& attrs, const std::vector<TensorRef>& ins,
                const std::vector<TensorRef>& outs) {
  return KernelCall{kind, &attrs, ins, outs, {}};
}

// Sets the CPU kernels' thread count for one scope.
struct Threads {
  explicit Threads(int n) : before(kernels::cpu_threads()) { kernels::set_cpu_threads(n); }
  ~Threads() { kernels::set_cpu_threads(before); }
  int before;
};

graph::OpAttrs window_attrs(const Geometry& g) {
  graph::OpAttrs attrs;
  attrs.kernel = g.k;
  attrs.stride = g.stride;
  attrs.padding = g.pad;
  attrs.dilation = g.dil;
  return attrs;
}

std::int64_t out_size(const Geometry& g) { return (g.h + 2 * g.pad - (g.dil * (g.k - 1) + 1)) / g.stride + 1; }

std::string where(const Geometry& g, int threads) {
  return "n" + std::to_string(g.n) + " c" + std::to_string(g.c) + " h" + std::to_string(g.h) + " k" +
         std::to_string(g.k) + " s" + std::to_string(g.stride) + " d" + std::to_string(g.dil) + ", " +
         std::to_string(threads) + " threads";
}

// dx of conv2d_backward_cols then col2im, run apart.
std::vector<float> input_gradient_apart(const Geometry& g, const std::vector<float>& dy, const std::vector<float>& w) {
  const std::int64_t o = out_size(g), ckk = g.c * g.k * g.k;
  const graph::OpAttrs attrs = window_attrs(g);
  const Shape xs{g.n, g.c, g.h, g.h}, cs{g.n, ckk, o * o}, ws{g.cout, ckk}, ys{g.n, g.cout, o, o};
  std::vector<float> dcols(static_cast<std::size_t>(cs.numel()), -1.0f), dx(static_cast<std::size_t>(xs.numel()), -1.0f);
  kernels::find_kernel(OpKind::conv2d_backward_cols, kernels::DeviceKind::cpu)(call(
      OpKind::conv2d_backward_cols, attrs, {{const_cast<float*>(dy.data()), &ys}, {const_cast<float*>(w.data()), &ws}},
      {{dcols.data(), &cs}}));
  kernels::find_kernel(OpKind::col2im, kernels::DeviceKind::cpu)(
      call(OpKind::col2im, attrs, {{dcols.data(), &cs}}, {{dx.data(), &xs}}));
  return dx;
}

// {n, c, h, cout, k, stride, pad, dil}; 7x7 and 5x5 images put several samples in one pass of
// the weight gradient (a pass covers 256 columns), 3 or 5 channels give row counts that are not
// whole blocks of 8.
const Geometry kGeometries[] = {{2, 3, 12, 5, 3, 1, 1, 1}, {3, 4, 7, 6, 3, 1, 1, 1}, {2, 3, 11, 4, 3, 2, 1, 1},
                                {2, 2, 12, 3, 3, 1, 2, 2}, {2, 5, 9, 7, 1, 1, 0, 1}, {4, 8, 16, 8, 3, 1, 1, 1},
                                {5, 3, 10, 5, 3, 1, 1, 1}, {13, 5, 5, 20, 3, 1, 1, 1}, {9, 16, 7, 17, 3, 1, 1, 1}};

TEST(FusedKernels, EachPairGivesTheBitsOfItsTwoOps) {
  const auto forward = kernels::find_fused_kernel(OpKind::im2col, OpKind::conv2d, kernels::DeviceKind::cpu);
  const auto weight = kernels::find_fused_kernel(OpKind::im2col, OpKind::conv2d_backward_weight, kernels::DeviceKind::cpu);
  const auto backward = kernels::find_fused_kernel(OpKind::conv2d_backward_cols, OpKind::col2im, kernels::DeviceKind::cpu);
  ASSERT_NE(forward.fn, nullptr);
  ASSERT_NE(weight.fn, nullptr);
  ASSERT_NE(backward.fn, nullptr);
  // Each pair's columns have no other reader in a training step (the weight gradient rebuilds
  // them), so all three keep them as scratch: only the second op's output is compared.
  EXPECT_TRUE(forward.first_output_is_scratch);
  EXPECT_TRUE(weight.first_output_is_scratch);
  EXPECT_TRUE(backward.first_output_is_scratch);
  EXPECT_EQ(kernels::find_fused_kernel(OpKind::conv2d, OpKind::im2col, kernels::DeviceKind::cpu).fn, nullptr);
  for (int threads : {1, 2, 3}) {
    const Threads scope(threads);
    for (const Geometry& g : kGeometries) {
      const std::int64_t o = out_size(g), ckk = g.c * g.k * g.k;
      const graph::OpAttrs attrs = window_attrs(g);
      const Shape xs{g.n, g.c, g.h, g.h}, cs{g.n, ckk, o * o}, ws{g.cout, ckk}, ys{g.n, g.cout, o, o};
      auto x = wave(xs.numel(), 0.37f), w = wave(ws.numel(), 0.11f), dy = wave(ys.numel(), 0.23f);
      std::vector<float> cols(static_cast<std::size_t>(cs.numel()), -1.0f), scratch(cols.size(), -2.0f);
      std::vector<float> y1(static_cast<std::size_t>(ys.numel()), -1.0f), y2(y1.size(), -2.0f);
      const TensorRef xr{x.data(), &xs}, wr{w.data(), &ws}, dyr{dy.data(), &ys};
      // Forward: im2col then conv2d, one after the other and fused.
      kernels::find_kernel(OpKind::im2col, kernels::DeviceKind::cpu)(call(OpKind::im2col, attrs, {xr}, {{cols.data(), &cs}}));
      kernels::find_kernel(OpKind::conv2d, kernels::DeviceKind::cpu)(
          call(OpKind::conv2d, attrs, {{cols.data(), &cs}, wr}, {{y1.data(), &ys}}));
      forward.fn(call(OpKind::im2col, attrs, {xr}, {{scratch.data(), &cs}}),
                 call(OpKind::conv2d, attrs, {{scratch.data(), &cs}, wr}, {{y2.data(), &ys}}));
      EXPECT_EQ(y1, y2) << where(g, threads);
      EXPECT_NE(y1[0], -1.0f) << "the kernels ran";
      // The weight gradient from the columns made above, and with the columns rebuilt on the way.
      std::vector<float> dw1(static_cast<std::size_t>(ws.numel()), -1.0f), dw2(dw1.size(), -2.0f);
      kernels::find_kernel(OpKind::conv2d_backward_weight, kernels::DeviceKind::cpu)(
          call(OpKind::conv2d_backward_weight, attrs, {dyr, {cols.data(), &cs}}, {{dw1.data(), &ws}}));
      std::fill(scratch.begin(), scratch.end(), -3.0f);
      weight.fn(call(OpKind::im2col, attrs, {xr}, {{scratch.data(), &cs}}),
                call(OpKind::conv2d_backward_weight, attrs, {dyr, {scratch.data(), &cs}}, {{dw2.data(), &ws}}));
      EXPECT_EQ(dw1, dw2) << where(g, threads);
      // Backward: the columns' gradient then col2im.
      const std::vector<float> dx1 = input_gradient_apart(g, dy, w);
      std::vector<float> dx2(x.size(), -2.0f);
      backward.fn(call(OpKind::conv2d_backward_cols, attrs, {dyr, wr}, {{scratch.data(), &cs}}),
                  call(OpKind::col2im, attrs, {{scratch.data(), &cs}}, {{dx2.data(), &xs}}));
      EXPECT_EQ(dx1, dx2) << where(g, threads);
    }
  }
}

// The CPU fuses exactly the pairs the schedule keeps adjacent (graph::fusable_pair).
TEST(FusedKernels, TheCpuFusesExactlyTheFusablePairs) {
  int pairs = 0;
  for (int i = 0; i < graph::kOpKindCount; ++i) {
    for (int j = 0; j < graph::kOpKindCount; ++j) {
      const auto a = static_cast<OpKind>(i), b = static_cast<OpKind>(j);
      const bool fused = kernels::find_fused_kernel(a, b, kernels::DeviceKind::cpu).fn != nullptr;
      EXPECT_EQ(fused, graph::fusable_pair(a, b)) << graph::op_name(a) << " then " << graph::op_name(b);
      pairs += fused;
    }
  }
  EXPECT_EQ(pairs, 3);
}

// FusedKernel::sample_waves: dx may lie over dy where each dx sample covers only dy samples at or
// before its own index, or only ones at or after it; laid out so here (from the same start, dx
// no larger a sample or twice as large, or ending where dy ends while twice its size a sample),
// the fused kernel still gives the bits computed apart.
TEST(FusedKernels, TheInputGradientMayOverwriteOutputGradientSamplesAlreadyRead) {
  const auto backward = kernels::find_fused_kernel(OpKind::conv2d_backward_cols, OpKind::col2im, kernels::DeviceKind::cpu);
  ASSERT_TRUE(backward.sample_waves);
  // {n, c, h, cout, k, stride, pad, dil}: dx a sample no larger than dy's, and twice dy's.
  const Geometry no_larger[] = {{4, 8, 16, 8, 3, 1, 1, 1}, {5, 3, 10, 5, 3, 1, 1, 1}, {6, 2, 12, 8, 3, 2, 1, 1}};
  const Geometry twice[] = {{6, 2, 12, 4, 3, 2, 1, 1}, {7, 4, 8, 8, 3, 2, 1, 1}};
  struct Layout {
    std::span<const Geometry> geometries;
    bool end_aligned;  // else from the same start
    kernels::SampleOrder order;
  };
  const Layout layouts[] = {{no_larger, false, kernels::SampleOrder::ascending},
                            {twice, true, kernels::SampleOrder::ascending},
                            {twice, false, kernels::SampleOrder::descending}};
  for (int threads : {1, 2, 3, 4}) {
    const Threads scope(threads);
    for (const Layout& layout : layouts) {
      const bool end_aligned = layout.end_aligned;
      for (const Geometry& g : layout.geometries) {
        const std::int64_t o = out_size(g), ckk = g.c * g.k * g.k;
        const graph::OpAttrs attrs = window_attrs(g);
        const Shape xs{g.n, g.c, g.h, g.h}, cs{g.n, ckk, o * o}, ws{g.cout, ckk}, ys{g.n, g.cout, o, o};
        const auto w = wave(ws.numel(), 0.11f), dy = wave(ys.numel(), 0.23f);
        const std::vector<float> expected = input_gradient_apart(g, dy, w);
        // One buffer holds dy and dx.
        const std::int64_t total = std::max(xs.numel(), ys.numel());
        std::vector<float> shared(static_cast<std::size_t>(total), -3.0f);
        float* dy_at = shared.data() + (end_aligned ? total - ys.numel() : 0);
        float* dx_at = shared.data();
        std::copy(dy.begin(), dy.end(), dy_at);
        ASSERT_EQ(kernels::sample_wave_order(dx_at, xs.numel() * 4, dy_at, ys.numel() * 4, g.n), layout.order)
            << where(g, threads);
        std::vector<float> dcols(static_cast<std::size_t>(cs.numel()), -2.0f);
        backward.fn(call(OpKind::conv2d_backward_cols, attrs, {{dy_at, &ys}, {const_cast<float*>(w.data()), &ws}},
                         {{dcols.data(), &cs}}),
                    call(OpKind::col2im, attrs, {{dcols.data(), &cs}}, {{dx_at, &xs}}));
        EXPECT_EQ(std::vector<float>(dx_at, dx_at + xs.numel()), expected) << where(g, threads) << (end_aligned ? ", same end" : ", same start");
      }
    }
  }
  // Three out samples of four floats over three in samples of two from float 3: out sample 1
  // covers in samples 0 to 2, on both sides of its index, so no order is safe. Shifted by two
  // floats either way, one is.
  std::vector<float> buffer(16);
  const float* at = buffer.data();
  EXPECT_EQ(kernels::sample_wave_order(at, 4 * 12, at + 3, 4 * 6, 3), kernels::SampleOrder::none);
  EXPECT_EQ(kernels::sample_wave_order(at, 4 * 8, at + 2, 4 * 8, 2), kernels::SampleOrder::ascending);
  EXPECT_EQ(kernels::sample_wave_order(at + 2, 4 * 8, at, 4 * 8, 2), kernels::SampleOrder::descending);
  EXPECT_EQ(kernels::sample_wave_order(at, 4 * 8, at + 8, 4 * 8, 2), kernels::SampleOrder::ascending);  // apart
}

// im2col and col2im against loops written from their definitions, bit for bit: every column
// element is a copy of a pixel or zero, and every pixel of col2im sums the column elements that
// came from it in (kh, kw) order from +0. Rows of 7 to 33 pixels (one to three 16-lane chunks),
// padding past the kernel's reach, dilations, and stride 2 (the scalar path).
TEST(FusedKernels, Im2colAndCol2imMatchTheirDefinitionsBitForBit) {
  const Geometry cases[] = {{2, 3, 28, 1, 3, 1, 1, 1}, {1, 2, 7, 1, 3, 1, 1, 1},  {1, 2, 14, 1, 3, 1, 1, 1},
                            {1, 2, 33, 1, 5, 1, 2, 1}, {1, 2, 17, 1, 3, 1, 2, 2}, {1, 3, 9, 1, 1, 1, 0, 1},
                            {1, 2, 12, 1, 3, 1, 3, 1}, {2, 2, 15, 1, 3, 2, 1, 1}, {1, 2, 20, 1, 3, 1, 0, 3}};
  for (const Geometry& g : cases) {
    const std::int64_t o = out_size(g), kk = g.k * g.k;
    const graph::OpAttrs attrs = window_attrs(g);
    const Shape xs{g.n, g.c, g.h, g.h}, cs{g.n, g.c * kk, o * o};
    const auto x = wave(xs.numel(), 0.37f), cols = wave(cs.numel(), 0.29f);
    std::vector<float> got_cols(static_cast<std::size_t>(cs.numel()), -1.0f), got_x(x.size(), -1.0f);
    kernels::find_kernel(OpKind::im2col, kernels::DeviceKind::cpu)(
        call(OpKind::im2col, attrs, {{const_cast<float*>(x.data()), &xs}}, {{got_cols.data(), &cs}}));
    kernels::find_kernel(OpKind::col2im, kernels::DeviceKind::cpu)(
        call(OpKind::col2im, attrs, {{const_cast<float*>(cols.data()), &cs}}, {{got_x.data(), &xs}}));
    std::vector<float> want_cols(got_cols.size()), want_x(x.size(), 0.0f);
    for (std::int64_t plane = 0; plane < g.n * g.c; ++plane) {
      for (std::int64_t kh = 0; kh < g.k; ++kh) {
        for (std::int64_t kw = 0; kw < g.k; ++kw) {
          for (std::int64_t oh = 0; oh < o; ++oh) {
            for (std::int64_t ow = 0; ow < o; ++ow) {
              const std::int64_t ih = oh * g.stride + kh * g.dil - g.pad, iw = ow * g.stride + kw * g.dil - g.pad;
              const auto at = static_cast<std::size_t>(((plane * kk + kh * g.k + kw) * o + oh) * o + ow);
              const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.h;
              const auto pixel = static_cast<std::size_t>((plane * g.h + ih) * g.h + iw);
              want_cols[at] = inside ? x[pixel] : 0.0f;
              if (inside) want_x[pixel] += cols[at];
            }
          }
        }
      }
    }
    EXPECT_EQ(got_cols, want_cols) << where(g, 0);
    EXPECT_EQ(got_x, want_x) << where(g, 0);
  }
}

graph::Graph cnn_step() {
  models::ModelOptions model;
  model.name = "cnn";
  model.cnn.image = 12;
  model.cnn.widths = {4, 8};
  model.cnn.blocks_per_stage = 1;
  model.cnn.classes = 5;
  graph::Graph g = models::build_forward(model, 4).value();
  graph::make_training_step(g, graph::OptimizerConfig{});
  return g;
}

std::string train_sha(const graph::Graph& g, bool fuse, int* fused_pairs, std::vector<float>* retained = nullptr) {
  runtime::CpuDevice device;
  runtime::ExecutorOptions options;
  options.fuse_kernels = fuse;
  runtime::Executor exec(g, testing::plan_for(g, device), device, options);
  EXPECT_TRUE(exec.setup().ok());
  *fused_pairs = exec.fused_pairs();
  exec.initialize_persistent(3);
  const auto x = testing::random_values(static_cast<std::size_t>(g.tensor(g.find("x")).shape.numel()), 9);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(g.tensor(g.find("labels")).shape.numel()));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 5);
  for (int s = 0; s < 5; ++s) {
    exec.set_input(g.find("x"), x.data(), static_cast<Bytes>(x.size() * sizeof(float)));
    exec.set_input(g.find("labels"), labels.data(), static_cast<Bytes>(labels.size() * sizeof(std::int32_t)));
    EXPECT_TRUE(exec.run_step().ok());
  }
  if (retained != nullptr && !g.retained.empty()) {
    retained->assign(static_cast<std::size_t>(g.tensor(g.retained[0]).shape.numel()), 0.0f);
    exec.read_tensor(g.retained[0], retained->data());
  }
  return exec.params_sha256();
}

TEST(FusedKernels, TheExecutorFusesTheCnnsPairsAndKeepsItsBits) {
  const graph::Graph g = cnn_step();
  int fused = 0, unfused = -1;
  const std::string with = train_sha(g, true, &fused);
  const std::string without = train_sha(g, false, &unfused);
  // Every conv's pairs but one: the image's last reader is the stem's rebuilt im2col, so the plan
  // may put the stem's weight gradient over the image, and that pair runs apart.
  EXPECT_EQ(fused, count_ops(g, OpKind::im2col) + count_ops(g, OpKind::col2im) - 1);
  EXPECT_GT(count_ops(g, OpKind::col2im), 0);
  EXPECT_EQ(unfused, 0);
  EXPECT_EQ(with, without);
}

TEST(FusedKernels, AColumnsGradientWithAnotherReaderIsNotUsedAsScratch) {
  graph::Graph g = cnn_step();
  const TensorId dcols = g.find("d(stage1.block1.b.conv.cols)");
  ASSERT_NE(dcols, kNoTensor);
  g.retained.push_back(dcols);  // the caller reads it after the step
  int fused = 0, unfused = -1;
  std::vector<float> with_values, without_values;
  const std::string with = train_sha(g, true, &fused, &with_values);
  const std::string without = train_sha(g, false, &unfused, &without_values);
  // That pair runs apart (other pairs may fuse or not as the changed plan allows): had its
  // columns been used as scratch, the values read after the step would differ.
  EXPECT_GT(fused, 0);
  EXPECT_LT(fused, count_ops(g, OpKind::im2col) + count_ops(g, OpKind::col2im));
  EXPECT_EQ(with, without);
  EXPECT_EQ(with_values, without_values);
}

// The reference CNN at its training batch: every pair fused (nine forward, nine of the weight
// gradients, eight of the input gradients) but the stem's weight gradient (see above).
TEST(FusedKernels, TheReferenceCnnRunsEveryPairFused) {
  models::ModelOptions model;
  model.name = "cnn";
  graph::Graph g = models::build_forward(model, 64).value();
  graph::make_training_step(g, graph::OptimizerConfig{});
  runtime::CpuDevice device;
  runtime::Executor exec(g, testing::plan_for(g, device), device);
  ASSERT_TRUE(exec.setup().ok());
  EXPECT_EQ(count_ops(g, OpKind::im2col), 18);  // the forward's and the weight gradients'
  EXPECT_EQ(count_ops(g, OpKind::col2im), 8);
  EXPECT_EQ(exec.fused_pairs(), 25);
}

}  // namespace
}  // namespace memplan
