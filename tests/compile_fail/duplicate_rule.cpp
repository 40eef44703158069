// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/pattern.hpp"

using namespace tg::pat;

// Mistake: the same rule appears twice in one table.
// Expected: "[table] a rule appears twice in this table"
#ifndef TG_CF_FIXED
constexpr auto t = table(rule(x + 0_c, x), rule(x * 1_c, x), rule(x + 0_c, x));
#else
constexpr auto t = table(rule(x + 0_c, x), rule(x * 1_c, x), rule(x * 0_c, 0_c));
#endif

int main() { return int(t.size) - 3; }
