#pragma once
// The symbolic rule tables (internal). The same constexpr tables feed the rewriter (symbolic_*.cpp register them into
// PatternMatchers) and the random-evaluation rule tester (tests/symbolic_tests.cpp via tg/rule_check.hpp).
//
// Semantics: ints follow C with wrap-around (exec_alu): IDIV/MOD truncate toward zero, the remainder takes the sign of
// the dividend. Ring identities (reassociation, distribution, like terms) hold modulo 2^n and need no bounds. Rules that
// reason about order or division (div/mod folding, comparisons) check with exact 128-bit arithmetic on the captures'
// bounds that nothing wraps. Float rules are IEEE-exact (no x*0, x-x, x/x, reassociation).
// Callbacks (do_...) are thin lambdas over out-of-line functions in symbolic_util.cpp, so each table instantiates
// little code. Tables are grouped per op family; symbolic.cpp fixes their order.
#include <algorithm>
#include <cmath>

#include "tg/pattern.hpp"

namespace tg::sym {
using namespace tg::pat;
using i128 = __int128;

// ------------------------------------------------------------------ facts about nodes (symbolic_util.cpp)

/** A scalar int/bool node with known bounds. */
bool known(const UOp* u);
/** A signed integer dtype (index, weakint, int8..int64). */
bool is_signed(DType d);
/** Smallest / largest value of an int/bool dtype (uint64: 2^63-1, conservatively). */
i128 dt_min(DType d);
i128 dt_max(DType d);
/** [lo, hi] lies inside d's range. */
bool fits(DType d, i128 lo, i128 hi);
/** The value of an int/bool CONST. */
int64_t cv(const UOp* c);
/** u is never zero (a nonzero constant, or bounds that exclude 0). */
bool nonzero(const UOp* u);
/** x / y can neither divide by zero nor overflow (INT_MIN / -1). */
bool div_ok(const UOp* x, const UOp* y);
/** x*c / x+c never wrap for any x in bounds. */
bool mul_exact(const UOp* x, i128 c);
bool add_exact(const UOp* x, i128 c);
/** Exact bounds of x*y (corner products); false when unknown or they leave x's dtype. */
bool mul_bounds(const UOp* x, const UOp* y, i128& lo, i128& hi);
/** Truncated (C) and floored division of 128-bit values. */
i128 tdiv(i128 a, i128 b);
i128 fdiv_floor(i128 a, i128 b);
i128 cdiv_ceil(i128 a, i128 b);
i128 gcd(i128 a, i128 b);
/** Sign compatibility: trunc((q*d + r)/d) == q + trunc(r/d) holds for all values when the numerator and r never have
 *  opposite signs (or r is always 0). */
bool sign_ok(i128 nlo, i128 nhi, i128 rlo, i128 rhi);
/** A constant of d with value v (v must fit d, or wraps as C does). */
UOpRef cst(DType d, i128 v);
/** The term order used for canonical chains: constants last, variables by name, then by op and structural hash. */
bool order_less(const UOp* a, const UOp* b);
/** c's bits are all ones in d (-1 for signed ints, the max for unsigned). */
bool all_ones(DType d, int64_t c);
/** Every value of x is a value of dtype a (by x's bounds, or a lossless cast). */
bool holds(DType a, const UOp* x);

// Callback bodies.
UOpRef fold_alu(const UOp* root);
UOpRef fold_cast(const UOp* root);
UOpRef fold_where_const(const UOp* root);
UOpRef fold_bounds(const UOp* root);
UOpRef order_chain(const UOp* root);
UOpRef divmod_const(const UOp* root);
UOpRef divmod_neg(const UOp* root);
UOpRef mod_div_nested(const UOp* root);
UOpRef fold_split_index(const UOp* root);
UOpRef lt_mul(const UOp* root);
UOpRef gt_mul(const UOp* root);
UOpRef lt_div(const UOp* root);
UOpRef lt_gcd(const UOp* root);
UOpRef cmp_mul(const UOp* root);
UOpRef not_lt(const UOp* root);
UOpRef shift_const(const UOp* root);
UOpRef and_or_lt(const UOp* root);
UOpRef cast_bool_ne(const UOp* root);
UOpRef fdiv_pow2(const UOp* root);
UOpRef bitcast_twice(const UOp* root);
UOpRef float_zero_add(const UOp* root);

// ------------------------------------------------------------------ matchers, one per translation unit

PatternMatcher pm_simple_tables();   // symbolic_tables.cpp: fold + identity + bool + cast + float
PatternMatcher pm_arith_tables();    // symbolic_arith.cpp: bounds + add + mul + bits
PatternMatcher pm_divmod_tables();   // symbolic_divmod.cpp: divmod + cmp + where
PatternMatcher pm_order_table();     // symbolic_arith.cpp: order

}  // namespace tg::sym

