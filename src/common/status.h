// Status and Result<T>: the error currency of gmux.
//
// A Status is a closed code plus a message a person can act on. Result<T> holds either a value
// or a non-OK Status. Both are [[nodiscard]]; propagate with early returns (GMUX_RETURN_IF_ERROR,
// GMUX_ASSIGN_OR_RETURN). No exceptions cross a module boundary. Bugs are assertions, not Status.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gmux {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is malformed (config, scenario, message)
  kNotFound,            // an id or name that does not exist (for this caller)
  kAlreadyExists,
  kPermissionDenied,    // the caller may not do this (e.g. a foreign id)
  kResourceExhausted,   // a quota, a limit, memory
  kFailedPrecondition,  // the system is not in a state that allows this
  kOutOfRange,
  kUnavailable,         // a peer or device is not reachable right now
  kUnimplemented,
  kInternal,            // an invariant broke; a bug
  kDataLoss,            // truncated or corrupt data
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is "prefix: message"; OK stays OK.
  Status WithPrefix(std::string_view prefix) const;

  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }

// Either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }

  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gmux

#define GMUX_CONCAT_INNER_(a, b) a##b
#define GMUX_CONCAT_(a, b) GMUX_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not OK.
#define GMUX_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::gmux::Status gmux_status_ = (expr);          \
    if (!gmux_status_.ok()) return gmux_status_;   \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status.
#define GMUX_ASSIGN_OR_RETURN(lhs, expr) \
  GMUX_ASSIGN_OR_RETURN_IMPL_(GMUX_CONCAT_(gmux_result_, __LINE__), lhs, expr)
#define GMUX_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
