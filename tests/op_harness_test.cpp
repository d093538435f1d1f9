// The op harness, driven by the case table (tests/op_cases.h): every case at every dtype its op's
// row accepts and the CPU has a kernel for; the backward of every op with a gradient rule
// against central finite differences; the CPU kernel's forward result against the op's
// double-precision reference; and every OpKind exercised by some case's graph (forward or
// backward) or exempted by name, with the test that covers it instead.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "memplan/graph/autograd.h"
#include "memplan/kernels/kernel.h"
#include "op_cases.h"
#include "test_util.h"

namespace memplan {
namespace {

using graph::DType;
using graph::OpKind;
using testing::OpCase;
using testing::op_cases;

// --- values at a tensor's dtype ---------------------------------------------------------------

std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
}
float from_bf16(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// `values` as the bytes of a tensor of `dtype`.
std::vector<std::byte> encode(const std::vector<float>& values, DType dtype) {
  std::vector<std::byte> bytes(values.size() * static_cast<std::size_t>(graph::dtype_size(dtype)));
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::f32: std::memcpy(&bytes[i * 4], &values[i], 4); break;
      case DType::f16: {
        const _Float16 h = static_cast<_Float16>(values[i]);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      case DType::bf16: {
        const std::uint16_t h = to_bf16(values[i]);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      case DType::i32: {
        const auto v = static_cast<std::int32_t>(values[i]);
        std::memcpy(&bytes[i * 4], &v, 4);
        break;
      }
      case DType::u8: {  // any value to a byte: quantized codes spread over 0..255
        const auto v = static_cast<std::uint8_t>(static_cast<std::int64_t>(std::floor(values[i] * 1000.0)) & 0xFF);
        std::memcpy(&bytes[i], &v, 1);
        break;
      }
      case DType::i64: {
        const auto v = static_cast<std::int64_t>(values[i]);
        std::memcpy(&bytes[i * 8], &v, 8);
        break;
      }
    }
  }
  return bytes;
}

std::vector<double> read_values(const runtime::Executor& e, TensorId id) {
  const graph::TensorDesc& d = e.graph().tensor(id);
  std::vector<std::byte> bytes(static_cast<std::size_t>(d.size_bytes()));
  e.read_tensor(id, bytes.data());
  std::vector<double> v(static_cast<std::size_t>(d.shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (d.dtype) {
      case DType::f32: { float f; std::memcpy(&f, &bytes[i * 4], 4); v[i] = f; break; }
      case DType::f16: { _Float16 h; std::memcpy(&h, &bytes[i * 2], 2); v[i] = static_cast<double>(h); break; }
      case DType::bf16: { std::uint16_t h; std::memcpy(&h, &bytes[i * 2], 2); v[i] = from_bf16(h); break; }
      case DType::i32: { std::int32_t x; std::memcpy(&x, &bytes[i * 4], 4); v[i] = x; break; }
      case DType::u8: { std::uint8_t x; std::memcpy(&x, &bytes[i], 1); v[i] = x; break; }
      case DType::i64: { std::int64_t x; std::memcpy(&x, &bytes[i * 8], 8); v[i] = static_cast<double>(x); break; }
    }
  }
  return v;
}

void write_values(runtime::Executor& e, TensorId id, const std::vector<float>& values) {
  e.write_tensor(id, encode(values, e.graph().tensor(id).dtype).data());
}

// The machine epsilon of a floating dtype: tolerances widen with it.
double epsilon(DType dtype) { return dtype == DType::f16 ? 9.8e-4 : dtype == DType::bf16 ? 7.8e-3 : 1.2e-7; }

// --- which (case, dtype) pairs run --------------------------------------------------------------

bool runs_at(const OpCase& c, DType dtype) {
  return graph::op_info(c.kind).accepts.contains(dtype) && kernels::find_kernel(c.kind, kernels::DeviceKind::cpu, dtype) != nullptr;
}

struct Param {
  std::size_t case_index;
  std::size_t dims_index;
  DType dtype;
};

// How gtest names a failing instance: the case, its shape and dtype.
void PrintTo(const Param& p, std::ostream* os) {
  const OpCase& c = op_cases()[p.case_index];
  *os << c.name << " " << ::testing::PrintToString(c.dim_sets[p.dims_index]) << " " << graph::dtype_name(p.dtype);
}

// Every (case, shape, dtype) that runs; `select` picks the cases.
template <typename Select>
std::vector<Param> params_where(Select select) {
  std::vector<Param> out;
  for (std::size_t c = 0; c < op_cases().size(); ++c) {
    if (!select(op_cases()[c])) continue;
    for (DType dtype : testing::kCaseDTypes) {
      if (!runs_at(op_cases()[c], dtype)) continue;
      // f32 at every shape the case lists; 16-bit at its first. A 16-bit op computes in f32 copies
      // through the same f32 kernel (the f32 instances cover the shapes), and each instance is a
      // process of its own under ctest: 16-bit at every shape doubled the sanitizer run's share.
      const std::size_t shapes = dtype == DType::f32 ? op_cases()[c].dim_sets.size() : 1;
      for (std::size_t d = 0; d < shapes; ++d) out.push_back({c, d, dtype});
    }
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const OpCase& c = op_cases()[info.param.case_index];
  std::string name = std::string(c.name) + "_" + std::string(graph::dtype_name(info.param.dtype));
  for (std::int64_t d : c.dim_sets[info.param.dims_index]) name += "_" + std::to_string(d);
  return name;
}

// Sets every parameter (seeds from 17 in graph order), the weights R and integer inputs.
void fill_operands(const OpCase& c, const testing::Dims& dims, const graph::Graph& g, runtime::Executor& exec) {
  exec.initialize_persistent(1);  // non-parameter state (running statistics)
  std::uint64_t seed = 17;
  for (TensorId p : g.parameters()) {
    auto values = testing::random_values(static_cast<std::size_t>(g.tensor(p).shape.numel()), seed++);
    if (c.away_from_zero) {
      for (float& v : values) v = v >= 0 ? v + 0.2f : v - 0.2f;
    }
    if (c.positive) {
      for (float& v : values) v = std::fabs(v) + 0.1f;
    }
    if (c.distinct) {  // a scrambled ramp: no two values within 0.1 (37 is prime to every size used)
      const auto n = static_cast<std::int64_t>(values.size());
      for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = 0.1f * float((i * 37) % n - n / 2);
    }
    write_values(exec, p, values);
  }
  const TensorId weights = g.find("R");
  const auto r = testing::random_values(static_cast<std::size_t>(g.tensor(weights).shape.numel()), 99);
  exec.set_input(weights, encode(r, g.tensor(weights).dtype).data(), g.tensor(weights).size_bytes());
  // Integer inputs (labels, token ids) take values below id_range, or below the class count.
  const auto id_range = static_cast<std::size_t>(c.id_range > 0 ? c.id_range : dims.size() > 1 ? dims[1] : 1);
  for (TensorId id : g.tensors_with_role(graph::Role::input)) {
    if (g.tensor(id).dtype != DType::i32) continue;
    std::vector<std::int32_t> l(static_cast<std::size_t>(g.tensor(id).shape.numel()));
    for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<std::int32_t>((i * 7 + 1) % id_range);
    exec.set_input(id, l.data(), static_cast<Bytes>(l.size() * 4));
  }
}

// --- the gradient check ---------------------------------------------------------------------------

class GradCheck : public ::testing::TestWithParam<Param> {};

TEST_P(GradCheck, BackwardMatchesCentralFiniteDifferences) {
  const OpCase& c = op_cases()[GetParam().case_index];
  const auto& dims = c.dim_sets[GetParam().dims_index];
  ASSERT_TRUE(graph::has_gradient_rule(c.kind)) << c.name;

  graph::Graph g;
  testing::build_case_graph(c, dims, GetParam().dtype, /*backward=*/true, g);
  testing::CpuRun run(g);
  fill_operands(c, dims, g, run.executor);

  auto loss_now = [&] {
    EXPECT_TRUE(run.executor.run_step().ok());
    return read_values(run.executor, g.loss)[0];
  };
  loss_now();
  std::vector<std::vector<double>> analytic;
  // Frozen parameters (a quantized weight's storage) have no gradient to check.
  for (TensorId p : g.parameters()) {
    if (!g.tensor(p).frozen) analytic.push_back(read_values(run.executor, g.tensor(p).grad));
  }

  // Steps and tolerances widen with the dtype's precision (f32: the steps and tolerances the cases state).
  const double widen = epsilon(GetParam().dtype) / epsilon(DType::f32);
  const float h = GetParam().dtype == DType::f32 ? 1e-2f : 1e-1f;
  const double tolerance = c.tolerance * std::max(1.0, std::sqrt(widen) / 10);
  std::size_t param_index = 0;
  for (TensorId p : g.parameters()) {
    if (g.tensor(p).frozen) continue;
    const auto current = read_values(run.executor, p);
    std::vector<float> values(current.begin(), current.end());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float original = values[i];
      values[i] = original + h;
      write_values(run.executor, p, values);
      const double up = loss_now();
      values[i] = original - h;
      write_values(run.executor, p, values);
      const double down = loss_now();
      values[i] = original;
      write_values(run.executor, p, values);
      const double numeric = (up - down) / (2.0 * h);
      const double got = analytic[param_index][i];
      EXPECT_NEAR(got, numeric, tolerance * (1.0 + std::abs(numeric)))
          << c.name << ": d loss / d " << g.tensor(p).name << "[" << i << "]";
    }
    ++param_index;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOp, GradCheck,
                         ::testing::ValuesIn(params_where([](const OpCase& c) { return graph::has_gradient_rule(c.kind); })),
                         param_name);

// Every op kind that can sit on a path from parameters to the loss has a case; this keeps the
// table honest when an op is added.
TEST(GradCheckCoverage, EveryForwardOpWithARuleHasACase) {
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (!graph::has_gradient_rule(kind)) continue;
    bool covered = false;
    for (const OpCase& c : op_cases()) covered = covered || c.kind == kind;
    EXPECT_TRUE(covered) << "op '" << graph::op_name(kind) << "' has a gradient rule but no gradient check";
  }
}

// --- the forward result against the reference -------------------------------------------------------

class CpuVsReference : public ::testing::TestWithParam<Param> {};

TEST_P(CpuVsReference, ForwardMatchesTheDoublePrecisionReference) {
  const OpCase& c = op_cases()[GetParam().case_index];
  const auto& dims = c.dim_sets[GetParam().dims_index];
  const testing::Reference reference = testing::reference_of(c.kind);
  ASSERT_NE(reference, nullptr) << c.name;

  graph::Graph g;
  testing::build_case_graph(c, dims, GetParam().dtype, /*backward=*/false, g);
  const graph::Op& op = testing::op_under_test(g, c.kind);
  ASSERT_EQ(op.outputs.size() + (op.updates.empty() ? 0 : 1), 1u) << c.name << ": one output, or updates in place";
  for (TensorId id : op.inputs) g.retained.push_back(id);
  for (TensorId id : op.outputs) g.retained.push_back(id);
  testing::CpuRun run(g);
  fill_operands(c, dims, g, run.executor);
  testing::RefOperands operands{op, {}, {}, op.outputs.empty() ? graph::Shape{} : g.tensor(op.outputs[0]).shape, {}};
  for (TensorId id : op.updates) operands.updates.push_back(read_values(run.executor, id));
  ASSERT_TRUE(run.executor.run_step().ok());

  for (TensorId id : op.inputs) {
    operands.in.push_back(read_values(run.executor, id));
    operands.shape.push_back(g.tensor(id).shape);
  }
  const std::vector<double> want = reference(operands);
  std::vector<double> got;
  for (TensorId id : op.outputs.empty() ? op.updates : op.outputs) {
    const std::vector<double> values = read_values(run.executor, id);
    got.insert(got.end(), values.begin(), values.end());
  }
  ASSERT_EQ(got.size(), want.size()) << c.name;
  // f32 kernels agree with the double reference to rounding over short sums; 16-bit ones to their precision.
  const double tolerance = std::max(1e-5, 8 * epsilon(GetParam().dtype));
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * (1.0 + std::abs(want[i]))) << c.name << ": element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOp, CpuVsReference,
                         ::testing::ValuesIn(params_where([](const OpCase& c) { return testing::reference_of(c.kind) != nullptr; })),
                         param_name);

// The forward ops of the cases' graphs (the ops under test and those built around them) that have
// no reference yet: the gap is visible, and an op added with a case but without a reference fails
// here until it is given one (or added to this list).
TEST(OpHarness, ForwardOpsWithoutAReferenceAreTheListedOnes) {
  std::set<std::string> without;
  for (const OpCase& c : op_cases()) {
    graph::Graph g;
    testing::build_case_graph(c, c.dim_sets[0], DType::f32, /*backward=*/false, g);
    for (const graph::Op& op : g.ops()) {
      if (testing::reference_of(op.kind) == nullptr) without.emplace(graph::op_name(op.kind));
    }
  }
  EXPECT_EQ(without, (std::set<std::string>{}));
}

// --- dtypes ------------------------------------------------------------------------------------

// Each case runs at every dtype its row accepts that the CPU has a kernel for; the pairs skipped
// for want of a kernel are printed. Every case runs at one dtype at least: a case that never runs
// would be a check that passes without checking.
TEST(OpHarness, EveryCaseRunsAtSomeDTypeAndTheSkippedOnesAreListed) {
  std::set<std::string> skipped;
  for (const OpCase& c : op_cases()) {
    int runs = 0;
    for (DType dtype : testing::kCaseDTypes) {
      if (runs_at(c, dtype)) {
        ++runs;
      } else if (graph::op_info(c.kind).accepts.contains(dtype)) {
        skipped.insert(std::string(graph::op_name(c.kind)) + "@" + std::string(graph::dtype_name(dtype)));
      }
    }
    EXPECT_GT(runs, 0) << "case '" << c.name << "' runs at no dtype: its op has no CPU kernel at any dtype its row accepts";
  }
  std::string listed;
  for (const std::string& pair : skipped) listed += (listed.empty() ? "" : ", ") + pair;
  std::printf("op harness: (op, dtype) pairs the row accepts but the CPU has no kernel for, skipped: %s\n", listed.c_str());
}

// --- coverage --------------------------------------------------------------------------------------

// Kinds no case exercises, each with the test that covers it instead.
const std::map<OpKind, const char*>& exemptions() {
  static const std::map<OpKind, const char*> kExempt = {
      {OpKind::kv_cache_write, "tests/kv_cache_test.cpp (DecodeStep: logits equal the full-context models')"},
      {OpKind::decode_attention, "tests/kv_cache_test.cpp (DecodeStep: logits equal the full-context models')"},
      {OpKind::latent_cache_write, "tests/kv_cache_test.cpp (DecodeStep: latent attention's logits equal the full model's)"},
      {OpKind::latent_decode_attention, "tests/kv_cache_test.cpp (DecodeStep: latent attention's logits equal the full model's)"},
      {OpKind::sgd_update_mixed, "tests/mixed_precision_cli_test.cpp (16-bit training steps, every mode) and "
                                 "tests/mixed_precision_test.cpp (master copies, loss scaling)"},
      {OpKind::sgd_momentum_update_mixed, "tests/mixed_precision_cli_test.cpp, tests/mixed_precision_test.cpp"},
      {OpKind::adamw_update_mixed, "tests/mixed_precision_cli_test.cpp, tests/mixed_precision_test.cpp"},
      {OpKind::adamw8bit_update, "tests/adam8bit_test.cpp (block-wise steps against the published algorithm) and "
                                 "tests/cuda_kernels_test.cpp (CUDA against the CPU)"},
      {OpKind::adamw8bit_update_mixed, "tests/adam8bit_test.cpp (bf16 training, planned = naive)"},
      {OpKind::grads_finite, "tests/mixed_precision_test.cpp (LossScaling: an overflowed step changes no weight)"},
      {OpKind::to_host, "tests/optimizer_offload_test.cpp (training with offload gives the bits of training without)"},
      {OpKind::pack, "tests/data_parallel_test.cpp (Collectives.PackLaysShardsOutRankMajorWithZeroPadding)"},
      {OpKind::all_gather_into, "tests/data_parallel_mpi_test.cpp (ranks against one process, every ZeRO stage)"},
  };
  return kExempt;
}

// Every kind is the op of some case or an op of some case's graph (backward ops through their
// forward op's case), or is exempted above, naming the test that covers it.
TEST(OpHarness, EveryOpKindIsExercisedByACaseOrExemptedByName) {
  std::set<OpKind> exercised;
  for (const OpCase& c : op_cases()) {
    exercised.insert(c.kind);
    graph::Graph g;
    testing::build_case_graph(c, c.dim_sets[0], DType::f32, graph::has_gradient_rule(c.kind), g);
    for (const graph::Op& op : g.ops()) exercised.insert(op.kind);
  }
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    const bool exempt = exemptions().count(kind) != 0;
    EXPECT_TRUE(exercised.count(kind) || exempt)
        << "op '" << graph::op_name(kind) << "' is exercised by no case of tests/op_cases.cpp and not exempted";
    EXPECT_FALSE(exercised.count(kind) && exempt) << "op '" << graph::op_name(kind) << "' is exempted (covered by "
                                                  << exemptions().at(kind) << ") but a case exercises it: drop the exemption";
  }
}

}  // namespace
}  // namespace memplan
