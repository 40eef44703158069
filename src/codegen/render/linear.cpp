// Validation of linear programs, shared by all renderers.
#include "linear.hpp"

#include <algorithm>

#include "tg/error.hpp"

namespace tg::render_detail {

std::string describe(const UOp* u) {
  std::string s = std::string(op_name(u->op)) + " " + u->dtype.name();
  std::string a = arg_str(u->arg);
  if (!a.empty()) s += " arg=" + a;
  return s;
}

std::string comment_safe(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '/' && !out.empty() && out.back() == '*') out += ' ';
    out += (c >= 32 && c < 127) ? c : '?';
  }
  return out;
}

const UOp* end_range(const UOp* end) {
  const UOp* r = end->nsrc() ? end->src(end->nsrc() - 1) : nullptr;
  return r && r->op == Ops::RANGE ? r : nullptr;
}

namespace {

bool base_op(Ops o) {
  switch (o) {
    case Ops::PARAM: case Ops::DEFINE_VAR: case Ops::CONST: case Ops::RANGE: case Ops::END: case Ops::DEFINE_REG:
    case Ops::INDEX: case Ops::LOAD: case Ops::STORE: case Ops::IF: case Ops::ENDIF: case Ops::SINK: case Ops::AFTER:
    case Ops::CAST: case Ops::BITCAST: case Ops::VECTORIZE: case Ops::PREFETCH: return true;
    default: return is_alu(o);
  }
}

// Nodes that live for the whole function whatever their position (renderers hoist them).
bool function_scoped(Ops o) {
  return o == Ops::PARAM || o == Ops::DEFINE_VAR || o == Ops::CONST || o == Ops::DEFINE_REG || o == Ops::DEFINE_LOCAL;
}

}  // namespace

