// The CUDA backend against the CPU: (a) no op of a step CUDA trains lacks a CUDA kernel, by the
// dispatch table's own list of gaps (runs wherever memplan was built with CUDA, GPU or not); (b) every op of the reference models' steps,
// CUDA vs CPU on fresh random inputs with a tolerance per op, and likewise every op (forward and
// backward) of every op-harness case's graph (tests/op_cases.h); (c) short training runs CPU vs
// GPU, planned mode allocating nothing during steps, and planned/naive/dynamic (expandable
// segments) giving the same bits on the GPU. (b) and (c) skip, saying why, when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <tuple>

#include "tests/test_util.h"
#include "memplan/common/rng.h"
#include "memplan/graph/autograd.h"
#include "memplan/graph/builder.h"
#include "memplan/graph/mixed_precision.h"
#include "memplan/graph/training_step.h"
#include "memplan/kernels/half.h"
#include "memplan/kernels/kernel.h"
#include "memplan/models/gpt_decode.h"
#include "memplan/models/registry.h"
#include "memplan/runtime/devices.h"
#ifdef MEMPLAN_HAVE_CUDA
#include "memplan/kernels/cuda/cublas_loader.h"
#endif
#include "cli_util.h"
#include "op_cases.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::OpKind;
using kernels::DeviceKind;

#define MEMPLAN_SKIP_WITHOUT_GPU()                                                                      \
  do {                                                                                                  \
    if (!kernels::built_with_cuda()) GTEST_SKIP() << "memplan was built without CUDA (no nvcc found)";  \
    if (!runtime::cuda_device_present()) GTEST_SKIP() << "no CUDA GPU on this machine: CUDA vs CPU checks need one"; \
  } while (0)

#ifdef MEMPLAN_HAVE_CUDA
bool process_maps_library(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(name) != std::string::npos;
}

// cuBLAS is opened when the CUDA context needs it, not linked: a CPU run never loads it (the
// dynamic loader's own log of a fresh memplan process says so), and loading it (no GPU
// needed) resolves every entry point memplan calls.
TEST(CudaKernels, CublasIsLoadedOnFirstUseWithEveryEntryPoint) {
  const auto cpu_run = testing::run_cli_with_env("LD_DEBUG=libs", "plan --model mlp --batch 2 --time-limit 0");
  ASSERT_EQ(cpu_run.exit_code, 0) << cpu_run.output;
  ASSERT_NE(cpu_run.output.find("libc.so"), std::string::npos) << "no loader log: " << cpu_run.output;
  EXPECT_EQ(cpu_run.output.find("libcublas"), std::string::npos) << "a CPU run loaded cuBLAS";

  if (!kernels::cuda::cublas_loaded()) {
    EXPECT_FALSE(process_maps_library("libcublas")) << "libcublas is mapped before anything asked for it";
  }
  const kernels::cuda::CublasApi& api = kernels::cuda::cublas_api();
  EXPECT_TRUE(kernels::cuda::cublas_loaded());
  EXPECT_TRUE(process_maps_library("libcublas"));
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.set_math_mode, nullptr);
  EXPECT_NE(api.set_workspace, nullptr);
  EXPECT_NE(api.sgemm, nullptr);
  EXPECT_NE(api.sgemm_strided_batched, nullptr);
  ASSERT_NE(api.status_string, nullptr);
  // A call that needs no GPU: the loaded library answers through the resolved pointer.
  const std::string not_initialized = api.status_string(CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_NE(not_initialized.find("not initialized"), std::string::npos) << not_initialized;
  EXPECT_NE(not_initialized, std::string(api.status_string(CUBLAS_STATUS_SUCCESS)));
}
#endif

TEST(CudaKernels, DeviceChoiceWithoutAGpuIsAnErrorNotACrash) {
  EXPECT_EQ(runtime::resolve_device_kind("cpu").value(), DeviceKind::cpu);
  EXPECT_EQ(runtime::resolve_device_kind("auto").value(),
            runtime::cuda_device_present() ? DeviceKind::cuda : DeviceKind::cpu);
  EXPECT_FALSE(runtime::resolve_device_kind("gpu").ok());
  auto made = runtime::make_device(DeviceKind::cuda);
  EXPECT_EQ(made.ok(), runtime::cuda_device_present());
  if (!made.ok()) {
    EXPECT_NE(made.error().message.find("--device cpu"), std::string::npos) << made.error().message;
  }
}

