// The CUDA execution context shared by every CUDA kernel: one stream, one cuBLAS handle, one
// cuDNN handle and the kernel workspace (a buffer the runtime places inside the arena). Created
// once, on first use, by the CUDA device; kernels never allocate device memory themselves.
// Plain C++ (compiled by nvcc and by the host compiler alike).
#pragma once

#include <cstddef>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "memplan/common/check.h"
#include "memplan/kernels/cuda/cublas_loader.h"
#include "memplan/kernels/kernel.h"

namespace memplan::kernels::cuda {

struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  // Inside the arena. Its first half is cuBLAS's workspace, its second the kernels' scratch: a
  // kernel may keep scratch across a cuBLAS call it makes (the convolution weight gradient's
  // per-sample products), so the two never share bytes.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// The process-wide context (device 0). The first call creates the stream and library handles.
Context& context();
bool context_created();

// Points cuBLAS and the kernels at their workspace; nullptr/0 detaches it (before the arena
// that holds it is freed).
void set_workspace(void* ptr, std::size_t size_bytes);

// Bytes the kernels want as workspace: 16 MiB for cuBLAS and 16 MiB of scratch (one double per
// softmax-cross-entropy row; per-sample weight-gradient products, as many samples as fit).
inline constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

// Scratch for a kernel: the workspace's second half, checked to be large enough.
void* scratch(std::size_t size_bytes, const char* op);
std::size_t scratch_capacity();

std::string error_string(cudaError_t status);

// fp32 GEMMs in TF32 on tensor cores (10-bit mantissa inputs, f32 accumulation) or in full fp32,
// the default (as PyTorch's torch.backends.cuda.matmul.allow_tf32 = False).
void set_tf32(bool allowed);

// Every CUDA kernel at f32 (the lists of the kernel files): what the widening adapter computes in.
KernelEntries f32_kernel_entries();

}  // namespace memplan::kernels::cuda

#define MEMPLAN_CUDA_CHECK(expr)                                                                 \
  do {                                                                                           \
    const cudaError_t memplan_cuda_status_ = (expr);                                             \
    MEMPLAN_CHECK(memplan_cuda_status_ == cudaSuccess,                                           \
                  "CUDA error " << ::memplan::kernels::cuda::error_string(memplan_cuda_status_)); \
  } while (0)

#define MEMPLAN_CUBLAS_CHECK(expr)                                                         \
  do {                                                                                     \
    const cublasStatus_t memplan_cublas_status_ = (expr);                                  \
    MEMPLAN_CHECK(memplan_cublas_status_ == CUBLAS_STATUS_SUCCESS,                         \
                  "cuBLAS error " << ::memplan::kernels::cuda::cublas_api().status_string(memplan_cublas_status_)); \
  } while (0)

#define MEMPLAN_CUDNN_CHECK(expr)                                                          \
  do {                                                                                     \
    const cudnnStatus_t memplan_cudnn_status_ = (expr);                                    \
    MEMPLAN_CHECK(memplan_cudnn_status_ == CUDNN_STATUS_SUCCESS,                           \
                  "cuDNN error " << cudnnGetErrorString(memplan_cudnn_status_));           \
  } while (0)
