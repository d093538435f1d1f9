// Optimizer updates as graph ops: each parameter's update reads its gradient and modifies the
// parameter and its optimizer state in place (phase optimizer). State tensors are persistent.
#pragma once

#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"

namespace memplan::graph {

enum class OptimizerKind { sgd, momentum, adamw };

// The names --optimizer takes and reports print (common/enum_names.h).
inline constexpr EnumName<OptimizerKind> kOptimizerNames[] = {
    {"sgd", OptimizerKind::sgd}, {"momentum", OptimizerKind::momentum}, {"adamw", OptimizerKind::adamw}};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  float lr = 1e-3f;
  float momentum = 0.9f;      // momentum only
  float beta1 = 0.9f;         // adamw
  float beta2 = 0.999f;       // adamw
  float eps = 1e-8f;          // adamw
  float weight_decay = 0.0f;  // decoupled for adamw, L2 for sgd/momentum (as PyTorch)
};

Result<OptimizerKind> parse_optimizer_kind(std::string_view name);
std::string_view optimizer_name(OptimizerKind kind);

// Appends one update op per parameter that has a gradient (after append_backward), creating
// the optimizer state each needs: momentum 1 buffer, AdamW 2 (m, v), SGD none. A 16-bit (bf16,
// f16) parameter also gets an f32 master copy, and its state is f32 (mixed precision).
void append_optimizer(Graph& graph, const OptimizerConfig& config);

// Optimizer offload (ZeRO-Offload, Ren et al. 2021): every update's optimizer state and f32
// master copy live in host memory (TensorDesc::host), and the gradient it reads is copied there
// first (a to_host op, just before the update): the update then runs on the CPU and writes the
// parameter, which stays on the device. The device keeps parameters, activations and gradients;
// the host holds 12 bytes a parameter of AdamW state plus the gradient copies. Returns the number
// of updates moved; a step with none is left alone.
int offload_optimizer(Graph& graph);

// One parameter's update as append_optimizer makes it, from gradient `grad`. `state_shape`: the
// shape of its optimizer state (and master copy), the parameter's when empty; `attrs_base`
// carries the shard fields of a sharded update (OpAttrs::shard_offset/shard_count).
void append_update(Graph& graph, TensorId param, TensorId grad, const OptimizerConfig& config,
                   const Shape& state_shape = {}, const OpAttrs& attrs_base = {});

}  // namespace memplan::graph
