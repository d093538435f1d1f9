// SIGTERM and SIGINT as a request to stop cleanly: the first one is recorded for the training
// loop to see between steps (finish the step, save a checkpoint, exit); a second one ends the
// process at once with 128 + the signal, leaving the checkpoints on disk as they were (a save in
// flight is never renamed into place, so it does not count).
#pragma once

#include <csignal>

namespace memplan::train {

class StopSignals {
 public:
  // Installs the handlers; the destructor puts back the ones there were.
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received first (SIGTERM or SIGINT), or 0.
  static int received();
  // Forgets a received signal (tests; a run that handled it).
  static void clear();

 private:
  struct sigaction previous_term_{}, previous_int_{};
};

// "SIGTERM", "SIGINT", "SIGKILL", or "a signal".
const char* signal_name(int signal);

}  // namespace memplan::train