LinearInfo check_linear(const std::string& who, const std::string& name, const std::vector<const UOp*>& program,
                        const std::function<bool(DType)>& supports, const std::vector<Ops>& extra_ops) {
  LinearInfo info;
  std::unordered_map<const UOp*, size_t> pos;
  std::unordered_map<const UOp*, const UOp*> scope_of;  // node -> the RANGE/IF it was defined in (null: function)
  std::vector<const UOp*> open;                         // open RANGE/IF, innermost last
  size_t i = 0;
  auto fail = [&](const UOp* u, const std::string& why) -> void {
    throw Error("[" + who + "] kernel " + name + ": " + why + " at op #" + std::to_string(i) + ": " + describe(u));
  };
  auto check_dtype = [&](const UOp* u) {
    DType d = u->dtype;
    if (d == dtypes::void_) return;
    // Vector values (see vectorize in include/tg/opt.hpp): pointers point to scalars and constants are scalars
    // (a vector of them is a VECTORIZE); whether the renderer takes the width is its supports().
    if (d.count != 1 && (d.ptr || u->op == Ops::CONST || u->op == Ops::DEFINE_VAR || u->op == Ops::RANGE))
      fail(u, "vector dtypes are values only: no vector pointers, constants or loop variables (devectorise first)");
    if (u->op == Ops::WMMA) {
      if (!(d == dtypes::float32.vec(4))) fail(u, "WMMA gives float32x4");
      d = d.scalar_type();
    }
    DType s = d.ptr ? d.base() : d;
    if (s.scalar == Scalar::Index || dtypes::is_weak(s)) fail(u, "dtype " + s.name() + " must be lowered before rendering");
    if (!supports(s)) fail(u, "dtype " + s.name() + " is not supported by this renderer");
  };
  for (; i < program.size(); i++) {
    const UOp* u = program[i];
    if (!u) throw Error("[" + who + "] kernel " + name + ": null op at #" + std::to_string(i));
    if (!base_op(u->op) && std::find(extra_ops.begin(), extra_ops.end(), u->op) == extra_ops.end())
      fail(u, std::string(op_name(u->op)) + " cannot be rendered (not part of the linear program format)");
    if (pos.count(u)) fail(u, "the node appears twice");
    check_dtype(u);
    if (u->op != Ops::SINK) {
      for (size_t k = 0; k < u->nsrc(); k++) {
        const UOp* s = u->src(k);
        if (pos.find(s) == pos.end()) fail(u, "source " + describe(s) + " is used before it is defined");
        // Ordering-only sources (AFTER's dependencies, END's effects) may lie in loops already closed.
        bool ordering = (u->op == Ops::AFTER && k > 0) || (u->op == Ops::END && k + 1 < u->nsrc());
        const UOp* sc = scope_of[s];
        if (!ordering && sc && std::find(open.begin(), open.end(), sc) == open.end())
          fail(u, "source " + describe(s) + " is used outside the " + op_name(sc->op) + " it was defined in");
        info.uses[s]++;
      }
    }
    auto need_src = [&](size_t lo, size_t hi) {
      if (u->nsrc() < lo || u->nsrc() > hi) fail(u, "wrong number of sources (" + std::to_string(u->nsrc()) + ")");
    };
    switch (u->op) {
      case Ops::PARAM: {
        auto* idx = std::get_if<int64_t>(&u->arg);
        if (!idx || *idx < 0) fail(u, "PARAM needs a non-negative integer index");
        if (!u->dtype.ptr) fail(u, "PARAM needs a pointer dtype");
        size_t k = size_t(*idx);
        if (info.params.size() <= k) info.params.resize(k + 1, nullptr);
        if (info.params[k]) fail(u, "PARAM index " + std::to_string(k) + " is used twice");
        info.params[k] = u;
        break;
      }
      case Ops::DEFINE_VAR:
        if (!std::holds_alternative<VarArg>(u->arg)) fail(u, "DEFINE_VAR needs a VarArg");
        if (!dtypes::is_int(u->dtype)) fail(u, "DEFINE_VAR needs an int dtype");
        info.var_index[u] = int(info.vars.size());
        info.vars.push_back(u);
        break;
      case Ops::DEFINE_REG: case Ops::DEFINE_LOCAL:
        if (!u->dtype.ptr || u->dtype.size <= 0) fail(u, "needs a pointer dtype with a known size");
        break;
      case Ops::AFTER:
        need_src(1, 1u << 30);
        if (!(u->src(0)->dtype == u->dtype)) fail(u, "AFTER must have the dtype of its source 0");
        break;
      case Ops::INDEX:
        need_src(2, 2);
        if (!u->src(0)->dtype.ptr) fail(u, "INDEX needs a pointer as source 0");
        if (!dtypes::is_int(u->src(1)->dtype)) fail(u, "INDEX needs an int index");
        break;
      case Ops::LOAD:
        need_src(1, 3);
        if (u->nsrc() == 2) fail(u, "a gated LOAD needs (INDEX, alt, gate)");
        if (u->src(0)->op != Ops::INDEX) fail(u, "LOAD needs an INDEX as source 0");
        // a LOAD of n lanes reads n consecutive elements from its INDEX
        if (!(u->src(0)->dtype.base().vec(u->dtype.count) == u->dtype)) fail(u, "LOAD dtype differs from the pointer's element");
        if (u->nsrc() == 3 && (!(u->src(1)->dtype == u->dtype) || !dtypes::is_bool(u->src(2)->dtype)))
          fail(u, "a gated LOAD needs alt of the load's dtype and a bool gate");
        break;
      case Ops::STORE:
        need_src(2, 3);
        if (u->src(0)->op != Ops::INDEX) fail(u, "STORE needs an INDEX as source 0");
        if (u->nsrc() == 3 && !dtypes::is_bool(u->src(2)->dtype)) fail(u, "a gated STORE needs a bool gate");
        if (!(u->src(0)->dtype.base().vec(u->src(1)->dtype.count) == u->src(1)->dtype))
          fail(u, "STORE value dtype differs from the pointer's");
        if (u->nsrc() == 3 && u->src(2)->dtype.count != 1) fail(u, "a gated STORE needs one bool gate");
        break;
      case Ops::PREFETCH:  // a hint: PREFETCH(PARAM, index), the index may lie past the buffer (no access is made)
        need_src(2, 2);
        if (u->src(0)->op != Ops::PARAM) fail(u, "PREFETCH needs a PARAM as source 0");
        if (!dtypes::is_int(u->src(1)->dtype)) fail(u, "PREFETCH needs an int index");
        break;
      case Ops::RANGE:
        need_src(1, 1);
        if (!dtypes::is_int(u->dtype) || !(u->src(0)->dtype == u->dtype)) fail(u, "RANGE needs an int end of its dtype");
        break;
      case Ops::IF:
        need_src(1, 1);
        if (!dtypes::is_bool(u->src(0)->dtype)) fail(u, "IF needs a bool condition");
        break;
      case Ops::END: case Ops::ENDIF: {
        const UOp* closes = u->op == Ops::END ? end_range(u) : (u->nsrc() ? u->src(0) : nullptr);
        Ops want = u->op == Ops::END ? Ops::RANGE : Ops::IF;
        if (!closes || closes->op != want)
          fail(u, std::string("needs the ") + op_name(want) + " it closes as its " + (u->op == Ops::END ? "last" : "only") + " source");
        if (open.empty() || open.back() != closes) fail(u, "does not close the innermost open RANGE/IF");
        open.pop_back();
        break;
      }
      case Ops::SINK:
        if (i + 1 != program.size()) fail(u, "SINK must be last");
        break;
      case Ops::WMMA:
        need_src(16, 16);
        break;
      case Ops::GEP: {
        need_src(1, 1);
        auto* a = std::get_if<std::vector<int64_t>>(&u->arg);
        if (u->src(0)->dtype.count < 2 || !a || a->size() != 1 || (*a)[0] < 0 || (*a)[0] >= u->src(0)->dtype.count ||
            u->dtype.count != 1)
          fail(u, "GEP needs a vector source and one element index within it");
        break;
      }
      case Ops::VECTORIZE:
        if (u->nsrc() != size_t(u->dtype.count) || u->nsrc() < 2) fail(u, "VECTORIZE needs one source per lane");
        for (size_t k = 0; k < u->nsrc(); k++)
          if (!(u->src(k)->dtype == u->dtype.scalar_type())) fail(u, "VECTORIZE's sources must be scalars of its dtype");
        break;
      case Ops::BARRIER:
        for (size_t k = 0; k < u->nsrc(); k++)
          if (u->src(k)->op != Ops::STORE) fail(u, "BARRIER sources must be STOREs");
        break;
      default:
        if (is_alu(u->op) && int(u->nsrc()) != op_arity(u->op)) fail(u, "wrong number of sources");
        if ((u->op == Ops::CAST || u->op == Ops::BITCAST) && u->nsrc() != 1) fail(u, "wrong number of sources");
        break;
    }
    pos[u] = i;
    scope_of[u] = function_scoped(u->op) || open.empty() ? nullptr : open.back();
    if (u->op == Ops::RANGE || u->op == Ops::IF) {
      open.push_back(u);
      if (u->op == Ops::RANGE) scope_of[u] = u;  // the loop variable exists inside its loop only
    }
  }
  if (!open.empty()) {
    i = program.size();
    fail(open.back(), "is never closed");
  }
  for (size_t k = 0; k < info.params.size(); k++)
    if (!info.params[k]) throw Error("[" + who + "] kernel " + name + ": PARAM " + std::to_string(k) + " is missing");
  return info;
}

}  // namespace tg::render_detail
