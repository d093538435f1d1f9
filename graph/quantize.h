// Quantized frozen weights (QLoRA and quantized fine-tuning): the frozen linear layers of a forward
// graph store their weights as the quantization libraries lay them out, and a quant_matmul op
// dequantizes a tile of rows at a time inside the product, in its own scratch: no full-precision
// copy of a quantized weight is ever kept. Embeddings, the output head and norms stay in the
// working dtype, as transformers leaves them.
//
// The layouts, per weight of `numel` = out x in elements (docs/fine_tuning.md gives the sources):
//   nf4, fp4 (bitsandbytes' 4-bit): data u8 [ceil(numel / 2)] (two codes a byte), absmax f32
//     [ceil(numel / 64)] (a scale per block of 64); with double quantization the absmax are u8
//     codes [ceil(numel / 64)] with an f32 absmax per 256 of them and one f32 offset.
//   int8 (LLM.int8): data u8 [numel] (int8 values), f32 row scales [out].
//   fp8 (e4m3): data u8 [numel], one f32 scale.
//   gptq, awq (packed int4 with group size G along `in`): qweight u8 [numel / 2], zeros u8
//     [(in / G) x out / 2] (packed int4), scales f16 [(in / G) x out]; GPTQ adds g_idx i32 [in].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memplan/common/enum_names.h"
#include "memplan/graph/graph.h"

namespace memplan::graph {

struct QuantConfig {
  QuantFormat format = QuantFormat::none;
  bool double_quant = false;    // nf4, fp4: the block scales quantized again
  std::int64_t group_size = 128;  // gptq, awq: input channels sharing a scale and a zero

  bool active() const { return format != QuantFormat::none; }
};

// The bytes of one quantized [out, in] weight, by part.
struct QuantLayout {
  Bytes data = 0;       // the quantized values
  Bytes constants = 0;  // scales, zeros, offsets, g_idx
  Bytes total() const { return data + constants; }
};
// Throws GraphError where the format cannot hold such a weight (a group size that does not divide
// `in`).
QuantLayout quant_layout(const QuantConfig& config, std::int64_t out, std::int64_t in);

// The elements of a 4-bit block (nf4, fp4) and the block scales sharing a second-level scale
// under double quantization: bitsandbytes' defaults.
inline constexpr std::int64_t kQuant4BitBlock = 64;
inline constexpr std::int64_t kQuantDoubleBlock = 256;

// The storage tensors of a quantized [out, in] weight named `name` ("<module>.weight"): frozen
// parameters "<name>.quant", ".absmax", ..., in the order quant_matmul reads them.
std::vector<TensorId> add_quantized_weight(Graph& g, const std::string& name, std::int64_t out, std::int64_t in,
                                           const QuantConfig& config);
// y = x deq(W)^T for the weight `storage` holds (add_quantized_weight).
TensorId add_quant_matmul(Graph& g, TensorId x, const std::vector<TensorId>& storage, std::int64_t out, std::int64_t in,
                          const QuantConfig& config, const std::string& name, Role role = Role::activation,
                          Phase phase = Phase::forward);

struct QuantReport {
  int quantized_layers = 0;
  std::int64_t quantized_params = 0;  // elements of the weights quantized
  Bytes full_bytes = 0;               // those weights at the working dtype
  Bytes data_bytes = 0;
  Bytes constant_bytes = 0;
  // Mixtures of experts: the experts' weights ([E, out, in], products batched over the experts)
  // stay at the working dtype: quant_matmul does not take them yet.
  int expert_weights_left = 0;
  Bytes expert_bytes_left = 0;
};

// Replaces every frozen linear weight of `forward` (not the output head) by its quantized storage
// and the layer's product by quant_matmul. Throws GraphError when no frozen linear layer exists
// (quantization applies to frozen weights: LoRA's base or --freeze) or a layout cannot hold one.
QuantReport quantize_frozen_linears(Graph& forward, const QuantConfig& config);

}  // namespace memplan::graph