TEST(CudaKernels, TrainSaysWhichDeviceAndRefusesCudaWithoutAGpu) {
  if (runtime::cuda_device_present()) {
    const auto r = testing::run_cli("train --model mlp --steps 1 --batch 8 --device cuda --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  } else {
    const auto r = testing::run_cli("train --model mlp --steps 1 --device cuda --data /nonexistent/memplan-data");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--device cpu"), std::string::npos) << r.output;
  }
  // The choice is made and reported before the data is read (here: a path that does not exist).
  const auto automatic = testing::run_cli("train --model mlp --steps 1 --data /nonexistent/memplan-data");
  EXPECT_EQ(automatic.exit_code, 2) << automatic.output;
  EXPECT_NE(automatic.output.find(runtime::cuda_device_present() ? "training on it" : "training on the CPU"), std::string::npos)
      << automatic.output;
}

// --- the reference models' training steps (and evaluation graphs) at small sizes ---------------

models::ModelOptions small(const std::string& name, bool training) {
  models::ModelOptions o;
  o.name = name;
  o.training = training;
  o.mlp = {64, {32, 32}, 10};
  o.cnn.image = 8;
  o.cnn.widths = {4, 8};
  o.cnn.classes = 5;
  o.gpt.vocab = 11;
  o.gpt.context = 8;
  o.gpt.layers = 2;
  o.gpt.heads = 2;
  o.gpt.width = 8;
  o.gpt.dropout = 0.1f;
  return o;
}

graph::Graph training_step(const models::ModelOptions& model, std::int64_t batch, graph::OptimizerKind optimizer,
                           graph::DType dtype = graph::DType::f32) {
  graph::Graph g = models::build_forward(model, batch).value();
  if (dtype != graph::DType::f32) g = graph::with_working_dtype(g, dtype);
  graph::OptimizerConfig opt;
  opt.kind = optimizer;
  opt.lr = 1e-2f;
  opt.weight_decay = 0.01f;
  graph::make_training_step(g, opt);
  if (dtype == graph::DType::f16) graph::add_loss_scaling(g);  // as plan_step adds it
  return g;
}

graph::Graph training_step(const std::string& model, std::int64_t batch, graph::OptimizerKind optimizer,
                           graph::DType dtype = graph::DType::f32) {
  return training_step(small(model, true), batch, optimizer, dtype);
}

// 8-bit AdamW quantizes the states of parameters of 4,096 elements or more: an MLP whose first
// layer [64, 96] has 6,144 (its others keep f32 states).
graph::Graph eight_bit_adam_step(graph::DType dtype = graph::DType::f32) {
  models::ModelOptions o = small("mlp", true);
  o.mlp = {64, {96, 32}, 10};
  return training_step(o, 8, graph::OptimizerKind::adamw8bit, dtype);
}

// Ops the reference models do not use: pooling (through cuDNN on the GPU) with overlapping,
// padded windows, elementwise product, scaling, sum and mean, trained with plain SGD.
graph::Graph pooling_step() {
  graph::Graph g;
  graph::Builder b(g);
  const TensorId x = b.input("x", {2, 3, 9, 9});
  const TensorId w = b.parameter("w", {2, 3, 9, 9}, {graph::InitSpec::Kind::normal, 1.0f});
  const TensorId h = b.mul(x, w, "h");
  const TensorId p = b.max_pool2d(h, 3, 2, 1, "max");  // [2, 3, 5, 5]
  const TensorId a = b.avg_pool2d(p, 2, 1, "avg");     // [2, 3, 4, 4]
  const TensorId s = b.scale(a, 0.5f, "scaled");
  g.output = b.sum(s, "total");
  g.loss = b.mean(s, "loss");
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::sgd;
  opt.lr = 0.1f;
  graph::make_training_step(g, opt);
  return g;
}

// The gated MLP of LLaMA-style decoders: swiglu, and through its gradient silu and silu_backward.
graph::Graph gated_mlp_step() {
  graph::Graph g;
  graph::Builder b(g);
  const TensorId x = b.input("x", {6, 8});
  const TensorId gate_w = b.parameter("gate_w", {12, 8}, {graph::InitSpec::Kind::normal, 0.5f});
  const TensorId up_w = b.parameter("up_w", {12, 8}, {graph::InitSpec::Kind::normal, 0.5f});
  const TensorId gate = b.matmul(x, gate_w, false, true, "gate");
  const TensorId up = b.matmul(x, up_w, false, true, "up");
  const TensorId h = b.swiglu(gate, up, "act");
  g.output = b.sum(h, "total");
  g.loss = b.mean(h, "loss");
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::adamw;
  opt.lr = 0.01f;
  graph::make_training_step(g, opt);
  return g;
}

// The ops of imported mobile nets: depthwise and grouped convolution, clip (ReLU6), sigmoid, tanh.
graph::Graph mobile_step() {
  graph::Graph g;
  graph::Builder b(g);
  const TensorId x = b.input("x", {2, 4, 7, 7});
  const TensorId dw = b.parameter("dw", {4, 1, 3, 3}, {graph::InitSpec::Kind::normal, 0.5f});
  const TensorId gw = b.parameter("gw", {6, 2, 3, 3}, {graph::InitSpec::Kind::normal, 0.5f});
  const TensorId d = b.clip(b.grouped_conv2d(x, dw, 1, 1, 4, "depthwise"), 0.0f, 6.0f, "relu6");
  const TensorId c = b.grouped_conv2d(d, gw, 2, 1, 2, "grouped");  // [2, 6, 4, 4]
  const TensorId s = b.mul(b.sigmoid(c, "gate"), b.tanh(c, "squash"), "gated");
  g.output = b.sum(s, "total");
  g.loss = b.mean(s, "loss");
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::sgd;
  opt.lr = 0.1f;
  graph::make_training_step(g, opt);
  return g;
}

// Dilated convolutions: im2col/col2im with taps D apart (and a stride), and the direct grouped
// kernel at a dilation, forward and backward; and a squeeze-and-excitation channel_scale.
graph::Graph dilated_step() {
  graph::Graph g;
  graph::Builder b(g);
  const TensorId x = b.input("x", {2, 3, 9, 9});
  const TensorId xw = b.parameter("xw", {2, 3, 9, 9}, {graph::InitSpec::Kind::normal, 1.0f});
  const TensorId w = b.parameter("w", {4, 3, 3, 3}, {graph::InitSpec::Kind::normal, 0.5f});
  const TensorId dw = b.parameter("dw", {4, 1, 3, 3}, {graph::InitSpec::Kind::normal, 0.5f});
  const TensorId sw = b.parameter("sw", {6, 2, 3, 3}, {graph::InitSpec::Kind::normal, 0.5f});
  const TensorId a = b.conv2d(b.mul(x, xw, "xin"), w, 1, 2, "atrous", 2);        // [2, 4, 9, 9]
  const TensorId d = b.grouped_conv2d(a, dw, 1, 2, 4, "depthwise", 2);          // [2, 4, 9, 9]
  const TensorId strided = b.grouped_conv2d(d, sw, 2, 3, 2, "strided", 3);      // [2, 6, 5, 5]
  // a squeeze-and-excitation gate on it: [2, 6, 5, 5] * [2, 6]
  const TensorId c = b.channel_scale(strided, b.sigmoid(b.global_avg_pool(strided, "squeeze"), "excite"), "se");
  const TensorId e = b.conv2d(c, b.parameter("ew", {2, 6, 2, 2}, {graph::InitSpec::Kind::normal, 0.5f}), 2, 1, "wide", 3);
  g.output = b.sum(e, "total");
  g.loss = b.mean(e, "loss");
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::sgd;
  opt.lr = 0.1f;
  graph::make_training_step(g, opt);
  return g;
}

// Fused attention at the head sizes the GPU runs tiled (16, 32, 64), over more rows than one
// block (128) and tile (32) hold, with and without the causal mask and dropout, and with grouped
// K/V heads.
graph::Graph attention_step(std::int64_t heads, std::int64_t kv_heads, std::int64_t t, std::int64_t d, bool causal,
                            float dropout) {
  graph::Graph g;
  graph::Builder b(g);
  const graph::InitSpec init{graph::InitSpec::Kind::normal, 1.0f};
  const TensorId q = b.parameter("q", {2, heads, t, d}, init);
  const TensorId k = b.parameter("k", {2, kv_heads, t, d}, init);
  const TensorId v = b.parameter("v", {2, kv_heads, t, d}, init);
  const TensorId y = b.attention(q, k, v, causal, 1.0f / std::sqrt(float(d)), dropout, "attn");
  const TensorId e = b.mul(y, b.parameter("w", {2, heads, t, d}, init), "weighted");
  g.output = b.sum(e, "total");
  g.loss = b.mean(e, "loss");
  graph::OptimizerConfig opt;
  opt.kind = graph::OptimizerKind::sgd;
  opt.lr = 0.1f;
  graph::make_training_step(g, opt);
  return g;
}

std::vector<graph::Graph> reference_graphs() {
  std::vector<graph::Graph> graphs;
  graphs.push_back(training_step("mlp", 16, graph::OptimizerKind::adamw));
  graphs.push_back(training_step("mlp", 8, graph::OptimizerKind::sgd));
  graphs.push_back(training_step("cnn", 4, graph::OptimizerKind::momentum));
  graphs.push_back(training_step("gpt", 2, graph::OptimizerKind::adamw));
  graphs.push_back(models::build_forward(small("cnn", false), 3).value());
  graphs.push_back(pooling_step());
  graphs.push_back(mobile_step());
  graphs.push_back(gated_mlp_step());
  graphs.push_back(dilated_step());
  graphs.push_back(attention_step(2, 1, 150, 64, true, 0.1f));
  graphs.push_back(attention_step(3, 3, 40, 32, false, 0.0f));
  graphs.push_back(attention_step(4, 2, 129, 16, true, 0.0f));
  return graphs;
}

std::vector<std::string> op_names(const std::vector<OpKind>& kinds) {
  std::vector<std::string> names;
  for (OpKind k : kinds) names.emplace_back(graph::op_name(k));
  return names;
}

// The ops the CUDA backend lacks, as the dispatch table says (kernels::missing_kernels): no op
// of a step `memplan train` or `generate --device cuda` runs may be among them (the reference
// models, the graphs above exercising the rest, the GPT's decode step; what the CPU lacks is kernel_dispatch_test's). The list is
// printed, so a gap is visible rather than silent.
TEST(CudaKernels, NoOpOfATrainableStepLacksACudaKernel) {
  if (!kernels::built_with_cuda()) GTEST_SKIP() << "memplan was built without CUDA (no nvcc found)";
  const std::vector<OpKind> missing = kernels::missing_kernels(DeviceKind::cuda);
  std::printf("ops without a CUDA kernel: %s\n", ::testing::PrintToString(op_names(missing)).c_str());
  const std::set<OpKind> lacking(missing.begin(), missing.end());
  int kinds_seen = 0;
  std::set<OpKind> seen;
  // The GPT's decode step too: `memplan generate --device cuda` runs it.
  std::vector<graph::Graph> graphs = reference_graphs();
  models::GptConfig gpt;
  gpt.context = 12;
  graphs.push_back(models::build_gpt_decode(gpt, models::DecodeShape{2, 4, 5}));
  for (const graph::Graph& g : graphs) {
    for (const graph::Op& op : g.ops()) {
      EXPECT_FALSE(lacking.count(op.kind)) << "op '" << op.name << "' (" << graph::op_name(op.kind)
                                           << ") of a CUDA-trainable step has no CUDA kernel";
      kinds_seen += seen.insert(op.kind).second ? 1 : 0;
    }
  }
  EXPECT_GE(kinds_seen, 40);
}


// Relative tolerance of each op, against max(1, max |CPU value|): GEMMs and long reductions sum
// in another order on the GPU; elementwise ops differ only by libm/FMA rounding.
double tolerance(OpKind kind) {
  switch (kind) {
    case OpKind::matmul:
    case OpKind::batched_matmul:
    case OpKind::conv2d:
    case OpKind::conv2d_backward_cols:
    case OpKind::conv2d_backward_weight:
    case OpKind::grouped_conv2d:
    case OpKind::grouped_conv2d_backward_input:
    case OpKind::grouped_conv2d_backward_weight:
    case OpKind::sum:
    case OpKind::mean:
    case OpKind::reduce_rows:
    case OpKind::channel_sum:
    case OpKind::channel_scale_backward:
    case OpKind::batch_norm_dgamma:
    case OpKind::layer_norm_dgamma:
    case OpKind::embedding_backward:
    case OpKind::attention_lse:  // sums over keys, in tiles on the CPU and one by one on the GPU
    case OpKind::attention:
    case OpKind::attention_backward_dot:
    case OpKind::attention_backward:
      return 1e-4;
    default:
      return 2e-5;
  }
}

// Ops whose f32 operands must be non-negative (variances, Adam's second moment).
bool wants_non_negative(OpKind kind) {
  return kind == OpKind::batch_norm || kind == OpKind::batch_norm_inference || kind == OpKind::batch_norm_backward ||
         kind == OpKind::batch_norm_dgamma || kind == OpKind::running_stats_update || kind == OpKind::adamw_update ||
         kind == OpKind::adamw8bit_update || kind == OpKind::adamw8bit_update_mixed;
}

// The exclusive upper bound of an op's i32 operand (token ids, class labels).
std::int64_t id_bound(const graph::Graph& g, const graph::Op& op) {
  auto shape = [&](TensorId t) { return g.tensor(t).shape; };
  switch (op.kind) {
    case OpKind::embedding: return shape(op.inputs[1])[0];
    case OpKind::embedding_backward: return shape(op.outputs[0])[0];
    case OpKind::softmax_cross_entropy: return shape(op.inputs[0])[1];
    case OpKind::softmax_cross_entropy_backward: return shape(op.inputs[1])[1];
    default: return 2;
  }
}

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    MEMPLAN_SKIP_WITHOUT_GPU();
    device_ = runtime::make_device(DeviceKind::cuda).value();
    workspace_ = device_->allocate(bytes()).value();
    device_->attach_workspace(workspace_, bytes());
  }
  void TearDown() override {
    if (device_ == nullptr) return;
    device_->attach_workspace(nullptr, 0);
    device_->deallocate(workspace_, bytes());
  }
  // The device's scratch and room for the f32 copies of the widened 16-bit ops the tests run.
  Bytes bytes() const { return device_->workspace_bytes() + (Bytes{64} << 20); }
  std::span<std::byte> workspace() const { return {static_cast<std::byte*>(workspace_), static_cast<std::size_t>(bytes())}; }
  std::unique_ptr<runtime::Device> device_;
  void* workspace_ = nullptr;
};

