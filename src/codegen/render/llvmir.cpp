// The LLVM IR renderer (tinygrad: renderer/llvmir.py): one pass over the linear program emitting textual
// LLVM 19 IR with opaque pointers. Loops are header-tested blocks with a phi counter (runtime trip counts may be
// 0), gated loads are a branch diamond, accumulators are allocas in the entry block. bool is i1 in registers
// and i8 in memory; float16/bfloat16 are `half`/`bfloat` and compute in float.
#include <bit>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "linear.hpp"
#include "tg/env.hpp"
#include "tg/error.hpp"
#include "tg/opt.hpp"
#include "tg/render.hpp"

namespace tg {

using render_detail::check_linear;
using render_detail::describe;
using render_detail::end_range;

namespace {

bool is16(DType d) { return d.scalar == Scalar::Float16 || d.scalar == Scalar::BFloat16; }
bool is_signed_int(DType d) { return dtypes::is_int(d) && !dtypes::is_unsigned(d); }

std::string lscalar(DType d);
// Register type of a dtype: a vector of n lanes is <n x T>.
std::string ltype(DType d) {
  if (d.ptr) return "ptr";
  if (d.count > 1) return "<" + std::to_string(d.count) + " x " + lscalar(d) + ">";
  return lscalar(d);
}
std::string lscalar(DType d) {
  switch (d.scalar) {
    case Scalar::Void: return "void";
    case Scalar::Bool: return "i1";
    case Scalar::Float16: return "half";
    case Scalar::BFloat16: return "bfloat";
    case Scalar::Float32: return "float";
    case Scalar::Float64: return "double";
    default: return "i" + std::to_string(d.bitsize());
  }
}
// Memory type: bool is a byte.
std::string mtype(DType d) {
  if (d.scalar != Scalar::Bool || d.ptr) return ltype(d);
  return d.count > 1 ? "<" + std::to_string(d.count) + " x i8>" : "i8";
}
// The constant c (a scalar literal) in every lane of d.
std::string splat(DType d, const std::string& c) {
  if (d.count == 1) return c;
  std::string s = "<";
  for (int i = 0; i < d.count; i++) s += (i ? ", " : "") + lscalar(d) + " " + c;
  return s + ">";
}
std::string zero(DType d) { return d.count > 1 ? "zeroinitializer" : dtypes::is_float(d) ? "0.0" : "0"; }
// The i1 type of a comparison or select condition over d's lanes.
std::string cond_t(DType d) { return d.count > 1 ? "<" + std::to_string(d.count) + " x i1>" : "i1"; }
std::string fsuffix(DType d) { return d.scalar == Scalar::Float64 ? "f64" : "f32"; }

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIX64, v);
  return buf;
}

// A helper's name over n lanes (n 1: the scalar one), "fn.vN".
std::string lanes_helper_name(const std::string& fn, int n) { return n == 1 ? fn : fn + ".v" + std::to_string(n); }

