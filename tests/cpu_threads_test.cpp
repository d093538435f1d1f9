// kernels::set_cpu_threads: the thread count reaches both halves of the CPU backend, Eigen's GEMM
// and the OpenMP loops of the other kernels (it used to reach Eigen only).
#include <gtest/gtest.h>
#include <omp.h>

#include "memplan/kernels/kernel.h"

namespace memplan::kernels {
namespace {

int threads_in_a_parallel_region() {
  int n = 0;
#pragma omp parallel
  {
#pragma omp single
    n = omp_get_num_threads();
  }
  return n;
}

TEST(CpuThreads, SetCpuThreadsLimitsEigenAndTheOpenMpLoops) {
  set_cpu_threads(1);
  EXPECT_EQ(cpu_threads(), 1);
  EXPECT_EQ(omp_get_max_threads(), 1);
  EXPECT_EQ(threads_in_a_parallel_region(), 1);

  set_cpu_threads(3);
  EXPECT_EQ(cpu_threads(), 3);
  EXPECT_EQ(omp_get_max_threads(), 3);
  EXPECT_EQ(threads_in_a_parallel_region(), 3);

  // 0: OpenMP's default, which Eigen then follows.
  set_cpu_threads(0);
  EXPECT_GE(omp_get_max_threads(), 1);
  EXPECT_EQ(cpu_threads(), omp_get_max_threads());
}

}  // namespace
}  // namespace memplan::kernels
