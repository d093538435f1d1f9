// Register-tiled products for the convolutions' small shapes (Cout and C*K*K in the tens to
// hundreds, one image's P = OH*OW columns), where a general GEMM spends as long packing as
// multiplying. Every output element sums its terms in one fixed order set by the shapes alone
// (never by the thread count, the tile it falls in or the address), with one fused multiply-add
// per term where the target has FMA.
#include <algorithm>
#include <cstring>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/cpu/vector_math.h"

namespace memplan::kernels::cpu {
namespace {

// 16 floats: one AVX-512 register, two AVX2 registers, or what the compiler makes of it.
constexpr int kLanes = 16;
typedef float Vec16 __attribute__((vector_size(64)));

inline Vec16 vload(const float* p) {
  Vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, Vec16 v) { std::memcpy(p, &v, sizeof v); }
// The first n (< 16) floats at p, the rest zero.
inline Vec16 vload_part(const float* p, int n) {
  float t[kLanes] = {};
  std::memcpy(t, p, sizeof(float) * static_cast<std::size_t>(n));
  return vload(t);
}
inline void vstore_part(float* p, Vec16 v, int n) {
  float t[kLanes];
  vstore(t, v);
  std::memcpy(p, t, sizeof(float) * static_cast<std::size_t>(n));
}
inline Vec16 splat(float s) { return Vec16{s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
// a * b + c lane by lane, each lane as madd does it.
inline Vec16 vfma(Vec16 a, Vec16 b, Vec16 c) {
#if defined(__AVX512F__)
  return (Vec16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  typedef float Half __attribute__((vector_size(32)));
  Half a0, a1, b0, b1, c0, c1;
  std::memcpy(&a0, &a, 32), std::memcpy(&a1, reinterpret_cast<const char*>(&a) + 32, 32);
  std::memcpy(&b0, &b, 32), std::memcpy(&b1, reinterpret_cast<const char*>(&b) + 32, 32);
  std::memcpy(&c0, &c, 32), std::memcpy(&c1, reinterpret_cast<const char*>(&c) + 32, 32);
  c0 = (Half)_mm256_fmadd_ps((__m256)a0, (__m256)b0, (__m256)c0);
  c1 = (Half)_mm256_fmadd_ps((__m256)a1, (__m256)b1, (__m256)c1);
  Vec16 r;
  std::memcpy(&r, &c0, 32), std::memcpy(reinterpret_cast<char*>(&r) + 32, &c1, 32);
  return r;
#else
  Vec16 r;
  for (int i = 0; i < kLanes; ++i) r[i] = madd(a[i], b[i], c[i]);
  return r;
#endif
}
// C[MR rows, NV*16 columns] = sum_k A(r, k) B[k, :], A(r, k) at a[r * ars + k * acs]; with
// PART the last vector holds only `last` columns. k runs upwards; each element is one fma per k
// from zero, whichever tile it falls in.
template <int MR, int NV, bool PART>
void nn_tile(std::int64_t k, const float* a, std::int64_t ars, std::int64_t acs, const float* b, std::int64_t ldb,
             float* c, std::int64_t ldc, int last) {
  Vec16 acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec16{};
  }
  for (std::int64_t kk = 0; kk < k; ++kk) {
    Vec16 bv[NV];
    const float* brow = b + kk * ldb;
    for (int v = 0; v < NV; ++v) {
      if (PART && v == NV - 1) bv[v] = vload_part(brow + v * kLanes, last);
      else bv[v] = vload(brow + v * kLanes);
    }
    const float* acol = a + kk * acs;
    for (int r = 0; r < MR; ++r) {
      const Vec16 av = splat(acol[r * ars]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      float* dst = c + r * ldc + v * kLanes;
      if (PART && v == NV - 1) vstore_part(dst, acc[r][v], last);
      else vstore(dst, acc[r][v]);
    }
  }
}

template <int MR>
void nn_rows(std::int64_t n, std::int64_t k, const float* a, std::int64_t ars, std::int64_t acs, const float* b,
             std::int64_t ldb, float* c, std::int64_t ldc, std::int64_t j) {
  // Columns j.. in tiles of 32, else 16 and a part, else one part.
  const std::int64_t left = n - j;
  if (left >= 2 * kLanes) nn_tile<MR, 2, false>(k, a, ars, acs, b + j, ldb, c + j, ldc, kLanes);
  else if (left == kLanes) nn_tile<MR, 1, false>(k, a, ars, acs, b + j, ldb, c + j, ldc, kLanes);
  else if (left > kLanes) nn_tile<MR, 2, true>(k, a, ars, acs, b + j, ldb, c + j, ldc, static_cast<int>(left - kLanes));
  else nn_tile<MR, 1, true>(k, a, ars, acs, b + j, ldb, c + j, ldc, static_cast<int>(left));
}

}  // namespace

void small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t ars, std::int64_t acs,
                const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  // Column tiles outermost so one B panel (k x 32) serves every row block while it is cached.
  for (std::int64_t j = 0; j < n; j += 2 * kLanes) {
    std::int64_t i = 0;
    for (; i + 8 <= m; i += 8) nn_rows<8>(n, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, j);
    for (; i + 4 <= m; i += 4) nn_rows<4>(n, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, j);
    for (; i < m; ++i) nn_rows<1>(n, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, j);
  }
}

namespace {

// Columns of B per pass of the weight gradient: a [chunk, 16] transposed block of B is 16 KiB.
constexpr std::int64_t kNtChunk = 256;

// C[i0.., j0..j0+16] (+)= A rows [i0, i0+MR) times bt [segs * kc, 16] (B's block, transposed):
// segment g reads A at a + g * seg_stride. The sixteen outputs of one row are one vector, read
// from and written to C's strided column once per call, so several short samples share one
// read-modify-write of C.
template <int MR>
void nt_tile(std::int64_t segs, std::int64_t kc, const float* a, std::int64_t seg_stride, std::int64_t lda,
             const float* bt, int nb, float* c, std::int64_t ldc, bool first) {
  Vec16 acc[MR];
  for (int r = 0; r < MR; ++r) {
    if (first) {
      acc[r] = Vec16{};
    } else {
      float t[kLanes] = {};
      for (int q = 0; q < nb; ++q) t[q] = c[q * ldc + r];
      acc[r] = vload(t);
    }
  }
  for (std::int64_t g = 0; g < segs; ++g) {
    const float* ag = a + g * seg_stride;
    const float* bg = bt + g * kc * kLanes;
    for (std::int64_t kk = 0; kk < kc; ++kk) {
      const Vec16 bv = vload(bg + kk * kLanes);
      for (int r = 0; r < MR; ++r) acc[r] = vfma(splat(ag[r * lda + kk]), bv, acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    float t[kLanes];
    vstore(t, acc[r]);
    for (int q = 0; q < nb; ++q) c[q * ldc + r] = t[q];
  }
}

}  // namespace

namespace {

// batched_gemm_nt, B given (fill null) or made pass by pass into `slots` (fill set).
void batched_gemm_nt_impl(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                          const float* b, float* slots, float* c, const RowFill* fill, bool accumulate) {
  // C^T [N, M] = sum_s B[s] A[s]^T: 16 rows of A at a time (one vector of C's column), A's K
  // columns in chunks transposed onto the stack, B's rows 8 at a time broadcast against them.
  // A sample shorter than a chunk shares its pass with the next ones (a 7x7 image has K = 49:
  // one pass per sample spent as long loading and storing C as multiplying). Each element sums
  // its samples, then its chunks, then k within a chunk, in order, one fma per term: set by the
  // shapes alone.
  const std::int64_t row_blocks = (n + 7) / 8;
  const std::int64_t group = k >= kNtChunk ? 1 : kNtChunk / k;  // samples per pass
  const bool parallel = 2.0 * double(batch) * double(m) * double(n) * double(k) >= 4.0e6 && row_blocks > 2;
  // Each part owns a contiguous run of B's row blocks, in pairs: a pair is 16 columns of C, one
  // 64-byte line per row, so no two parts write the same line (interleaved blocks made every tile
  // store a false-sharing miss and two threads slower than one). One part a thread.
  const std::int64_t pairs = (row_blocks + 1) / 2;
  const std::int64_t nt = parallel ? std::min<std::int64_t>(parallel_threads(), pairs) : 1;
  parallel_for(nt, 1, [&](std::int64_t t, std::int64_t, int) {
    const std::int64_t rb_begin = std::min(row_blocks, 2 * (pairs * t / nt));
    const std::int64_t rb_end = std::min(row_blocks, 2 * (pairs * (t + 1) / nt));
    alignas(64) float at[kNtChunk * kLanes];
    for (std::int64_t s0 = 0; s0 < batch; s0 += group) {
      const std::int64_t segs = std::min(group, batch - s0);
      // This thread's rows of the pass's samples, into the first slots.
      const std::int64_t r0 = std::min(n, rb_begin * 8), r1 = std::min(n, rb_end * 8);
      if (fill != nullptr && r0 < r1) {
        for (std::int64_t g = 0; g < segs; ++g) (*fill)(s0 + g, r0, r1, slots + g * n * k);
      }
      const float* bpass = fill != nullptr ? slots : b + s0 * n * k;
      for (std::int64_t i0 = 0; i0 < m; i0 += kLanes) {
        const int mb = static_cast<int>(std::min<std::int64_t>(kLanes, m - i0));
        for (std::int64_t k0 = 0; k0 < k; k0 += kNtChunk) {
          const std::int64_t kc = std::min(kNtChunk, k - k0);
          for (std::int64_t g = 0; g < segs; ++g) {
            const float* as = a + ((s0 + g) * m + i0) * k + k0;
            float* ag = at + g * kc * kLanes;
            for (std::int64_t kk = 0; kk < kc; ++kk) {
              for (int q = 0; q < kLanes; ++q) ag[kk * kLanes + q] = q < mb ? as[q * k + kk] : 0.0f;
            }
          }
          const bool first = !accumulate && s0 == 0 && k0 == 0;
          for (std::int64_t rb = rb_begin; rb < rb_end; ++rb) {
            const std::int64_t j0 = rb * 8;
            const float* bs = bpass + j0 * k + k0;
            float* cs = c + i0 * n + j0;
            const std::int64_t rows = std::min<std::int64_t>(8, n - j0);
            if (rows == 8) {
              nt_tile<8>(segs, kc, bs, n * k, k, at, mb, cs, n, first);
            } else {
              for (std::int64_t r = 0; r < rows; ++r) nt_tile<1>(segs, kc, bs + r * k, n * k, k, at, mb, cs + r, n, first);
            }
          }
        }
      }
    }
  });
}

}  // namespace

void batched_gemm_nt(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                     const float* b, float* c, bool accumulate) {
  batched_gemm_nt_impl(batch, m, n, k, a, b, nullptr, c, nullptr, accumulate);
}

void batched_gemm_nt_filled(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                            float* slots, float* c, const RowFill& fill) {
  batched_gemm_nt_impl(batch, m, n, k, a, nullptr, slots, c, &fill, false);
}

}  // namespace memplan::kernels::cpu
