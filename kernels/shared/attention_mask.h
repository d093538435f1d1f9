// Which keys a query sees under a causal mask with an optional sliding window, for the CPU and
// CUDA attention and softmax kernels alike (graph::OpAttrs::causal and window).
#pragma once

#include <cstdint>

#include "memplan/common/host_device.h"

namespace memplan::kernels {

// Keys [first, end) of t that query i sees: all without a causal mask; j <= i with one; and
// j > i - window besides when window > 0 (Mistral's and Gemma's local layers).
struct KeyRange {
  std::int64_t first = 0;
  std::int64_t end = 0;
};
MEMPLAN_HD inline KeyRange visible_keys(std::int64_t i, std::int64_t t, bool causal, std::int64_t window) {
  if (!causal) return {0, t};
  return {window > 0 && i + 1 > window ? i + 1 - window : 0, i + 1};
}

}  // namespace memplan::kernels