struct HostTensor {
  std::vector<std::byte> bytes;
  const graph::Shape* shape;
  graph::DType dtype;
};

// Runs `op` on the CPU and on the GPU from the same random operands; returns the worst error
// relative to the tolerance's scale, and fails with the op's name if it exceeds its tolerance.
void compare_op(runtime::Device& gpu, std::span<std::byte> workspace, const graph::Graph& g, const graph::Op& op,
                std::uint64_t seed) {
  Rng rng(seed);
  const bool non_negative = wants_non_negative(op.kind);
  auto fresh = [&](TensorId id, bool random) {
    const graph::TensorDesc& d = g.tensor(id);
    HostTensor t{std::vector<std::byte>(static_cast<std::size_t>(d.size_bytes())), &d.shape, d.dtype};
    if (!random) return t;
    if (d.dtype == graph::DType::i32) {
      auto* p = reinterpret_cast<std::int32_t*>(t.bytes.data());
      for (std::int64_t i = 0; i < d.shape.numel(); ++i) p[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(id_bound(g, op))));
    } else if (d.dtype == graph::DType::u8) {  // quantized codes: every byte value
      for (std::byte& b : t.bytes) b = static_cast<std::byte>(rng.below(256));
    } else {
      std::vector<float> v(static_cast<std::size_t>(d.shape.numel()));
      for (float& x : v) x = non_negative ? std::fabs(rng.normal()) : rng.normal();
      kernels::narrow_from_f32(d.dtype, v.data(), t.bytes.data(), d.shape.numel());  // f32: a copy
    }
    return t;
  };
  std::vector<HostTensor> cpu;  // inputs, outputs, updates in the kernel's order
  for (TensorId id : op.inputs) cpu.push_back(fresh(id, true));
  for (TensorId id : op.outputs) cpu.push_back(fresh(id, false));
  for (TensorId id : op.updates) cpu.push_back(fresh(id, true));
  // Fused attention takes the rows' log-sum-exp of its scores as an input: a random one would
  // make exp(score - lse) overflow (both kernels assume probabilities <= 1), so it is the true
  // one, computed from the random q and k by the CPU's attention_lse.
  if (op.kind == OpKind::attention || op.kind == OpKind::attention_backward) {
    const std::size_t q = op.kind == OpKind::attention ? 0 : 1;  // attention_backward: dy, q, k, v, lse, delta
    const std::size_t lse = q + 3;  // after q, k and v
    const std::vector<kernels::TensorRef> qk = {{cpu[q].bytes.data(), cpu[q].shape, cpu[q].dtype},
                                                {cpu[q + 1].bytes.data(), cpu[q + 1].shape, cpu[q + 1].dtype}};
    const std::vector<kernels::TensorRef> out = {{cpu[lse].bytes.data(), cpu[lse].shape, cpu[lse].dtype}};
    kernels::find_kernel(OpKind::attention_lse, DeviceKind::cpu)(kernels::KernelCall{OpKind::attention_lse, &op.attrs, qk, out, {}, 3});
  }

  std::vector<void*> device_ptrs;
  std::vector<kernels::TensorRef> cpu_refs, gpu_refs;
  for (HostTensor& t : cpu) {
    const auto size = static_cast<Bytes>(t.bytes.size());
    void* p = gpu.allocate(size).value();
    gpu.copy_from_host(p, t.bytes.data(), size);
    device_ptrs.push_back(p);
    cpu_refs.push_back({t.bytes.data(), t.shape, t.dtype});
    gpu_refs.push_back({p, t.shape, t.dtype});
  }
  // 16-bit ops: each device computes the widened ones in f32 copies made in its workspace, and
  // ops with scratch of their own keep it there: the kernels get what follows the device's own
  // scratch (as the executor's kernel_workspace), which the fixture's workspace covers.
  const graph::DType dtype = graph::op_dtype(g, op);
  std::vector<std::byte> cpu_workspace(
      static_cast<std::size_t>(graph::op_widening(g, op).bytes + graph::op_scratch_bytes(g, op)));
  auto call_of = [&](const std::vector<kernels::TensorRef>& refs, std::span<std::byte> scratch) {
    const std::span<const kernels::TensorRef> all(refs);
    kernels::KernelCall call{op.kind, &op.attrs, all.subspan(0, op.inputs.size()),
                             all.subspan(op.inputs.size(), op.outputs.size()),
                             all.subspan(op.inputs.size() + op.outputs.size()), 3};
    call.workspace = scratch;
    return call;
  };
  kernels::find_kernel(op.kind, DeviceKind::cpu, dtype)(call_of(cpu_refs, cpu_workspace));
  kernels::find_kernel(op.kind, DeviceKind::cuda, dtype)(
      call_of(gpu_refs, workspace.subspan(static_cast<std::size_t>(gpu.workspace_bytes()))));
  gpu.synchronize();

  // A 16-bit result may round to a neighbouring value where the devices' f32 results differ in
  // their last bits: two of its epsilons more.
  const double tol = tolerance(op.kind) + (dtype == graph::DType::bf16 ? 2.0 / 256 : dtype == graph::DType::f16 ? 2.0 / 2048 : 0.0);
  for (std::size_t i = op.inputs.size(); i < cpu.size(); ++i) {
    const HostTensor& want = cpu[i];
    std::vector<std::byte> got(want.bytes.size());
    gpu.copy_to_host(got.data(), device_ptrs[i], static_cast<Bytes>(got.size()));
    if (!graph::is_floating(want.dtype)) {
      EXPECT_EQ(got, want.bytes) << op.name;
      continue;
    }
    const std::int64_t n = want.shape->numel();
    std::vector<float> wf(static_cast<std::size_t>(n)), of(static_cast<std::size_t>(n));
    kernels::widen_to_f32(want.dtype, want.bytes.data(), wf.data(), n);
    kernels::widen_to_f32(want.dtype, got.data(), of.data(), n);
    const float* w = wf.data();
    const float* o = of.data();
    double scale = 1.0, worst = 0.0;
    std::int64_t worst_at = 0;
    for (std::int64_t k = 0; k < n; ++k) scale = std::max(scale, double(std::fabs(w[k])));
    for (std::int64_t k = 0; k < n; ++k) {
      const double err = std::isnan(o[k]) != std::isnan(w[k]) ? INFINITY : std::fabs(double(o[k]) - double(w[k]));
      if (err > worst) worst = err, worst_at = k;
    }
    EXPECT_LE(worst / scale, tol) << graph::op_name(op.kind) << " '" << op.name << "' operand " << i << ": element "
                                  << worst_at << " cpu " << w[worst_at] << " cuda " << o[worst_at];
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) gpu.deallocate(device_ptrs[i], static_cast<Bytes>(cpu[i].bytes.size()));
}