// sin of float32 lanes for the CPU (Ops::SIN; LLVM lowers llvm.sin to one libm sinf call per lane, scalar code that
// stops the kernel's vectors, 7 ns an element for randn's cos). In double, as glibc's own sinf reduces: q = rint(x 2/pi),
// r = x - q pi/2 with pi/2 in two doubles and fused multiply-adds (exact products; for |x| < 2^24 the error is below
// 2^-80 against |r| >= 2^-30, the closest any float32 comes to a multiple of pi/2 there), then sin r or cos r by
// their Taylor series to r^11 and r^12 (|r| <= pi/4: truncation below 1e-11 relative), the sign and the swap by q's
// low bits, rounded once to float: within 0.5 ulp plus 1e-11 of the exact value. |x| < 2^-12 returns x (sin x rounds
// to x there; keeps -0). Lanes at or past 2^24, infinities and NaN take libm's sinf, one at a time, behind a branch
// that ordinary arguments never take. n lanes (1: a scalar).
std::string lanes_suffix(int n, const char* scalar) { return (n > 1 ? "v" + std::to_string(n) : "") + scalar; }
// The intrinsics sin_helper_def(n) calls.
std::vector<std::string> sin_helper_decls(int n) {
  const DType f = dtypes::float32.vec(n);
  const std::string F = ltype(f), D = ltype(dtypes::float64.vec(n)), fs = lanes_suffix(n, "f32"), ds = lanes_suffix(n, "f64");
  std::vector<std::string> d{"declare " + F + " @llvm.fabs." + fs + "(" + F + ")",
                             "declare " + D + " @llvm.rint." + ds + "(" + D + ")",
                             "declare " + D + " @llvm.fma." + ds + "(" + D + ", " + D + ", " + D + ")",
                             "declare float @llvm.sin.f32(float)"};
  if (n > 1) d.push_back("declare i1 @llvm.vector.reduce.and." + lanes_suffix(n, "i1") + "(" + cond_t(f) + ")");
  return d;
}
std::string sin_helper_def(int n) {
  const bool vec = n > 1;
  const std::string F = ltype(dtypes::float32.vec(n)), D = ltype(dtypes::float64.vec(n)), I = ltype(dtypes::int32.vec(n)),
                    C = cond_t(dtypes::float32.vec(n)), fs = lanes_suffix(n, "f32"), ds = lanes_suffix(n, "f64"),
                    name = lanes_helper_name("tg.sinf", n);
  auto dk = [&](double v) { return splat(dtypes::float64.vec(n), hex64(std::bit_cast<uint64_t>(v))); };
  auto fk = [&](double v) { return splat(dtypes::float32.vec(n), hex64(std::bit_cast<uint64_t>(v))); };
  auto ik = [&](const char* v) { return splat(dtypes::int32.vec(n), v); };
  auto fma = [&](const std::string& out, const std::string& a, const std::string& b, const std::string& c) {
    return "  " + out + " = call " + D + " @llvm.fma." + ds + "(" + D + " " + a + ", " + D + " " + b + ", " + D + " " + c + ")\n";
  };
  const double s[] = {-1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800};
  const double c[] = {-1.0 / 2, 1.0 / 24, -1.0 / 720, 1.0 / 40320, -1.0 / 3628800, 1.0 / 479001600};
  // The scalar one is a call LLVM's loop vectoriser may widen (an elementwise kernel's lane loop, run as vectors by
  // LLVM): its vector variants are named to it (VFABI), and it stays a call until then.
  const std::string attrs = vec ? "alwaysinline nounwind willreturn memory(none)"
                                : "noinline nounwind willreturn memory(none) \"vector-function-abi-variant\"=\""
                                  "_ZGV_LLVM_N4v_tg.sinf(tg.sinf.v4),_ZGV_LLVM_N8v_tg.sinf(tg.sinf.v8),"
                                  "_ZGV_LLVM_N16v_tg.sinf(tg.sinf.v16)\"";
  std::string b = "define internal " + F + " @" + name + "(" + F + " %x) " + attrs + " {\nentry:\n";
  b += "  %ax = call " + F + " @llvm.fabs." + fs + "(" + F + " %x)\n";
  b += "  %ok = fcmp olt " + F + " %ax, " + fk(16777216.0) + "\n";
  b += "  %tiny = fcmp olt " + F + " %ax, " + fk(std::ldexp(1.0, -12)) + "\n";
  b += "  %xs = select " + C + " %ok, " + F + " %x, " + F + " " + zero(dtypes::float32.vec(n)) + "\n";
  b += "  %xd = fpext " + F + " %xs to " + D + "\n";
  b += "  %t = fmul " + D + " %xd, " + dk(0.63661977236758134308) + "\n";  // 2/pi
  b += "  %q = call " + D + " @llvm.rint." + ds + "(" + D + " %t)\n";
  b += "  %nq = fneg " + D + " %q\n";
  b += fma("%r1", "%nq", dk(std::bit_cast<double>(uint64_t(0x3FF921FB54442D18))), "%xd");  // pi/2, high double
  b += fma("%r", "%nq", dk(std::bit_cast<double>(uint64_t(0x3C91A62633145C07))), "%r1");   // pi/2 - high
  b += "  %r2 = fmul " + D + " %r, %r\n";
  b += fma("%s4", "%r2", dk(s[4]), dk(s[3])) + fma("%s3", "%r2", "%s4", dk(s[2])) + fma("%s2", "%r2", "%s3", dk(s[1])) +
       fma("%s1", "%r2", "%s2", dk(s[0]));
  b += "  %r3 = fmul " + D + " %r, %r2\n" + fma("%sin", "%r3", "%s1", "%r");
  b += fma("%c5", "%r2", dk(c[5]), dk(c[4])) + fma("%c4", "%r2", "%c5", dk(c[3])) + fma("%c3", "%r2", "%c4", dk(c[2])) +
       fma("%c2", "%r2", "%c3", dk(c[1])) + fma("%c1", "%r2", "%c2", dk(c[0])) + fma("%cos", "%r2", "%c1", dk(1.0));
  b += "  %qi = fptosi " + D + " %q to " + I + "\n";
  b += "  %q1 = and " + I + " %qi, " + ik("1") + "\n  %swap = icmp ne " + I + " %q1, " + zero(dtypes::int32.vec(n)) + "\n";
  b += "  %v = select " + C + " %swap, " + D + " %cos, " + D + " %sin\n";
  b += "  %q2 = and " + I + " %qi, " + ik("2") + "\n  %neg = icmp ne " + I + " %q2, " + zero(dtypes::int32.vec(n)) + "\n";
  b += "  %nv = fneg " + D + " %v\n  %w = select " + C + " %neg, " + D + " %nv, " + D + " %v\n";
  b += "  %f = fptrunc " + D + " %w to " + F + "\n";
  b += "  %fast = select " + C + " %tiny, " + F + " %x, " + F + " %f\n";
  if (!vec) {
    b += "  br i1 %ok, label %done, label %slow\nslow:\n  %si = call float @llvm.sin.f32(float %x)\n  br label %done\n";
    b += "done:\n  %res = phi float [ %fast, %entry ], [ %si, %slow ]\n  ret float %res\n}\n";
    return b;
  }
  const std::string N = std::to_string(n);
  b += "  %all = call i1 @llvm.vector.reduce.and." + lanes_suffix(n, "i1") + "(" + C + " %ok)\n";
  b += "  br i1 %all, label %done, label %loop\n";
  b += "loop:\n  %i = phi i32 [ 0, %entry ], [ %in, %next ]\n  %acc = phi " + F + " [ %fast, %entry ], [ %acc2, %next ]\n";
  b += "  %oki = extractelement " + C + " %ok, i32 %i\n  br i1 %oki, label %next, label %call\n";
  b += "call:\n  %xi = extractelement " + F + " %x, i32 %i\n  %si = call float @llvm.sin.f32(float %xi)\n";
  b += "  %accc = insertelement " + F + " %acc, float %si, i32 %i\n  br label %next\n";
  b += "next:\n  %acc2 = phi " + F + " [ %acc, %loop ], [ %accc, %call ]\n  %in = add i32 %i, 1\n";
  b += "  %more = icmp ult i32 %in, " + N + "\n  br i1 %more, label %loop, label %done\n";
  b += "done:\n  %res = phi " + F + " [ %fast, %entry ], [ %acc2, %next ]\n  ret " + F + " %res\n}\n";
  return b;
}

