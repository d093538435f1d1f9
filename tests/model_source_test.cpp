// graph/model_source.h as the planner sees it: a source defined here, with no model from models/
// or import/, has its size knobs searched by planner/step_size (the largest value that works,
// exact), its layer count checked from two tiny builds, its problems named as its quantities or
// however a caller names them, and its steps planned by plan_step.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memplan/graph/builder.h"
#include "memplan/graph/model_source.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/step_size.h"

namespace memplan::planner {
namespace {

// `depth` blocks of a square linear + relu of `width` features, then a linear to 4 classes.
graph::Graph toy_forward(std::int64_t batch, std::int64_t width, std::int64_t depth) {
  graph::Graph g;
  graph::Builder b(g);
  const graph::InitSpec init{graph::InitSpec::Kind::uniform, 0.1f};
  TensorId h = b.input("x", {batch, width});
  const TensorId labels = b.input("labels", {batch}, graph::DType::i32);
  for (std::int64_t i = 0; i < depth; ++i) {
    const std::string name = "block" + std::to_string(i);
    h = b.relu(b.linear(h, b.parameter(name + ".w", {width, width}, init), b.parameter(name + ".b", {width}, init), name),
               name + ".relu");
  }
  g.output = b.linear(h, b.parameter("head.w", {4, width}, init), b.parameter("head.b", {4}, init), "logits");
  g.loss = b.cross_entropy(g.output, labels, "loss");
  return g;
}

graph::ModelSource toy_source(std::int64_t width, std::int64_t depth) {
  graph::ModelSource s;
  s.name = "toy";
  s.default_batch = 8;
  s.knobs = {
      graph::SizeKnob{.key = "width", .quantity = "the toy's width", .value = width, .usual = 16, .granule = 2},
      graph::SizeKnob{.key = "depth", .quantity = "the toy's depth", .value = depth, .usual = 2, .unit = "blocks", .layers = true},
  };
  s.build = [](std::int64_t batch, std::span<const std::int64_t> sizes) { return toy_forward(batch, sizes[0], sizes[1]); };
  return s;
}

std::optional<StepSizeProblem> problem_at(std::int64_t batch, std::int64_t width, std::int64_t depth) {
  return find_step_size_problem(StepDescription::of_source(toy_source(width, depth), batch));
}

TEST(ModelSource, TheSourcesKnobsAreSearchedForTheLargestValueThatWorks) {
  EXPECT_FALSE(problem_at(8, 16, 2).has_value());
  // [width, width] weights: 2^31 x 2^31 f32 is 2^64 bytes, past any tensor's limit.
  const std::int64_t asked = std::int64_t{1} << 31;
  const auto p = problem_at(8, asked, 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->kind, StepSizeProblem::Kind::too_large);
  EXPECT_EQ(p->knob.key, "width");
  EXPECT_EQ(p->largest % 2, 0) << "a multiple of the knob's granule";
  EXPECT_GT(p->largest, 16);
  EXPECT_LT(p->largest, asked);
  EXPECT_FALSE(problem_at(8, p->largest, 2).has_value()) << "the largest value works";
  EXPECT_TRUE(problem_at(8, p->largest + 2, 2).has_value()) << "and the next one does not";
  const std::string message = describe(*p);
  EXPECT_EQ(message.rfind("the toy's width " + std::to_string(asked) + ": the step cannot be represented", 0), 0u) << message;
  EXPECT_NE(message.find("with the other sizes as given is " + std::to_string(p->largest)), std::string::npos) << message;
}

TEST(ModelSource, ABatchTooLargeIsNamedAsTheBatch) {
  const std::int64_t asked = std::int64_t{1} << 61;
  const auto p = problem_at(asked, 16, 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->knob.key, "batch");
  EXPECT_EQ(p->knob.usual, 8) << "the source's default batch is where the search starts";
  const StepDescription step = StepDescription::of_source(toy_source(16, 2), 1);
  EXPECT_EQ(largest_representable_batch(step, asked), p->largest);
  EXPECT_EQ(describe(*p).rfind("the batch " + std::to_string(asked) + ":", 0), 0u) << describe(*p);
}

TEST(ModelSource, ALayerCountIsCheckedFromTwoTinyBuildsAndNamedAsTheCallerNamesIt) {
  // About 3M ops: refused from two tiny builds (were it built, it would still be a few GB at most).
  const auto p = problem_at(8, 16, 300000);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->kind, StepSizeProblem::Kind::too_many_ops);
  EXPECT_EQ(p->knob.key, "depth");
  ASSERT_GT(p->largest, 1000);
  EXPECT_LT(p->largest, kMaxStepOps);
  const SizeNaming flags{[](const graph::SizeKnob& k, std::optional<std::int64_t> v) {
                           return "--toy-" + k.key + (v ? " " + std::to_string(*v) : "");
                         },
                         "flags"};
  const std::string message = describe(*p, flags);
  EXPECT_EQ(message.rfind("--toy-depth 300000: the step would have more than " + std::to_string(kMaxStepOps) + " ops", 0), 0u)
      << message;
  EXPECT_NE(message.find("the largest that works is " + std::to_string(p->largest) + " blocks"), std::string::npos) << message;
}

TEST(ModelSource, PlanStepBuildsTheSourceAsTrainingStepOrAsItIs) {
  graph::ModelSource source = toy_source(16, 2);
  auto trained = plan_step(StepDescription::of_source(source, 8), PlanRequest{});
  ASSERT_TRUE(trained.ok()) << trained.error().message;
  source.training = false;
  auto evaluated = plan_step(StepDescription::of_source(source, 8), PlanRequest{});
  ASSERT_TRUE(evaluated.ok()) << evaluated.error().message;
  EXPECT_EQ(evaluated.value().graph.num_ops(), toy_forward(8, 16, 2).num_ops()) << "evaluation plans the forward graph as built";
  EXPECT_GT(trained.value().graph.num_ops(), evaluated.value().graph.num_ops()) << "training adds backward and updates";
  EXPECT_GT(trained.value().plan.arena_bytes, evaluated.value().plan.arena_bytes);
  // A build that fails is an Error naming the source.
  source.build = [](std::int64_t, std::span<const std::int64_t>) -> graph::Graph { throw graph::GraphError("no such width"); };
  auto failed = plan_step(StepDescription::of_source(source, 8), PlanRequest{});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().message, "model 'toy': no such width");
}

}  // namespace
}  // namespace memplan::planner
