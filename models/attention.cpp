// The two forms of the attention block (models/attention.h).
#include "memplan/models/attention.h"

#include <cmath>

namespace memplan::models {

TensorId soft_cap(graph::Builder& b, TensorId x, float cap, const std::string& name) {
  return b.scale(b.tanh(b.scale(x, 1.0f / cap, name + ".in"), name + ".tanh"), cap, name);
}

TensorId attention_block(graph::Builder& b, AttentionKind kind, TensorId q, TensorId k,
                                TensorId v, bool causal, float p, const std::string& prefix, float scale,
                                float softcap, TensorId bias, std::int64_t window) {
  const graph::Shape& qs = b.graph().tensor(q).shape;
  if (qs.rank() != 4) throw graph::GraphError("attention: queries must be [B, H, T, D], got " + qs.to_string());
  const std::int64_t heads = qs[1], head_dim = qs[3];
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (kind == AttentionKind::fused) {
    if (bias != kNoTensor) throw graph::GraphError("attention: an additive score bias needs the materialized form");
    return b.attention(q, k, v, causal, scale, p, prefix + ".fused", prefix + ".drop", softcap, window);
  }
  const std::int64_t kv_heads = b.graph().tensor(k).shape[1];
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    throw graph::GraphError("attention: " + std::to_string(heads) + " query heads do not split into " +
                            std::to_string(kv_heads) + " key/value heads");
  }
  k = b.repeat_heads(k, heads / kv_heads, prefix + ".k.repeat");
  v = b.repeat_heads(v, heads / kv_heads, prefix + ".v.repeat");
  TensorId att = b.batched_matmul(q, k, false, true, prefix + ".scores");  // [B, H, Tq, Tk]
  if (scale != 1.0f) att = b.scale(att, scale, prefix + ".scaled");
  if (bias != kNoTensor) {
    const graph::Shape scores = b.graph().tensor(att).shape;
    const std::int64_t per_sample = b.graph().tensor(bias).shape.numel();
    att = b.bias_add(b.reshape(att, {scores[0], per_sample}, prefix + ".scores.flat"),
                     b.reshape(bias, {per_sample}, prefix + ".bias.flat"), prefix + ".biased");
    att = b.reshape(att, scores, prefix + ".biased.heads");
  }
  if (softcap > 0.0f) att = soft_cap(b, att, softcap, prefix + ".capped");
  att = b.softmax(att, causal, prefix + ".probs", window);
  att = b.dropout(att, p, prefix + ".drop");
  return b.batched_matmul(att, v, false, false, prefix + ".values");  // [B, H, T, D]
}

}  // namespace memplan::models
