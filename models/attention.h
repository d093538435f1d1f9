// The attention block every transformer here builds (GPT, LLaMA, BERT/ViT encoders), in one of
// two forms: fused (one attention op keeping the output and a log-sum-exp per row, as PyTorch's
// scaled_dot_product_attention does) or materialized (scores, softmax and dropout as [B, H, T, T]
// tensors, K/V heads repeated for grouped-query attention).
#pragma once

#include <cstdint>
#include <string>

#include "memplan/common/enum_names.h"
#include "memplan/graph/builder.h"

namespace memplan::models {

enum class AttentionKind : std::uint8_t { fused, materialized };
// What --attention takes.
inline constexpr EnumName<AttentionKind> kAttentionKindNames[] = {{"fused", AttentionKind::fused},
                                                                   {"materialized", AttentionKind::materialized}};
inline std::string_view attention_kind_name(AttentionKind kind) { return enum_name(kAttentionKindNames, kind); }

// softmax(q k^T / sqrt(D)) v for q [B, H, T, D] and k, v [B, KH, T, D] (KH divides H), with
// dropout p on the probabilities; [B, H, T, D]. Tensors are named `prefix`.scores, .scaled,
// .probs, .drop, .values (materialized; .k.repeat/.v.repeat for GQA) or `prefix`.fused and
// .fused.lse (fused, whose dropout draws the same mask as `prefix`.drop would).
TensorId attention_block(graph::Builder& b, AttentionKind kind, TensorId q, TensorId k,
                                TensorId v, bool causal, float p, const std::string& prefix);

}  // namespace memplan::models
