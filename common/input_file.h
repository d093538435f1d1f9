// Reading files users point memplan at (weights, datasets, CSVs, snapshots), with bounds: only a
// regular file is read (a directory, named pipe, device such as /dev/zero or socket is refused
// before any byte is read, and opening never blocks), never more than a limit the caller states,
// and lines no longer than a limit. Refusals are Errors naming the file, what it was expected to
// be and the limit, so the CLI reports them as usage errors.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "memplan/common/result.h"
#include "memplan/common/types.h"

namespace memplan {

// An open regular file, read sequentially. Move-only; closes on destruction.
class InputFile {
 public:
  // Opens `path` as `what` ("weights file", "MiniMalloc CSV file"). Refuses anything but a
  // regular file, and a file larger than `max_bytes` (checked on its size before reading; a file
  // that grows while read is stopped at the same limit).
  static Result<InputFile> open(const std::string& path, Bytes max_bytes, std::string_view what);

  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  const std::string& path() const { return path_; }
  Bytes size() const { return size_; }            // at open time
  Bytes bytes_read() const { return bytes_read_; }  // taken from the file (some perhaps buffered)
  Bytes max_bytes() const { return max_bytes_; }

  // Reads up to `n` bytes into `buffer`; 0 at the end of the file. An Error when reading fails
  // or the file has grown past max_bytes.
  Result<std::size_t> read(char* buffer, std::size_t n);
  // Reads exactly `n` bytes (appended to `out`), or an Error saying the file ended early.
  Status read_exact(std::size_t n, std::string& out);
  // The next line without its '\n' (a trailing '\r' is kept), or nothing at the end of the file.
  // A line longer than `max_line_bytes` is an Error "PATH:LINE: ...", found before more
  // than max_line_bytes plus one read chunk (64 KiB) of it is held.
  Result<std::optional<std::string>> read_line(std::size_t max_line_bytes);
  // The line number of the last line read_line returned (1-based).
  std::size_t line_number() const { return line_number_; }

  // The open descriptor, for a library that reads the file itself (zlib's gzdopen on a dup()).
  int fd() const { return fd_; }

  // An Error "PATH: MESSAGE" for a defect found in this file.
  Error error(const std::string& message) const;

 private:
  InputFile(int fd, std::string path, std::string what, Bytes size, Bytes max_bytes);
  Result<std::size_t> read_file(char* buffer, std::size_t n);  // from the descriptor, bounded
  Status fill();  // refills buffer_ when empty; leaves it empty at the end of the file

  int fd_ = -1;
  std::string path_;
  std::string what_;
  Bytes size_ = 0;
  Bytes max_bytes_ = 0;
  Bytes bytes_read_ = 0;
  std::string buffer_;        // bytes read from the file and not yet handed out
  std::size_t buffer_pos_ = 0;
  std::size_t line_number_ = 0;
};

// The whole content of the regular file `path` (as InputFile::open refuses it otherwise).
Result<std::string> read_regular_file(const std::string& path, Bytes max_bytes, std::string_view what);

// "1000 bytes", "1.5 MiB (1572864 bytes)": a size for messages.
std::string describe_bytes(Bytes bytes);

}  // namespace memplan
