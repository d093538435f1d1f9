// Programmer-error checks: a failed MEMPLAN_CHECK is a bug in memplan, not a user mistake.
// It throws memplan::InternalError carrying file:line and the failed expression, so tests can
// observe it and the CLI can report it; expected failures use Result<T> (result.h) instead.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace memplan {

struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& message);

}  // namespace memplan

#define MEMPLAN_CHECK(cond, ...)                                                         \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] {                                                          \
      std::ostringstream memplan_check_msg_;                                             \
      (void)(memplan_check_msg_ __VA_OPT__(<< __VA_ARGS__));                             \
      ::memplan::check_failed(__FILE__, __LINE__, #cond, memplan_check_msg_.str());      \
    }                                                                                    \
  } while (0)
