#pragma once
// Helpers shared by the test suites.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tg/error.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

namespace tg::test {

/** The last kernel of t's schedule: its AST and the buffers it writes and reads. */
struct LastKernel {
  UOpRef ast;
  std::vector<std::shared_ptr<Buffer>> bufs;
};
inline LastKernel last_kernel(const Tensor& t) {
  UOpRef root = t.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  if (s.items.empty()) throw Error("[test] last_kernel: the tensor's schedule has no kernel");
  return LastKernel{s.items.back().ast, s.items.back().bufs};
}

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
