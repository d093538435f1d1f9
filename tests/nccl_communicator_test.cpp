// The NCCL communicator on one GPU (world 1, bootstrapped by the single-process communicator):
// it starts, and its collectives move GPU buffers as the interface states (in place, out of
// place, uneven shards). Skipped, saying why, without the CUDA backend or without a GPU; several
// GPUs under mpirun are not covered here.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "memplan/dist/communicator.h"
#include "memplan/runtime/devices.h"
#ifdef MEMPLAN_HAVE_NCCL
#include "memplan/dist/nccl_communicator.h"
#endif

namespace memplan {
namespace {

TEST(NcclCommunicator, CollectivesOnOneGpuMoveTheBuffersTheyName) {
#ifndef MEMPLAN_HAVE_NCCL
  GTEST_SKIP() << "memplan was built without the CUDA backend: no NCCL communicator";
#else
  if (!runtime::cuda_device_present()) GTEST_SKIP() << "no CUDA GPU on this machine: the NCCL communicator needs one";
  auto made = runtime::make_device(kernels::DeviceKind::cuda);
  ASSERT_TRUE(made) << made.error().message;
  runtime::Device& gpu = *made.value();
  dist::SingleProcessCommunicator bootstrap;
  auto nccl = dist::NcclCommunicator::create(bootstrap, 0);
  ASSERT_TRUE(nccl) << nccl.error().message;
  dist::Communicator& comm = *nccl.value();
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.backend(), "nccl");
  const std::vector<float> host = {1.5f, -2.0f, 3.25f, 7.0f, 0.5f};
  const Bytes bytes = static_cast<Bytes>(host.size() * sizeof(float));
  auto a = gpu.allocate(bytes);
  auto b = gpu.allocate(bytes);
  ASSERT_TRUE(a && b);
  gpu.copy_from_host(a.value(), host.data(), bytes);
  comm.all_reduce_sum(a.value(), 5, dist::ElementType::f32);  // one rank: the sum is the value
  comm.reduce_scatter_sum(a.value(), b.value(), 5, dist::ElementType::f32);
  std::vector<float> back(host.size(), 0.0f);
  gpu.copy_to_host(back.data(), b.value(), bytes);
  EXPECT_EQ(back, host);
  gpu.copy_from_host(b.value(), std::vector<float>(5, 0.0f).data(), bytes);
  comm.all_gather_shards(a.value(), b.value(), 5, dist::ElementType::f32);
  gpu.copy_to_host(back.data(), b.value(), bytes);
  EXPECT_EQ(back, host);
  comm.broadcast(b.value(), 5, dist::ElementType::f32, 0);
  comm.barrier();
  gpu.copy_to_host(back.data(), b.value(), bytes);
  EXPECT_EQ(back, host);
  gpu.deallocate(a.value(), bytes);
  gpu.deallocate(b.value(), bytes);
#endif
}

}  // namespace
}  // namespace memplan
