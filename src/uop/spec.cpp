// The spec checker: structural rules every UOp must satisfy (SPEC=1 checks each node as it is built).
#include "tg/env.hpp"
#include "tg/error.hpp"
#include "tg/uop.hpp"
#include "spec_pause.hpp"

namespace tg {

bool spec_enabled() {
  static const bool on = getenv_int("SPEC", 0) > 0;
  return on;
}

namespace {
thread_local bool t_spec_paused = false;
}  // namespace
SpecPause::SpecPause() : prev_(t_spec_paused) { t_spec_paused = true; }
SpecPause::~SpecPause() { t_spec_paused = prev_; }
bool SpecPause::active() { return t_spec_paused; }

namespace {

[[noreturn]] void fail(const UOp* u, const std::string& why) {
  std::string s = "[spec] " + std::string(op_name(u->op)) + " " + u->dtype.name() + " with " +
                  std::to_string(u->nsrc()) + " sources: " + why + "\n" + print_graph(u);
  throw SpecError(s);
}

void check_node(const UOp* u) {
  int ar = op_arity(u->op);
  // A movement op with symbolic arguments carries them as index sources, one per argument entry.
  if ((u->op == Ops::RESHAPE || u->op == Ops::EXPAND || u->op == Ops::SHRINK || u->op == Ops::PAD) && u->nsrc() > 1) {
    // PAD's argument also holds the input's largest dims (one per dim after the pairs)
    size_t per = u->op == Ops::PAD ? 3 : 1, want = u->op == Ops::PAD ? 2 : 1;
    if (!std::holds_alternative<std::vector<int64_t>>(u->arg) ||
        (u->nsrc() - 1) * per != std::get<std::vector<int64_t>>(u->arg).size() * want)
      fail(u, "symbolic arguments: one index source per argument entry");
    ar = int(u->nsrc());
  }
  if (ar >= 0 && int(u->nsrc()) != ar)
    fail(u, "expected " + std::to_string(ar) + " source(s)");
  if (u->op == Ops::BIND && (u->src(0)->op != Ops::DEFINE_VAR || u->src(1)->op != Ops::CONST))
    fail(u, "BIND needs (DEFINE_VAR, CONST)");
  if (has_no_dtype(u->op) && !(u->dtype == dtypes::void_)) fail(u, "dtype must be void");
  auto sd = [&](size_t i) { return u->src(i)->dtype; };
  if (u->op == Ops::CONST) {
    bool fl = dtypes::is_float(u->dtype);
    if (fl && !std::holds_alternative<double>(u->arg)) fail(u, "a float CONST needs a double argument");
    if (!fl && !std::holds_alternative<int64_t>(u->arg)) fail(u, "an int/bool CONST needs an integer argument");
  }
  if (u->op == Ops::DEFINE_VAR && !std::holds_alternative<VarArg>(u->arg)) fail(u, "DEFINE_VAR needs (name, min, max)");
  if (is_alu(u->op)) {
    if (is_comparison(u->op)) {
      if (!dtypes::is_bool(u->dtype.scalar_type())) fail(u, "a comparison yields bool");
      if (!(sd(0) == sd(1))) fail(u, "sources have different dtypes " + sd(0).name() + " and " + sd(1).name());
    } else if (u->op == Ops::WHERE) {
      if (!dtypes::is_bool(sd(0).scalar_type())) fail(u, "WHERE's condition must be bool, got " + sd(0).name());
      if (!(sd(1) == u->dtype) || !(sd(2) == u->dtype)) fail(u, "WHERE's branches must have the node's dtype");
    } else if (u->op == Ops::SHL || u->op == Ops::SHR) {
      if (!(sd(0) == u->dtype)) fail(u, "the shifted value must have the node's dtype");
    } else if (u->op == Ops::THREEFRY) {
      if (!(u->dtype == dtypes::uint64)) fail(u, "THREEFRY works on uint64");
    } else {
      for (size_t i = 0; i < u->nsrc(); i++)
        if (!(sd(i) == u->dtype)) fail(u, "source " + std::to_string(i) + " is " + sd(i).name() + ", expected " + u->dtype.name());
    }
    bool fl = dtypes::is_float(u->dtype);
    if ((u->op == Ops::XOR || u->op == Ops::OR || u->op == Ops::AND || u->op == Ops::SHL || u->op == Ops::SHR) && fl)
      fail(u, "bitwise ops need int or bool operands");
    if ((u->op == Ops::IDIV || u->op == Ops::MOD) && fl) fail(u, "IDIV/MOD need int operands");
    if ((u->op == Ops::FDIV || is_unary(u->op)) && u->op != Ops::NEG && !fl && u->op != Ops::TRUNC && u->op != Ops::RECIPROCAL)
      fail(u, "needs a float dtype");
  }
  if (u->op == Ops::RANGE && !dtypes::is_int(u->dtype)) fail(u, "RANGE needs an int dtype");
}

}  // namespace

void spec_check_node(const UOp* u) { check_node(u); }

void spec_check(const UOp* root) {
  for (const UOp* u : toposort(root)) check_node(u);
}

}  // namespace tg
