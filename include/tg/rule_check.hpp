#pragma once
// Random-evaluation checks of rewrite rules (the slinky rule tester, for tg's typed patterns).
//
// check_table: for every rule of a constexpr table, instantiate its LEFT pattern with random leaves (the Instantiate
// trait over Any/Cst/Lit/OpP/Bind), run the rule's compiled function R::apply, and where it fires evaluate both sides
// at random points (exec_alu semantics); any difference is a mismatch. Rules are reported as exercised (fired at
// least once), verified (compared at a defined point) or skipped (their pattern could not be instantiated).
// ExprFuzzer: random integer expressions (index and int32, wrap-around included) checked against simplify().
// Thread-safety: objects are single-threaded; separate objects may run on separate threads.
#include "tg/config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "tg/pattern.hpp"
#include "tg/symbolic.hpp"

namespace tg::rule_check {

/// The random generator of the checks (seeded: a failure reproduces).
using Rng = std::mt19937_64;

/// a uniform integer in [lo, hi]
inline int64_t uniform(Rng& r, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(r); }
/// true with probability p
inline bool chance(Rng& r, double p) { return std::uniform_real_distribution<double>(0, 1)(r) < p; }
template <class T, size_t N>
/// a uniformly chosen element of the array
const T& pick(Rng& r, const T (&a)[N]) {
  return a[size_t(uniform(r, 0, int64_t(N) - 1))];
}

// ------------------------------------------------------------------ evaluation

/** Values of the free nodes at one point: DEFINE_VARs (set by the caller) and RANGEs (drawn below their end). */
struct Point {
  /// (node, value) pairs
  std::vector<std::pair<const UOp*, int64_t>> v;
  /// the value given to node u, or null
  const int64_t* find(const UOp* u) const {
    for (auto& [k, val] : v)
      if (k == u) return &val;
    return nullptr;
  }
  /// "v0=3, r1=0": the values as a counterexample prints them
  std::string str() const {
    std::string s;
    for (auto& [k, val] : v) {
      if (!s.empty()) s += ", ";
      s += render_expr(k) + "=" + std::to_string(val);
    }
    return s;
  }
};

/** A random value of a bounded variable, biased to its ends and to 0. */
inline int64_t sample(const UOp* var, Rng& rng) {
  int64_t lo = var->vmin(), hi = var->vmax();
  switch (uniform(rng, 0, 9)) {
    case 0: case 1: return lo;
    case 2: case 3: return hi;
    case 4: return (lo <= 0 && 0 <= hi) ? 0 : lo;
    case 5: return lo < hi ? lo + 1 : lo;
    case 6: return lo < hi ? hi - 1 : hi;
    default: return uniform(rng, lo, hi);
  }
}

/** An int/bool graph compiled once for evaluation at many points (iterative; exec_alu semantics, TRUNC of an int is
 *  the int). eval returns nullopt where the graph is undefined: a division by zero, an empty RANGE, an op exec_alu
 *  cannot evaluate. */
class Evaluator {
 public:
  /// compiles the graph under root (its nodes in toposort order)
  explicit Evaluator(const UOp* root) : order_(toposort(root)), vals_(order_.size()) {
    idx_.reserve(order_.size());
    for (size_t i = 0; i < order_.size(); i++) idx_.emplace(order_[i], i);
    srcs_.resize(order_.size());
    for (size_t i = 0; i < order_.size(); i++)
      for (auto& s : order_[i]->src()) srcs_[i].push_back(idx_.at(s.get()));
  }
  /** The DEFINE_VARs of the graph. */
  std::vector<const UOp*> vars() const {
    std::vector<const UOp*> r;
    for (const UOp* u : order_)
      if (u->op == Ops::DEFINE_VAR) r.push_back(u);
    return r;
  }
  /// the root's value at p (DEFINE_VARs from p; RANGEs drawn below their end), or nullopt where undefined
  std::optional<Value> eval(Point& p, Rng& rng) const {
    for (size_t i = 0; i < order_.size(); i++) {
      const UOp* u = order_[i];
      Value& r = vals_[i];
      r = Value{};
      if (u->op == Ops::CONST) {
        if (auto* f = std::get_if<double>(&u->arg)) r.f = *f;
        else r.i = std::get<int64_t>(u->arg);
      } else if (u->op == Ops::DEFINE_VAR) {
        const int64_t* v = p.find(u);
        if (!v) p.v.push_back({u, sample(u, rng)}), v = &p.v.back().second;
        r.i = *v;
      } else if (u->op == Ops::RANGE) {
        const int64_t* v = p.find(u);
        int64_t end = vals_[srcs_[i][0]].i;
        if (!v) {
          if (end <= 0) return std::nullopt;
          p.v.push_back({u, uniform(rng, 0, end - 1)});
          v = &p.v.back().second;
        }
        if (*v < 0 || *v >= end) return std::nullopt;
        r.i = *v;
      } else if (u->op == Ops::TRUNC && !dtypes::is_float(u->dtype)) {
        r = vals_[srcs_[i][0]];
      } else if (is_alu(u->op) || u->op == Ops::CAST || u->op == Ops::BITCAST) {
        std::array<Value, 3> s;
        size_t n = srcs_[i].size();
        if (n > 3) return std::nullopt;
        for (size_t j = 0; j < n; j++) s[j] = vals_[srcs_[i][j]];
        if ((u->op == Ops::IDIV || u->op == Ops::MOD) && !dtypes::is_float(u->dtype) && s[1].i == 0) return std::nullopt;
        try {
          r = exec_alu(u->op, u->dtype, std::span<const Value>(s.data(), n), u->src(0)->dtype);
        } catch (const Error&) {
          return std::nullopt;
        }
      } else {
        return std::nullopt;
      }
    }
    return vals_.back();
  }

