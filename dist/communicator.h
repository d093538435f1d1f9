// Collective communication between the ranks of a data-parallel run, behind one interface:
// the single-process communicator (world 1, no MPI), MPI (CPU buffers; mpi_communicator.h) and
// NCCL (GPU buffers; nccl_communicator.h). Buffers are typed (element type + count); calls are
// blocking: a buffer may be read or reused when the call returns. Not a transport of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "memplan/common/result.h"

namespace memplan::dist {

// u16: bf16 or f16 values, moved as they are (all_to_all, all_gather_shards, broadcast); the
// communicator never sums them: 16-bit sums are added in f32 by the kernels that exchange them.
enum class ElementType : std::uint8_t { f32, i32, i64, u16 };
std::int64_t element_size(ElementType type);
// Throws (naming `backend`) for u16: 16-bit values are moved, never summed by a communicator.
void check_summable(ElementType type, std::string_view backend);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string_view backend() const = 0;  // "single", "mpi", "nccl"

  // data[i] = sum over ranks of data[i], in place.
  virtual void all_reduce_sum(void* data, std::int64_t count, ElementType type) = 0;
  // input holds world_size() chunks of `chunk` elements; output[i] = sum over ranks of their
  // input[rank() * chunk + i]. input and output must not overlap.
  virtual void reduce_scatter_sum(const void* input, void* output, std::int64_t chunk, ElementType type) = 0;
  // Assembles a flat tensor of `numel` elements split as dist/shard.h states: rank r's `input`
  // holds its shard (shard_range(numel, world, r).count elements are sent); `output` gets all
  // `numel`. input nullptr: in place (each rank's shard already sits at its place in output);
  // else input and output must not overlap.
  virtual void all_gather_shards(const void* input, void* output, std::int64_t numel, ElementType type) = 0;
  // input holds world_size() chunks of `chunk` elements, chunk r for rank r; output[r * chunk ...]
  // gets rank r's chunk rank() (MPI_Alltoall). input and output must not overlap.
  virtual void all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) = 0;
  // data = root's data on every rank.
  virtual void broadcast(void* data, std::int64_t count, ElementType type, int root) = 0;
  virtual void barrier() = 0;
  // The communicator of the ranks that pass the same `color` (ordered by their rank here), as
  // MPI_Comm_split: every rank calls it. The groups of tensor and data parallelism
  // (graph/tensor_parallel.h). An Error where the backend cannot split.
  virtual Result<std::unique_ptr<Communicator>> split(int color);
};

// World 1: every collective is the identity (or a copy). What a process not launched under a
// launcher uses.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string_view backend() const override { return "single"; }
  void all_reduce_sum(void*, std::int64_t, ElementType) override {}
  void reduce_scatter_sum(const void* input, void* output, std::int64_t chunk, ElementType type) override;
  void all_gather_shards(const void* input, void* output, std::int64_t numel, ElementType type) override;
  void all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) override;
  void broadcast(void*, std::int64_t, ElementType, int) override {}
  void barrier() override {}
  Result<std::unique_ptr<Communicator>> split(int color) override;
};

// The world size a launcher (Open MPI's mpirun, or a PMI-based one) announced in this process's
// environment, or 0 when the process was started on its own. Reading it needs no MPI.
int launched_world_size();

// The communicator for CPU tensors: MPI when launched under mpirun with more than one rank,
// else the single-process one (MPI is then never initialised). An Error when MPI is wanted but
// cannot start.
Result<std::unique_ptr<Communicator>> make_cpu_communicator();

}  // namespace memplan::dist