// Helpers defined in the module when used: exact conversions the x86 backend would otherwise do with libcalls. The
// bfloat16 ones take n lanes (n 1: scalars; vector CASTs, see LLVMRenderer::vector_alu) and are named by them.
std::string helper_def(const std::string& fn, int n) {
  const std::string F = ltype(dtypes::float32.vec(n)), B = ltype(dtypes::bfloat16.vec(n)), I = ltype(dtypes::int32.vec(n)),
                    H = ltype(dtypes::int16.vec(n)), C = ltype(dtypes::bool_.vec(n)), name = lanes_helper_name(fn, n);
  auto k = [&](const char* c) { return splat(dtypes::int32.vec(n), c); };
  if (fn == "tg.bf2f")
    return "define internal " + F + " @" + name + "(" + B + " %x) alwaysinline nounwind {\n"
           "  %b = bitcast " + B + " %x to " + H + "\n"
           "  %z = zext " + H + " %b to " + I + "\n"
           "  %s = shl " + I + " %z, " + k("16") + "\n"
           "  %f = bitcast " + I + " %s to " + F + "\n"
           "  ret " + F + " %f\n}\n";
  if (fn == "tg.f2bf")  // round to nearest even; a NaN stays a (quiet) NaN
    return "define internal " + B + " @" + name + "(" + F + " %x) alwaysinline nounwind {\n"
           "  %u = bitcast " + F + " %x to " + I + "\n"
           "  %a = and " + I + " %u, " + k("2147483647") + "\n"
           "  %nan = icmp ugt " + I + " %a, " + k("2139095040") + "\n"
           "  %hi = lshr " + I + " %u, " + k("16") + "\n"
           "  %q = or " + I + " %hi, " + k("64") + "\n"
           "  %lsb = and " + I + " %hi, " + k("1") + "\n"
           "  %r1 = add " + I + " %u, " + k("32767") + "\n"
           "  %r2 = add " + I + " %r1, %lsb\n"
           "  %r3 = lshr " + I + " %r2, " + k("16") + "\n"
           "  %res = select " + C + " %nan, " + I + " %q, " + I + " %r3\n"
           "  %t = trunc " + I + " %res to " + H + "\n"
           "  %b = bitcast " + H + " %t to " + B + "\n"
           "  ret " + B + " %b\n}\n";
  // double -> half rounded once: round to odd into float (24 bits >= 11 + 2), then to nearest even.
  return R"(define internal half @tg.d2h(double %d) alwaysinline nounwind {
  %f = fptrunc double %d to float
  %back = fpext float %f to double
  %inexact = fcmp one double %back, %d
  %u = bitcast float %f to i32
  %af = call double @llvm.fabs.f64(double %back)
  %ad = call double @llvm.fabs.f64(double %d)
  %away = fcmp ogt double %af, %ad
  %dec = zext i1 %away to i32
  %u1 = sub i32 %u, %dec
  %u2 = or i32 %u1, 1
  %u3 = select i1 %inexact, i32 %u2, i32 %u
  %f2 = bitcast i32 %u3 to float
  %h = fptrunc float %f2 to half
  ret half %h
}
declare double @llvm.fabs.f64(double)
)";
}

// State of one render.
class LLVMEmitter {
 public:
  LLVMEmitter(const std::string& name, const render_detail::LinearInfo& info) : name_(name), info_(info) {}

  std::string run(const std::vector<const UOp*>& program) {
    // The entry point (the CPU ABI) loads the buffer pointers and variables and calls the body, whose buffer
    // arguments are noalias: distinct PARAMs are distinct buffers (a buffer read and written by one kernel is one
    // PARAM), so LLVM may reorder the expander's loads and stores and vectorise them. The body is inlined.
    std::string wrap, call, sig;
    for (size_t i = 0; i < info_.params.size(); i++) {
      std::string p = "%data" + std::to_string(i), is = std::to_string(i);
      wrap += "  %bufp" + is + " = getelementptr inbounds ptr, ptr %bufs, i64 " + is + "\n";
      wrap += "  " + p + " = load ptr, ptr %bufp" + is + ", align 8\n";
      call += std::string(call.empty() ? "" : ", ") + "ptr " + p;
      sig += std::string(sig.empty() ? "" : ", ") + "ptr noalias " + p;
      r_[info_.params[i]] = p;
    }
    for (size_t j = 0; j < info_.vars.size(); j++) {
      const UOp* v = info_.vars[j];
      std::string n = "%var" + std::to_string(j), js = std::to_string(j), T = ltype(v->dtype);
      wrap += "  %varp" + js + " = getelementptr inbounds i64, ptr %vars, i64 " + js + "  ; " +
              render_detail::comment_safe(std::get<VarArg>(v->arg).name) + "\n";
      if (v->dtype.bitsize() == 64) {
        wrap += "  " + n + " = load i64, ptr %varp" + js + ", align 8\n";
      } else {
        wrap += "  %var64." + js + " = load i64, ptr %varp" + js + ", align 8\n";
        wrap += "  " + n + " = trunc i64 %var64." + js + " to " + T + "\n";
      }
      call += std::string(call.empty() ? "" : ", ") + T + " " + n;
      sig += std::string(sig.empty() ? "" : ", ") + T + " " + n;
      r_[v] = n;
    }
    for (size_t i = 0; i < program.size(); i++) emit(program[i], i);

    std::string out = "; kernel " + name_ + " (tg LLVM renderer)\n\n";
    out += "define void @" + name_ + "(ptr nocapture readonly %bufs, ptr nocapture readonly %vars) #0 {\nentry:\n";
    out += wrap + "  call void @" + name_ + ".body(" + call + ")\n  ret void\n}\n\n";
    out += "define internal void @" + name_ + ".body(" + sig + ") #1 {\nentry:\n";
    // non-temporal stores are weakly ordered: fenced before the kernel returns (x86 MFENCE, AArch64 DMB), so the
    // thread pool's completion signal, and the next kernel, see them
    out += entry_ + body_ + (nt_md_.empty() ? "" : "  fence seq_cst\n") + "  ret void\n}\n\n";
    for (const auto& [name, def] : helpers_) out += def + "\n";
    for (const std::string& d : decls_) out += d + "\n";
    if (!compiler_used_.empty()) {
      std::string list;
      for (const std::string& f : compiler_used_) list += (list.empty() ? "ptr @" : ", ptr @") + f;
      out += "@llvm.compiler.used = appending global [" + std::to_string(compiler_used_.size()) + " x ptr] [" + list +
             "], section \"llvm.metadata\"\n";
    }
    out += "\nattributes #0 = { nounwind \"no-trapping-math\"=\"true\" }\n";
    out += "attributes #1 = { nounwind alwaysinline \"no-trapping-math\"=\"true\" }\n";
    for (const std::string& m : meta_) out += m + "\n";
    return out;
  }

