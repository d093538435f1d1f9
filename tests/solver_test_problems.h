// Problems for the solvers' tests: the optimum of a tiny problem by brute force, and a small
// eager-execution-like trace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "memplan/common/rng.h"
#include "memplan/planner/allocation_problem.h"

namespace memplan::planner {

// Brute force, independent of the solver's machinery: every order of the free buffers, each
// placed at the lowest aligned offset clear of those placed before it. Sorting any optimal
// packing by offset gives an order on which this reaches it, so the minimum is the optimum.
inline Bytes brute_force_height(const AllocationProblem& p) {
  std::vector<std::size_t> free_buffers;
  for (std::size_t i = 0; i < p.buffers.size(); ++i) {
    if (!p.buffers[i].fixed_offset) free_buffers.push_back(i);
  }
  Bytes best = std::numeric_limits<Bytes>::max();
  do {
    std::vector<Offset> offsets(p.buffers.size(), -1);
    for (std::size_t i = 0; i < p.buffers.size(); ++i) {
      if (p.buffers[i].fixed_offset) offsets[i] = *p.buffers[i].fixed_offset;
    }
    for (const std::size_t i : free_buffers) {
      const BufferSpec& b = p.buffers[i];
      Offset x = 0;
      for (bool moved = true; moved;) {
        moved = false;
        for (std::size_t j = 0; j < p.buffers.size(); ++j) {
          if (offsets[j] < 0 || j == i || !lifetimes_overlap(b, p.buffers[j])) continue;
          const Offset top = offsets[j] + footprint_bytes(p.buffers[j]);
          if (x < top && offsets[j] < x + footprint_bytes(b)) {
            x = align_up(top, b.alignment);
            moved = true;
          }
        }
      }
      offsets[i] = x;
    }
    best = std::min(best, packing_height(p, offsets));
  } while (std::next_permutation(free_buffers.begin(), free_buffers.end()));
  return best;
}

// A small eager-execution-like trace: activations saved by a forward pass and freed in
// reverse by the backward pass, temporaries in between, sizes from a few classes.
inline AllocationProblem trace_like(std::uint64_t seed, int layers) {
  Rng rng(seed);
  const Bytes classes[] = {512, 2048, 8192, 65536, 262144};
  auto size = [&] { return classes[rng.below(5)]; };
  AllocationProblem problem;
  auto add = [&](TimePoint first, TimePoint end) {
    problem.buffers.push_back({"b" + std::to_string(problem.buffers.size()), size(), 1, first, end, std::nullopt});
  };
  TimePoint t = 0;
  std::vector<std::size_t> saved;
  for (int i = 0; i < layers; ++i) {
    saved.push_back(problem.buffers.size());
    add(t, t + 1);  // end set in the backward pass
    ++t;
    for (std::uint64_t k = rng.below(3); k > 0; --k, ++t) add(t, t + 1 + TimePoint(rng.below(4)));
  }
  for (auto it = saved.rbegin(); it != saved.rend(); ++it, t += 2) {
    add(t, t + 1 + TimePoint(rng.below(6)));
    problem.buffers[*it].end_op = t + 1;
  }
  return problem;
}

}  // namespace memplan::planner
