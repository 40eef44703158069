// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/pattern.hpp"

using namespace tg::pat;

// Mistake: two tables that each hold the rule x + 0_c -> x are composed with +.
// Expected: "[table] a rule appears twice in this table"
constexpr auto a = table(rule(x + 0_c, x), rule(x * 1_c, x));
#ifndef TG_CF_FIXED
constexpr auto b = table(rule(x * 0_c, 0_c), rule(x + 0_c, x));
#else
constexpr auto b = table(rule(x * 0_c, 0_c), rule(0_c + x, x));
#endif
constexpr auto t = a + b;

int main() { return int(t.size) - 4; }
