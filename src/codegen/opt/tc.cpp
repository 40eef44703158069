// Tensor cores (tinygrad: the TC opt and CUDA's tensor_cores): a half/bfloat16 matmul-shaped kernel
//   out[.., m, n] = f(sum_k x[.., m, k] * y[.., k, n])
// becomes warp-wide mma.sync m16n8k16 steps: one warp (32 work items, the LOCAL range `lane`) computes a 16x8
// tile of the output; each step multiplies a 16x16 tile of x by a 16x8 tile of y. Every work item loads its own
// fragment elements and stores its four results, at the places the PTX ISA's fragment tables give
// (g = lane / 4, t = lane % 4):
//   x element i (0..7): row m = g + 8*((i/2)%2), column k = 2t + i%2 + 8*(i/4)
//   y element j (0..3): row k = 2t + j%2 + 8*(j/2), column n = g
//   result c (0..3):    row m = g + 8*(c/2),     column n = 2t + c%2
// The WMMA node takes (x0..x7, y0..y3, acc0..acc3) and gives float32 x4; GEP picks one result. The reduction over
// the k tiles is four REDUCEs of GEP(WMMA(.., 0, 0, 0, 0), c); after expand_reduces, fuse_wmma_accumulators lets
// the WMMA add into the accumulators itself (D = A*B + C).
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "tg/opt.hpp"

namespace tg {

namespace {

UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }

bool is_16bit_float(DType d) { return d.count == 1 && (d.scalar == Scalar::Float16 || d.scalar == Scalar::BFloat16); }

struct TcMatch {
  const UOp* reduce = nullptr;
  const UOp* store = nullptr;
  const UOp *m = nullptr, *n = nullptr, *k = nullptr;  // output row, output column, reduce axis
  UOpRef x, y;                                         // the 16-bit operands (x depends on m and k, y on k and n)
};

// Strip a CAST from a 16-bit float to float32.
UOpRef operand(const UOp* u) {
  if (u->op == Ops::CAST && u->dtype == dtypes::float32 && is_16bit_float(u->src(0)->dtype)) return UOpRef(u->src(0));
  return UOpRef(u);
}

std::optional<TcMatch> find_tc(const UOpRef& ast, std::string& why) {
  TcMatch t;
  std::vector<const UOp*> outs, reduces, stores;
  for (const UOp* u : toposort(ast.get())) {
    if (u->op == Ops::REDUCE) reduces.push_back(u);
    if (u->op == Ops::STORE) stores.push_back(u);
    if (u->op == Ops::RANGE) {
      AxisType ty = range_type(u);
      if (ty == AxisType::Local || ty == AxisType::Group || ty == AxisType::Upcast || ty == AxisType::Unroll) {
        why = "the kernel already has LOCAL/GROUP/UPCAST/UNROLL opts (TC comes first)";
        return std::nullopt;
      }
      if (ty == AxisType::Loop || ty == AxisType::Global) outs.push_back(u);
    }
  }
  for (const UOp* o : outs)
    if (o->src(0)->op != Ops::CONST) {
      why = "an output size is symbolic (every output loop must become work-group indices)";
      return std::nullopt;
    }
  if (reduces.size() != 1 || stores.size() != 1) {
    why = "TC needs one reduce and one store";
    return std::nullopt;
  }
  const UOp* r = reduces[0];
  t.reduce = r;
  t.store = stores[0];
  if (std::get<int64_t>(r->arg) != int64_t(Ops::ADD) || !(r->dtype == dtypes::float32 || is_16bit_float(r->dtype))) {
    why = "the reduce is not a float sum";
    return std::nullopt;
  }
  if (r->nsrc() != 2 || r->src(1)->op != Ops::RANGE || r->src(1)->src(0)->op != Ops::CONST) {
    why = "TC needs exactly one reduce axis of constant size";
    return std::nullopt;
  }
  t.k = r->src(1);
  // sum(cast(x*y)) (a 16-bit product, as Tensor::sum writes it), sum(cast(x)*cast(y)) or a 16-bit sum of x*y.
  const UOp* s = r->src(0);
  if (s->op == Ops::CAST && s->dtype == dtypes::float32 && is_16bit_float(s->src(0)->dtype)) s = s->src(0);
  if (s->op != Ops::MUL) {
    why = "the reduced value is not a product";
    return std::nullopt;
  }
  UOpRef a = operand(s->src(0)), b = operand(s->src(1));
  if (!is_16bit_float(a->dtype) || !(a->dtype == b->dtype)) {
    why = "TC needs two float16 or two bfloat16 operands";
    return std::nullopt;
  }
  // m: an output axis only the first operand uses, n: one only the second uses (innermost of each).
  auto pick = [&](const UOpRef& p, const UOpRef& q, int64_t mult) -> const UOp* {
    const UOp* best = nullptr;
    for (const UOp* o : outs)
      if (depends_on(p.get(), o) && !depends_on(q.get(), o) && o->src(0)->op == Ops::CONST &&
          o->src(0)->const_int() % mult == 0 && (!best || range_id(o) > range_id(best)))
        best = o;
    return best;
  };
  // Either operand may be x; prefer n (a result's column pairs) on the innermost output axis.
  std::optional<TcMatch> best;
  for (int swap = 0; swap < 2; swap++) {
    TcMatch c = t;
    c.x = swap ? b : a;
    c.y = swap ? a : b;
    c.m = pick(c.x, c.y, 16);
    c.n = pick(c.y, c.x, 8);
    if (c.m && c.n && (!best || range_id(c.n) > range_id(best->n))) best = c;
  }
  if (best) t = *best;
  if (!best) {
    why = "no output axes of sizes divisible by 16 (rows) and 8 (columns) that only one operand uses";
    return std::nullopt;
  }
  if (t.k->src(0)->const_int() % 16 != 0) {
    why = "the reduce axis size " + std::to_string(t.k->src(0)->const_int()) + " is not divisible by 16";
    return std::nullopt;
  }
  if (!depends_on(t.x.get(), t.k) || !depends_on(t.y.get(), t.k)) {
    why = "an operand does not depend on the reduce axis";
    return std::nullopt;
  }
  return t;
}

}  // namespace

