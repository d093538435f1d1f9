// ONNX import against PyTorch: fixtures exported by tests/golden/make_onnx_fixtures.py (a small
// CNN and a GPT-2-style decoder) must give torch's parameter count, forward output, loss and
// gradients for the same batch; planned and naive execution must agree bitwise; hostile files
// must fail with a message naming the node.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include "cli_util.h"
#include "golden_util.h"
#include "memplan/graph/autograd.h"
#include "memplan/graph/training_step.h"
#include "memplan/import/onnx_import.h"
#include "test_util.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;
using import::ImportedGraph;
using import::OnnxModel;

std::string fixture(const std::string& name) { return std::string(MEMPLAN_TEST_DATA_DIR) + "/onnx/" + name; }

std::shared_ptr<const OnnxModel> load(const std::string& name) {
  auto m = OnnxModel::load(fixture(name));
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? m.value() : nullptr;
}

void write_initial_values(runtime::Executor& e, const ImportedGraph& imported) {
  for (const auto& [id, values] : imported.initial_values) {
    ASSERT_EQ(static_cast<std::int64_t>(values.size()), imported.graph.tensor(id).shape.numel());
    e.write_values(id, values.data());  // f32 weights, or a Gather's constant i32 indices
  }
}

void set_golden_inputs(runtime::Executor& e, const ImportedGraph& imported, const nlohmann::json& golden) {
  const graph::TensorDesc& x = imported.graph.tensor(imported.inputs.at(0));
  if (x.dtype == graph::DType::i32) {
    const auto ids = golden["input"].get<std::vector<std::int32_t>>();
    e.set_input(imported.inputs[0], ids.data(), static_cast<Bytes>(ids.size() * 4));
  } else {
    const auto v = golden["input"].get<std::vector<float>>();
    e.set_input(imported.inputs[0], v.data(), static_cast<Bytes>(v.size() * 4));
  }
  const auto labels = golden["labels"].get<std::vector<std::int32_t>>();
  e.set_input(imported.labels, labels.data(), static_cast<Bytes>(labels.size() * 4));
}

class OnnxGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(OnnxGolden, ForwardLossAndGradientsMatchPyTorch) {
  const std::string name = GetParam();
  const nlohmann::json golden = testing::load_golden("onnx/" + name + "_golden.json");
  auto model = load(name + ".onnx");
  ASSERT_TRUE(model);
  import::ImportOptions options;
  options.batch = golden["input_shape"][0].get<std::int64_t>();
  ImportedGraph imported = model->build(options);
  graph::Graph& g = imported.graph;

  std::int64_t params = 0;
  for (TensorId p : g.parameters()) params += g.tensor(p).shape.numel();
  EXPECT_EQ(params, golden["parameter_count"].get<std::int64_t>());
  EXPECT_EQ(g.tensor(g.output).shape.dims, golden["output_shape"].get<std::vector<std::int64_t>>());

  graph::append_backward(g, g.loss);
  for (TensorId p : g.parameters()) g.retained.push_back(g.tensor(p).grad);
  g.retained.push_back(g.output);
  testing::CpuRun run(g);
  write_initial_values(run.executor, imported);
  set_golden_inputs(run.executor, imported, golden);
  ASSERT_TRUE(run.executor.run_step().ok());

