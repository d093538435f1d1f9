// GELU forward + backward over 1M floats: the libm formulation (std::erf, std::exp per element,
// what the CPU kernels ran before) against kernels/cpu/vector_math.h's erf_approx/exp_approx
// (what they run now), one thread, interleaved rounds; checks first that the two agree to 4e-7.
//
//   bench_gelu_kernels [--rounds 5] [--json-out bench_gelu_kernels.json]
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "memplan/kernels/cpu/vector_math.h"

namespace {

using namespace memplan::kernels::cpu;
constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;

__attribute__((noinline)) void gelu_libm(const float* x, const float* dy, float* y, float* dx, long n) {
  for (long i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
  for (long i = 0; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + std::erf(x[i] * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}

__attribute__((noinline)) void gelu_vector(const float* x, const float* dy, float* y, float* dx, long n) {
#pragma omp simd
  for (long i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erf_approx(x[i] * kInvSqrt2));
#pragma omp simd
  for (long i = 0; i < n; ++i) {
    const float xi = x[i];
    const float cdf = 0.5f * (1.0f + erf_approx(xi * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * exp_approx(-0.5f * xi * xi);
    dx[i] = dy[i] * madd(xi, pdf, cdf);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string json_out = "bench_gelu_kernels.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::stoi(argv[++i]);
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "bench_gelu_kernels: unknown flag %s (see the comment at the top of bench/gelu_kernels.cpp)\n", a.c_str());
      return 2;
    }
  }
  const long n = 1 << 20;
  std::vector<float> x(n), dy(n), y1(n), dx1(n), y2(n), dx2(n);
  for (long i = 0; i < n; ++i) {
    x[i] = -6.0f + 12.0f * float(i) / float(n);
    dy[i] = 1.0f - float(i % 7) / 7.0f;
  }
  gelu_libm(x.data(), dy.data(), y1.data(), dx1.data(), n);
  gelu_vector(x.data(), dy.data(), y2.data(), dx2.data(), n);
  double worst = 0.0;
  for (long i = 0; i < n; ++i) worst = std::max({worst, double(std::fabs(y1[i] - y2[i])), double(std::fabs(dx1[i] - dx2[i]))});
  if (worst > 4e-7 * 6.0) {  // |y| reaches 6: about 2 ulp there
    std::fprintf(stderr, "bench_gelu_kernels: check failed: the two formulations differ by %g\n", worst);
    return 1;
  }
  std::vector<double> libm, vec;
  for (int r = 0; r < rounds; ++r) {
    libm.push_back(memplan::bench::time_ms([&] { gelu_libm(x.data(), dy.data(), y1.data(), dx1.data(), n); }));
    vec.push_back(memplan::bench::time_ms([&] { gelu_vector(x.data(), dy.data(), y2.data(), dx2.data(), n); }));
  }
  const double a = memplan::bench::median(libm), b = memplan::bench::median(vec);
  std::printf("GELU forward + backward, %ld floats, one thread, median of %d interleaved rounds; largest difference %.3g\n\n",
              n, rounds, worst);
  memplan::bench::print_table({"formulation", "ms", "speedup"},
                              {{"std::erf, std::exp (before)", memplan::bench::fmt(a), "1.00x"},
                               {"erf_approx, exp_approx (now)", memplan::bench::fmt(b), memplan::bench::fmt(a / b, 2) + "x"}});
  memplan::bench::write_json(json_out, {{"benchmark", "gelu_kernels"}, {"elements", n}, {"rounds", rounds},
                                        {"libm_ms", a}, {"vector_ms", b}, {"speedup", a / b}, {"max_abs_difference", worst},
                                        {"libm_rounds_ms", libm}, {"vector_rounds_ms", vec}});
  return 0;
}
