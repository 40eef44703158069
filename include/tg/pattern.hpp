#pragma once
// Patterns, rules, rule tables, PatternMatcher and graph_rewrite: the one mechanism of tg.
//
// A pattern is an expression-template *type* over typed wildcards:
//   x, y, z, w        any node (captures 0..3)           c0..c3   a CONST (captures 4..7)
//   3_c, -1_c         a CONST with that value             op<Ops::WHERE>(x, y, z), ops<Ops::ADD, Ops::MUL>(x, y)
//   x.is_int()        a dtype predicate                   bind(x, op<Ops::RANGE>(y))  name an op pattern
// Operators (+ - * % < != & | ^ << >> unary -) and idiv/fdiv/max_/where/lt/ne/eq build op patterns.
// A rule is `rule(pattern, replacement[, predicate])`; the replacement is a pattern expression over the
// captures or a callable `[](auto& m) -> UOpRef` reading captures as m[x] (null result: no rewrite).
// A table is `table(rule, ...)`: a constexpr Boost.Hana tuple. Tables compose with +.
// Every type-level mistake is a static_assert: an unbound capture in a replacement, a wrong source count,
// a capture bound twice with different meanings, a duplicated rule, a dtype predicate on a void op.
// Thread-safety: tables are constexpr values; a PatternMatcher is immutable after construction.
#include "tg/config.hpp"

#include <array>
#include <boost/hana.hpp>
#include <cstdint>
#include <ostream>  // operator<< below is a pattern op: std::ostream must be complete when overloads are checked
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tg/uop.hpp"