 private:
  std::string tmp() { return "%t" + std::to_string(ntmp_++); }
  void ins(const std::string& s) { body_ += "  " + s + "\n"; }
  void label(const std::string& l) {
    body_ += l + ":\n";
    block_ = l;
  }
  // A new temporary holding the result of `rhs` (an instruction without its "%x = ").
  std::string val(const std::string& rhs) {
    std::string t = tmp();
    ins(t + " = " + rhs);
    return t;
  }
  std::string intrinsic(const std::string& fn, DType d, const std::vector<std::string>& args) {
    std::string T = ltype(d), sig, call;
    for (size_t i = 0; i < args.size(); i++) {
      sig += (i ? ", " : "") + T;
      call += (i ? ", " : "") + T + " " + args[i];
    }
    std::string full = "llvm." + fn + "." + (d.count > 1 ? "v" + std::to_string(d.count) : "") +
                       (dtypes::is_float(d) ? fsuffix(d) : lscalar(d));
    decls_.insert("declare " + T + " @" + full + "(" + sig + ")");
    return val("call " + T + " @" + full + "(" + call + ")");
  }
  // sin of float32 lanes through sin_helper_def (vectorised; libm only for arguments past 2^24, inf and NaN)
  std::string sin_f32(DType d, const std::string& x) {
    auto define = [&](int lanes) {
      const std::string nm = lanes_helper_name("tg.sinf", lanes);
      if (helpers_.count(nm)) return nm;
      helpers_[nm] = sin_helper_def(lanes);
      for (std::string& decl : sin_helper_decls(lanes)) decls_.insert(std::move(decl));
      return nm;
    };
    const std::string name = define(d.count);
    if (d.count == 1)  // the scalar's vector variants, kept until the loop vectoriser has run (llvm.compiler.used)
      for (int lanes : {4, 8, 16}) compiler_used_.insert(define(lanes));
    return val("call " + ltype(d) + " @" + name + "(" + ltype(d) + " " + x + ")");
  }
  // A call of helper fn (helper_def) over n lanes.
  std::string helper(const std::string& fn, const std::string& ret, const std::string& arg, int n = 1) {
    std::string name = lanes_helper_name(fn, n);
    if (!helpers_.count(name)) helpers_[name] = helper_def(fn, n);
    return val("call " + ret + " @" + name + "(" + arg + ")");
  }

  std::string lconst(const UOp* c) {
    DType d = c->dtype;
    if (dtypes::is_float(d)) {
      double v = std::get<double>(c->arg);
      char buf[16];
      if (d.scalar == Scalar::Float16) {
        std::snprintf(buf, sizeof buf, "0xH%04X", unsigned(float_to_half_bits(float(v))));
        return buf;
      }
      if (d.scalar == Scalar::BFloat16) {
        std::snprintf(buf, sizeof buf, "0xR%04X", unsigned(float_to_bf16_bits(float(v))));
        return buf;
      }
      // float and double literals are the double's bits (a float's value is exact in double).
      if (std::isnan(v)) return hex64(std::signbit(v) ? 0xFFF8000000000000ull : 0x7FF8000000000000ull);
      if (d.scalar == Scalar::Float32) v = double(float(v));  // LLVM rejects float literals that are not floats
      uint64_t bits;
      std::memcpy(&bits, &v, 8);
      return hex64(bits);
    }
    int64_t v = std::get<int64_t>(c->arg);
    if (dtypes::is_bool(d)) return v ? "true" : "false";
    int bits = d.bitsize();
    if (bits < 64) v = int64_t(uint64_t(v) << (64 - bits)) >> (64 - bits);  // sign-extend: LLVM reads iN literals so
    return std::to_string(v);
  }

  // float32 value of a 16-bit float, and back (lane by lane for vectors).
  std::string ext_f32(const std::string& x, DType d) {
    std::string F = ltype(dtypes::float32.vec(d.count));
    if (d.scalar == Scalar::Float16) return val("fpext " + ltype(d) + " " + x + " to " + F);
    if (d.scalar == Scalar::BFloat16) return helper("tg.bf2f", F, ltype(d) + " " + x, d.count);
    return x;
  }
  std::string trunc_f32(const std::string& x, DType d) {
    std::string F = ltype(dtypes::float32.vec(d.count));
    if (d.scalar == Scalar::Float16) return val("fptrunc " + F + " " + x + " to " + ltype(d));
    if (d.scalar == Scalar::BFloat16) return helper("tg.f2bf", ltype(d), F + " " + x, d.count);
    return x;
  }
  // An int (or bool) converted to another int width.
  std::string int_resize(const std::string& x, DType from, DType to) {
    int fb = dtypes::is_bool(from) ? 1 : from.bitsize(), tb = dtypes::is_bool(to) ? 1 : to.bitsize();
    if (fb == tb) return x;
    if (fb > tb) return val("trunc " + ltype(from) + " " + x + " to " + ltype(to));
    return val(std::string(is_signed_int(from) ? "sext " : "zext ") + ltype(from) + " " + x + " to " + ltype(to));
  }

