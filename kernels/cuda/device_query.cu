// The CUDA backend's entry point into the build: device discovery. The CUDA kernels and the
// CUDA device (one cudaMalloc arena, cuBLAS/cuDNN) grow here; CPU-only builds omit this folder.
#include <cuda_runtime.h>

#include "memplan/kernels/cuda/device_query.h"

namespace memplan::kernels::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;  // no driver or no device
  return count;
}

}  // namespace memplan::kernels::cuda
