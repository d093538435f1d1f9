// cuBLAS, loaded on first use rather than linked. libcublas pulls in libcublasLt (about 500 MB),
// and mapping and relocating it costs a third of a second at every process start — paid by every
// `memplan plan`/`fit` on a CPU-only machine and by every test process. Loading it with dlopen
// when the CUDA context is created leaves CPU runs untouched. Only the calls memplan makes are
// resolved; their types come from cuBLAS's own header, so a signature change fails to compile.
#pragma once

#include <cublas_v2.h>

namespace memplan::kernels::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  decltype(&cublasGetStatusString) status_string;
  // The mixed-precision GEMMs (16-bit operands, f32 accumulation). cuBLAS's header overloads these
  // names for C++, so the C entry points' types are spelled out.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
                            cudaDataType, int, const void*, cudaDataType, int, const void*, void*, cudaDataType, int,
                            cublasComputeType_t, cublasGemmAlgo_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                            const void*, cudaDataType, int, long long int, const void*, cudaDataType, int,
                                            long long int, const void*, void*, cudaDataType, int, long long int, int,
                                            cublasComputeType_t, cublasGemmAlgo_t);
};

// Loads libcublas on the first call (thread-safe) and returns its entry points. Throws an
// InternalError (a failed MEMPLAN_CHECK) naming the library and the loader's reason when it
// cannot be loaded.
const CublasApi& cublas_api();

// Whether cublas_api() has loaded the library in this process (tests: CPU runs must not).
bool cublas_loaded();

}  // namespace memplan::kernels::cuda
