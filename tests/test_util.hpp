#pragma once
// Helpers shared by the test suites.
#include <unistd.h>

#include <cstdio>
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

/** What `f` writes to stderr (file descriptor 2) while it runs; stderr is restored even if `f` throws. */
template <class F>
std::string stderr_of(F&& f) {
  std::fflush(stderr);
  FILE* cap = std::tmpfile();
  if (!cap) return "<no temporary file>";
  int saved = dup(2);
  dup2(fileno(cap), 2);
  struct Restore {
    int saved;
    ~Restore() {
      std::fflush(stderr);
      dup2(saved, 2);
      close(saved);
    }
  };
  {
    Restore r{saved};
    f();
  }
  std::rewind(cap);
  std::string out;
  for (int ch; (ch = std::fgetc(cap)) != EOF;) out += char(ch);
  std::fclose(cap);
  return out;
}

}  // namespace tg::test
