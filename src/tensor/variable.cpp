// Symbolic shapes: sint arithmetic, Variable binding, and the passes that unbind and rebind a graph's variables.
#include "tg/variable.hpp"

#include <functional>
#include <span>
#include <unordered_map>

#include "tg/error.hpp"
#include "tg/symbolic.hpp"

namespace tg {

namespace {
UOpRef index_expr(const UOpRef& e) {
  if (!e) throw Error("[sint] null expression");
  if (!(e->dtype == dtypes::index)) return simplify(e->cast(dtypes::index));
  return simplify(e);
}

}  // namespace

sint::sint(const UOpRef& expr) : u_(index_expr(expr)) {}

int64_t sint::value() const { return is_int() ? u_->const_int() : eval_int(u_.get(), {}); }

std::string sint::str() const {
  if (is_int()) return std::to_string(u_->const_int());
  std::string s = render_expr(u_.get());
  if (s.size() > 2 && s.front() == '(' && s.back() == ')') s = s.substr(1, s.size() - 2);
  return s;
}

sint operator+(const sint& a, const sint& b) { return sint(a.u_->alu(Ops::ADD, b.u_)); }
sint operator-(const sint& a, const sint& b) { return sint(a.u_->alu(Ops::SUB, b.u_)); }
sint operator*(const sint& a, const sint& b) { return sint(a.u_->alu(Ops::MUL, b.u_)); }

std::string shape_str(const SymShape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + s[i].str();
  return r + (s.size() == 1 ? ",)" : ")");
}

Variable::Variable(std::string name, int64_t min, int64_t max) {
  if (name.empty()) throw Error("[Variable] needs a name");
  if (min < 0) throw Error("[Variable] " + name + ": bounds must not be negative, got min " + std::to_string(min));
  u_ = UOp::variable(std::move(name), min, max);
}

const std::string& Variable::name() const { return std::get<VarArg>(u_->arg).name; }

sint Variable::bind(int64_t v) const {
  if (v < min() || v > max())
    throw Error("[Variable::bind] " + name() + " = " + std::to_string(v) + " is outside its bounds [" +
                std::to_string(min()) + ", " + std::to_string(max()) + "]");
  return sint(UOp::make(Ops::BIND, u_->dtype, {u_, UOp::cnst_int(u_->dtype, v)}));
}

std::vector<std::pair<std::string, int64_t>> bound_vars(std::span<const UOpRef> roots, const char* op) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const UOp* u : toposort(roots)) {
    if (u->op != Ops::BIND) continue;
    const std::string& n = std::get<VarArg>(u->src(0)->arg).name;
    int64_t v = u->src(1)->const_int();
    bool seen = false;
    for (auto& [k, x] : out)
      if (k == n) {
        seen = true;
        if (x != v)
          throw Error(std::string("[") + op + "] variable " + n + " is bound to " + std::to_string(x) + " and to " +
                      std::to_string(v) + " in one graph");
      }
    if (!seen) out.emplace_back(n, v);
  }
  return out;
}


UOpRef unbind(const UOpRef& u, std::vector<std::pair<std::string, int64_t>>* vals) {
  if (vals) {
    std::vector<UOpRef> r{u};
    auto b = bound_vars(r, "realize");
    vals->insert(vals->end(), b.begin(), b.end());
  }
  return substitute(u, [](const UOp* n) { return n->op == Ops::BIND ? n->src(0)->ref() : UOpRef{}; });
}

UOpRef rebind(const UOpRef& u, const std::vector<std::pair<std::string, int64_t>>& vals) {
  return substitute(u, [&](const UOp* n) -> UOpRef {
    if (n->op != Ops::BIND) return {};
    const VarArg& va = std::get<VarArg>(n->src(0)->arg);
    for (auto& [k, v] : vals)
      if (k == va.name) {
        if (v < va.min || v > va.max)
          throw Error("[Variable::bind] " + k + " = " + std::to_string(v) + " is outside its bounds [" +
                      std::to_string(va.min) + ", " + std::to_string(va.max) + "]");
        return UOp::make(Ops::BIND, n->dtype, {n->src(0)->ref(), UOp::cnst_int(n->dtype, v)});
      }
    return {};
  });
}

}  // namespace tg
