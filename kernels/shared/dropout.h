// Dropout masks, shared by the CPU and CUDA kernels so both draw the same bits: a counter-based
// stream (SplitMix64 finaliser), where element i's draw depends only on (seed, step, i), never on
// threads, order or device.
#pragma once

#include <cstdint>

#include "memplan/common/host_device.h"
#include "memplan/common/splitmix64.h"

namespace memplan::kernels {

// The stream of one dropout op at one optimizer step (`seed` is fixed per op, from its name).
MEMPLAN_HD inline std::uint64_t dropout_stream(std::uint64_t seed, std::int64_t step) {
  return splitmix64_mix(seed ^ splitmix64_mix(static_cast<std::uint64_t>(step)));
}

// The value kept elements take: 1 / (1 - p), so the mask's expectation is 1.
MEMPLAN_HD inline float dropout_keep_scale(float p) { return 1.0f / (1.0f - p); }

// Element i of the mask: 0 where its uniform draw in [0, 1) (24 bits) is below p, else `keep`.
MEMPLAN_HD inline float dropout_mask_element(std::uint64_t stream, std::int64_t i, float p, float keep) {
  const float u = float(splitmix64_mix(stream + static_cast<std::uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
  return u < p ? 0.0f : keep;
}

}  // namespace memplan::kernels
