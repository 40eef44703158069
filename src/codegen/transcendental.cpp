// Transcendental decompositions: EXP2 and LOG2 on float32 written as plain ALU ops (a range reduction through the
// float's bits, a polynomial, the exponent put back), for renderers whose own exp2/log2 are scalar library calls
// (the CPU: a libm call per element stops LLVM from vectorising the kernel). float16/bfloat16 go through float32;
// float64 keeps the library call.
//
// Accuracy (tests/codegen_tests.cpp checks every float32 bit pattern class against libm):
//   exp2: x = q + s with q = round(x), |s| <= 1/2; 2^s by a degree-6 minimax polynomial (0.03 ulp on that
//         interval), evaluated with fused multiply-adds; 2^q by building the float's bits in two halves (so
//         q = -151..129, subnormal results, and overflow to inf by the multiply itself). About 21 vector
//         instructions; NaN passes through the float steps unchecked. Measured: at most 0.91 ulp from the exact value.
//         An argument known to be <= 0 (softmax's) needs no upper clamp and scales in one step: 13 instructions.
//   log2: x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log2(m) = 2/ln2 * atanh(t), t = (m-1)/(m+1), |t| <= 0.172,
//         by its odd series to t^11 (truncation below 0.01 ulp), with t's rounding error and 2/ln2's carried as
//         correction terms. Subnormal inputs are scaled by 2^64 first. Measured: at most 1.02 ulp.
// Special values as IEEE: exp2(+inf) = inf, exp2(-inf) = 0, log2(0) = -inf, log2(x<0) = NaN, NaN stays NaN.
#include <cmath>

#include "tg/codegen.hpp"
#include "tg/env.hpp"
#include "tg/pattern.hpp"