 private:
  std::vector<const UOp*> order_;
  std::unordered_map<const UOp*, size_t> idx_;
  std::vector<std::vector<size_t>> srcs_;
  mutable std::vector<Value> vals_;
};

/** Two values of dtype d are the same (floats by bits, any NaN equal to any NaN). */
inline bool same_value(DType d, Value a, Value b) {
  if (!dtypes::is_float(d)) return a.i == b.i;
  if (std::isnan(a.f) && std::isnan(b.f)) return true;
  return std::memcmp(&a.f, &b.f, sizeof(double)) == 0;
}
/// a value of dtype d as text
inline std::string value_str(DType d, Value v) {
  if (dtypes::is_float(d)) return std::to_string(v.f);
  return std::to_string(v.i);
}

// ------------------------------------------------------------------ random leaves

/** Random choices for one instantiation: the dtype of int leaves and the nodes bound to each capture. */
struct Gen {
  /// the generator of all choices
  Rng& rng;
  DType idt = dtypes::index;  ///< dtype of int operands of comparisons
  DType fdt = dtypes::void_;  ///< float dtype of this instantiation (void: ints and bools only)
  /// the node bound to each capture so far
  std::array<UOpRef, pat::kMaxSlots> slot{};
  /// the DEFINE_VARs created
  std::vector<UOpRef> vars{};
  /// variables created (for their names)
  int nvar = 0;
  /// RANGEs created (for their ids)
  int nrange = 0;

  /// the integer constants leaves are drawn from (small, powers of two, negatives)
  static constexpr int64_t kConsts[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 64, 100,
                                        -1, -2, -3, -4, -5, -7, -8, -16, 2, 3, 4, 8};

  /** A DEFINE_VAR of int dtype d with random bounds (some negative, some small, rarely huge). */
  UOpRef var(DType d) {
    static constexpr int64_t ks[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16, 31, 32, 63, 64, 100, 255, 1000, 4096};
    int64_t k = pick(rng, ks), lo, hi;
    switch (uniform(rng, 0, 9)) {
      case 0: case 1: case 2: lo = 0, hi = k; break;
      case 3: lo = -k, hi = 0; break;
      case 4: case 5: lo = -k, hi = k; break;
      case 6: lo = 1, hi = k; break;
      case 7: lo = uniform(rng, -50, 50), hi = lo + k; break;
      case 8: lo = -k, hi = -1; break;
      default: lo = dtypes::min_int(d), hi = dtypes::max_int(d); break;
    }
    lo = std::clamp<int64_t>(lo, dtypes::min_int(d), dtypes::max_int(d));
    hi = std::clamp<int64_t>(hi, lo, dtypes::max_int(d));
    UOpRef v = UOp::variable("v" + std::to_string(nvar++), lo, hi, d);
    vars.push_back(v);
    return v;
  }

  /// a random CONST of dtype d (floats include -0, inf, NaN and extremes)
  UOpRef cnst(DType d) {
    if (dtypes::is_float(d)) {
      static constexpr double fs[] = {0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -4.0, 0.25, 1e30, -1e-30,
                                      INFINITY, -INFINITY, NAN, 65504.0, 1e-8};
      return UOp::cnst(d, pick(rng, fs));
    }
    if (dtypes::is_bool(d)) return UOp::cnst_int(d, uniform(rng, 0, 1));
    if (chance(rng, 0.03)) return UOp::cnst_int(d, chance(rng, 0.5) ? dtypes::max_int(d) : dtypes::min_int(d));
    return UOp::cnst_int(d, pick(rng, kConsts));
  }

