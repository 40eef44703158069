// Stage "bounds" of the scheduler: facts the tensor graph shows and a kernel no longer does, written into the graph
// where the lowering reads them.
//
// x - max(x) along the reduced axes is <= 0 (or NaN): each element is at most its row's maximum. Inside a kernel the
// two sides are a load and a reduce over other indices, or a load of a buffer another kernel wrote; here they are one
// node x and REDUCE_AXIS(MAX, x) broadcast back over the reduced axes. An exp2 of that difference (times a positive
// constant, as exp writes it) gets the bound as a clamp at 0, min(d, 0) written where(0 < d, 0, d): the exp2
// decomposition (src/codegen/transcendental.cpp, nonpositive) reads it and drops its own upper clamp and its two-step
// scale (one min for 8 ops). The clamp changes no value, NaN included, so it is done for every such exp2 (softmax,
// log_softmax, logsumexp, cross-entropy) and none is written in the front end.
#include "stages.hpp"

namespace tg::sched {

namespace {

// Whether e is -EXPAND(REDUCE_AXIS(MAX, x)) (the NEG on either side of the EXPAND, DETACHes anywhere): the negated
// row maximum of x broadcast over x, or -x. The ADD that reads e and x is elementwise, so the EXPAND restores exactly
// the reduced axes.
bool neg_expanded_max_of(const UOp* e, const UOp* x) {
  bool neg = false, expand = false;
  for (;; e = e->src(0)) {
    if (e->op == Ops::NEG && !neg) neg = true;
    else if (e->op == Ops::EXPAND && !expand) expand = true;  // a symbolic shape's sints are its other sources
    else if (e->op != Ops::DETACH) break;
  }
  if (neg && e == x) return true;  // x - x (a maximum over size-1 axes is x itself): 0 or NaN
  return neg && e->op == Ops::REDUCE_AXIS && std::get<ReduceArg>(e->arg).op == Ops::MAX && e->src(0) == x;
}

// The constant c of a broadcast constant (movement ops over a CONST), if it is one.
const UOp* broadcast_const(const UOp* u) {
  while (is_movement(u->op)) u = u->src(0);
  return u->is_const() ? u : nullptr;
}

// The same broadcast with the constant v: the shape of the multiplier it stands beside.
UOpRef with_value(const UOp* u, double v) {
  if (u->is_const()) return UOp::cnst(u->dtype, v);
  std::vector<UOpRef> src(u->src().begin(), u->src().end());
  src[0] = with_value(u->src(0), v);
  return UOp::make(u->op, u->dtype, std::move(src), u->arg);
}

// d = x + -max(x) (either order): the clamped d, or null.
UOpRef clamp_row_diff(const UOp* d, const UOp* like) {
  if (d->op != Ops::ADD || !dtypes::is_float(d->dtype)) return {};
  if (!neg_expanded_max_of(d->src(1), d->src(0)) && !neg_expanded_max_of(d->src(0), d->src(1))) return {};
  UOpRef zero = with_value(like, 0);
  return zero->alu(Ops::CMPLT, d->ref())->alu(Ops::WHERE, zero, d->ref());  // min(d, 0)
}

// exp2(d * c): the same with d clamped at 0 when d is x - max(x) and c a positive constant (either order), or null.
UOpRef do_bound_exp2(const UOp* d, const UOp* c) {
  const UOp* k = broadcast_const(c);
  if (!k || !(k->const_float() > 0)) return {};
  UOpRef clamped = clamp_row_diff(d, c);
  return clamped ? clamped->alu(Ops::MUL, c->ref())->alu(Ops::EXP2) : UOpRef{};
}

const PatternMatcher& pm_bounds() {
  using namespace pat;
  static const PatternMatcher pm(table(
      // exp2((x - max(x)) * c), c > 0 -> exp2(min(x - max(x), 0) * c)
      rule(op<Ops::EXP2>(op<Ops::MUL>(x, y)), [](auto& m) -> UOpRef {
        UOpRef r = do_bound_exp2(m[x], m[y]);
        return r ? r : do_bound_exp2(m[y], m[x]);
      })));
  return pm;
}

}  // namespace

std::vector<UOpRef> apply_bounds(std::span<const UOpRef> roots) {
  return rewrite_roots(roots, pm_bounds(), nullptr, "bounds");
}

}  // namespace tg::sched