  EXPECT_NEAR(run.executor.read_scalar(g.loss), golden["loss"].get<float>(), 1e-5f);
  testing::expect_close(testing::read_floats(run.executor, g.output), golden["output"].get<std::vector<float>>(),
                        "output", 1e-5f, 1e-4f);
  ASSERT_FALSE(golden["grad"].empty());
  for (const auto& [pname, grad] : golden["grad"].items()) {
    const TensorId p = g.find(pname);
    ASSERT_NE(p, kNoTensor) << pname;
    testing::expect_close(testing::read_floats(run.executor, g.tensor(p).grad), grad.get<std::vector<float>>(),
                          "d loss / d " + pname, 1e-5f, 1e-3f);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OnnxGolden, ::testing::Values("small_cnn", "tiny_gpt", "tiny_mobilenet", "tiny_ln_mlp", "tiny_dilated", "tiny_se", "tiny_vgg", "tiny_vit",
                                                             "tiny_torchvision_ops", "tiny_swin", "tiny_maxvit"));

// Three SGD steps from the file's weights, planned and naive: the same parameter bytes.
std::string train_sha(const std::string& name, runtime::ExecutionMode mode) {
  auto model = load(name + ".onnx");
  import::ImportOptions options;
  options.batch = 2;
  ImportedGraph imported = model->build(options);
  graph::OptimizerConfig sgd;
  sgd.kind = graph::OptimizerKind::sgd;
  sgd.lr = 0.05f;
  graph::make_training_step(imported.graph, sgd);
  testing::CpuRun run(imported.graph, mode);
  write_initial_values(run.executor, imported);
  const nlohmann::json golden = testing::load_golden("onnx/" + name + "_golden.json");
  for (int step = 0; step < 3; ++step) {
    set_golden_inputs(run.executor, imported, golden);
    EXPECT_TRUE(run.executor.run_step().ok());
  }
  return run.executor.params_sha256();
}

TEST(OnnxImport, PlannedAndNaiveTrainingAgreeBitwise) {
  for (const char* name : {"small_cnn", "tiny_gpt", "tiny_mobilenet", "tiny_ln_mlp", "tiny_dilated", "tiny_se", "tiny_vgg", "tiny_vit",
                           "tiny_swin", "tiny_maxvit"}) {
    const std::string planned = train_sha(name, runtime::ExecutionMode::planned);
    EXPECT_EQ(planned, train_sha(name, runtime::ExecutionMode::naive)) << name;
    EXPECT_NE(planned, "");
  }
}

TEST(OnnxImport, BatchReplacesTheFirstDimension) {
  auto model = load("small_cnn.onnx");
  import::ImportOptions options;
  options.batch = 37;
  options.keep_values = false;
  const ImportedGraph imported = model->build(options);
  EXPECT_EQ(imported.graph.tensor(imported.inputs[0]).shape, (graph::Shape{37, 1, 12, 12}));
  EXPECT_EQ(imported.graph.tensor(imported.graph.output).shape, (graph::Shape{37, 10}));
  EXPECT_TRUE(imported.initial_values.empty());
  // The decoder's reshapes follow the batch through Shape -> Gather -> Concat.
  auto gpt = load("tiny_gpt.onnx");
  const ImportedGraph g = gpt->build(options);
  EXPECT_EQ(g.graph.tensor(g.graph.output).shape, (graph::Shape{37, 8, 32}));
}

TEST(OnnxImport, MseLossReadsATargetOfTheOutputsShape) {
  auto model = load("small_cnn.onnx");
  import::ImportOptions options;
  options.batch = 4;
  options.loss = import::LossKind::mse;
  const ImportedGraph imported = model->build(options);
  EXPECT_EQ(imported.graph.tensor(imported.labels).shape, (graph::Shape{4, 10}));
  EXPECT_EQ(imported.graph.tensor(imported.graph.loss).shape.numel(), 1);
}

// ---- hostile files ---------------------------------------------------------------------------

onnx::ModelProto tiny_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(15);
  onnx::GraphProto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(4);
  g->add_output()->set_name("y");
  return m;
}