  std::string cast(std::string x, DType from, DType to) {
    if (from == to) return x;
    if (is16(from)) {
      x = ext_f32(x, from);
      from = dtypes::float32.vec(from.count);
      if (to == from) return x;
    }
    bool ff = dtypes::is_float(from), tf = dtypes::is_float(to);
    if (dtypes::is_bool(to))
      return ff ? val("fcmp une " + ltype(from) + " " + x + ", 0.0") : val("icmp ne " + ltype(from) + " " + x + ", 0");
    if (!ff && !tf) return int_resize(x, from, to);
    if (!ff) {  // int/bool -> float
      std::string cv = dtypes::is_bool(from) || dtypes::is_unsigned(from) ? "uitofp " : "sitofp ";
      if (to.scalar == Scalar::Float32 || to.scalar == Scalar::Float64) return val(cv + ltype(from) + " " + x + " to " + ltype(to));
      std::string d = val(cv + ltype(from) + " " + x + " to double");  // as exec_alu: through double
      if (to.scalar == Scalar::Float16) return helper("tg.d2h", "half", "double " + d);
      return trunc_f32(val("fptrunc double " + d + " to float"), to);
    }
    if (tf) {  // float32/float64 -> float
      if (from == to) return x;
      if (to.scalar == Scalar::Float64) return val("fpext " + ltype(from) + " " + x + " to " + ltype(to));
      if (from.scalar == Scalar::Float64 && to.scalar == Scalar::Float32)
        return val("fptrunc " + ltype(from) + " " + x + " to " + ltype(to));
      if (from == dtypes::float64 && to.scalar == Scalar::Float16) return helper("tg.d2h", "half", "double " + x);
      if (from == dtypes::float64) x = val("fptrunc double " + x + " to float");
      return to == dtypes::float32 ? x : trunc_f32(x, to);
    }
    // float -> int: through int64 so that values outside the target width wrap instead of being poison
    std::string T = ltype(from);
    if (to == dtypes::uint64) {
      std::string big = val("fcmp oge " + T + " " + x + ", 0x43E0000000000000");  // 2^63
      std::string u = val("fptoui " + T + " " + x + " to i64"), s = val("fptosi " + T + " " + x + " to i64");
      return val("select i1 " + big + ", i64 " + u + ", i64 " + s);
    }
    std::string s = val("fptosi " + T + " " + x + " to i64");
    return to.bitsize() == 64 ? s : val("trunc i64 " + s + " to " + ltype(to));
  }

  std::string bitcast(const std::string& x, DType from, DType to) {
    if (ltype(from) == ltype(to)) return x;
    if (dtypes::is_bool(to)) return val("icmp ne " + ltype(from) + " " + x + ", 0");
    if (dtypes::is_bool(from)) return val("zext i1 " + x + " to " + ltype(to));
    return val("bitcast " + ltype(from) + " " + x + " to " + ltype(to));
  }

  std::string float_alu(const UOp* u, DType d, const std::vector<std::string>& a) {
    std::string T = ltype(d);
    auto bin = [&](const char* ins) { return val(std::string(ins) + " " + T + " " + a[0] + ", " + a[1]); };
    switch (u->op) {
      case Ops::NEG: return val("fneg " + T + " " + a[0]);
      case Ops::EXP2: return intrinsic("exp2", d, a);
      case Ops::LOG2: return intrinsic("log2", d, a);
      case Ops::SIN: return d.scalar == Scalar::Float32 && getenv_int("TRANSCENDENTAL", 1) != 0 ? sin_f32(d, a[0])
                                                                                           : intrinsic("sin", d, a);
      case Ops::SQRT: return intrinsic("sqrt", d, a);
      case Ops::TRUNC: return intrinsic("trunc", d, a);
      case Ops::POW: return intrinsic("pow", d, a);
      case Ops::MAX: {  // exec_alu's: a < b ? b : a, NaN when either is (a + b carries it)
        std::string lt = val("fcmp olt " + T + " " + a[0] + ", " + a[1]), C = cond_t(d);
        std::string m = val("select " + C + " " + lt + ", " + T + " " + a[1] + ", " + T + " " + a[0]);
        std::string uno = val("fcmp uno " + T + " " + a[0] + ", " + a[1]);
        return val("select " + C + " " + uno + ", " + T + " " + bin("fadd") + ", " + T + " " + m);
      }
      case Ops::MULACC: return intrinsic("fma", d, a);
      case Ops::RECIPROCAL: return val("fdiv " + T + " " + splat(d, "1.0") + ", " + a[0]);
      case Ops::ADD: return bin("fadd");
      case Ops::SUB: return bin("fsub");
      case Ops::MUL: return bin("fmul");
      case Ops::FDIV: return bin("fdiv");
      case Ops::CMPLT: return bin("fcmp olt");
      case Ops::CMPNE: return bin("fcmp une");
      case Ops::CMPEQ: return bin("fcmp oeq");
      default: throw Error("[render] kernel " + name_ + ": LLVM has no rendering for " + describe(u));
    }
  }

  std::string int_alu(const UOp* u, DType d, std::vector<std::string> a) {
    std::string T = ltype(d);
    bool sgn = is_signed_int(d), b = dtypes::is_bool(d);
    auto bin = [&](const std::string& ins) { return val(ins + " " + T + " " + a[0] + ", " + a[1]); };
    switch (u->op) {
      case Ops::NEG: return b ? a[0] : val("sub " + T + " " + zero(d) + ", " + a[0]);  // -b != 0 is b
      case Ops::TRUNC: return a[0];
      case Ops::ADD: return bin(b ? "or" : "add");
      case Ops::SUB: return bin("sub");
      case Ops::MUL: return bin("mul");
      case Ops::IDIV: return bin(sgn ? "sdiv" : "udiv");
      case Ops::MOD: return bin(sgn ? "srem" : "urem");
      case Ops::MAX: return b ? bin("or") : intrinsic(sgn ? "smax" : "umax", d, a);
      case Ops::CMPLT: return bin(sgn ? "icmp slt" : "icmp ult");
      case Ops::CMPNE: return bin("icmp ne");
      case Ops::CMPEQ: return bin("icmp eq");
      case Ops::XOR: return bin("xor");
      case Ops::OR: return bin("or");
      case Ops::AND: return bin("and");
      case Ops::SHL: case Ops::SHR:
        a[1] = int_resize(a[1], u->src(1)->dtype, d);
        return bin(u->op == Ops::SHL ? "shl" : sgn ? "ashr" : "lshr");
      case Ops::MULACC: {
        std::string m = bin("mul");
        return val(std::string(b ? "or " : "add ") + T + " " + m + ", " + a[2]);
      }
      case Ops::POW: {  // as exec_alu: pow of the doubles, truncated
        std::string cv = sgn ? "sitofp " : "uitofp ";
        std::string x = val(cv + T + " " + a[0] + " to double"), y = val(cv + T + " " + a[1] + " to double");
        std::string p = intrinsic("pow", dtypes::float64, {x, y});
        return int_resize(val("fptosi double " + p + " to i64"), dtypes::int64, d);
      }
      default: throw Error("[render] kernel " + name_ + ": LLVM has no rendering for " + describe(u));
    }
  }

