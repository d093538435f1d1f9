// GEMM-shaped ops through cuBLAS: matmul, batched matmul (attention) and the convolution GEMMs
// (forward, weight gradient, column gradient) on im2col columns. Row-major operands are passed
// to column-major cuBLAS as their transposes: C^T = op(B)^T op(A)^T.
#include <algorithm>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/quant.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

// The operations and leading dimensions cuBLAS (column-major) sees for row-major op(A) op(B).
struct ColumnMajor {
  cublasOperation_t op_a, op_b;
  int ld_a, ld_b;
};
ColumnMajor column_major(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k) {
  return {trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(trans_a ? m : k),
          static_cast<int>(trans_b ? k : n)};
}

// C[M,N] (+)= op(A) op(B) for `batch` matrices at the given element strides (0 = shared);
// row-major, A stored [M,K] or [K,M] (trans_a), B stored [K,N] or [N,K] (trans_b).
void gemm_batched(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t stride_a, const float* b, std::int64_t stride_b, float* c, std::int64_t stride_c,
                  std::int64_t batch, float beta) {
  const float alpha = 1.0f;
  const auto [op_a, op_b, ld_a, ld_b] = column_major(trans_a, trans_b, m, n, k);
  cublasHandle_t h = context().cublas;
  if (batch == 1) {
    MEMPLAN_CUBLAS_CHECK(cublas_api().sgemm(h, op_b, op_a, int(n), int(m), int(k), &alpha, b, ld_b, a, ld_a, &beta, c, int(n)));
  } else {
    MEMPLAN_CUBLAS_CHECK(cublas_api().sgemm_strided_batched(h, op_b, op_a, int(n), int(m), int(k), &alpha, b, ld_b, stride_b, a,
                                                   ld_a, stride_a, &beta, c, int(n), stride_c, int(batch)));
  }
}

void k_matmul(const KernelCall& c) {
  const graph::Shape& a = *c.inputs[0].shape;
  const graph::Shape& out = *c.outputs[0].shape;
  const std::int64_t k = c.attrs->trans_a ? a[0] : a[1];
  gemm_batched(c.attrs->trans_a, c.attrs->trans_b, out[0], out[1], k, c.inputs[0].f32(), 0, c.inputs[1].f32(), 0,
               c.outputs[0].f32(), 0, 1, 0.0f);
}

void k_batched_matmul(const KernelCall& c) {
  const graph::Shape& a = *c.inputs[0].shape;
  const graph::Shape& out = *c.outputs[0].shape;
  const int r = out.rank();
  const std::int64_t m = out[r - 2], n = out[r - 1];
  const std::int64_t k = c.attrs->trans_a ? a[r - 2] : a[r - 1];
  const std::int64_t batch = out.numel() / (m * n);
  gemm_batched(c.attrs->trans_a, c.attrs->trans_b, m, n, k, c.inputs[0].f32(), m * k, c.inputs[1].f32(), k * n,
               c.outputs[0].f32(), m * n, batch, 0.0f);
}

// quant_matmul (graph/quantize.h): the weight dequantized 64 rows at a time into the op's scratch
// with the arithmetic the CPU uses (kernels/shared/quant.h), each tile multiplied in by cuBLAS.
// trans_b: y[N, out] = x[N, in] W^T (each tile writes its own columns); else y[N, in] = x[N, out] W
// (the tiles' products summed in order).
void k_quant_matmul(const KernelCall& c) {
  const QuantView q = quant_view(c);
  MEMPLAN_CHECK(kernels_compute(q.format), "no CUDA kernel computes " << enum_name(graph::kQuantFormatNames, q.format) << " weights");
  const std::int64_t n = (*c.inputs[0].shape)[0];
  const std::int64_t tile_rows = std::min<std::int64_t>(64, q.out);
  MEMPLAN_CHECK(static_cast<std::int64_t>(c.workspace.size()) >= tile_rows * q.in * 4, "quant_matmul: the scratch was not planned");
  float* tile = reinterpret_cast<float*>(c.workspace.data());
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const float one = 1.0f;
  cublasHandle_t h = context().cublas;
  for (std::int64_t r0 = 0; r0 < q.out; r0 += tile_rows) {
    const std::int64_t rows = std::min(tile_rows, q.out - r0);
    const std::int64_t first = r0 * q.in;
    for_each_index(rows * q.in, "dequantize a weight tile", [=] __device__(std::int64_t i) { tile[i] = dequantize_element(q, first + i); });
    if (c.attrs->trans_b) {  // y[:, r0:r0+rows] = x tile^T
      const float zero = 0.0f;
      MEMPLAN_CUBLAS_CHECK(cublas_api().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n), int(q.in), &one, tile, int(q.in), x,
                                              int(q.in), &zero, y + r0, int(q.out)));
    } else {  // y += x[:, r0:r0+rows] tile
      const float beta = r0 == 0 ? 0.0f : 1.0f;
      MEMPLAN_CUBLAS_CHECK(cublas_api().sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, int(q.in), int(n), int(rows), &one, tile, int(q.in),
                                              x + r0, int(q.out), &beta, y, int(q.in)));
    }
  }
}

