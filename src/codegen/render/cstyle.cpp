// The C-style renderer: one pass over the linear program, one statement per node, expressions from the
// dialect's CStyleLanguage (tinygrad: renderer/cstyle.py).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "linear.hpp"
#include "tg/error.hpp"
#include "tg/opt.hpp"
#include "tg/render.hpp"

namespace tg {

using render_detail::check_linear;
using render_detail::describe;

namespace {

bool is16(DType d) { return d.scalar == Scalar::Float16 || d.scalar == Scalar::BFloat16; }

bool valid_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

std::string join(const std::vector<std::string>& a) {
  std::string s;
  for (size_t i = 0; i < a.size(); i++) s += (i ? ", " : "") + a[i];
  return s;
}

// A math function call: the float32 or float64 spelling by dtype.
CodeForOp math_fn(const char* f32, const char* f64) {
  return [f32, f64](const std::vector<std::string>& a, DType dt, const CStyleLanguage&) {
    return std::string(dt.scalar == Scalar::Float64 ? f64 : f32) + "(" + join(a) + ")";
  };
}

CodeForOp infix(const char* op) {
  return [op](const std::vector<std::string>& a, DType, const CStyleLanguage&) { return "(" + a[0] + op + a[1] + ")"; };
}

}  // namespace

const std::string& CStyleLanguage::type(DType dt) const {
  const std::string& t = types[size_t(dt.scalar)];
  if (t.empty()) throw Error("[render] the " + name + " dialect has no type for " + dt.name());
  return t;
}

const std::string& CStyleLanguage::utype(DType dt) const {
  switch (dt.scalar) {
    case Scalar::Bool: case Scalar::Int8: return type(dtypes::uint8);
    case Scalar::Int16: return type(dtypes::uint16);
    case Scalar::Int32: return type(dtypes::uint32);
    case Scalar::Int64: return type(dtypes::uint64);
    default: return type(dt);
  }
}

std::unordered_map<Ops, CodeForOp> CStyleLanguage::base_code_for_op() {
  auto fl = [](DType d) { return dtypes::is_float(d); };
  std::unordered_map<Ops, CodeForOp> m;
  m[Ops::EXP2] = math_fn("exp2f", "exp2");
  m[Ops::LOG2] = math_fn("log2f", "log2");
  m[Ops::SIN] = math_fn("sinf", "sin");
  m[Ops::SQRT] = math_fn("sqrtf", "sqrt");
  m[Ops::TRUNC] = [fl](auto& a, DType dt, auto& l) { return fl(dt) ? math_fn("truncf", "trunc")(a, dt, l) : a[0]; };
  m[Ops::RECIPROCAL] = [fl](auto& a, DType dt, auto&) {
    return std::string(!fl(dt) ? "(1/" : dt.scalar == Scalar::Float64 ? "(1.0/" : "(1.0f/") + a[0] + ")";
  };
  m[Ops::NEG] = [](auto& a, DType dt, auto&) { return dtypes::is_bool(dt) ? a[0] : "(-" + a[0] + ")"; };  // -b != 0 is b
  m[Ops::ADD] = [](auto& a, DType dt, auto&) { return "(" + a[0] + (dtypes::is_bool(dt) ? "|" : "+") + a[1] + ")"; };
  m[Ops::SUB] = infix("-");
  m[Ops::MUL] = infix("*");
  m[Ops::FDIV] = infix("/");
  m[Ops::IDIV] = infix("/");
  m[Ops::MOD] = infix("%");
  m[Ops::CMPLT] = infix("<");
  m[Ops::CMPNE] = infix("!=");
  m[Ops::CMPEQ] = infix("==");
  m[Ops::XOR] = infix("^");
  m[Ops::OR] = infix("|");
  m[Ops::AND] = infix("&");
  m[Ops::SHR] = infix(">>");
  // Shift left in the unsigned type: shifting a negative signed value is undefined in C.
  m[Ops::SHL] = [](auto& a, DType dt, auto& l) { return "((" + l.utype(dt) + ")" + a[0] + "<<" + a[1] + ")"; };
  m[Ops::MAX] = [fl](auto& a, DType dt, auto&) {
    if (fl(dt)) return std::string(dt.scalar == Scalar::Float64 ? "tg_fmax(" : "tg_fmaxf(") + a[0] + ", " + a[1] + ")";
    return "(" + a[0] + ">" + a[1] + "?" + a[0] + ":" + a[1] + ")";
  };
  m[Ops::POW] = [fl](auto& a, DType dt, auto& l) {
    if (fl(dt)) return math_fn("powf", "pow")(a, dt, l);
    return "(" + l.type(dt) + ")(" + l.type(dtypes::int64) + ")pow((double)" + a[0] + ", (double)" + a[1] + ")";
  };
  m[Ops::WHERE] = [](auto& a, DType, auto&) { return "(" + a[0] + "?" + a[1] + ":" + a[2] + ")"; };
  m[Ops::MULACC] = [fl](auto& a, DType dt, auto& l) {
    return fl(dt) ? math_fn("fmaf", "fma")(a, dt, l) : "(" + a[0] + "*" + a[1] + "+" + a[2] + ")";
  };
  return m;
}

CStyleRenderer::CStyleRenderer(CStyleLanguage lang) : lang_(std::move(lang)) {}

bool CStyleRenderer::supports(DType dt) const {
  if (dt.ptr) dt = dt.base();
  if (dt == dtypes::void_) return true;
  if (dt.count != 1 && dt.count > vector_lanes_of(dt.scalar_type())) return false;
  if (dtypes::is_weak(dt) || dt.scalar == Scalar::Index) return false;
  return !lang_.types[size_t(dt.scalar)].empty();
}

int CStyleRenderer::vector_lanes_of(DType d) const {
  bool kind = (d.scalar == Scalar::Float32 || d.scalar == Scalar::Int32) && !lang_.types[size_t(d.scalar)].empty();
  return kind && lang_.vector_bytes >= 8 ? lang_.vector_bytes / 4 : 1;
}

bool CStyleRenderer::vector_alu(const UOp* u) const {
  if (u->dtype.scalar != Scalar::Float32) return false;
  for (const UOpRef& s : u->src())
    if (s->dtype.scalar != Scalar::Float32) return false;
  return std::find(lang_.vector_float_ops.begin(), lang_.vector_float_ops.end(), u->op) != lang_.vector_float_ops.end();
}

std::string CStyleRenderer::render_const(const UOp* c) const {
  DType dt = c->dtype;
  char buf[64];
  if (dtypes::is_float(dt)) {
    double v = std::get<double>(c->arg);
    if (is16(dt) && (dt.scalar == Scalar::Float16 ? lang_.half_as_bits : lang_.bf16_as_bits)) {
      unsigned bits = dt.scalar == Scalar::Float16 ? float_to_half_bits(float(v)) : float_to_bf16_bits(float(v));
      std::snprintf(buf, sizeof buf, "0x%04Xu", bits);
      return "((" + lang_.type(dt) + ")" + buf + ")";
    }
    bool dbl = dt.scalar == Scalar::Float64;
    std::string s;
    if (std::isnan(v)) s = dbl ? "(double)NAN" : "NAN";
    else if (std::isinf(v)) s = std::string(v < 0 ? "-" : "") + (dbl ? "(double)INFINITY" : "INFINITY");
    else {
      std::snprintf(buf, sizeof buf, "%a", v);
      s = std::string(buf) + (dbl ? "" : "f");
    }
    return dt.scalar == Scalar::Float32 || dbl ? "(" + s + ")" : "((" + lang_.type(dt) + ")" + s + ")";
  }
  int64_t v = std::get<int64_t>(c->arg);
  switch (dt.scalar) {
    case Scalar::Bool: return v ? "1" : "0";
    case Scalar::Int32:
      return v == INT32_MIN ? "(-2147483647-1)" : v < 0 ? "(" + std::to_string(v) + ")" : std::to_string(v);
    case Scalar::UInt32: return std::to_string(uint32_t(v)) + "u";
    case Scalar::Int64:
      return v == INT64_MIN ? "(-9223372036854775807ll-1)" : v < 0 ? "(" + std::to_string(v) + "ll)" : std::to_string(v) + "ll";
    case Scalar::UInt64: return std::to_string(uint64_t(v)) + "ull";
    default: return "((" + lang_.type(dt) + ")" + std::to_string(v) + ")";
  }
}

std::string CStyleRenderer::to_float(const std::string& x, DType dt) const {
  if (dt.scalar == Scalar::Float16 && lang_.half_as_bits) return lang_.h2f + "(" + x + ")";
  if (dt.scalar == Scalar::BFloat16 && lang_.bf16_as_bits) return lang_.bf2f + "(" + x + ")";
  return "(float)" + x;
}

std::string CStyleRenderer::from_float(const std::string& x, DType dt) const {
  if (dt.scalar == Scalar::Float16 && lang_.half_as_bits) return lang_.f2h + "(" + x + ")";
  if (dt.scalar == Scalar::BFloat16 && lang_.bf16_as_bits) return lang_.f2bf + "(" + x + ")";
  return "(" + lang_.type(dt) + ")(" + x + ")";
}

std::string CStyleRenderer::render_cast(const std::string& x0, DType from, DType to) const {
  std::string x = x0;
  if (from == to) return x;
  if (is16(from)) {  // through float32, which holds every float16/bfloat16 exactly
    x = to_float(x, from);
    from = dtypes::float32;
    if (to == from) return x;
  }
  const std::string& T = lang_.type(to);
  if (dtypes::is_bool(to)) return "(" + x + "!=0)";
  bool ff = dtypes::is_float(from);
  if (to.scalar == Scalar::Float16) {
    if (from == dtypes::float32) return from_float(x, to);
    // Rounded once from double (ints convert to double first, as exec_alu does).
    return lang_.half_as_bits ? lang_.d2h + "((double)" + x + ")" : "(" + T + ")((double)" + x + ")";
  }
  if (to.scalar == Scalar::BFloat16) {  // via float32, as tinygrad rounds bfloat16
    if (from == dtypes::float32) return from_float(x, to);
    return from_float(std::string(ff ? "(float)" : "(float)(double)") + x, to);
  }
  if (ff && !dtypes::is_float(to)) {
    const std::string& I64 = lang_.type(dtypes::int64);
    if (to == dtypes::int64) return "(" + I64 + ")" + x;
    if (to == dtypes::uint64) return "((" + x + ")>=0x1p63?(" + T + ")(" + x + "):(" + T + ")(" + I64 + ")(" + x + "))";
    return "(" + T + ")(" + I64 + ")(" + x + ")";  // wraps to the width instead of being undefined
  }
  return "(" + T + ")(" + x + ")";
}

std::string CStyleRenderer::render_bitcast(const std::string& dst, const std::string& x, DType from, DType to) const {
  if (lang_.type(from) == lang_.type(to)) return dst + " = " + x + ";";
  if (dtypes::is_bool(to)) return dst + " = (" + x + "!=0);";
  if (dtypes::is_bool(from)) return dst + " = (" + lang_.type(to) + ")" + x + ";";
  return "__builtin_memcpy(&" + dst + ", &" + x + ", sizeof(" + dst + "));";
}

std::string CStyleRenderer::render_special(const UOp* u) const {
  throw Error("[render] the " + lang_.name + " dialect cannot render " + describe(u));
}

std::string CStyleRenderer::render_wmma(const std::string&, const std::vector<std::string>&, const UOp* u,
                                        std::string&) const {
  throw Error("[render] the " + lang_.name + " dialect has no tensor cores for " + describe(u));
}

std::string CStyleRenderer::render_kernel(const std::string& name, const std::vector<KernelArg>& args,
                                          const std::string& decls, const std::string& body) const {
  std::string s = lang_.prelude + "\n" + lang_.kernel_prefix + "void " + name +
                  "(void* const* bufs, const " + lang_.type(dtypes::int64) + "* vars) {\n";
  int nb = 0, nv = 0;
  for (const KernelArg& a : args) {
    if (a.is_buffer) {
      std::string T = lang_.type(a.dtype.base()) + "*";
      s += "  " + lang_.buffer_prefix + T + (lang_.restrict_kw.empty() ? "" : " " + lang_.restrict_kw) + " " + a.name +
           " = (" + T + ")bufs[" + std::to_string(nb++) + "];\n";
    } else {
      s += "  const " + lang_.type(a.dtype) + " " + a.name + " = (" + lang_.type(a.dtype) + ")vars[" +
           std::to_string(nv++) + "];  /* " + a.comment + " */\n";
    }
  }
  return s + decls + body + "}\n";
}

std::string CStyleRenderer::render(const std::string& name, const std::vector<const UOp*>& program) {
  std::vector<Ops> extra{Ops::SPECIAL, Ops::WMMA, Ops::GEP};
  if (!lang_.smem_prefix.empty()) extra.push_back(Ops::DEFINE_LOCAL);
  if (!lang_.barrier.empty()) extra.push_back(Ops::BARRIER);
  auto info = check_linear("render", name, program, [this](DType d) { return supports(d); }, extra);
  if (!valid_identifier(name)) throw Error("[render] kernel name '" + name + "' is not a C identifier");

  std::unordered_map<const UOp*, std::string> r;
  std::unordered_map<std::string, int> counters;
  auto fresh = [&](const char* prefix) { return prefix + std::to_string(counters[prefix]++); };
  std::vector<KernelArg> args;
  for (size_t i = 0; i < info.params.size(); i++) {
    r[info.params[i]] = "data" + std::to_string(i);
    args.push_back({r[info.params[i]], info.params[i]->dtype, true, ""});
  }
  for (size_t j = 0; j < info.vars.size(); j++) {
    const UOp* v = info.vars[j];
    r[v] = "var" + std::to_string(j);
    args.push_back({r[v], v->dtype, false, render_detail::comment_safe(std::get<VarArg>(v->arg).name)});
  }

  std::string decls, body;
  int depth = 1;
  auto line = [&](const std::string& s) { body += std::string(size_t(2 * depth), ' ') + s + "\n"; };
  // a vector of n lanes is TYPEn (float4)
  auto vtype = [&](DType d) { return d.count > 1 ? lang_.type(d.scalar_type()) + std::to_string(d.count) : lang_.type(d); };
  auto def = [&](const UOp* u, const char* prefix, const std::string& expr) {
    r[u] = fresh(prefix);
    line(vtype(u->dtype) + " " + r[u] + " = " + expr + ";");
  };
  for (const UOp* u : program) {
    auto s = [&](size_t i) -> const std::string& { return r.at(u->src(i)); };
    switch (u->op) {
      case Ops::PARAM: case Ops::DEFINE_VAR: case Ops::SINK: break;
      case Ops::CONST: r[u] = render_const(u); break;
      case Ops::AFTER: r[u] = s(0); break;  // ordering only
      case Ops::DEFINE_REG: case Ops::DEFINE_LOCAL: {
        r[u] = fresh(u->op == Ops::DEFINE_REG ? "acc" : "smem");
        std::string pre = u->op == Ops::DEFINE_LOCAL ? lang_.smem_prefix : lang_.aligned_array;
        decls += "  " + pre + lang_.type(u->dtype.base()) + " " + r[u] + "[" + std::to_string(u->dtype.size) + "];\n";
        break;
      }
      case Ops::INDEX: r[u] = "(" + s(0) + "+" + s(1) + ")"; break;
      case Ops::LOAD:
        if (u->dtype.count > 1) {  // n consecutive elements
          if (u->nsrc() != 1 && u->src(2)->dtype.count != 1)
            throw Error("[render] kernel " + name + ": a LOAD with a vector gate is not supported: " + describe(u));
          std::string n = std::to_string(u->dtype.count);
          std::string x = lang_.vector_aligned ? "*((" + vtype(u->dtype) + "*)" + s(0) + ")" : "vload" + n + "(0, " + s(0) + ")";
          def(u, "val", u->nsrc() == 3 ? "(" + s(2) + "?" + x + ":" + s(1) + ")" : x);  // a scalar gate: the whole vector
          break;
        }
        def(u, "val", u->nsrc() == 3 ? "(" + s(2) + "?*" + s(0) + ":" + s(1) + ")" : "*" + s(0));
        break;
      case Ops::STORE: {
        DType d = u->src(1)->dtype;
        std::string gate = u->nsrc() == 3 ? "if (" + s(2) + ") " : "";
        if (d.count > 1)
          line(gate + (lang_.vector_aligned ? "*((" + vtype(d) + "*)" + s(0) + ") = " + s(1) + ";"
                                            : "vstore" + std::to_string(d.count) + "(" + s(1) + ", 0, " + s(0) + ");"));
        else
          line(gate + "*" + s(0) + " = " + s(1) + ";");
        break;
      }
      case Ops::VECTORIZE: {
        std::vector<std::string> a;
        for (size_t i = 0; i < u->nsrc(); i++) a.push_back(s(i));
        def(u, "vec", lang_.vector_make.empty() ? "(" + vtype(u->dtype) + ")(" + join(a) + ")"
                                                : lang_.vector_make + vtype(u->dtype) + "(" + join(a) + ")");
        break;
      }
      case Ops::RANGE: {
        r[u] = fresh("ridx");
        // Lane loops (see expand_upcasts): the C dialect asks clang to vectorise them across the lanes (not to
        // unroll them first: a short loop unrolled is left scalar).
        if (vector_lanes() && range_type(u) == AxisType::Lane && u->src(0)->is_const())
          line("#pragma clang loop vectorize(enable) vectorize_width(" + std::to_string(lane_vector_width(u->src(0)->const_int())) +
               ") interleave_count(1) unroll(disable)");
        line("for (" + lang_.type(u->dtype) + " " + r[u] + " = 0; " + r[u] + " < " + s(0) + "; " + r[u] + "++) {");
        depth++;
        break;
      }
      case Ops::IF: line("if (" + s(0) + ") {"); depth++; break;
      case Ops::END: case Ops::ENDIF: depth--; line("}"); break;
      case Ops::BARRIER: line(lang_.barrier); break;
      case Ops::PREFETCH:  // a hint: the C dialect's builtin (integer address arithmetic: it may lie past the buffer)
        if (!lang_.prefetch.empty())
          line(lang_.prefetch + "((const void*)((uintptr_t)" + s(0) + " + (uintptr_t)(" + s(1) + ") * " +
               std::to_string(u->src(0)->dtype.base().itemsize()) + "));");
        break;
      case Ops::SPECIAL: def(u, "gidx", render_special(u)); break;
      case Ops::WMMA: {
        r[u] = fresh("wmma");
        std::vector<std::string> a;
        for (size_t i = 0; i < u->nsrc(); i++) a.push_back(s(i));
        line(lang_.type(u->dtype.scalar_type()) + " " + r[u] + "[" + std::to_string(u->dtype.count) + "];");
        line(render_wmma(r[u], a, u, decls));
        break;
      }
      case Ops::GEP: {
        int64_t i = std::get<std::vector<int64_t>>(u->arg).at(0);
        if (u->src(0)->op == Ops::WMMA) r[u] = s(0) + "[" + std::to_string(i) + "]";  // an array
        else if (u->src(0)->dtype.count <= 4) r[u] = s(0) + "." + "xyzw"[i];
        else r[u] = s(0) + ".s" + "0123456789abcdef"[i];
        break;
      }
      case Ops::CAST: def(u, "cast", render_cast(s(0), u->src(0)->dtype, u->dtype)); break;
      case Ops::BITCAST: {
        r[u] = fresh("bits");
        std::string x = s(0);
        if (u->src(0)->op == Ops::CONST) {  // memcpy needs an lvalue
          x = r[u] + "_src";
          line(lang_.type(u->src(0)->dtype) + " " + x + " = " + s(0) + ";");
        }
        line(lang_.type(u->dtype) + " " + r[u] + ";");
        line(render_bitcast(r[u], x, u->src(0)->dtype, u->dtype));
        break;
      }
      default: {  // ALU
        auto it = lang_.code_for_op.find(u->op);
        if (it == lang_.code_for_op.end())
          throw Error("[render] kernel " + name + ": the " + lang_.name + " dialect has no rendering for " + describe(u));
        DType cdt = is_comparison(u->op) ? u->src(0)->dtype : u->dtype;
        bool via_float = is16(cdt) && u->op != Ops::WHERE;  // 16-bit floats compute in float32
        std::vector<std::string> a;
        for (size_t i = 0; i < u->nsrc(); i++) a.push_back(via_float ? to_float(s(i), cdt) : s(i));
        std::string e = it->second(a, via_float ? dtypes::float32 : cdt, lang_);
        if (via_float && !is_comparison(u->op)) e = from_float(e, u->dtype);
        def(u, "alu", e);
        break;
      }
    }
  }
  return render_kernel(name, args, decls, body);
}

}  // namespace tg
