// The op harness's table: one or more cases per op kind, each a small graph around the op under
// test over a few shapes, built at a given dtype. tests/op_harness_test.cpp checks every case's
// backward against central finite differences (ops with a gradient rule), its forward against a
// double-precision reference written from the op's contract in graph/op.h (where the op has one),
// and that every OpKind is exercised by some case or exempted by name;
// tests/cuda_kernels_test.cpp runs every op of every case's graph on the GPU against the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/graph/builder.h"
#include "memplan/graph/graph.h"

namespace memplan::testing {

using Dims = std::vector<std::int64_t>;

struct OpCase {
  const char* name;
  graph::OpKind kind;  // the op under test: the last op of this kind the builder appends
  // Builds the op from parameters it creates at `dtype` (so they receive gradients) and inputs;
  // returns the tensor the harness reduces to a loss (the op's output, or one computed from it).
  std::function<TensorId(graph::Builder&, const Dims& dims, graph::DType dtype)> build;
  std::vector<Dims> dim_sets;   // shapes to try
  float tolerance = 2e-2f;      // the gradient check's, relative to 1 + |numeric|
  bool away_from_zero = false;  // parameter values kept away from kinks (relu, clip)
  bool distinct = false;        // parameter values at least 0.1 apart (max pooling: no near-ties)
  std::int64_t id_range = 0;    // i32 inputs hold (7i + 1) % id_range; 0 = dims[1]
  bool positive = false;        // parameter values > 0 (variances)
};

// Every case, in the table's order.
const std::vector<OpCase>& op_cases();

// The values of one op's operands, in double, row-major, for a reference.
struct RefOperands {
  const graph::Op& op;
  std::vector<std::vector<double>> in;  // each input's values
  std::vector<graph::Shape> shape;      // each input's shape
  graph::Shape out;                     // the output's shape (none for an update in place)
  std::vector<std::vector<double>> updates;  // each updated tensor's values before the op
};
// The op's output computed from its operands by plain loops from the op's contract (graph/op.h);
// for an op that updates tensors in place (no output), their new values one after the other.
using Reference = std::vector<double> (*)(const RefOperands& operands);
// The reference of `kind`, or nullptr where it has none yet.
Reference reference_of(graph::OpKind kind);

// The floating dtypes every case is tried at (those a row accepts and the CPU has a kernel for run).
inline constexpr graph::DType kCaseDTypes[] = {graph::DType::f32, graph::DType::f16, graph::DType::bf16};

// The case's graph at `dims` and `dtype`: y = build(...), loss = sum(y * R) with R an input named
// "R" of y's shape; with `backward`, append_backward from the loss and every parameter's gradient
// retained. Returns y.
TensorId build_case_graph(const OpCase& c, const Dims& dims, graph::DType dtype, bool backward, graph::Graph& g);

// The op under test in a case's graph: the last op of the case's kind outside the backward pass.
const graph::Op& op_under_test(const graph::Graph& g, graph::OpKind kind);

}  // namespace memplan::testing
