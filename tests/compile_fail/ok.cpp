// Control for the compile-fail tests: a valid table that must compile with the same command line, so that a
// broken harness (wrong include path, missing Boost, bad flags) cannot make every compile_fail_* test pass.
#include "tg/pattern.hpp"

using namespace tg::pat;

constexpr auto base = table(
    rule(x + 0_c, x),
    rule(x * 1_c, x),
    rule(x * 0_c, 0_c),
    rule(x + x, x * 2_c),
    rule((x * c0) + (x * c1), [](auto& m) {
      return m[x]->alu(tg::Ops::MUL, m[x]->const_like_int(m[c0]->const_int() + m[c1]->const_int()));
    }),
    rule(where(x, y, y), y),
    rule(op<tg::Ops::STORE>(x, y.is_float()), x),
    rule(lt(x, y), 1_c, [](auto& m) { return m[x]->vmax() < m[y]->vmin(); }));
constexpr auto extra = table(rule(x.is_float() - x.is_float(), 0_c), rule(bind(z, op<tg::Ops::RANGE>(y)) < 0_c, 0_c));
constexpr auto t = base + extra;
static_assert(decltype(t)::size == 10);

int main() {
  tg::PatternMatcher pm(t);
  return pm.size() == 10 ? 0 : 1;
}
