// Ops of the static training graph: kind, operands, attributes, and one metadata table (name,
// shape inference, FLOPs) keyed by kind. Gradient rules live in autograd.cpp, one per kind.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "graph/tensor.h"

namespace memplan::graph {

enum class OpKind : std::uint8_t {
  // forward
  matmul,                 // C[M,N] = op(A) op(B), op = optional transpose; 2-D operands
  bias_add,               // y[..., N] = x[..., N] + b[N]
  add,                    // y = a + b (same shape)
  mul,                    // y = a * b (same shape)
  scale,                  // y = alpha * x
  relu,                   // y = max(x, 0)
  gelu,                   // y = x * Phi(x)  (exact, erf-based, as PyTorch's default)
  reshape,                // a view of x with another shape (no copy)
  sum,                    // scalar = sum(x)
  mean,                   // scalar = mean(x)
  softmax_cross_entropy,  // scalar = mean_i(-log softmax(logits_i)[label_i]); labels i32
  // backward-only helpers
  relu_backward,                   // dx = dy * (y > 0)              inputs: dy, y
  gelu_backward,                   // dx = dy * gelu'(x)             inputs: dy, x
  broadcast_scalar,                // y[shape] = alpha * g           inputs: g (scalar)
  reduce_rows,                     // y[N] = sum over rows of x[..., N]
  softmax_cross_entropy_backward,  // dlogits                        inputs: dloss, logits, labels
  fill,                            // y[shape] = alpha               no inputs
  // optimizer updates: modify their `updates` operands in place
  sgd_update,           // updates: param;                   inputs: grad
  sgd_momentum_update,  // updates: param, momentum buffer;  inputs: grad
  adamw_update,  // updates: param, m, v;             inputs: grad
  count_
};

inline constexpr int kOpKindCount = static_cast<int>(OpKind::count_);

enum class Phase : std::uint8_t { forward, backward, optimizer, recompute };
std::string_view phase_name(Phase phase);

struct OpAttrs {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;              // scale, fill, broadcast_scalar
  std::vector<std::int64_t> shape; // reshape, fill, broadcast_scalar: the output shape
  // optimizer hyper-parameters
  float lr = 0.0f;
  float momentum = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

struct Op {
  OpKind kind = OpKind::add;
  std::string name;
  std::vector<TensorId> inputs;   // read
  std::vector<TensorId> outputs;  // written, produced by this op
  std::vector<TensorId> updates;  // read and written in place (persistent tensors)
  OpAttrs attrs;
  Phase phase = Phase::forward;
};

// A model or graph the user described is inconsistent (shape mismatch, bad config).
struct GraphError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct OutputSpec {
  Shape shape;
  DType dtype = DType::f32;
};

struct OpInfo {
  std::string_view name;
  int num_inputs;   // exact count
  int num_updates;  // exact count
  int num_outputs;  // 1, or 0 for in-place updates
  bool output_is_view;  // the output aliases inputs[0] (no storage of its own)
  // Shape inference; throws GraphError naming the op and the mismatch.
  OutputSpec (*infer)(std::span<const TensorDesc* const> inputs, const OpAttrs& attrs);
  // Floating-point operations for one execution, from shapes (documented per op in op.cpp).
  double (*flops)(std::span<const TensorDesc* const> inputs, const TensorDesc* output);
};

const OpInfo& op_info(OpKind kind);
inline std::string_view op_name(OpKind kind) { return op_info(kind).name; }

}  // namespace memplan::graph
