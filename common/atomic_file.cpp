#include "memplan/common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace memplan {
namespace {

// -1 when no fault is injected.
long long kill_after_bytes() {
  const char* value = std::getenv("MEMPLAN_FAULT_KILL_AFTER_BYTES");
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  return (*end == '\0' && n >= 0) ? n : -1;
}

}  // namespace

Status write_file_atomically(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  // mkstemp gives a name no one else uses, in the target's folder so the rename is atomic.
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) return Error{path + ": cannot create a temporary file in " + dir.string()};
  // mkstemp creates 0600; an output file is an ordinary file others may read.
  bool ok = ::fchmod(fd, 0644) == 0;
  const long long fault_at = kill_after_bytes();
  std::size_t written = 0;
  constexpr std::size_t kChunk = std::size_t{1} << 16;  // small enough for a fault to land mid-file
  while (ok && written < bytes.size()) {
    std::size_t chunk = std::min(kChunk, bytes.size() - written);
    if (fault_at >= 0) {
      const auto room = static_cast<std::size_t>(fault_at) > written ? static_cast<std::size_t>(fault_at) - written : 0;
      if (room == 0) std::raise(SIGKILL);
      chunk = std::min(chunk, room);
    }
    const ssize_t n = ::write(fd, bytes.data() + written, chunk);
    if (n <= 0) {
      ok = false;
      break;
    }
    written += static_cast<std::size_t>(n);
  }
  if (ok && fault_at >= 0 && written >= static_cast<std::size_t>(fault_at)) std::raise(SIGKILL);
  // The data must be on disk before the rename makes it the file's content.
  if (ok && ::fsync(fd) != 0) ok = false;
  if (::close(fd) != 0) ok = false;
  if (!ok) {
    std::remove(tmpl.c_str());
    return Error{path + ": write failed (disk full or not writable?)"};
  }
  if (std::rename(tmpl.c_str(), path.c_str()) != 0) {
    std::remove(tmpl.c_str());
    return Error{path + ": cannot rename the temporary file into place"};
  }
  // Make the rename itself durable.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status::success();
}

}  // namespace memplan
