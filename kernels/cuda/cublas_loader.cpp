#include "memplan/kernels/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "memplan/common/check.h"

namespace memplan::kernels::cuda {
namespace {

#define MEMPLAN_STRINGIFY_EXPANDED(x) MEMPLAN_STRINGIFY(x)
#define MEMPLAN_STRINGIFY(x) #x

CublasApi g_api;
std::atomic<bool> g_loaded{false};
std::once_flag g_once;

template <typename Fn>
void resolve(void* library, const char* library_name, const char* symbol, Fn& out) {
  dlerror();
  void* address = dlsym(library, symbol);
  const char* error = dlerror();
  MEMPLAN_CHECK(error == nullptr && address != nullptr,
                "cuBLAS library " << library_name << " has no symbol " << symbol << ": "
                                  << (error != nullptr ? error : "null address"));
  out = reinterpret_cast<Fn>(address);
}

void load() {
  // The toolkit's library found at build time first, then the versioned name through the
  // loader's search path (a runtime-only install has no unversioned symlink).
  const std::vector<std::string> candidates = {
#ifdef MEMPLAN_CUBLAS_LIBRARY
      MEMPLAN_CUBLAS_LIBRARY,
#endif
      "libcublas.so." MEMPLAN_STRINGIFY_EXPANDED(CUBLAS_VER_MAJOR), "libcublas.so"};
  void* library = nullptr;
  std::string reasons;
  std::string loaded_name;
  for (const std::string& name : candidates) {
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      loaded_name = name;
      break;
    }
    const char* error = dlerror();
    reasons += "\n  " + name + ": " + (error != nullptr ? error : "not found");
  }
  MEMPLAN_CHECK(library != nullptr, "cannot load cuBLAS, which the CUDA backend needs for matrix products (tried:"
                                        << reasons << "); install the CUDA toolkit's cuBLAS or run with --device cpu");
  const char* name = loaded_name.c_str();
  // cublas_v2.h maps the plain names onto the _v2 entry points; stringifying after expansion
  // asks dlsym for the symbols the header would have linked against.
  resolve(library, name, MEMPLAN_STRINGIFY_EXPANDED(cublasCreate), g_api.create);
  resolve(library, name, MEMPLAN_STRINGIFY_EXPANDED(cublasSetStream), g_api.set_stream);
  resolve(library, name, MEMPLAN_STRINGIFY_EXPANDED(cublasSetMathMode), g_api.set_math_mode);
  resolve(library, name, MEMPLAN_STRINGIFY_EXPANDED(cublasSetWorkspace), g_api.set_workspace);
  resolve(library, name, MEMPLAN_STRINGIFY_EXPANDED(cublasSgemm), g_api.sgemm);
  resolve(library, name, MEMPLAN_STRINGIFY_EXPANDED(cublasSgemmStridedBatched), g_api.sgemm_strided_batched);
  resolve(library, name, MEMPLAN_STRINGIFY_EXPANDED(cublasGetStatusString), g_api.status_string);
  resolve(library, name, "cublasGemmEx", g_api.gemm_ex);
  resolve(library, name, "cublasGemmStridedBatchedEx", g_api.gemm_strided_batched_ex);
  g_loaded = true;  // the library stays loaded for the process's lifetime
}

}  // namespace

const CublasApi& cublas_api() {
  std::call_once(g_once, load);
  return g_api;
}

bool cublas_loaded() { return g_loaded; }

}  // namespace memplan::kernels::cuda
