// Facts about nodes (exact 128-bit bounds arithmetic) and the bodies of the symbolic callbacks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#define TG_SYMBOLIC_NO_TABLES
#include "symbolic_rules.hpp"
#include "tg/error.hpp"

namespace tg::sym {

// ------------------------------------------------------------------ facts

bool known(const UOp* u) {
  DType d = u->dtype;
  return u->bounds().known && d.count == 1 && !d.ptr && (dtypes::is_int(d) || dtypes::is_bool(d));
}
bool is_signed(DType d) { return dtypes::is_int(d) && !dtypes::is_unsigned(d); }
i128 dt_min(DType d) { return dtypes::min_int(d.scalar_type()); }
i128 dt_max(DType d) { return dtypes::max_int(d.scalar_type()); }
bool fits(DType d, i128 lo, i128 hi) {
  if (d.ptr || d.count != 1 || !(dtypes::is_int(d) || dtypes::is_bool(d))) return false;
  return lo >= dt_min(d) && hi <= dt_max(d) && lo <= hi;
}
int64_t cv(const UOp* c) { return std::get<int64_t>(c->arg); }

bool nonzero(const UOp* u) {
  if (u->op == Ops::CONST) return !std::holds_alternative<int64_t>(u->arg) || cv(u) != 0;
  return known(u) && (u->vmin() > 0 || u->vmax() < 0);
}
bool div_ok(const UOp* x, const UOp* y) {
  if (!nonzero(y)) return false;
  if (!is_signed(x->dtype)) return true;
  bool y_may_be_m1 = y->op == Ops::CONST ? cv(y) == -1 : (!known(y) || (y->vmin() <= -1 && y->vmax() >= -1));
  bool x_may_be_min = !known(x) || i128(x->vmin()) == dt_min(x->dtype);
  return !(y_may_be_m1 && x_may_be_min);
}
bool mul_exact(const UOp* x, i128 c) {
  if (!known(x)) return false;
  i128 a = i128(x->vmin()) * c, b = i128(x->vmax()) * c;
  return fits(x->dtype, std::min(a, b), std::max(a, b));
}
bool add_exact(const UOp* x, i128 c) { return known(x) && fits(x->dtype, x->vmin() + c, x->vmax() + c); }
bool mul_bounds(const UOp* x, const UOp* y, i128& lo, i128& hi) {
  if (!known(x) || !known(y)) return false;
  i128 p[4] = {i128(x->vmin()) * y->vmin(), i128(x->vmin()) * y->vmax(), i128(x->vmax()) * y->vmin(),
               i128(x->vmax()) * y->vmax()};
  lo = *std::min_element(p, p + 4);
  hi = *std::max_element(p, p + 4);
  return fits(x->dtype, lo, hi);
}
i128 tdiv(i128 a, i128 b) { return a / b; }
i128 fdiv_floor(i128 a, i128 b) {
  i128 q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
i128 cdiv_ceil(i128 a, i128 b) { return -fdiv_floor(-a, b); }
i128 gcd(i128 a, i128 b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}
bool sign_ok(i128 nlo, i128 nhi, i128 rlo, i128 rhi) {
  return (nlo >= 0 && rlo >= 0) || (nhi <= 0 && rhi <= 0) || (rlo == 0 && rhi == 0);
}
UOpRef cst(DType d, i128 v) { return UOp::cnst_int(d, int64_t(v)); }

// A hash of u's op tree that ignores where its loads read (the address under an INDEX), to depth 6: the copies of an
// upcast sum (one per vector lane, each reading its own addresses) then order their terms alike, so the vectorize
// stage packs term t of every lane into one vector (int_gemm's four byte products of a word: by hash, each lane had
// its own order, and the packed vectors mixed bytes across lanes).
static uint64_t shape_hash(const UOp* u, int depth = 6) {
  if (u->nsrc() == 0 || depth == 0) return u->nsrc() == 0 ? u->hash : uint64_t(u->op) + 1;
  uint64_t h = (uint64_t(u->op) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(u->dtype.scalar) << 8 | u->dtype.count);
  const size_t n = u->op == Ops::INDEX ? 1 : u->nsrc();  // a load's buffer, not its address
  for (size_t i = 0; i < n; i++) h = (h ^ shape_hash(u->src(i), depth - 1)) * 0x100000001B3ull;
  return h;
}

// The constant parts of the addresses u's loads read (an INDEX's index a + c: c), in the order of a walk of its
// tree, to depth 6: terms of one shape (one word's byte products of each group) ordered by where they read, the
// same order in every lane (lane l adds l to each address of its copy).
static void address_offsets(const UOp* u, std::vector<int64_t>& out, int depth = 6) {
  if (depth == 0) return;
  if (u->op == Ops::INDEX && u->nsrc() >= 2) {
    const UOp* i = u->src(1);
    out.push_back(i->op == Ops::CONST ? i->const_int()
                  : i->op == Ops::ADD && i->src(1)->op == Ops::CONST ? i->src(1)->const_int() : 0);
    return;
  }
  for (size_t k = 0; k < u->nsrc(); k++) address_offsets(u->src(k), out, depth - 1);
}

// a before b by shape, then by where their loads read (the same order in every lane's copy); nullopt when alike
static std::optional<bool> lane_order(const UOp* a, const UOp* b) {
  if (uint64_t ha = shape_hash(a), hb = shape_hash(b); ha != hb) return ha < hb;
  std::vector<int64_t> oa, ob;
  address_offsets(a, oa), address_offsets(b, ob);
  if (oa != ob) return oa < ob;
  return std::nullopt;
}

namespace {
int order_cat(const UOp* u) {
  if (u->op == Ops::CONST) return 2;
  if (u->op == Ops::DEFINE_VAR || u->op == Ops::RANGE || u->op == Ops::SPECIAL) return 0;
  return 1;
}
}  // namespace

bool order_less(const UOp* a, const UOp* b) {
  if (a == b) return false;
  int ca = order_cat(a), cb = order_cat(b);
  if (ca != cb) return ca < cb;
  if (ca == 2) return false;  // constants are combined, not ordered
  if (a->op != b->op) return a->op < b->op;
  if (a->op == Ops::LOAD) {
    // Loads by buffer: the copies of an unrolled product then all multiply in the same operand order, which the
    // SLP vectoriser needs to pack them into vector instructions (hash order differs from copy to copy).
    auto param = [](const UOp* l) -> int64_t {
      const UOp* p = l->src(0)->nsrc() ? l->src(0)->src(0) : nullptr;
      return p && p->op == Ops::PARAM ? std::get<int64_t>(p->arg) : -1;
    };
    if (int64_t pa = param(a), pb = param(b); pa != pb) return pa < pb;
  }
  if (a->op == Ops::DEFINE_VAR) {
    int c = std::get<VarArg>(a->arg).name.compare(std::get<VarArg>(b->arg).name);
    if (c != 0) return c < 0;
  } else if (a->op == Ops::RANGE || a->op == Ops::SPECIAL) {
    if (!arg_equal(a->arg, b->arg) && a->arg.index() == b->arg.index()) {
      if (auto* va = std::get_if<std::vector<int64_t>>(&a->arg)) return *va < std::get<std::vector<int64_t>>(b->arg);
    }
  }
  if (dtypes::is_float(a->dtype) && a->dtype == b->dtype) {
    // Float values of one op (a lane's product and sum terms): by shape, then by where their loads read, before the
    // hash. The expander's copies (one per vector lane, each reading its own addresses) then order their operands
    // alike and the vectorize stage packs them into vector ops: by hash each lane had its own order, and the packed
    // vectors mixed the terms of a batchnorm backward's sum across lanes (gathered lane by lane).
    if (std::optional<bool> o = lane_order(a, b)) return *o;
  }
  return a->hash < b->hash;
}

bool all_ones(DType d, int64_t c) {
  if (!dtypes::is_int(d) || d.count != 1) return false;
  if (is_signed(d) || d.scalar == Scalar::UInt64) return c == -1;
  return uint64_t(c) == dtypes::max_uint(d);
}

bool holds(DType a, const UOp* x) {
  if (known(x) && fits(a, x->vmin(), x->vmax())) return true;
  return can_lossless_cast(x->dtype, a);
}

// ------------------------------------------------------------------ constant folding

namespace {
bool const_value(const UOp* c, Value& v) {
  if (c->op != Ops::CONST) return false;
  if (auto* f = std::get_if<double>(&c->arg)) v.f = *f;
  else if (auto* i = std::get_if<int64_t>(&c->arg)) v.i = *i;
  else return false;
  return true;
}
UOpRef value_const(DType d, Value v) {
  return dtypes::is_float(d) ? UOp::cnst(d, v.f) : UOp::cnst_int(d, v.i);
}
}  // namespace

UOpRef fold_alu(const UOp* r) {
  size_t n = r->nsrc();
  if (n == 0 || n > 3 || r->dtype.count != 1 || r->dtype.ptr || r->op == Ops::THREEFRY) return {};
  Value v[3];
  for (size_t i = 0; i < n; i++)
    if (!const_value(r->src(i), v[i])) return {};
  DType vd = r->op == Ops::WHERE ? r->src(1)->dtype : r->src(0)->dtype;  // the operands' dtype
  if (!dtypes::is_float(vd)) {
    switch (r->op) {
      case Ops::IDIV: case Ops::MOD:
        if (v[1].i == 0) return {};  // C leaves it undefined: keep the division
        break;
      case Ops::POW: {
        if (vd.scalar == Scalar::UInt64) return {};
        double p = std::pow(double(v[0].i), double(v[1].i));
        if (!(std::fabs(p) < 9.0e18)) return {};
        break;
      }
      case Ops::EXP2: case Ops::LOG2: case Ops::SIN: case Ops::SQRT: case Ops::RECIPROCAL: case Ops::TRUNC:
      case Ops::FDIV:
        return {};
      default: break;
    }
  } else if (r->op == Ops::IDIV || r->op == Ops::MOD) {
    return {};
  }
  try {
    return value_const(r->dtype, exec_alu(r->op, r->dtype, std::span<const Value>(v, n), r->src(0)->dtype));
  } catch (const Error&) {
    return {};
  }
}

UOpRef fold_cast(const UOp* r) {
  Value v;
  if (r->dtype.count != 1 || r->dtype.ptr || !const_value(r->src(0), v)) return {};
  try {
    return value_const(r->dtype, exec_alu(r->op, r->dtype, std::span<const Value>(&v, 1), r->src(0)->dtype));
  } catch (const Error&) {
    return {};
  }
}

UOpRef fold_where_const(const UOp* r) {
  const UOp* c = r->src(0);
  bool t = dtypes::is_float(c->dtype) ? c->const_float() != 0 : c->const_int() != 0;
  return r->src(t ? 1 : 2)->ref();
}

UOpRef fold_bounds(const UOp* r) {
  if (!known(r) || r->vmin() != r->vmax()) return {};
  return cst(r->dtype, r->vmin());
}

// ------------------------------------------------------------------ canonical order

namespace {
// The like-term key of an ADD operand: x for x*c, else the term itself.
const UOp* add_base(const UOp* t) {
  if (t->op == Ops::MUL && t->src(1)->op == Ops::CONST) return t->src(0);
  return t;
}
}  // namespace

// A REDUCE, or the expander's tree of `o` over them (its per-lane partial results).
static bool lane_tree(const UOp* u, Ops o) {
  return u->op == Ops::REDUCE || (u->op == o && lane_tree(u->src(0), o) && lane_tree(u->src(1), o));
}

UOpRef order_chain(const UOp* r) {
  Ops o = r->op;
  DType d = r->dtype;
  const UOp *s0 = r->src(0), *s1 = r->src(1);
  DType sd = s0->dtype;
  if (sd.ptr || sd.scalar == Scalar::Void) return {};
  bool assoc = (dtypes::is_int(sd) || dtypes::is_bool(sd)) && o != Ops::CMPNE && o != Ops::CMPEQ;
  // integer data (not index) sums: terms by shape first, alike in every lane's copy
  const bool data = o == Ops::ADD && assoc && sd.scalar != Scalar::Index && !dtypes::is_bool(sd);
  auto less = [&](const UOp* a, const UOp* b) {
    if (data)
      if (std::optional<bool> lo = lane_order(add_base(a), add_base(b))) return *lo;
    return o == Ops::ADD && assoc ? order_less(add_base(a), add_base(b)) : order_less(a, b);
  };
  auto mk = [&](const UOp* a, const UOp* b) { return UOp::make(o, d, {a->ref(), b->ref()}); };
  if (!assoc) {
    // The expander's per-lane partial sums (REDUCE + REDUCE) keep their lane order: the accumulators are then
    // laid out in lane order, so their updates vectorise.
    if (lane_tree(s0, o) && lane_tree(s1, o)) return {};
    // Floats: ADD/MUL/CMPNE/CMPEQ commute exactly; MAX does not (max(-0.0, 0.0)), nor are any associative.
    if (dtypes::is_float(sd) && o != Ops::ADD && o != Ops::MUL && o != Ops::CMPNE && o != Ops::CMPEQ) return {};
    return less(s1, s0) ? mk(s1, s0) : UOpRef{};
  }
  auto same = [&](const UOp* u) { return u->op == o && u->dtype == d; };
  if (same(s1)) return UOp::make(o, d, {mk(s0, s1->src(0)), s1->src()[1]});  // a+(b+c) -> (a+b)+c
  if (!same(s0)) return less(s1, s0) ? mk(s1, s0) : UOpRef{};                // b+a -> a+b
  // s0 is a sorted chain: insert s1 where it belongs in one step, (a+c)+b -> (a+b)+c. Chains longer than
  // kMaxSortedChain are not sorted further (insertion would cost O(n^2) on adversarial orders).
  constexpr size_t kMaxSortedChain = 64;
  if (s1->is_const()) return {};
  std::vector<const UOp*> above;  // chain terms that sort after s1, outermost first
  const UOp* cur = s0;
  while (same(cur) && less(s1, cur->src(1))) {
    above.push_back(cur->src(1));
    cur = cur->src(0);
    if (above.size() > kMaxSortedChain) return {};
  }
  if (above.empty()) return {};
  UOpRef acc = (!same(cur) && less(s1, cur)) ? mk(s1, cur) : mk(cur, s1);
  for (size_t i = above.size(); i-- > 0;) acc = UOp::make(o, d, {acc, above[i]->ref()});
  return acc;
}

// ------------------------------------------------------------------ div and mod

namespace {
// One term of a linear form: base*f, exact.
struct Term {
  const UOp* base;
  i128 f;
  i128 lo() const { return f >= 0 ? base->vmin() * f : base->vmax() * f; }
  i128 hi() const { return f >= 0 ? base->vmax() * f : base->vmin() * f; }
};
// A sum of terms plus a constant: an int ADD chain read as linear form.
struct Linear {
  std::vector<Term> terms;
  i128 k = 0;
  i128 lo = 0, hi = 0;  // exact bounds of the whole sum
};

// Split u into a linear form; false when it is too long, unbounded, or the sum may wrap.
bool linear(const UOp* u, Linear& out, size_t limit = 32) {
  DType d = u->dtype;
  std::vector<const UOp*> st{u};
  while (!st.empty()) {
    const UOp* t = st.back();
    st.pop_back();
    if (t->op == Ops::ADD && t->dtype == d) {
      st.push_back(t->src(1));
      st.push_back(t->src(0));
      continue;
    }
    if (t->op == Ops::CONST) {
      out.k += cv(t);
      continue;
    }
    if (out.terms.size() >= limit) return false;
    if (t->op == Ops::MUL && t->src(1)->op == Ops::CONST && mul_exact(t->src(0), cv(t->src(1))))
      out.terms.push_back({t->src(0), cv(t->src(1))});
    else if (known(t))
      out.terms.push_back({t, 1});
    else
      return false;
  }
  out.lo = out.hi = out.k;
  for (auto& t : out.terms) out.lo += t.lo(), out.hi += t.hi();
  // The chain's value equals the exact sum when the exact sum fits (it is congruent modulo 2^n).
  return fits(d, out.lo, out.hi);
}

// sum(f_i * base_i) + k, built left to right (graph_rewrite simplifies it further).
UOpRef build(DType d, const std::vector<std::pair<const UOp*, i128>>& ts, i128 k) {
  UOpRef acc;
  for (auto& [b, f] : ts) {
    if (f == 0) continue;
    UOpRef t = f == 1 ? b->ref() : b->alu(Ops::MUL, cst(d, f));
    acc = acc ? acc->alu(Ops::ADD, t) : t;
  }
  if (!acc) return cst(d, k);
  return k == 0 ? acc : acc->alu(Ops::ADD, cst(d, k));
}

i128 floor_mod(i128 a, i128 c) { return a - fdiv_floor(a, c) * c; }

// Full fold: pick for each factor a remainder r (f mod c, or that minus c) so that R = sum r_i*b_i + r_k has one
// quotient over its whole range and never differs in sign from the numerator. Then num//c = Q + q0, num%c = R - q0*c.
UOpRef divmod_full(const UOp* r, const Linear& L, i128 c) {
  DType d = r->dtype;
  bool is_div = r->op == Ops::IDIV;
  size_t n = L.terms.size();
  std::vector<std::array<i128, 2>> reps(n + 1);
  std::vector<int> nrep(n + 1);
  auto fill = [&](size_t i, i128 f) {
    i128 m = floor_mod(f, c);
    reps[i] = {m, m - c};
    nrep[i] = m == 0 ? 1 : 2;
  };
  for (size_t i = 0; i < n; i++) fill(i, L.terms[i].f);
  fill(n, L.k);
  size_t combos = 1;
  for (int k : nrep) combos *= size_t(k);
  bool exhaustive = combos <= 64;
  std::vector<int> pick(n + 1, 0);
  auto try_pick = [&]() -> UOpRef {
    i128 rlo = reps[n][pick[n]], rhi = rlo;
    for (size_t i = 0; i < n; i++) {
      Term t{L.terms[i].base, reps[i][pick[i]]};
      rlo += t.lo();
      rhi += t.hi();
    }
    if (!fits(d, rlo, rhi) || !sign_ok(L.lo, L.hi, rlo, rhi)) return {};
    i128 q0 = tdiv(rlo, c);
    if (q0 != tdiv(rhi, c)) return {};
    std::vector<std::pair<const UOp*, i128>> ts;
    if (is_div) {
      i128 qlo = q0 + (L.k - reps[n][pick[n]]) / c, qhi = qlo;
      for (size_t i = 0; i < n; i++) {
        Term t{L.terms[i].base, (L.terms[i].f - reps[i][pick[i]]) / c};
        qlo += t.lo(), qhi += t.hi();
        ts.push_back({t.base, t.f});
      }
      if (!fits(d, qlo, qhi)) return {};
      return build(d, ts, q0 + (L.k - reps[n][pick[n]]) / c);
    }
    for (size_t i = 0; i < n; i++) ts.push_back({L.terms[i].base, reps[i][pick[i]]});
    return build(d, ts, reps[n][pick[n]] - q0 * c);
  };
  if (exhaustive) {
    for (size_t comb = 0; comb < combos; comb++) {
      size_t v = comb;
      for (size_t i = 0; i <= n; i++) pick[i] = int(v % size_t(nrep[i])), v /= size_t(nrep[i]);
      if (UOpRef res = try_pick()) return res;
    }
    return {};
  }
  // Too many combinations: the remainder of least magnitude per term, both choices for the constant.
  for (size_t i = 0; i < n; i++) {
    i128 a = reps[i][0], b = reps[i][1];
    pick[i] = (nrep[i] == 2 && (b < 0 ? -b : b) < a) ? 1 : 0;
  }
  for (int kc = 0; kc < nrep[n]; kc++) {
    pick[n] = kc;
    if (UOpRef res = try_pick()) return res;
  }
  return {};
}

// Factor out: terms whose factor c divides, and the multiple of c in the constant, leave the division; under a
// MOD every factor may also drop its multiple of c (x*5 % 4 -> x % 4 when both sides keep the numerator's sign).
UOpRef divmod_factor(const UOp* r, const Linear& L, i128 c) {
  DType d = r->dtype;
  bool is_div = r->op == Ops::IDIV;
  auto residue = [&](i128 v) { return L.lo >= 0 ? floor_mod(v, c) : L.hi <= 0 ? -floor_mod(-v, c) : v; };
  i128 rk = residue(L.k);
  bool moved = rk != L.k;
  std::vector<std::pair<const UOp*, i128>> quo, rem;
  i128 rlo = rk, rhi = rk, qlo = (L.k - rk) / c, qhi = qlo;
  for (auto& t : L.terms) {
    if (t.f % c == 0) {
      Term q{t.base, t.f / c};
      quo.push_back({q.base, q.f});
      qlo += q.lo(), qhi += q.hi();
      moved = true;
    } else {
      Term rt{t.base, is_div ? t.f : residue(t.f)};
      moved |= rt.f != t.f;
      rem.push_back({rt.base, rt.f});
      rlo += rt.lo(), rhi += rt.hi();
    }
  }
  if (!moved || rem.empty() || !fits(d, rlo, rhi) || !fits(d, qlo, qhi) || !sign_ok(L.lo, L.hi, rlo, rhi)) return {};
  UOpRef R = build(d, rem, rk);
  UOpRef cr = cst(d, c);
  if (!is_div) return R->alu(Ops::MOD, cr);
  return build(d, quo, (L.k - rk) / c)->alu(Ops::ADD, R->alu(Ops::IDIV, cr));
}

// gcd: num = g*M + k with g | c; for num >= 0 and M + floor(k/g) >= 0: num//c = (M+kf)//(c/g),
// num%c = ((M+kf)%(c/g))*g + (k - kf*g).
UOpRef divmod_gcd(const UOp* r, const Linear& L, i128 c) {
  if (L.lo < 0 || L.terms.empty()) return {};
  DType d = r->dtype;
  i128 g = c;
  for (auto& t : L.terms) g = gcd(g, t.f < 0 ? -t.f : t.f);
  if (g <= 1) return {};
  i128 kf = fdiv_floor(L.k, g), km = L.k - kf * g;
  std::vector<std::pair<const UOp*, i128>> ts;
  i128 mlo = kf, mhi = kf;
  for (auto& t : L.terms) {
    Term m{t.base, t.f / g};
    ts.push_back({m.base, m.f});
    mlo += m.lo(), mhi += m.hi();
  }
  if (mlo < 0 || !fits(d, mlo, mhi)) return {};
  UOpRef M = build(d, ts, kf), cg = cst(d, c / g);
  if (r->op == Ops::IDIV) return M->alu(Ops::IDIV, cg);
  UOpRef res = M->alu(Ops::MOD, cg)->alu(Ops::MUL, cst(d, g));
  return km == 0 ? res : res->alu(Ops::ADD, cst(d, km));
}

// Split at a factor: num = g*A + B where g divides c, g divides every factor in A and 0 <= B < g (the rest), A >= 0:
// num//c = A//(c/g) and num%c = (A%(c/g))*g + B ((56h + w)//112 with w < 56 is h//2: the row index of a view that
// reshapes (h, w) windows of a 2-wide stride back to the image).
UOpRef divmod_split(const UOp* r, const Linear& L, i128 c) {
  DType d = r->dtype;
  i128 best = 0;
  for (auto& t : L.terms) {
    i128 g = t.f;
    if (g <= 1 || g <= best || c % g != 0) continue;
    i128 alo = 0, blo = 0, bhi = 0;
    for (auto& u : L.terms) {
      if (u.f % g == 0) alo += Term{u.base, u.f / g}.lo();
      else blo += u.lo(), bhi += u.hi();
    }
    i128 kq = fdiv_floor(L.k, g), kr = L.k - kq * g;
    if (alo + kq >= 0 && blo + kr >= 0 && bhi + kr < g) best = g;
  }
  if (!best) return {};
  const i128 g = best;
  i128 kq = fdiv_floor(L.k, g), kr = L.k - kq * g;
  std::vector<std::pair<const UOp*, i128>> as, bs;
  for (auto& u : L.terms) (u.f % g == 0 ? as : bs).push_back({u.base, u.f % g == 0 ? u.f / g : u.f});
  UOpRef A = build(d, as, kq), m = cst(d, c / g);
  if (r->op == Ops::IDIV) return c == g ? A : A->alu(Ops::IDIV, m);
  UOpRef hi = (c == g ? cst(d, 0) : A->alu(Ops::MOD, m)->alu(Ops::MUL, cst(d, g)));
  return bs.empty() && kr == 0 ? hi : hi->alu(Ops::ADD, build(d, bs, kr));
}
}  // namespace

UOpRef divmod_const(const UOp* r) {
  DType d = r->dtype;
  const UOp *num = r->src(0), *den = r->src(1);
  if (!dtypes::is_int(d) || !known(num)) return {};
  i128 c = cv(den);
  if (c <= 1) return {};
  Linear L;
  if (!linear(num, L)) return {};
  if (UOpRef res = divmod_full(r, L, c)) return res;
  if (UOpRef res = divmod_factor(r, L, c)) return res;
  if (UOpRef res = divmod_split(r, L, c)) return res;
  return divmod_gcd(r, L, c);
}

UOpRef divmod_neg(const UOp* r) {
  DType d = r->dtype;
  const UOp *x = r->src(0), *den = r->src(1);
  if (!is_signed(d)) return {};
  i128 c = cv(den);
  if (c >= -1 || c == dt_min(d)) return {};
  UOpRef pc = cst(d, -c);
  if (r->op == Ops::MOD) return x->alu(Ops::MOD, pc);                 // x%-c == x%c in C
  return x->alu(Ops::IDIV, pc)->alu(Ops::MUL, cst(d, -1));           // x//-c == -(x//c) in C
}

UOpRef mod_div_nested(const UOp* r) {
  const UOp* m = r->src(0);
  i128 a = cv(m->src(1)), b = cv(r->src(1));
  if (a <= 0 || b <= 0 || a % b != 0) return {};
  DType d = r->dtype;
  // trunc((x%(k*b))/b) == trunc(x/b)%k for every sign of x (both sides are odd in x).
  return m->src(0)->alu(Ops::IDIV, cst(d, b))->alu(Ops::MOD, cst(d, a / b));
}

// A sum holding the pieces of a split index, in any order: (x%a)*m + ((x//a)%b)*(a*m) -> (x%(a*b))*m and
// (x%a)*m + (x//a)*(a*m) -> x*m, for x >= 0, repeated while pieces meet (a view re-split over the same shape
// collapses back to its flat index; the result's bounds then fold a last x%N to x).
UOpRef fold_split_index(const UOp* r) {
  DType d = r->dtype;
  if (!dtypes::is_int(d)) return {};
  auto is_mod = [](const UOp* u) { return u->op == Ops::MOD && u->src(1)->op == Ops::CONST && cv(u->src(1)) > 0; };
  // Only where a piece joins the chain (every pair meets at the ADD that adds its later piece): a long sum of
  // other terms is not flattened at each of its nodes.
  auto piece = [&](const UOp* t) {
    if (t->op == Ops::MUL && t->src(1)->op == Ops::CONST) t = t->src(0);
    return is_mod(t) || (t->op == Ops::IDIV && t->src(1)->op == Ops::CONST);
  };
  if (!piece(r->src(1)) && !piece(r->src(0))) return {};
  Linear L;
  if (!linear(r, L, 64)) return {};
  size_t mods = 0;
  for (auto& t : L.terms) mods += is_mod(t.base);
  if (mods == 0) return {};
  std::vector<std::pair<const UOp*, i128>> ts;
  for (auto& t : L.terms) ts.push_back({t.base, t.f});
  std::vector<UOpRef> keep;  // new bases stay alive while ts points at them
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    for (size_t i = 0; i < ts.size() && !again; i++) {
      const UOp* lo = ts[i].first;  // x % a, factor m
      if (ts[i].second == 0 || !is_mod(lo)) continue;
      const UOp* x = lo->src(0);
      i128 a = cv(lo->src(1)), m = ts[i].second;
      if (!known(x) || x->vmin() < 0) continue;
      for (size_t j = 0; j < ts.size(); j++) {
        const UOp* hi = ts[j].first;
        if (j == i || ts[j].second != a * m) continue;
        const UOp* q = is_mod(hi) ? hi->src(0) : hi;  // (x//a)%b or x//a
        if (q->op != Ops::IDIV || q->src(0) != x || q->src(1)->op != Ops::CONST || cv(q->src(1)) != a) continue;
        UOpRef nb = is_mod(hi) ? x->alu(Ops::MOD, cst(d, a * cv(hi->src(1)))) : x->ref();
        keep.push_back(nb);
        ts[i] = {nb.get(), m};
        ts[j].second = 0;
        again = changed = true;
        break;
      }
    }
  }
  if (!changed) return {};
  return build(d, ts, L.k);
}

// ------------------------------------------------------------------ comparisons

UOpRef lt_mul(const UOp* r) {
  const UOp* mul = r->src(0);
  const UOp* x = mul->src(1)->op == Ops::CONST ? mul->src(0) : mul->src(1);
  i128 c = cv(mul->src(1)->op == Ops::CONST ? mul->src(1) : mul->src(0)), dv = cv(r->src(1));
  if (c == 0 || c == 1 || !mul_exact(x, c)) return {};
  DType d = x->dtype;
  if (c > 0) {  // x*c < d  <=>  x < ceil(d/c)
    i128 k = cdiv_ceil(dv, c);
    return fits(d, k, k) ? x->alu(Ops::CMPLT, cst(d, k)) : UOpRef{};
  }
  i128 k = fdiv_floor(dv, c);  // c<0: x*c < d  <=>  x > d/c  <=>  floor(d/c) < x
  return fits(d, k, k) ? cst(d, k)->alu(Ops::CMPLT, x->ref()) : UOpRef{};
}

UOpRef gt_mul(const UOp* r) {
  const UOp* mul = r->src(1);
  const UOp* x = mul->src(1)->op == Ops::CONST ? mul->src(0) : mul->src(1);
  i128 c = cv(mul->src(1)->op == Ops::CONST ? mul->src(1) : mul->src(0)), dv = cv(r->src(0));
  if (c == 0 || c == 1 || !mul_exact(x, c)) return {};
  DType d = x->dtype;
  if (c > 0) {  // d < x*c  <=>  floor(d/c) < x
    i128 k = fdiv_floor(dv, c);
    return fits(d, k, k) ? cst(d, k)->alu(Ops::CMPLT, x->ref()) : UOpRef{};
  }
  i128 k = cdiv_ceil(dv, c);  // c<0: d < x*c  <=>  x < d/c  <=>  x < ceil(d/c)
  return fits(d, k, k) ? x->alu(Ops::CMPLT, cst(d, k)) : UOpRef{};
}

UOpRef lt_div(const UOp* r) {
  const UOp* dv = r->src(0);
  const UOp* x = dv->src(0);
  i128 c = cv(dv->src(1)), k = cv(r->src(1));
  if (c <= 1 || !known(x)) return {};
  DType d = x->dtype;
  // trunc(x/c) < k  <=>  x < k*c for k > 0;  <=>  x < (k-1)*c + 1 for k <= 0
  i128 b = k > 0 ? k * c : (k - 1) * c + 1;
  return fits(d, b, b) ? x->alu(Ops::CMPLT, cst(d, b)) : UOpRef{};
}

UOpRef lt_gcd(const UOp* r) {
  const UOp* num = r->src(0);
  DType d = num->dtype;
  if (num->op != Ops::ADD && num->op != Ops::MUL) return {};
  Linear L;
  if (!linear(num, L)) return {};
  i128 c = i128(cv(r->src(1))) - L.k;  // sum(terms) < c
  i128 g = 0, plo = 0, phi = 0;
  std::vector<std::pair<const UOp*, i128>> big;
  for (auto& t : L.terms) {
    if (t.f == 1) {
      plo += t.lo(), phi += t.hi();
    } else {
      g = gcd(g, t.f < 0 ? -t.f : t.f);
      big.push_back({t.base, t.f});
    }
  }
  if (big.empty()) return {};
  g = gcd(g, c < 0 ? -c : c);
  // sum = g*M + P with 0 <= P < g and g | c:  sum < c  <=>  M < c/g
  if (g <= 1 || plo < 0 || phi >= g) return {};
  i128 mlo = 0, mhi = 0;
  for (auto& [b, f] : big) {
    f /= g;
    Term t{b, f};
    mlo += t.lo(), mhi += t.hi();
  }
  if (!fits(d, mlo, mhi) || !fits(d, c / g, c / g)) return {};
  return build(d, big, 0)->alu(Ops::CMPLT, cst(d, c / g));
}

UOpRef cmp_mul(const UOp* r) {
  const UOp *mul = r->src(0)->op == Ops::MUL ? r->src(0) : r->src(1);
  const UOp *dc = mul == r->src(0) ? r->src(1) : r->src(0);
  if (mul->op != Ops::MUL || dc->op != Ops::CONST) return {};
  const UOp* x = mul->src(1)->op == Ops::CONST ? mul->src(0) : mul->src(1);
  const UOp* cc = mul->src(1)->op == Ops::CONST ? mul->src(1) : mul->src(0);
  if (cc->op != Ops::CONST) return {};
  i128 c = cv(cc), k = cv(dc);
  if (c == 0 || c == 1 || !mul_exact(x, c)) return {};
  if (k % c != 0) return UOp::cnst_int(r->dtype, r->op == Ops::CMPNE ? 1 : 0);  // x*c can never equal k
  if (!fits(x->dtype, k / c, k / c)) return {};
  return x->alu(r->op, cst(x->dtype, k / c));
}

UOpRef not_lt(const UOp* r) {
  const UOp* l = r->src(0)->op == Ops::CMPLT ? r->src(0) : r->src(1);
  if (l->op != Ops::CMPLT) return {};
  const UOp *a = l->src(0), *b = l->src(1);
  DType d = a->dtype;
  if (b->op == Ops::CONST && a->op != Ops::CONST) {  // !(a < k)  <=>  k-1 < a
    i128 k = cv(b);
    return k > dt_min(d) ? cst(d, k - 1)->alu(Ops::CMPLT, a->ref()) : UOpRef{};
  }
  if (a->op == Ops::CONST && b->op != Ops::CONST) {  // !(k < b)  <=>  b < k+1
    i128 k = cv(a);
    return k < dt_max(d) ? b->alu(Ops::CMPLT, cst(d, k + 1)) : UOpRef{};
  }
  return {};
}

// ------------------------------------------------------------------ bits, casts, floats

UOpRef shift_const(const UOp* r) {
  const UOp* x = r->src(0);
  DType d = r->dtype;
  if (d.count != 1) return {};
  i128 c = cv(r->src(1));
  int bits = d.bitsize();
  if (c < 0 || c >= bits) return {};
  if (r->op == Ops::SHL) return x->alu(Ops::MUL, UOp::cnst_int(d, int64_t(uint64_t(1) << int(c))));  // mod 2^n
  i128 p = i128(1) << int(c);
  if (!known(x) || x->vmin() < 0 || !fits(d, p, p)) return {};
  return x->alu(Ops::IDIV, cst(d, p));  // x >= 0: arithmetic shift == division
}

UOpRef and_or_lt(const UOp* r) {
  const UOp *a = r->src(0), *b = r->src(1);
  if (a->op != Ops::CMPLT || b->op != Ops::CMPLT || a->src(0) != b->src(0)) return {};
  if (a->src(1)->op != Ops::CONST || b->src(1)->op != Ops::CONST) return {};
  int64_t ka = cv(a->src(1)), kb = cv(b->src(1));
  bool keep_a = r->op == Ops::AND ? ka <= kb : ka >= kb;
  return (keep_a ? a : b)->ref();
}

UOpRef cast_bool_ne(const UOp* r) {
  const UOp* cast = r->src(0)->op == Ops::CAST ? r->src(0) : r->src(1);
  const UOp* c = cast == r->src(0) ? r->src(1) : r->src(0);
  if (cast->op != Ops::CAST || c->op != Ops::CONST) return {};
  const UOp* x = cast->src(0);
  double v = c->const_float();
  if (v == 0) return x->ref();                                       // int(x) != 0  <=>  x
  if (v == 1) return x->alu(Ops::CMPNE, UOp::cnst_int(x->dtype, 1));  // int(x) != 1  <=>  !x
  return UOp::cnst_int(r->dtype, 1);                                 // int(x) is 0 or 1
}

UOpRef fdiv_pow2(const UOp* r) {
  const UOp* c = r->src(1);
  DType d = r->dtype;
  double v = c->const_float();
  if (v == 0 || !std::isfinite(v)) return {};
  int e;
  if (std::frexp(v, &e) != 0.5 && std::frexp(v, &e) != -0.5) return {};
  double inv = 1.0 / v;
  if (truncate_float(inv, d) != inv || truncate_float(v, d) != v) return {};
  return r->src(0)->alu(Ops::MUL, UOp::cnst(d, inv));
}

UOpRef bitcast_twice(const UOp* r) {
  const UOp* x = r->src(0)->src(0);
  if (x->dtype == r->dtype) return x->ref();
  if (x->dtype.itemsize() != r->dtype.itemsize()) return {};
  return UOp::make(Ops::BITCAST, r->dtype, {x->ref()});
}

UOpRef float_zero_add(const UOp* r) {
  const UOp *a = r->src(0), *b = r->src(1);
  const UOp* c = b->op == Ops::CONST ? b : a;
  const UOp* other = c == b ? a : b;
  if (c->op != Ops::CONST || !std::holds_alternative<double>(c->arg)) return {};
  double v = std::get<double>(c->arg);
  return v == 0 && std::signbit(v) ? other->ref() : UOpRef{};  // x + (-0.0) == x for every x, -0.0 included
}

}  // namespace tg::sym
