#include "memplan/common/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "memplan/common/memory_files.h"

namespace memplan {
namespace {

constexpr std::size_t kChunkBytes = std::size_t{1} << 16;

// What a non-regular file is, for the refusal.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (a stream without an end memplan could wait for)";
  if (S_ISCHR(mode)) return "a character device (such as /dev/zero, a stream without an end)";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string describe_bytes(Bytes bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.1f %s (%lld bytes)", value, units[unit], static_cast<long long>(bytes));
  return text;
}

Result<InputFile> InputFile::open(const std::string& path, Bytes max_bytes, std::string_view what) {
  const std::string quoted = "'" + path + "'";
  // An input handed over in memory (common/memory_files.h) is opened under its name.
  const std::string opened = memory_input_path(path).value_or(path);
  // stat first: it has no side effects on devices, and a named pipe is refused before open().
  struct stat st {};
  if (::stat(opened.c_str(), &st) != 0) {
    return Error{"cannot open " + std::string(what) + " " + quoted + ": " + std::strerror(errno)};
  }
  if (!S_ISREG(st.st_mode)) {
    return Error{quoted + " is " + kind_of(st.st_mode) + "; a " + std::string(what) + " must be a regular file"};
  }
  // O_NONBLOCK: should the path be swapped for a pipe after the stat, open() still returns at once.
  const int fd = ::open(opened.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error{"cannot open " + std::string(what) + " " + quoted + ": " + std::strerror(errno)};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{quoted + " is " + kind_of(st.st_mode) + "; a " + std::string(what) + " must be a regular file"};
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  const Bytes size = static_cast<Bytes>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return Error{quoted + " is " + describe_bytes(size) + "; a " + std::string(what) + " may be at most " +
                 describe_bytes(max_bytes)};
  }
  return InputFile(fd, path, std::string(what), size, max_bytes);
}

InputFile::InputFile(int fd, std::string path, std::string what, Bytes size, Bytes max_bytes)
    : fd_(fd), path_(std::move(path)), what_(std::move(what)), size_(size), max_bytes_(max_bytes) {}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      size_(other.size_),
      max_bytes_(other.max_bytes_),
      bytes_read_(other.bytes_read_),
      buffer_(std::move(other.buffer_)),
      buffer_pos_(other.buffer_pos_),
      line_number_(other.line_number_) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    size_ = other.size_;
    max_bytes_ = other.max_bytes_;
    bytes_read_ = other.bytes_read_;
    buffer_ = std::move(other.buffer_);
    buffer_pos_ = other.buffer_pos_;
    line_number_ = other.line_number_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Error InputFile::error(const std::string& message) const { return Error{path_ + ": " + message}; }

Result<std::size_t> InputFile::read(char* out, std::size_t n) {
  if (buffer_pos_ < buffer_.size()) {
    const std::size_t given = std::min(n, buffer_.size() - buffer_pos_);
    std::memcpy(out, buffer_.data() + buffer_pos_, given);
    buffer_pos_ += given;
    return given;
  }
  return read_file(out, n);
}

Result<std::size_t> InputFile::read_file(char* out, std::size_t n) {
  // Ask for one byte more than the limit allows, so a file that grew past it is noticed.
  const Bytes allowed = max_bytes_ - bytes_read_ + 1;
  const std::size_t want = static_cast<std::size_t>(std::min<Bytes>(static_cast<Bytes>(n), allowed));
  if (want == 0) return std::size_t{0};
  ssize_t got = 0;
  do {
    got = ::read(fd_, out, want);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return error(std::string("read error: ") + std::strerror(errno));
  bytes_read_ += got;
  if (bytes_read_ > max_bytes_) {
    return error("has grown past " + describe_bytes(max_bytes_) + " while being read; a " + what_ +
                 " may be at most that");
  }
  return static_cast<std::size_t>(got);
}

Status InputFile::read_exact(std::size_t n, std::string& out) {
  const std::size_t start = out.size();
  out.resize(start + n);
  std::size_t have = 0;
  while (have < n) {
    Result<std::size_t> got = read(out.data() + start + have, n - have);
    if (!got) {
      out.resize(start + have);
      return got.error();
    }
    if (got.value() == 0) {
      out.resize(start + have);
      return error("ends after " + std::to_string(bytes_read_) + " bytes, " + std::to_string(n - have) +
                   " bytes short of what its header announces (truncated?)");
    }
    have += got.value();
  }
  return Status::success();
}

Status InputFile::fill() {
  buffer_.resize(kChunkBytes);
  buffer_pos_ = 0;
  Result<std::size_t> got = read_file(buffer_.data(), buffer_.size());
  if (!got) {
    buffer_.clear();
    return got.error();
  }
  buffer_.resize(got.value());
  return Status::success();
}

Result<std::optional<std::string>> InputFile::read_line(std::size_t max_line_bytes) {
  std::string line;
  bool any = false;
  for (;;) {
    if (buffer_pos_ >= buffer_.size()) {
      if (Status s = fill(); !s) return s.error();
      if (buffer_.empty()) break;  // end of file
    }
    any = true;
    const std::size_t begin = buffer_pos_;
    const void* found = std::memchr(buffer_.data() + begin, '\n', buffer_.size() - begin);
    const std::size_t end = found ? static_cast<std::size_t>(static_cast<const char*>(found) - buffer_.data())
                                  : buffer_.size();
    line.append(buffer_, begin, end - begin);
    buffer_pos_ = found ? end + 1 : end;
    if (line.size() > max_line_bytes) {
      return Error{path_ + ":" + std::to_string(line_number_ + 1) + ": line is longer than " +
                   std::to_string(max_line_bytes) + " bytes"};
    }
    if (found) break;
  }
  if (!any) return std::optional<std::string>();
  ++line_number_;
  return std::optional<std::string>(std::move(line));
}

Result<std::string> read_regular_file(const std::string& path, Bytes max_bytes, std::string_view what) {
  Result<InputFile> file = InputFile::open(path, max_bytes, what);
  if (!file) return file.error();
  InputFile& in = file.value();
  std::string bytes;
  bytes.reserve(static_cast<std::size_t>(in.size()));
  char chunk[kChunkBytes];
  for (;;) {
    Result<std::size_t> got = in.read(chunk, sizeof chunk);
    if (!got) return got.error();
    if (got.value() == 0) break;
    bytes.append(chunk, got.value());
  }
  return bytes;
}

}  // namespace memplan
