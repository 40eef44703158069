// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: lshift on a TensorOf<bool>. Expected: "[tensor] lshift needs an int tensor"
Tensor f(const Tensor& a, const Tensor& b) {
#ifndef TG_CF_FIXED
  return TensorOf<bool>(a).lshift(b);
#else
  return TensorOf<int>(a).lshift(b);
#endif
}

int main() { return 0; }
