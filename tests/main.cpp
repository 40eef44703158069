// The shared doctest main: DEVICE from the environment selects the device the suites run on (tg's default
// device); TG_NVRTC_CHECK=1 also renders every kernel for CUDA and compiles it with NVRTC (nvrtc_check.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <cstdio>
#include <cstdlib>
#include <ostream>  // clang 14 + libstdc++ 12: doctest needs the complete type
#include <doctest/doctest.h>

#include "nvrtc_check.hpp"
#include "tg/error.hpp"

int main(int argc, char** argv) {
  bool nvrtc = false;
  try {
    nvrtc = tg::test::nvrtc_check_from_env();
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "TG_NVRTC_CHECK: %s\n", e.what());
    return 1;
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return tg::test::nvrtc_check_exit(nvrtc, ctx.run());
}
