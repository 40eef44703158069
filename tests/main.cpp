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
  const char* nv = std::getenv("TG_NVRTC_CHECK");
  bool nvrtc = nv && std::atoi(nv) > 0;
  if (nvrtc) {
    try {
      tg::test::install_nvrtc_check();
    } catch (const tg::Error& e) {
      std::fprintf(stderr, "TG_NVRTC_CHECK: %s\n", e.what());
      return 1;
    }
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  int rc = ctx.run();
  if (nvrtc && tg::test::nvrtc_check_report() > 0) rc = rc ? rc : 1;
  return rc;
}
