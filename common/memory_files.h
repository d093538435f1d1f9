// Files a library user hands memplan in memory rather than on disk: the Python package passes a
// snapshot dict, a config dict or an ONNX export it made in memory under a name, and reads the
// reports a command writes (--html, --svg) back without a folder to put them in. While a
// ScopedMemoryInput lives, InputFile::open (so every reader of user files) finds its name before
// looking on disk, and messages name it as they would name a path; while a ScopedMemoryOutput
// lives, writes of a report to its name are kept in memory. The names are process-wide: the
// registry is locked, and a name registered twice is an error, not a shadow.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "memplan/common/result.h"

namespace memplan {

class ScopedMemoryInput {
 public:
  // Registers `bytes` under `name` (copied into an anonymous in-memory file).
  static Result<ScopedMemoryInput> create(std::string name, std::string_view bytes);
  ScopedMemoryInput(ScopedMemoryInput&& other) noexcept;
  ScopedMemoryInput& operator=(ScopedMemoryInput&&) = delete;
  ScopedMemoryInput(const ScopedMemoryInput&) = delete;
  ScopedMemoryInput& operator=(const ScopedMemoryInput&) = delete;
  ~ScopedMemoryInput();

  const std::string& name() const { return name_; }

 private:
  explicit ScopedMemoryInput(std::string name) : name_(std::move(name)) {}
  std::string name_;  // empty once moved from
};

// The path that opens the in-memory input `name` (/proc/self/fd/N: each open has its own file
// offset), or nothing when no input of that name is registered.
std::optional<std::string> memory_input_path(const std::string& name);

class ScopedMemoryOutput {
 public:
  static Result<ScopedMemoryOutput> create(std::string name);
  ScopedMemoryOutput(ScopedMemoryOutput&& other) noexcept;
  ScopedMemoryOutput& operator=(ScopedMemoryOutput&&) = delete;
  ScopedMemoryOutput(const ScopedMemoryOutput&) = delete;
  ScopedMemoryOutput& operator=(const ScopedMemoryOutput&) = delete;
  ~ScopedMemoryOutput();

  const std::string& name() const { return name_; }
  // What was written to the name (the last write wins, as a file's would); nothing if unwritten.
  std::optional<std::string> bytes() const;

 private:
  explicit ScopedMemoryOutput(std::string name) : name_(std::move(name)) {}
  std::string name_;
};

// Keeps `bytes` as the content of the memory output `name` and returns true, or returns false
// when no output of that name is registered (the caller then writes a file).
bool write_memory_output(const std::string& name, std::string_view bytes);

}  // namespace memplan
