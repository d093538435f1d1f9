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

MPI_Comm comm_of(int handle) { return MPI_Comm_f2c(static_cast<MPI_Fint>(handle)); }

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create() {
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    if (MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return Error{"MPI_Init failed: cannot start the MPI ranks"};
    c->finalize_ = true;
  }
  c->handle_ = static_cast<int>(MPI_Comm_c2f(MPI_COMM_WORLD));
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->world_);
  c->counts_.resize(static_cast<std::size_t>(c->world_));
  c->displs_.resize(static_cast<std::size_t>(c->world_));
  return c;
}

MpiCommunicator::~MpiCommunicator() {
  if (owns_handle_) {
    MPI_Comm group = comm_of(handle_);
    MPI_Comm_free(&group);
  }
  if (finalize_) MPI_Finalize();
}

Result<std::unique_ptr<Communicator>> MpiCommunicator::split(int color) {
  MPI_Comm group = MPI_COMM_NULL;
  if (MPI_Comm_split(comm_of(handle_), color, rank_, &group) != MPI_SUCCESS) {
    return Error{"MPI_Comm_split failed: cannot form the groups of ranks"};
  }
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator());
  c->handle_ = static_cast<int>(MPI_Comm_c2f(group));
  c->owns_handle_ = true;
  MPI_Comm_rank(group, &c->rank_);
  MPI_Comm_size(group, &c->world_);
  c->counts_.resize(static_cast<std::size_t>(c->world_));
  c->displs_.resize(static_cast<std::size_t>(c->world_));
  return std::unique_ptr<Communicator>(std::move(c));
}

void MpiCommunicator::all_reduce_sum(void* data, std::int64_t count, ElementType type) {
  check_summable(type, "MPI");
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(type), MPI_SUM, comm_of(handle_)),
            "MPI_Allreduce");
}

void MpiCommunicator::reduce_scatter_sum(const void* input, void* output, std::int64_t chunk, ElementType type) {
  check_summable(type, "MPI");
  mpi_check(MPI_Reduce_scatter_block(input, output, checked_count(chunk), mpi_type(type), MPI_SUM, comm_of(handle_)),
            "MPI_Reduce_scatter_block");
}

void MpiCommunicator::all_gather_shards(const void* input, void* output, std::int64_t numel, ElementType type) {
  for (int r = 0; r < world_; ++r) {
    const ShardRange range = shard_range(numel, world_, r);
    counts_[static_cast<std::size_t>(r)] = checked_count(range.count);
    displs_[static_cast<std::size_t>(r)] = checked_count(range.offset);
  }
  mpi_check(MPI_Allgatherv(input == nullptr ? MPI_IN_PLACE : input, counts_[static_cast<std::size_t>(rank_)], mpi_type(type), output, counts_.data(),
                           displs_.data(), mpi_type(type), comm_of(handle_)),
            "MPI_Allgatherv");
}

void MpiCommunicator::all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) {
  mpi_check(MPI_Alltoall(input, checked_count(chunk), mpi_type(type), output, checked_count(chunk), mpi_type(type), comm_of(handle_)),
            "MPI_Alltoall");
}

void MpiCommunicator::broadcast(void* data, std::int64_t count, ElementType type, int root) {
  mpi_check(MPI_Bcast(data, checked_count(count), mpi_type(type), root, comm_of(handle_)), "MPI_Bcast");
}

void MpiCommunicator::barrier() { mpi_check(MPI_Barrier(comm_of(handle_)), "MPI_Barrier"); }

}  // namespace memplan::dist
