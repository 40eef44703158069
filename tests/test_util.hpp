#pragma once
// Helpers shared by the test suites.
#include <string>

#include "tg/error.hpp"

namespace tg::test {

/** The message of the tg::Error `f` throws ("" when it throws none). */
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tg::test
