// Names that carry units: bytes, offsets and op positions are all integers, but never the same.
#pragma once

#include <cstdint>

namespace memplan {

using Bytes = std::int64_t;    // a size in bytes
using Offset = std::int64_t;   // a byte offset into an arena
using OpIndex = std::int32_t;  // a position in a schedule
using TensorId = std::int32_t; // an index into a graph's tensor table

inline constexpr TensorId kNoTensor = -1;

constexpr Bytes align_up(Bytes value, Bytes alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace memplan