// The graphs the GPU comparison runs must reach the tiled attention kernels at every head size
// they serve (16, 32, 64) and the per-row ones at another (the small GPT's 4), forward and
// backward; checked wherever the tests run, so a changed graph cannot drop a case unseen.
TEST(CudaKernels, ComparisonGraphsReachEveryAttentionHeadSize) {
  std::set<std::int64_t> forward, backward;
  for (const graph::Graph& g : reference_graphs()) {
    for (const graph::Op& op : g.ops()) {
      if (op.kind == OpKind::attention) forward.insert(g.tensor(op.inputs[0]).shape[3]);
      if (op.kind == OpKind::attention_backward) backward.insert(g.tensor(op.inputs[1]).shape[3]);
    }
  }
  EXPECT_EQ(forward, (std::set<std::int64_t>{4, 16, 32, 64}));
  EXPECT_EQ(backward, (std::set<std::int64_t>{4, 16, 32, 64}));
}

TEST_F(CudaVsCpu, EveryOpOfTheReferenceModelsMatchesTheCpuWithinItsTolerance) {
  std::set<OpKind> tested;
  std::uint64_t seed = 1;
  for (const graph::Graph& g : reference_graphs()) {
    for (const graph::Op& op : g.ops()) {
      if (graph::op_info(op.kind).output_is_view) continue;  // no kernel work
      compare_op(*device_, workspace(), g, op, seed++);
      tested.insert(op.kind);
    }
  }
  std::vector<std::string> untested;
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (kernels::find_kernel(kind, DeviceKind::cpu) != nullptr && !graph::op_info(kind).output_is_view && !tested.count(kind)) {
      untested.emplace_back(graph::op_name(kind));
    }
  }
  // Kinds no reference model uses are listed, so a gap is visible rather than silent.
  if (!untested.empty()) std::printf("CUDA vs CPU: op kinds no reference model exercises: %s\n", ::testing::PrintToString(untested).c_str());
  EXPECT_GE(tested.size(), 40u);
}

