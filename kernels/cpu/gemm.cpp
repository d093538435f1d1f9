// The only translation unit that includes Eigen: GEMM dominates the MLP's time, and keeping the
// heavy templates here keeps the rest of the build fast.
#include <omp.h>

#include <Eigen/Core>

#include "memplan/kernels/cpu/cpu_kernels.h"

namespace memplan::kernels::cpu {

namespace {
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;
}  // namespace

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          const float* b, float* c) {
  // A is stored [M,K] (or [K,M] when transposed); B [K,N] (or [N,K]).
  ConstMap a_map(a, trans_a ? k : m, trans_a ? m : k);
  ConstMap b_map(b, trans_b ? n : k, trans_b ? k : n);
  Map c_map(c, m, n);
  if (!trans_a && !trans_b) c_map.noalias() = a_map * b_map;
  else if (!trans_a && trans_b) c_map.noalias() = a_map * b_map.transpose();
  else if (trans_a && !trans_b) c_map.noalias() = a_map.transpose() * b_map;
  else c_map.noalias() = a_map.transpose() * b_map.transpose();
}

void gemm_accumulate(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, const float* b, float* c) {
  ConstMap a_map(a, trans_a ? k : m, trans_a ? m : k);
  ConstMap b_map(b, trans_b ? n : k, trans_b ? k : n);
  Map c_map(c, m, n);
  if (!trans_a && !trans_b) c_map.noalias() += a_map * b_map;
  else if (!trans_a && trans_b) c_map.noalias() += a_map * b_map.transpose();
  else if (trans_a && !trans_b) c_map.noalias() += a_map.transpose() * b_map;
  else c_map.noalias() += a_map.transpose() * b_map.transpose();
}

void gemm_accumulate_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                             const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                             std::int64_t ldc) {
  using Strided = Eigen::OuterStride<Eigen::Dynamic>;
  Eigen::Map<const RowMatrix, 0, Strided> a_map(a, trans_a ? k : m, trans_a ? m : k, Strided(lda));
  Eigen::Map<const RowMatrix, 0, Strided> b_map(b, trans_b ? n : k, trans_b ? k : n, Strided(ldb));
  Eigen::Map<RowMatrix, 0, Strided> c_map(c, m, n, Strided(ldc));
  if (!trans_a && !trans_b) c_map.noalias() += a_map * b_map;
  else if (!trans_a && trans_b) c_map.noalias() += a_map * b_map.transpose();
  else if (trans_a && !trans_b) c_map.noalias() += a_map.transpose() * b_map;
  else c_map.noalias() += a_map.transpose() * b_map.transpose();
}

}  // namespace memplan::kernels::cpu

namespace memplan::kernels {

void set_cpu_threads(int threads) {
  // The parallel loops follow OpenMP's thread count and Eigen's GEMM its own, so both are set.
  // 0 goes back to what OpenMP had at the first call (OMP_NUM_THREADS, else every core).
  static const int initial = omp_get_max_threads();
  omp_set_num_threads(threads > 0 ? threads : initial);
  Eigen::setNbThreads(threads);  // 0: Eigen follows OpenMP's count
}

int cpu_threads() { return Eigen::nbThreads(); }

}  // namespace memplan::kernels
