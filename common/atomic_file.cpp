#include "memplan/common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace memplan {
namespace {

// The value of a fault-injection variable; -1 when it is not set (or not a count).
long long fault_bytes(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  return (*end == '\0' && n >= 0) ? n : -1;
}

// Bytes every atomic write of this process has written, for MEMPLAN_FAULT_DISK_FULL_AFTER_BYTES.
std::atomic<long long> g_bytes_written{0};

// write(2), or ENOSPC once the process has written `disk_full_at` bytes (when >= 0).
ssize_t write_some(int fd, const char* data, std::size_t n, long long disk_full_at) {
  if (disk_full_at >= 0) {
    const long long room = disk_full_at - g_bytes_written.load();
    if (room <= 0) {
      errno = ENOSPC;
      return -1;
    }
    n = std::min(n, static_cast<std::size_t>(room));
  }
  const ssize_t done = ::write(fd, data, n);
  if (done > 0) g_bytes_written += done;
  return done;
}

}  // namespace

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

Status write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string_view pieces[] = {bytes};
  return write_file_atomically(path, pieces);
}

Status write_file_atomically(const std::string& path, std::span<const std::string_view> pieces) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  // mkstemp gives a name no one else uses, in the target's folder so the rename is atomic.
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) return Error{path + ": cannot create a temporary file in " + dir.string() + ": " + std::strerror(errno)};
  // mkstemp creates 0600; an output file is an ordinary file others may read.
  bool ok = ::fchmod(fd, 0644) == 0;
  int failure = ok ? 0 : errno;
  const long long fault_at = fault_bytes("MEMPLAN_FAULT_KILL_AFTER_BYTES");
  const long long disk_full_at = fault_bytes("MEMPLAN_FAULT_DISK_FULL_AFTER_BYTES");
  std::size_t total = 0;
  for (std::string_view piece : pieces) total += piece.size();
  std::size_t written = 0;  // of the whole file
  constexpr std::size_t kChunk = std::size_t{1} << 16;  // small enough for a fault to land mid-file
  for (std::string_view bytes : pieces) {
    std::size_t done = 0;  // of this piece
    while (ok && done < bytes.size()) {
      std::size_t chunk = std::min(kChunk, bytes.size() - done);
      if (fault_at >= 0) {
        const long long room = fault_at - g_bytes_written.load();
        if (room <= 0) std::raise(SIGKILL);
        chunk = std::min(chunk, static_cast<std::size_t>(room));
      }
      const ssize_t n = write_some(fd, bytes.data() + done, chunk, disk_full_at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failure = n < 0 ? errno : ENOSPC;
        ok = false;
        break;
      }
      done += static_cast<std::size_t>(n);
      written += static_cast<std::size_t>(n);
    }
  }
  if (ok && fault_at >= 0 && g_bytes_written.load() >= fault_at) std::raise(SIGKILL);
  // The data must be on disk before the rename makes it the file's content.
  if (ok && ::fsync(fd) != 0) {
    failure = errno;
    ok = false;
  }
  if (::close(fd) != 0 && ok) {
    failure = errno;
    ok = false;
  }
  if (!ok) {
    std::remove(tmpl.c_str());
    return Error{path + ": write failed after " + std::to_string(written) + " of " + std::to_string(total) +
                 " bytes: " + std::strerror(failure) + " (nothing was left in its place)"};
  }
  if (std::rename(tmpl.c_str(), path.c_str()) != 0) {
    failure = errno;
    std::remove(tmpl.c_str());
    return Error{path + ": cannot rename the temporary file into place: " + std::strerror(failure)};
  }
  sync_directory(dir.string());  // the rename itself durable
  return Status::success();
}

}  // namespace memplan
