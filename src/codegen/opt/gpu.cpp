// GPU optimisations: the hand-coded heuristic for renderers with work groups (OpenCL, CUDA), and the lowering of
// grouped reductions (GROUP/GROUPTOP) to local memory and a barrier (tinygrad: heuristic.py's GPU part, and the
// group-reduce lowering in codegen).
#include <algorithm>
#include <functional>
#include <optional>
#include <unordered_map>

#include "tg/opt.hpp"
#include "tg/symbolic.hpp"

namespace tg {

namespace {

UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }

bool is_out(AxisType t) { return t == AxisType::Loop || t == AxisType::Global; }

// Whether `r` enters the index expression `e` with coefficient 1 (neighbouring values of r: neighbouring
// addresses); only sums and constant multiples are followed.
bool unit_stride(const UOp* e, const UOp* r) {
  std::function<std::optional<int64_t>(const UOp*)> coef = [&](const UOp* x) -> std::optional<int64_t> {
    if (x == r) return 1;
    if (!depends_on(x, r)) return 0;
    if (x->op == Ops::ADD) {
      auto a = coef(x->src(0)), b = coef(x->src(1));
      if (!a || !b) return std::nullopt;
      return *a + *b;
    }
    if (x->op == Ops::MUL)
      for (int k = 0; k < 2; k++)
        if (x->src(size_t(1 - k))->op == Ops::CONST) {
          auto a = coef(x->src(size_t(k)));
          if (!a) return std::nullopt;
          return *a * x->src(size_t(1 - k))->const_int();
        }
    return std::nullopt;
  };
  auto c = coef(e);
  return c && *c == 1;
}

}  // namespace

