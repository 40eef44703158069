// The kernel AST stage after rangeify (pm_kernel_ast): rules over one kernel's AST before it is cached and lowered.
#include "stages.hpp"
#include "tg/opt.hpp"

#include <algorithm>
#include <optional>
#include <unordered_set>

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

// A bool's conjuncts: the leaves of its AND tree (iterative).
std::vector<const UOp*> conjuncts(const UOp* c) {
  std::vector<const UOp*> out, stack{c};
  while (!stack.empty()) {
    const UOp* u = stack.back();
    stack.pop_back();
    if (u->op == Ops::AND && u->dtype == dtypes::bool_) stack.push_back(u->src(1)), stack.push_back(u->src(0));
    else out.push_back(u);
  }
  return out;
}

// A one-hot compare: (iota == e) with iota the RANGE r (or a cast of it that holds every index of r) and e
// independent of r, on either side. The operands as built go through reshapes (r // 1 % n, a load at
// (r + 50 q) // 50 % 1): each is simplified alone (simplifying the whole AST here disturbed the loads'
// valid-bounded indices). Returns e in r's dtype, or null.
UOpRef one_hot_index(const UOp* c, const UOp* r) {
  if (c->op != Ops::CMPEQ) return {};
  for (int side = 0; side < 2; side++) {
    UOpRef side_s = simplify(c->src()[size_t(side)]), other_s = simplify(c->src()[size_t(1 - side)]);
    const UOp* iota = strip_cast(side_s.get());
    const UOp* other = other_s.get();
    if (iota != r || depends_on(other, r)) continue;
    const UOp* cast = side_s.get();  // the iota's cast must not wrap: its dtype holds every index of r
    if (cast != r && (!dtypes::is_int(cast->dtype) || r->vmax() > dtypes::max_int(cast->dtype))) continue;
    return other->dtype == r->dtype ? UOpRef(other) : other->cast(r->dtype);
  }
  return {};
}

// The range a one-hot compare's iota side is (null for another compare).
const UOp* one_hot_range(const UOp* c) {
  for (int side = 0; side < 2; side++) {
    UOpRef s = simplify(c->src()[size_t(side)]);
    const UOp* iota = strip_cast(s.get());
    if (iota->op == Ops::RANGE && one_hot_index(c, iota)) return iota;
  }
  return nullptr;
}

// An index the kernel checks (the compare marked by its op, IndexCheck): where `bad`, the index e is outside [0, n).
struct PendingCheck {
  UOpRef bad, e, n;
  int64_t code;
};

// The check of a marked compare whose index is e and whose iota runs over r (none for an unmarked compare).
std::optional<PendingCheck> check_of(const UOp* c, const UOp* r, const UOpRef& e) {
  const auto* mark = std::get_if<std::vector<int64_t>>(&c->arg);
  if (!mark || mark->empty()) return {};
  UOpRef n = r->src()[0];  // bad: e < 0 or n - 1 < e
  UOpRef bad = e->alu(Ops::CMPLT, UOp::cnst_int(e->dtype, 0))
                   ->alu(Ops::OR, n->alu(Ops::ADD, UOp::cnst_int(n->dtype, -1))->alu(Ops::CMPLT, e));
  if (mark->size() > 1) bad = bad->alu(Ops::AND, e->alu(Ops::CMPNE, UOp::cnst_int(e->dtype, (*mark)[1])));
  return PendingCheck{bad, e, n, (*mark)[0]};
}

