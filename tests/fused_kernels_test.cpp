// Fused CPU kernels (kernels/kernel.h: find_fused_kernel) give the bits of their two ops run one
// after the other, on geometries that take both product paths (narrow images through Eigen,
// wide ones through small_gemm), strides, dilations and 1x1 kernels; and the executor fuses the
// reference CNN's pairs with the same parameters after training as without fusion.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "memplan/graph/training_step.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/registry.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::OpKind;
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

TEST(FusedKernels, EachPairGivesTheBitsOfItsTwoOps) {
  const Geometry cases[] = {{2, 3, 12, 5, 3, 1, 1, 1}, {3, 4, 7, 6, 3, 1, 1, 1}, {2, 3, 11, 4, 3, 2, 1, 1},
                            {2, 2, 12, 3, 3, 1, 2, 2}, {2, 5, 9, 7, 1, 1, 0, 1}, {4, 8, 16, 8, 3, 1, 1, 1}};
  const auto forward = kernels::find_fused_kernel(OpKind::im2col, OpKind::conv2d, kernels::DeviceKind::cpu);
  const auto backward = kernels::find_fused_kernel(OpKind::conv2d_backward_cols, OpKind::col2im, kernels::DeviceKind::cpu);
  ASSERT_NE(forward, nullptr);
  ASSERT_NE(backward, nullptr);
  EXPECT_EQ(kernels::find_fused_kernel(OpKind::conv2d, OpKind::im2col, kernels::DeviceKind::cpu), nullptr);
  for (const Geometry& g : cases) {
    const std::int64_t span = g.dil * (g.k - 1) + 1, o = (g.h + 2 * g.pad - span) / g.stride + 1, ckk = g.c * g.k * g.k;
    graph::OpAttrs attrs;
    attrs.kernel = g.k;
    attrs.stride = g.stride;
    attrs.padding = g.pad;
    attrs.dilation = g.dil;
    const Shape xs{g.n, g.c, g.h, g.h}, cs{g.n, ckk, o * o}, ws{g.cout, ckk}, ys{g.n, g.cout, o, o};
    auto x = wave(xs.numel(), 0.37f), w = wave(ws.numel(), 0.11f), dy = wave(ys.numel(), 0.23f);
    std::vector<float> cols1(static_cast<std::size_t>(cs.numel()), -1.0f), cols2(cols1.size(), -2.0f);
    std::vector<float> y1(static_cast<std::size_t>(ys.numel()), -1.0f), y2(y1.size(), -2.0f);
    const TensorRef xr{x.data(), &xs}, wr{w.data(), &ws};
    // Forward: im2col then conv2d, one after the other and fused.
    kernels::find_kernel(OpKind::im2col, kernels::DeviceKind::cpu)(call(OpKind::im2col, attrs, {xr}, {{cols1.data(), &cs}}));
    kernels::find_kernel(OpKind::conv2d, kernels::DeviceKind::cpu)(
        call(OpKind::conv2d, attrs, {{cols1.data(), &cs}, wr}, {{y1.data(), &ys}}));
    forward(call(OpKind::im2col, attrs, {xr}, {{cols2.data(), &cs}}),
            call(OpKind::conv2d, attrs, {{cols2.data(), &cs}, wr}, {{y2.data(), &ys}}));
    const std::string where = "n" + std::to_string(g.n) + " c" + std::to_string(g.c) + " h" + std::to_string(g.h) +
                              " k" + std::to_string(g.k) + " s" + std::to_string(g.stride) + " d" + std::to_string(g.dil);
    EXPECT_EQ(cols1, cols2) << where;
    EXPECT_EQ(y1, y2) << where;
    // Backward: the columns' gradient then col2im.
    std::vector<float> dcols1(cols1.size(), -1.0f), dcols2(cols1.size(), -2.0f);
    std::vector<float> dx1(x.size(), -1.0f), dx2(x.size(), -2.0f);
    const TensorRef dyr{dy.data(), &ys};
    kernels::find_kernel(OpKind::conv2d_backward_cols, kernels::DeviceKind::cpu)(
        call(OpKind::conv2d_backward_cols, attrs, {dyr, wr}, {{dcols1.data(), &cs}}));
    kernels::find_kernel(OpKind::col2im, kernels::DeviceKind::cpu)(
        call(OpKind::col2im, attrs, {{dcols1.data(), &cs}}, {{dx1.data(), &xs}}));
    backward(call(OpKind::conv2d_backward_cols, attrs, {dyr, wr}, {{dcols2.data(), &cs}}),
             call(OpKind::col2im, attrs, {{dcols2.data(), &cs}}, {{dx2.data(), &xs}}));
    EXPECT_EQ(dcols1, dcols2) << where;
    EXPECT_EQ(dx1, dx2) << where;
    EXPECT_NE(y1[0], -1.0f) << "the kernels ran";
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

std::string train_sha(const graph::Graph& g, bool fuse, int* fused_pairs) {
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
  return exec.params_sha256();
}

TEST(FusedKernels, TheExecutorFusesTheCnnsPairsAndKeepsItsBits) {
  const graph::Graph g = cnn_step();
  int fused = 0, unfused = -1;
  const std::string with = train_sha(g, true, &fused);
  const std::string without = train_sha(g, false, &unfused);
  EXPECT_GT(fused, 0) << "no pair of the CNN's step was fused";
  EXPECT_EQ(unfused, 0);
  EXPECT_EQ(with, without);
}

}  // namespace
}  // namespace memplan