onnx::NodeProto* add_node(onnx::ModelProto& m, const std::string& op, const std::string& name,
                          std::vector<std::string> inputs, std::vector<std::string> outputs) {
  onnx::NodeProto* n = m.mutable_graph()->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

std::string build_error(const onnx::ModelProto& m) {
  std::string bytes;
  EXPECT_TRUE(m.SerializeToString(&bytes));
  auto model = OnnxModel::parse(bytes, "hostile.onnx");
  if (!model) return model.error().message;
  import::ImportOptions options;
  options.batch = 2;
  auto built = model.value()->try_build(options);
  return built.ok() ? std::string("(imported)") : built.error().message;
}

TEST(OnnxImport, UnsupportedOpNamesOpNodeOpsetAndWhatIsSupported) {
  onnx::ModelProto m = tiny_model();
  add_node(m, "Relu", "first", {"x"}, {"r"});
  add_node(m, "Mish", "the_mish", {"r"}, {"y"});
  const std::string e = build_error(m);
  EXPECT_NE(e.find("node 'the_mish' (Mish, opset 15)"), std::string::npos) << e;
  EXPECT_NE(e.find("not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("LayerNormalization"), std::string::npos) << e;  // the list of supported ops
}

TEST(OnnxImport, ACycleOrAnInputUsedBeforeItIsDefinedNamesTheNode) {
  onnx::ModelProto cycle = tiny_model();
  add_node(cycle, "Add", "a", {"x", "b_out"}, {"a_out"});
  add_node(cycle, "Relu", "b", {"a_out"}, {"b_out"});
  const std::string e = build_error(cycle);
  EXPECT_NE(e.find("node 'a' (Add"), std::string::npos) << e;
  EXPECT_NE(e.find("'b_out' is used before any node defines it"), std::string::npos) << e;
}

TEST(OnnxImport, ShapesThatDisagreeNameTheNode) {
  onnx::ModelProto m = tiny_model();
  add_node(m, "Flatten", "flat", {"x"}, {"f"});
  auto* shape = add_node(m, "Constant", "shape", {}, {"s"});
  auto* attr = shape->add_attribute();
  attr->set_name("value_ints");
  attr->set_type(onnx::AttributeProto::INTS);
  attr->add_ints(3);
  attr->add_ints(3);
  add_node(m, "Reshape", "bad_reshape", {"f", "s"}, {"y"});
  const std::string e = build_error(m);
  EXPECT_NE(e.find("node 'bad_reshape' (Reshape, opset 15): cannot reshape [2, 4] to [3, 3]"), std::string::npos) << e;
}

// A float initializer of `dims`, its values (or external data) left to the caller.
onnx::TensorProto* add_float_initializer(onnx::ModelProto& m, const std::string& name, const std::vector<std::int64_t>& dims) {
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name(name);
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (std::int64_t d : dims) w->add_dims(d);
  return w;
}

void add_ints_attribute(onnx::NodeProto* node, const std::string& name, const std::vector<std::int64_t>& values) {
  auto* attr = node->add_attribute();
  attr->set_name(name);
  attr->set_type(onnx::AttributeProto::INTS);
  for (std::int64_t v : values) attr->add_ints(v);
}

void add_int_constant(onnx::ModelProto& m, const std::string& name, std::vector<std::int64_t> values) {
  add_ints_attribute(add_node(m, "Constant", name, {}, {name}), "value_ints", values);
}

// x [2, 4] sliced along its columns from `start` with `step` (Swin's patch merging is step 2).
onnx::ModelProto strided_slice_model(std::int64_t start, std::int64_t step,
                                     std::int64_t end = std::numeric_limits<std::int64_t>::max()) {
  onnx::ModelProto m = tiny_model();
  add_int_constant(m, "starts", {start});
  add_int_constant(m, "ends", {end});
  add_int_constant(m, "axes", {1});
  add_int_constant(m, "steps", {step});
  add_node(m, "Slice", "merge", {"x", "starts", "ends", "axes", "steps"}, {"y"});
  return m;
}

TEST(OnnxImport, StridedSlicesTakeEveryKthColumnAndNameStepsTheyCannot) {
  std::string bytes;
  ASSERT_TRUE(strided_slice_model(1, 2).SerializeToString(&bytes));
  auto model = OnnxModel::parse(bytes, "slice.onnx");
  ASSERT_TRUE(model.ok()) << model.error().message;
  import::ImportOptions options;
  options.batch = 2;
  options.loss = import::LossKind::mse;
  ImportedGraph imported = model.value()->build(options);
  const graph::Graph& g = imported.graph;
  ASSERT_EQ(g.tensor(g.output).shape, (graph::Shape{2, 2}));
  imported.graph.retained.push_back(g.output);
  testing::CpuRun run(imported.graph);
  const std::vector<float> x = {0, 1, 2, 3, 10, 11, 12, 13};
  run.executor.set_input(imported.inputs[0], x.data(), 32);
  const std::vector<float> target(4, 0.0f);
  run.executor.set_input(imported.labels, target.data(), 16);
  ASSERT_TRUE(run.executor.run_step().ok());
  EXPECT_EQ(testing::read_floats(run.executor, g.output), (std::vector<float>{1, 3, 11, 13}));

  std::string e = build_error(strided_slice_model(0, 3));
  EXPECT_NE(e.find("node 'merge' (Slice, opset 15): a slice with step 3 along an axis of 4"), std::string::npos) << e;
  e = build_error(strided_slice_model(-1, -1, std::numeric_limits<std::int64_t>::min()));
  EXPECT_NE(e.find("node 'merge' (Slice, opset 15): a slice with a negative step"), std::string::npos) << e;
}

// Constants are folded for shapes, masks and indices: a broadcast of two into a huge one (2^26
// elements from [8192, 1] + [1, 8192]) is refused before anything is allocated.
TEST(OnnxImport, FoldingAHugeConstantIsRefused) {
  onnx::ModelProto m = tiny_model();
  add_int_constant(m, "tall_shape", {8192, 1});
  add_int_constant(m, "wide_shape", {1, 8192});
  add_node(m, "ConstantOfShape", "tall", {"tall_shape"}, {"t"});
  add_node(m, "ConstantOfShape", "wide", {"wide_shape"}, {"w"});
  add_node(m, "Add", "grid", {"t", "w"}, {"g"});
  add_node(m, "Relu", "act", {"x"}, {"y"});
  const std::string e = build_error(m);
  EXPECT_NE(e.find("node 'grid' (Add, opset 15): a constant of 67108864 elements is too large to fold"), std::string::npos) << e;
}

// Transpose folds constants too (the exporter reorders F.pad's pad list); its perm must name every
// axis once, for constants as for tensors.
TEST(OnnxImport, TransposeOfAConstantNeedsAWholePermutation) {
  for (const std::vector<std::int64_t>& perm : {std::vector<std::int64_t>{0}, std::vector<std::int64_t>{0, 0},
                                                std::vector<std::int64_t>{0, 1, 2}}) {
    onnx::ModelProto m = tiny_model();
    add_int_constant(m, "shape", {2, 3});
    add_node(m, "ConstantOfShape", "zeros", {"shape"}, {"z"});
    add_ints_attribute(add_node(m, "Transpose", "flip", {"z"}, {"zt"}), "perm", perm);
    add_node(m, "Relu", "act", {"x"}, {"y"});
    const std::string e = build_error(m);
    EXPECT_NE(e.find("node 'flip' (Transpose, opset 15): perm is not a permutation of the input's 2 axes"), std::string::npos) << e;
  }
  // A scalar has no axis to name.
  onnx::ModelProto m = tiny_model();
  auto* c = add_node(m, "Constant", "scalar", {}, {"s"});
  auto* value = c->add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  value->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  value->mutable_t()->add_int64_data(7);
  add_ints_attribute(add_node(m, "Transpose", "flip", {"s"}, {"st"}), "perm", {0});
  add_node(m, "Relu", "act", {"x"}, {"y"});
  const std::string e = build_error(m);
  EXPECT_NE(e.find("node 'flip' (Transpose, opset 15): perm is not a permutation of the input's 0 axes"), std::string::npos) << e;
}

// Gather of a learned table by constant indices (a relative-position bias): an embedding reading
// an i32 buffer of the indices; an index outside the table names the node and the table's rows.
TEST(OnnxImport, ConstantIndexGathersReadAnIndexBufferAndCheckTheRange) {
  for (std::int64_t bad : {std::int64_t{2}, std::int64_t{5}}) {
    onnx::ModelProto m = tiny_model();
    auto* w = add_float_initializer(m, "table", {5, 4});
    for (int i = 0; i < 20; ++i) w->add_float_data(static_cast<float>(i));
    add_int_constant(m, "index", {bad, 0});
    add_node(m, "Gather", "bias", {"table", "index"}, {"rows"});
    add_node(m, "Add", "sum", {"x", "rows"}, {"y"});
    std::string bytes;
    ASSERT_TRUE(m.SerializeToString(&bytes));
    auto model = OnnxModel::parse(bytes, "gather.onnx");
    ASSERT_TRUE(model.ok());
    import::ImportOptions options;
    options.batch = 2;
    options.loss = import::LossKind::mse;
    auto built = model.value()->try_build(options);
    if (bad == 5) {
      ASSERT_FALSE(built.ok());
      EXPECT_NE(built.error().message.find("node 'bias' (Gather, opset 15): index 5 is out of range for the table's 5 rows"),
                std::string::npos) << built.error().message;
      continue;
    }
    ASSERT_TRUE(built.ok()) << built.error().message;
    ImportedGraph& imported = built.value();
    const TensorId index = imported.graph.find("index");
    ASSERT_NE(index, kNoTensor);
    EXPECT_EQ(imported.graph.tensor(index).dtype, graph::DType::i32);
    EXPECT_EQ(imported.graph.tensor(index).role, graph::Role::optimizer_state);  // a buffer, never trained
    imported.graph.retained.push_back(imported.graph.output);
    testing::CpuRun run(imported.graph);
    write_initial_values(run.executor, imported);
    const std::vector<float> x(8, 0.5f), target(8, 0.0f);
    run.executor.set_input(imported.inputs[0], x.data(), 32);
    run.executor.set_input(imported.labels, target.data(), 32);
    ASSERT_TRUE(run.executor.run_step().ok());
    EXPECT_EQ(testing::read_floats(run.executor, imported.graph.output), (std::vector<float>{8.5f, 9.5f, 10.5f, 11.5f, 0.5f, 1.5f, 2.5f, 3.5f}));
  }
}

// ONNX's external data (how models over protobuf's 2 GiB are saved): an initializer's bytes in a
// file beside the model, at an offset. Loaded from its file the model reads them; a location
// outside the model's folder, a missing file or a file too short are refused naming the tensor.
TEST(OnnxImport, ExternalDataIsReadFromFilesBesideTheModel) {
  const fs::path dir = fs::temp_directory_path() / ("memplan-external-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write_model = [&](const std::string& location, std::int64_t offset, std::int64_t length) {
    onnx::ModelProto m = tiny_model();
    auto* w = add_float_initializer(m, "w", {4, 3});
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"location", location},
                                     {"offset", std::to_string(offset)}, {"length", std::to_string(length)}}) {
      auto* e = w->add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
    add_node(m, "MatMul", "mm", {"x", "w"}, {"z"});
    add_node(m, "Relu", "act", {"z"}, {"y"});
    std::string bytes;
    EXPECT_TRUE(m.SerializeToString(&bytes));
    std::ofstream(dir / "model.onnx", std::ios::binary) << bytes;
    return (dir / "model.onnx").string();
  };
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) values[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i) - 2.0f;
  {
    std::ofstream data(dir / "weights.bin", std::ios::binary);
    data << "8 bytes!";  // the tensor starts at offset 8
    data.write(reinterpret_cast<const char*>(values.data()), 48);
  }
  auto model = OnnxModel::load(write_model("weights.bin", 8, 48));
  ASSERT_TRUE(model.ok()) << model.error().message;
  import::ImportOptions options;
  options.batch = 2;
  options.loss = import::LossKind::mse;
  const ImportedGraph imported = model.value()->build(options);
  ASSERT_EQ(imported.initial_values.size(), 1u);
  EXPECT_EQ(imported.initial_values[0].second, values);
  options.keep_values = false;  // planning reads no weight
  EXPECT_TRUE(model.value()->try_build(options).ok());

  auto error_of = [&](const std::string& location, std::int64_t offset, std::int64_t length) {
    auto m = OnnxModel::load(write_model(location, offset, length));
    return m.ok() ? std::string("(loaded)") : m.error().message;
  };
  std::string e = error_of("../weights.bin", 8, 48);
  EXPECT_NE(e.find("initializer 'w' keeps its data at '../weights.bin'"), std::string::npos) << e;
  e = error_of("missing.bin", 0, 48);
  EXPECT_NE(e.find("initializer 'w' keeps its data in an external file"), std::string::npos) << e;
  EXPECT_NE(e.find("missing.bin"), std::string::npos) << e;
  e = error_of("weights.bin", 40, 48);
  EXPECT_NE(e.find("reads bytes [40, 88) of 'weights.bin', which holds 56"), std::string::npos) << e;
  // Parsed from bytes alone there is no folder to read the file from.
  std::string bytes;
  {
    std::ifstream in(dir / "model.onnx", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto parsed = OnnxModel::parse(bytes, "bytes.onnx");
  ASSERT_TRUE(parsed.ok());
  options.keep_values = true;
  auto built = parsed.value()->try_build(options);
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.error().message.find("external file"), std::string::npos) << built.error().message;
  fs::remove_all(dir);
}

TEST(OnnxImport, DimensionsThatOverflowBytesAreRefused) {
  onnx::ModelProto m = tiny_model();
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(std::int64_t{1} << 40);
  w->add_dims(std::int64_t{1} << 40);
  add_node(m, "MatMul", "mm", {"x", "w"}, {"y"});
  const std::string e = build_error(m);
  EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("overflow"), std::string::npos) << e;

  onnx::ModelProto big = tiny_model();
  auto* dims = big.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  dims->mutable_dim(1)->set_dim_value(std::int64_t{1} << 59);
  add_node(big, "Relu", "wide_relu", {"x"}, {"y"});
  const std::string e2 = build_error(big);
  EXPECT_NE(e2.find("x"), std::string::npos) << e2;
  EXPECT_NE(e2, "(imported)");
}

