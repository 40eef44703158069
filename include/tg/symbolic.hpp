#pragma once
// The symbolic simplifier: rule tables for constant folding, identities, canonical order, like terms,
// div/mod folding from bounds, comparison and where folding. Users compose these matchers with their own.
// Integer rules follow C semantics with wrap-around (truncating IDIV/MOD; bounds-based rules check exactly that nothing
// wraps); float rules are IEEE-exact. The tables live in src/uop/symbolic_rules.hpp and are checked rule by rule by
// tg/rule_check.hpp.
// Thread-safety: the matchers are built once (thread-safe statics) and are immutable.
#include "tg/config.hpp"

#include "tg/pattern.hpp"

namespace tg {

/** Constant folding of every ALU op on constants, and the cheap identities (x+0, x*1, x//1, ...). */
const PatternMatcher& symbolic_simple();
/** symbolic_simple plus canonical ordering, like terms, div/mod and comparison folding from bounds, where folding. */
const PatternMatcher& symbolic();
/** Simplify one expression with symbolic(). */
UOpRef simplify(const UOpRef& u);

/** Evaluate an integer/bool expression with DEFINE_VARs bound by name (for tests and checkers). */
int64_t eval_int(const UOp* root, const std::vector<std::pair<std::string, int64_t>>& vars);

}  // namespace tg
