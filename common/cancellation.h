// Stopping long work from outside: the Python package turns Ctrl-C (KeyboardInterrupt) into a
// request that a search in progress stops. Long loops call throw_if_cancelled() at points where
// stopping leaves nothing half done (a plan not yet begun, an event not yet replayed); searches
// that run on worker threads look at cancellation_requested() and stop early instead, and the
// thread that called into memplan throws at its next point. The CLI never requests it (a signal
// ends the process there), so for a command-line user these checks are one atomic load each.
#pragma once

#include <stdexcept>

namespace memplan {

// Thrown by throw_if_cancelled(): the work was stopped on request, nothing is wrong.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("cancelled") {}
};

void request_cancellation();
void clear_cancellation();
bool cancellation_requested();
// Throws Cancelled once cancellation is requested. Only on the thread that called into memplan.
void throw_if_cancelled();

}  // namespace memplan
