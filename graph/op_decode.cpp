// Generation with a KV cache: writing keys and values, and one query token's attention over the cache.
// One row per op (graph/op.h: OpInfo): shape rule, FLOPs, in-place inputs, gradient rule.
#include <cstdint>

#include "memplan/graph/op_rules_internal.h"

namespace memplan::graph {
namespace {

using namespace op_rules;

// The operands generation with a KV cache shares: per-slot k, v [B, KW] (KW = NKV*HD), a block
// table [B, MB] and positions [B], both i32.
void expect_kv_slots(std::string_view op, const TensorDesc& k, const TensorDesc& v, const TensorDesc& table,
                     const TensorDesc& positions) {
  expect_float(op, k);
  expect_rank(op, k, 2);
  expect_same_shape(op, k, v);
  expect_same_dtype(op, k, v);
  if (table.dtype != DType::i32 || positions.dtype != DType::i32) fail(op, "block table and positions must be i32");
  expect_rank(op, table, 2);
  expect_rank(op, positions, 1);
  if (table.shape[0] != k.shape[0] || positions.shape[0] != k.shape[0]) {
    fail(op, "block table " + table.shape.to_string() + " and positions " + positions.shape.to_string() +
                 " must have one row per slot of '" + k.name + "' " + k.shape.to_string());
  }
}

// attrs.shape: {} stores keys as they are; {HD} rotates each head of HD values of the key by its
// position first (rotary embedding with attrs.rope_base).
OutputSpec infer_kv_cache_write(Inputs in, const OpAttrs& attrs) {
  expect_kv_slots("kv_cache_write", *in[0], *in[1], *in[2], *in[3]);
  if (!attrs.shape.empty() &&
      (attrs.shape.size() != 1 || attrs.shape[0] <= 0 || attrs.shape[0] % 2 != 0 || in[0]->shape[1] % attrs.shape[0] != 0)) {
    fail("kv_cache_write", "shape must be {} or {head size} (even, dividing the key's width)");
  }
  const std::int64_t hd = attrs.shape.empty() ? 0 : attrs.shape[0];
  if (attrs.rotary_dims < 0 || attrs.rotary_dims % 2 != 0 || attrs.rotary_dims > hd) {
    fail("kv_cache_write", "rotary_dims " + str(attrs.rotary_dims) + " must be even and at most the head size " + str(hd) + " (0: all)");
  }
  return {};
}

OutputSpec infer_decode_attention(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& q = *in[0];
  const TensorDesc& k = *in[1];
  expect_kv_slots("decode_attention", k, *in[2], *in[5], *in[6]);
  expect_float("decode_attention", q);
  expect_rank("decode_attention", q, 2);
  expect_same_dtype("decode_attention", q, k);
  // attrs.shape: {heads, kv_heads}, or {heads, kv_heads, 1} to rotate the query and the slot's own
  // key by the slot's position first (rotary embedding with attrs.rope_base; the cache holds
  // rotated keys, kv_cache_write's {HD}).
  const bool shape_ok = (attrs.shape.size() == 2 || (attrs.shape.size() == 3 && attrs.shape[2] == 1)) &&
                        attrs.shape[0] > 0 && attrs.shape[1] > 0 && attrs.shape[0] % attrs.shape[1] == 0;
  if (!shape_ok) fail("decode_attention", "shape must be {heads, kv_heads} or {heads, kv_heads, 1}, kv_heads dividing heads");
  const std::int64_t nh = attrs.shape[0], nkv = attrs.shape[1];
  if (q.shape[0] != k.shape[0] || q.shape[1] % nh != 0 || k.shape[1] != q.shape[1] / nh * nkv) {
    fail("decode_attention", "query '" + q.name + "' " + q.shape.to_string() + " and key '" + k.name + "' " +
                                 k.shape.to_string() + " do not split into " + str(nh) + " and " + str(nkv) +
                                 " heads of one size");
  }
  const std::int64_t rotary_limit = attrs.shape.size() == 3 ? q.shape[1] / nh : 0;
  if (attrs.rotary_dims < 0 || attrs.rotary_dims % 2 != 0 || attrs.rotary_dims > rotary_limit) {
    fail("decode_attention", "rotary_dims " + str(attrs.rotary_dims) + " must be even and at most the head size " +
                                 str(rotary_limit) + " of a rotating step (0: all)");
  }
  for (const TensorDesc* cache : {in[3], in[4]}) {
    expect_rank("decode_attention", *cache, 3);
    expect_same_dtype("decode_attention", *cache, k);
    if (cache->shape[2] != k.shape[1]) {
      fail("decode_attention", "cache '" + cache->name + "' " + cache->shape.to_string() + " must hold rows of " +
                                   str(k.shape[1]) + " values");
    }
  }
  expect_same_shape("decode_attention", *in[3], *in[4]);
  return {q.shape, q.dtype};
}

// latent_cache_write: the key [B, HD] stored whole; attrs.shape {HD} rotates its first rotary_dims
// channels by the position (MLA's decoupled rotary key ahead of the latent).
OutputSpec infer_latent_cache_write(Inputs in, const OpAttrs& attrs) {
  expect_kv_slots("latent_cache_write", *in[0], *in[0], *in[1], *in[2]);
  const std::int64_t width = in[0]->shape[1];
  if (!attrs.shape.empty() && (attrs.shape.size() != 1 || attrs.shape[0] != width)) {
    fail("latent_cache_write", "shape must be {} or {the key's width " + str(width) + "}");
  }
  if (attrs.rotary_dims < 0 || attrs.rotary_dims % 2 != 0 || attrs.rotary_dims > width) {
    fail("latent_cache_write", "rotary_dims " + str(attrs.rotary_dims) + " must be even and at most the key's width " + str(width));
  }
  return {};
}

// latent_decode_attention: every query head of HD channels against one shared key head of HD;
// values are the keys' channels [start, HD), so the output has NH * (HD - start) channels.
OutputSpec infer_latent_decode_attention(Inputs in, const OpAttrs& attrs) {
  const TensorDesc& q = *in[0];
  const TensorDesc& k = *in[1];
  const TensorDesc& cache = *in[2];
  expect_kv_slots("latent_decode_attention", k, k, *in[3], *in[4]);
  expect_float("latent_decode_attention", q);
  expect_rank("latent_decode_attention", q, 2);
  expect_same_dtype("latent_decode_attention", q, k);
  const bool shape_ok = (attrs.shape.size() == 1 || (attrs.shape.size() == 2 && attrs.shape[1] == 1)) && attrs.shape[0] > 0;
  if (!shape_ok) fail("latent_decode_attention", "shape must be {heads} or {heads, 1}");
  const std::int64_t nh = attrs.shape[0], hd = k.shape[1];
  if (q.shape[0] != k.shape[0] || q.shape[1] != nh * hd) {
    fail("latent_decode_attention", "query '" + q.name + "' " + q.shape.to_string() + " must hold " + str(nh) +
                                        " heads as wide as the key '" + k.name + "' " + k.shape.to_string());
  }
  if (attrs.start < 0 || attrs.start >= hd) {
    fail("latent_decode_attention", "start " + str(attrs.start) + " (the value's first channel) must lie in [0, " + str(hd) + ")");
  }
  const std::int64_t rotary_limit = attrs.shape.size() == 2 ? attrs.start : 0;
  if (attrs.rotary_dims < 0 || attrs.rotary_dims % 2 != 0 || attrs.rotary_dims > rotary_limit ||
      (attrs.shape.size() == 2 && attrs.rotary_dims == 0)) {
    fail("latent_decode_attention", "rotary_dims " + str(attrs.rotary_dims) + " must be even, positive when rotating, and "
                                        "at most the value's first channel " + str(rotary_limit) + " (values do not rotate)");
  }
  expect_rank("latent_decode_attention", cache, 3);
  expect_same_dtype("latent_decode_attention", cache, k);
  if (cache.shape[2] != hd) {
    fail("latent_decode_attention", "cache '" + cache.name + "' " + cache.shape.to_string() + " must hold rows of " +
                                        str(hd) + " values");
  }
  return {Shape{q.shape[0], nh * (hd - attrs.start)}, q.dtype};
}

// Scores over every channel of the key, weighted sums over the value's.
double flops_latent_decode_attention(Inputs in, const TensorDesc* out) {
  const double context = double(in[3]->shape[1]) * double(in[2]->shape[1]);  // MB * block size
  const double heads = double(in[0]->shape[1]) / double(in[1]->shape[1]);
  return 2.0 * (double(in[0]->shape.numel()) + numel_of(out)) * context + 5.0 * double(in[0]->shape[0]) * heads * context;
}

// Attention of one query row per slot over a full context (the most a step can do): scores and
// weighted values, 2 multiply-adds per cached element, plus the softmax.
double flops_decode_attention(Inputs in, const TensorDesc* out) {
  const double context = double(in[5]->shape[1]) * double(in[3]->shape[1]);  // MB * block size
  return 4.0 * numel_of(out) * context + 5.0 * double(in[0]->shape[0]) * context;
}

// clang-format off
constexpr OpInfo kDecodeRows[] = {
  {.kind = OpKind::kv_cache_write, .name = "kv_cache_write", .num_inputs = 4, .num_updates = 2, .num_outputs = 0,
    .infer = infer_kv_cache_write, .flops = flops_zero},
  {.kind = OpKind::decode_attention, .name = "decode_attention", .num_inputs = 7, .num_updates = 0, .num_outputs = 1,
    .infer = infer_decode_attention, .flops = flops_decode_attention},
  {.kind = OpKind::latent_cache_write, .name = "latent_cache_write", .num_inputs = 3, .num_updates = 1, .num_outputs = 0,
    .infer = infer_latent_cache_write, .flops = flops_zero},
  {.kind = OpKind::latent_decode_attention, .name = "latent_decode_attention", .num_inputs = 5, .num_updates = 0,
    .num_outputs = 1, .infer = infer_latent_decode_attention, .flops = flops_latent_decode_attention},
};
// clang-format on

}  // namespace

std::span<const OpInfo> decode_rows() { return kDecodeRows; }

}  // namespace memplan::graph
