// The MPI communicator (Open MPI; CPU buffers): MPI is initialised by create() and finalised when
// the communicator is destroyed, so one lives per process. Reductions are MPI_SUM in MPI's own
// order; with two ranks a sum is exact in either order, so results do not depend on it.
#pragma once

#include <memory>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/dist/communicator.h"

namespace memplan::dist {

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI (unless someone else did) on MPI_COMM_WORLD.
  static Result<std::unique_ptr<MpiCommunicator>> create();
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string_view backend() const override { return "mpi"; }
  void all_reduce_sum(void* data, std::int64_t count, ElementType type) override;
  void reduce_scatter_sum(const void* input, void* output, std::int64_t chunk, ElementType type) override;
  void all_gather_shards(const void* input, void* output, std::int64_t numel, ElementType type) override;
  void all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) override;
  void broadcast(void* data, std::int64_t count, ElementType type, int root) override;
  void barrier() override;
  // MPI_Comm_split; the group's communicator is freed with it (before this one finalises MPI).
  Result<std::unique_ptr<Communicator>> split(int color) override;

 private:
  MpiCommunicator() = default;
  int rank_ = 0;
  int world_ = 1;
  // The MPI communicator as its Fortran handle (an int in every MPI, unlike MPI_Comm, so mpi.h
  // stays out of this header): MPI_COMM_WORLD, or a group split from it that this object frees.
  int handle_ = 0;
  bool owns_handle_ = false;
  bool finalize_ = false;  // we initialised MPI
  std::vector<int> counts_, displs_;  // all_gather_shards: sized once, reused
};

}  // namespace memplan::dist
