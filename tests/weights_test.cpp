// Weights files: the safetensors format (against a file laid out by hand from the format's
// description), save/load through executors, the checksum, mismatch reports, and crash safety
// (a save killed halfway leaves the previous file intact).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "memplan/graph/training_step.h"
#include "memplan/models/gpt.h"
#include "memplan/models/mlp.h"
#include "memplan/runtime/safetensors.h"
#include "memplan/runtime/weights.h"
#include "cli_util.h"
#include "test_util.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;
using runtime::parse_safetensors;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("memplan_weights_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A two-tensor file written byte by byte as the format describes it.
std::string hand_made_file() {
  const std::string header =
      R"({"b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("__metadata__":{"format":"pt"}})";
  const float a[2] = {1.5f, -2.0f};
  const std::int32_t b[2] = {7, -9};
  std::string data(16, '\0');
  std::memcpy(data.data(), a, 8);
  std::memcpy(data.data() + 8, b, 8);
  return le64(header.size()) + header + data;
}

TEST(Safetensors, ReadsAFileLaidOutByHand) {
  const std::string bytes = hand_made_file();
  auto view = parse_safetensors(bytes, "hand.safetensors");
  ASSERT_TRUE(view.ok()) << view.error().message;
  ASSERT_EQ(view.value().tensors.size(), 2u);
  EXPECT_EQ(view.value().metadata.at("format"), "pt");
  const runtime::SafetensorsEntry* a = view.value().find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, graph::DType::f32);
  EXPECT_EQ(a->shape, std::vector<std::int64_t>{2});
  float values[2];
  std::memcpy(values, a->data.data(), 8);
  EXPECT_EQ(values[0], 1.5f);
  EXPECT_EQ(values[1], -2.0f);
  const runtime::SafetensorsEntry* b = view.value().find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, graph::DType::i32);
  std::int32_t ints[2];
  std::memcpy(ints, b->data.data(), 8);
  EXPECT_EQ(ints[1], -9);
}

TEST(Safetensors, EncodesWhatItParsesWithAnAlignedHeader) {
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  const std::string w_bytes(reinterpret_cast<const char*>(w.data()), w.size() * 4);
  auto encoded = runtime::encode_safetensors({{"w", graph::DType::f32, {2, 3}, w_bytes}}, {{"k", "v"}});
  ASSERT_TRUE(encoded.ok());
  const std::string& bytes = encoded.value();
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "data must start 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + header_len + w_bytes.size());
  auto view = parse_safetensors(bytes, "x");
  ASSERT_TRUE(view.ok()) << view.error().message;
  EXPECT_EQ(view.value().tensors[0].shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(view.value().tensors[0].data, w_bytes);
  EXPECT_EQ(view.value().metadata.at("k"), "v");

  EXPECT_FALSE(runtime::encode_safetensors({{"w", graph::DType::f32, {2, 2}, w_bytes}}, {}).ok()) << "size mismatch";
  EXPECT_FALSE(runtime::encode_safetensors({{"w", graph::DType::f32, {6}, w_bytes}, {"w", graph::DType::f32, {6}, w_bytes}}, {})
                   .ok())
      << "duplicate name";
}

TEST(Safetensors, EveryTruncationIsRefusedWithAMessage) {
  const std::string bytes = hand_made_file();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto view = parse_safetensors(std::string_view(bytes).substr(0, n), "cut.safetensors");
    ASSERT_FALSE(view.ok()) << "a file cut to " << n << " bytes was accepted";
    EXPECT_NE(view.error().message.find("cut.safetensors"), std::string::npos) << view.error().message;
  }
}

TEST(Safetensors, MalformedHeadersAreRefused) {
  const std::string data(16, '\0');
  auto with_header = [&](const std::string& header) { return le64(header.size()) + header + data; };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", "F64"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,16]}})", "non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", "need 8"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}})", "outside"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", "outside"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", "gap"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "after the last tensor"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", "lacks"},
      {R"({"__metadata__":{"k":3},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "not a string"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}})", "overflows"},
  };
  for (const auto& [header, expected] : cases) {
    auto view = parse_safetensors(with_header(header), "bad.safetensors");
    ASSERT_FALSE(view.ok()) << header;
    EXPECT_NE(view.error().message.find(expected), std::string::npos) << header << " -> " << view.error().message;
  }
  auto huge = parse_safetensors(le64(std::uint64_t{1} << 62) + "{}", "huge.safetensors");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message.find("implausible"), std::string::npos);
}

