#include "memplan/planner/device_profile.h"

#include <algorithm>

namespace memplan::planner {

namespace {
constexpr Bytes kMiB = Bytes{1} << 20;
}

Bytes DeviceProfile::overhead_bytes() const {
  Bytes total = 0;
  for (const Overhead& o : overheads) total += o.bytes;
  return total;
}

Bytes DeviceProfile::total_bytes(Bytes arena_bytes) const {
  return align_up(arena_bytes, std::max<Bytes>(alignment, 1)) + overhead_bytes();
}

Bytes DeviceProfile::arena_budget(Bytes device_memory) const {
  const Bytes left = device_memory - overhead_bytes();
  if (left <= 0) return 0;
  return left / std::max<Bytes>(alignment, 1) * std::max<Bytes>(alignment, 1);
}

Result<DeviceProfile> documented_device_profile(std::string_view kind) {
  // The ops each backend computes at 16 bits natively (kernels::native_16bit_ops; the kernel
  // dispatch test checks these lists against the backends').
  using graph::OpKind;
  if (kind == "cpu") {
    DeviceProfile p;
    p.native_16bit_ops = {OpKind::grads_finite, OpKind::embedding,  OpKind::softmax_cross_entropy,
                          OpKind::pack,         OpKind::all_gather, OpKind::all_gather_into, OpKind::to_host,
                          OpKind::cast,         OpKind::all_to_all};
    return p;
  }
  if (kind == "cuda") {
    DeviceProfile p;
    p.name = "cuda";
    p.workspace_bytes = kCudaWorkspaceBytes;
    // GEMMs on tensor cores, fused attention, layer norm, softmax, the loss and its gradient, the
    // elementwise ops, the embedding gather, the updates and the overflow check read 16 bits;
    // the rest (convolutions, pooling, batch norm, the column sums of bias gradients, the rotary
    // decoders' own ops) widen.
    p.native_16bit_ops = {
        OpKind::matmul,           OpKind::batched_matmul,   OpKind::embedding,        OpKind::grads_finite,
        OpKind::softmax_cross_entropy, OpKind::softmax_cross_entropy_backward, OpKind::sgd_update_mixed,
        OpKind::sgd_momentum_update_mixed, OpKind::adamw_update_mixed, OpKind::adamw8bit_update_mixed,
        OpKind::attention_lse,    OpKind::attention,        OpKind::attention_backward_dot, OpKind::attention_backward,
        OpKind::slice,            OpKind::layer_norm_stats, OpKind::layer_norm,       OpKind::layer_norm_backward,
        OpKind::layer_norm_dgamma, OpKind::softmax,         OpKind::softmax_backward,
        OpKind::bias_add,         OpKind::add,              OpKind::mul,              OpKind::scale,
        OpKind::relu,             OpKind::relu_backward,    OpKind::gelu,             OpKind::gelu_backward,
        OpKind::sigmoid,          OpKind::sigmoid_backward, OpKind::tanh,             OpKind::tanh_backward,
        OpKind::silu,             OpKind::silu_backward,    OpKind::swiglu,           OpKind::clip,
        OpKind::clip_backward,    OpKind::broadcast_scalar, OpKind::fill,             OpKind::dropout_mask,
        OpKind::cast};
    // Measured on an H200 (driver 580.159, CUDA 13.0; bench/gpu/run.sh): the device memory in use
    // after a training step, less what the step's cudaMalloc took, was 603-607 MiB over four
    // models. These 610 MiB cover each with 0.3-3.6 MiB to spare.
    p.overheads = {{"CUDA context", 586 * kMiB}, {"cuBLAS handle", 8 * kMiB}, {"cuDNN handle", 16 * kMiB}};
    return p;
  }
  return Error{"unknown device kind '" + std::string(kind) + "' (expected cuda or cpu)"};
}

}  // namespace memplan::planner