TEST(OnnxImport, PartsOfTheLayerNormPatternUsedElsewhereNameTheNode) {
  onnx::ModelProto m = tiny_model();
  auto* mean = add_node(m, "ReduceMean", "mean", {"x"}, {"mu"});
  auto* axes = mean->add_attribute();
  axes->set_name("axes");
  axes->set_type(onnx::AttributeProto::INTS);
  axes->add_ints(-1);
  add_node(m, "Relu", "uses_the_mean", {"mu"}, {"y"});
  const std::string e = build_error(m);
  EXPECT_NE(e.find("node 'uses_the_mean' (Relu, opset 15)"), std::string::npos) << e;
  EXPECT_NE(e.find("LayerNormalization's decomposition"), std::string::npos) << e;

  onnx::ModelProto sqrt = tiny_model();
  add_node(sqrt, "Sqrt", "plain_sqrt", {"x"}, {"y"});
  EXPECT_NE(build_error(sqrt).find("node 'plain_sqrt' (Sqrt, opset 15): memplan imports Sqrt only within"), std::string::npos)
      << build_error(sqrt);
}

TEST(OnnxImport, ClipBoundsMustBeConstantAndConvGroupsMustDivide) {
  onnx::ModelProto clip = tiny_model();
  add_node(clip, "Clip", "clip_by_tensor", {"x", "x"}, {"y"});
  EXPECT_NE(build_error(clip).find("node 'clip_by_tensor' (Clip, opset 15): the min bound must be a constant"), std::string::npos)
      << build_error(clip);

  onnx::ModelProto conv = tiny_model();
  auto* dims = conv.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  for (int i = 0; i < 2; ++i) dims->add_dim()->set_dim_value(5);  // x [B, 4, 5, 5]
  auto* w = conv.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (std::int64_t d : {6, 1, 3, 3}) w->add_dims(d);
  for (int i = 0; i < 54; ++i) w->add_float_data(0.0f);
  auto* node = add_node(conv, "Conv", "odd_groups", {"x", "w"}, {"y"});
  auto* group = node->add_attribute();
  group->set_name("group");
  group->set_type(onnx::AttributeProto::INT);
  group->set_i(3);  // does not divide 4 input channels
  const std::string e = build_error(conv);
  EXPECT_NE(e.find("node 'odd_groups' (Conv, opset 15): group 3 must divide"), std::string::npos) << e;
}

