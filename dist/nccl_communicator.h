// The NCCL communicator (GPU buffers; the nccl.h/libnccl shipped with the CUDA toolkit): one rank
// per GPU, bootstrapped over another communicator (MPI) that carries NCCL's unique id. Calls are
// enqueued on `stream` and waited for, so they are blocking like the other communicators. Built
// only with the CUDA backend (MEMPLAN_HAVE_NCCL).
#pragma once

#include <memory>

#include "memplan/common/result.h"
#include "memplan/dist/communicator.h"

namespace memplan::dist {

class NcclCommunicator final : public Communicator {
 public:
  // Selects GPU `device` for this thread and joins the NCCL clique of `bootstrap`'s ranks (same
  // rank and world). `stream` is a cudaStream_t (nullptr: the default stream). An Error when no
  // GPU or NCCL cannot start.
  static Result<std::unique_ptr<NcclCommunicator>> create(Communicator& bootstrap, int device, void* stream = nullptr);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string_view backend() const override { return "nccl"; }
  void all_reduce_sum(void* data, std::int64_t count, ElementType type) override;
  void reduce_scatter_sum(const void* input, void* output, std::int64_t chunk, ElementType type) override;
  void all_gather_shards(const void* input, void* output, std::int64_t numel, ElementType type) override;
  void all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) override;
  void broadcast(void* data, std::int64_t count, ElementType type, int root) override;
  void barrier() override;

 private:
  NcclCommunicator() = default;
  void wait();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int world_ = 1;
};

// Whether this build holds the NCCL communicator.
bool built_with_nccl();

}  // namespace memplan::dist
