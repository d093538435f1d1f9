// models/model_ref.h: a model as a user names it, resolved into the step to plan in one place,
// with its errors naming the flag at fault and its notes for the user. Also the layering it is
// for: the CLI reaches the zoo, the Hugging Face reader and the ONNX importer only through it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "memplan/models/model_ref.h"
#include "memplan/models/model_source.h"
#include "memplan/planner/plan_step.h"

namespace memplan::models {
namespace {

std::string config_path(const std::string& file) { return std::string(MEMPLAN_CONFIG_DIR) + "/" + file; }

std::int64_t parameter_bytes(const planner::StepDescription& step) {
  const graph::Graph g = step.source->forward(step.batch);
  std::int64_t bytes = 0;
  for (const graph::TensorDesc& t : g.tensors()) {
    if (t.role == graph::Role::parameter) bytes += t.size_bytes();
  }
  return bytes;
}

std::string error_of(const ModelRef& ref) {
  auto resolved = resolve_model(ref);
  return resolved ? std::string("(resolved)") : resolved.error().message;
}

TEST(ModelRef, ANameResolvesToTheRegistrysModelAtItsDefaultBatch) {
  ModelRef ref;
  ref.name = "gpt2";
  ref.seq = 128;
  ref.dtype = graph::DType::bf16;
  auto resolved = resolve_model(ref);
  ASSERT_TRUE(resolved.ok()) << resolved.error().message;
  const planner::StepDescription& step = resolved.value().step;
  ModelOptions options;
  options.name = "gpt2";
  options.zoo = {128, 0, graph::DType::bf16};
  const graph::ModelSource direct = registry_source(options);
  EXPECT_EQ(step.batch, direct.default_batch);
  EXPECT_EQ(step.dtype, graph::DType::bf16);
  EXPECT_EQ(parameter_bytes(step), parameter_bytes(planner::StepDescription::of_source(direct, step.batch)));
  EXPECT_TRUE(resolved.value().notes.empty());
  EXPECT_FALSE(resolved.value().config.has_value());
  EXPECT_EQ(ref.label(), "gpt2");
}

TEST(ModelRef, AConfigResolvesWithItsOwnPositionsAndTheBatchAsked) {
  ModelRef ref;
  ref.config = config_path("llama-3.2-1b.json");
  ref.batch = 3;
  ref.seq = 64;
  auto resolved = resolve_model(ref);
  ASSERT_TRUE(resolved.ok()) << resolved.error().message;
  EXPECT_EQ(resolved.value().step.batch, 3);
  ASSERT_TRUE(resolved.value().config.has_value());
  EXPECT_EQ(resolved.value().config->model_type, "llama");
  EXPECT_EQ(ref.label(), ref.config);
  EXPECT_TRUE(resolved.value().notes.empty()) << "no note unless asked, and llama has no experts";
}

TEST(ModelRef, NotesListUnreadKeysWhenAskedAndStateWhatAMixtureAssumes) {
  ModelRef ref;
  ref.config = config_path("mixtral-8x7b.json");
  ref.seq = 32;
  ref.batch = 2;
  ref.list_unread_config_keys = true;
  auto resolved = resolve_model(ref);
  ASSERT_TRUE(resolved.ok()) << resolved.error().message;
  const std::vector<std::string>& notes = resolved.value().notes;
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0].rfind(ref.config + ": ", 0), 0u) << notes[0];
  EXPECT_NE(notes[0].find("memplan does not read (for model_type mixtral"), std::string::npos) << notes[0];
  EXPECT_EQ(notes[1].rfind("note: ", 0), 0u) << notes[1];
  EXPECT_NE(notes[1].find("(at batch 2)"), std::string::npos) << notes[1];
}

