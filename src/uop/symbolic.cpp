// The symbolic simplifier: symbolic_simple and symbolic as ordered sums of the rule groups in symbolic_rules.hpp.
#include "tg/symbolic.hpp"

#include <unordered_map>

#define TG_SYMBOLIC_NO_TABLES
#include "symbolic_rules.hpp"
#include "tg/error.hpp"

namespace tg {

const PatternMatcher& symbolic_simple() {
  static const PatternMatcher pm = sym::pm_simple_tables();
  return pm;
}

const PatternMatcher& symbolic() {
  // Folding and identities first, canonical order last (like terms and constants combine before terms are sorted).
  static const PatternMatcher pm =
      symbolic_simple() + sym::pm_arith_tables() + sym::pm_divmod_tables() + sym::pm_order_table();
  return pm;
}

UOpRef simplify(const UOpRef& u) { return graph_rewrite(u, symbolic(), nullptr, false, "simplify"); }

int64_t eval_int(const UOp* root, const std::vector<std::pair<std::string, int64_t>>& vars) {
  std::unordered_map<const UOp*, Value> v;
  auto value_of = [&](const UOp* c) {
    auto it = v.find(c);
    if (it != v.end()) return it->second;
    throw Error("[eval_int] variable " + (c->op == Ops::DEFINE_VAR ? std::get<VarArg>(c->arg).name : std::string(op_name(c->op))) +
                " has no value: bind it (Variable::bind) or pass its value");
  };
  for (const UOp* u : toposort(root)) {
    Value r;
    if (u->op == Ops::CONST) {
      r.i = u->const_int();
    } else if (u->op == Ops::BIND) {  // a bound variable: its value
      r.i = u->src(1)->const_int();
    } else if (u->op == Ops::DEFINE_VAR) {
      auto& name = std::get<VarArg>(u->arg).name;
      bool found = false;
      for (auto& [n, val] : vars)
        if (n == name) r.i = val, found = true;
      if (!found) continue;  // an error where it is read (under a BIND it is not)
    } else if (is_alu(u->op) || u->op == Ops::CAST || u->op == Ops::BITCAST) {
      std::vector<Value> s;
      for (auto& c : u->src()) s.push_back(value_of(c.get()));
      r = exec_alu(u->op, u->dtype, s, u->src(0)->dtype);
    } else {
      throw Error(std::string("[eval_int] cannot evaluate ") + op_name(u->op));
    }
    v[u] = r;
  }
  return value_of(root).i;
}

}  // namespace tg