// Gather as a load: a sum over r of where(e == r & rest, x(r), 0), e independent of r, has one term:
// where(0 <= e < end(r) & rest(e), x(e), 0) (tinygrad's arange folding). index_select, gather, embeddings,
// advanced indexing (one compare per index tensor, ANDed) and one-hot picks written as one-hot reduces become
// indexed loads instead of a loop over every row; each fold of a marked compare checks its index.
UOpRef fold_one_hot_sum(const UOp* red, std::vector<PendingCheck>& checks) {
  if (Ops(std::get<int64_t>(red->arg)) != Ops::ADD) return {};
  const UOp* v = red->src(0);
  std::vector<const UOp*> casts;  // a sum accumulates in a wider dtype (uint8 rows sum as int64): cast(0) is 0
  while (v->op == Ops::CAST) casts.push_back(v), v = v->src(0);
  if (v->op != Ops::WHERE || !v->src(2)->is_const() || v->src(2)->const_float() != 0) return {};
  std::vector<const UOp*> conj = conjuncts(v->src(0));
  for (size_t k = 1; k < red->nsrc(); k++) {
    const UOp* r = red->src(k);
    if (r->op != Ops::RANGE) continue;
    for (size_t ci = 0; ci < conj.size(); ci++) {
      UOpRef e = one_hot_index(conj[ci], r);
      if (!e) continue;
      UOpRef valid = e->alu(Ops::CMPLT, r->src()[0])->alu(Ops::AND, UOp::cnst_int(r->dtype, -1)->alu(Ops::CMPLT, e));
      UOpRef cond = valid;
      for (size_t j = 0; j < conj.size(); j++)  // the other conjuncts at r = e
        if (j != ci) cond = cond->alu(Ops::AND, substitute_gated(UOpRef(conj[j]), r, e, valid));
      UOpRef x = substitute_gated(v->src()[1], r, e, valid);
      UOpRef nv = cond->alu(Ops::WHERE, x, v->src()[2]);
      if (auto chk = check_of(conj[ci], r, e)) checks.push_back(*chk);
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

// The diagnostic kernel of a check (IndexCheck, run only after its kernel hit): every point of the check's loops
// (the reduce loops too, as output loops) stores the index where it is out of range, INT64_MIN elsewhere, row-major
// into PARAM 0; PARAM 1.. are the checked kernel's parameters it reads (IndexDiag::params). None when a loop's
// extent is symbolic or there are more than 2^22 points (32 MiB of int64): the error then names the one index.
std::optional<IndexDiag> diag_of(const PendingCheck& c) {
  std::vector<const UOp*> ranges;
  for (const UOp* u : toposort(c.bad.get()))
    if (u->op == Ops::RANGE) ranges.push_back(u);
  std::stable_sort(ranges.begin(), ranges.end(), [](const UOp* a, const UOp* b) {
    bool ra = range_type(a) == AxisType::Reduce, rb = range_type(b) == AxisType::Reduce;
    return ra != rb ? rb : range_id(a) < range_id(b);
  });
  int64_t size = 1;
  std::vector<UOpRef> fresh;
  UOpRef flat = UOp::cnst_int(dtypes::index, 0);
  for (const UOp* r : ranges) {
    if (!r->src(0)->is_const()) return {};
    int64_t n = r->src(0)->const_int();
    if (n <= 0 || size > (int64_t(1) << 22) / n) return {};
    size *= n;
    fresh.push_back(UOp::range(r->src()[0], int64_t(fresh.size()), AxisType::Loop));
    UOpRef at = fresh.back()->dtype == dtypes::index ? fresh.back() : fresh.back()->cast(dtypes::index);
    flat = flat->alu(Ops::MUL, UOp::cnst_int(dtypes::index, n))->alu(Ops::ADD, at);
  }
  auto renamed = [&](const UOpRef& x) {
    return substitute(x, [&](const UOp* u) {
      auto it = std::find(ranges.begin(), ranges.end(), u);
      return it == ranges.end() ? UOpRef{} : fresh[size_t(it - ranges.begin())];
    });
  };
  UOpRef value = renamed(c.bad)->alu(Ops::WHERE, renamed(c.e)->cast(dtypes::int64), UOp::cnst_int(dtypes::int64, INT64_MIN));
  // its parameters: PARAM 0 the output, then the checked kernel's parameters it reads, in their order
  std::vector<const UOp*> reads;
  for (const UOp* u : toposort(value.get()))
    if (u->op == Ops::PARAM) reads.push_back(u);
  std::sort(reads.begin(), reads.end(), [](const UOp* a, const UOp* b) { return std::get<int64_t>(a->arg) < std::get<int64_t>(b->arg); });
  IndexDiag d{c.code, {}, size, {}};
  for (const UOp* u : reads) d.params.push_back(int(std::get<int64_t>(u->arg)));
  value = substitute(value, [&](const UOp* u) {
    auto it = std::find(reads.begin(), reads.end(), u);
    return it == reads.end() ? UOpRef{} : UOp::make(Ops::PARAM, u->dtype, {}, int64_t(it - reads.begin() + 1));
  });
  UOpRef out = UOp::make(Ops::PARAM, dtypes::int64.ptr_to(), {}, int64_t(0));
  UOpRef store = UOp::make(Ops::STORE, dtypes::void_, {UOp::make(Ops::INDEX, out->dtype, {out, simplify(flat)}), value});
  d.ast = UOp::make(Ops::SINK, dtypes::void_, {store});
  return d;
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

UOpRef kernel_ast_rules(const UOpRef& ast, int check_param, bool* index_check, std::vector<IndexDiag>* diags) {
  *index_check = false;
  bool has = false;  // only kernels with a one-hot compare
  for (const UOp* u : toposort(ast.get())) has |= u->op == Ops::CMPEQ;
  if (!has) return ast;
  KernelAstCtx ctx;
  UOpRef k = graph_rewrite(ast, pm_kernel_ast(), &ctx, false, "kernel ast");
  if (!ctx.folded) k = ast;  // a kernel with nothing to fold keeps its AST (and its cache keys) as built
  // The marked compares of ops that write through their mask (scatter, index_put: no sum folds) are checked
  // wherever the kernel evaluates them; those of the other ops where the kernel evaluates them outside any reduce:
  // a mask computed into a buffer (the realize map's choice for a small table, x of 3 rows: E_2_3 then a reduce
  // over it) is read by a sum that cannot fold, so its index is checked where the mask is stored.
  std::unordered_set<const UOp*> under_reduce;
  for (const UOp* u : toposort(k.get()))
    if (u->op == Ops::REDUCE)
      for (const UOp* v : toposort(u->src(0))) under_reduce.insert(v);
  for (const UOp* u : toposort(k.get())) {
    const auto* mark = u->op == Ops::CMPEQ ? std::get_if<std::vector<int64_t>>(&u->arg) : nullptr;
    if (!mark || mark->empty() || !IndexCheck::op_of((*mark)[0])) continue;
    if (!IndexCheck::op_of((*mark)[0])->unfolded && under_reduce.count(u)) continue;
    if (const UOp* r = one_hot_range(u))
      if (auto chk = check_of(u, r, one_hot_index(u, r))) ctx.checks.push_back(*chk);
  }
  if (ctx.checks.empty()) return k;
  // the checks store into the record, the kernel's last parameter (IndexCheck); one check per distinct condition
  UOpRef record = UOp::make(Ops::PARAM, dtypes::int64.ptr_to(), {}, int64_t(check_param));
  std::vector<UOpRef> sink(k->src().begin(), k->src().end());
  std::vector<const UOp*> seen;
  for (const PendingCheck& c : ctx.checks) {
    if (std::find(seen.begin(), seen.end(), c.bad.get()) != seen.end()) continue;
    seen.push_back(c.bad.get());
    for (UOpRef& st : check_stores(c, record)) sink.push_back(std::move(st));
    if (diags)
      if (auto d = diag_of(c)) diags->push_back(std::move(*d));
  }
  *index_check = true;
  return k->replace_src(sink);
}

}  // namespace tg::sched
