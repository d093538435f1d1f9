// CPU kernels of the data-parallel ops: pack lays gradients out rank-major for the collectives,
// which hand their buffers to the executor's communicator (MPI between processes, or the
// single-process one). Element-wise work after a reduction (the 1/world scale) is done here so
// every rank computes it identically. At bf16 and f16 the wire carries 16 bits, as DeepSpeed's
// ZeRO does: packs and gathers move 16-bit values as they are, and a sum across ranks exchanges
// each rank's 16-bit chunks (all_to_all) and adds them in f32 in rank order, rounding once
// (graph::op_widening sizes the exchange buffers, which the plan's workspace holds).
#include <cstring>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/dist/communicator.h"
#include "memplan/dist/shard.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/half.h"

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

// At any dtype: bytes moved as they are.
void k_pack(const KernelCall& c) {
  const int world = static_cast<int>(c.attrs->world);
  const std::int64_t chunk = c.outputs[0].numel() / world;
  const auto es = static_cast<std::size_t>(graph::dtype_size(c.outputs[0].dtype));
  auto* out = static_cast<std::byte*>(c.outputs[0].data);
  for (int r = 0; r < world; ++r) {
    std::byte* dst = out + static_cast<std::size_t>(r * chunk) * es;
    for (const TensorRef& x : c.inputs) {
      const dist::ShardRange range = dist::shard_range(x.numel(), world, r);
      const std::int64_t s = dist::shard_size(x.numel(), world);
      std::memcpy(dst, static_cast<const std::byte*>(x.data) + static_cast<std::size_t>(range.offset) * es,
                  static_cast<std::size_t>(range.count) * es);
      std::memset(dst + static_cast<std::size_t>(range.count) * es, 0, static_cast<std::size_t>(s - range.count) * es);
      dst += static_cast<std::size_t>(s) * es;
    }
  }
}

dist::ElementType element_type(graph::DType dtype) {
  return graph::is_16bit_float(dtype) ? dist::ElementType::u16 : dist::ElementType::f32;
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
  communicator_of(c).all_gather_shards(c.inputs[0].data, c.outputs[0].data, c.outputs[0].numel(),
                                       element_type(c.outputs[0].dtype));
}

void k_all_gather_into(const KernelCall& c) {
  communicator_of(c).all_gather_shards(nullptr, c.updates[0].data, c.updates[0].numel(), element_type(c.updates[0].dtype));
}

// At any dtype: the chunks move as they are.
void k_all_to_all(const KernelCall& c) {
  dist::Communicator& comm = communicator_of(c);
  comm.all_to_all(c.inputs[0].data, c.outputs[0].data, c.outputs[0].numel() / c.attrs->world,
                  element_type(c.outputs[0].dtype));
}

// --- 16-bit sums across ranks -----------------------------------------------------------------------

// The exchange buffers, carved out of the workspace in graph::op_widening's order.
std::uint16_t* exchange_buffer(const KernelCall& c, std::int64_t offset_elements, std::int64_t elements) {
  const auto bytes = static_cast<std::size_t>((offset_elements + elements) * 2);
  MEMPLAN_CHECK(c.workspace.size() >= bytes, graph::op_name(c.kind) << " at 16 bits needs " << bytes
                                                                    << " bytes of workspace for its exchange, the plan holds "
                                                                    << c.workspace.size());
  return reinterpret_cast<std::uint16_t*>(c.workspace.data()) + offset_elements;
}

// out[i] = round(alpha * sum over ranks r of chunks[r * chunk + i]), summed in f32 in rank order.
void sum_chunks(graph::DType dtype, const std::uint16_t* chunks, int world, std::int64_t chunk, float alpha,
                std::uint16_t* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    float s = 0.0f;
    for (int r = 0; r < world; ++r) {
      const std::uint16_t h = chunks[static_cast<std::size_t>(r) * static_cast<std::size_t>(chunk) + static_cast<std::size_t>(i)];
      s += dtype == graph::DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    if (alpha != 1.0f) s *= alpha;
    out[i] = dtype == graph::DType::bf16 ? f32_to_bf16(s) : f32_to_f16(s);
  }
}

// Each rank receives every rank's chunk of its own shard and sums them.
void k_reduce_scatter_16bit(const KernelCall& c) {
  dist::Communicator& comm = communicator_of(c);
  const int world = comm.world_size();
  const std::int64_t chunk = c.outputs[0].numel();
  std::uint16_t* received = exchange_buffer(c, 0, world * chunk);
  comm.all_to_all(c.inputs[0].data, received, chunk, dist::ElementType::u16);
  sum_chunks(c.outputs[0].dtype, received, world, chunk, c.attrs->alpha, static_cast<std::uint16_t*>(c.outputs[0].data), chunk);
}

// A reduce-scatter over shards of the flat tensor (padded to world * shard_size), then the summed
// shards gathered in place: every rank ends with the same bits.
void k_all_reduce_16bit(const KernelCall& c) {
  dist::Communicator& comm = communicator_of(c);
  const int world = comm.world_size();
  const std::int64_t n = c.outputs[0].numel();
  const std::int64_t chunk = dist::shard_size(n, world);
  auto* y = static_cast<std::uint16_t*>(c.outputs[0].data);  // a view of the input: reduced in place
  std::uint16_t* sent = exchange_buffer(c, 0, world * chunk);
  std::uint16_t* received = exchange_buffer(c, world * chunk, world * chunk);
  std::memcpy(sent, y, static_cast<std::size_t>(n) * 2);
  std::memset(sent + n, 0, static_cast<std::size_t>(world * chunk - n) * 2);
  comm.all_to_all(sent, received, chunk, dist::ElementType::u16);
  const dist::ShardRange mine = dist::shard_range(n, world, comm.rank());
  sum_chunks(c.outputs[0].dtype, received, world, chunk, c.attrs->alpha, y + mine.offset, mine.count);
  comm.all_gather_shards(nullptr, y, n, dist::ElementType::u16);
}

}  // namespace

KernelEntries collective_16bit_kernel_entries() {
  KernelEntries entries;
  for (graph::DType d : {graph::DType::bf16, graph::DType::f16}) {
    entries.push_back({OpKind::pack, k_pack, d});
    entries.push_back({OpKind::all_gather, k_all_gather, d});
    entries.push_back({OpKind::all_gather_into, k_all_gather_into, d});
    entries.push_back({OpKind::all_to_all, k_all_to_all, d});
  }
  return entries;
}

KernelEntries collective_exchange_kernel_entries() {
  KernelEntries entries;
  for (graph::DType d : {graph::DType::bf16, graph::DType::f16}) {
    entries.push_back({OpKind::all_reduce, k_all_reduce_16bit, d});
    entries.push_back({OpKind::reduce_scatter, k_reduce_scatter_16bit, d});
  }
  return entries;
}

KernelEntries collective_kernel_entries() {
  return {
      {OpKind::pack, k_pack},
      {OpKind::all_reduce, k_all_reduce},
      {OpKind::reduce_scatter, k_reduce_scatter},
      {OpKind::all_gather, k_all_gather},
      {OpKind::all_gather_into, k_all_gather_into},
      {OpKind::all_to_all, k_all_to_all},
  };
}

}  // namespace memplan::kernels::cpu