// x [B, 4, 5, 5] through a 3x3 Conv with the given dilations and padding 1.
onnx::ModelProto dilated_conv(std::vector<std::int64_t> dilations) {
  onnx::ModelProto conv = tiny_model();
  auto* dims = conv.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  for (int i = 0; i < 2; ++i) dims->add_dim()->set_dim_value(5);
  auto* w = conv.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (std::int64_t d : {2, 4, 3, 3}) w->add_dims(d);
  for (int i = 0; i < 72; ++i) w->add_float_data(0.0f);
  auto* node = add_node(conv, "Conv", "atrous", {"x", "w"}, {"y"});
  auto* dil = node->add_attribute();
  dil->set_name("dilations");
  dil->set_type(onnx::AttributeProto::INTS);
  for (std::int64_t d : dilations) dil->add_ints(d);
  auto* pads = node->add_attribute();
  pads->set_name("pads");
  pads->set_type(onnx::AttributeProto::INTS);
  for (int i = 0; i < 4; ++i) pads->add_ints(1);
  return conv;
}

TEST(OnnxImport, DilatedConvImportsAndUnequalOrOversizedDilationsNameTheNode) {
  EXPECT_EQ(build_error(dilated_conv({2, 2})), "(imported)");  // (5 + 2 - 5) / 1 + 1 = 3
  const std::string unequal = build_error(dilated_conv({2, 1}));
  EXPECT_NE(unequal.find("node 'atrous' (Conv, opset 15): memplan's convolution takes one positive dilation along H and W, got dilations [2, 1]"),
            std::string::npos)
      << unequal;
  const std::string wide = build_error(dilated_conv({4, 4}));  // the window spans 9 > 5 + 2
  EXPECT_NE(wide.find("atrous"), std::string::npos) << wide;
  EXPECT_NE(wide.find("window 9 (kernel 3, dilation 4) is larger than the padded input 7"), std::string::npos) << wide;
}