// y[n] [Cout, P] = w [Cout, CKK] cols[n] [CKK, P]: one strided-batched GEMM, w shared.
void k_conv2d(const KernelCall& c) {
  const graph::Shape& cs = *c.inputs[0].shape;
  const std::int64_t n = cs[0], ckk = cs[1], p = cs[2];
  const std::int64_t cout = (*c.inputs[1].shape)[0];
  gemm_batched(false, false, cout, p, ckk, c.inputs[1].f32(), 0, c.inputs[0].f32(), ckk * p, c.outputs[0].f32(),
               cout * p, n, 0.0f);
}

// dcols[n] [CKK, P] = w^T dy[n].
void k_conv2d_backward_cols(const KernelCall& c) {
  const graph::Shape& ds = *c.outputs[0].shape;
  const std::int64_t n = ds[0], ckk = ds[1], p = ds[2];
  const std::int64_t cout = (*c.inputs[1].shape)[0];
  gemm_batched(true, false, ckk, p, cout, c.inputs[1].f32(), 0, c.inputs[0].f32(), cout * p, c.outputs[0].f32(),
               ckk * p, n, 0.0f);
}

// out[e] (+)= partials[0][e] + partials[1][e] + ... in that order.
__global__ void sum_partials_kernel(const float* partials, std::int64_t count, std::int64_t size, bool accumulate,
                                    float* out) {
  MEMPLAN_GRID_STRIDE(e, size) {
    float s = accumulate ? out[e] : 0.0f;
    for (std::int64_t i = 0; i < count; ++i) s += partials[i * size + e];
    out[e] = s;
  }
}

// dw [Cout, CKK] = sum_n dy[n] [Cout, P] cols[n]^T, samples summed in order, so the result does
// not depend on the run. One strided-batched GEMM writes as many samples' products as the
// scratch holds, a kernel adds them to dw; a GEMM per sample (accumulating with beta = 1) costs
// a launch each, which dominated the CNN's step.
void k_conv2d_backward_weight(const KernelCall& c) {
  const graph::Shape& cs = *c.inputs[1].shape;
  const std::int64_t n = cs[0], ckk = cs[1], p = cs[2];
  const std::int64_t cout = (*c.inputs[0].shape)[1];
  const float* dy = c.inputs[0].f32();
  const float* cols = c.inputs[1].f32();
  float* dw = c.outputs[0].f32();
  const std::int64_t size = cout * ckk;
  const auto per_sample = static_cast<std::size_t>(size) * sizeof(float);
  const std::int64_t chunk = std::min<std::int64_t>(n, static_cast<std::int64_t>(scratch_capacity() / per_sample));
  if (chunk < 2) {  // a layer whose gradient alone fills the scratch
    for (std::int64_t i = 0; i < n; ++i) {
      gemm_batched(false, true, cout, ckk, p, dy + i * cout * p, 0, cols + i * ckk * p, 0, dw, 0, 1,
                   i == 0 && !c.accumulate ? 0.0f : 1.0f);
    }
    return;
  }
  auto* partials = static_cast<float*>(scratch(static_cast<std::size_t>(chunk) * per_sample, "conv2d_backward_weight"));
  for (std::int64_t first = 0; first < n; first += chunk) {
    const std::int64_t count = std::min(chunk, n - first);
    gemm_batched(false, true, cout, ckk, p, dy + first * cout * p, cout * p, cols + first * ckk * p, ckk * p, partials,
                 size, count, 0.0f);
    sum_partials_kernel<<<blocks_for(size), kThreads, 0, stream()>>>(partials, count, size, first > 0 || c.accumulate, dw);
    check_launch("conv2d_backward_weight");
  }
}

