// Helpers shared by the caching-allocator, expandable-segment and allocation-trace tests.
#pragma once

#include "memplan/common/types.h"
#include "memplan/runtime/virtual_memory.h"

namespace memplan::runtime::test_support {

inline constexpr Bytes MiB = Bytes{1} << 20;
// A block's pointer as the device address the allocator reports.
inline DeviceAddress addr(void* p) { return reinterpret_cast<DeviceAddress>(p); }

}  // namespace memplan::runtime::test_support
