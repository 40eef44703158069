// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/pattern.hpp"

using namespace tg::pat;

// Mistake: capture 0 is bound as any node and as a float node in the same pattern.
// Expected: "[rule] a capture is bound twice with different meanings"
#ifndef TG_CF_FIXED
constexpr auto t = table(rule(x + x.is_float(), x));
#else
constexpr auto t = table(rule(x.is_float() + x.is_float(), x));
#endif

int main() { return int(t.size) - 1; }