// x [B, 4, 5, 5] through a Conv of a [2, 4, kh, kw] weight with the given pads (Inception-v3's 1x7
// and 7x1 convolutions pad one axis only).
onnx::ModelProto rectangular_conv(std::int64_t kh, std::int64_t kw, std::vector<std::int64_t> pad_values) {
  onnx::ModelProto conv = tiny_model();
  auto* dims = conv.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  for (int i = 0; i < 2; ++i) dims->add_dim()->set_dim_value(5);
  auto* w = conv.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (std::int64_t d : {std::int64_t{2}, std::int64_t{4}, kh, kw}) w->add_dims(d);
  for (std::int64_t i = 0; i < 8 * kh * kw; ++i) w->add_float_data(0.0f);
  auto* node = add_node(conv, "Conv", "one_by_seven", {"x", "w"}, {"y"});
  auto* pads = node->add_attribute();
  pads->set_name("pads");
  pads->set_type(onnx::AttributeProto::INTS);
  for (std::int64_t p : pad_values) pads->add_ints(p);
  return conv;
}

TEST(OnnxImport, RectangularKernelsPadEachAxisByItsOwnAmount) {
  for (const auto& [kh, kw, pads] : {std::tuple{1, 5, std::vector<std::int64_t>{0, 2, 0, 2}},
                                     std::tuple{5, 1, std::vector<std::int64_t>{2, 0, 2, 0}}}) {
    onnx::ModelProto m = rectangular_conv(kh, kw, pads);
    std::string bytes;
    ASSERT_TRUE(m.SerializeToString(&bytes));
    auto model = OnnxModel::parse(bytes, "rect.onnx");
    ASSERT_TRUE(model.ok()) << model.error().message;
    import::ImportOptions options;
    options.batch = 2;
    auto built = model.value()->try_build(options);
    ASSERT_TRUE(built.ok()) << built.error().message;
    const graph::Graph& g = built.value().graph;
    EXPECT_EQ(g.tensor(g.find("y")).shape, (graph::Shape{2, 2, 5, 5})) << kh << "x" << kw;  // the size kept
    EXPECT_EQ(g.tensor(g.find("y.cols")).shape, (graph::Shape{2, 4 * kh * kw, 25}));
  }
  const std::string uneven = build_error(rectangular_conv(1, 5, {0, 2, 0, 1}));
  EXPECT_NE(uneven.find("node 'one_by_seven' (Conv, opset 15): memplan's convolution pads each axis by the same amount on "
                        "both sides, got pads [0, 2, 0, 1]"),
            std::string::npos)
      << uneven;
}

// q [B, 2, 3, 4] and k [B, 2, 5, 4] through an Einsum of `equation`.
onnx::ModelProto einsum_model(const std::string& equation) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(15);
  onnx::GraphProto* g = m.mutable_graph();
  for (const auto& [name, rows] : {std::pair{"q", 3}, std::pair{"k", 5}}) {
    auto* in = g->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    for (int d : {2, rows, 4}) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  g->add_output()->set_name("y");
  auto* node = add_node(m, "Einsum", "scores", {"q", "k"}, {"y"});
  auto* eq = node->add_attribute();
  eq->set_name("equation");
  eq->set_type(onnx::AttributeProto::STRING);
  eq->set_s(equation);
  return m;
}

// Einsum equations that are batched matrix products import as one batched_matmul (MaxViT's
// attention scores, spaces and capital labels as torch writes them); others name the equation.
TEST(OnnxImport, EinsumMatrixProductsAreBatchedMatmuls) {
  for (const std::string equation : {"bhid,bhjd->bhij", "B G P D, B G Q D -> B G P Q"}) {
    std::string bytes;
    ASSERT_TRUE(einsum_model(equation).SerializeToString(&bytes));
    auto model = OnnxModel::parse(bytes, "einsum.onnx");
    ASSERT_TRUE(model.ok()) << model.error().message;
    import::ImportOptions options;
    options.batch = 2;
    auto built = model.value()->try_build(options);
    ASSERT_TRUE(built.ok()) << equation << ": " << built.error().message;
    const graph::Graph& g = built.value().graph;
    const TensorId y = g.find("y");
    EXPECT_EQ(g.tensor(y).shape, (graph::Shape{2, 2, 3, 5})) << equation;
    ASSERT_GE(g.producer(y), 0);
    const graph::Op& op = g.ops()[static_cast<std::size_t>(g.producer(y))];
    EXPECT_EQ(op.kind, graph::OpKind::batched_matmul);
    EXPECT_FALSE(op.attrs.trans_a);
    EXPECT_TRUE(op.attrs.trans_b);
  }
  for (const std::string equation : {"bhid,bhjd->bhji", "bhid,bhjd->hbij", "bhid,bhje->bhij", "...id,...jd->...ij"}) {
    const std::string e = build_error(einsum_model(equation));
    EXPECT_NE(e.find("node 'scores' (Einsum, opset 15): equation '" + equation + "'"), std::string::npos) << e;
  }
}

