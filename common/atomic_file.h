// All-or-nothing file writes: a reader (or the next run after a crash) sees either the previous
// file or the complete new one, never a partial file.
#pragma once

#include <string>
#include <string_view>

#include "memplan/common/result.h"

namespace memplan {

// Writes `bytes` to `path`: a temporary file in the same folder, fsync, rename over `path`,
// fsync of the folder. A failure leaves `path` as it was and removes the temporary file.
//
// Fault injection for tests: when the environment variable MEMPLAN_FAULT_KILL_AFTER_BYTES=N is
// set, the process kills itself with SIGKILL once N bytes of the temporary file are written, as
// a power cut or an OOM kill would.
Status write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace memplan
