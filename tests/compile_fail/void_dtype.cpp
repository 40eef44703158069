// Compile-fail test (see check.sh / meson.build in this folder). Built with -DTG_CF_FIXED the mistake is
// removed and the snippet must compile: that proves the failure comes from the one mistake below.
#include "tg/pattern.hpp"

using namespace tg::pat;

// Mistake: STORE has no dtype (it is always void), so a dtype predicate on it can never hold.
// Expected: "[pattern] a dtype predicate on an op that has no dtype"
#ifndef TG_CF_FIXED
constexpr auto t = table(rule(op<tg::Ops::STORE>(x, y).is_float(), x));
#else
constexpr auto t = table(rule(op<tg::Ops::STORE>(x, y.is_float()), x));
#endif

int main() { return int(t.size) - 1; }