// Squeeze-and-excitation: each Mul of [N, C, H, W] by a gate [N, C, 1, 1] is one channel_scale
// that reads the gate as it is (no tensor of the gate broadcast to [N, C, H, W]); other
// broadcasts stay refused.
TEST(OnnxImport, SqueezeExcitationGatesAreChannelScalesAndOtherBroadcastsAreRefused) {
  auto model = load("tiny_se.onnx");
  ASSERT_TRUE(model);
  import::ImportOptions options;
  options.batch = 2;
  const ImportedGraph imported = model->build(options);
  const graph::Graph& g = imported.graph;
  int scales = 0;
  for (const graph::Op& op : g.ops()) {
    if (op.kind == graph::OpKind::mul) ADD_FAILURE() << "a broadcast Mul became an elementwise mul: " << op.name;
    if (op.kind != graph::OpKind::channel_scale) continue;
    ++scales;
    const graph::Shape& gate = g.tensor(op.inputs[1]).shape;
    EXPECT_EQ(gate.rank(), 4) << op.name;
    EXPECT_EQ(gate.numel(), gate[0] * gate[1]) << op.name << ": the gate is " << gate.to_string();
  }
  EXPECT_EQ(scales, 2);

  onnx::ModelProto m = tiny_model();
  auto* dims = m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  for (int i = 0; i < 2; ++i) dims->add_dim()->set_dim_value(3);  // x [B, 4, 3, 3]
  auto* w = m.mutable_graph()->add_initializer();  // a [1, 1, 3, 3] spatial factor: neither gate nor per channel
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (std::int64_t d : {1, 1, 3, 3}) w->add_dims(d);
  for (int i = 0; i < 9; ++i) w->add_float_data(1.0f);
  add_node(m, "Mul", "spatial", {"x", "w"}, {"y"});
  const std::string e = build_error(m);
  EXPECT_NE(e.find("node 'spatial' (Mul, opset 15): memplan multiplies tensors of equal shape, by a scalar constant, "
                   "[N, C, ...] by a gate [N, C, 1, ...] or by a per-channel factor [C, 1, ...]; got [2, 4, 3, 3] and [1, 1, 3, 3]"),
            std::string::npos)
      << e;
  // A per-channel factor ([1, 4, 1, 1] or [4, 1, 1], ConvNeXt's layer scale) is repeated over the
  // batch into a gate: tests/data/onnx/tiny_torchvision_ops checks its values against PyTorch.
  for (const std::vector<std::int64_t>& shape : {std::vector<std::int64_t>{1, 4, 1, 1}, std::vector<std::int64_t>{4, 1, 1}}) {
    w->clear_dims();
    w->clear_float_data();
    for (std::int64_t d : shape) w->add_dims(d);
    for (int i = 0; i < 4; ++i) w->add_float_data(1.0f);
    EXPECT_EQ(build_error(m), "(imported)") << graph::Shape(shape).to_string();
  }
}

