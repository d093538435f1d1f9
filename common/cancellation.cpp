#include "memplan/common/cancellation.h"

#include <atomic>

namespace memplan {
namespace {
std::atomic<bool> cancel_requested{false};
}  // namespace

void request_cancellation() { cancel_requested.store(true, std::memory_order_relaxed); }
void clear_cancellation() { cancel_requested.store(false, std::memory_order_relaxed); }
bool cancellation_requested() { return cancel_requested.load(std::memory_order_relaxed); }
void throw_if_cancelled() {
  if (cancellation_requested()) throw Cancelled();
}

}  // namespace memplan
