// One libFuzzer binary per target: MEMPLAN_FUZZ_ENTRY names the entry point in targets.h.
#include <cstddef>
#include <cstdint>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memplan::fuzz::MEMPLAN_FUZZ_ENTRY(data, size);
  return 0;
}