namespace tg {

namespace {

UOpRef f32(double v) { return UOp::cnst(dtypes::float32, v); }
UOpRef i32(int64_t v) { return UOp::cnst_int(dtypes::int32, v); }
UOpRef fma(const UOpRef& a, const UOpRef& b, const UOpRef& c) { return a->alu(Ops::MULACC, b, c); }
UOpRef where(const UOpRef& c, const UOpRef& a, const UOpRef& b) { return c->alu(Ops::WHERE, a, b); }
UOpRef bitcast(const UOpRef& x, DType d) { return UOp::make(Ops::BITCAST, d, {x}); }
UOpRef lt(const UOpRef& a, const UOpRef& b) { return a->alu(Ops::CMPLT, b); }

// 2^k as a float32 for k in [-126, 127]: the exponent field k + 127.
UOpRef pow2i(const UOpRef& k) { return bitcast(k->alu(Ops::ADD, i32(127))->alu(Ops::SHL, i32(23)), dtypes::float32); }

// 2^s on [-1/2, 1/2] by a degree-6 polynomial fitted for least maximum relative error (Lawson's iteration in long
// double; 2.0e-9 relative, 0.03 ulp, where the degree-7 Taylor series needed one more fma).
constexpr float kExp2Poly[7] = {1.0f,           0.693147182f,  0.240226477f,  0.0555033237f,
                                0.00961843692f, 0.0013398875f, 0.00015353362f};

UOpRef xexp2(const UOpRef& x) {
  // Clamped into the range that decides the result. NaN fails both tests and stays NaN through every float step
  // (the integer steps see some bit pattern and wrap; a NaN times anything is NaN), so it needs no check of its own.
  // Each bound tests the value it replaces, so both are one min/max instruction (not a compare and a blend).
  UOpRef lo = where(lt(x, f32(-151)), f32(-151), x);
  UOpRef xc = where(lt(f32(129), lo), f32(129), lo);
  // q = round(xc) by the 1.5*2^23 trick (|xc| < 2^22: the sum's last bit is the integer part), s = xc - q exactly;
  // the sum's low bits are q as an int.
  const float magic = 12582912.0f;
  UOpRef t = xc->alu(Ops::ADD, f32(magic));
  UOpRef q = t->alu(Ops::SUB, f32(magic));
  UOpRef s = xc->alu(Ops::SUB, q);
  UOpRef qi = bitcast(t, dtypes::int32)->alu(Ops::SUB, i32(0x4b400000));
  // 2^s by the polynomial
  UOpRef u = f32(kExp2Poly[6]);
  for (int k = 5; k >= 0; k--) u = fma(u, s, f32(kExp2Poly[k]));
  // u * 2^q in two exact steps: q1 = floor(q/2), q2 = q - q1, both in [-76, 65]; past the float range the
  // products round to inf or 0 themselves.
  UOpRef q1 = qi->alu(Ops::SHR, i32(1));
  UOpRef q2 = qi->alu(Ops::SUB, q1);
  return u->alu(Ops::MUL, pow2i(q1))->alu(Ops::MUL, pow2i(q2));
}

// Whether x is known to be <= 0 or NaN from its form: a constant, min(y, c) with c <= 0 as the clamps write it
// (where(c < y, c, y)), or such a value times a positive constant. The scheduler's bounds stage clamps exp(x - max(x))
// so (src/schedule/bounds.cpp: the difference is <= 0 already; the clamp makes it visible here, where x and its row
// maximum are a load and a reduce, and costs one min for the exp2 clamp it removes).
bool nonpositive(const UOp* x) {
  while (x->op == Ops::MUL) {
    const UOp* a = x->src(0);
    const UOp* b = x->src(1);
    if (a->is_const()) std::swap(a, b);
    if (!b->is_const() || !(b->const_float() > 0)) return false;
    x = a;
  }
  if (x->is_const()) return !(x->const_float() > 0);
  if (x->op != Ops::WHERE || x->src(0)->op != Ops::CMPLT) return false;
  const UOp* c = x->src(1);
  return c->is_const() && c->const_float() <= 0 && x->src(0)->src(0) == c && x->src(0)->src(1) == x->src(2);
}

// exp2 of x <= 0 (or NaN): no upper clamp, and the scale in one step. q = round(x) is in [-151, 0], so 2^(q+64) is a
// normal float; the polynomial's coefficients carry the 2^-64 (scaling by a power of two is exact at every step),
// and the one product u*2^-64 * 2^(q+64) rounds once, as the two-step scale does (subnormal results included).
// The exponent field is (bits(t) + 127 + 64) << 23: bits(t) = 0x4b400000 + q, and the shift drops 0x4b400000.
// 13 instructions against 20; the same values as xexp2 to the last bit.
UOpRef xexp2_nonpositive(const UOpRef& x) {
  UOpRef xc = where(lt(x, f32(-151)), f32(-151), x);
  const float magic = 12582912.0f;
  UOpRef t = xc->alu(Ops::ADD, f32(magic));
  UOpRef s = xc->alu(Ops::SUB, t->alu(Ops::SUB, f32(magic)));
  UOpRef u = f32(std::ldexp(kExp2Poly[6], -64));
  for (int k = 5; k >= 0; k--) u = fma(u, s, f32(std::ldexp(kExp2Poly[k], -64)));
  UOpRef e = bitcast(t, dtypes::int32)->alu(Ops::ADD, i32(127 + 64))->alu(Ops::SHL, i32(23));
  return u->alu(Ops::MUL, bitcast(e, dtypes::float32));
}

UOpRef xlog2(const UOpRef& x) {
  // Subnormals (and zero) scaled into the normal range; the exponent takes the 64 back.
  UOpRef tiny = lt(x, f32(0x1p-126));
  UOpRef xs = where(tiny, x->alu(Ops::MUL, f32(0x1p64)), x);
  UOpRef bits = bitcast(xs, dtypes::int32);
  UOpRef e = bits->alu(Ops::SHR, i32(23))->alu(Ops::AND, i32(0xff))->alu(Ops::SUB, i32(127));
  UOpRef m = bitcast(bits->alu(Ops::AND, i32(0x7fffff))->alu(Ops::OR, i32(0x3f800000)), dtypes::float32);  // [1, 2)
  UOpRef big = lt(f32(M_SQRT2), m);
  m = where(big, m->alu(Ops::MUL, f32(0.5)), m);  // [sqrt(1/2), sqrt(2))
  e = where(big, e->alu(Ops::ADD, i32(1)), e);
  e = where(tiny, e->alu(Ops::SUB, i32(64)), e);
  // t = (m-1)/(m+1) plus its rounding error tc: m-1 is exact, w = m+1 is rounded (by werr, exactly m - (w-1)),
  // rem = (m-1) - t*w exactly (one fma), so the true quotient is t + (rem - t*werr)/w to well below an ulp.
  UOpRef u = m->alu(Ops::SUB, f32(1)), w = m->alu(Ops::ADD, f32(1));
  UOpRef t = u->alu(Ops::FDIV, w);
  UOpRef werr = m->alu(Ops::SUB, w->alu(Ops::SUB, f32(1)));
  UOpRef rem = fma(t->alu(Ops::NEG), w, u);
  UOpRef tc = rem->alu(Ops::SUB, t->alu(Ops::MUL, werr))->alu(Ops::FDIV, w);
  UOpRef t2 = t->alu(Ops::MUL, t);
  // 2/ln2 * (t + t^3/3 + ... + t^11/11): the leading term with 2/ln2 split in two floats (hi + lo), the rest
  // t^3 * q(t^2) small enough that its rounding does not matter; the leading product rounds once in an fma.
  const double c1 = 2 / M_LN2;
  const float c1_hi = float(c1), c1_lo = float(c1 - double(c1_hi));
  UOpRef q = f32(c1 / 11);
  for (int k = 9; k >= 3; k -= 2) q = fma(q, t2, f32(c1 / k));
  UOpRef low = fma(t->alu(Ops::MUL, t2), q, fma(f32(c1_lo), t, f32(c1_hi)->alu(Ops::MUL, tc)));
  UOpRef r = fma(f32(c1_hi), t, e->cast(dtypes::float32))->alu(Ops::ADD, low);
  r = where(x->alu(Ops::CMPEQ, f32(0)), f32(-INFINITY), r);
  r = where(x->alu(Ops::CMPEQ, f32(INFINITY)), x, r);
  r = where(lt(x, f32(0)), f32(NAN), r);
  return where(x->alu(Ops::CMPNE, x), x, r);
}

// x^y (a float POW), as tinygrad's xpow: exp2(y * log2|x|), negated for a negative base and an odd integer y, NaN for
// a negative base and a non-integer y except (-inf)^y (inf or 0, as C's pow), and 1 for y == 0 (0^0, inf^0, NaN^0).
// y is an odd integer when y == trunc(y) and y/2 is not (y/2 is exact: no float rounds when halved but subnormals,
// which are not integers).
UOpRef xpow(const UOpRef& x, const UOpRef& y) {
  auto c = [&](double v) { return UOp::cnst(x->dtype, v); };
  UOpRef mag = y->alu(Ops::MUL, x->alu(Ops::MAX, x->alu(Ops::NEG))->alu(Ops::LOG2))->alu(Ops::EXP2);
  UOpRef yt = y->alu(Ops::TRUNC), h = y->alu(Ops::MUL, c(0.5));
  UOpRef odd = y->alu(Ops::CMPEQ, yt)->alu(Ops::AND, h->alu(Ops::CMPNE, h->alu(Ops::TRUNC)));
  UOpRef neg = lt(x, c(0));
  UOpRef r = where(neg->alu(Ops::AND, odd), mag->alu(Ops::NEG), mag);
  UOpRef nan = neg->alu(Ops::AND, y->alu(Ops::CMPNE, yt))->alu(Ops::AND, x->alu(Ops::CMPNE, c(-INFINITY)));
  r = where(nan, c(NAN), r);
  return where(y->alu(Ops::CMPEQ, c(0)), c(1), r);
}

const PatternMatcher& pm_pow() {
  using namespace pat;
  static const PatternMatcher pm(table(rule(op<Ops::POW>(x, y), [](auto& m) -> UOpRef {
    DType d = m.root->dtype;
    if (!dtypes::is_float(d) || d.count != 1) return {};  // integer POW: the renderers' own (exact) pow
    if (d == dtypes::float16 || d == dtypes::bfloat16)  // in float32, rounded once (as torch's opmath)
      return xpow(m.root->src(0)->cast(dtypes::float32), m.root->src(1)->cast(dtypes::float32))->cast(d);
    return xpow(m.root->src(0)->ref(), m.root->src(1)->ref());
  })));
  return pm;
}

// The float32 form of a 16-bit float op, rounded back once.
UOpRef via_f32(const UOp* u, UOpRef (*f)(const UOpRef&)) {
  if (u->dtype == dtypes::float32) return f(u->src(0)->ref());
  if (u->dtype == dtypes::float16 || u->dtype == dtypes::bfloat16)
    return f(u->src(0)->cast(dtypes::float32))->cast(u->dtype);
  return {};  // float64, vectors: the library call
}

const PatternMatcher& pm_transcendental() {
  using namespace pat;
  // exp2 of a value known to be <= 0 (softmax's exp(x - max)) takes the shorter form
  static const PatternMatcher pm(table(rule(op<Ops::EXP2>(x), [](auto& m) {
                                         return via_f32(m.root, nonpositive(m.root->src(0)) ? xexp2_nonpositive : xexp2);
                                       }),
                                       rule(op<Ops::LOG2>(x), [](auto& m) { return via_f32(m.root, xlog2); })));
  return pm;
}

}  // namespace

UOpRef decompose_transcendentals(const UOpRef& sink) {
  return graph_rewrite(sink, pm_transcendental(), nullptr, false, "transcendentals");
}

UOpRef decompose_pow(const UOpRef& sink) { return graph_rewrite(sink, pm_pow(), nullptr, false, "pow"); }

bool want_transcendental_decomposition(const Renderer& r) {
  int64_t v = getenv_int("TRANSCENDENTAL", 1);
  if (v < 0 || v > 2)
    throw EnvError("TRANSCENDENTAL=" + std::to_string(v) +
                   " is out of range; expected 0 (library calls), 1 (as the renderer prefers) or 2 (always)");
  return v == 2 || (v == 1 && !r.native_transcendentals());
}

}  // namespace tg
