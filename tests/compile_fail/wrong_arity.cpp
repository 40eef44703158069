// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/pattern.hpp"

using namespace tg::pat;

// Mistake: WHERE takes three sources, not two.
// Expected: "[pattern] wrong number of sources for this op"
#ifndef TG_CF_FIXED
constexpr auto t = table(rule(op<tg::Ops::WHERE>(x, y), y));
#else
constexpr auto t = table(rule(op<tg::Ops::WHERE>(x, y, y), y));
#endif

int main() { return int(t.size) - 1; }
