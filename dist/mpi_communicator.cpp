#include "memplan/dist/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <string>

#include "memplan/common/check.h"
#include "memplan/dist/shard.h"

namespace memplan::dist {

namespace {

MPI_Datatype mpi_type(ElementType type) {
  switch (type) {
    case ElementType::f32: return MPI_FLOAT;
    case ElementType::i32: return MPI_INT;
    case ElementType::i64: return MPI_INT64_T;
    case ElementType::u16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

int checked_count(std::int64_t count) {
  MEMPLAN_CHECK(count >= 0 && count <= INT_MAX, "MPI counts are ints; " << count << " elements in one call is too many");
  return static_cast<int>(count);
}

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  MEMPLAN_CHECK(false, what << " failed: " << std::string(text, static_cast<std::size_t>(length)));
}

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create() {
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    if (MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return Error{"MPI_Init failed: cannot start the MPI ranks"};
    c->finalize_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->world_);
  c->counts_.resize(static_cast<std::size_t>(c->world_));
  c->displs_.resize(static_cast<std::size_t>(c->world_));
  return c;
}

MpiCommunicator::~MpiCommunicator() {
  if (finalize_) MPI_Finalize();
}

void MpiCommunicator::all_reduce_sum(void* data, std::int64_t count, ElementType type) {
  check_summable(type, "MPI");
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(type), MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
}

void MpiCommunicator::reduce_scatter_sum(const void* input, void* output, std::int64_t chunk, ElementType type) {
  check_summable(type, "MPI");
  mpi_check(MPI_Reduce_scatter_block(input, output, checked_count(chunk), mpi_type(type), MPI_SUM, MPI_COMM_WORLD),
            "MPI_Reduce_scatter_block");
}

void MpiCommunicator::all_gather_shards(const void* input, void* output, std::int64_t numel, ElementType type) {
  for (int r = 0; r < world_; ++r) {
    const ShardRange range = shard_range(numel, world_, r);
    counts_[static_cast<std::size_t>(r)] = checked_count(range.count);
    displs_[static_cast<std::size_t>(r)] = checked_count(range.offset);
  }
  mpi_check(MPI_Allgatherv(input == nullptr ? MPI_IN_PLACE : input, counts_[static_cast<std::size_t>(rank_)], mpi_type(type), output, counts_.data(),
                           displs_.data(), mpi_type(type), MPI_COMM_WORLD),
            "MPI_Allgatherv");
}

void MpiCommunicator::all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) {
  mpi_check(MPI_Alltoall(input, checked_count(chunk), mpi_type(type), output, checked_count(chunk), mpi_type(type), MPI_COMM_WORLD),
            "MPI_Alltoall");
}

void MpiCommunicator::broadcast(void* data, std::int64_t count, ElementType type, int root) {
  mpi_check(MPI_Bcast(data, checked_count(count), mpi_type(type), root, MPI_COMM_WORLD), "MPI_Bcast");
}

void MpiCommunicator::barrier() { mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

}  // namespace memplan::dist