graph::Graph mlp_step(std::vector<std::int64_t> hidden) {
  models::MlpConfig config;
  config.inputs = 12;
  config.hidden = std::move(hidden);
  config.classes = 3;
  graph::Graph g = models::build_mlp(config, 4);
  graph::make_training_step(g, graph::OptimizerConfig{});  // AdamW: state to save too
  return g;
}

void feed_and_step(runtime::Executor& e, int step) {
  const graph::Graph& g = e.graph();
  const auto x = testing::random_values(48, 100 + static_cast<std::uint64_t>(step));
  const std::vector<std::int32_t> labels = {0, 1, 2, step % 3};
  e.set_input(g.find("x"), x.data(), 48 * 4);
  e.set_input(g.find("labels"), labels.data(), 16);
  ASSERT_TRUE(e.run_step().ok());
}

TEST(Weights, SaveThenLoadResumesTrainingBitForBit) {
  const fs::path dir = temp_dir("resume");
  const graph::Graph g = mlp_step({16});
  testing::CpuRun original(g);
  original.executor.initialize_persistent(1);
  for (int i = 0; i < 3; ++i) feed_and_step(original.executor, i);
  ASSERT_TRUE(runtime::save_weights(original.executor, (dir / "w.safetensors").string(), {{"note", "x"}}).ok());

  testing::CpuRun resumed(g);
  resumed.executor.initialize_persistent(99);  // different start: everything must come from the file
  auto file = runtime::read_weights_file((dir / "w.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(file.value().view.metadata.at("note"), "x");
  auto report = runtime::load_weights(resumed.executor, file.value(), "w.safetensors");
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_TRUE(report.value().fresh_state.empty());
  EXPECT_EQ(report.value().step, 3);
  EXPECT_EQ(resumed.executor.params_sha256(), original.executor.params_sha256());
  for (int i = 3; i < 6; ++i) {
    feed_and_step(original.executor, i);
    feed_and_step(resumed.executor, i);
  }
  EXPECT_EQ(resumed.executor.params_sha256(), original.executor.params_sha256())
      << "optimizer state must be saved and restored too";
  fs::remove_all(dir);
}

TEST(Weights, AnEvaluationGraphLoadsTheWeightsAndIgnoresOptimizerState) {
  const fs::path dir = temp_dir("eval");
  models::GptConfig config{11, 8, 1, 2, 16, 0.0f, true};
  graph::Graph train = models::build_gpt(config, 2, true);
  graph::make_training_step(train, graph::OptimizerConfig{});
  testing::CpuRun trained(train);
  trained.executor.initialize_persistent(3);
  ASSERT_TRUE(runtime::save_weights(trained.executor, (dir / "gpt.safetensors").string(), {}).ok());

  const graph::Graph eval = models::build_gpt(config, 1, false);
  testing::CpuRun evaluator(eval);
  auto file = runtime::read_weights_file((dir / "gpt.safetensors").string());
  ASSERT_TRUE(file.ok());
  auto report = runtime::load_weights(evaluator.executor, file.value(), "gpt.safetensors");
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_EQ(evaluator.executor.params_sha256(), trained.executor.params_sha256());
  fs::remove_all(dir);
}

TEST(Weights, MismatchesAreListedByTensorNameAndNothingIsWritten) {
  const fs::path dir = temp_dir("mismatch");
  const graph::Graph small_graph = mlp_step({16});
  testing::CpuRun small(small_graph);
  small.executor.initialize_persistent(1);
  ASSERT_TRUE(runtime::save_weights(small.executor, (dir / "w.safetensors").string(), {}).ok());

  const graph::Graph other_graph = mlp_step({8, 8});
  testing::CpuRun other(other_graph);
  other.executor.initialize_persistent(2);
  const std::string before = other.executor.params_sha256();
  auto file = runtime::read_weights_file((dir / "w.safetensors").string());
  ASSERT_TRUE(file.ok());
  auto report = runtime::load_weights(other.executor, file.value(), "w.safetensors");
  ASSERT_FALSE(report.ok());
  const std::string& msg = report.error().message;
  EXPECT_NE(msg.find("fc1.weight: shape [16, 12] in the file, [8, 12] in the model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fc3.weight: missing from the file"), std::string::npos) << msg;
  EXPECT_EQ(other.executor.params_sha256(), before) << "a refused load must not change any weight";
  fs::remove_all(dir);
}

TEST(Weights, ACorruptedFileIsRefusedByItsChecksum) {
  const fs::path dir = temp_dir("corrupt");
  const graph::Graph g = mlp_step({16});
  testing::CpuRun run(g);
  run.executor.initialize_persistent(1);
  const fs::path path = dir / "w.safetensors";
  ASSERT_TRUE(runtime::save_weights(run.executor, path.string(), {}).ok());
  std::string bytes = file_bytes(path);
  bytes[bytes.size() - 5] = static_cast<char>(bytes[bytes.size() - 5] ^ 0x10);  // one bit in the last tensor
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  auto file = runtime::read_weights_file(path.string());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("checksum mismatch"), std::string::npos) << file.error().message;
  fs::remove_all(dir);
}

// The process is killed (SIGKILL, as the OOM killer would) halfway through writing a new
// checkpoint over an existing one: the existing one must still load, unchanged.
TEST(Weights, ASaveKilledHalfwayLeavesThePreviousCheckpointIntact) {
  const fs::path dir = temp_dir("crash");
  const fs::path path = dir / "mlp.safetensors";
  const std::string common = "train --model mlp --hidden 32 --steps 3 --eval-samples 0 --quiet --threads 1 --save " + path.string();
  auto first = testing::run_cli(common);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string good = file_bytes(path);
  ASSERT_GT(good.size(), 100000u);

  ::setenv("MEMPLAN_FAULT_KILL_AFTER_BYTES", std::to_string(good.size() / 2).c_str(), 1);
  auto killed = testing::run_cli(common + " --seed 7");
  ::unsetenv("MEMPLAN_FAULT_KILL_AFTER_BYTES");
  EXPECT_NE(killed.exit_code, 0) << "the fault hook did not kill the save";
  EXPECT_EQ(file_bytes(path), good) << "the previous checkpoint changed";
  auto file = runtime::read_weights_file(path.string());
  EXPECT_TRUE(file.ok()) << file.error().message;

  // The next complete save replaces it.
  auto again = testing::run_cli(common + " --seed 7");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(file_bytes(path), good);
  EXPECT_TRUE(runtime::read_weights_file(path.string()).ok());
  fs::remove_all(dir);
}

TEST(Weights, LoadOnTheCliReportsMismatchesAndRefusesCorruptFiles) {
  const fs::path dir = temp_dir("cli");
  const fs::path path = dir / "mlp.safetensors";
  ASSERT_EQ(testing::run_cli("train --model mlp --hidden 32 --steps 2 --eval-samples 0 --quiet --threads 1 --save " + path.string()).exit_code, 0);
  auto resumed = testing::run_cli("train --model mlp --hidden 32 --steps 2 --eval-samples 0 --quiet --threads 1 --load " + path.string());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  auto wrong = testing::run_cli("train --model mlp --hidden 64 --steps 2 --eval-samples 0 --quiet --threads 1 --load " + path.string());
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_NE(wrong.output.find("fc1.weight: shape [32, 784] in the file, [64, 784] in the model"), std::string::npos)
      << wrong.output;
  auto not_gpt = testing::run_cli("sample --load " + path.string());
  EXPECT_EQ(not_gpt.exit_code, 2);
  EXPECT_NE(not_gpt.output.find("not a GPT"), std::string::npos) << not_gpt.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memplan