// The tables below cost every including TU a few seconds of type-level work; TUs that only need the helpers above
// define TG_SYMBOLIC_NO_TABLES.
#ifndef TG_SYMBOLIC_NO_TABLES
namespace tg::sym {

// ------------------------------------------------------------------ callbacks

inline constexpr auto do_fold_alu = [](auto& m) { return fold_alu(m.root); };
inline constexpr auto do_fold_cast = [](auto& m) { return fold_cast(m.root); };
inline constexpr auto do_where_const = [](auto& m) { return fold_where_const(m.root); };
inline constexpr auto do_bounds_const = [](auto& m) { return fold_bounds(m.root); };
inline constexpr auto do_order = [](auto& m) { return order_chain(m.root); };
inline constexpr auto do_divmod_const = [](auto& m) { return divmod_const(m.root); };
inline constexpr auto do_divmod_neg = [](auto& m) { return divmod_neg(m.root); };
inline constexpr auto do_mod_div_nested = [](auto& m) { return mod_div_nested(m.root); };
inline constexpr auto do_fold_split_index = [](auto& m) { return fold_split_index(m.root); };
inline constexpr auto do_lt_mul = [](auto& m) { return lt_mul(m.root); };
inline constexpr auto do_gt_mul = [](auto& m) { return gt_mul(m.root); };
inline constexpr auto do_lt_div = [](auto& m) { return lt_div(m.root); };
inline constexpr auto do_lt_gcd = [](auto& m) { return lt_gcd(m.root); };
inline constexpr auto do_cmp_mul = [](auto& m) { return cmp_mul(m.root); };
inline constexpr auto do_not_lt = [](auto& m) { return not_lt(m.root); };
inline constexpr auto do_shift_const = [](auto& m) { return shift_const(m.root); };
inline constexpr auto do_and_or_lt = [](auto& m) { return and_or_lt(m.root); };
inline constexpr auto do_cast_bool_ne = [](auto& m) { return cast_bool_ne(m.root); };
inline constexpr auto do_fdiv_pow2 = [](auto& m) { return fdiv_pow2(m.root); };
inline constexpr auto do_bitcast_twice = [](auto& m) { return bitcast_twice(m.root); };
inline constexpr auto do_float_zero_add = [](auto& m) { return float_zero_add(m.root); };

// x = (x//c)*c + x%c (C), so (x%c)*m + (x//c)*(c*m) = x*m modulo 2^n.
inline constexpr auto do_recombine_ok = [](auto& m) {
  return div_ok(m[x], m[c0]) && i128(cv(m[c2])) == i128(cv(m[c0])) * cv(m[c1]) &&
         fits(m[x]->dtype, i128(cv(m[c0])) * cv(m[c1]), i128(cv(m[c0])) * cv(m[c1]));
};

// Typed captures: an int (index, intN, uintN) or a bool node.
inline constexpr auto xi = x.is_int();
inline constexpr auto yi = y.is_int();
inline constexpr auto xb = x.is_bool();
inline constexpr auto yb = y.is_bool();
inline constexpr auto xn = x.is_int_or_bool();

// ------------------------------------------------------------------ symbolic_simple: folding and identities

/** Constant folding of every ALU op, CAST and BITCAST (exec_alu; never an integer division by zero). */
inline constexpr auto sym_fold = table(
    rule(op_any<alu_ops>, do_fold_alu),   // op(c0, c1, ...) -> exec_alu(op, c0, c1, ...)
    rule(op<Ops::CAST>(c0), do_fold_cast),     // cast(c) -> c converted as C does
    rule(op<Ops::BITCAST>(c0), do_fold_cast),  // bitcast(c) -> c reinterpreted
    rule(where(c0, x, y), do_where_const));    // where(True,a,b) -> a ; where(False,a,b) -> b

/** Identities that hold for ints and bools (wrap-around included); the IEEE-exact ones hold for every dtype. */
inline constexpr auto sym_identity = table(
    rule(xn + 0_c, x),                                                  // x+0 -> x
    rule(x * 1_c, x),                                                   // x*1 -> x (exact for floats too)
    rule(xn * 0_c, 0_c),                                                // x*0 -> 0 (not floats: NaN*0)
    rule(xi - 0_c, x),                                                  // x-0 -> x
    rule(xi - xi, 0_c),                                                 // x-x -> 0
    rule(idiv(xi, 1_c), x),                                             // x//1 -> x
    rule(idiv(xi, -1_c), -x, [](auto& m) { return is_signed(m[x]->dtype); }),  // x//-1 -> -x
    rule(xi % 1_c, 0_c),                                                // x%1 -> 0 (ints: a float MOD keeps the fraction)
    rule(xi % -1_c, 0_c, [](auto& m) { return is_signed(m[x]->dtype); }),      // x%-1 -> 0
    rule(idiv(xi, xi), 1_c, [](auto& m) { return nonzero(m[x]); }),     // x//x -> 1 (x != 0)
    rule(xi % xi, 0_c, [](auto& m) { return nonzero(m[x]); }),          // x%x -> 0 (x != 0)
    rule(bind(z, xi % y) % y, z),                                       // (x%y)%y -> x%y
    rule(xn & xn, x),                                                   // x&x -> x
    rule(xn | xn, x),                                                   // x|x -> x
    rule(xn ^ xn, 0_c),                                                 // x^x -> 0
    rule(xn & 0_c, 0_c),                                                // x&0 -> 0
    rule(xn | 0_c, x),                                                  // x|0 -> x
    rule(xn ^ 0_c, x),                                                  // x^0 -> x
    rule(xi & c0, x, [](auto& m) { return all_ones(m[x]->dtype, cv(m[c0])); }),      // x&-1 -> x
    rule(xi | c0, c0, [](auto& m) { return all_ones(m[x]->dtype, cv(m[c0])); }),     // x|-1 -> -1
    rule((xn ^ y) ^ y, x),                                              // (x^y)^y -> x
    rule(x << 0_c, x),                                                  // x<<0 -> x
    rule(x >> 0_c, x),                                                  // x>>0 -> x
    rule(max_(x, x), x),                                                // max(x,x) -> x
    rule(lt(x, x), 0_c),                                                // x<x -> False (NaN<NaN is False too)
    rule(ne(xn, xn), 0_c),                                              // x!=x -> False (not floats: NaN)
    rule(eq(xn, xn), 1_c),                                              // x==x -> True (not floats: NaN)
    rule(-(-x), x),                                                     // -(-x) -> x
    rule(op<Ops::TRUNC>(xn), x),                                        // trunc(x) -> x for ints
    rule(where(x, y, y), y));                                           // where(c,a,a) -> a

/** Bool algebra: tg's logical not is `x != True`. */
inline constexpr auto sym_bool = table(
    rule(xb * yb, x & y),                                                     // bool: x*y -> x&y
    rule(xb + yb, x | y),                                                     // bool: x+y -> x|y
    rule(max_(xb, yb), x | y),                                                // bool: max(x,y) -> x|y
    rule(xb & 1_c, x),                                                        // x&True -> x
    rule(xb | 1_c, 1_c),                                                      // x|True -> True
    rule(ne(xb, 0_c), x),                                                     // x!=False -> x
    rule(eq(xb, 1_c), x),                                                     // x==True -> x
    rule(eq(xb, 0_c), ne(x, 1_c)),                                            // x==False -> !x
    rule(xb ^ 1_c, ne(x, 1_c)),                                               // x^True -> !x
    rule(ne(ne(xb, 1_c), 1_c), x),                                            // !!x -> x
    rule(where(xb, 1_c, 0_c), x, [](auto& m) { return dtypes::is_bool(m.root->dtype); }),          // where(x,True,False) -> x
    rule(where(xb, 0_c, 1_c), ne(x, 1_c), [](auto& m) { return dtypes::is_bool(m.root->dtype); }),  // where(x,False,True) -> !x
    rule(ne(op<Ops::CAST>(xb), c0), do_cast_bool_ne));                        // int(x)!=c -> x if c==0, !x if c==1, else True

/** Casts and bitcasts of non-constants. */
inline constexpr auto sym_cast = table(
    rule(op<Ops::CAST>(x), x, [](auto& m) { return m.root->dtype == m[x]->dtype; }),     // cast(x: T -> T) -> x
    rule(op<Ops::BITCAST>(x), x, [](auto& m) { return m.root->dtype == m[x]->dtype; }),  // bitcast(x: T -> T) -> x
    rule(op<Ops::CAST>(bind(y, op<Ops::CAST>(x))), x, [](auto& m) {      // cast(cast(x,a),b) -> x when b == T(x), a holds x
      return m.root->dtype == m[x]->dtype && holds(m[y]->dtype, m[x]);
    }),
    rule(op<Ops::CAST>(bind(y, op<Ops::CAST>(x))), op<Ops::CAST>(x), [](auto& m) {  // cast(cast(x,a),b) -> cast(x,b), a holds x
      return m.root->dtype != m[x]->dtype && holds(m[y]->dtype, m[x]);
    }),
    rule(op<Ops::BITCAST>(op<Ops::BITCAST>(x)), do_bitcast_twice),                          // bitcast(bitcast(x)) -> bitcast(x)
    rule(op<Ops::CAST>(x), ne(x, 0_c), [](auto& m) {                                        // bool(x) -> x != 0
      return dtypes::is_bool(m.root->dtype) && !dtypes::is_bool(m[x]->dtype) && m.root->dtype.count == 1;
    }));

/** IEEE-exact float identities (bit-exact up to NaN payloads). */
inline constexpr auto sym_float = table(
    rule(x.is_float() + c0, do_float_zero_add),                       // x+(-0.0) -> x (x+0.0 is not: -0.0+0.0 = 0.0)
    rule(x.is_float() - c0, x, [](auto& m) {                          // x-0.0 -> x
      return m[c0]->const_float() == 0 && !std::signbit(m[c0]->const_float());
    }),
    rule(fdiv(x, 1_c), x),                                             // x/1.0 -> x
    rule(x.is_float() * -1_c, -x),                                     // x*-1.0 -> -x
    rule(fdiv(x.is_float(), c0), do_fdiv_pow2),                        // x/2^k -> x*2^-k (the reciprocal is exact)
    rule(op<Ops::TRUNC>(bind(y, op<Ops::TRUNC>(x))), y));             // trunc(trunc(x)) -> trunc(x)

// ------------------------------------------------------------------ symbolic: order, like terms, bounds

/** Results decided by bounds; a RANGE over one iteration is 0. */
inline constexpr auto sym_bounds = table(
    rule(op_any<alu_ops>, do_bounds_const),  // vmin == vmax -> that constant (comparisons, div/mod, where, ...)
    rule(op<Ops::RANGE>(1_c), 0_c));         // RANGE(1) -> 0

/** ADD/SUB/NEG on ints: subtraction as +(-1)*, like terms, constants to the right. */
inline constexpr auto sym_add = table(
    rule(xi - y, x + y * -1_c),                                                  // x-y -> x+y*-1
    rule(-xi, x * -1_c),                                                         // -x -> x*-1
    rule(xi + xi, x * 2_c),                                                      // x+x -> x*2
    rule(xi * c0 + xi * c1, x * (c0 + c1)),                                      // x*c0+x*c1 -> x*(c0+c1)
    rule(xi + xi * c0, x * (c0 + 1_c)),                                          // x+x*c -> x*(c+1)
    rule((y + xi) + xi, y + x * 2_c),                                            // (y+x)+x -> y+x*2
    rule((y + xi * c0) + xi * c1, y + x * (c0 + c1)),                            // (y+x*c0)+x*c1 -> y+x*(c0+c1)
    rule((y + xi) + xi * c0, y + x * (c0 + 1_c)),                                // (y+x)+x*c -> y+x*(c+1)
    rule((y + xi * c0) + xi, y + x * (c0 + 1_c)),                                // (y+x*c)+x -> y+x*(c+1)
    rule((xi + c0) + c1, x + (c0 + c1)),                                         // (x+c0)+c1 -> x+(c0+c1)
    rule((xi + c0) + y, (x + y) + c0, [](auto& m) { return !m[y]->is_const(); }),  // (x+c)+y -> (x+y)+c
    rule(xi % y + idiv(xi, y) * y, x, [](auto& m) { return div_ok(m[x], m[y]); }),  // x%y+(x//y)*y -> x
    rule((z + xi % y) + idiv(xi, y) * y, z + x, [](auto& m) { return div_ok(m[x], m[y]); }),  // (z+x%y)+(x//y)*y -> z+x
    rule((z + idiv(xi, y) * y) + xi % y, z + x, [](auto& m) { return div_ok(m[x], m[y]); }),  // (z+(x//y)*y)+x%y -> z+x
    rule((xi % c0) * c1 + idiv(xi, c0) * c2, x * c1, do_recombine_ok),            // (x%c)*m+(x//c)*(c*m) -> x*m
    rule((z + (xi % c0) * c1) + idiv(xi, c0) * c2, z + x * c1, do_recombine_ok),  // (z+(x%c)*m)+(x//c)*(c*m) -> z+x*m
    rule((z + idiv(xi, c0) * c2) + (xi % c0) * c1, z + x * c1, do_recombine_ok)); // (z+(x//c)*(c*m))+(x%c)*m -> z+x*m

/** MUL on ints: constants to the right, distribution over sums (linear forms). */
inline constexpr auto sym_mul = table(
    rule((xi * c0) * c1, x * (c0 * c1)),                                           // (x*c0)*c1 -> x*(c0*c1)
    rule((xi * c0) * y, (x * y) * c0, [](auto& m) { return !m[y]->is_const(); }),  // (x*c)*y -> (x*y)*c
    rule((xi + y) * c0, x * c0 + y * c0));                                         // (x+y)*c -> x*c+y*c

/** Bitwise ops, shifts and bool clauses. */
inline constexpr auto sym_bits = table(
    rule((xn & c0) & c1, x & (c0 & c1)),                                        // (x&c0)&c1 -> x&(c0&c1)
    rule((xn | c0) | c1, x | (c0 | c1)),                                        // (x|c0)|c1 -> x|(c0|c1)
    rule((xn ^ c0) ^ c1, x ^ (c0 ^ c1)),                                        // (x^c0)^c1 -> x^(c0^c1)
    rule(max_(max_(xi, c0), c1), max_(x, max_(c0, c1))),                        // max(max(x,c0),c1) -> max(x,max(c0,c1))
    rule(xi & c0, x, [](auto& m) {                                              // x&(2^k-1) -> x when 0<=x<2^k
      int64_t c = cv(m[c0]);
      return c >= 0 && (uint64_t(c) & (uint64_t(c) + 1)) == 0 && known(m[x]) && m[x]->vmin() >= 0 && m[x]->vmax() <= c;
    }),
    rule(xi & c0, 0_c, [](auto& m) {                                            // x&c -> 0 when 0<=x<lowbit(c)
      int64_t c = cv(m[c0]);
      return c > 0 && known(m[x]) && m[x]->vmin() >= 0 && m[x]->vmax() < (c & -c);
    }),
    rule(xi << c0, do_shift_const),                                             // x<<c -> x*2^c
    rule(xi >> c0, do_shift_const),                                             // x>>c -> x//2^c for x>=0
    rule(xn & (xn | y), x),                                                     // x&(x|y) -> x
    rule(xn | (xn & y), x),                                                     // x|(x&y) -> x
    rule(xb | ne(xb, 1_c), 1_c),                                                // x|!x -> True
    rule(xb & ne(xb, 1_c), 0_c),                                                // x&!x -> False
    rule(lt(xi, c0) & lt(xi, c1), do_and_or_lt),                                // (x<c0)&(x<c1) -> x<min(c0,c1)
    rule(lt(xi, c0) | lt(xi, c1), do_and_or_lt));                               // (x<c0)|(x<c1) -> x<max(c0,c1)

/** IDIV/MOD on ints (truncating): split multiples of the divisor out of sums, nested div/mod, bounds. */
inline constexpr auto sym_divmod = table(
    rule(idiv(xi, c0), do_divmod_const),                       // (a*c+b)//c -> a+b//c, (x*4+3)//4 -> x, gcd, ...
    rule(xi % c0, do_divmod_const),                            // (a*c+b)%c -> b%c, (x*4+3)%4 -> 3, gcd, ...
    rule(idiv(xi, c0), do_divmod_neg),                         // x//-c -> (x//c)*-1
    rule(xi % c0, do_divmod_neg),                              // x%-c -> x%c
    rule(idiv(idiv(xi, c0), c1), idiv(x, c0 * c1), [](auto& m) {                   // (x//a)//b -> x//(a*b)
      i128 a = cv(m[c0]), b = cv(m[c1]);
      return a > 0 && b > 0 && fits(m[x]->dtype, a * b, a * b);
    }),
    rule(idiv(idiv(xi, c0) + c1, c2), idiv(x + c1 * c0, c0 * c2), [](auto& m) {    // (x//a+b)//c -> (x+b*a)//(a*c)
      i128 a = cv(m[c0]), b = cv(m[c1]), c = cv(m[c2]);
      return a > 0 && c > 0 && known(m[x]) && m[x]->vmin() >= 0 && m[x]->vmin() + b * a >= 0 &&
             fits(m[x]->dtype, a * c, a * c) && fits(m[x]->dtype, m[x]->vmin() + b * a, m[x]->vmax() + b * a);
    }),                                                                            //   for x>=0, x+b*a>=0
    rule((xi % c0) % c1, x % c1, [](auto& m) {                                    // (x%(a*b))%a -> x%a
      int64_t a = cv(m[c0]), b = cv(m[c1]);
      return a != 0 && b != 0 && (is_signed(m[x]->dtype) || (a > 0 && b > 0)) && a % b == 0;
    }),
    rule(idiv(xi % c0, c1), do_mod_div_nested),                                    // (x%(a*b))//a -> (x//a)%b
    rule(xi + y, do_fold_split_index),  // (x%a)*m + ((x//a)%b)*(a*m) -> (x%(a*b))*m anywhere in a sum
    rule(xi % y, x, [](auto& m) {                                                  // x%y -> x when |x| < |y|
      const UOp *a = m[x], *b = m[y];
      if (!known(a) || !known(b) || !nonzero(b)) return false;
      i128 amax = std::max(-i128(a->vmin()), i128(a->vmax()));
      i128 bmin = b->vmin() > 0 ? i128(b->vmin()) : -i128(b->vmax());
      return amax < bmin;
    }),
    rule(idiv(xi * y, y), x, [](auto& m) {                                         // (x*y)//y -> x
      i128 lo, hi;
      return div_ok(m[x], m[y]) && mul_bounds(m[x], m[y], lo, hi);
    }),
    rule((xi * y) % y, 0_c, [](auto& m) {                                         // (x*y)%y -> 0
      i128 lo, hi;
      return nonzero(m[y]) && mul_bounds(m[x], m[y], lo, hi);
    }),
    rule(idiv(xi * y + z, y), x + idiv(z, y), [](auto& m) {                        // (x*y+z)//y -> x+z//y
      i128 lo, hi;
      if (!nonzero(m[y]) || !known(m[z]) || !div_ok(m[z], m[y]) || !mul_bounds(m[x], m[y], lo, hi)) return false;
      i128 zl = m[z]->vmin(), zh = m[z]->vmax();
      return fits(m[x]->dtype, lo + zl, hi + zh) && sign_ok(lo + zl, hi + zh, zl, zh);
    }),                                                                            //   when x*y+z and z never differ in sign
    rule((xi * y + z) % y, z % y, [](auto& m) {                                   // (x*y+z)%y -> z%y
      i128 lo, hi;
      if (!nonzero(m[y]) || !known(m[z]) || !div_ok(m[z], m[y]) || !mul_bounds(m[x], m[y], lo, hi)) return false;
      i128 zl = m[z]->vmin(), zh = m[z]->vmax();
      return fits(m[x]->dtype, lo + zl, hi + zh) && sign_ok(lo + zl, hi + zh, zl, zh);
    }),                                                                            //   when x*y+z and z never differ in sign
    rule(bind(x, op<Ops::RANGE>(y)) % y, x),                                       // r%end -> r for r = RANGE(end)
    rule(idiv(bind(x, op<Ops::RANGE>(y)), y), 0_c));                               // r//end -> 0 for r = RANGE(end)

/** Comparisons on ints: move constants across, divide through by positive factors. */
inline constexpr auto sym_cmp = table(
    rule(lt(xi + c0, c1), lt(x, c1 - c0), [](auto& m) {                            // x+c0<c1 -> x<c1-c0
      i128 d = i128(cv(m[c1])) - cv(m[c0]);
      return add_exact(m[x], cv(m[c0])) && fits(m[x]->dtype, d, d);
    }),
    rule(lt(c0, xi + c1), lt(c0 - c1, x), [](auto& m) {                            // c0<x+c1 -> c0-c1<x
      i128 d = i128(cv(m[c0])) - cv(m[c1]);
      return add_exact(m[x], cv(m[c1])) && fits(m[x]->dtype, d, d);
    }),
    rule(lt(xi * c0, c1), do_lt_mul),                                              // x*c<d -> x<ceil(d/c) for c>0
    rule(lt(c1, xi * c0), do_gt_mul),                                              // d<x*c -> floor(d/c)<x for c>0
    rule(lt(idiv(xi, c0), c1), do_lt_div),                                         // x//c<d -> x<d*c for c>0, d>0
    rule(lt(xi, c0), do_lt_gcd),                                                   // x*4+y<8 -> x<2 for 0<=y<4
    rule(lt(xi * -1_c, yi * -1_c), lt(y, x), [](auto& m) {                         // -x<-y -> y<x
      return add_exact(m[x], 0) && add_exact(m[y], 0) && mul_exact(m[x], -1) && mul_exact(m[y], -1);
    }),
    rule(ne(xi + c0, c1), ne(x, c1 - c0)),                                          // x+c0!=c1 -> x!=c1-c0 (mod 2^n)
    rule(eq(xi + c0, c1), eq(x, c1 - c0)),                                          // x+c0==c1 -> x==c1-c0 (mod 2^n)
    rule(ne(xi * c0, c1), do_cmp_mul),                                              // x*c!=d -> True if c∤d else x!=d/c
    rule(eq(xi * c0, c1), do_cmp_mul),                                              // x*c==d -> False if c∤d else x==d/c
    rule(ne(lt(xi, c0), 1_c), do_not_lt),                                           // !(x<c) -> c-1<x
    rule(ne(lt(c0, xi), 1_c), do_not_lt));                                          // !(c<x) -> x<c+1

/** WHERE and MAX folding. */
inline constexpr auto sym_where = table(
    rule(where(ne(xb, 1_c), y, z), where(x, z, y)),                                 // where(!c,a,b) -> where(c,b,a)
    rule(where(x, where(x, y, z), w), where(x, y, w)),                              // where(c,where(c,a,b),d) -> where(c,a,d)
    rule(where(x, y, where(x, z, w)), where(x, y, w)),                              // where(c,a,where(c,b,d)) -> where(c,a,d)
    rule(where(x, where(y, z, w), w), where(x & y, z, w)),                          // where(a,where(b,c,d),d) -> where(a&b,c,d)
    rule(where(x, z, where(y, z, w)), where(x | y, z, w)),                          // where(a,c,where(b,c,d)) -> where(a|b,c,d)
    rule(where(lt(xi, y), y, xi), max_(x, y)),                                      // where(x<y,y,x) -> max(x,y)
    rule(where(x, c0, c1) + where(x, c2, c3), where(x, c0 + c2, c1 + c3)),          // where(c,a,b)+where(c,d,e) -> where(c,a+d,b+e)
    rule(where(x, yi, 0_c) + where(x, 0_c, z), where(x, y, z)),                     // where(c,a,0)+where(c,0,b) -> where(c,a,b)
    rule(where(x, c0, c1) + c2, where(x, c0 + c2, c1 + c2)),                        // where(c,a,b)+d -> where(c,a+d,b+d)
    rule(where(x, c0, c1) * c2, where(x, c0 * c2, c1 * c2)),                        // where(c,a,b)*d -> where(c,a*d,b*d)
    rule(lt(where(x, c0, c1), c2), where(x, lt(c0, c2), lt(c1, c2))),               // where(c,a,b)<d -> where(c,a<d,b<d)
    rule(ne(where(x, c0, c1), c2), where(x, ne(c0, c2), ne(c1, c2))),               // where(c,a,b)!=d -> where(c,a!=d,b!=d)
    rule(max_(xi, y), x, [](auto& m) { return known(m[y]) && m[x]->vmin() >= m[y]->vmax() && known(m[x]); }),  // max(x,y) -> x when x>=y
    rule(max_(xi, y), y, [](auto& m) { return known(m[y]) && m[x]->vmax() <= m[y]->vmin() && known(m[x]); })); // max(x,y) -> y when x<=y

/** Canonical order of commutative ops (last: like terms and constants are combined first). */
inline constexpr auto sym_order = table(
    rule(op<Ops::ADD>(x, y), do_order),    // b+a -> a+b by term order; (a+c)+b -> (a+b)+c; a+(b+c) -> (a+b)+c
    rule(op<Ops::MUL>(x, y), do_order),    // b*a -> a*b; chains as for ADD
    rule(op<Ops::AND>(x, y), do_order),    // b&a -> a&b; chains as for ADD
    rule(op<Ops::OR>(x, y), do_order),     // b|a -> a|b; chains as for ADD
    rule(op<Ops::XOR>(x, y), do_order),    // b^a -> a^b; chains as for ADD
    rule(op<Ops::MAX>(x, y), do_order),    // max(b,a) -> max(a,b) (ints); chains as for ADD
    rule(op<Ops::CMPNE>(x, y), do_order),  // b!=a -> a!=b
    rule(op<Ops::CMPEQ>(x, y), do_order)); // b==a -> a==b

}  // namespace tg::sym
#endif  // TG_SYMBOLIC_NO_TABLES
