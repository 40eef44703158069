// The shared doctest main: DEVICE from the environment selects the device the suites run on.
#define DOCTEST_CONFIG_IMPLEMENT
#include <ostream>  // clang 14 + libstdc++ 12: doctest needs the complete type
#include <doctest/doctest.h>

int main(int argc, char** argv) {
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