namespace tg {
namespace pat {
namespace hana = boost::hana;

#ifdef __cpp_lib_source_location
using SourceLoc = std::source_location;
#else
/** clang < 15 with libstdc++ has no std::source_location: the same call-site capture from the builtins. */
struct SourceLoc {
  /// the source file of the call site
  const char* file_;
  /// the line of the call site
  unsigned line_;
  /// the position of the expression that calls this (as a defaulted argument: the caller's)
  static constexpr SourceLoc current(const char* f = __builtin_FILE(), unsigned l = __builtin_LINE()) { return {f, l}; }
  /// the source file, as std::source_location::file_name
  constexpr const char* file_name() const { return file_; }
  /// the line, as std::source_location::line
  constexpr unsigned line() const { return line_; }
};
#endif

/// The most captures one pattern may use (capture indices 0..15).
inline constexpr int kMaxSlots = 16;
/** Captured nodes of one match, by capture index. */
struct Slots {
  /// the node captured at each index, or null
  const UOp* s[kMaxSlots] = {};
};

/** A set of ops, usable as a template argument. */
struct OpSet {
  /// membership bits: ops 0..63 in lo, 64.. in hi
  ///@{
  uint64_t lo = 0, hi = 0;
  ///@}
  /// this set plus op o
  constexpr OpSet with(Ops o) const {
    OpSet r = *this;
    if (int(o) < 64) r.lo |= 1ull << int(o);
    else r.hi |= 1ull << (int(o) - 64);
    return r;
  }
  /// whether op o is in the set
  constexpr bool has(Ops o) const { return int(o) < 64 ? (lo >> int(o)) & 1 : (hi >> (int(o) - 64)) & 1; }
  /// the union
  constexpr OpSet operator|(OpSet o) const { return {lo | o.lo, hi | o.hi}; }
  /// number of ops in the set
  constexpr int count() const { return __builtin_popcountll(lo) + __builtin_popcountll(hi); }
  /// whether the set is non-empty and every op in it is commutative (a match also tries the swapped sources)
  constexpr bool all_commutative() const {
    for (int i = 0; i < kNumOps; i++)
      if (has(Ops(i)) && !is_commutative(Ops(i))) return false;
    return count() > 0;
  }
  /// whether some op in it has no dtype (a dtype predicate on it is a compile error)
  constexpr bool any_void() const {
    for (int i = 0; i < kNumOps; i++)
      if (has(Ops(i)) && has_no_dtype(Ops(i))) return true;
    return false;
  }
  /// the lowest op in the set (NOOP when empty)
  constexpr Ops first() const {
    for (int i = 0; i < kNumOps; i++)
      if (has(Ops(i))) return Ops(i);
    return Ops::NOOP;
  }
};
/// The set of the ops Os.
template <Ops... Os>
inline constexpr OpSet opset = (OpSet{} | ... | OpSet{}.with(Os));
/// The set of every op.
inline constexpr OpSet all_ops = [] {
  OpSet s;
  for (int i = 0; i < kNumOps; i++) s = s.with(Ops(i));
  return s;
}();
/// The set of the ALU ops (unary, binary, ternary).
inline constexpr OpSet alu_ops = [] {
  OpSet s;
  for (int i = 0; i < kNumOps; i++)
    if (is_alu(Ops(i))) s = s.with(Ops(i));
  return s;
}();

/** A dtype predicate, usable as a template argument. */
struct DPred {
  /// what the dtype must be: anything, an int kind, a float kind, bool, int or bool, or exactly scalar s
  ///@{
  enum Kind : uint8_t { None, Int, Float, Bool, IntOrBool, Exact } kind = None;
  ///@}
  /// the scalar an Exact predicate requires
  Scalar s = Scalar::Void;
  /// whether dtype d passes
  constexpr bool ok(DType d) const {
    switch (kind) {
      case None: return true;
      case Int: return dtypes::is_int(d.scalar_type());
      case Float: return dtypes::is_float(d.scalar_type());
      case Bool: return dtypes::is_bool(d.scalar_type());
      case IntOrBool: return dtypes::is_int(d.scalar_type()) || dtypes::is_bool(d.scalar_type());
      case Exact: return d.scalar == s && !d.ptr;
    }
    return false;
  }
};

struct pattern_tag {};
/// Whether T is a pattern type (derives from pattern_tag).
template <class T>
inline constexpr bool is_pattern_v = std::is_base_of_v<pattern_tag, std::remove_cvref_t<T>>;
template <class T>
concept Pattern = is_pattern_v<T>;

template <class P>
struct with_binds;  // forward

// -------------------------------------------------------------- leaf patterns

/** Any node, captured at index I (twice in one pattern: both places must be the same node). */
template <int I, DPred P = DPred{}>
struct Any : pattern_tag {
  static_assert(I >= 0 && I < kMaxSlots, "[pattern] capture index out of range");
  /// The pattern interface the matcher and the compile-time table checks read: the capture index or literal value,
  /// the captures bound and used (bit masks), the ops a matched root may have, whether it is a literal, and the
  /// captures' pattern types (bindings())
  ///@{
  static constexpr int index = I;
  static constexpr uint32_t binds = 1u << I, uses = 1u << I;
  static constexpr OpSet roots = all_ops;
  static constexpr bool is_literal = false;
  static constexpr auto bindings() { return hana::make_tuple(hana::make_pair(hana::int_c<I>, hana::type_c<Any>)); }
  ///@}
  /// the same pattern, matching only nodes of an int, float, bool (or int-or-bool) dtype
  ///@{
  constexpr Any<I, DPred{DPred::Int}> is_int() const { return {}; }
  constexpr Any<I, DPred{DPred::Float}> is_float() const { return {}; }
  constexpr Any<I, DPred{DPred::Bool}> is_bool() const { return {}; }
  constexpr Any<I, DPred{DPred::IntOrBool}> is_int_or_bool() const { return {}; }
  ///@}
  /// matches node n, capturing into c, then calls the continuation k (the rest of the match); k's result, or null
  template <class K>
  static UOpRef match(const UOp* n, Slots& c, K&& k) {
    if (!P.ok(n->dtype)) return {};
    if (c.s[I]) return c.s[I] == n ? k() : UOpRef{};
    c.s[I] = n;
    UOpRef r = k();
    if (!r) c.s[I] = nullptr;
    return r;
  }
  /// the node this pattern stands for in a replacement, from the captures (hint: the dtype for a literal)
  static UOpRef build(const Slots& c, DType) { return c.s[I]; }
};

/** A CONST node, captured at index I. */
template <int I, DPred P = DPred{}>
struct Cst : pattern_tag {
  static_assert(I >= 0 && I < kMaxSlots, "[pattern] capture index out of range");
  /// The pattern interface the matcher and the compile-time table checks read: the capture index or literal value,
  /// the captures bound and used (bit masks), the ops a matched root may have, whether it is a literal, and the
  /// captures' pattern types (bindings())
  ///@{
  static constexpr int index = I;
  static constexpr uint32_t binds = 1u << I, uses = 1u << I;
  static constexpr OpSet roots = opset<Ops::CONST>;
  static constexpr bool is_literal = false;
  static constexpr auto bindings() { return hana::make_tuple(hana::make_pair(hana::int_c<I>, hana::type_c<Cst>)); }
  ///@}
  /// the same pattern, matching only nodes of an int, float, bool (or int-or-bool) dtype
  ///@{
  constexpr Cst<I, DPred{DPred::Int}> is_int() const { return {}; }
  constexpr Cst<I, DPred{DPred::Float}> is_float() const { return {}; }
  ///@}
  /// matches node n, capturing into c, then calls the continuation k (the rest of the match); k's result, or null
  template <class K>
  static UOpRef match(const UOp* n, Slots& c, K&& k) {
    if (n->op != Ops::CONST || !P.ok(n->dtype)) return {};
    if (c.s[I]) return c.s[I] == n ? k() : UOpRef{};
    c.s[I] = n;
    UOpRef r = k();
    if (!r) c.s[I] = nullptr;
    return r;
  }
  /// the node this pattern stands for in a replacement, from the captures (hint: the dtype for a literal)
  static UOpRef build(const Slots& c, DType) { return c.s[I]; }
};

/** A CONST equal to V (ints by value, floats by value, bools as 0/1). In a replacement: a CONST of the operands' dtype. */
template <int64_t V>
struct Lit : pattern_tag {
  /// The pattern interface the matcher and the compile-time table checks read: the capture index or literal value,
  /// the captures bound and used (bit masks), the ops a matched root may have, whether it is a literal, and the
  /// captures' pattern types (bindings())
  ///@{
  static constexpr int64_t value = V;
  static constexpr uint32_t binds = 0, uses = 0;
  static constexpr OpSet roots = opset<Ops::CONST>;
  static constexpr bool is_literal = true;
  static constexpr auto bindings() { return hana::make_tuple(); }
  ///@}
  /// matches node n, capturing into c, then calls the continuation k (the rest of the match); k's result, or null
  template <class K>
  static UOpRef match(const UOp* n, Slots&, K&& k) {
    if (n->op != Ops::CONST) return {};
    if (auto* f = std::get_if<double>(&n->arg)) return *f == double(V) ? k() : UOpRef{};
    return std::get<int64_t>(n->arg) == V ? k() : UOpRef{};
  }
  /// the node this pattern stands for in a replacement, from the captures (hint: the dtype for a literal)
  static UOpRef build(const Slots&, DType d) { return UOp::cnst_int(d, V); }
};

namespace detail {
constexpr int64_t parse_int(const char* s) {
  int64_t v = 0;
  for (; *s; s++) {
    if (*s == '\'') continue;
    if (*s < '0' || *s > '9') throw "[pattern] only decimal integer literals can be written as N_c";
    v = v * 10 + (*s - '0');
  }
  return v;
}
template <char... Cs>
struct lit_str {
  static constexpr char s[] = {Cs..., '\0'};
};
template <class T, class... Ts>
constexpr int count_same() { return (0 + ... + int(std::is_same_v<T, Ts>)); }
}  // namespace detail

/** Integer literal in a pattern: 0_c, 1_c; negate with -1_c. */
template <char... Cs>
constexpr auto operator""_c() {
  return Lit<detail::parse_int(detail::lit_str<Cs...>::s)>{};
}

// -------------------------------------------------------------- op patterns

/** A node whose op is in S (and whose dtype passes P) with sources matching Ch in order. AnySrc: any sources. */
template <OpSet S, DPred P, bool AnySrc, class... Ch>
struct OpP : pattern_tag {
  /// The pattern interface the matcher and the compile-time table checks read: the capture index or literal value,
  /// the captures bound and used (bit masks), the ops a matched root may have, whether it is a literal, and the
  /// captures' pattern types (bindings())
  ///@{
  static constexpr uint32_t binds = (0u | ... | Ch::binds), uses = (0u | ... | Ch::uses);
  static constexpr OpSet roots = S;
  static constexpr bool is_literal = false;
  static constexpr auto bindings() { return hana::flatten(hana::make_tuple(Ch::bindings()...)); }
  ///@}

