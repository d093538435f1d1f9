// Deterministic random numbers, identical on every platform and compiler (std::*_distribution
// is implementation-defined, so it is not used where results must be reproducible).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "memplan/common/splitmix64.h"

namespace memplan {

// SplitMix64: small, fast, passes BigCrush; good enough for initialisation and shuffling.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next_u64() { return splitmix64_mix(state_ += kSplitMix64Gamma); }
  // Uniform in [0, 1) with 24 random bits (exactly representable as float).
  float uniform01() { return float(next_u64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform01(); }
  // Uniform integer in [0, n) without modulo bias.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    std::uint64_t x;
    do x = next_u64(); while (x >= limit);
    return x % n;
  }
  // Standard normal by Box-Muller (one of the pair; simple and reproducible).
  float normal() {
    double u1 = (double(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = double(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  std::uint64_t state_;
};

}  // namespace memplan
