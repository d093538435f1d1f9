// CPU kernels of the data-parallel ops: pack lays gradients out rank-major for the collectives,
// which hand their buffers to the executor's communicator (MPI between processes, or the
// single-process one). Element-wise work after a reduction (the 1/world scale) is done here so
// every rank computes it identically.
#include <cstring>

#include "memplan/common/check.h"
#include "memplan/dist/communicator.h"
#include "memplan/dist/shard.h"
#include "memplan/kernels/cpu/cpu_kernels.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

dist::Communicator& communicator_of(const KernelCall& c) {
  MEMPLAN_CHECK(c.communicator != nullptr, graph::op_name(c.kind) << " needs a communicator (the executor's)");
  MEMPLAN_CHECK(c.communicator->world_size() == c.attrs->world,
                graph::op_name(c.kind) << " was planned for " << c.attrs->world << " ranks but runs on "
                                       << c.communicator->world_size());
  return *c.communicator;
}

void scale_in_place(float* x, std::int64_t n, float alpha) {
  if (alpha == 1.0f) return;
  for (std::int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

void k_pack(const KernelCall& c) {
  const int world = static_cast<int>(c.attrs->world);
  const std::int64_t chunk = c.outputs[0].numel() / world;
  float* out = c.outputs[0].f32();
  for (int r = 0; r < world; ++r) {
    float* dst = out + r * chunk;
    for (const TensorRef& x : c.inputs) {
      const dist::ShardRange range = dist::shard_range(x.numel(), world, r);
      const std::int64_t s = dist::shard_size(x.numel(), world);
      std::memcpy(dst, x.f32() + range.offset, static_cast<std::size_t>(range.count) * sizeof(float));
      std::memset(dst + range.count, 0, static_cast<std::size_t>(s - range.count) * sizeof(float));
      dst += s;
    }
  }
}

void k_all_reduce(const KernelCall& c) {
  dist::Communicator& comm = communicator_of(c);
  float* y = c.outputs[0].f32();  // a view of the input: reduced in place
  comm.all_reduce_sum(y, c.outputs[0].numel(), dist::ElementType::f32);
  scale_in_place(y, c.outputs[0].numel(), c.attrs->alpha);
}

void k_reduce_scatter(const KernelCall& c) {
  dist::Communicator& comm = communicator_of(c);
  float* y = c.outputs[0].f32();
  comm.reduce_scatter_sum(c.inputs[0].f32(), y, c.outputs[0].numel(), dist::ElementType::f32);
  scale_in_place(y, c.outputs[0].numel(), c.attrs->alpha);
}

void k_all_gather(const KernelCall& c) {
  communicator_of(c).all_gather_shards(c.inputs[0].f32(), c.outputs[0].f32(), c.outputs[0].numel(),
                                       dist::ElementType::f32);
}

void k_all_gather_into(const KernelCall& c) {
  communicator_of(c).all_gather_shards(nullptr, c.updates[0].f32(), c.updates[0].numel(), dist::ElementType::f32);
}

}  // namespace

KernelEntries collective_kernel_entries() {
  return {
      {OpKind::pack, k_pack},
      {OpKind::all_reduce, k_all_reduce},
      {OpKind::reduce_scatter, k_reduce_scatter},
      {OpKind::all_gather, k_all_gather},
      {OpKind::all_gather_into, k_all_gather_into},
  };
}

}  // namespace memplan::kernels::cpu
