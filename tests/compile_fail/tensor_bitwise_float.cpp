// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: a bitwise op on an expression that is statically float (tensor + a double is float whatever
// the tensor's dtype). Expected: "[tensor] bitwise ops need int or bool operands"
Tensor f(const Tensor& a) {
#ifndef TG_CF_FIXED
  return (a + 1.5) & a;
#else
  return (a + 1) & a;
#endif
}

int main() { return 0; }