  /** The same pattern with a dtype predicate. */
  template <DPred Q>
  constexpr auto dtype_is() const {
    static_assert(!S.any_void(), "[pattern] a dtype predicate on an op that has no dtype (it is always void)");
    return OpP<S, Q, AnySrc, Ch...>{};
  }
  /// the same pattern, matching only nodes of an int, float, bool (or int-or-bool) dtype
  ///@{
  constexpr auto is_int() const { return dtype_is<DPred{DPred::Int}>(); }
  constexpr auto is_float() const { return dtype_is<DPred{DPred::Float}>(); }
  constexpr auto is_bool() const { return dtype_is<DPred{DPred::Bool}>(); }
  ///@}
  /// the same pattern, matching only nodes whose dtype is exactly scalar T
  template <Scalar T>
  constexpr auto dtype() const { return dtype_is<DPred{DPred::Exact, T}>(); }

  /// matches sources J.. of n, in the order `order` gives (both orders for a commutative op), then calls k
  template <size_t J, class K>
  static UOpRef match_src(const UOp* n, const uint8_t* order, Slots& c, K& k) {
    if constexpr (J == sizeof...(Ch)) {
      return k();
    } else {
      using C = std::tuple_element_t<J, std::tuple<Ch...>>;
      return C::match(n->src(order[J]), c, [&]() { return match_src<J + 1>(n, order, c, k); });
    }
  }
  /// matches node n, capturing into c, then calls the continuation k (the rest of the match); k's result, or null
  template <class K>
  static UOpRef match(const UOp* n, Slots& c, K&& k) {
    if (!S.has(n->op) || !P.ok(n->dtype)) return {};
    if constexpr (AnySrc) {
      return k();
    } else {
      if (n->nsrc() != sizeof...(Ch)) return {};
      static constexpr uint8_t fwd[] = {0, 1, 2, 3, 4, 5, 6, 7};
      if (UOpRef r = match_src<0>(n, fwd, c, k)) return r;
      if constexpr (sizeof...(Ch) == 2 && S.all_commutative()) {
        static constexpr uint8_t rev[] = {1, 0};
        return match_src<0>(n, rev, c, k);
      }
      return {};
    }
  }
  /// the node this pattern stands for in a replacement, from the captures (hint: the dtype for a literal)
  static UOpRef build(const Slots& c, DType hint) {
    static_assert(S.count() == 1, "[rule] a replacement must name exactly one op");
    static_assert(!AnySrc, "[rule] a replacement must list its sources");
    constexpr Ops O = S.first();
    constexpr bool lits[] = {Ch::is_literal..., false};
    std::array<UOpRef, sizeof...(Ch)> built{};
    // Non-literal sources first; their dtype types the literals.
    size_t i = 0;
    ((built[i] = Ch::is_literal ? UOpRef{} : Ch::build(c, hint), i++), ...);
    DType d = hint;
    size_t first_val = O == Ops::WHERE ? 1 : 0;
    bool found = false;
    for (size_t j = first_val; j < sizeof...(Ch); j++)
      if (!lits[j]) { d = built[j]->dtype; found = true; break; }
    if (!found && is_comparison(O)) d = hint;  // nothing typed: the caller's dtype
    i = 0;
    ((built[i] = Ch::is_literal ? Ch::build(c, (O == Ops::WHERE && i == 0) ? dtypes::bool_ : d) : built[i], i++), ...);
    DType out = is_comparison(O) ? dtypes::bool_.vec(d.count) : d;
    if constexpr (O == Ops::CAST || O == Ops::BITCAST) out = hint;
    return UOp::make(O, out, std::span<const UOpRef>(built.data(), built.size()));
  }
};

namespace detail {
template <class A>
constexpr auto as_pattern(A a) {
  static_assert(is_pattern_v<A>, "[pattern] write integer constants in patterns as N_c (e.g. x + 1_c)");
  return a;
}
}  // namespace detail

/** op<Ops::X>(srcs...): a node with op X and exactly these sources. */
template <Ops O, class... Ch>
constexpr auto op(Ch...) {
  static_assert((is_pattern_v<Ch> && ...), "[pattern] sources must be patterns (write constants as N_c)");
  static_assert(op_arity(O) < 0 || op_arity(O) == int(sizeof...(Ch)), "[pattern] wrong number of sources for this op");
  return OpP<opset<O>, DPred{}, false, Ch...>{};
}
/** ops<Ops::X, Ops::Y>(srcs...): a node whose op is any of these. */
template <Ops... Os, class... Ch>
constexpr auto ops(Ch...) {
  static_assert(((op_arity(Os) < 0 || op_arity(Os) == int(sizeof...(Ch))) && ...),
                "[pattern] wrong number of sources for one of these ops");
  return OpP<opset<Os...>, DPred{}, false, Ch...>{};
}
/** A node whose op is in S, whatever its sources. */
template <OpSet S>
inline constexpr OpP<S, DPred{}, true> op_any{};

/** bind(x, p): match p and capture the node at x's index. */
template <int I, class P>
struct Bind : pattern_tag {
  /// The pattern interface the matcher and the compile-time table checks read: the capture index or literal value,
  /// the captures bound and used (bit masks), the ops a matched root may have, whether it is a literal, and the
  /// captures' pattern types (bindings())
  ///@{
  static constexpr uint32_t binds = (1u << I) | P::binds, uses = (1u << I);
  static constexpr OpSet roots = P::roots;
  static constexpr bool is_literal = false;
  static constexpr auto bindings() {
    return hana::prepend(P::bindings(), hana::make_pair(hana::int_c<I>, hana::type_c<Bind>));
  }
  ///@}
  /// matches node n, capturing into c, then calls the continuation k (the rest of the match); k's result, or null
  template <class K>
  static UOpRef match(const UOp* n, Slots& c, K&& k) {
    if (c.s[I]) return c.s[I] == n ? P::match(n, c, k) : UOpRef{};
    c.s[I] = n;
    UOpRef r = P::match(n, c, k);
    if (!r) c.s[I] = nullptr;
    return r;
  }
  /// the node this pattern stands for in a replacement, from the captures (hint: the dtype for a literal)
  static UOpRef build(const Slots& c, DType) { return c.s[I]; }
};
/// bind(x, p): match p and capture the matched node as x
template <int I, DPred D, class P>
constexpr Bind<I, P> bind(Any<I, D>, P) { return {}; }

#define TG_PAT_BINOP(sym, OPNAME)                                                          \
  template <Pattern A, class B>                                                            \
  constexpr auto operator sym(A a, B b) {                                                  \
    return op<Ops::OPNAME>(a, detail::as_pattern(b));                                      \
  }                                                                                        \
  template <class A, Pattern B>                                                            \
    requires(!is_pattern_v<A>)                                                             \
  constexpr auto operator sym(A a, B b) {                                                  \
    return op<Ops::OPNAME>(detail::as_pattern(a), b);                                      \
  }
TG_PAT_BINOP(+, ADD)
TG_PAT_BINOP(*, MUL)
TG_PAT_BINOP(-, SUB)
TG_PAT_BINOP(%, MOD)
TG_PAT_BINOP(<, CMPLT)
TG_PAT_BINOP(!=, CMPNE)
TG_PAT_BINOP(&, AND)
TG_PAT_BINOP(|, OR)
TG_PAT_BINOP(^, XOR)
TG_PAT_BINOP(<<, SHL)
TG_PAT_BINOP(>>, SHR)
#undef TG_PAT_BINOP

/// -a: a NEG node over a
template <Pattern A>
constexpr auto operator-(A a) { return op<Ops::NEG>(a); }
/// -1_c: the negated literal
template <int64_t V>
constexpr Lit<-V> operator-(Lit<V>) { return {}; }
/// an IDIV node (integer division, truncating)
template <Pattern A, Pattern B>
constexpr auto idiv(A a, B b) { return op<Ops::IDIV>(a, b); }
/// an FDIV node (float division)
template <Pattern A, Pattern B>
constexpr auto fdiv(A a, B b) { return op<Ops::FDIV>(a, b); }
/// a MAX node
template <Pattern A, Pattern B>
constexpr auto max_(A a, B b) { return op<Ops::MAX>(a, b); }
/// a CMPLT node (a < b)
template <Pattern A, Pattern B>
constexpr auto lt(A a, B b) { return op<Ops::CMPLT>(a, b); }
/// a CMPNE node (a != b)
template <Pattern A, Pattern B>
constexpr auto ne(A a, B b) { return op<Ops::CMPNE>(a, b); }
/// a CMPEQ node (a == b)
template <Pattern A, Pattern B>
constexpr auto eq(A a, B b) { return op<Ops::CMPEQ>(a, b); }
/// a WHERE node (a ? b : c)
template <Pattern A, Pattern B, Pattern C>
constexpr auto where(A a, B b, C c) { return op<Ops::WHERE>(a, b, c); }

/// The standard captures.
inline constexpr Any<0> x{};
/// any node, capture 1
inline constexpr Any<1> y{};
/// any node, capture 2
inline constexpr Any<2> z{};
/// any node, capture 3
inline constexpr Any<3> w{};
/// a CONST, capture 4
inline constexpr Cst<4> c0{};
/// a CONST, capture 5
inline constexpr Cst<5> c1{};
/// a CONST, capture 6
inline constexpr Cst<6> c2{};
/// a CONST, capture 7
inline constexpr Cst<7> c3{};
/// any node, capture I (for patterns that need more than the standard captures)
template <int I>
inline constexpr Any<I> cap{};

// -------------------------------------------------------------- match view for callables

/** What a callable replacement receives: the captures (m[x]), the matched root (m.root) and the context. */
template <uint32_t Binds>
struct Match {
  /// the captured nodes
  const Slots& slots;
  /// the matched node
  const UOp* root;
  /// the rewrite's context (see ctx())
  void* ctx_;
  /// the node captured as w (a capture the pattern binds; else a compile error)
  template <class W>
  const UOp* operator[](W) const {
    static_assert(is_pattern_v<W> && !W::is_literal, "[rule] m[...] takes a capture such as x or c0");
    static_assert((Binds >> W::index) & 1u, "[rule] the replacement uses a capture that the pattern does not bind");
    return slots.s[W::index];
  }
  /// the rewrite's context as a T (the caller passed a T*)
  template <class T>
  T& ctx() const { return *static_cast<T*>(ctx_); }
};

// -------------------------------------------------------------- rules and tables

struct NoPred {};

namespace detail {
/** Every capture index is bound with one meaning (same wildcard kind, predicate and sub-pattern). */
template <class P>
constexpr bool bindings_consistent() {
  constexpr auto bs = P::bindings();
  return hana::all_of(bs, [](auto a) {
    return hana::all_of(P::bindings(), [a](auto b) {
      return hana::or_(hana::not_(hana::equal(hana::first(a), hana::first(b))),
                       hana::equal(hana::second(a), hana::second(b)));
    });
  });
}
}  // namespace detail

/** One rule: pattern P rewrites to R when predicate Pr (a callable on the match) holds. */
template <class P, class R, class Pr>
struct Rule {
  /// the pattern
  using Pat = P;
  /// the replacement: a pattern over the captures, or a callable (auto& m) -> UOpRef
  using Repl = R;
  /// the predicate on the match (NoPred: none)
  using Pred = Pr;
  /// the source file that declares the rule
  const char* file;
  /// the line that declares the rule
  unsigned line;

