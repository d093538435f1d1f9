#include "memplan/dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "memplan/common/check.h"
#include "memplan/dist/shard.h"

namespace memplan::dist {

namespace {

ncclDataType_t nccl_type(ElementType type) {
  switch (type) {
    case ElementType::f32: return ncclFloat32;
    case ElementType::i32: return ncclInt32;
    case ElementType::i64: return ncclInt64;
    case ElementType::u16: return ncclFloat16;  // moved, never summed: any 16-bit type carries the bits
  }
  return ncclUint8;
}

void nccl_check(ncclResult_t rc, const char* what) {
  MEMPLAN_CHECK(rc == ncclSuccess, what << " failed: " << ncclGetErrorString(rc));
}

void cuda_check(cudaError_t rc, const char* what) {
  MEMPLAN_CHECK(rc == cudaSuccess, what << " failed: " << cudaGetErrorString(rc));
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

bool built_with_nccl() { return true; }

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(Communicator& bootstrap, int device, void* stream) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return Error{"NCCL needs a GPU and this machine has none (run on the CPU with MPI instead)"};
  }
  if (device < 0 || device >= devices) {
    return Error{"GPU " + std::to_string(device) + " does not exist (this machine has " + std::to_string(devices) + ")"};
  }
  if (cudaSetDevice(device) != cudaSuccess) return Error{"cannot select GPU " + std::to_string(device)};
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->impl_ = std::make_unique<Impl>();
  c->impl_->stream = static_cast<cudaStream_t>(stream);
  c->rank_ = bootstrap.rank();
  c->world_ = bootstrap.world_size();
  ncclUniqueId id{};
  if (c->rank_ == 0) {
    if (ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess) {
      return Error{std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(rc)};
    }
  }
  static_assert(sizeof(ncclUniqueId) % 4 == 0, "the id travels as 32-bit words");
  bootstrap.broadcast(&id, static_cast<std::int64_t>(sizeof(id) / 4), ElementType::i32, 0);
  if (ncclResult_t rc = ncclCommInitRank(&c->impl_->comm, c->world_, id, c->rank_); rc != ncclSuccess) {
    return Error{std::string("ncclCommInitRank failed: ") + ncclGetErrorString(rc)};
  }
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_ && impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
}

void NcclCommunicator::wait() { cuda_check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize"); }

void NcclCommunicator::all_reduce_sum(void* data, std::int64_t count, ElementType type) {
  check_summable(type, "NCCL");
  nccl_check(ncclAllReduce(data, data, static_cast<std::size_t>(count), nccl_type(type), ncclSum, impl_->comm,
                           impl_->stream),
             "ncclAllReduce");
  wait();
}

void NcclCommunicator::reduce_scatter_sum(const void* input, void* output, std::int64_t chunk, ElementType type) {
  check_summable(type, "NCCL");
  nccl_check(ncclReduceScatter(input, output, static_cast<std::size_t>(chunk), nccl_type(type), ncclSum, impl_->comm,
                               impl_->stream),
             "ncclReduceScatter");
  wait();
}

void NcclCommunicator::all_gather_shards(const void* input, void* output, std::int64_t numel, ElementType type) {
  // NCCL's all-gather needs equal counts; shards of uneven tensors are gathered as one broadcast
  // per owner, grouped so they run as one collective.
  const std::int64_t bytes = element_size(type);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < world_; ++r) {
    const ShardRange range = shard_range(numel, world_, r);
    if (range.count == 0) continue;
    char* place = static_cast<char*>(output) + range.offset * bytes;
    nccl_check(ncclBroadcast(input == nullptr ? place : input, place, static_cast<std::size_t>(range.count),
                             nccl_type(type), r, impl_->comm, impl_->stream),
               "ncclBroadcast");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  wait();
}

void NcclCommunicator::all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) {
  // One send and one receive per peer, grouped so they run as one collective.
  const std::int64_t bytes = chunk * element_size(type);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < world_; ++r) {
    nccl_check(ncclSend(static_cast<const char*>(input) + r * bytes, static_cast<std::size_t>(chunk), nccl_type(type), r,
                        impl_->comm, impl_->stream),
               "ncclSend");
    nccl_check(ncclRecv(static_cast<char*>(output) + r * bytes, static_cast<std::size_t>(chunk), nccl_type(type), r,
                        impl_->comm, impl_->stream),
               "ncclRecv");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  wait();
}

void NcclCommunicator::broadcast(void* data, std::int64_t count, ElementType type, int root) {
  nccl_check(ncclBroadcast(data, data, static_cast<std::size_t>(count), nccl_type(type), root, impl_->comm, impl_->stream),
             "ncclBroadcast");
  wait();
}

void NcclCommunicator::barrier() {
  // An all-reduce of nothing orders every rank's stream; NCCL has no barrier of its own.
  nccl_check(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce");
  wait();
}

}  // namespace memplan::dist
