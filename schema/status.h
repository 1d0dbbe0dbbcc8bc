// bitroll::Status and bitroll::Result<T>: errors are values (leveldb's rule).
//
// Every call that crosses a module boundary and can fail returns a Status or a Result<T>. No
// exception crosses a module boundary, and library code never calls exit()/abort() on bad input.
//
// The ErrorCode numbering is part of the wire protocol (schema/rollout.fbs mirrors it) and of the
// WAL: append new codes at the end, never renumber.
//
// Thread-safety: Status and Result are values; distinct objects may be used from distinct threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace bitroll {

enum class ErrorCode : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,      // the caller passed something malformed or out of range
  kNotFound = 2,             // a named thing (file, model, trajectory, tool) does not exist
  kCorruption = 3,           // stored bytes fail a check (checksum, magic, size, verifier)
  kIoError = 4,              // the operating system refused a read, write or sync
  kUnsupported = 5,          // valid input that this build cannot handle (format, arch, ISA)
  kOutOfRange = 6,           // an index or token id outside its domain
  kResourceExhausted = 7,    // a limit was hit (KV blocks, memory, output bytes, queue)
  kBusy = 8,                 // backpressure: try again later
  kTimeout = 9,              // a deadline passed
  kAborted = 10,             // the work was cancelled
  kInternal = 11,            // a bug in bitroll; the message says where
  kUnavailable = 12,         // a tier, device or replica is not available here
  kFailedPrecondition = 13,  // the call is valid but not in this state (e.g. sticky WAL error)
  kNoSpace = 14,             // the disk or the LMDB map is full
  kProtocol = 15,            // a wire message is malformed, of unknown type or wrong version
};

// Stable lower-case name of a code, e.g. "corruption". Never returns nullptr.
const char* ErrorCodeName(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {ErrorCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {ErrorCode::kCorruption, std::move(m)}; }
  static Status IoError(std::string m) { return {ErrorCode::kIoError, std::move(m)}; }
  static Status Unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {ErrorCode::kOutOfRange, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {ErrorCode::kResourceExhausted, std::move(m)};
  }
  static Status Busy(std::string m) { return {ErrorCode::kBusy, std::move(m)}; }
  static Status Timeout(std::string m) { return {ErrorCode::kTimeout, std::move(m)}; }
  static Status Aborted(std::string m) { return {ErrorCode::kAborted, std::move(m)}; }
  static Status Internal(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }
  static Status Unavailable(std::string m) { return {ErrorCode::kUnavailable, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {ErrorCode::kFailedPrecondition, std::move(m)};
  }
  static Status NoSpace(std::string m) { return {ErrorCode::kNoSpace, std::move(m)}; }
  static Status Protocol(std::string m) { return {ErrorCode::kProtocol, std::move(m)}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK", or "<code name>: <message>".
  std::string ToString() const {
    if (ok()) return "OK";
    return std::string(ErrorCodeName(code_)) + ": " + message_;
  }
  // Returns a copy whose message is prefixed with `context` (e.g. a file name).
  Status WithContext(std::string_view context) const {
    if (ok()) return *this;
    return Status(code_, std::string(context) + ": " + message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kCorruption:
      return "corruption";
    case ErrorCode::kIoError:
      return "io_error";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kOutOfRange:
      return "out_of_range";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kBusy:
      return "busy";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kAborted:
      return "aborted";
    case ErrorCode::kInternal:
      return "internal";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kNoSpace:
      return "no_space";
    case ErrorCode::kProtocol:
      return "protocol";
  }
  return "unknown";
}

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error, or OK when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  // REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace bitroll

#define BR_CONCAT_INNER_(a, b) a##b
#define BR_CONCAT_(a, b) BR_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define BR_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::bitroll::Status br_status_ = (expr);   \
    if (!br_status_.ok()) return br_status_; \
  } while (0)

// `lhs = value of expr`, or return its Status from the enclosing function.
#define BR_ASSIGN_OR_RETURN(lhs, expr) \
  BR_ASSIGN_OR_RETURN_IMPL_(BR_CONCAT_(br_result_, __LINE__), lhs, expr)
#define BR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
