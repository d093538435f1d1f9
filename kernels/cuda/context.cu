// The CUDA context: created on first use, lives for the process (the driver reclaims it at exit;
// destroying handles from a static destructor would race the CUDA runtime's own teardown).
#include <mutex>

#include "memplan/kernels/cuda/context.h"
#include "memplan/kernels/cuda/cublas_loader.h"
#include "memplan/kernels/cuda/cuda_kernels.h"

namespace memplan::kernels::cuda {

namespace {
Context* g_context = nullptr;
std::once_flag g_once;
}  // namespace

std::string error_string(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

Context& context() {
  std::call_once(g_once, [] {
    auto* ctx = new Context();
    MEMPLAN_CUDA_CHECK(cudaSetDevice(ctx->device));
    MEMPLAN_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    const CublasApi& blas = cublas_api();
    MEMPLAN_CUBLAS_CHECK(blas.create(&ctx->cublas));
    MEMPLAN_CUBLAS_CHECK(blas.set_stream(ctx->cublas, ctx->stream));
    // Plain FP32 GEMMs (no TF32), as the CPU computes and as PyTorch does by default.
    MEMPLAN_CUBLAS_CHECK(blas.set_math_mode(ctx->cublas, CUBLAS_DEFAULT_MATH));
    MEMPLAN_CUDNN_CHECK(cudnnCreate(&ctx->cudnn));
    MEMPLAN_CUDNN_CHECK(cudnnSetStream(ctx->cudnn, ctx->stream));
    g_context = ctx;
  });
  return *g_context;
}

bool context_created() { return g_context != nullptr; }

void set_workspace(void* ptr, std::size_t size_bytes) {
  Context& ctx = context();
  if (ptr == ctx.workspace && (ptr == nullptr || size_bytes == ctx.workspace_bytes)) return;
  MEMPLAN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // no kernel may still use the old one
  ctx.workspace = ptr;
  ctx.workspace_bytes = ptr == nullptr ? 0 : size_bytes;
  // Without a workspace of ours cuBLAS would allocate its own; with one it allocates nothing.
  // Its half is rounded down to 256 bytes, the alignment cuBLAS asks of a workspace.
  MEMPLAN_CUBLAS_CHECK(cublas_api().set_workspace(ctx.cublas, ptr, ctx.workspace_bytes / 2 / 256 * 256));
}

std::size_t scratch_capacity() {
  const Context& ctx = context();
  return ctx.workspace_bytes - ctx.workspace_bytes / 2 / 256 * 256;
}

void* scratch(std::size_t size_bytes, const char* op) {
  const Context& ctx = context();
  MEMPLAN_CHECK(ctx.workspace != nullptr && size_bytes <= scratch_capacity(),
                "op '" << op << "' needs " << size_bytes << " bytes of CUDA scratch, the plan's workspace holds "
                       << scratch_capacity());
  return static_cast<char*>(ctx.workspace) + ctx.workspace_bytes / 2 / 256 * 256;
}

void set_tf32(bool allowed) {
  MEMPLAN_CUBLAS_CHECK(cublas_api().set_math_mode(context().cublas, allowed ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

KernelEntries f32_kernel_entries() {
  KernelEntries all = elementwise_kernel_entries();
  for (KernelEntries part : {reduction_kernel_entries(), nn_kernel_entries(), blas_kernel_entries(),
                             attention_kernel_entries(), decode_kernel_entries(), fused_loss_kernel_entries(),
                             optimizer_8bit_kernel_entries()}) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

KernelEntries kernel_entries() {
  KernelEntries all = f32_kernel_entries();
  for (KernelEntries part : {native_16bit_kernel_entries(), widened_kernel_entries()}) all.insert(all.end(), part.begin(), part.end());
  return all;
}

}  // namespace memplan::kernels::cuda