UOpRef lower_group_reduces(const UOpRef& ast) {
  std::vector<const UOp*> items, reds;  // work-item ranges (LOCAL and GROUP), grouped REDUCEs
  int64_t next_id = 0;
  for (const UOp* u : toposort(ast.get())) {
    if (u->op == Ops::RANGE) {
      next_id = std::max(next_id, range_id(u) + 1);
      if (range_type(u) == AxisType::Local || range_type(u) == AxisType::Group) items.push_back(u);
    }
    if (u->op == Ops::REDUCE)
      for (size_t k = 1; k < u->nsrc(); k++)
        if (u->src(k)->op == Ops::RANGE && range_type(u->src(k)) == AxisType::Group) {
          reds.push_back(u);
          break;
        }
  }
  if (reds.empty()) return ast;
  std::sort(items.begin(), items.end(), [](const UOp* a, const UOp* b) { return range_id(a) < range_id(b); });
  items.erase(std::unique(items.begin(), items.end()), items.end());
  // One slot per work item: the flattened index over every work-item range of the kernel.
  UOpRef slot = ci(0);
  int64_t slots = 1;
  for (size_t i = items.size(); i-- > 0;) {
    slot = slot->alu(Ops::ADD, UOpRef(items[i])->alu(Ops::MUL, ci(slots)));
    slots *= items[i]->src(0)->const_int();
  }
  std::vector<std::pair<const UOp*, UOpRef>> repl;
  int64_t next_local = 0;
  for (const UOp* r : reds) {
    std::vector<UOpRef> groups, rest;
    for (size_t k = 1; k < r->nsrc(); k++) {
      const UOp* x = r->src(k);
      (x->op == Ops::RANGE && range_type(x) == AxisType::Group ? groups : rest).push_back(UOpRef(x));
    }
    // Every item must reach the barrier once per kernel: the reduce may not sit inside another (serial) loop,
    // i.e. its value may depend on no reduce range but its own (an inner REDUCE's own ranges are closed by it).
    std::unordered_map<const UOp*, std::vector<const UOp*>> open;
    for (const UOp* n : toposort(r->src(0))) {
      std::vector<const UOp*> o;
      if (n->op == Ops::RANGE && range_type(n) == AxisType::Reduce) o.push_back(n);
      for (size_t k = 0; k < n->nsrc(); k++)
        for (const UOp* x : open[n->src(k)])
          if (std::find(o.begin(), o.end(), x) == o.end() &&
              !(n->op == Ops::REDUCE && std::find(n->src().begin() + 1, n->src().end(), UOpRef(x)) != n->src().end()))
            o.push_back(x);
      open[n] = std::move(o);
    }
    for (const UOp* x : open[r->src(0)])
      if (std::find(rest.begin(), rest.end(), UOpRef(x)) == rest.end())
        throw OptError("[opt] GROUP: the grouped reduce lies inside another reduce's loop (its local memory and "
                       "barrier would be reused by every iteration); group the outer reduce instead");
    std::vector<UOpRef> ps{UOpRef(r->src(0))};
    ps.insert(ps.end(), rest.begin(), rest.end());
    UOpRef partial = rest.empty() ? UOpRef(r->src(0)) : UOp::make(Ops::REDUCE, r->dtype, ps, r->arg);
    UOpRef smem = UOp::make(Ops::DEFINE_LOCAL, r->dtype.ptr_to(slots, AddrSpace::Local), {}, next_local++);
    UOpRef st = UOp::make(Ops::STORE, dtypes::void_, {UOp::make(Ops::INDEX, smem->dtype, {smem, slot}), partial});
    UOpRef bar = UOp::make(Ops::BARRIER, dtypes::void_, {st});
    // Each item then reduces the group's partials itself (all compute the same value).
    std::vector<std::pair<const UOp*, UOpRef>> fresh;
    std::vector<UOpRef> fs;
    for (const UOpRef& g : groups) {
      fs.push_back(UOp::range(UOpRef(g->src()[0]), next_id++, AxisType::Reduce));
      fresh.emplace_back(g.get(), fs.back());
    }
    UOpRef ld = UOp::make(Ops::LOAD, r->dtype,
                          {UOp::make(Ops::INDEX, smem->dtype,
                                     {UOp::make(Ops::AFTER, smem->dtype, {smem, bar}), substitute(slot, fresh)})});
    std::vector<UOpRef> fsrc{ld};
    fsrc.insert(fsrc.end(), fs.begin(), fs.end());
    repl.emplace_back(r, UOp::make(Ops::REDUCE, r->dtype, fsrc, r->arg));
  }
  // Only the group's first item stores (all compute the same values; another item's late reads of a buffer that
  // is also the output, as in an in-place update, must not see the stored value).
  UOpRef leader;
  for (const UOp* g : items)
    if (range_type(g) == AxisType::Group) {
      UOpRef first = UOpRef(g)->alu(Ops::CMPLT, ci(1));
      leader = leader ? leader->alu(Ops::AND, first) : first;
    }
  UOpRef out = substitute(ast, repl);
  std::vector<UOpRef> stores;
  for (const UOpRef& st : out->src())
    stores.push_back(st->op == Ops::STORE && st->nsrc() == 2
                         ? UOp::make(Ops::STORE, dtypes::void_, {UOpRef(st->src()[0]), UOpRef(st->src()[1]), leader})
                         : st);
  return out->replace_src(stores);
}