// The reference models' steps at bf16 and f16 (fp16 with its overflow check).
std::vector<graph::Graph> sixteen_bit_reference_steps(graph::DType dtype) {
  return {training_step("mlp", 16, graph::OptimizerKind::adamw, dtype), training_step("mlp", 8, graph::OptimizerKind::sgd, dtype),
          training_step("cnn", 4, graph::OptimizerKind::momentum, dtype), training_step("gpt", 2, graph::OptimizerKind::adamw, dtype),
          eight_bit_adam_step(dtype)};
}

// 8-bit AdamW's updates at f32, CUDA against the CPU: parameters within the update's tolerance,
// the absmax likewise, the u8 codes equal.
TEST_F(CudaVsCpu, EightBitAdamUpdatesMatchTheCpu) {
  const graph::Graph g = eight_bit_adam_step();
  int compared = 0;
  std::uint64_t seed = 900;
  for (const graph::Op& op : g.ops()) {
    if (op.kind != OpKind::adamw8bit_update) continue;
    compare_op(*device_, workspace(), g, op, seed++);
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

// Every op of those steps, the natively 16-bit ones and the widened ones, against the CPU's.
TEST_F(CudaVsCpu, EveryOpOfTheReferenceModelsAt16BitsMatchesTheCpuWithinItsTolerance) {
  std::uint64_t seed = 500;
  int compared = 0;
  for (graph::DType dtype : {graph::DType::bf16, graph::DType::f16}) {
    SCOPED_TRACE(std::string(graph::dtype_name(dtype)));
    for (const graph::Graph& g : sixteen_bit_reference_steps(dtype)) {
      for (const graph::Op& op : g.ops()) {
        if (graph::op_info(op.kind).output_is_view) continue;
        compare_op(*device_, workspace(), g, op, seed++);
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 100);
}

// --- the op harness's cases (tests/op_cases.h) ----------------------------------------------------

// Each case's graph at each of its shapes, f32: forward, and backward where the op has a gradient rule.
// At bf16 and f16 (`sixteen_bits`): each case whose row accepts the dtype, at every shape (the
// attention cases reach the tiled kernels at 16, 32 and 64 channels and the per-row ones at others).
std::vector<std::pair<std::string, graph::Graph>> case_graphs(bool sixteen_bits = false) {
  std::vector<std::pair<std::string, graph::Graph>> graphs;
  const std::vector<graph::DType> dtypes =
      sixteen_bits ? std::vector<graph::DType>{graph::DType::bf16, graph::DType::f16} : std::vector<graph::DType>{graph::DType::f32};
  for (graph::DType dtype : dtypes) {
    for (const testing::OpCase& c : testing::op_cases()) {
      if (sixteen_bits && !graph::op_info(c.kind).accepts.contains(dtype)) continue;
      for (const testing::Dims& dims : c.dim_sets) {
        graph::Graph g;
        testing::build_case_graph(c, dims, dtype, graph::has_gradient_rule(c.kind), g);
        std::string name = std::string(c.name) + " " + ::testing::PrintToString(dims);
        if (sixteen_bits) name += " " + std::string(graph::dtype_name(dtype));
        graphs.emplace_back(std::move(name), std::move(g));
      }
    }
  }
  return graphs;
}

// The ops of the cases' graphs that have no CUDA kernel (the LLaMA-style ops, the mixtures of
// experts' and T5's relative attention bias, which CUDA training does not reach yet; the
// collectives and the vocabulary-parallel loss of tensor parallelism, which trains on CPU ranks):
// one explicit list, so the gap is visible and a new op of a case without a CUDA kernel fails here
// until it has one or is listed (runs wherever memplan was built with CUDA).
const std::set<std::string> kCaseOpsWithoutACudaKernel = {
    "all_gather", "all_reduce", "all_to_all", "concat", "moe_combine", "moe_combine_backward_gates", "moe_dispatch", "moe_router_stats",
    "moe_router_stats_backward", "moe_top_k", "moe_top_k_backward", "relative_position_bias",
    "relative_position_bias_backward", "repeat_heads", "repeat_heads_backward",
    "reduce_scatter", "rms_norm", "rms_norm_backward", "rms_norm_dgamma", "rotary", "vocab_parallel_cross_entropy_backward",
    "vocab_parallel_loss", "vocab_parallel_stats"};

TEST(CudaKernels, TheOpHarnessCasesOpsWithoutACudaKernelAreTheListedOnes) {
  if (!kernels::built_with_cuda()) GTEST_SKIP() << "memplan was built without CUDA (no nvcc found)";
  std::set<std::string> lacking;
  for (const auto& [name, g] : case_graphs()) {
    for (const graph::Op& op : g.ops()) {
      if (kernels::find_kernel(op.kind, DeviceKind::cuda) == nullptr) lacking.emplace(graph::op_name(op.kind));
    }
  }
  EXPECT_EQ(lacking, kCaseOpsWithoutACudaKernel);
}

// Every op of every case's graph, forward and backward, CUDA vs CPU on fresh random operands.
TEST_F(CudaVsCpu, EveryOpOfEveryOpHarnessCaseMatchesTheCpuWithinItsTolerance) {
  std::set<OpKind> tested;
  std::uint64_t seed = 1000;
  for (const auto& [name, g] : case_graphs()) {
    SCOPED_TRACE("case " + name);
    for (const graph::Op& op : g.ops()) {
      if (graph::op_info(op.kind).output_is_view) continue;  // no kernel work
      if (kernels::find_kernel(op.kind, DeviceKind::cuda) == nullptr) {
        EXPECT_TRUE(kCaseOpsWithoutACudaKernel.count(std::string(graph::op_name(op.kind))))
            << "op '" << op.name << "' (" << graph::op_name(op.kind) << ") has no CUDA kernel";
        continue;
      }
      compare_op(*device_, workspace(), g, op, seed++);
      tested.insert(op.kind);
    }
  }
  for (const testing::OpCase& c : testing::op_cases()) {
    if (graph::op_info(c.kind).output_is_view || kCaseOpsWithoutACudaKernel.count(std::string(graph::op_name(c.kind)))) continue;
    EXPECT_TRUE(tested.count(c.kind)) << "case " << c.name << ": its op was never compared";
  }
}

// Every kernel CUDA runs at 16 bits natively (kernels::native_16bit_ops) is reached by the GPU
// comparisons at 16 bits: the op-harness cases or the reference steps (runs wherever memplan was
// built with CUDA, so a new native kernel without a comparison fails here, GPU or not).
TEST(CudaKernels, EveryNative16BitKernelIsComparedWithTheCpuOnAGpu) {
  if (!kernels::built_with_cuda()) GTEST_SKIP() << "memplan was built without CUDA (no nvcc found)";
  std::set<OpKind> reached;
  for (const auto& [name, g] : case_graphs(/*sixteen_bits=*/true)) {
    for (const graph::Op& op : g.ops()) {
      if (graph::is_16bit_float(graph::op_dtype(g, op))) reached.insert(op.kind);
    }
  }
  for (graph::DType dtype : {graph::DType::bf16, graph::DType::f16}) {
    for (const graph::Graph& g : sixteen_bit_reference_steps(dtype)) {
      for (const graph::Op& op : g.ops()) reached.insert(op.kind);
    }
  }
  std::vector<std::string> unreached;
  for (OpKind kind : kernels::native_16bit_ops(DeviceKind::cuda)) {
    if (!reached.count(kind)) unreached.emplace_back(graph::op_name(kind));
  }
  EXPECT_TRUE(unreached.empty()) << "native 16-bit CUDA kernels no GPU comparison reaches: " << ::testing::PrintToString(unreached);
}

// Every op of every case's graph at bf16 and f16, CUDA vs CPU: the native 16-bit kernels against
// the CPU's widened ones, within the op's tolerance plus two epsilons of the dtype.
TEST_F(CudaVsCpu, EveryOpOfEveryOpHarnessCaseAt16BitsMatchesTheCpuWithinItsTolerance) {
  std::uint64_t seed = 5000;
  int compared = 0;
  for (const auto& [name, g] : case_graphs(/*sixteen_bits=*/true)) {
    SCOPED_TRACE("case " + name);
    for (const graph::Op& op : g.ops()) {
      if (graph::op_info(op.kind).output_is_view) continue;
      const graph::DType dtype = graph::op_dtype(g, op);
      if (kernels::find_kernel(op.kind, DeviceKind::cuda, dtype) == nullptr ||
          kernels::find_kernel(op.kind, DeviceKind::cpu, dtype) == nullptr) {
        continue;  // the f32 harness test lists the ops CUDA lacks
      }
      compare_op(*device_, workspace(), g, op, seed++);
      ++compared;
    }
  }
  EXPECT_GE(compared, 100);
}

// --- whole training steps -------------------------------------------------------------------------

struct RunResult {
  std::vector<float> losses;
  std::vector<float> params;
  std::int64_t allocations_during_steps = 0;
};

RunResult run(const graph::Graph& g, runtime::Device& device, runtime::ExecutorOptions options, int steps) {
  runtime::Executor exec(g, testing::plan_for(g, device), device, options);
  EXPECT_TRUE(exec.setup().ok());
  exec.initialize_persistent(7);
  Rng rng(11);
  const graph::TensorDesc& x = g.tensor(g.find("x"));
  const auto classes = static_cast<std::uint64_t>(g.tensor(g.output).shape[1]);
  std::vector<float> xf(static_cast<std::size_t>(x.shape.numel()));
  std::vector<std::int32_t> xi(xf.size());
  std::vector<std::int32_t> y(static_cast<std::size_t>(g.tensor(g.find("labels")).shape.numel()));
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    for (float& v : xf) v = rng.uniform(-1.0f, 1.0f);
    for (auto& v : xi) v = static_cast<std::int32_t>(rng.below(classes));
    for (auto& v : y) v = static_cast<std::int32_t>(rng.below(classes));
    if (graph::is_16bit_float(x.dtype)) {
      exec.set_input_values(g.find("x"), xf);
    } else {
      exec.set_input(g.find("x"), x.dtype == graph::DType::i32 ? static_cast<const void*>(xi.data()) : xf.data(), x.size_bytes());
    }
    exec.set_input(g.find("labels"), y.data(), static_cast<Bytes>(y.size() * 4));
    EXPECT_TRUE(exec.run_step().ok());
    r.losses.push_back(exec.read_scalar(g.loss));
  }
  for (TensorId p : g.parameters()) {
    const auto v = testing::read_floats(exec, p);
    r.params.insert(r.params.end(), v.begin(), v.end());
  }
  r.allocations_during_steps = exec.device_allocations_during_steps();
  return r;
}

class CudaTraining : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaTraining, FiveStepsMatchTheCpuAndPlannedModeAllocatesNothing) {
  MEMPLAN_SKIP_WITHOUT_GPU();
  const std::string model = GetParam();
  const graph::Graph g = training_step(model, 4, graph::OptimizerKind::adamw);
  runtime::CpuDevice cpu;
  auto gpu = runtime::make_device(DeviceKind::cuda).value();
  const RunResult want = run(g, cpu, {}, 5);
  const auto* vm = dynamic_cast<const runtime::DeviceMemoryQuery*>(gpu.get());
  ASSERT_NE(vm, nullptr);
  const RunResult got = run(g, *gpu, {}, 5);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-3 * std::max(1.0f, std::fabs(want.losses[s]))) << model << " step " << s + 1;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < want.params.size(); ++i) worst = std::max(worst, double(std::fabs(got.params[i] - want.params[i])));
  EXPECT_LT(worst, 1e-3) << model << ": parameters after 5 AdamW steps";
  EXPECT_EQ(got.allocations_during_steps, 0);
}

