// How a flat tensor of `numel` elements is split over `world` ranks, stated once: every rank's
// shard holds shard_size(numel, world) = ceil(numel / world) elements (the last ranks' tails are
// padding), and rank r owns elements [shard_range(...).offset, + count) of the flat tensor.
#pragma once

#include <algorithm>
#include <cstdint>

namespace memplan::dist {

inline std::int64_t shard_size(std::int64_t numel, int world) { return (numel + world - 1) / world; }

struct ShardRange {
  std::int64_t offset = 0;  // first element owned
  std::int64_t count = 0;   // elements owned (may be 0 when numel < world)
};

inline ShardRange shard_range(std::int64_t numel, int world, int rank) {
  const std::int64_t s = shard_size(numel, world);
  const std::int64_t begin = std::min<std::int64_t>(numel, s * rank);
  const std::int64_t end = std::min<std::int64_t>(numel, begin + s);
  return ShardRange{begin, end - begin};
}

}  // namespace memplan::dist
