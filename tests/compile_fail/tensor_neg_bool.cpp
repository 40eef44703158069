// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: negating a comparison (statically bool). Expected: "[tensor] negation of a bool tensor"
Tensor f(const Tensor& a, const Tensor& b) {
#ifndef TG_CF_FIXED
  return -(a < b);
#else
  return (a < b).logical_not();
#endif
}

int main() { return 0; }