  // A VECTORIZE of lane j of n vectors of n lanes (the vectorizer's transposed block: a store along one axis of
  // loads along another): row j of their transpose, by the block-swap network. Rows a, a ^ 2^b exchange the halves
  // their bit b picks, one two-source shuffle per row and bit, log2(n) bits: the n rows of one block cost n log2(n)
  // shuffles, shared between the block's VECTORIZEs (memoised within a basic block), where an insert of each lane
  // cost n - 1 per row, which LLVM's x86 lowering turned into single-element blends, broadcasts and spills
  // (a (512, 24, 24, 32) -> NCHW copy: about 850 instructions, nearly all in its loop over 384 floats, 21 GB/s). Null
  // when u is not such a block.
  std::optional<std::string> transpose_lane(const UOp* u) {
    const size_t n = u->nsrc();
    if (n < 4 || (n & (n - 1)) || u->src(0)->op != Ops::GEP) return std::nullopt;
    const auto& lanes0 = std::get<std::vector<int64_t>>(u->src(0)->arg);
    if (lanes0.size() != 1) return std::nullopt;
    const int64_t j = lanes0[0];
    std::vector<std::string> rows;
    for (const UOpRef& g : u->src()) {
      if (g->op != Ops::GEP || std::get<std::vector<int64_t>>(g->arg) != std::vector<int64_t>{j} ||
          !(g->src(0)->dtype == u->dtype))
        return std::nullopt;
      rows.push_back(r_.at(g->src(0)));
    }
    std::string T = ltype(u->dtype), key = block_;
    for (const std::string& r : rows) key += "," + r;
    auto& memo = transpose_memo_[key];
    int bits = 0;
    while ((size_t(1) << bits) < n) bits++;
    // row(level, a): row a after the exchanges of bits bits-1 .. bits-level
    std::function<std::string(int, size_t)> row = [&](int level, size_t a) -> std::string {
      if (level == 0) return rows[a];
      auto it = memo.find({level, a});
      if (it != memo.end()) return it->second;
      const size_t bit = size_t(1) << (bits - level), p = a ^ bit;
      std::string x = row(level - 1, a), y = row(level - 1, p), mask;
      for (size_t c = 0; c < n; c++) {
        size_t pick = (c & bit) == (a & bit) ? c : n + (c ^ bit);
        mask += (c ? ", i32 " : "i32 ") + std::to_string(pick);
      }
      std::string t = val("shufflevector " + T + " " + x + ", " + T + " " + y + ", <" + std::to_string(n) +
                          " x i32> <" + mask + ">");
      memo.emplace(std::make_pair(level, a), t);
      return t;
    };
    return row(bits, size_t(j));
  }

  std::string alu(const UOp* u) {
    std::vector<std::string> a;
    for (const UOpRef& s : u->src()) a.push_back(r_.at(s.get()));
    if (u->op == Ops::WHERE)
      return val("select " + cond_t(u->dtype) + " " + a[0] + ", " + ltype(u->dtype) + " " + a[1] + ", " + ltype(u->dtype) +
                 " " + a[2]);
    DType cdt = is_comparison(u->op) ? u->src(0)->dtype : u->dtype;
    if (is16(cdt)) {  // compute in float32, round after the op
      for (std::string& x : a) x = ext_f32(x, cdt);
      std::string res = float_alu(u, dtypes::float32.vec(cdt.count), a);
      return is_comparison(u->op) ? res : trunc_f32(res, u->dtype);
    }
    return dtypes::is_float(cdt) ? float_alu(u, cdt, a) : int_alu(u, cdt, a);
  }

