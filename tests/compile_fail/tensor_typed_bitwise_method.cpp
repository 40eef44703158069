// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: bitwise_and on a TensorOf<float>. Expected: "[tensor] bitwise_and needs an int or bool tensor"
Tensor f(const Tensor& a, const Tensor& b) {
#ifndef TG_CF_FIXED
  return TensorOf<float>(a).bitwise_and(b);
#else
  return TensorOf<int>(a).bitwise_and(b);
#endif
}

int main() { return 0; }
