#include "memplan/common/memory_files.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace memplan {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, int> inputs;  // name -> memfd
  std::map<std::string, std::optional<std::string>> outputs;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: scoped entries may outlive static teardown
  return *r;
}

Status write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{std::string("cannot keep an in-memory file: ") + std::strerror(errno)};
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

}  // namespace

Result<ScopedMemoryInput> ScopedMemoryInput::create(std::string name, std::string_view bytes) {
  if (name.empty()) return Error{"an in-memory input needs a name"};
  const int fd = ::memfd_create("memplan-input", MFD_CLOEXEC);
  if (fd < 0) return Error{std::string("cannot create an in-memory file: ") + std::strerror(errno)};
  if (Status written = write_all(fd, bytes); !written) {
    ::close(fd);
    return written.error();
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.inputs.emplace(name, fd).second) {
    ::close(fd);
    return Error{"an in-memory input named '" + name + "' is already registered"};
  }
  return ScopedMemoryInput(std::move(name));
}

ScopedMemoryInput::ScopedMemoryInput(ScopedMemoryInput&& other) noexcept : name_(std::exchange(other.name_, {})) {}

ScopedMemoryInput::~ScopedMemoryInput() {
  if (name_.empty()) return;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.inputs.find(name_);
  if (it == r.inputs.end()) return;
  ::close(it->second);
  r.inputs.erase(it);
}

std::optional<std::string> memory_input_path(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.inputs.empty()) return std::nullopt;
  auto it = r.inputs.find(name);
  if (it == r.inputs.end()) return std::nullopt;
  return "/proc/self/fd/" + std::to_string(it->second);
}

Result<ScopedMemoryOutput> ScopedMemoryOutput::create(std::string name) {
  if (name.empty()) return Error{"an in-memory output needs a name"};
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.outputs.emplace(name, std::nullopt).second) {
    return Error{"an in-memory output named '" + name + "' is already registered"};
  }
  return ScopedMemoryOutput(std::move(name));
}

ScopedMemoryOutput::ScopedMemoryOutput(ScopedMemoryOutput&& other) noexcept : name_(std::exchange(other.name_, {})) {}

ScopedMemoryOutput::~ScopedMemoryOutput() {
  if (name_.empty()) return;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.outputs.erase(name_);
}

std::optional<std::string> ScopedMemoryOutput::bytes() const {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.outputs.find(name_);
  if (it == r.outputs.end()) return std::nullopt;
  return it->second;
}

bool write_memory_output(const std::string& name, std::string_view bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.outputs.find(name);
  if (it == r.outputs.end()) return false;
  it->second = std::string(bytes);
  return true;
}

}  // namespace memplan