  /// the rewrite of node n (ctx: the rewrite's context), or null when the rule does not apply
  static UOpRef apply(const UOp* n, void* ctx) {
    Slots c;
    return P::match(n, c, [&]() -> UOpRef {
      Match<P::binds> m{c, n, ctx};
      if constexpr (!std::is_same_v<Pr, NoPred>) {
        if (!Pr{}(m)) return {};
      }
      if constexpr (is_pattern_v<R>) return R::build(c, n->dtype);
      else return UOpRef(R{}(m));
    });
  }
};

/// the rule, after the compile-time checks of its captures, replacement and predicate
template <class P, class R, class Pr>
constexpr auto make_rule(SourceLoc loc) {
  static_assert(is_pattern_v<P>, "[rule] the left side must be a pattern");
  static_assert(detail::bindings_consistent<P>(), "[rule] a capture is bound twice with different meanings");
  if constexpr (is_pattern_v<R>) {
    static_assert((R::uses & ~P::binds) == 0, "[rule] the replacement uses a capture that the pattern does not bind");
  } else {
    static_assert(std::is_default_constructible_v<R>, "[rule] a callable replacement must not capture anything");
    static_assert(std::is_invocable_v<R, Match<P::binds>&>, "[rule] a callable replacement takes (auto& m)");
  }
  if constexpr (!std::is_same_v<Pr, NoPred>)
    static_assert(std::is_invocable_r_v<bool, Pr, Match<P::binds>&>, "[rule] a predicate takes (auto& m) and returns bool");
  (void)&Rule<P, R, Pr>::apply;  // instantiate the match code now, so every check fires at the declaration
  return Rule<P, R, Pr>{loc.file_name(), loc.line()};
}

/** rule(pattern, replacement): replacement is a pattern over the captures or a callable (auto& m) -> UOpRef. */
template <class P, class R>
constexpr auto rule(P, R, SourceLoc loc = SourceLoc::current()) {
  return make_rule<P, R, NoPred>(loc);
}
/** rule(pattern, replacement, predicate): the rule applies only where predicate(m) is true. */
template <class P, class R, class Pr>
constexpr auto rule(P, R, Pr, SourceLoc loc = SourceLoc::current()) {
  return make_rule<P, R, Pr>(loc);
}

/** A rule table: a Boost.Hana tuple of rules, checked for duplicates. */
template <class... Rs>
struct Table {
  /// the rules, in matching order
  hana::tuple<Rs...> rules;
  /// number of rules
  static constexpr size_t size = sizeof...(Rs);
};

/// a table of these rules (a rule given twice is a compile error)
template <class... Rs>
constexpr auto table(Rs... rs) {
  static_assert(((detail::count_same<Rs, Rs...>() == 1) && ...), "[table] a rule appears twice in this table");
  return Table<Rs...>{hana::make_tuple(rs...)};
}
/// a's rules, then b's, as one table
template <class... A, class... B>
constexpr auto operator+(const Table<A...>& a, const Table<B...>& b) {
  return hana::unpack(hana::concat(a.rules, b.rules), [](auto... rs) { return table(rs...); });
}

// -------------------------------------------------------------- the matcher

/// A compiled rule: the rewrite of a node (with the context), or null.
using RuleFn = UOpRef (*)(const UOp*, void*);
/** One registered rule: compiled match code plus where it was declared. */
struct RuleEntry {
  /// the compiled match and rewrite
  RuleFn fn;
  /// the source file that declares the rule
  const char* file;
  /// the line that declares the rule
  unsigned line;
};

}  // namespace pat

/** Rules grouped by root op; matching a node calls only the rules that can match its op, in table order. */
class PatternMatcher {
 public:
  PatternMatcher() = default;
  /// the matcher of a rule table (implicit: tables convert to matchers)
  template <class... Rs>
  PatternMatcher(const pat::Table<Rs...>& t) {  // NOLINT: tables convert implicitly
    pat::hana::for_each(t.rules, [&](const auto& r) { add(r); });
  }
  /** The first rule that rewrites `n` (its result, and which rule in `*which`), or null. */
  UOpRef rewrite(const UOp* n, void* ctx = nullptr, const pat::RuleEntry** which = nullptr) const;
  /** This matcher's rules, then o's. */
  PatternMatcher operator+(const PatternMatcher& o) const;
  /// number of rules
  size_t size() const { return count_; }

