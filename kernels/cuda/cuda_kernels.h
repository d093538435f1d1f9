// CUDA implementations of the ops CUDA training runs, registered in the same dispatch table
// (kernels::missing_kernels(DeviceKind::cuda) lists the rest: the LLaMA-style ops the zoo plans
// and the collectives, which GPU ranks do not run yet). Each file lists its entries beside its
// kernels; kernels run on the context's one stream and take their
// scratch from the workspace inside the arena.
#pragma once

#include <vector>

#include "memplan/kernels/kernel.h"

namespace memplan::kernels::cuda {

KernelEntries kernel_entries();
KernelEntries elementwise_kernel_entries();  // elementwise.cu
KernelEntries reduction_kernel_entries();    // reduce.cu
KernelEntries nn_kernel_entries();           // nn.cu
KernelEntries blas_kernel_entries();         // blas.cu
KernelEntries blas_16bit_kernel_entries();   // blas.cu: bf16/f16 GEMMs on tensor cores
KernelEntries attention_kernel_entries();    // attention.cu (fused attention, slice)
// The same kernels at bf16 and f16 where one body computes every dtype (reading 16 bits into f32
// registers and rounding each output once), and the loss read from 16-bit logits.
KernelEntries elementwise_16bit_kernel_entries();
KernelEntries reduction_16bit_kernel_entries();
KernelEntries nn_16bit_kernel_entries();
KernelEntries attention_16bit_kernel_entries();
KernelEntries decode_kernel_entries();       // decode.cu
KernelEntries fused_loss_kernel_entries();   // fused_loss.cu (the fused projection and cross-entropy)
KernelEntries optimizer_8bit_kernel_entries();        // optimizer_8bit.cu: 8-bit AdamW at f32
KernelEntries optimizer_8bit_16bit_kernel_entries();  // and its mixed update at bf16 and f16
// mixed_precision.cu: the 16-bit kernels (the GEMMs' from blas.cu among them) and the adapter
// computing every other op at 16 bits in f32 copies.
KernelEntries native_16bit_kernel_entries();
KernelEntries widened_kernel_entries();

}  // namespace memplan::kernels::cuda
