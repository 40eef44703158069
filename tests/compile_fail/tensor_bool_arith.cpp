// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: adding two comparisons (statically bool). Expected: "[tensor] arithmetic on two bool operands"
Tensor f(const Tensor& a, const Tensor& b) {
#ifndef TG_CF_FIXED
  return (a < b) + (a > b);
#else
  return (a < b).cast(dtypes::int32) + (a > b);
#endif
}

int main() { return 0; }
