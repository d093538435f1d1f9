// One-thread GEMM speed on the shapes memplan's reference models use: memplan's Eigen path
// (kernels/cpu/gemm.cpp), Debian's OpenBLAS (cblas_sgemm, when the build found libopenblas) and,
// for the convolutions' per-image shapes, memplan's register-tiled small_gemm. Interleaved
// round by round; each result is checked against the Eigen one before anything is timed.
//
//   bench_gemm_blas [--rounds 5] [--json-out bench_gemm_blas.json]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "memplan/common/rng.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/kernel.h"

#ifdef MEMPLAN_HAVE_OPENBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace {

using namespace memplan;

struct Shape {
  std::string model, what;
  bool ta, tb;
  std::int64_t m, n, k;
  bool conv;  // a per-image convolution product: small_gemm applies
};

// GPT 2 x 128, T 64, batch 32 (2048 rows); MLP 784-256-256-10, batch 128; CNN per image.
const Shape kShapes[] = {
    {"gpt", "qkv forward", false, false, 2048, 384, 128, false},
    {"gpt", "mlp.fc forward", false, false, 2048, 512, 128, false},
    {"gpt", "mlp.proj forward", false, false, 2048, 128, 512, false},
    {"gpt", "mlp.proj dW = X^T dY", true, false, 512, 128, 2048, false},
    {"gpt", "mlp.fc dX = dY W^T", false, true, 2048, 128, 512, false},
    {"gpt", "head forward", false, false, 2048, 96, 128, false},
    {"mlp", "fc1 forward", false, false, 128, 256, 784, false},
    {"mlp", "fc1 dW = X^T dY", true, false, 784, 256, 128, false},
    {"mlp", "fc2 dX = dY W^T", false, true, 128, 256, 256, false},
    {"cnn", "stage1 conv forward", false, false, 16, 784, 144, true},
    {"cnn", "stage2 conv forward", false, false, 32, 196, 288, true},
    {"cnn", "stage3 conv forward", false, false, 64, 49, 576, true},
    {"cnn", "stage1 dcols = W^T dY", true, false, 144, 784, 16, true},
};

std::vector<float> random_vec(std::size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(a[i])));
  }
  return worst / std::max(scale, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string json_out = "bench_gemm_blas.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "bench_gemm_blas: unknown flag %s (--rounds N, --json-out FILE)\n", a.c_str());
      return 2;
    }
  }
  kernels::set_cpu_threads(1);
#ifdef MEMPLAN_HAVE_OPENBLAS
  openblas_set_num_threads(1);
  const bool have_blas = true;
#else
  const bool have_blas = false;
  std::puts("OpenBLAS: not found at build time (libopenblas-dev); its column stays empty");
#endif
  Rng rng(7);
  std::vector<std::vector<std::string>> rows;
  nlohmann::json results = nlohmann::json::array();
  for (const Shape& s : kShapes) {
    const auto a = random_vec(static_cast<std::size_t>(s.m * s.k), rng);
    const auto b = random_vec(static_cast<std::size_t>(s.k * s.n), rng);
    std::vector<float> c_eigen(static_cast<std::size_t>(s.m * s.n)), c_other(c_eigen.size());
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    const int reps = std::max(3, static_cast<int>(1.0e9 / flop));
    auto run_eigen = [&] { kernels::cpu::gemm(s.ta, s.tb, s.m, s.n, s.k, a.data(), b.data(), c_eigen.data()); };
    auto run_blas = [&] {
#ifdef MEMPLAN_HAVE_OPENBLAS
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(s.m), int(s.n),
                  int(s.k), 1.0f, a.data(), int(s.ta ? s.m : s.k), b.data(), int(s.tb ? s.k : s.n), 0.0f, c_other.data(),
                  int(s.n));
#endif
    };
    auto run_small = [&] {
      // op(A)(r, k): A [M,K] row-major, or A^T from A stored [K,M].
      kernels::cpu::small_gemm(s.m, s.n, s.k, a.data(), s.ta ? 1 : s.k, s.ta ? s.m : 1, b.data(), s.n, c_other.data(),
                               s.n);
    };
    run_eigen();
    double blas_diff = -1.0, small_diff = -1.0;
    if (have_blas) {
      run_blas();
      blas_diff = max_rel_diff(c_eigen, c_other);
    }
    if (s.conv) {
      run_small();
      small_diff = max_rel_diff(c_eigen, c_other);
    }
    if (blas_diff > 1e-4 || small_diff > 1e-4) {
      std::fprintf(stderr, "%s %s: results differ (OpenBLAS %g, small_gemm %g)\n", s.model.c_str(), s.what.c_str(),
                   blas_diff, small_diff);
      return 1;
    }
    std::vector<double> te, tb, ts;
    for (int r = 0; r < rounds; ++r) {
      te.push_back(bench::time_ms([&] { for (int i = 0; i < reps; ++i) run_eigen(); }) / reps);
      if (have_blas) tb.push_back(bench::time_ms([&] { for (int i = 0; i < reps; ++i) run_blas(); }) / reps);
      if (s.conv) ts.push_back(bench::time_ms([&] { for (int i = 0; i < reps; ++i) run_small(); }) / reps);
    }
    auto gflops = [&](const std::vector<double>& t) { return t.empty() ? 0.0 : flop / (bench::median(t) * 1e6); };
    rows.push_back({s.model, s.what, std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k),
                    bench::fmt(gflops(te), 1), have_blas ? bench::fmt(gflops(tb), 1) : "-",
                    s.conv ? bench::fmt(gflops(ts), 1) : "-"});
    results.push_back({{"model", s.model}, {"product", s.what}, {"trans_a", s.ta}, {"trans_b", s.tb}, {"m", s.m},
                       {"n", s.n}, {"k", s.k}, {"eigen_gflops", gflops(te)},
                       {"openblas_gflops", have_blas ? nlohmann::json(gflops(tb)) : nlohmann::json(nullptr)},
                       {"small_gemm_gflops", s.conv ? nlohmann::json(gflops(ts)) : nlohmann::json(nullptr)}});
  }
  std::printf("one thread, median of %d rounds, GFLOP/s\n\n", rounds);
  bench::print_table({"model", "product", "M x N x K", "Eigen", "OpenBLAS", "small_gemm"}, rows);
  bench::write_json(json_out, {{"bench", "gemm_blas"}, {"rounds", rounds}, {"threads", 1}, {"results", results}});
  return 0;
}
