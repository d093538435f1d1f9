// Expected failures (bad file, bad flag, does not fit, device out of memory) are values, not
// exceptions: Result<T> holds either a T or an Error whose message a user can act on. A caller
// that must tell kinds of failure apart (train's input errors from run failures) names its own
// error type with a `message`: Result<T, TrainError>.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "memplan/common/check.h"

namespace memplan {

struct Error {
  std::string message;
};

template <typename T, typename E = Error>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(E error) : v_(std::move(error)) {}          // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  const T& value() const& {
    MEMPLAN_CHECK(ok(), "value() on an error result: " << error().message);
    return std::get<T>(v_);
  }
  T& value() & {
    MEMPLAN_CHECK(ok(), "value() on an error result: " << std::get<E>(v_).message);
    return std::get<T>(v_);
  }
  T&& value() && {
    MEMPLAN_CHECK(ok(), "value() on an error result: " << std::get<E>(v_).message);
    return std::get<T>(std::move(v_));
  }
  const E& error() const {
    MEMPLAN_CHECK(!ok(), "error() on a successful result");
    return std::get<E>(v_);
  }

 private:
  std::variant<T, E> v_;
};

// Result<void>: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design
  static Status success() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    MEMPLAN_CHECK(!ok_, "error() on a successful status");
    return error_;
  }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace memplan
