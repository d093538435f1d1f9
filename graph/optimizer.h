// Optimizer updates as graph ops: each parameter's update reads its gradient and modifies the
// parameter and its optimizer state in place (phase optimizer). State tensors are persistent.
#pragma once

#include <cstdint>
#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"

namespace memplan::graph {

// adamw8bit: AdamW with bitsandbytes' block-wise 8-bit states (Dettmers et al. 2022,
// "8-bit Optimizers via Block-wise Quantization"; bnb.optim.AdamW8bit). Each moment is a u8 code
// per element, into the signed dynamic map for m and the unsigned one for v
// (kernels/shared/optimizers.h), scaled by an f32 absmax per block of 256 elements: 2 bytes an
// element plus 8 bytes a block, against AdamW's 8 bytes an element. A parameter of fewer than
// 4,096 elements keeps f32 states (bnb's min_8bit_size). paged_adamw8bit: the same, with the u8
// states of parameters of 100,000 elements or more in host-visible memory (bnb's paged
// optimizers page them out of the device; the absmax stays on the device): counted as host bytes.
enum class OptimizerKind { sgd, momentum, adamw, adamw8bit, paged_adamw8bit };

// The names --optimizer takes and reports print (common/enum_names.h).
inline constexpr EnumName<OptimizerKind> kOptimizerNames[] = {{"sgd", OptimizerKind::sgd},
                                                              {"momentum", OptimizerKind::momentum},
                                                              {"adamw", OptimizerKind::adamw},
                                                              {"adamw8bit", OptimizerKind::adamw8bit},
                                                              {"paged_adamw8bit", OptimizerKind::paged_adamw8bit}};

inline constexpr std::int64_t kAdam8bitBlock = 256;             // elements a block's absmax scales
inline constexpr std::int64_t kAdam8bitMinElements = 4096;      // smaller parameters keep f32 states
inline constexpr std::int64_t kPagedStateMinElements = 100000;  // smaller parameters' states are not paged

inline bool is_8bit_adam(OptimizerKind kind) {
  return kind == OptimizerKind::adamw8bit || kind == OptimizerKind::paged_adamw8bit;
}

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  float lr = 1e-3f;
  float momentum = 0.9f;      // momentum only
  float beta1 = 0.9f;         // adamw, adamw8bit
  float beta2 = 0.999f;       // adamw, adamw8bit
  float eps = 1e-8f;          // adamw, adamw8bit
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

// The 8-bit AdamW states of a step, for fit's breakdown: the u8 codes and the f32 absmax of the
// updates that quantize, and the f32 moments of the AdamW updates, which in a step built with an
// 8-bit optimizer are the parameters too small to quantize (bnb's min_8bit_size).
struct EightBitStates {
  int quantized_updates = 0;
  int f32_updates = 0;      // parameters under kAdam8bitMinElements, with AdamW's f32 moments
  Bytes code_bytes = 0;     // the u8 m and v (device and host)
  Bytes paged_bytes = 0;    // of which in host-visible memory (paged_adamw8bit)
  Bytes absmax_bytes = 0;   // an f32 for each block of 256, each moment
  Bytes f32_state_bytes = 0;
};
EightBitStates eight_bit_states(const Graph& graph);

// One parameter's update as append_optimizer makes it, from gradient `grad`. `state_shape`: the
// shape of its optimizer state (and master copy), the parameter's when empty; `attrs_base`
// carries the shard fields of a sharded update (OpAttrs::shard_offset/shard_count).
void append_update(Graph& graph, TensorId param, TensorId grad, const OptimizerConfig& config,
                   const Shape& state_shape = {}, const OpAttrs& attrs_base = {});

}  // namespace memplan::graph
