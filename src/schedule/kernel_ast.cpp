// The kernel AST stage after rangeify (pm_kernel_ast): rules over one kernel's AST before it is cached and lowered.
#include "stages.hpp"
#include "tg/opt.hpp"

namespace tg::sched {

namespace {

const UOp* strip_cast(const UOp* u) { return u->op == Ops::CAST ? u->src(0) : u; }

// `x` with the range r replaced by e; every load whose address changes is gated by `valid` (e may lie outside r).
UOpRef substitute_gated(const UOpRef& x, const UOp* r, const UOpRef& e, const UOpRef& valid) {
  return substitute(
      x, [&](const UOp* u) { return u == r ? e : UOpRef{}; },
      [&](const UOp* u, std::span<const UOpRef> src) {
        if (u->op != Ops::LOAD) return u->replace_src(src);
        UOpRef gate = u->nsrc() == 3 ? src[2]->alu(Ops::AND, valid) : valid;
        return UOp::make(Ops::LOAD, u->dtype, {src[0], u->nsrc() == 3 ? src[1] : UOp::cnst(u->dtype, 0), gate});
      });
}

// Gather as a load: a sum over r of where(e == r, x(r), 0), e independent of r, has one term: x(e) where
// 0 <= e < end(r), else 0 (tinygrad's arange folding). index_select, gather, embeddings and one-hot picks written
// as one-hot reduces become indexed loads instead of a loop over every row.
UOpRef fold_one_hot_sum(const UOp* red) {
  if (Ops(std::get<int64_t>(red->arg)) != Ops::ADD) return {};
  const UOp* v = red->src(0);
  std::vector<const UOp*> casts;  // a sum accumulates in a wider dtype (uint8 rows sum as int64): cast(0) is 0
  while (v->op == Ops::CAST) casts.push_back(v), v = v->src(0);
  if (v->op != Ops::WHERE || !v->src(2)->is_const() || v->src(2)->const_float() != 0) return {};
  const UOp* c = v->src(0);
  if (c->op != Ops::CMPEQ) return {};
  for (size_t k = 1; k < red->nsrc(); k++) {
    const UOp* r = red->src(k);
    if (r->op != Ops::RANGE) continue;
    for (int side = 0; side < 2; side++) {
      // the index side as built goes through the arange's reshapes (r // 1 % n ...): simplified here, alone
      // the compare's operands as built go through reshapes (r // 1 % n, a load at (r + 50 q) // 50 % 1): each is
      // simplified alone (simplifying the whole AST here disturbed the loads' valid-bounded indices)
      UOpRef side_s = simplify(c->src()[size_t(side)]), other_s = simplify(c->src()[size_t(1 - side)]);
      const UOp* iota = strip_cast(side_s.get());
      const UOp* other = other_s.get();
      if (iota != r || depends_on(other, r)) continue;
      // the iota's cast must not wrap: its dtype holds every index of r
      const UOp* cast = side_s.get();
      if (cast != r && (!dtypes::is_int(cast->dtype) || r->vmax() > dtypes::max_int(cast->dtype))) continue;
      UOpRef e = other->dtype == r->dtype ? UOpRef(other) : other->cast(r->dtype);
      UOpRef valid = e->alu(Ops::CMPLT, r->src()[0])->alu(Ops::AND, UOp::cnst_int(r->dtype, -1)->alu(Ops::CMPLT, e));
      UOpRef x = substitute_gated(v->src()[1], r, e, valid);
      UOpRef nv = valid->alu(Ops::WHERE, x, v->src()[2]);
      for (size_t j = casts.size(); j-- > 0;) nv = nv->cast(casts[j]->dtype);
      std::vector<UOpRef> rest{nv};
      for (size_t j = 1; j < red->nsrc(); j++)
        if (j != k) rest.push_back(red->src()[j]);
      return rest.size() == 1 ? nv : UOp::make(Ops::REDUCE, red->dtype, rest, red->arg);
    }
  }
  return {};
}

struct KernelAstCtx {
  int folded = 0;
};

/** The kernel AST stage after rangeify: one-hot sums become indexed loads. */
const PatternMatcher& pm_kernel_ast() {
  using namespace pat;
  static const PatternMatcher pm(table(rule(op_any<opset<Ops::REDUCE>>, [](auto& m) -> UOpRef {
    UOpRef r = fold_one_hot_sum(m.root);
    if (r) m.template ctx<KernelAstCtx>().folded++;
    return r;
  })));
  return pm;
}

}  // namespace

UOpRef kernel_ast_rules(const UOpRef& ast) {
  bool has = false;  // only kernels with a one-hot compare inside a reduce
  for (const UOp* u : toposort(ast.get())) has |= u->op == Ops::CMPEQ;
  if (!has) return ast;
  KernelAstCtx ctx;
  UOpRef k = graph_rewrite(ast, pm_kernel_ast(), &ctx, false, "kernel ast");
  return ctx.folded ? k : ast;  // a kernel with nothing to fold keeps its AST (and its cache keys) as built
}

}  // namespace tg::sched