 private:
  template <class R>
  void add(const R& r) {
    pat::RuleEntry e{&R::apply, r.file, r.line};
    for (int i = 0; i < kNumOps; i++)
      if (R::Pat::roots.has(Ops(i))) by_op_[size_t(i)].push_back(e);
    count_++;
  }
  std::array<std::vector<pat::RuleEntry>, kNumOps> by_op_;
  size_t count_ = 0;
};

/** One applied rule, recorded by a traced graph_rewrite. */
struct RewriteStep {
  std::string rule;  ///< "file:line"
  /// the node the rule matched, and what it became
  ///@{
  UOpRef before, after;
  ///@}
};

/** Options of one graph_rewrite. */
struct RewriteOptions {
  /// the context rules receive (m.ctx<T>())
  void* ctx = nullptr;
  bool bottom_up = false;             ///< apply rules to a node before its sources are rewritten
  const char* name = "";              ///< printed at DEBUG>=6 and kept in traces
  std::vector<RewriteStep>* trace = nullptr;  ///< when set, every applied rule is recorded
};

/** Rewrite the graph under `root` with `pm` to a fixed point; memoised within the call; iterative. */
UOpRef graph_rewrite(const UOpRef& root, const PatternMatcher& pm, const RewriteOptions& opts = {});
/// graph_rewrite with the options as arguments
inline UOpRef graph_rewrite(const UOpRef& root, const PatternMatcher& pm, void* ctx, bool bottom_up = false,
                            const char* name = "") {
  return graph_rewrite(root, pm, RewriteOptions{ctx, bottom_up, name, nullptr});
}

/** Visit every node of `nodes` (sources before their users: a toposort) with `pm`'s rules, for what they record in
 *  `ctx`: an analysis pass (tinygrad's rewrites that return None and mark their context, as the scheduler's realize
 *  map). Every rule that matches a node runs, in table order; a rule that returns a node is an error. */
void graph_visit(std::span<const UOp* const> nodes, const PatternMatcher& pm, void* ctx, const char* name);

}  // namespace tg
