// SplitMix64 (Steele, Lea and Flood): the finaliser that memplan's random numbers all come from,
// the sequential Rng (common/rng.h) and the counter-based dropout streams of the CPU and CUDA
// kernels (kernels/shared/dropout.h). One definition, so the three cannot drift apart.
#pragma once

#include <cstdint>

#include "memplan/common/host_device.h"

namespace memplan {

// The increment of the sequential generator (2^64 / golden ratio, odd).
inline constexpr std::uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// The finaliser: a bijection of 64-bit words whose outputs pass BigCrush for consecutive inputs.
MEMPLAN_HD constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace memplan
