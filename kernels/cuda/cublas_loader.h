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
};

// Loads libcublas on the first call (thread-safe) and returns its entry points. Throws an
// InternalError (a failed MEMPLAN_CHECK) naming the library and the loader's reason when it
// cannot be loaded.
const CublasApi& cublas_api();

// Whether cublas_api() has loaded the library in this process (tests: CPU runs must not).
bool cublas_loaded();

}  // namespace memplan::kernels::cuda
