// Errors as values. A Status carries a message a user can act on (which file,
// field, line or request, and what was expected); Result<T> is a value or such a Status.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace hsx {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Error(std::string message) { return Status(std::move(message)); }
  bool ok() const { return !message_.has_value(); }
  const std::string& message() const {
    static const std::string kOk = "ok";
    return message_ ? *message_ : kOk;
  }
  // Prefixes context ("reading config.json: ...") while keeping the original cause.
  Status with_context(const std::string& context) const {
    return ok() ? *this : Status(context + ": " + *message_);
  }

 private:
  explicit Status(std::string m) : message_(std::move(m)) {}
  std::optional<std::string> message_;
};

inline Status Error(std::string message) { return Status::Error(std::move(message)); }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace hsx

#define HSX_CONCAT_INNER(a, b) a##b
#define HSX_CONCAT(a, b) HSX_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is an error.
#define HSX_RETURN_IF_ERROR(expr)                   \
  do {                                              \
    ::hsx::Status hsx_status_ = (expr);             \
    if (!hsx_status_.ok()) return hsx_status_;      \
  } while (0)

// `HSX_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define HSX_ASSIGN_OR_RETURN(lhs, expr) \
  HSX_ASSIGN_OR_RETURN_IMPL(HSX_CONCAT(hsx_result_, __LINE__), lhs, expr)
#define HSX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
