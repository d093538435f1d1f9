// The fused projection and cross-entropy (graph/fusions.h) on CUDA: a chunk of logits at a
// time in the call's workspace through cuBLAS, the row statistics by one block per row.
#include <algorithm>
#include <cmath>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/loss_chunks.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

// Row-major C[m, n] = op(A) op(B) + beta C with leading dimensions as stored (cuBLAS sees the
// column-major transposes: C^T = op(B)^T op(A)^T).
void gemm_ld(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
             const float* b, std::int64_t ldb, float* c, std::int64_t ldc, float beta) {
  const float alpha = 1.0f;
  MEMPLAN_CUBLAS_CHECK(cublas_api().sgemm(context().cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          int(n), int(m), int(k), &alpha, b, int(ldb), a, int(lda), &beta, c, int(ldc)));
}


// lse of each row of logits [rows, V]: the max, then the sum of exponentials in double.
__global__ void lse_rows_kernel(const float* logits, std::int64_t vocab, float* lse) {
  const float* row = logits + blockIdx.x * vocab;
  float m = -INFINITY;
  for (std::int64_t v = threadIdx.x; v < vocab; v += blockDim.x) m = fmaxf(m, row[v]);
  m = block_max(m);
  double z = 0.0;
  for (std::int64_t v = threadIdx.x; v < vocab; v += blockDim.x) z += exp(double(row[v] - m));
  z = block_sum(z);
  if (threadIdx.x == 0) lse[blockIdx.x] = static_cast<float>(log(z) + double(m));
}

// lse[n] - h_n . w_{label n} per row, in double.
__global__ void label_rows_kernel(const float* h, const float* w, const std::int32_t* labels, const float* lse,
                                  std::int64_t width, double* row_loss) {
  const float* x = h + blockIdx.x * width;
  const float* wl = w + std::int64_t{labels[blockIdx.x]} * width;
  double dot = 0.0;
  for (std::int64_t k = threadIdx.x; k < width; k += blockDim.x) dot += double(x[k]) * double(wl[k]);
  dot = block_sum(dot);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = double(lse[blockIdx.x]) - dot;
}

__global__ void mean_rows_kernel(const double* v, std::int64_t n, float* out) {
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = static_cast<float>(s / double(n));
}

// Logits [rows, V] become (exp(logit - lse) - onehot) * dloss / N in place.
__global__ void dlogits_rows_kernel(const float* dloss, const std::int32_t* labels, const float* lse, std::int64_t vocab,
                                    std::int64_t total_rows, float* p) {
  float* row = p + blockIdx.x * vocab;
  const float scale = dloss[0] / static_cast<float>(total_rows);
  const float m = lse[blockIdx.x];
  const std::int32_t label = labels[blockIdx.x];
  for (std::int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float q = expf(row[v] - m) * scale;
    row[v] = v == label ? q - scale : q;
  }
}

void k_linear_cross_entropy_lse(const KernelCall& c) {
  const LossChunks s = loss_chunks(c.inputs[0], c.inputs[1], *c.attrs);
  const float* h = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* logits = chunk_logits_scratch(c, s);
  for (std::int64_t first = 0; first < s.rows; first += s.chunk) {
    const std::int64_t count = std::min(s.chunk, s.rows - first);
    gemm_ld(false, true, count, s.vocab, s.width, h + first * s.width, s.width, w, s.width, logits, s.vocab, 0.0f);
    lse_rows_kernel<<<static_cast<unsigned>(count), kReduceThreads, 0, stream()>>>(logits, s.vocab, c.outputs[0].f32() + first);
    check_launch("linear_cross_entropy_lse");
  }
}

void k_linear_cross_entropy(const KernelCall& c) {
  const std::int64_t rows = (*c.inputs[0].shape)[0], width = (*c.inputs[0].shape)[1];
  auto* row_loss = static_cast<double*>(scratch(static_cast<std::size_t>(rows) * sizeof(double), "linear_cross_entropy"));
  label_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream()>>>(c.inputs[0].f32(), c.inputs[1].f32(), c.inputs[2].i32(),
                                                                            c.inputs[3].f32(), width, row_loss);
  check_launch("linear_cross_entropy");
  mean_rows_kernel<<<1, kReduceThreads, 0, stream()>>>(row_loss, rows, c.outputs[0].f32());
  check_launch("linear_cross_entropy");
}

void k_linear_cross_entropy_backward(const KernelCall& c) {
  const LossChunks s = loss_chunks(c.inputs[1], c.inputs[2], *c.attrs);
  const float* h = c.inputs[1].f32();
  const float* w = c.inputs[2].f32();
  const std::int32_t* labels = c.inputs[3].i32();
  const float* lse = c.inputs[4].f32();
  float* dh = c.outputs[0].f32();
  float* dw = dh + s.rows * s.width;
  float* p = chunk_logits_scratch(c, s);
  for (std::int64_t first = 0; first < s.rows; first += s.chunk) {
    const std::int64_t count = std::min(s.chunk, s.rows - first);
    gemm_ld(false, true, count, s.vocab, s.width, h + first * s.width, s.width, w, s.width, p, s.vocab, 0.0f);
    dlogits_rows_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream()>>>(c.inputs[0].f32(), labels + first, lse + first,
                                                                               s.vocab, s.rows, p);
    check_launch("linear_cross_entropy_backward");
    gemm_ld(false, false, count, s.width, s.vocab, p, s.vocab, w, s.width, dh + first * s.width, s.width, 0.0f);
    // dw = the first chunk's product, then each later chunk's added.
    gemm_ld(true, false, s.vocab, s.width, count, p, s.vocab, h + first * s.width, s.width, dw, s.width, first == 0 ? 0.0f : 1.0f);
  }
}

}  // namespace

KernelEntries fused_loss_kernel_entries() {
  return {{OpKind::linear_cross_entropy_lse, k_linear_cross_entropy_lse},
          {OpKind::linear_cross_entropy, k_linear_cross_entropy},
          {OpKind::linear_cross_entropy_backward, k_linear_cross_entropy_backward}};
}

}  // namespace memplan::kernels::cuda