TEST_P(CudaTraining, PlannedNaiveAndDynamicGiveTheSameBitsOnTheGpu) {
  MEMPLAN_SKIP_WITHOUT_GPU();
  const graph::Graph g = training_step(GetParam(), 4, graph::OptimizerKind::adamw);
  auto gpu = runtime::make_device(DeviceKind::cuda).value();
  runtime::ExecutorOptions naive, dynamic;
  naive.mode = runtime::ExecutionMode::naive;
  dynamic.mode = runtime::ExecutionMode::dynamic;
  dynamic.allocator.expandable_segments = true;
  const RunResult planned = run(g, *gpu, {}, 3);
  const RunResult a = run(g, *gpu, naive, 3);
  const RunResult b = run(g, *gpu, dynamic, 3);
  EXPECT_EQ(planned.losses, a.losses);
  EXPECT_EQ(planned.params, a.params);
  EXPECT_EQ(planned.losses, b.losses);
  EXPECT_EQ(planned.params, b.params);
  EXPECT_EQ(planned.allocations_during_steps, 0);
  EXPECT_GT(a.allocations_during_steps, 0) << "naive mode must allocate per step, or the counter is fake";
}

INSTANTIATE_TEST_SUITE_P(ReferenceModels, CudaTraining, ::testing::Values("mlp", "cnn", "gpt"));

