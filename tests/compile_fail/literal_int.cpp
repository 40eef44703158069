// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/pattern.hpp"

using namespace tg::pat;

// Mistake: a plain int in a pattern; constants are written as N_c.
// Expected: "[pattern] write integer constants in patterns as N_c"
#ifndef TG_CF_FIXED
constexpr auto t = table(rule(x + 1, x));
#else
constexpr auto t = table(rule(x + 1_c, x));
#endif

int main() { return int(t.size) - 1; }
