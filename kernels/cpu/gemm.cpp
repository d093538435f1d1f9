// The only translation unit that includes Eigen: GEMM dominates the MLP's time, and keeping the
// heavy templates here keeps the rest of the build fast.
#include <algorithm>

#include <Eigen/Core>

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"

namespace memplan::kernels::cpu {

namespace {
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
}  // namespace

namespace {

using Strided = Eigen::OuterStride<Eigen::Dynamic>;
using ConstStridedMap = Eigen::Map<const RowMatrix, 0, Strided>;
using StridedMap = Eigen::Map<RowMatrix, 0, Strided>;

// C (= or +=) op(A) op(B) on one thread, every operand a strided view.
void gemm_block(bool accumulate, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  ConstStridedMap a_map(a, trans_a ? k : m, trans_a ? m : k, Strided(lda));
  ConstStridedMap b_map(b, trans_b ? n : k, trans_b ? k : n, Strided(ldb));
  StridedMap c_map(c, m, n, Strided(ldc));
  if (!accumulate) c_map.setZero();
  if (!trans_a && !trans_b) c_map.noalias() += a_map * b_map;
  else if (!trans_a && trans_b) c_map.noalias() += a_map * b_map.transpose();
  else if (trans_a && !trans_b) c_map.noalias() += a_map.transpose() * b_map;
  else c_map.noalias() += a_map.transpose() * b_map.transpose();
}

// Threads split C into a fixed number of row or column blocks (set by the sizes alone, never by
// the thread count), each a single-threaded GEMM and one chunk of a parallel loop. Eigen's own
// multi-threaded GEMM instead busy-waits on shared counters inside the product, and collapses
// when another process takes one of the cores (a 2-thread GPT step went from 0.2 s to 2.7 s with two busy processes).
constexpr std::int64_t kBlockAlign = 16;      // block edges on whole cache lines of C
constexpr std::int64_t kMaxBlocks = 8;
constexpr double kFlopsPerBlock = 2.0e6;       // below this a block is not worth a thread

// Eigen never starts threads of its own, whether or not set_cpu_threads is called.
[[maybe_unused]] const bool kEigenSingleThreaded = [] {
  Eigen::setNbThreads(1);
  return true;
}();

// C = op(A) op(B), A, B and C contiguous.
void gemm_split(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                const float* b, float* c) {
  const std::int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const bool split_rows = m >= n;
  const std::int64_t extent = split_rows ? m : n;
  const double flops = 2.0 * double(m) * double(n) * double(k);
  std::int64_t blocks = std::min<std::int64_t>(kMaxBlocks, static_cast<std::int64_t>(flops / kFlopsPerBlock));
  blocks = std::max<std::int64_t>(1, std::min(blocks, extent / kBlockAlign));
  const std::int64_t width = (extent + blocks - 1) / blocks;
  const std::int64_t step = (width + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  const std::int64_t count = (extent + step - 1) / step;
  parallel_for(count, 1, [&](std::int64_t i, std::int64_t, int) {
    const std::int64_t lo = i * step, hi = std::min(extent, lo + step);
    if (split_rows) {
      // Rows lo..hi of op(A) and of C.
      const float* a_rows = trans_a ? a + lo : a + lo * lda;
      gemm_block(false, trans_a, trans_b, hi - lo, n, k, a_rows, lda, b, ldb, c + lo * n, n);
    } else {
      // Columns lo..hi of op(B) and of C.
      const float* b_cols = trans_b ? b + lo * ldb : b + lo;
      gemm_block(false, trans_a, trans_b, m, hi - lo, k, a, lda, b_cols, ldb, c + lo, n);
    }
  });
}

}  // namespace

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          const float* b, float* c) {
  gemm_split(trans_a, trans_b, m, n, k, a, b, c);
}

void gemm_accumulate_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                             const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                             std::int64_t ldc) {
  gemm_block(true, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

}  // namespace memplan::kernels::cpu

namespace memplan::kernels {

void set_cpu_threads(int threads) {
  // The loops run on memplan's thread pool (cpu/parallel.h); GEMMs split into blocks over it
  // (gemm_split), each block a single-threaded Eigen product, so Eigen itself stays at one.
  cpu::set_parallel_threads(threads > 0 ? threads : cpu::default_parallel_threads());
  Eigen::setNbThreads(1);
}

int cpu_threads() { return cpu::parallel_threads(); }

}  // namespace memplan::kernels
