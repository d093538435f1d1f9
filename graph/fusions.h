// Rewrites of a forward graph that fuse ops so that the step stores less (docs/fusions.md):
//
// - The output projection and its cross-entropy as one computation (Liger's and Apple's Cut
//   Cross-Entropy's idea): a language model's logits [tokens, vocabulary] and their gradient are
//   the largest tensors of its step (1.6 GB each for GPT-2 at batch 8, T 1024), yet the loss needs
//   only one log-sum-exp per row and the gradients of the hidden states and the weight. The fused
//   ops (graph/op.h: linear_cross_entropy_lse, linear_cross_entropy, linear_cross_entropy_backward)
//   compute `chunk_rows` rows of logits at a time in their scratch and recompute them in the
//   backward pass.
// - SiLU then a product (a gated MLP's silu(gate) * up) as one swiglu op: its gradient recomputes
//   the SiLU instead of reading it stored, for the same bits.
// - A training step's layout copies (permute) whose input the backward pass keeps anyway are
//   copied again in the backward pass rather than stored from the forward (attention's output
//   in [B, T, H, D] order, kept both ways for the attention's and the projection's gradients).
#pragma once

#include <cstdint>
#include <string_view>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"

namespace memplan::graph {

// The fused ops' arithmetic is fixed per block of this many rows (aligned to row 0): every GEMM
// call covers one block, the weight gradient sums the blocks in order. A chunk is a whole number
// of blocks, so every chunk size gives the same bits; it decides only the scratch.
inline constexpr std::int64_t kLossRowBlock = 128;
// The scratch a chunk of f32 logits aims at: the rows per chunk the planner picks (at least one
// block, at most every row).
inline constexpr std::int64_t kLossChunkBytes = std::int64_t{64} << 20;

// Rows per chunk for N rows of a V-wide vocabulary: the most blocks whose f32 logits fit in
// kLossChunkBytes (at least one block), and no more than N.
std::int64_t default_loss_chunk_rows(std::int64_t rows, std::int64_t vocab);

// Bytes of scratch a fused-loss op with these rows, vocabulary and chunk rows takes (f32 logits
// of one chunk).
std::int64_t loss_chunk_scratch_bytes(std::int64_t rows, std::int64_t vocab, std::int64_t chunk_rows);

// Whether a training step fuses its loss: `on` wherever the pattern is found, `off` never, `auto`
// (the planner's default) where the fused step's arena lower bound is below the unfused one's.
enum class FusedLoss { auto_, on, off };
inline constexpr EnumName<FusedLoss> kFusedLossNames[] = {
    {"auto", FusedLoss::auto_}, {"on", FusedLoss::on}, {"off", FusedLoss::off}};
std::string_view fused_loss_name(FusedLoss mode);
Result<FusedLoss> parse_fused_loss(std::string_view name);

// What fuse_linear_cross_entropy did.
struct LossFusion {
  bool fused = false;
  std::string logits;      // the logits tensor no longer stored, when fused
  std::int64_t rows = 0;   // N
  std::int64_t vocab = 0;  // V
  std::int64_t chunk_rows = 0;
  std::string why_not;     // when not fused: which condition failed (empty: no cross-entropy at all)
};

// Rewrites `forward` (a model's forward graph, before autograd) in place: a softmax_cross_entropy
// whose logits are matmul(h, w, trans_b) [N, V] read by nothing else becomes
// linear_cross_entropy_lse then linear_cross_entropy on h and w, `chunk_rows` rows at a time (0:
// default_loss_chunk_rows). The logits are then no longer the graph's output (an evaluation graph
// is built unfused). Leaves the graph as it is, saying why, where the pattern is not there.
LossFusion fuse_linear_cross_entropy(Graph& forward, std::int64_t chunk_rows = 0);

// What fuse_swiglu did: the pairs fused and the bytes of SiLU outputs no longer stored.
struct SwigluFusion {
  int pairs = 0;
  std::int64_t bytes = 0;
};

// Rewrites `forward` in place: every silu whose output one mul alone reads (and no caller keeps)
// becomes, with that mul, swiglu(gate, up) under the mul's name. The swiglu rounds its SiLU to
// the step's dtype before the product (OpAttrs::dtype), as the stored SiLU was, and its gradient
// rule recomputes the SiLU with the same op: the step computes the same bits at every dtype.
SwigluFusion fuse_swiglu(Graph& forward);

// What recompute_layout_copies did: the copies made again and the bytes no longer stored.
struct CopyRecompute {
  int copies = 0;
  std::int64_t bytes = 0;
};

// Rewrites `step` (a training step, after autograd) in place: the output Y of a forward permute
// whose input X a backward op reads, and which backward ops read too (itself or through views),
// is copied again from X just before its first backward reader (a backward-phase clone of the
// permute and of Y's views), and the backward ops read the copy: Y then dies after its forward
// readers. A copy computes the same bits.
CopyRecompute recompute_layout_copies(Graph& step);

}  // namespace memplan::graph
