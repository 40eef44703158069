// symbolic's arithmetic rule groups: bounds, ADD/SUB/NEG, MUL, bitwise, and the canonical order of commutative ops.
#include "symbolic_rules.hpp"

namespace tg::sym {

PatternMatcher pm_arith_tables() {
  return PatternMatcher(sym_bounds) + PatternMatcher(sym_add) + PatternMatcher(sym_mul) + PatternMatcher(sym_bits);
}

PatternMatcher pm_order_table() { return PatternMatcher(sym_order); }

}  // namespace tg::sym