// --- 16 bits: bf16 or f16 operands on tensor cores, f32 accumulation ----------------------------

cudaDataType cuda_type(graph::DType d) {
  switch (d) {
    case graph::DType::bf16: return CUDA_R_16BF;
    case graph::DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// gemm_batched at each operand's own dtype (16 or 32 bits), computed in f32: cuBLAS rounds C once.
void gemm_batched_ex(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const TensorRef& a,
                     std::int64_t stride_a, const TensorRef& b, std::int64_t stride_b, const TensorRef& c,
                     std::int64_t stride_c, std::int64_t batch) {
  const float alpha = 1.0f, beta = 0.0f;
  const auto [op_a, op_b, ld_a, ld_b] = column_major(trans_a, trans_b, m, n, k);
  cublasHandle_t h = context().cublas;
  if (batch == 1) {
    MEMPLAN_CUBLAS_CHECK(cublas_api().gemm_ex(h, op_b, op_a, int(n), int(m), int(k), &alpha, b.data, cuda_type(b.dtype), ld_b,
                                              a.data, cuda_type(a.dtype), ld_a, &beta, c.data, cuda_type(c.dtype), int(n),
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    MEMPLAN_CUBLAS_CHECK(cublas_api().gemm_strided_batched_ex(
        h, op_b, op_a, int(n), int(m), int(k), &alpha, b.data, cuda_type(b.dtype), ld_b, stride_b, a.data, cuda_type(a.dtype),
        ld_a, stride_a, &beta, c.data, cuda_type(c.dtype), int(n), stride_c, int(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
}

void k_matmul_16(const KernelCall& c) {
  const graph::Shape& a = *c.inputs[0].shape;
  const graph::Shape& out = *c.outputs[0].shape;
  const std::int64_t k = c.attrs->trans_a ? a[0] : a[1];
  gemm_batched_ex(c.attrs->trans_a, c.attrs->trans_b, out[0], out[1], k, c.inputs[0], 0, c.inputs[1], 0, c.outputs[0], 0, 1);
}

void k_batched_matmul_16(const KernelCall& c) {
  const graph::Shape& a = *c.inputs[0].shape;
  const graph::Shape& out = *c.outputs[0].shape;
  const int r = out.rank();
  const std::int64_t m = out[r - 2], n = out[r - 1];
  const std::int64_t k = c.attrs->trans_a ? a[r - 2] : a[r - 1];
  gemm_batched_ex(c.attrs->trans_a, c.attrs->trans_b, m, n, k, c.inputs[0], m * k, c.inputs[1], k * n, c.outputs[0], m * n,
                  out.numel() / (m * n));
}

}  // namespace

KernelEntries blas_16bit_kernel_entries() {
  KernelEntries entries;
  for (graph::DType d : {graph::DType::bf16, graph::DType::f16}) {
    entries.push_back({OpKind::matmul, k_matmul_16, d});
    entries.push_back({OpKind::batched_matmul, k_batched_matmul_16, d});
  }
  return entries;
}

KernelEntries blas_kernel_entries() {
  return {
      {OpKind::matmul, k_matmul},
      {OpKind::batched_matmul, k_batched_matmul},
      {OpKind::conv2d, k_conv2d},
      {OpKind::conv2d_backward_cols, k_conv2d_backward_cols},
      {OpKind::conv2d_backward_weight, k_conv2d_backward_weight},
      {OpKind::quant_matmul, k_quant_matmul},
  };
}

}  // namespace memplan::kernels::cuda
