// The symbolic simplifier (first cut: constant folding and identities; grown by the symbolic tables).
#include "tg/symbolic.hpp"

#include <unordered_map>

namespace tg {
using namespace tg::pat;

namespace {
constexpr auto sym_identity = table(
    rule(x + 0_c, x),  // x+0 -> x
    rule(x * 1_c, x),  // x*1 -> x
    rule(x * 0_c, 0_c));  // x*0 -> 0
}  // namespace

const PatternMatcher& symbolic_simple() {
  static const PatternMatcher pm(sym_identity);
  return pm;
}
const PatternMatcher& symbolic() { return symbolic_simple(); }
UOpRef simplify(const UOpRef& u) { return graph_rewrite(u, symbolic()); }

int64_t eval_int(const UOp* root, const std::vector<std::pair<std::string, int64_t>>& vars) {
  std::unordered_map<const UOp*, Value> v;
  for (const UOp* u : toposort(root)) {
    Value r;
    if (u->op == Ops::CONST) r.i = u->const_int();
    else if (u->op == Ops::DEFINE_VAR) {
      auto& name = std::get<VarArg>(u->arg).name;
      bool found = false;
      for (auto& [n, val] : vars)
        if (n == name) { r.i = val; found = true; }
      if (!found) throw Error("[eval_int] no value for variable " + name);
    } else if (is_alu(u->op) || u->op == Ops::CAST) {
      std::vector<Value> s;
      for (auto& c : u->src()) s.push_back(v.at(c.get()));
      r = exec_alu(u->op, u->dtype, s, u->src(u->op == Ops::WHERE ? 1 : 0)->dtype);
    } else {
      throw Error(std::string("[eval_int] cannot evaluate ") + op_name(u->op));
    }
    v[u] = r;
  }
  return v.at(root).i;
}

}  // namespace tg