bool tc_fits(const UOpRef& ast) {
  std::string why;
  return find_tc(ast, why).has_value();
}

std::optional<std::pair<int, int>> tc_axes(const UOpRef& ast) {
  std::string why;
  auto t = find_tc(ast, why);
  if (!t) return std::nullopt;
  auto axes = kernel_axes(ast);
  auto pos = [&](const UOp* r) { return int(std::find(axes.begin(), axes.end(), r) - axes.begin()); };
  return std::make_pair(pos(t->m), pos(t->n));
}

UOpRef apply_tc(const UOpRef& ast) {
  std::string why;
  auto t = find_tc(ast, why);
  if (!t) throw OptError("[opt] Opt(TC): " + why);
  int64_t max_id = 0;
  for (const UOp* u : toposort(ast.get()))
    if (u->op == Ops::RANGE) max_id = std::max(max_id, range_id(u));
  auto sz = [](const UOp* r) { return r->src(0)->const_int(); };
  UOpRef lane = UOp::range(ci(32), max_id + 1, AxisType::Local);
  UOpRef mo = UOp::range(ci(sz(t->m) / 16), range_id(t->m), AxisType::Loop);
  UOpRef no = UOp::range(ci(sz(t->n) / 8), range_id(t->n), AxisType::Loop);
  UOpRef ko = UOp::range(ci(sz(t->k) / 16), range_id(t->k), AxisType::Reduce);
  UOpRef g = lane->alu(Ops::IDIV, ci(4)), tig = lane->alu(Ops::MOD, ci(4));
  auto at = [](const UOpRef& outer, int64_t tile, const UOpRef& inner) {
    return outer->alu(Ops::MUL, ci(tile))->alu(Ops::ADD, inner);
  };
  std::vector<UOpRef> srcs;
  for (int64_t i = 0; i < 8; i++) {  // x fragment
    UOpRef m = at(mo, 16, g->alu(Ops::ADD, ci(8 * ((i / 2) % 2))));
    UOpRef k = at(ko, 16, tig->alu(Ops::MUL, ci(2))->alu(Ops::ADD, ci(i % 2 + 8 * (i / 4))));
    srcs.push_back(substitute(t->x, {{t->m, m}, {t->k, k}}));
  }
  for (int64_t j = 0; j < 4; j++) {  // y fragment
    UOpRef k = at(ko, 16, tig->alu(Ops::MUL, ci(2))->alu(Ops::ADD, ci(j % 2 + 8 * (j / 2))));
    UOpRef n = at(no, 8, g);
    srcs.push_back(substitute(t->y, {{t->k, k}, {t->n, n}}));
  }
  for (int c = 0; c < 4; c++) srcs.push_back(UOp::cnst(dtypes::float32, 0.0));
  UOpRef w = UOp::make(Ops::WMMA, dtypes::float32.vec(4), srcs, std::string("m16n8k16"));
  std::vector<UOpRef> stores;
  for (int64_t c = 0; c < 4; c++) {
    UOpRef part = UOp::make(Ops::REDUCE, dtypes::float32,
                            {UOp::make(Ops::GEP, dtypes::float32, {w}, std::vector<int64_t>{c}), ko}, int64_t(Ops::ADD));
    if (!(t->reduce->dtype == dtypes::float32)) part = part->cast(t->reduce->dtype);
    UOpRef m = at(mo, 16, g->alu(Ops::ADD, ci(8 * (c / 2))));
    UOpRef n = at(no, 8, tig->alu(Ops::MUL, ci(2))->alu(Ops::ADD, ci(c % 2)));
    stores.push_back(substitute(UOpRef(t->store), {{t->reduce, part}, {t->m, m}, {t->n, n}}));
  }
  return ast->replace_src(stores);
}

