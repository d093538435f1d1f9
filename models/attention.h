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

// cap * tanh(x / cap): the soft-capping of Gemma-2's attention scores and final logits, as three
// elementwise ops (`name`.in, `name`.tanh, `name`).
TensorId soft_cap(graph::Builder& b, TensorId x, float cap, const std::string& name);

// softmax(q k^T / sqrt(D)) v for q [B, H, T, D] and k, v [B, KH, T, D] (KH divides H), with
// dropout p on the probabilities; [B, H, T, D]. Tensors are named `prefix`.scores, .scaled,
// .probs, .drop, .values (materialized; .k.repeat/.v.repeat for GQA) or `prefix`.fused and
// .fused.lse (fused, whose dropout draws the same mask as `prefix`.drop would).
// `scale` > 0 replaces 1 / sqrt(D) (Gemma-2's query_pre_attn_scalar^-1/2); `softcap` > 0 caps the
// scaled scores to softcap * tanh(s / softcap) before the softmax (Gemma-2; materialized:
// `prefix`.capped). q [B, H, Tq, D] may attend to keys of another length Tk (cross-attention).
// `bias` [H, Tq, Tk] (T5's relative position bias) is added to every sample's scaled scores
// (`prefix`.biased; materialized only); a scale of exactly 1 stores no scaled copy (T5).
// `window` > 0 (causal only): query i sees keys i - window < j <= i (a sliding window).
TensorId attention_block(graph::Builder& b, AttentionKind kind, TensorId q, TensorId k,
                                TensorId v, bool causal, float p, const std::string& prefix, float scale = 0.0f,
                                float softcap = 0.0f, TensorId bias = kNoTensor, std::int64_t window = 0);

}  // namespace memplan::models
