// Byte-size strings as users write them: "24GiB", "80GB", "16000MiB", "1.5 TiB", "4096".
// Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) of 1000.
#pragma once

#include <string>
#include <string_view>

#include "memplan/common/result.h"
#include "memplan/common/types.h"

namespace memplan {

// A positive byte count, or an Error saying what was wrong (empty, zero, negative, NaN,
// unknown unit, overflow) and what would work.
Result<Bytes> parse_byte_size(std::string_view text);
// The other way, for people: "1.50 MiB", "640 B" (two decimals, binary units).
std::string format_bytes(Bytes bytes);

}  // namespace memplan
