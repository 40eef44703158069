// The expander: UPCAST and UNROLL ranges leave the graph here. A node that depends on such ranges is replicated
// once per combination of their values (the range becomes a constant in each copy). A REDUCE over an UNROLL range
// becomes one REDUCE per value of it (independent accumulators that share one loop), combined after the loop.
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "expander.hpp"
#include "tg/pattern.hpp"

namespace tg {

namespace {

bool is_expanded(const UOp* u) {
  return u->op == Ops::RANGE && (range_type(u) == AxisType::Upcast || range_type(u) == AxisType::Unroll);
}

using Env = std::unordered_map<const UOp*, int64_t>;

// Every combination of values of `rs` (each RANGE over [0, size)), added to `base`.
std::vector<Env> combinations(const std::vector<const UOp*>& rs, const Env& base) {
  std::vector<Env> out{base};
  for (const UOp* r : rs) {
    int64_t n = r->src(0)->const_int();
    std::vector<Env> next;
    for (const Env& e : out)
      for (int64_t v = 0; v < n; v++) {
        Env x = e;
        x[r] = v;
        next.push_back(std::move(x));
      }
    out = std::move(next);
  }
  return out;
}

class Expander {
 public:
  explicit Expander(const UOpRef& root) {
    for (const UOp* n : toposort(root.get())) {
      std::vector<const UOp*> d;
      auto add = [&](const UOp* r) {
        if (std::find(d.begin(), d.end(), r) == d.end()) d.push_back(r);
      };
      if (is_expanded(n)) add(n);
      for (size_t k = 0; k < n->nsrc(); k++) {
        if (n->op == Ops::REDUCE && k > 0) continue;  // the REDUCE's own ranges
        for (const UOp* r : deps_[n->src(k)]) {
          if (n->op == Ops::REDUCE && std::find(n->src().begin() + 1, n->src().end(), UOpRef(r)) != n->src().end())
            continue;
          add(r);
        }
      }
      // Later opts vary slowest: the first upcast (the vector axis) is contiguous in the copies.
      std::sort(d.begin(), d.end(), [](const UOp* a, const UOp* b) { return range_id(a) > range_id(b); });
      deps_[n] = std::move(d);
      // A REDUCE over an UNROLL range changes even where no copies depend on it, and so does all above it.
      bool changes = n->op == Ops::REDUCE && std::any_of(n->src().begin() + 1, n->src().end(),
                                                         [](const UOpRef& r) { return is_expanded(r.get()); });
      for (const UOpRef& x : n->src()) changes |= changes_.count(x.get()) > 0;
      if (changes) changes_.insert(n);
    }
  }

  const std::vector<const UOp*>& deps(const UOp* n) { return deps_[n]; }

  UOpRef expand(const UOp* n, const Env& env) {
    const auto& d = deps_[n];
    if (d.empty() && !changes_.count(n)) return UOpRef(n);
    std::vector<int64_t> key;
    for (const UOp* r : d) key.push_back(env.at(r));
    auto mk = std::make_pair(n, key);
    if (auto it = memo_.find(mk); it != memo_.end()) return it->second;
    UOpRef res;
    if (is_expanded(n)) {
      res = UOp::cnst_int(n->dtype, env.at(n));
    } else if (n->op == Ops::REDUCE) {
      std::vector<const UOp*> unrolled;
      std::vector<UOpRef> rest;
      for (size_t k = 1; k < n->nsrc(); k++)
        if (is_expanded(n->src(k))) unrolled.push_back(n->src(k));
        else if (n->src(k)->op == Ops::RANGE && !(n->src(k)->src(0)->is_const() && n->src(k)->src(0)->const_int() == 1))
          rest.push_back(n->src(k));  // a loop of 1 (an UNROLL of the whole axis) is no loop: the copies are the values
      Ops op = Ops(std::get<int64_t>(n->arg));
      std::vector<UOpRef> parts;
      for (const Env& e : combinations(unrolled, env)) {
        UOpRef v = expand(n->src(0), e);
        if (!rest.empty()) {
          std::vector<UOpRef> s{v};
          s.insert(s.end(), rest.begin(), rest.end());
          v = UOp::make(Ops::REDUCE, n->dtype, s, n->arg);
        }
        parts.push_back(v);
      }
      res = reduce_tree(op, std::move(parts));
    } else {
      std::vector<UOpRef> s;
      for (const UOpRef& x : n->src()) s.push_back(expand(x.get(), env));
      res = n->replace_src(s);
    }
    memo_[mk] = res;
    return res;
  }