// The loader leaves the initializers' data out of the parsed message and reads it from the file
// when asked: the values equal protobuf's own parse of the whole file, for raw_data and for
// float_data initializers alike.
TEST(OnnxImport, InitializerValuesEqualProtobufsParseOfTheWholeFile) {
  std::ifstream in(fixture("tiny_mobilenet.onnx"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  onnx::ModelProto whole;
  ASSERT_TRUE(whole.ParseFromString(bytes));
  // One initializer moved to float_data, so both encodings are read.
  onnx::TensorProto* first = whole.mutable_graph()->mutable_initializer(0);
  std::vector<float> first_values(first->raw_data().size() / 4);
  std::memcpy(first_values.data(), first->raw_data().data(), first->raw_data().size());
  first->clear_raw_data();
  for (float v : first_values) first->add_float_data(v);
  std::string rewritten;
  ASSERT_TRUE(whole.SerializeToString(&rewritten));
  auto model = OnnxModel::parse(rewritten, "mixed.onnx");
  ASSERT_TRUE(model.ok()) << model.error().message;
  const ImportedGraph g = model.value()->build({});
  std::map<std::string, const onnx::TensorProto*> by_name;
  for (const auto& t : whole.graph().initializer()) by_name[t.name()] = &t;
  std::size_t compared = 0;
  for (const auto& [id, values] : g.initial_values) {
    const onnx::TensorProto& t = *by_name.at(g.graph.tensor(id).name);
    std::vector<float> expected(t.float_data().begin(), t.float_data().end());
    if (!t.raw_data().empty()) {
      expected.resize(t.raw_data().size() / 4);
      std::memcpy(expected.data(), t.raw_data().data(), t.raw_data().size());
    }
    EXPECT_EQ(values, expected) << g.graph.tensor(id).name;
    ++compared;
  }
  EXPECT_EQ(compared, by_name.size());
  EXPECT_EQ(compared, static_cast<std::size_t>(whole.graph().initializer_size()));
}

TEST(OnnxImport, TruncatedOrCorruptFilesAreRefused) {
  std::ifstream in(fixture("small_cnn.onnx"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  ASSERT_GT(bytes.size(), 100u);
  auto truncated = OnnxModel::parse(std::string_view(bytes).substr(0, bytes.size() / 2), "half.onnx");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message.find("half.onnx: not a valid ONNX model"), std::string::npos) << truncated.error().message;
  EXPECT_FALSE(OnnxModel::parse("\xff\xff\xff\xff garbage", "junk.onnx").ok());
  EXPECT_FALSE(OnnxModel::load(fixture("no_such_file.onnx")).ok());
}

TEST(OnnxImport, WithInitializersWritesTrainedValuesBack) {
  auto model = load("small_cnn.onnx");
  const std::vector<float> bias(10, 0.25f);
  auto bytes = model->with_initializers({{"fc.bias", bias}});
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  auto reread = OnnxModel::parse(bytes.value(), "rewritten.onnx");
  ASSERT_TRUE(reread.ok());
  const ImportedGraph g = reread.value()->build({});
  bool found = false;
  for (const auto& [id, values] : g.initial_values) {
    if (g.graph.tensor(id).name == "fc.bias") {
      EXPECT_EQ(values, bias);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  // Every other initializer keeps the file's values (the loader holds them outside the parsed
  // message, and the rewrite puts them back).
  const ImportedGraph before = model->build({});
  ASSERT_EQ(before.initial_values.size(), g.initial_values.size());
  for (std::size_t i = 0; i < g.initial_values.size(); ++i) {
    const std::string& name = g.graph.tensor(g.initial_values[i].first).name;
    ASSERT_EQ(name, before.graph.tensor(before.initial_values[i].first).name);
    if (name != "fc.bias") {
      EXPECT_EQ(g.initial_values[i].second, before.initial_values[i].second) << name;
    }
  }
  EXPECT_FALSE(model->with_initializers({{"no.such.tensor", bias}}).ok());
  EXPECT_FALSE(model->with_initializers({{"fc.bias", std::vector<float>(3)}}).ok());
}

// ---- the CLI -------------------------------------------------------------------------------

TEST(OnnxCli, FitPlanAndCompareTakeAnOnnxFile) {
  const std::string cnn = fixture("small_cnn.onnx");
  auto fit = testing::run_cli("fit --onnx " + cnn + " --batch 8 --device-memory 1GiB --json", false);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const auto j = nlohmann::json::parse(fit.output);
  EXPECT_EQ(j["parameter_count"].get<std::int64_t>(), 770);  // torch's count (small_cnn_golden.json)
  EXPECT_TRUE(j["fits"].get<bool>());
  auto plan = testing::run_cli("plan --onnx " + fixture("tiny_gpt.onnx") + " --batch 4 --loss cross_entropy");
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("wte.weight"), std::string::npos) << plan.output;
  auto compare = testing::run_cli("compare --onnx " + cnn + " --batch 8 --device-memory 1GiB");
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
}

TEST(OnnxCli, MaxBatchAndCheckpointingWorkOnAnImportedDecoder) {
  auto r = testing::run_cli("fit --onnx " + fixture("tiny_gpt.onnx") +
                                " --batch 64 --device cpu --device-memory 600MiB --overhead 0 --max-batch --checkpoint sqrt --json",
                            false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_GT(j["max_batch"].get<std::int64_t>(), 64);
  // Stages were found in the imported graph: sqrt checkpointing recomputes something.
  EXPECT_GT(j["checkpoint"]["recompute_ops"].get<std::int64_t>(), 0) << r.output;
  EXPECT_LT(j["checkpoint"]["arena_bytes_with"].get<std::int64_t>(), j["checkpoint"]["arena_bytes_without"].get<std::int64_t>());
}

TEST(OnnxCli, BadFilesAndFlagsExitWithUsageErrors) {
  const std::string bad = ::testing::TempDir() + "/memplan_bad.onnx";
  {
    std::ofstream out(bad, std::ios::binary);
    out << "\x0a\xff\xff not protobuf";
  }
  auto r = testing::run_cli("fit --onnx " + bad + " --device-memory 1GiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not a valid ONNX model"), std::string::npos) << r.output;
  auto both = testing::run_cli("fit --onnx " + fixture("small_cnn.onnx") + " --model mlp --device-memory 1GiB");
  EXPECT_EQ(both.exit_code, 2) << both.output;
  auto seq = testing::run_cli("fit --onnx " + fixture("tiny_gpt.onnx") + " --seq 16 --device-memory 1GiB");
  EXPECT_EQ(seq.exit_code, 2) << seq.output;
  EXPECT_NE(seq.output.find("--seq"), std::string::npos) << seq.output;
  auto output = testing::run_cli("fit --onnx " + fixture("small_cnn.onnx") + " --output nope --device-memory 1GiB");
  EXPECT_EQ(output.exit_code, 2) << output.output;
  EXPECT_NE(output.output.find("no value named 'nope'"), std::string::npos) << output.output;
  auto huge = testing::run_cli("fit --onnx " + fixture("small_cnn.onnx") + " --batch 4611686018427387904 --device-memory 1GiB");
  EXPECT_EQ(huge.exit_code, 2) << huge.output;
  EXPECT_NE(huge.output.find("--batch"), std::string::npos) << huge.output;
}

}  // namespace
}  // namespace memplan
