// CPU implementations of every op (Eigen GEMM, loops on the thread pool of parallel.h), in f32,
// and at bf16 and f16 by computing in f32 copies (widened_kernels.cpp). Loops split over
// independent outputs in chunks set by the shapes, so no value depends on the thread count or on
// which thread runs a chunk.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "memplan/kernels/kernel.h"

namespace memplan::kernels::cpu {

// Every CPU kernel: the f32 ones and their bf16 and f16 forms.
KernelEntries kernel_entries();
// The f32 kernels of every op (all but the mixed-precision updates, which take 16-bit gradients).
KernelEntries f32_kernel_entries();
// Every op with an f32 kernel, and the mixed updates, at bf16 and f16: computed in f32 copies of
// the 16-bit operands made in KernelCall::workspace (graph::op_widening says how many bytes).
KernelEntries widened_kernel_entries();
// The kernels that read 16-bit values at their own width (grads_finite), at every dtype.
KernelEntries native_16bit_kernel_entries();
KernelEntries nn_16bit_kernel_entries();    // nn_kernels.cpp: the 16-bit embedding gather
KernelEntries loss_16bit_kernel_entries();  // cpu_kernels.cpp: the loss read from 16-bit logits
// Convolution, pooling, normalisation, attention and embedding kernels (nn_kernels.cpp).
KernelEntries nn_kernel_entries();
// The pairs of adjacent ops that run fused on the CPU (graph::fusable_pair: im2col then conv2d
// or the weight gradient; the input gradient's product then col2im), sample by sample
// (nn_kernels.cpp).
struct FusedKernelEntry {
  graph::OpKind first, second;
  FusedKernel kernel;
};
std::vector<FusedKernelEntry> nn_fused_kernel_entries();
// RMSNorm, SiLU, rotary, grouped-query head repetition, concat and slice (llm_kernels.cpp).
KernelEntries llm_kernel_entries();
// Rotary embedding of one head of `hd` values at position `pos` (llm_kernels.cpp): pairs (i, i + R/2)
// rotate by pos * base^(-2i/R), R the rotating channels (rotary_dims, or all hd), the rest copied;
// `inverse` rotates by the negative angle. The rotary op and the decode kernels both use it.
void rotate_head(const float* x, float* y, std::int64_t hd, std::int64_t pos, double base, std::int64_t rotary_dims,
                 bool inverse = false);
// Fused attention: its log-sum-exp, output and backward ops (attention_kernels.cpp).
KernelEntries attention_kernel_entries();
// KV cache writes and decode attention through a block table (decode_kernels.cpp).
KernelEntries decode_kernel_entries();
// Top-k routing, dispatch, combine and router statistics of mixtures of experts (moe_kernels.cpp).
KernelEntries moe_kernel_entries();
// The fused projection and cross-entropy, chunk by chunk (fused_loss_kernels.cpp).
KernelEntries fused_loss_kernel_entries();
KernelEntries quant_kernel_entries();
// optimizer_8bit_kernels.cpp: 8-bit AdamW at f32, and the f32 form of its mixed update (the
// widened kernels' compute table).
KernelEntries optimizer_8bit_kernel_entries();
void adamw8bit_update_mixed_f32(const KernelCall& c);  // quant_kernels.cpp: products with quantized frozen weights
// The vocabulary-parallel cross-entropy's statistics, loss and gradient (tensor_parallel_kernels.cpp).
KernelEntries tensor_parallel_kernel_entries();
// pack and the collectives, which call the executor's communicator (collective_kernels.cpp).
KernelEntries collective_kernel_entries();
// collective_kernels.cpp at bf16/f16: packs and gathers moving 16-bit values (native), and the
// sums across ranks, which exchange 16 bits and add in f32 in buffers graph::op_widening sizes.
KernelEntries collective_16bit_kernel_entries();
KernelEntries collective_exchange_kernel_entries();

// The parameter elements an optimizer update writes (updates[0]: the parameter, or the f32 copy of
// a mixed update's working copy): all of them, or one rank's shard (ZeRO-1/2), whose gradient and
// state are indexed from 0.
inline float* updated_params(const KernelCall& c) {
  return c.updates[0].f32() + (c.attrs->shard_count >= 0 ? c.attrs->shard_offset : 0);
}
inline std::int64_t updated_count(const KernelCall& c) {
  return c.attrs->shard_count >= 0 ? c.attrs->shard_count : c.updates[0].numel();
}

// C[M,N] = op(A) op(B), all row-major and contiguous: A stored [M,K] ([K,M] when trans_a), B stored
// [K,N] ([N,K] when trans_b).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          const float* b, float* c);
// C += op(A) op(B) with explicit row strides (elements) of A, B and C as stored: sub-blocks.
void gemm_accumulate_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                             const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                             std::int64_t ldc);

// C[M,N] = A B for the convolutions' small shapes (conv_gemm.cpp), single-threaded: A(r, k) at
// a[r * ars + k * acs] (so A or its transpose, in place), B [K,N] and C [M,N] with row strides.
void small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t ars, std::int64_t acs,
                const float* b, std::int64_t ldb, float* c, std::int64_t ldc);
// C[M,N] = sum over s < batch of A[s] B[s]^T, A [batch, M, K] and B [batch, N, K] contiguous; the
// convolution's weight gradient. Threads split C's tiles; the result does not depend on their count.
// accumulate: C += the sum (C's values are the first term).
void batched_gemm_nt(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                     const float* b, float* c, bool accumulate = false);
// The same sum, the same bits, with B's rows made on the way: each thread calls
// fill(s, r0, r1, dst) for the rows [r0, r1) of sample s it needs, which it writes at
// dst + r * k, dst a sample-sized slot of `slots` ([batch, N, K], reused for every pass), so the
// rows are read back while in cache.
using RowFill = std::function<void(std::int64_t s, std::int64_t r0, std::int64_t r1, float* dst)>;
void batched_gemm_nt_filled(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                            float* slots, float* c, const RowFill& fill);

}  // namespace memplan::kernels::cpu
