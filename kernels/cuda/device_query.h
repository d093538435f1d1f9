// CUDA device discovery, safe to call on machines without a GPU or driver (returns 0).
#pragma once

namespace memplan::kernels::cuda {

int device_count();

}  // namespace memplan::kernels::cuda