// Mixed precision on the GPU: five bf16 and fp16 AdamW steps against the CPU's (the same plan
// semantics, 16-bit storage on both), within the 16-bit tolerance the steps accumulate; planned,
// naive and dynamic execution give the same bits, and planned mode allocates nothing.
class CudaMixedTraining : public ::testing::TestWithParam<std::tuple<const char*, graph::DType>> {};

TEST_P(CudaMixedTraining, FiveStepsMatchTheCpuAndEveryModeGivesTheSameBits) {
  MEMPLAN_SKIP_WITHOUT_GPU();
  const auto [model, dtype] = GetParam();
  const graph::Graph g = training_step(model, 4, graph::OptimizerKind::adamw, dtype);
  runtime::CpuDevice cpu;
  auto gpu = runtime::make_device(DeviceKind::cuda).value();
  const RunResult want = run(g, cpu, {}, 5);
  const RunResult got = run(g, *gpu, {}, 5);
  const double eps = dtype == graph::DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 8 * eps * std::max(1.0f, std::fabs(want.losses[s]))) << model << " step " << s + 1;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < want.params.size(); ++i) worst = std::max(worst, double(std::fabs(got.params[i] - want.params[i])));
  EXPECT_LT(worst, 8 * eps) << model << ": parameters after 5 AdamW steps";
  EXPECT_EQ(got.allocations_during_steps, 0);

  runtime::ExecutorOptions naive, dynamic;
  naive.mode = runtime::ExecutionMode::naive;
  dynamic.mode = runtime::ExecutionMode::dynamic;
  const RunResult a = run(g, *gpu, naive, 5);
  const RunResult b = run(g, *gpu, dynamic, 5);
  EXPECT_EQ(got.losses, a.losses);
  EXPECT_EQ(got.params, a.params);
  EXPECT_EQ(got.losses, b.losses);
  EXPECT_EQ(got.params, b.params);
}

INSTANTIATE_TEST_SUITE_P(ReferenceModels, CudaMixedTraining,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "gpt"),
                                            ::testing::Values(graph::DType::bf16, graph::DType::f16)),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param)) + "_" + std::string(graph::dtype_name(std::get<1>(p.param)));
                         });

}  // namespace
}  // namespace memplan
