#pragma once
// tg::Error: every refusal of bad input. Messages start with the operation in brackets and, when the error comes
// from inside a public Tensor call, end with the user's call site: "[matmul] ... (at my_model.cpp:42)".
#include "tg/config.hpp"

#include <stdexcept>
#include <string>

namespace tg {

/** The source position of a call into tg's public API (a defaulted last parameter of the entry points), as
 *  std::source_location (which clang 14 cannot provide with libstdc++): `CallLoc loc = CallLoc::current()`. */
struct CallLoc {
  /// the caller's source file ("" when unknown)
  const char* file = "";
  /// the caller's line (0 when unknown)
  unsigned line = 0;
  /// the position of the expression that calls this (as a defaulted argument: the user's call)
  static constexpr CallLoc current(const char* f = __builtin_FILE(), unsigned l = __builtin_LINE()) noexcept {
    return {f, l};
  }
};

/** Marks the user's call being executed on this thread (an RAII guard at the top of a public entry point). The
 *  outermost guard wins, so an op calling other ops keeps the user's position; positions inside tg's own sources
 *  (src/, include/tg/) are ignored, so a layer calling an op does not report tg's line as the user's.
 *  Thread-safety: per thread (a thread_local). */
class CallSite {
 public:
  /// marks `loc` as this thread's user call unless an outer guard already did
  explicit CallSite(const CallLoc& loc) noexcept;
  ~CallSite();
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;
  /** " (at file:line)" for the active call on this thread, or "" outside any. */
  static std::string suffix();

 private:
  bool owner_ = false;
};

/** Base of all errors tg raises; the message names the operation, the inputs and what was expected, and ends with
 *  the user's call site when raised inside a public call (see CallSite). */
class Error : public std::runtime_error {
 public:
  /// an error with message `msg`, followed by the user's call site when one is active
  explicit Error(const std::string& msg) : std::runtime_error(msg + CallSite::suffix()) {}
  /// as Error(std::string(msg))
  explicit Error(const char* msg) : Error(std::string(msg)) {}
};

/** A malformed UOp caught by the spec checker (SPEC=1). */
class SpecError : public Error {
 public:
  using Error::Error;
};

/** An environment variable with a value tg cannot use. */
class EnvError : public Error {
 public:
  using Error::Error;
};

}  // namespace tg