  void emit(const UOp* u, size_t i) {
    auto s = [&](size_t k) -> const std::string& { return r_.at(u->src(k)); };
    std::string id = std::to_string(i), v = "%v" + id;
    switch (u->op) {
      case Ops::PARAM: case Ops::DEFINE_VAR: case Ops::SINK: return;
      case Ops::CONST: r_[u] = lconst(u); return;
      case Ops::AFTER: r_[u] = s(0); return;  // ordering only
      case Ops::DEFINE_REG:
        entry_ += "  " + v + " = alloca [" + std::to_string(u->dtype.size) + " x " + mtype(u->dtype.base()) + "], align 16\n";
        r_[u] = v;
        return;
      case Ops::INDEX:
        ins(v + " = getelementptr inbounds " + mtype(u->dtype.base()) + ", ptr " + s(0) + ", " + ltype(u->src(1)->dtype) +
            " " + s(1));
        r_[u] = v;
        return;
      case Ops::LOAD: {
        DType d = u->dtype;
        // a vector of n lanes reads n consecutive elements, aligned as one element
        std::string align = d.count > 1 ? ", align " + std::to_string(std::max(1, d.bitsize() / 8)) : "";
        auto load = [&]() {
          std::string x = val("load " + mtype(d) + ", ptr " + s(0) + align);
          return dtypes::is_bool(d) ? val("icmp ne " + mtype(d) + " " + x + ", " + zero(d)) : x;
        };
        if (u->nsrc() == 1) {
          r_[u] = load();
          return;
        }
        if (u->src(2)->dtype.count != 1)
          throw Error("[render] kernel " + name_ + ": LLVM IR: a LOAD with a vector gate is not supported");
        std::string pre = block_, lb = "G" + id + ".load", jb = "G" + id + ".join";
        ins("br i1 " + s(2) + ", label %" + lb + ", label %" + jb);
        label(lb);
        std::string x = load();
        ins("br label %" + jb);
        label(jb);
        ins(v + " = phi " + ltype(d) + " [ " + x + ", %" + lb + " ], [ " + s(1) + ", %" + pre + " ]");
        r_[u] = v;
        return;
      }
      case Ops::STORE: {
        DType d = u->src(1)->dtype;
        std::string x = dtypes::is_bool(d) ? val("zext " + ltype(d) + " " + s(1) + " to " + mtype(d)) : s(1);
        std::string align = d.count > 1 ? ", align " + std::to_string(std::max(1, d.bitsize() / 8)) : "";
        if (u->nsrc() == 3) {  // gated (an index check's hit record): a branch around the store
          if (u->src(2)->dtype.count != 1) throw Error("[render] LLVM IR: a STORE with a vector gate is not supported");
          ins("br i1 " + s(2) + ", label %S" + id + ".then, label %S" + id + ".end");
          label("S" + id + ".then");
          ins("store " + mtype(d) + " " + x + ", ptr " + s(0) + align);
          ins("br label %S" + id + ".end");
          label("S" + id + ".end");
          return;
        }
        if (const int64_t* nt = std::get_if<int64_t>(&u->arg); nt && *nt == 1 && d.count > 1) {
          // Opt NONTEMPORAL: a store past the caches, aligned to the vector's bytes (x86 MOVNT* faults otherwise):
          // the index is a multiple of the lanes (mark_nontemporal_stores), the buffer's address is tested once on
          // entry (tg's allocator aligns to 64 bytes; memory owned elsewhere may not be), else an ordinary store.
          int64_t bytes = int64_t(d.count) * std::max(1, d.bitsize() / 8);
          std::string ok = aligned_flag(u->src(0)->src(0), bytes);
          if (nt_md_.empty()) {
            nt_md_ = "!" + std::to_string(meta_.size() + 1);
            meta_.push_back(nt_md_ + " = !{i32 1}");
          }
          ins("br i1 " + ok + ", label %S" + id + ".nt, label %S" + id + ".plain");
          label("S" + id + ".nt");
          ins("store " + mtype(d) + " " + x + ", ptr " + s(0) + ", align " + std::to_string(bytes) + ", !nontemporal " + nt_md_);
          ins("br label %S" + id + ".end");
          label("S" + id + ".plain");
          ins("store " + mtype(d) + " " + x + ", ptr " + s(0) + align);
          ins("br label %S" + id + ".end");
          label("S" + id + ".end");
          return;
        }
        ins("store " + mtype(d) + " " + x + ", ptr " + s(0) + align);
        return;
      }
      case Ops::VECTORIZE: {
        DType d = u->dtype;
        std::string T = ltype(d), E = lscalar(d);
        bool consts = true, same = true;
        for (size_t k = 0; k < u->nsrc(); k++) consts &= u->src(k)->op == Ops::CONST, same &= u->src(k) == u->src(0);
        if (consts) {  // a constant vector
          std::string c = "<";
          for (size_t k = 0; k < u->nsrc(); k++) c += (k ? ", " : "") + E + " " + s(k);
          r_[u] = c + ">";
          return;
        }
        if (!same)
          if (auto t = transpose_lane(u)) {
            r_[u] = *t;
            return;
          }
        std::string acc = "poison";
        for (size_t k = 0; k < (same ? 1 : u->nsrc()); k++)
          acc = val("insertelement " + T + " " + acc + ", " + E + " " + s(k) + ", i64 " + std::to_string(k));
        // a broadcast: lane 0 shuffled into every lane
        r_[u] = same ? val("shufflevector " + T + " " + acc + ", " + T + " poison, <" + std::to_string(d.count) +
                           " x i32> zeroinitializer")
                     : acc;
        return;
      }
      case Ops::GEP: {
        int64_t lane = std::get<std::vector<int64_t>>(u->arg).at(0);
        r_[u] = val("extractelement " + ltype(u->src(0)->dtype) + " " + s(0) + ", i64 " + std::to_string(lane));
        return;
      }
      case Ops::RANGE: {
        std::string T = ltype(u->dtype), L = "L" + id, pre = block_;
        ins("br label %" + L + ".hdr");
        label(L + ".hdr");
        ins(v + " = phi " + T + " [ 0, %" + pre + " ], [ " + v + ".next, %" + L + ".latch ]");
        std::string c = val(std::string(is_signed_int(u->dtype) ? "icmp slt " : "icmp ult ") + T + " " + v + ", " + s(0));
        ins("br i1 " + c + ", label %" + L + ".body, label %" + L + ".exit");
        label(L + ".body");
        r_[u] = v;
        return;
      }
      case Ops::END: {
        const UOp* rng = end_range(u);
        std::string L = "L" + std::to_string(range_pos(rng)), rv = r_.at(rng), T = ltype(rng->dtype);
        ins("br label %" + L + ".latch");
        label(L + ".latch");
        // r < end <= max of the dtype, so r + 1 wraps neither way
        ins(rv + ".next = add nuw " + std::string(is_signed_int(rng->dtype) ? "nsw " : "") + T + " " + rv + ", 1");
        if (range_type(rng) == AxisType::Lane && rng->src(0)->is_const()) {
          // Lane loops: vectorised across the lanes even with the loop vectoriser off (forced by metadata), and
          // not unrolled first (the full unroll of a short loop runs before the vectoriser, which then sees none).
          std::string md = "!" + std::to_string(meta_.size() + 1);
          meta_.push_back(md + " = distinct !{" + md + ", !{!\"llvm.loop.vectorize.enable\", i1 true}, " +
                          "!{!\"llvm.loop.vectorize.width\", i32 " + std::to_string(lane_vector_width(rng->src(0)->const_int())) +
                          "}, !{!\"llvm.loop.interleave.count\", i32 1}, !{!\"llvm.loop.unroll.disable\"}}");
          ins("br label %" + L + ".hdr, !llvm.loop " + md);
        } else {
          ins("br label %" + L + ".hdr");
        }
        label(L + ".exit");
        return;
      }
      case Ops::IF:
        ins("br i1 " + s(0) + ", label %I" + id + ".then, label %I" + id + ".end");
        label("I" + id + ".then");
        if_ids_[u] = id;
        return;
      case Ops::ENDIF: {
        std::string I = "I" + if_ids_.at(u->src(0));
        ins("br label %" + I + ".end");
        label(I + ".end");
        return;
      }
      case Ops::PREFETCH: {
        // a read prefetch into all cache levels; the address is not `inbounds` (it may lie past the buffer's end,
        // where a prefetch does nothing)
        std::string a = val("getelementptr " + mtype(u->src(0)->dtype.base()) + ", ptr " + s(0) + ", " +
                            ltype(u->src(1)->dtype) + " " + s(1));
        decls_.insert("declare void @llvm.prefetch.p0(ptr nocapture readonly, i32 immarg, i32 immarg, i32 immarg)");
        ins("call void @llvm.prefetch.p0(ptr " + a + ", i32 0, i32 3, i32 1)");
        return;
      }
      case Ops::CAST: r_[u] = cast(s(0), u->src(0)->dtype, u->dtype); return;
      case Ops::BITCAST: r_[u] = bitcast(s(0), u->src(0)->dtype, u->dtype); return;
      default: r_[u] = alu(u); return;
    }
  }

