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
// An index the fold checks (the compare marked by its op, IndexCheck): where `bad`, the index e is outside [0, n).
struct PendingCheck {
  UOpRef bad, e, n;
  int64_t code;
};

UOpRef fold_one_hot_sum(const UOp* red, std::vector<PendingCheck>& checks) {
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
      if (const auto* mark = std::get_if<std::vector<int64_t>>(&c->arg); mark && !mark->empty()) {
        UOpRef n = r->src()[0];  // bad: e < 0 or n - 1 < e
        UOpRef bad = e->alu(Ops::CMPLT, UOp::cnst_int(e->dtype, 0))
                         ->alu(Ops::OR, n->alu(Ops::ADD, UOp::cnst_int(n->dtype, -1))->alu(Ops::CMPLT, e));
        if (mark->size() > 1) bad = bad->alu(Ops::AND, e->alu(Ops::CMPNE, UOp::cnst_int(e->dtype, (*mark)[1])));
        checks.push_back({bad, e, r->src()[0], (*mark)[0]});
      }
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
  std::vector<PendingCheck> checks;
};

// The hit record's stores for one check: {code + 1, e, n} where the index is bad. A check under reduce loops
// (a class label read in a loss summed over the batch) reduces over them first: the stores sit in output loops only.
std::vector<UOpRef> check_stores(const PendingCheck& c, const UOpRef& record) {
  std::vector<UOpRef> reduce_ranges;
  for (const UOp* u : toposort(c.bad.get()))
    if (u->op == Ops::RANGE && range_type(u) == AxisType::Reduce) reduce_ranges.emplace_back(u);
  UOpRef e = c.e->cast(dtypes::int64), gate = c.bad;
  if (!reduce_ranges.empty()) {
    auto reduce_max = [&](const UOpRef& x) {
      std::vector<UOpRef> src{x};
      src.insert(src.end(), reduce_ranges.begin(), reduce_ranges.end());
      return UOp::make(Ops::REDUCE, x->dtype, src, int64_t(Ops::MAX));
    };
    UOpRef hit = reduce_max(c.bad->alu(Ops::WHERE, UOp::cnst_int(dtypes::int32, 1), UOp::cnst_int(dtypes::int32, 0)));
    e = reduce_max(c.bad->alu(Ops::WHERE, e, UOp::cnst_int(dtypes::int64, INT64_MIN)));
    gate = UOp::cnst_int(dtypes::int32, 0)->alu(Ops::CMPLT, hit);
  }
  std::vector<UOpRef> vals{UOp::cnst_int(dtypes::int64, c.code + 1), e, c.n->cast(dtypes::int64)};
  std::vector<UOpRef> stores;
  for (size_t i = 0; i < vals.size(); i++) {
    UOpRef at = UOp::make(Ops::INDEX, record->dtype, {record, UOp::cnst_int(dtypes::index, int64_t(i))});
    stores.push_back(UOp::make(Ops::STORE, dtypes::void_, {at, vals[i], gate}));
  }
  return stores;
}

/** The kernel AST stage after rangeify: one-hot sums become indexed loads. */
const PatternMatcher& pm_kernel_ast() {
  using namespace pat;
  static const PatternMatcher pm(table(rule(op_any<opset<Ops::REDUCE>>, [](auto& m) -> UOpRef {
    auto& ctx = m.template ctx<KernelAstCtx>();
    UOpRef r = fold_one_hot_sum(m.root, ctx.checks);
    if (r) ctx.folded++;
    return r;
  })));
  return pm;
}

}  // namespace

UOpRef kernel_ast_rules(const UOpRef& ast, int check_param, bool* index_check) {
  *index_check = false;
  bool has = false;  // only kernels with a one-hot compare inside a reduce
  for (const UOp* u : toposort(ast.get())) has |= u->op == Ops::CMPEQ;
  if (!has) return ast;
  KernelAstCtx ctx;
  UOpRef k = graph_rewrite(ast, pm_kernel_ast(), &ctx, false, "kernel ast");
  if (!ctx.folded) return ast;  // a kernel with nothing to fold keeps its AST (and its cache keys) as built
  if (ctx.checks.empty()) return k;
  // the checks store into the record, the kernel's last parameter (IndexCheck)
  UOpRef record = UOp::make(Ops::PARAM, dtypes::int64.ptr_to(), {}, int64_t(check_param));
  std::vector<UOpRef> sink(k->src().begin(), k->src().end());
  for (const PendingCheck& c : ctx.checks)
    for (UOpRef& st : check_stores(c, record)) sink.push_back(std::move(st));
  *index_check = true;
  return k->replace_src(sink);
}

}  // namespace tg::sched