  /** Any node of dtype d: a variable (fresh or reused), a constant, a comparison (bool), or a small expression. */
  UOpRef leaf(DType d) {
    if (dtypes::is_float(d)) {  // an int variable cast to d, a special constant, or a quotient (inf, NaN)
      switch (uniform(rng, 0, 5)) {
        case 0: case 1: return var(idt)->cast(d);
        case 2: return cnst(d);
        case 3: return var(idt)->cast(d)->alu(Ops::MUL, cnst(d));
        case 4: return var(idt)->cast(d)->alu(Ops::FDIV, var(idt)->cast(d));
        default: return var(idt)->cast(d)->alu(Ops::ADD, cnst(d));
      }
    }
    if (dtypes::is_bool(d)) {
      UOpRef a = var(idt);
      switch (uniform(rng, 0, 3)) {
        case 0: return a->alu(Ops::CMPLT, cnst(idt));
        case 1: return cnst(idt)->alu(Ops::CMPLT, a);
        case 2: return a->alu(Ops::CMPNE, cnst(idt));
        default: return a->alu(Ops::CMPLT, var(idt));
      }
    }
    int r = int(uniform(rng, 0, 19));
    if (r < 2) {
      for (auto& v : vars)
        if (v->dtype == d && chance(rng, 0.5)) return v;
    }
    if (r < 11) return var(d);
    if (r < 14) return cnst(d);
    UOpRef a = var(d);
    static constexpr Ops small_ops[] = {Ops::ADD, Ops::MUL, Ops::IDIV, Ops::MOD, Ops::MAX, Ops::ADD};
    Ops o = pick(rng, small_ops);
    if (o == Ops::IDIV || o == Ops::MOD) return a->alu(o, UOp::cnst_int(d, uniform(rng, 2, 8)));
    return a->alu(o, chance(rng, 0.6) ? cnst(d) : var(d));
  }
};

/** Ops the instantiator may build (evaluable by exec_alu on ints and bools). */
constexpr bool instantiable(Ops o) {
  switch (o) {
    case Ops::ADD: case Ops::SUB: case Ops::MUL: case Ops::IDIV: case Ops::MOD: case Ops::MAX: case Ops::CMPLT:
    case Ops::CMPNE: case Ops::CMPEQ: case Ops::XOR: case Ops::OR: case Ops::AND: case Ops::SHL: case Ops::SHR:
    case Ops::NEG: case Ops::WHERE: case Ops::CAST: case Ops::BITCAST: case Ops::MULACC: case Ops::RANGE:
    case Ops::TRUNC: case Ops::FDIV: case Ops::SQRT:
      return true;
    default: return false;
  }
}

namespace detail {
inline bool is_intish(DType d) { return d.count == 1 && !d.ptr && (dtypes::is_int(d) || dtypes::is_bool(d)); }
inline bool is_value(DType d) { return is_intish(d) || (d.count == 1 && !d.ptr && dtypes::is_float(d)); }
inline DType int_of_bits(Rng& rng, int bits) {
  switch (bits) {
    case 8: return chance(rng, 0.5) ? dtypes::int8 : dtypes::uint8;
    case 16: return chance(rng, 0.5) ? dtypes::int16 : dtypes::uint16;
    case 32: return chance(rng, 0.5) ? dtypes::int32 : dtypes::uint32;
    default: return chance(rng, 0.5) ? dtypes::index : dtypes::int64;
  }
}
// The dtypes of an op's sources when it produces `want`, or false when the op cannot produce it.
inline bool source_dtypes(Gen& g, Ops o, DType want, size_t n, std::array<DType, 3>& ds) {
  bool wb = dtypes::is_bool(want), wf = dtypes::is_float(want);
  if (is_comparison(o)) {
    if (!wb || n != 2) return false;
    bool f = g.fdt != dtypes::void_ && chance(g.rng, 0.6);
    ds[0] = ds[1] = f ? g.fdt : chance(g.rng, 0.85) ? g.idt : dtypes::bool_;
    return true;
  }
  if (wf) {  // float ops: IEEE arithmetic only
    switch (o) {
      case Ops::IDIV: case Ops::MOD: case Ops::AND: case Ops::OR: case Ops::XOR: case Ops::SHL: case Ops::SHR:
      case Ops::RANGE: case Ops::BITCAST:
        return false;
      default: break;
    }
  } else if (o == Ops::FDIV || o == Ops::SQRT) {
    return false;
  }
  switch (o) {
    case Ops::WHERE:
      if (n != 3) return false;
      ds = {dtypes::bool_, want, want};
      return true;
    case Ops::CAST: {
      static constexpr DType from[] = {dtypes::index, dtypes::int32, dtypes::int8, dtypes::uint8,
                                       dtypes::int16, dtypes::uint32, dtypes::bool_};
      ds[0] = chance(g.rng, 0.2) ? want : (g.fdt != dtypes::void_ && chance(g.rng, 0.3)) ? g.fdt : pick(g.rng, from);
      return n == 1;
    }
    case Ops::BITCAST:
      if (wb || n != 1) return false;
      ds[0] = int_of_bits(g.rng, want.bitsize());
      return true;
    case Ops::RANGE:
      if (wb || n != 1) return false;
      ds[0] = want;
      return true;
    case Ops::IDIV: case Ops::MOD: case Ops::SHL: case Ops::SHR: case Ops::SUB: case Ops::NEG: case Ops::TRUNC:
      if (wb) return false;
      [[fallthrough]];
    default:
      for (size_t i = 0; i < n; i++) ds[i] = want;
      return true;
  }
}
inline UOpRef make_node(Gen& g, Ops o, DType want, std::span<const UOpRef> srcs) {
  Arg arg;
  if (o == Ops::RANGE) arg = std::vector<int64_t>{g.nrange++, 0};
  return UOp::make(o, want, srcs, std::move(arg));
}
}  // namespace detail

/** `Instantiate<P>::make(g, want)`: a random node of dtype `want` that P matches (usually), or null where P cannot be
 *  instantiated at that dtype. Specialised for every pattern type in tg/pattern.hpp. */
template <class P>
struct Instantiate {
  /// null: this pattern type cannot be instantiated
  static UOpRef make(Gen&, DType) { return {}; }
};

/// Instances of a capture: a random leaf.
template <int I, pat::DPred P>
struct Instantiate<pat::Any<I, P>> {
  /// the capture's node: a new random leaf of dtype want, or the node already bound (null if its dtype differs)
  static UOpRef make(Gen& g, DType want) {
    if (g.slot[I]) return g.slot[I]->dtype == want ? g.slot[I] : UOpRef{};
    if (!P.ok(want) || !detail::is_value(want)) return {};
    return g.slot[I] = g.leaf(want);
  }
};

/// Instances of a CONST capture: a random constant.
template <int I, pat::DPred P>
struct Instantiate<pat::Cst<I, P>> {
  /// the capture's CONST: a new random constant of dtype want, or the one already bound
  static UOpRef make(Gen& g, DType want) {
    if (g.slot[I]) return g.slot[I]->dtype == want ? g.slot[I] : UOpRef{};
    if (!P.ok(want) || !detail::is_value(want)) return {};
    return g.slot[I] = g.cnst(want);
  }
};

/// Instances of a literal: the CONST itself.
template <int64_t V>
struct Instantiate<pat::Lit<V>> {
  /// the literal as a CONST of dtype want
  static UOpRef make(Gen&, DType want) {
    if (!detail::is_value(want)) return {};
    return UOp::cnst_int(want, V);
  }
};

/// Instances of bind(x, p): an instance of p, captured as x.
template <int I, class P>
struct Instantiate<pat::Bind<I, P>> {
  /// an instance of the inner pattern, bound to the capture
  static UOpRef make(Gen& g, DType want) {
    UOpRef r = Instantiate<P>::make(g, want);
    if (!r || (g.slot[I] && g.slot[I] != r)) return {};
    return g.slot[I] = r;
  }
};

namespace detail {
// Pick an op of S that can produce `want` (with n sources: nch, or the op's arity when any_src), and its sources'
// dtypes. Type-independent, so it is compiled once rather than per pattern.
inline bool pick_op(Gen& g, pat::OpSet S, bool any_src, size_t nch, DType want, Ops& o, size_t& n,
                    std::array<DType, 3>& ds) {
  Ops cand[kNumOps];
  size_t nc = 0;
  for (int i = 0; i < kNumOps; i++)
    if (S.has(Ops(i)) && instantiable(Ops(i)) && (any_src || op_arity(Ops(i)) < 0 || op_arity(Ops(i)) == int(nch)))
      cand[nc++] = Ops(i);
  std::shuffle(cand, cand + nc, g.rng);
  for (size_t c = 0; c < nc; c++) {
    o = cand[c];
    n = any_src ? size_t(std::max(op_arity(o), 1)) : nch;
    if (n <= 3 && source_dtypes(g, o, want, n, ds)) return true;
  }
  return false;
}
// Random sources for an op pattern that accepts any sources.
inline bool any_sources(Gen& g, size_t n, const std::array<DType, 3>& ds, std::array<UOpRef, 3>& srcs) {
  for (size_t j = 0; j < n; j++) {
    if (!is_value(ds[j])) return false;
    srcs[j] = chance(g.rng, 0.6) ? g.cnst(ds[j]) : g.leaf(ds[j]);
  }
  return true;
}
inline UOpRef finish_node(Gen& g, Ops o, DType want, size_t n, std::array<UOpRef, 3>& srcs) {
  if (n == 2 && is_commutative(o) && chance(g.rng, 0.3)) std::swap(srcs[0], srcs[1]);
  return make_node(g, o, want, std::span<const UOpRef>(srcs.data(), n));
}
}  // namespace detail

/// Instances of an op pattern: a node of one of its ops over instances of its sources.
template <pat::OpSet S, pat::DPred P, bool AnySrc, class... Ch>
struct Instantiate<pat::OpP<S, P, AnySrc, Ch...>> {
  /// a node of one of the pattern's ops with instantiated sources, or null where no op fits dtype want
  static UOpRef make(Gen& g, DType want) {
    if (!P.ok(want) || !detail::is_value(want)) return {};
    Ops o;
    size_t n;
    std::array<DType, 3> ds{};
    if (!detail::pick_op(g, S, AnySrc, sizeof...(Ch), want, o, n, ds)) return {};
    std::array<UOpRef, 3> srcs;
    if constexpr (AnySrc) {
      if (!detail::any_sources(g, n, ds, srcs)) return {};
    } else {
      bool ok = true;
      size_t j = 0;
      ((ok = ok && (srcs[j] = Instantiate<Ch>::make(g, ds[j])), j++), ...);
      if (!ok) return {};
    }
    return detail::finish_node(g, o, want, n, srcs);
  }
};

/** The dtype an instantiation of a pattern with these root ops should produce: bool for comparison roots, else a
 *  random int (or bool), or the float dtype `fdt` when one is given. */
inline DType root_dtype(pat::OpSet roots, Rng& rng, DType fdt = dtypes::void_) {
  bool all_cmp = true;
  for (int i = 0; i < kNumOps; i++)
    if (roots.has(Ops(i)) && instantiable(Ops(i)) && !is_comparison(Ops(i))) all_cmp = false;
  if (all_cmp) return dtypes::bool_;
  if (fdt != dtypes::void_ && chance(rng, 0.8)) return fdt;
  static constexpr DType ds[] = {dtypes::index, dtypes::index, dtypes::index, dtypes::int32, dtypes::int32,
                                 dtypes::int32, dtypes::bool_, dtypes::bool_, dtypes::int8,  dtypes::uint8,
                                 dtypes::int16, dtypes::uint32};
  return pick(rng, ds);
}

// ------------------------------------------------------------------ the rule tester

/// What checking one rule found.
struct RuleResult {
  std::string where;  ///< file:line of the rule
  /// instances built, instances the rule rewrote, rewrites checked equal, points evaluated, points where they differed
  ///@{
  size_t instantiated = 0, fired = 0, verified = 0, points = 0, mismatches = 0;
  ///@}
  std::string failure;  ///< the first mismatch
};

/// What checking one table found, per rule.
struct TableResult {
  /// the table's name
  std::string name;
  /// one result per rule, in table order
  std::vector<RuleResult> rules;
  /// number of rules whose counter f is nonzero
  size_t count(size_t RuleResult::*f) const {
    size_t n = 0;
    for (auto& r : rules) n += (r.*f) > 0;
    return n;
  }
  /// rules that fired at least once
  size_t exercised() const { return count(&RuleResult::fired); }
  /// rules with at least one checked rewrite
  size_t verified() const { return count(&RuleResult::verified); }
  /// rules that could not be instantiated
  size_t skipped() const { return rules.size() - count(&RuleResult::instantiated); }
  /// mismatching points over all rules
  size_t mismatches() const {
    size_t n = 0;
    for (auto& r : rules) n += r.mismatches;
    return n;
  }
  /** One line per table, then one per rule that never fired or mismatched. */
  std::string report() const {
    std::ostringstream s;
    s << name << ": " << rules.size() << " rules, " << exercised() << " exercised, " << verified() << " verified, "
      << skipped() << " skipped, " << mismatches() << " mismatches\n";
    for (auto& r : rules) {
      if (r.instantiated == 0) s << "  skipped (cannot instantiate): " << r.where << "\n";
      else if (r.fired == 0) s << "  never fired: " << r.where << " (" << r.instantiated << " instances)\n";
      if (r.mismatches) s << "  MISMATCH " << r.where << ": " << r.failure << "\n";
    }
    return s.str();
  }
};

/// How hard check_table tries.
struct CheckOptions {
  int tries = 400;     ///< instantiations per rule
  int points = 12;     ///< evaluation points per firing
  bool floats = false; ///< instantiate with float dtypes too (float32/float16/float64): checks IEEE-exactness bit for bit
};

namespace detail {
inline void compare(const UOp* before, const UOp* after, Rng& rng, int points, RuleResult& out, const char* what) {
  Evaluator L(before), R(after);
  std::vector<const UOp*> vars = L.vars();
  bool any = false;
  for (int p = 0; p < points; p++) {
    Point pt;
    for (const UOp* v : vars) pt.v.push_back({v, sample(v, rng)});
    auto lv = L.eval(pt, rng);
    if (!lv) continue;
    auto rv = R.eval(pt, rng);
    out.points++;
    any = true;
    if (!rv || !same_value(before->dtype, *lv, *rv)) {
      if (out.mismatches++ == 0)
        out.failure = std::string(what) + ": " + render_expr(before) + " -> " + render_expr(after) + " at " + pt.str() +
                      ": " + value_str(before->dtype, *lv) + " vs " + (rv ? value_str(before->dtype, *rv) : "undefined");
      return;
    }
  }
  if (any) out.verified++;
}
}  // namespace detail

namespace detail {
using InstantiateFn = UOpRef (*)(Gen&, DType);
// The rule tester's loop, compiled once: only `inst` (the pattern walk) and `apply` (the rule) differ per rule.
inline RuleResult check_rule_impl(const char* file, unsigned line, pat::OpSet roots, InstantiateFn inst, pat::RuleFn apply,
                                  Rng& rng, const CheckOptions& o) {
  RuleResult out;
  out.where = std::string(file) + ":" + std::to_string(line);
  for (int t = 0; t < o.tries; t++) {
    Gen g{rng};
    static constexpr DType fds[] = {dtypes::float32, dtypes::float32, dtypes::float16, dtypes::float64};
    if (o.floats) g.fdt = pick(rng, fds);
    DType want = root_dtype(roots, rng, g.fdt);
    g.idt = dtypes::is_int(want) ? want : (chance(rng, 0.5) ? dtypes::index : dtypes::int32);
    UOpRef n;
    try {
      n = inst(g, want);
    } catch (const Error&) {
      continue;
    }
    if (!n) continue;
    out.instantiated++;
    UOpRef m;
    try {
      m = apply(n.get(), nullptr);
    } catch (const std::exception& e) {
      if (out.mismatches++ == 0) out.failure = "throws on " + render_expr(n.get()) + ": " + e.what();
      continue;
    }
    if (!m || m == n) continue;
    out.fired++;
    if (m->dtype != n->dtype) {
      if (out.mismatches++ == 0)
        out.failure = "dtype changes: " + render_expr(n.get()) + " (" + n->dtype.name() + ") -> " + render_expr(m.get()) +
                      " (" + m->dtype.name() + ")";
      continue;
    }
    compare(n.get(), m.get(), rng, o.points, out, "rule");
  }
  return out;
}
}  // namespace detail

/** Check one rule (a pat::Rule) by random instantiation of its left pattern, R::apply, and evaluation. */
template <class R>
RuleResult check_rule(const R& r, Rng& rng, const CheckOptions& o) {
  return detail::check_rule_impl(r.file, r.line, R::Pat::roots, &Instantiate<typename R::Pat>::make, &R::apply, rng, o);
}

/** Check every rule of a table; the seed makes the run deterministic. */
template <class... Rs>
TableResult check_table(std::string name, const pat::Table<Rs...>& t, uint64_t seed, const CheckOptions& o = {}) {
  TableResult res{std::move(name), {}};
  Rng rng(seed);
  pat::hana::for_each(t.rules, [&](const auto& r) { res.rules.push_back(check_rule(r, rng, o)); });
  return res;
}

// ------------------------------------------------------------------ the expression fuzzer

/** A failing expression: its simplified form and the point where they differ. */
struct Counterexample {
  /// the random expression and its simplified form
  ///@{
  UOpRef expr, simplified;
  ///@}
  /// where they differ
  Point point;
  /// the values at the point (original, simplified), or the error simplifying raised
  ///@{
  std::string expected, got, error;
  ///@}
  /// the counterexample as a test failure prints it (expression, simplified form, point, variable bounds)
  std::string str() const {
    std::string s = "expr:       " + render_expr(expr.get()) + "  [" + expr->dtype.name() + "]\n";
    if (!error.empty()) return s + "error:      " + error + "\n";
    s += "simplified: " + render_expr(simplified.get()) + "\n";
    s += "at:         " + point.str() + "\n";
    s += "expected " + expected + ", got " + got + "\n";
    for (const UOp* u : toposort(expr.get()))
      if (u->op == Ops::DEFINE_VAR) {
        auto& v = std::get<VarArg>(u->arg);
        s += "  " + v.name + " in [" + std::to_string(v.min) + ", " + std::to_string(v.max) + "]\n";
      }
    return s;
  }
};

/** Random integer expressions over bounded variables: ADD SUB MUL IDIV MOD (nonzero divisors) MAX, comparisons under
 *  WHERE, AND/OR/XOR (mostly on non-negative operands), NEG, and casts from another int dtype (wrap-around
 *  included). */
class ExprGen {
 public:
  /** Variables are named prefix+a.., the divisor variable prefix+q; `casts`: may cast from another dtype. */
  ExprGen(Rng& rng, DType dt, bool casts = true, const std::string& prefix = "") : rng_(rng), dt_(dt), casts_(casts) {
    int n = int(uniform(rng_, 2, 4));
    for (int i = 0; i < n; i++) vars_.push_back(bounded_var(prefix + char('a' + i), false));
    divs_.push_back(bounded_var(prefix + "q", true));
  }
  /// a random expression at most depth levels deep
  UOpRef gen(int depth) {
    if (depth <= 0 || chance(rng_, 0.15)) return leaf();
    static constexpr Ops ops[] = {Ops::ADD, Ops::ADD, Ops::ADD, Ops::SUB, Ops::SUB, Ops::MUL, Ops::MUL, Ops::MUL,
                                  Ops::IDIV, Ops::IDIV, Ops::MOD, Ops::MOD, Ops::MAX, Ops::WHERE, Ops::AND,
                                  Ops::OR, Ops::XOR, Ops::NEG, Ops::CAST};
    Ops o = pick(rng_, ops);
    switch (o) {
      case Ops::CAST: {
        if (!casts_) return leaf();
        if (!inner_) {
          static constexpr DType others[] = {dtypes::index, dtypes::int32, dtypes::int8, dtypes::uint8, dtypes::int16};
          DType od = pick(rng_, others);
          inner_ = std::make_unique<ExprGen>(rng_, od == dt_ ? dtypes::int16 : od, false, "w");
        }
        return inner_->gen(depth - 1)->cast(dt_);
      }
      case Ops::IDIV: case Ops::MOD: return gen(depth - 1)->alu(o, divisor(depth - 1));
      case Ops::WHERE: return cond(depth - 1)->alu(Ops::WHERE, gen(depth - 1), gen(depth - 1));
      case Ops::AND: case Ops::OR: case Ops::XOR: return nonneg(gen(depth - 1))->alu(o, nonneg(gen(depth - 1)));
      case Ops::NEG: return gen(depth - 1)->alu(Ops::NEG);
      default: return gen(depth - 1)->alu(o, gen(depth - 1));
    }
  }

