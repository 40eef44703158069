// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: ~ of a true division (statically float). Expected: "[tensor] ~ needs an int or bool operand"
Tensor f(const Tensor& a, const Tensor& b) {
#ifndef TG_CF_FIXED
  return ~(a / b);
#else
  return ~(a < b);
#endif
}

int main() { return 0; }
