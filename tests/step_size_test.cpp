// planner/step_size on the registry's models: every model at its defaults can be represented (no
// false refusals); sizes past what a tensor or a step may hold are refused naming the quantity
// (tools/ names the flag instead) and the largest value that works, which is exact; layer counts
// are refused from their op count before a large build. A source of the test's own, with no
// model from models/, is in model_source_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "memplan/models/model_source.h"
#include "memplan/models/registry.h"
#include "memplan/planner/step_size.h"
#include "tools/cli_util.h"

namespace memplan::planner {
namespace {

StepDescription model_step(const std::string& name, std::int64_t batch,
                           const std::function<void(models::ModelOptions&)>& set = {}) {
  models::ModelOptions model;
  model.name = name;
  if (set) set(model);
  return StepDescription::of_source(models::registry_source(model), batch);
}

// The number after "is " at the end of a refusal.
std::int64_t largest_in(const std::string& message) {
  const std::string marker = "as given is ";
  const std::size_t at = message.find(marker);
  return at == std::string::npos ? -1 : std::stoll(message.substr(at + marker.size()));
}

TEST(StepSize, EveryModelAtItsDefaultsCanBeRepresented) {
  for (const models::ModelInfo& info : models::model_registry()) {
    const Status s = check_step_size(model_step(info.name, info.default_batch));
    EXPECT_TRUE(s.ok()) << info.name << ": " << s.error().message;
  }
}

TEST(StepSize, ABatchTooLargeNamesTheLargestThatWorksExactly) {
  StepDescription step = model_step("llama2-7b", 4000000000);
  const Status s = check_step_size(step);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message.rfind("the batch 4000000000: the step cannot be represented", 0), 0u) << s.error().message;
  const std::int64_t largest = largest_in(s.error().message);
  ASSERT_GT(largest, 1);
  step.batch = largest;
  EXPECT_TRUE(check_step_size(step).ok());
  step.batch = largest + 1;
  EXPECT_FALSE(check_step_size(step).ok());
  EXPECT_EQ(largest_representable_batch(model_step("llama2-7b", 1), std::int64_t{1} << 40), largest);
  EXPECT_EQ(largest_representable_batch(model_step("llama2-7b", 1), 1000), 1000);
}

// The planner names each quantity; tools/ names the flag that sets it, from the same problem.
TEST(StepSize, EachDimensionIsNamedAsAQuantityAndByToolsAsItsFlag) {
  const struct {
    std::string model;
    std::string quantity;
    std::string flag;
    std::function<void(models::ModelOptions&)> set;
  } cases[] = {
      {"gpt", "the sequence length", "--seq", [](models::ModelOptions& m) { m.gpt.context = std::int64_t{1} << 58; }},
      {"gpt", "the width", "--width", [](models::ModelOptions& m) { m.gpt.width = std::int64_t{1} << 40; }},
      {"mlp", "the hidden width", "--hidden", [](models::ModelOptions& m) { m.mlp.hidden = {std::int64_t{1} << 62}; }},
      {"mlp", "hidden width 2", "--hidden (width 2)", [](models::ModelOptions& m) { m.mlp.hidden = {8, std::int64_t{1} << 62}; }},
      {"cnn", "the image size", "--image-size", [](models::ModelOptions& m) { m.cnn.image = std::int64_t{1} << 40; }},
      {"vit-b16", "the image size", "--image-size", [](models::ModelOptions& m) { m.zoo.image_size = std::int64_t{1} << 40; }},
      {"llama-1b", "the sequence length", "--seq", [](models::ModelOptions& m) { m.zoo.seq = std::int64_t{1} << 58; }},
  };
  for (const auto& c : cases) {
    const StepDescription step = model_step(c.model, 4, c.set);
    const Status s = check_step_size(step);
    ASSERT_FALSE(s.ok()) << c.model << " " << c.quantity;
    EXPECT_EQ(s.error().message.rfind(c.quantity + " ", 0), 0u) << s.error().message;
    EXPECT_EQ(s.error().message.find("--"), std::string::npos) << "no flag in the planner's words: " << s.error().message;
    const std::int64_t largest = largest_in(s.error().message);
    EXPECT_GT(largest, 0) << s.error().message;
    const Status flagged = models::check_step_size_named(step);
    ASSERT_FALSE(flagged.ok());
    EXPECT_EQ(flagged.error().message.rfind(c.flag + " ", 0), 0u) << flagged.error().message;
    EXPECT_NE(flagged.error().message.find("with the other flags as given is " + std::to_string(largest)), std::string::npos)
        << flagged.error().message;
  }
}

TEST(StepSize, LayerCountsAreRefusedBeforeTheGraphIsBuilt) {
  const StepDescription step = model_step("gpt", 4, [](models::ModelOptions& m) { m.gpt.layers = 1000000000; });
  const Status s = check_step_size(step);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message.rfind("the layer count 1000000000: ", 0), 0u) << s.error().message;
  EXPECT_NE(s.error().message.find(std::to_string(kMaxStepOps)), std::string::npos) << s.error().message;
  const Status flagged = models::check_step_size_named(step);
  ASSERT_FALSE(flagged.ok());
  EXPECT_EQ(flagged.error().message.rfind("--layers 1000000000: ", 0), 0u) << flagged.error().message;
  const Status widths = models::check_step_size_named(model_step("mlp", 4, [](models::ModelOptions& m) {
    m.mlp.hidden.assign(200000, 1);  // about 2M ops
  }));
  ASSERT_FALSE(widths.ok());
  EXPECT_EQ(widths.error().message.rfind("--hidden with 200000 widths: ", 0), 0u) << widths.error().message;
}

TEST(StepSize, AnInconsistentStepIsLeftToThePlannerToReport) {
  // past GPT-2's 1024 learned positions: not a size problem
  const StepDescription step = model_step("gpt2", 4, [](models::ModelOptions& m) { m.zoo.seq = 5000; });
  EXPECT_TRUE(check_step_size(step).ok());
}

}  // namespace
}  // namespace memplan::planner
