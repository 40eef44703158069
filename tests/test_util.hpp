#pragma once
// Helpers shared by the test suites.
#include <string>

#include "tg/error.hpp"

namespace tg::test {

/** The message of the tg::Error `f` throws ("" when it throws none), without the caller's position that ends a
 *  message raised inside a public call (" (at file:line)"; api_typed_tests checks it). */
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string m = e.what();
    size_t at = m.rfind(" (at ");
    if (at != std::string::npos && m.back() == ')') m.resize(at);
    return m;
  }
  return "";
}

}  // namespace tg::test
