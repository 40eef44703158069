// Printing: the graph as numbered lines, and index arithmetic as infix text.
#include <sstream>
#include <unordered_map>

#include "tg/uop.hpp"

namespace tg {

std::string arg_str(const Arg& a) {
  struct V {
    std::string operator()(std::monostate) const { return ""; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      std::ostringstream os;
      os.precision(17);
      os << v;
      return os.str();
    }
    std::string operator()(const std::string& s) const { return "'" + s + "'"; }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string s = "(";
      for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + (v.size() == 1 ? ",)" : ")");
    }
    std::string operator()(const ReduceArg& r) const { return std::string(op_name(r.op)) + ", " + (*this)(r.axes); }
    std::string operator()(const VarArg& v) const {
      return "'" + v.name + "', " + std::to_string(v.min) + ", " + std::to_string(v.max);
    }
  };
  return std::visit(V{}, a);
}

std::string print_graph(const UOp* root) {
  auto order = toposort(root);
  std::unordered_map<const UOp*, size_t> idx;
  std::ostringstream os;
  for (size_t i = 0; i < order.size(); i++) {
    const UOp* u = order[i];
    idx[u] = i;
    os.width(4);
    os << i << " " << op_name(u->op);
    for (size_t k = std::char_traits<char>::length(op_name(u->op)); k < 12; k++) os << ' ';
    os << " " << u->dtype.name() << " [";
    for (size_t k = 0; k < u->nsrc(); k++) os << (k ? ", " : "") << idx[u->src(k)];
    os << "]";
    if (u->arg.index() != 0) os << " " << arg_str(u->arg);
    os << "\n";
  }
  return os.str();
}

namespace {
const char* infix(Ops op) {
  switch (op) {
    case Ops::ADD: return "+"; case Ops::SUB: return "-"; case Ops::MUL: return "*"; case Ops::IDIV: return "//";
    case Ops::FDIV: return "/"; case Ops::MOD: return "%"; case Ops::CMPLT: return "<"; case Ops::CMPNE: return "!=";
    case Ops::CMPEQ: return "=="; case Ops::AND: return "&"; case Ops::OR: return "|"; case Ops::XOR: return "^";
    case Ops::SHL: return "<<"; case Ops::SHR: return ">>";
    default: return nullptr;
  }
}
}  // namespace

std::string render_expr(const UOp* root) {
  auto order = toposort(root);
  std::unordered_map<const UOp*, std::string> s;
  for (const UOp* u : order) {
    std::string r;
    if (u->op == Ops::CONST) {
      r = arg_str(u->arg);
      if (dtypes::is_bool(u->dtype)) r = u->const_int() ? "True" : "False";
    } else if (u->op == Ops::DEFINE_VAR) {
      r = std::get<VarArg>(u->arg).name;
    } else if (u->op == Ops::BIND) {
      r = s[u->src(0)];
    } else if (u->op == Ops::RANGE) {
      r = "r" + std::to_string(std::get<std::vector<int64_t>>(u->arg)[0]);
    } else if (const char* o = infix(u->op)) {
      r = "(" + s[u->src(0)] + o + s[u->src(1)] + ")";
    } else if (u->op == Ops::NEG) {
      r = "(-" + s[u->src(0)] + ")";
    } else if (u->op == Ops::WHERE) {
      r = "(" + s[u->src(1)] + " if " + s[u->src(0)] + " else " + s[u->src(2)] + ")";
    } else if (u->op == Ops::CAST) {
      r = "(" + u->dtype.name() + ")" + s[u->src(0)];
    } else {
      r = std::string(op_name(u->op)) + "(";
      for (size_t k = 0; k < u->nsrc(); k++) r += (k ? ", " : "") + s[u->src(k)];
      if (u->arg.index() != 0) r += std::string(u->nsrc() ? ", " : "") + arg_str(u->arg);
      r += ")";
    }
    s[u] = std::move(r);
  }
  return s[root];
}

}  // namespace tg
