// CUDA implementations of every op that has a CPU kernel but the LLaMA-style ones (RMSNorm, SiLU,
// rotary, repeat_heads, concat and their backward ops: the zoo plans them, nothing trains
// them; tests/cuda_kernels_test.cpp keeps that list), registered in the same dispatch table.
// Each file contributes its entries; kernels run on the context's one stream and take their
// scratch from the workspace inside the arena.
#pragma once

#include <utility>
#include <vector>

#include "memplan/kernels/kernel.h"

namespace memplan::kernels::cuda {

using KernelEntries = std::vector<std::pair<graph::OpKind, KernelFn>>;

KernelEntries kernel_entries();
KernelEntries elementwise_kernel_entries();  // elementwise.cu
KernelEntries reduction_kernel_entries();    // reduce.cu
KernelEntries nn_kernel_entries();           // nn.cu
KernelEntries blas_kernel_entries();         // blas.cu
KernelEntries attention_kernel_entries();    // attention.cu (fused attention, slice)
KernelEntries decode_kernel_entries();       // decode.cu

}  // namespace memplan::kernels::cuda