TEST(ModelRef, ErrorsNameTheFlagAtFaultAndWhatWouldWork) {
  ModelRef mlp_seq;
  mlp_seq.name = "mlp";
  mlp_seq.seq = 16;
  EXPECT_EQ(error_of(mlp_seq), "--seq applies to language models; 'mlp' takes none");

  ModelRef unknown;
  unknown.name = "no-such-model";
  EXPECT_EQ(error_of(unknown), "--model: unknown model 'no-such-model'");

  ModelRef both;
  both.config = config_path("gpt2.json");
  both.onnx = "model.onnx";
  EXPECT_EQ(error_of(both), "--onnx and --config each name the model: give one");

  ModelRef sp;
  sp.name = "gpt";
  sp.sequence_parallel = true;
  EXPECT_NE(error_of(sp).find("give --tensor-parallel T (2 or more)"), std::string::npos) << error_of(sp);

  ModelRef dense_moe;
  dense_moe.config = config_path("llama-2-7b.json");
  dense_moe.moe_capacity_factor = 1.25;
  EXPECT_NE(error_of(dense_moe).find("--moe-capacity-factor applies to mixtures of experts"), std::string::npos)
      << error_of(dense_moe);

  ModelRef past_positions;
  past_positions.config = config_path("gpt2.json");
  past_positions.seq = 5000;
  EXPECT_EQ(error_of(past_positions), "--seq 5000 exceeds the 1024 learned positions of " + past_positions.config);

  ModelRef onnx_seq;
  onnx_seq.onnx = "model.onnx";
  onnx_seq.seq = 8;
  EXPECT_NE(error_of(onnx_seq).find("do not apply to --onnx"), std::string::npos) << error_of(onnx_seq);

  ModelRef missing_onnx;
  missing_onnx.onnx = "/nonexistent/model.onnx";
  EXPECT_EQ(error_of(missing_onnx).rfind("--onnx: ", 0), 0u) << error_of(missing_onnx);

  ModelRef huge;
  huge.config = config_path("llama-3.2-1b.json");
  huge.seq = std::int64_t{1} << 58;
  const std::string message = error_of(huge);
  EXPECT_EQ(message.rfind("--seq " + std::to_string(huge.seq), 0), 0u) << message;
}

TEST(ModelRef, ServedDecodersComeFromEveryKindOfDecoderReference) {
  ModelRef zoo;
  zoo.name = "llama2-7b";
  zoo.seq = 256;
  auto llama = served_decoder(zoo);
  ASSERT_TRUE(llama.ok()) << llama.error().message;
  ASSERT_TRUE(llama.value().llama.has_value());
  EXPECT_EQ(llama.value().llama->context, 256);

  ModelRef config;
  config.config = config_path("gpt2.json");
  auto gpt2 = served_decoder(config);
  ASSERT_TRUE(gpt2.ok()) << gpt2.error().message;
  EXPECT_FALSE(gpt2.value().llama.has_value());
  EXPECT_EQ(gpt2.value().seq, 1024) << "a config's own positions when no sequence is asked";
  EXPECT_EQ(gpt2.value().gpt.dropout, 0.0f);

  ModelRef vision;
  vision.config = config_path("vit-base-patch16-224.json");
  auto refused = served_decoder(vision);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, "--serve plans decoder models; " + vision.config + " is a vit");
}

// The CLI turns flags into a ModelRef and renders what comes back; the zoo, the Hugging Face
// reader and the ONNX importer are models/'s business, reached through model_ref.h.
TEST(ModelRef, ToolsIncludeNoModelBuilderOrImporterDirectly) {
  const std::string tools = std::string(MEMPLAN_TEST_SOURCE_DIR) + "/../tools/";
  const std::regex forbidden(R"re(#include\s+"memplan/(models/zoo\.h|models/hf_config\.h|import/onnx_[a-z_]*\.h)")re");
  int files = 0;
  for (const std::filesystem::directory_entry& entry : std::filesystem::directory_iterator(tools)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".h") continue;
    std::ifstream in(entry.path());
    ASSERT_TRUE(in) << entry.path();
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    std::smatch match;
    EXPECT_FALSE(std::regex_search(s, match, forbidden)) << entry.path().filename() << " includes " << match.str(0);
    ++files;
  }
  EXPECT_GT(files, 20) << "tools/ was not found at " << tools;
  std::ifstream cli_util(tools + "cli_util.cpp");
  int lines = 0;
  for (std::string line; std::getline(cli_util, line);) ++lines;
  EXPECT_LT(lines, 400) << "tools/cli_util.cpp holds flag helpers only";
}

}  // namespace
}  // namespace memplan::models
