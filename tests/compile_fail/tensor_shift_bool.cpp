// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: a shift by a bool. Expected: "[tensor] shifts need int operands"
Tensor f(const Tensor& a) {
#ifndef TG_CF_FIXED
  return a << true;
#else
  return a << 1;
#endif
}

int main() { return 0; }
