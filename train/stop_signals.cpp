#include "memplan/train/stop_signals.h"

#include <unistd.h>

#include <atomic>

namespace memplan::train {
namespace {

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

extern "C" void on_stop_signal(int signal) {
  int expected = 0;
  if (!g_received.compare_exchange_strong(expected, signal)) _exit(128 + signal);  // the second signal
}

}  // namespace

StopSignals::StopSignals() {
  g_received.store(0);  // a signal a previous run in this process handled is not this run's
  struct sigaction action{};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a write or read in progress carries on; the loop checks between steps
  sigaction(SIGTERM, &action, &previous_term_);
  sigaction(SIGINT, &action, &previous_int_);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &previous_term_, nullptr);
  sigaction(SIGINT, &previous_int_, nullptr);
}

int StopSignals::received() { return g_received.load(); }
void StopSignals::clear() { g_received.store(0); }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGKILL: return "SIGKILL";
    default: return "a signal";
  }
}

}  // namespace memplan::train
