#include "memplan/planner/fit.h"

#include <string>

namespace memplan::planner {

namespace {
constexpr Bytes kMiB = Bytes{1} << 20;
}

Result<std::vector<Overhead>> runtime_overheads(std::string_view device_kind) {
  if (device_kind == "cpu") return std::vector<Overhead>{};
  if (device_kind == "cuda") {
    return std::vector<Overhead>{{"CUDA context", 500 * kMiB},
                                 {"cuBLAS handle", 8 * kMiB},
                                 {"cuBLAS workspace", 32 * kMiB},
                                 {"cuDNN handle", 16 * kMiB}};
  }
  return Error{"unknown device kind '" + std::string(device_kind) + "' (expected cuda or cpu)"};
}

FitReport fit_report(const MemoryPlan& plan, Bytes budget_bytes, const std::vector<Overhead>& overheads) {
  FitReport r;
  r.budget_bytes = budget_bytes;
  r.overheads = overheads;
  FitBreakdown& b = r.breakdown;
  for (const auto& [role, bytes] : plan.peak_by_role()) {
    switch (role) {
      case graph::Role::parameter: b.parameters += bytes; break;
      case graph::Role::optimizer_state: b.optimizer_state += bytes; break;
      case graph::Role::gradient: b.gradients_at_peak += bytes; break;
      default: b.activations_at_peak += bytes; break;
    }
  }
  b.arena = plan.arena_bytes;
  for (const Overhead& o : overheads) b.runtime_overhead += o.bytes;
  b.total = b.arena + b.runtime_overhead;
  r.headroom_bytes = budget_bytes - b.total;
  r.fits = b.total <= budget_bytes;
  return r;
}

Result<BatchSearch> search_max_batch(const TotalBytesForBatch& total_bytes, Bytes budget_bytes, std::int64_t limit) {
  BatchSearch out;
  auto fits = [&](std::int64_t batch) -> Result<bool> {
    ++out.probes;
    Result<Bytes> total = total_bytes(batch);
    if (!total) return total.error();
    return total.value() <= budget_bytes;
  };
  Result<bool> first = fits(1);
  if (!first) return first.error();
  if (!first.value()) return out;  // max_batch 0
  std::int64_t lo = 1, hi = 2;     // lo fits; hi is untested
  while (hi <= limit) {
    Result<bool> f = fits(hi);
    if (!f) return f.error();
    if (!f.value()) break;
    lo = hi;
    if (hi == limit) break;
    hi = std::min(limit, hi * 2);
  }
  if (lo == limit) {
    out.max_batch = lo;
    return out;
  }
  // lo fits, hi does not (or hi > limit): bisect.
  hi = std::min(hi, limit + 1);
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    Result<bool> f = fits(mid);
    if (!f) return f.error();
    (f.value() ? lo : hi) = mid;
  }
  out.max_batch = lo;
  return out;
}

}  // namespace memplan::planner
