// All-or-nothing file writes: a reader (or the next run after a crash) sees either the previous
// file or the complete new one, never a partial file.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "memplan/common/result.h"

namespace memplan {

// Writes `bytes` to `path`: a temporary file in the same folder, fsync, rename over `path`,
// fsync of the folder. A failure leaves `path` as it was and removes the temporary file.
//
// Fault injection for tests: when the environment variable MEMPLAN_FAULT_KILL_AFTER_BYTES=N is
// set, the process kills itself with SIGKILL once its atomic writes together have written N bytes
// (of the first file, or N minus the earlier files' bytes into a later one), as a power cut or an
// OOM kill would. MEMPLAN_FAULT_DISK_FULL_AFTER_BYTES=N makes every write fail
// with ENOSPC once the process's atomic writes together have written N bytes, as a disk filling
// up would.
Status write_file_atomically(const std::string& path, std::string_view bytes);
// The same for a file made of `pieces` one after another (a header and data held apart).
Status write_file_atomically(const std::string& path, std::span<const std::string_view> pieces);

// Makes the renames and removals already done inside folder `dir` durable (fsync of the folder);
// best effort: a folder that cannot be opened is left as it is.
void sync_directory(const std::string& dir);

}  // namespace memplan
