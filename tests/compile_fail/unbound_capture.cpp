// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/pattern.hpp"

using namespace tg::pat;

// Mistake: the replacement y is not bound by the pattern x + 0_c.
// Expected: "[rule] the replacement uses a capture that the pattern does not bind"
#ifndef TG_CF_FIXED
constexpr auto t = table(rule(x + 0_c, y));
#else
constexpr auto t = table(rule(x + 0_c, x));
#endif

int main() { return int(t.size) - 1; }