std::vector<Opt> gpu_hand_coded_optimizations(const UOpRef& ast_in, const OptConfig& cfg) {
  UOpRef ast = graph_rewrite(ast_in, symbolic(), nullptr, false, "simplify for opts");
  auto axes = kernel_axes(ast);
  if (auto mn = cfg.tensor_cores ? tc_axes(ast) : std::nullopt) {
    // Each warp takes 2x2 tiles of 16x8 (its fragments are reused across the tile), four warps per group.
    std::vector<Opt> opts{{OptOp::TC, 0, 0}};
    auto [m, n] = *mn;
    int64_t tm = axes[size_t(m)]->src(0)->const_int() / 16, tn = axes[size_t(n)]->src(0)->const_int() / 8;
    for (auto [ax, t] : {std::pair{n, &tn}, std::pair{m, &tm}}) {
      if (*t % 2 == 0 && *t >= 4) opts.push_back({OptOp::UPCAST, ax, 2}), *t /= 2;
      if (*t % 2 == 0 && *t >= 2) opts.push_back({OptOp::LOCAL, ax, 2}), *t /= 2;
    }
    return opts;
  }
  size_t n_out = size_t(std::count_if(axes.begin(), axes.end(), [](const UOp* r) { return is_out(range_type(r)); }));
  std::vector<int64_t> size(axes.size(), 0);  // 0: symbolic, never split
  int64_t out_total = 1;
  for (size_t i = 0; i < axes.size(); i++) {
    size[i] = axes[i]->src(0)->op == Ops::CONST ? axes[i]->src(0)->const_int() : 0;
    if (i < n_out) out_total = size[i] ? out_total * size[i] : -1;
  }
  std::vector<const UOp*> stores, loads, reduces;
  for (const UOp* n : toposort(ast.get())) {
    if (n->op == Ops::REDUCE) reduces.push_back(n);
    if ((n->op != Ops::LOAD && n->op != Ops::STORE) || n->src(0)->op != Ops::INDEX || n->src(0)->src(0)->op != Ops::PARAM)
      continue;
    (n->op == Ops::LOAD ? loads : stores).push_back(n->src(0)->src(1));
  }
  if (stores.size() != 1 || out_total < 0) return {};  // multi-output or symbolic kernels keep the default grid
  std::vector<Opt> opts;
  int64_t items = 1, limit = std::min<int64_t>(cfg.local_threads, 256);
  auto pick = [](int64_t n, std::initializer_list<int64_t> amts, int64_t cap) -> int64_t {
    for (int64_t a : amts)
      if (a <= cap && n > 0 && n % a == 0) return a;
    return 0;
  };
  // 1. A large reduction into few outputs: split it across a work group (local memory, one barrier).
  bool grouped = false;
  if (reduces.size() == 1 && !dtypes::is_bool(reduces[0]->dtype) && n_out < axes.size() && out_total <= 2048) {
    size_t best = n_out;
    for (size_t i = n_out; i < axes.size(); i++)
      if (size[i] > size[best]) best = i;
    int64_t a = size[best] >= 512 ? pick(size[best], {256, 128, 64, 32, 16}, limit) : 0;
    if (a) {
      bool coalesced = std::any_of(loads.begin(), loads.end(), [&](const UOp* l) { return unit_stride(l, axes[best]); });
      opts.push_back({coalesced ? OptOp::GROUP : OptOp::GROUPTOP, int(best), a});
      items *= a;
      grouped = true;
    }
  }
  // 2. Matmul-shaped kernels: a small register tile over output axes whose loads are shared.
  if (!grouped && n_out < axes.size()) {
    int64_t up = 1;
    for (size_t i = 0; i < n_out && up < 16; i++) {
      bool shared = std::any_of(loads.begin(), loads.end(), [&](const UOp* l) { return !depends_on(l, axes[i]); });
      if (shared && size[i] >= 16 && size[i] % 4 == 0) {
        opts.push_back({OptOp::UPCAST, int(i), 4});
        size[i] /= 4;
        up *= 4;
      }
    }
  }
  // 3. Work-group items over output axes: the one the store is contiguous in first, then the others.
  std::vector<size_t> order;
  for (size_t i = 0; i < n_out; i++)
    if (unit_stride(stores[0], axes[i])) order.insert(order.begin(), i);
    else order.push_back(i);
  for (size_t i : order) {
    int64_t a = pick(size[i], {32, 16, 8, 4, 2}, std::min<int64_t>(limit / items, i == order[0] ? 32 : 8));
    if (a < 2) continue;
    opts.push_back({OptOp::LOCAL, int(i), a});
    size[i] /= a;
    items *= a;
  }
  return opts;
}

}  // namespace tg
