// symbolic's div/mod, comparison and where rule groups.
#include "symbolic_rules.hpp"

namespace tg::sym {

PatternMatcher pm_divmod_tables() {
  return PatternMatcher(sym_divmod) + PatternMatcher(sym_cmp) + PatternMatcher(sym_where);
}

}  // namespace tg::sym
