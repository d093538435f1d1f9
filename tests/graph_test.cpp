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