  // An i1 in the entry block: whether buffer parameter p's address is a multiple of `bytes` (once per pair).
  std::string aligned_flag(const UOp* p, int64_t bytes) {
    std::string& f = aligned_[{p, bytes}];
    if (f.empty()) {
      std::string n = std::to_string(aligned_.size()), a = "%al" + n;
      entry_ += "  " + a + ".i = ptrtoint ptr " + r_.at(p) + " to i64\n";
      entry_ += "  " + a + ".m = and i64 " + a + ".i, " + std::to_string(bytes - 1) + "\n";
      entry_ += "  " + a + " = icmp eq i64 " + a + ".m, 0\n";
      f = a;
    }
    return f;
  }

  size_t range_pos(const UOp* rng) const {
    std::string v = r_.at(rng);  // "%v<pos>"
    return size_t(std::stoull(v.substr(2)));
  }

  const std::string& name_;
  const render_detail::LinearInfo& info_;
  std::unordered_map<const UOp*, std::string> r_;
  std::vector<std::string> meta_;  // loop metadata nodes
  std::unordered_map<const UOp*, std::string> if_ids_;
  // transpose_lane's shuffles by (block, source rows) and (level, row)
  std::map<std::string, std::map<std::pair<int, size_t>, std::string>> transpose_memo_;
  std::string entry_, body_, block_ = "entry";
  std::set<std::string> decls_;
  std::map<std::string, std::string> helpers_;  // helper name -> its definition
  std::set<std::string> compiler_used_;         // helpers kept whether or not called (@llvm.compiler.used)
  std::map<std::pair<const UOp*, int64_t>, std::string> aligned_;  // aligned_flag's
  std::string nt_md_;                                              // the !nontemporal metadata node, once used
  int ntmp_ = 0;
};

bool valid_symbol(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

bool LLVMRenderer::supports(DType dt) const {
  if (dt.ptr) dt = dt.base();
  if (dt.count != 1 && (dt.ptr || dt.count > vector_lanes_of(dt.scalar_type()))) return false;
  switch (dt.scalar) {
    case Scalar::Index: case Scalar::WeakInt: case Scalar::WeakFloat: case Scalar::Fp8E4M3: case Scalar::Fp8E5M2:
      return false;
    default: return true;
  }
}

int LLVMRenderer::vector_lanes_of(DType d) const {
  switch (d.scalar) {
    case Scalar::Bool: case Scalar::Float16: case Scalar::BFloat16: case Scalar::Float32: case Scalar::Float64:
    case Scalar::Int16: case Scalar::UInt16: case Scalar::Int32: case Scalar::UInt32: case Scalar::Int64:
    case Scalar::UInt64: return 64;
    default: return 1;
  }
}

bool LLVMRenderer::vector_alu(const UOp* u) const {
  DType d = u->dtype, s = u->src(0)->dtype;
  bool f = dtypes::is_float(d);
  switch (u->op) {
    case Ops::ADD: case Ops::SUB: case Ops::MUL: case Ops::NEG: case Ops::MAX: case Ops::MULACC: case Ops::CMPLT:
    case Ops::CMPNE: case Ops::CMPEQ: case Ops::WHERE: case Ops::AND: case Ops::OR: case Ops::XOR: case Ops::SHL:
    case Ops::SHR: case Ops::IDIV: case Ops::MOD:
      return true;
    case Ops::FDIV: case Ops::RECIPROCAL: case Ops::SQRT: case Ops::TRUNC: return f || u->op == Ops::TRUNC;
    case Ops::CAST: {
      // int or bool -> float32/float64, float32 <-> float64, int widening and narrowing: one instruction on the
      // lanes; float16/bfloat16 -> float32/float64 and float32 -> float16/bfloat16 through float32 (the bfloat16
      // helpers on the vector)
      bool fd = d.scalar == Scalar::Float32 || d.scalar == Scalar::Float64;
      bool fs = s.scalar == Scalar::Float32 || s.scalar == Scalar::Float64;
      bool is = dtypes::is_int(s) || dtypes::is_bool(s), id = dtypes::is_int(d);
      return (fd && (fs || is || is16(s))) || (id && (dtypes::is_int(s))) || (is16(d) && s.scalar == Scalar::Float32);
    }
    case Ops::BITCAST:  // lanes of one width (the decomposed exp2's float <-> int32 views); bools lane by lane
      return d.count == s.count && !dtypes::is_bool(d) && !dtypes::is_bool(s) &&
             d.scalar_type().itemsize() == s.scalar_type().itemsize();
    default: return false;  // transcendentals are decomposed (or libm calls), POW lane by lane
  }
}

std::string LLVMRenderer::render(const std::string& name, const std::vector<const UOp*>& program) {
  auto info = check_linear("render", name, program, [this](DType d) { return supports(d); }, {Ops::GEP});
  if (!valid_symbol(name)) throw Error("[render] kernel name '" + name + "' is not a valid symbol");
  return LLVMEmitter(name, info).run(program);
}

}  // namespace tg
