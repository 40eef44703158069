// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/tensor.hpp"

using namespace tg;

// Mistake: a bitwise op on a float result reached through methods (exp of an int tensor is float; the kind is
// carried through reshape, exp and sum). Expected: "[tensor] bitwise ops need int or bool operands"
Tensor f(const Tensor& a) {
#ifndef TG_CF_FIXED
  return TensorOf<int>(a).reshape({2, 3}).exp().sum(1) & 1;
#else
  return TensorOf<int>(a).reshape({2, 3}).abs().sum(1) & 1;
#endif
}

int main() { return 0; }
