// symbolic_simple's rule groups: constant folding, identities, bool algebra, casts, IEEE-exact float identities.
#include "symbolic_rules.hpp"

namespace tg::sym {

PatternMatcher pm_simple_tables() {
  return PatternMatcher(sym_fold) + PatternMatcher(sym_identity) + PatternMatcher(sym_bool) +
         PatternMatcher(sym_cast) + PatternMatcher(sym_float);
}

}  // namespace tg::sym