 private:
  UOpRef bounded_var(const std::string& name, bool nonzero) {
    static constexpr int64_t ks[] = {1, 2, 3, 4, 7, 8, 10, 16, 100, 1000};
    int64_t k = pick(rng_, ks), lo, hi;
    if (nonzero) {
      bool neg = !dtypes::is_unsigned(dt_) && chance(rng_, 0.3);
      lo = neg ? -k : 1, hi = neg ? -1 : k;
    } else {
      switch (uniform(rng_, 0, 9)) {
        case 0: case 1: case 2: case 3: lo = 0, hi = k; break;
        case 4: case 5: lo = -k, hi = k; break;
        case 6: lo = -k, hi = -1; break;
        case 7: lo = uniform(rng_, -20, 20), hi = lo + k; break;
        case 8: lo = int64_t(1) << 29, hi = (int64_t(1) << 31) - 1; break;  // wraps int32 quickly
        default: lo = dtypes::min_int(dt_) / 2, hi = dtypes::max_int(dt_) / 2; break;
      }
    }
    lo = std::clamp<int64_t>(lo, dtypes::min_int(dt_), dtypes::max_int(dt_));
    hi = std::clamp<int64_t>(hi, lo, dtypes::max_int(dt_));
    return UOp::variable(name, lo, hi, dt_);
  }
  UOpRef cnst(bool nonzero = false) {
    static constexpr int64_t cs[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 31, 32, 64, 100, 255, 256, 1000,
                                     -1, -2, -3, -4, -5, -7, -8, -16, -100, 65536, 1 << 20, 1 << 30,
                                     2147483647, -2147483647 - 1};
    int64_t v;
    do v = pick(rng_, cs);
    while (nonzero && v == 0);
    return UOp::cnst_int(dt_, v);
  }
  UOpRef leaf() { return chance(rng_, 0.65) ? vars_[size_t(uniform(rng_, 0, int64_t(vars_.size()) - 1))] : cnst(); }
  UOpRef divisor(int depth) {
    switch (uniform(rng_, 0, 7)) {
      case 0: case 1: case 2: case 3: return cnst(true);
      case 4: case 5: return divs_[0];
      default: return gen(depth)->alu(Ops::MAX, UOp::cnst_int(dt_, uniform(rng_, 1, 5)));  // >= 1: never zero
    }
  }
  UOpRef cond(int depth) {
    static constexpr Ops cmps[] = {Ops::CMPLT, Ops::CMPLT, Ops::CMPNE, Ops::CMPEQ};
    UOpRef a = gen(depth), b = chance(rng_, 0.5) ? cnst() : gen(depth);
    return a->alu(pick(rng_, cmps), b);
  }
  UOpRef nonneg(UOpRef e) {
    if (chance(rng_, 0.1) || (e->bounds().known && e->vmin() >= 0)) return e;
    return e->alu(Ops::MAX, UOp::cnst_int(dt_, 0));
  }
  Rng& rng_;
  DType dt_;
  bool casts_;
  std::vector<UOpRef> vars_, divs_;
  std::unique_ptr<ExprGen> inner_;  // expressions of another dtype, cast to dt_
};

/** Replace `from` by `to` everywhere under root (iterative). */
inline UOpRef substitute(const UOpRef& root, const UOp* from, const UOpRef& to) {
  std::unordered_map<const UOp*, UOpRef> m;
  for (const UOp* u : toposort(root.get())) {
    if (u == from) {
      m[u] = to;
      continue;
    }
    std::vector<UOpRef> s;
    bool changed = false;
    for (auto& c : u->src()) {
      s.push_back(m.at(c.get()));
      changed |= s.back() != c;
    }
    m[u] = changed ? u->replace_src(s) : u->ref();
  }
  return m.at(root.get());
}

/// How ExprFuzzer draws expressions.
struct FuzzOptions {
  /// the deepest expression
  int max_depth = 6;
  int points = 8;  ///< evaluation points per expression
};

/** Simplifies random expressions and compares them with their originals at random points. */
class ExprFuzzer {
 public:
  /// a fuzzer whose expressions follow from seed
  explicit ExprFuzzer(uint64_t seed, FuzzOptions o = {}) : rng_(seed), o_(o) {}
  /** Check one random expression; a counterexample on mismatch. */
  std::optional<Counterexample> step() {
    static constexpr DType small[] = {dtypes::int8, dtypes::uint8, dtypes::int16, dtypes::uint32};
    DType dt = chance(rng_, 0.85) ? (chance(rng_, 0.5) ? dtypes::index : dtypes::int32) : pick(rng_, small);
    ExprGen g(rng_, dt);
    UOpRef e = g.gen(int(uniform(rng_, 1, o_.max_depth)));
    exprs_++;
    return check(e, o_.points);
  }
  /** Check e against simplify(e) at `points` random points. */
  std::optional<Counterexample> check(const UOpRef& e, int points) {
    Counterexample c{e, {}, {}, {}, {}, {}};
    try {
      c.simplified = simplify(e);
    } catch (const std::exception& ex) {
      c.error = ex.what();
      return c;
    }
    Evaluator L(e.get()), R(c.simplified.get());
    std::vector<const UOp*> vars = L.vars();
    for (int p = 0; p < points; p++) {
      Point pt;
      for (const UOp* v : vars) pt.v.push_back({v, sample(v, rng_)});
      if (auto bad = compare(c, L, R, pt)) return bad;
    }
    return std::nullopt;
  }
  /** Shrink a counterexample: replace nodes by their sources or by their value at the failing point while it still
   *  fails there. */
  Counterexample minimize(Counterexample c) {
    if (!c.error.empty()) return c;
    for (int round = 0; round < 200; round++) {
      bool improved = false;
      for (const UOp* u : toposort(c.expr.get())) {
        if (u->op == Ops::CONST || u->op == Ops::DEFINE_VAR) continue;
        std::vector<UOpRef> cands;
        for (auto& s : u->src())
          if (s->dtype == u->dtype) cands.push_back(s);
        Point pt = c.point;
        if (auto v = Evaluator(u).eval(pt, rng_)) cands.push_back(UOp::cnst_int(u->dtype, v->i));
        for (auto& cand : cands) {
          UOpRef e = substitute(c.expr, u, cand);
          Counterexample t{e, {}, c.point, {}, {}, {}};
          try {
            t.simplified = simplify(e);
          } catch (const std::exception& ex) {
            continue;
          }
          Evaluator L(e.get()), R(t.simplified.get());
          Point p2 = c.point;
          if (auto bad = compare(t, L, R, p2)) {
            c = *bad;
            improved = true;
            break;
          }
        }
        if (improved) break;
      }
      if (!improved) break;
    }
    Point used;  // only the variables left in the minimal expression
    for (const UOp* u : toposort(c.expr.get()))
      if (const int64_t* v = c.point.find(u)) used.v.push_back({u, *v});
    c.point = used;
    return c;
  }
  /// expressions checked so far
  uint64_t exprs() const { return exprs_; }
  /// evaluation points checked so far
  uint64_t samples() const { return samples_; }

 private:
  std::optional<Counterexample> compare(const Counterexample& c, const Evaluator& L, const Evaluator& R, Point& pt) {
    auto lv = L.eval(pt, rng_);
    if (!lv) return std::nullopt;  // the original is undefined here (never for generated expressions)
    samples_++;
    auto rv = R.eval(pt, rng_);
    if (rv && same_value(c.expr->dtype, *lv, *rv)) return std::nullopt;
    Counterexample bad = c;
    bad.point = pt;
    bad.expected = value_str(c.expr->dtype, *lv);
    bad.got = rv ? value_str(c.expr->dtype, *rv) : "undefined";
    return bad;
  }
  Rng rng_;
  FuzzOptions o_;
  uint64_t exprs_ = 0, samples_ = 0;
};

}  // namespace tg::rule_check
