// "Does it fit?" from a plan alone: total device bytes = the arena (exact) + the runtime's own
// overheads (documented constants per device kind), a breakdown by role, and the largest batch
// that fits by search over "fits / does not fit". Nothing here allocates or builds graphs; the
// caller supplies a function that plans a batch size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::planner {

struct Overhead {
  std::string what;
  Bytes bytes = 0;
};

// Memory the runtime uses outside the arena, by device kind ("cpu" or "cuda"). The CUDA figures
// are typical for a current driver and toolkit on Hopper: CUDA context ~500 MiB (it varies with
// driver, card and loaded modules: measure with `nvidia-smi` after cudaFree(0)), the cuBLAS
// handle ~8 MiB plus its default 32 MiB workspace on sm_90, the cuDNN handle ~16 MiB. The CPU
// device has none.
Result<std::vector<Overhead>> runtime_overheads(std::string_view device_kind);

struct FitBreakdown {
  Bytes parameters = 0;
  Bytes gradients_at_peak = 0;
  Bytes optimizer_state = 0;
  Bytes activations_at_peak = 0;  // activations, inputs and temporaries live at the peak
  Bytes workspace = 0;
  Bytes arena = 0;
  Bytes runtime_overhead = 0;
  Bytes total = 0;
};

struct FitReport {
  bool fits = false;
  Bytes budget_bytes = 0;
  Bytes headroom_bytes = 0;  // budget - total (negative when it does not fit)
  FitBreakdown breakdown;
  std::vector<Overhead> overheads;
};

FitReport fit_report(const MemoryPlan& plan, Bytes budget_bytes, const std::vector<Overhead>& overheads);

// Total device bytes for a batch size, or an Error (e.g. the model cannot be built at it).
using TotalBytesForBatch = std::function<Result<Bytes>(std::int64_t batch)>;

struct BatchSearch {
  std::int64_t max_batch = 0;  // 0: not even batch 1 fits
  std::int64_t probes = 0;     // plans made
};

// The largest batch in [1, limit] whose total fits the budget. Memory grows with the batch, so
// doubling then bisection finds it; the answer is checked: max_batch fits and max_batch + 1
// does not (unless max_batch == limit).
Result<BatchSearch> search_max_batch(const TotalBytesForBatch& total_bytes, Bytes budget_bytes,
                                     std::int64_t limit = std::int64_t{1} << 20);

}  // namespace memplan::planner
