// graph/: shape inference errors a user can read, views, autograd structure, optimizer ops.
#include <gtest/gtest.h>

#include "memplan/graph/autograd.h"
#include "memplan/graph/builder.h"
#include "memplan/graph/training_step.h"
#include "memplan/models/mlp.h"

namespace memplan::graph {
namespace {

TEST(Graph, MatmulShapeMismatchNamesBothOperands) {
  Graph g;
  Builder b(g);
  auto x = b.input("x", {4, 3});
  auto w = b.parameter("w", {5, 2}, {});
  try {
    b.matmul(x, w, false, false, "y");
    FAIL() << "expected a GraphError";
  } catch (const GraphError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 vs 5"), std::string::npos) << msg;
  }
}

TEST(Graph, NonPositiveDimensionIsRejected) {
  Graph g;
  Builder b(g);
  EXPECT_THROW(b.input("x", {4, 0}), GraphError);
  EXPECT_THROW(b.input("x", {-1, 3}), GraphError);
}

TEST(Graph, ReshapeIsAViewOfItsInput) {
  Graph g;
  Builder b(g);
  auto x = b.input("x", {2, 6});
  auto y = b.reshape(x, {3, 4}, "y");
  EXPECT_EQ(g.tensor(y).view_of, x);
  EXPECT_EQ(g.storage_root(y), x);
  EXPECT_THROW(b.reshape(x, {5, 2}, "bad"), GraphError);
}

// OH = (H + 2P - D(K-1) - 1) / S + 1 for every convolution; the backward ops carry the dilation;
// a dilation changes which pixels a tap reads, not how many multiply-adds there are.
TEST(Graph, DilatedConvolutionShapesBackwardAttributesAndFlops) {
  Graph g;
  Builder b(g);
  auto x = b.parameter("x", {2, 4, 17, 12}, {});
  auto w = b.parameter("w", {6, 4, 3, 3}, {});
  auto dw = b.parameter("dw", {4, 1, 3, 3}, {});
  const TensorId same = b.conv2d(x, w, 1, 2, "same", 2);       // DeepLab: 3x3, dilation 2, padding 2
  const TensorId strided = b.conv2d(x, w, 2, 1, "strided", 3);  // (17 + 2 - 7) / 2 + 1 = 7, (12 + 2 - 7) / 2 + 1 = 4
  const TensorId depthwise = b.grouped_conv2d(x, dw, 1, 4, 4, "depthwise", 4);  // 17 + 8 - 9 + 1 = 17
  EXPECT_EQ(g.tensor(same).shape, (Shape{2, 6, 17, 12}));
  EXPECT_EQ(g.tensor(strided).shape, (Shape{2, 6, 7, 4}));
  EXPECT_EQ(g.tensor(depthwise).shape, (Shape{2, 4, 17, 12}));
  const auto op_of = [&](TensorId t) -> const Op& { return g.ops()[static_cast<std::size_t>(g.producer(t))]; };
  const Op& cols = op_of(op_of(strided).inputs[0]);
  ASSERT_EQ(cols.kind, OpKind::im2col);
  EXPECT_EQ(cols.attrs.dilation, 3);
  EXPECT_EQ(g.tensor(cols.outputs[0]).shape, (Shape{2, 4 * 9, 7 * 4}));

  // FLOPs: 2 * N * Cout * OH * OW * Cin * K * K, the same at any dilation.
  const Op& conv = op_of(strided);
  std::vector<const TensorDesc*> in;
  for (TensorId t : conv.inputs) in.push_back(&g.tensor(t));
  EXPECT_EQ(op_info(OpKind::conv2d).flops(in, &g.tensor(strided)), 2.0 * 2 * 6 * 7 * 4 * 4 * 9);
  const Op& dconv = op_of(depthwise);
  std::vector<const TensorDesc*> din;
  for (TensorId t : dconv.inputs) din.push_back(&g.tensor(t));
  EXPECT_EQ(op_info(OpKind::grouped_conv2d).flops(din, &g.tensor(depthwise)), 2.0 * 2 * 4 * 17 * 12 * 9);

  g.loss = b.sum(b.add(b.sum(same, "s1"), b.add(b.sum(strided, "s2"), b.sum(depthwise, "s3"), "a1"), "a2"), "loss");
  append_backward(g, g.loss);
  int col2im = 0, grouped_backward = 0;
  for (const Op& op : g.ops()) {
    if (op.kind == OpKind::col2im) {
      ++col2im;
      EXPECT_TRUE(op.attrs.dilation == 2 || op.attrs.dilation == 3) << op.name;
      EXPECT_EQ(g.tensor(op.outputs[0]).shape, g.tensor(x).shape) << op.name;
    }
    if (op.kind == OpKind::grouped_conv2d_backward_input || op.kind == OpKind::grouped_conv2d_backward_weight) {
      ++grouped_backward;
      EXPECT_EQ(op.attrs.dilation, 4) << op.name;
    }
  }
  EXPECT_EQ(col2im, 2);
  EXPECT_EQ(grouped_backward, 2);
}

TEST(Graph, DilatedWindowsThatDoNotFitAreRefused) {
  Graph g;
  Builder b(g);
  auto x = b.input("x", {1, 2, 6, 6});
  auto w = b.parameter("w", {2, 2, 3, 3}, {});
  // A 3x3 kernel at dilation 4 spans 9 > 6 + 2 * 1.
  try {
    b.conv2d(x, w, 1, 1, "wide", 4);
    FAIL() << "expected a GraphError";
  } catch (const GraphError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("window 9 (kernel 3, dilation 4) is larger than the padded input 8"), std::string::npos) << msg;
  }
  // Padding up to half the dilated window is allowed (3 at dilation 3 spans 7), more is not.
  EXPECT_EQ(g.tensor(b.conv2d(x, w, 1, 3, "ok", 3)).shape, (Shape{1, 2, 6, 6}));
  EXPECT_THROW(b.conv2d(x, w, 1, 4, "overpadded", 3), GraphError);
  EXPECT_THROW(b.conv2d(x, w, 1, 1, "zero", 0), GraphError);
  EXPECT_THROW(b.grouped_conv2d(x, w, 1, 1, 1, "negative", -1), GraphError);
  OpAttrs pool;
  pool.kernel = 2;
  pool.stride = 2;
  pool.dilation = 2;
  EXPECT_THROW(g.add_op(OpKind::max_pool2d, {x}, pool, "dilated_pool", Role::activation, Phase::forward), GraphError);
}

TEST(Autograd, MlpGetsOneGradientPerParameterAndNoneForInputs) {
  Graph g = models::build_mlp(models::MlpConfig{}, 8);
  append_backward(g, g.loss);
  for (TensorId p : g.parameters()) {
    const TensorId grad = g.tensor(p).grad;
    ASSERT_NE(grad, kNoTensor) << g.tensor(p).name;
    EXPECT_EQ(g.tensor(grad).shape, g.tensor(p).shape) << g.tensor(p).name;
    EXPECT_EQ(g.tensor(grad).role, Role::gradient);
  }
  // No op computes a gradient for the data: nothing in the backward pass is shaped like x and
  // produced by a matmul that reads the first layer's weight with no transpose.
  const TensorId x = g.find("x");
  EXPECT_EQ(g.tensor(x).grad, kNoTensor);
  for (const Op& op : g.ops()) {
    if (op.phase != Phase::backward) continue;
    for (TensorId out : op.outputs) EXPECT_NE(g.tensor(out).name, "d(x)");
  }
}

TEST(Autograd, TensorUsedTwiceHasItsGradientsAccumulated) {
  Graph g;
  Builder b(g);
  auto w = b.parameter("w", {3}, {});
  auto y = b.mul(w, w, "y");
  g.loss = b.sum(y, "loss");
  append_backward(g, g.loss);
  int accumulations = 0;
  for (const Op& op : g.ops()) {
    if (op.phase == Phase::backward && op.kind == OpKind::add) ++accumulations;
  }
  EXPECT_EQ(accumulations, 1);
  EXPECT_EQ(g.tensor(g.tensor(w).grad).name, "grad_acc(w)");
}

TEST(Autograd, LossMustBeAScalarThatDependsOnParameters) {
  Graph g;
  Builder b(g);
  auto x = b.input("x", {3});
  auto w = b.parameter("w", {3}, {});
  auto y = b.mul(x, w, "y");
  EXPECT_THROW(append_backward(g, y), GraphError);  // not a scalar
  auto s = b.sum(x, "s");
  EXPECT_THROW(append_backward(g, s), GraphError);  // no parameter
}

TEST(Optimizer, AdamWAddsTwoStateTensorsPerParameterMomentumOneSgdNone) {
  for (auto [kind, states] : std::vector<std::pair<OptimizerKind, int>>{
           {OptimizerKind::adamw, 2}, {OptimizerKind::momentum, 1}, {OptimizerKind::sgd, 0}}) {
    Graph g = models::build_mlp(models::MlpConfig{}, 4);
    OptimizerConfig config;
    config.kind = kind;
    make_training_step(g, config);
    const auto params = g.parameters().size();
    EXPECT_EQ(g.tensors_with_role(Role::optimizer_state).size(), params * static_cast<std::size_t>(states));
    int updates = 0;
    for (const Op& op : g.ops()) {
      if (op.phase == Phase::optimizer) {
        ++updates;
        EXPECT_TRUE(op.outputs.empty());
        EXPECT_EQ(static_cast<int>(op.updates.size()), 1 + states);
      }
    }
    EXPECT_EQ(static_cast<std::size_t>(updates), params);
  }
}

TEST(Optimizer, ParsesNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_optimizer_kind("adamw").value(), OptimizerKind::adamw);
  EXPECT_EQ(parse_optimizer_kind("sgd").value(), OptimizerKind::sgd);
  EXPECT_FALSE(parse_optimizer_kind("adam").ok());
}

}  // namespace
}  // namespace memplan::graph