UOpRef fuse_wmma_accumulators(const UOpRef& k) {
  // STORE(INDEX(acc, c), ADD(LOAD(INDEX(acc, c)), GEP(W, c))) for c = 0..3, W's accumulator sources zero
  //   -> W' = W with accumulators LOAD(INDEX(acc, c)); STORE(INDEX(acc, c), GEP(W', c))
  std::unordered_map<const UOp*, std::vector<const UOp*>> by_wmma;  // W -> its four update STOREs, by c
  for (const UOp* u : toposort(k.get())) {
    if (u->op != Ops::STORE || u->src(1)->op != Ops::ADD) continue;
    const UOp *add = u->src(1), *ld = add->src(0), *gep = add->src(1);
    if (gep->op != Ops::GEP) std::swap(ld, gep);
    if (gep->op != Ops::GEP || gep->src(0)->op != Ops::WMMA || ld->op != Ops::LOAD || ld->src(0) != u->src(0)) continue;
    const UOp* w = gep->src(0);
    int64_t c = std::get<std::vector<int64_t>>(gep->arg)[0];
    auto& v = by_wmma[w];
    v.resize(4, nullptr);
    v[size_t(c)] = u;
  }
  std::vector<std::pair<const UOp*, UOpRef>> repl;
  for (auto& [w, sts] : by_wmma) {
    bool ok = std::all_of(sts.begin(), sts.end(), [](const UOp* s) { return s != nullptr; });
    for (size_t c = 12; c < 16 && ok; c++) ok = w->src(c)->op == Ops::CONST && std::get<double>(w->src(c)->arg) == 0.0;
    if (!ok) continue;
    std::vector<UOpRef> s(w->src().begin(), w->src().end());
    for (size_t c = 0; c < 4; c++) s[12 + c] = UOpRef(sts[c]->src(1)->src(0)->op == Ops::LOAD ? sts[c]->src(1)->src(0)
                                                                                                : sts[c]->src(1)->src(1));
    UOpRef w2 = w->replace_src(s);
    for (size_t c = 0; c < 4; c++)
      repl.emplace_back(sts[c], UOp::make(Ops::STORE, dtypes::void_,
                                          {UOpRef(sts[c]->src(0)),
                                           UOp::make(Ops::GEP, dtypes::float32, {w2}, std::vector<int64_t>{int64_t(c)})}));
  }
  return repl.empty() ? k : substitute(k, repl);
}

}  // namespace tg
