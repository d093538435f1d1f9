// planner/step_size: every model at its defaults can be represented (no false refusals); sizes
// past what a tensor or a step may hold are refused naming the flag and the largest value that
// works, which is exact; layer counts are refused from their op count before a large build.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "memplan/models/registry.h"
#include "memplan/planner/step_size.h"

namespace memplan::planner {
namespace {

StepDescription model_step(const std::string& name, std::int64_t batch) {
  models::ModelOptions model;
  model.name = name;
  return StepDescription::of_model(model, batch);
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
  EXPECT_EQ(s.error().message.rfind("--batch 4000000000: the step cannot be represented", 0), 0u) << s.error().message;
  const std::int64_t largest = largest_in(s.error().message);
  ASSERT_GT(largest, 1);
  step.batch = largest;
  EXPECT_TRUE(check_step_size(step).ok());
  step.batch = largest + 1;
  EXPECT_FALSE(check_step_size(step).ok());
  EXPECT_EQ(largest_representable_batch(model_step("llama2-7b", 1), std::int64_t{1} << 40), largest);
  EXPECT_EQ(largest_representable_batch(model_step("llama2-7b", 1), 1000), 1000);
}

TEST(StepSize, EachDimensionIsNamed) {
  const struct {
    std::string model;
    std::string flag;
    std::function<void(models::ModelOptions&)> set;
  } cases[] = {
      {"gpt", "--seq", [](models::ModelOptions& m) { m.gpt.context = std::int64_t{1} << 58; }},
      {"gpt", "--width", [](models::ModelOptions& m) { m.gpt.width = std::int64_t{1} << 40; }},
      {"mlp", "--hidden", [](models::ModelOptions& m) { m.mlp.hidden = {std::int64_t{1} << 62}; }},
      {"cnn", "--image-size", [](models::ModelOptions& m) { m.cnn.image = std::int64_t{1} << 40; }},
      {"vit-b16", "--image-size", [](models::ModelOptions& m) { m.zoo.image_size = std::int64_t{1} << 40; }},
      {"llama-1b", "--seq", [](models::ModelOptions& m) { m.zoo.seq = std::int64_t{1} << 58; }},
  };
  for (const auto& c : cases) {
    StepDescription step = model_step(c.model, 4);
    c.set(step.model);
    const Status s = check_step_size(step);
    ASSERT_FALSE(s.ok()) << c.model << " " << c.flag;
    EXPECT_EQ(s.error().message.rfind(c.flag, 0), 0u) << s.error().message;
    EXPECT_GT(largest_in(s.error().message), 0) << s.error().message;
  }
}

TEST(StepSize, LayerCountsAreRefusedBeforeTheGraphIsBuilt) {
  StepDescription step = model_step("gpt", 4);
  step.model.gpt.layers = 1000000000;
  const Status s = check_step_size(step);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("--layers 1000000000"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find(std::to_string(kMaxStepOps)), std::string::npos) << s.error().message;
}

TEST(StepSize, AnInconsistentStepIsLeftToThePlannerToReport) {
  StepDescription step = model_step("gpt2", 4);
  step.model.zoo.seq = 5000;  // past GPT-2's 1024 learned positions: not a size problem
  EXPECT_TRUE(check_step_size(step).ok());
}

}  // namespace
}  // namespace memplan::planner