 private:
  std::unordered_map<const UOp*, std::vector<const UOp*>> deps_;
  std::unordered_set<const UOp*> changes_;
  std::map<std::pair<const UOp*, std::vector<int64_t>>, UOpRef> memo_;
};

// A 16-, 32- or 64-bit element (not bool): what a vector load or store of the vectorize stage moves.
bool wide_elements(DType d) {
  int bits = d.scalar_type().bitsize();
  return !d.ptr && !dtypes::is_bool(d) && (bits == 16 || bits == 32 || bits == 64);
}

bool is_lane(const UOpRef& r) { return r->op == Ops::RANGE && range_type(r.get()) == AxisType::Lane; }

// REDUCE(x, ..., lane, r...) -> REDUCE(x, ..., r..., lane): the lane loop innermost.
const PatternMatcher& pm_lanes_last() {
  using namespace pat;
  static const PatternMatcher pm(table(rule(op_any<opset<Ops::REDUCE>>, [](auto& m) -> UOpRef {
    const UOp* r = m.root;
    std::vector<UOpRef> src(r->src().begin(), r->src().end());
    if (src.size() < 3 || is_lane(src.back()) || std::none_of(src.begin() + 1, src.end(), is_lane)) return {};
    std::stable_partition(src.begin() + 1, src.end(), [](const UOpRef& x) { return !is_lane(x); });
    return r->replace_src(src);
  })));
  return pm;
}

// An UNROLL range whose REDUCEs have no other UNROLL and no REDUCE over it inside becomes a Lane range (not copied),
// moved last among each REDUCE's ranges (the innermost loop; each lane still sums in the same order).
UOpRef lanes_from_unrolls(const UOpRef& ast, bool packs, bool pack_rows, bool* kept) {
  std::unordered_map<const UOp*, std::vector<const UOp*>> reduces_of;
  for (const UOp* n : toposort(ast.get()))
    if (n->op == Ops::REDUCE)
      for (size_t k = 1; k < n->nsrc(); k++)
        if (n->src(k)->op == Ops::RANGE && range_type(n->src(k)) == AxisType::Unroll) reduces_of[n->src(k)].push_back(n);
  std::unordered_map<const UOp*, UOpRef> lane;
  for (const auto& [u, rs] : reduces_of) {
    bool ok = true;
    for (const UOp* r : rs) {
      int expanded = 0;
      for (size_t k = 1; k < r->nsrc(); k++) expanded += is_expanded(r->src(k));
      ok &= expanded == 1;
      for (const UOp* b : toposort(r->src(0)))  // a REDUCE inside may only be one computed outside this loop
        if (b->op == Ops::REDUCE) ok &= !depends_on(b, u);
    }
    if (ok) lane[u] = UOp::range(UOpRef(u->src()[0]), range_id(u), AxisType::Lane);
  }
  // The UPCAST every store is contiguous in, when no REDUCE depends on it (an elementwise kernel, the output loop
  // of a row kernel), every memory access is contiguous in it or does not use it, no load's gate depends on it (a
  // store's may: PADTO's, which LLVM's vectoriser masks; a gated store is never packed below) and its size is a
  // power of two or a multiple of 8 (run as vectors of lane_vector_width): an innermost Lane loop around
  // the stores (SLP left a softmax's output loop as 16 scalar exps, and a padded 24-channel row as 24 branches, one
  // per gated load). Index arithmetic that is not linear in it (a pool's gradient, with divisions and gates) stays
  // with copies, where each copy's index folds to constants (as a Lane loop it is computed per lane at run time).
  // Where the lowering packs copies into vector ops (`packs`: the vectorize stage, a renderer with vectors), an
  // elementwise kernel whose values are all 16-, 32- or 64-bit (or bool) and whose stores are ungated keeps its
  // copies: vector loads, ops and stores of the machine's width in tg's IR, not a loop left to LLVM's vectoriser. A
  // load's gate does not depend on the picked axis (above): the copies' loads are one vector LOAD under that gate,
  // one branch per vector (as a Lane loop LLVM masks each lane, its masks recomputed per vector on AVX-512).
  {
    std::vector<const UOp*> reduces, upcasts, indexes, gates;
    for (const UOp* n : toposort(ast.get())) {
      if (n->op == Ops::REDUCE) reduces.push_back(n);
      if (n->op == Ops::RANGE && range_type(n) == AxisType::Upcast) upcasts.push_back(n);
      if (n->op == Ops::INDEX && n->src(0)->op == Ops::PARAM) indexes.push_back(n->src(1));
      if (n->op == Ops::LOAD && n->nsrc() == 3) gates.push_back(n->src(2));
      if ((n->op == Ops::LOAD && !wide_elements(n->dtype)) ||
          (n->op == Ops::STORE && (n->nsrc() != 2 || !wide_elements(n->src(1)->dtype))) ||
          (n->op == Ops::INDEX && n->nsrc() != 2))
        packs = false;  // only ungated stores are packed into vector ones (a load's gate: not the picked axis')
      DType d = n->dtype;
      if (!d.ptr && d.scalar != Scalar::Void && d.scalar != Scalar::Index && !dtypes::is_bool(d) && !wide_elements(d))
        packs = false;  // nor values of 8 bits
    }
    packs &= reduces.empty() || pack_rows;  // a row kernel's output loop: where its stores go past the caches
    const UOp* pick = nullptr;
    int found = 0;
    for (const UOp* u : upcasts) {
      int64_t n = u->src(0)->const_int();
      bool ok = !ast->src().empty() && ((n & (n - 1)) == 0 || lane_vector_width(n) >= 8);
      for (const UOpRef& st : ast->src()) {
        auto c = st->op == Ops::STORE ? index_coef(st->src(0)->src(1), u) : std::nullopt;
        ok &= c && *c == 1;
      }
      for (const UOp* i : indexes) {
        auto c = ok ? index_coef(i, u) : std::nullopt;
        ok &= c && (*c == 0 || *c == 1);
      }
      for (const UOp* g : gates) ok &= ok && !depends_on(g, u);
      for (const UOp* r : reduces) ok &= ok && !depends_on(r, u);
      if (ok) pick = u, found++;
    }
    // ... and whose values read the axis only through memory (an arange's or threefry's counter lanes would be
    // gathered: the simplifier folds each copy's constant differently, and the copies stop being one op)
    auto only_indexed = [&](const UOp* u) {
      std::unordered_set<const UOp*> index_nodes;
      for (const UOp* i : indexes)
        for (const UOp* x : toposort(i)) index_nodes.insert(x);
      for (const UOp* n : toposort(ast.get())) {
        if (n->op == Ops::INDEX || index_nodes.count(n)) continue;
        for (const UOpRef& x : n->src())
          if (x->op != Ops::INDEX && index_nodes.count(x.get()) && depends_on(x.get(), u)) return false;
      }
      return true;
    };
    if (found == 1 && packs && only_indexed(pick)) *kept = true;
    else if (found == 1) lane[pick] = UOp::range(UOpRef(pick->src()[0]), range_id(pick), AxisType::Lane);
  }
  if (lane.empty()) return ast;
  std::vector<std::pair<const UOp*, UOpRef>> map(lane.begin(), lane.end());
  return graph_rewrite(substitute(ast, map), pm_lanes_last(), nullptr, false, "lanes last");
}

}  // namespace

UOpRef reduce_tree(Ops op, std::vector<UOpRef> xs) {
  // Halving: x[i] with x[i + n/2], so each level is one vector op on the halves of a vector of lanes (a pairwise
  // tree of neighbours needs a shuffle per level; LLVM left it scalar).
  while (xs.size() > 1) {
    size_t h = xs.size() / 2;
    std::vector<UOpRef> next;
    for (size_t i = 0; i < h; i++) next.push_back(xs[i]->alu(op, xs[i + h]));
    if (xs.size() % 2) next.push_back(xs.back());
    xs = std::move(next);
  }
  return xs[0];
}

UOpRef expand_upcasts(const UOpRef& ast_in, bool lanes, bool packs, bool* kept_copies, bool pack_rows) {
  bool kept = false;
  if (kept_copies) *kept_copies = false;
  bool any = false;
  for (const UOp* n : toposort(ast_in.get())) any |= is_expanded(n);
  if (!any) return ast_in;
  UOpRef ast = lanes ? lanes_from_unrolls(ast_in, packs, pack_rows, &kept) : ast_in;
  if (kept_copies) *kept_copies = kept;
  Expander ex(ast);
  std::vector<UOpRef> srcs;
  for (const UOpRef& st : ast->src())
    for (const Env& e : combinations(ex.deps(st.get()), {})) srcs.push_back(ex.expand(st.get(), e));
  return ast->replace_src(srcs);
}

UOpRef expand_upcasts(const UOpRef& ast, bool lanes) { return expand_upcasts(ast, lanes, false, nullptr); }

}  // namespace tg
