#pragma once
// tg::Error: every refusal of bad input. Messages start with the operation in brackets.
#include "tg/config.hpp"

#include <stdexcept>
#include <string>

namespace tg {

/** Base of all errors tg raises; the message names the operation, the inputs and what was expected. */
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
