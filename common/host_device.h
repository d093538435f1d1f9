// MEMPLAN_HD marks a function that both the host and a CUDA device run: `__host__ __device__`
// when nvcc compiles the file, nothing for a plain C++ compiler. Headers that hold arithmetic the
// CPU and CUDA kernels must share bit for bit (common/splitmix64.h, kernels/shared/) use it, so
// each rule is written once.
#pragma once

#ifdef __CUDACC__
#define MEMPLAN_HD __host__ __device__
#else
#define MEMPLAN_HD
#endif
