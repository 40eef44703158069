// Kernel optimisations as axis-type changes (shift_to), and the hand-coded heuristic that picks them.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "tg/codegen.hpp"
#include "tg/env.hpp"
#include "tg/opt.hpp"
#include "tg/symbolic.hpp"

namespace tg {

namespace {

UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }

bool is_out(AxisType t) { return t == AxisType::Loop || t == AxisType::Global; }

std::optional<int64_t> range_size(const UOp* r) {
  if (r->src(0)->op != Ops::CONST) return std::nullopt;
  return r->src(0)->const_int();
}

// Uses of RANGE r become `repl`; a REDUCE over r reduces over `outer` and `inner` instead (apply_opt, split_ranges).
UOpRef split_range(const UOpRef& ast, const UOp* r, const UOpRef& repl, const UOpRef& outer, const UOpRef& inner) {
  std::unordered_map<const UOp*, UOpRef> m{{r, repl}};
  for (const UOp* u : toposort(ast.get())) {
    if (u == r) continue;
    std::vector<UOpRef> s;
    bool changed = false;
    for (size_t k = 0; k < u->nsrc(); k++) {
      const UOp* x = u->src(k);
      if (u->op == Ops::REDUCE && k > 0 && x == r) {
        s.push_back(outer);
        s.push_back(inner);
        changed = true;
        continue;
      }
      auto it = m.find(x);
      s.push_back(it == m.end() ? UOpRef(x) : it->second);
      changed |= it != m.end();
    }
    if (changed) m[u] = u->replace_src(s);
  }
  return m.count(ast.get()) ? m[ast.get()] : ast;
}

}  // namespace

bool depends_on(const UOp* e, const UOp* r) {
  for (const UOp* n : toposort(e))
    if (n == r) return true;
  return false;
}

std::optional<int64_t> index_coef(const UOp* e, const UOp* r) {
  if (e == r) return 1;
  if (!depends_on(e, r)) return 0;
  if (e->op == Ops::ADD) {
    auto a = index_coef(e->src(0), r), b = index_coef(e->src(1), r);
    if (!a || !b) return std::nullopt;
    return *a + *b;
  }
  if (e->op == Ops::MUL) {
    for (int k = 0; k < 2; k++)
      if (e->src(size_t(1 - k))->op == Ops::CONST) {
        auto a = index_coef(e->src(size_t(k)), r);
        if (!a) return std::nullopt;
        return *a * e->src(size_t(1 - k))->const_int();
      }
  }
  return std::nullopt;
}

namespace {

struct Accesses {
  std::vector<const UOp*> stores, loads;  // index expressions into PARAM buffers
  std::vector<int> load_bytes;             // the element size of each load
};
Accesses accesses(const UOpRef& ast) {
  Accesses a;
  for (const UOp* n : toposort(ast.get())) {
    if ((n->op != Ops::LOAD && n->op != Ops::STORE) || n->src(0)->op != Ops::INDEX) continue;
    if (n->op == Ops::STORE && n->nsrc() == 3) continue;  // a gated store: an index check's hit record, no output
    const UOp* idx = n->src(0);
    if (idx->src(0)->op != Ops::PARAM) continue;
    (n->op == Ops::LOAD ? a.loads : a.stores).push_back(idx->src(1));
    if (n->op == Ops::LOAD) a.load_bytes.push_back(n->dtype.scalar_type().itemsize());
  }
  return a;
}

}  // namespace

int64_t range_id(const UOp* r) { return std::get<std::vector<int64_t>>(r->arg)[0]; }
AxisType range_type(const UOp* r) { return static_cast<AxisType>(std::get<std::vector<int64_t>>(r->arg)[1]); }

std::string to_string(const Opt& o) {
  static const char* names[] = {"UPCAST", "UNROLL", "THREAD", "LOCAL", "GROUP", "GROUPTOP", "TC", "SWAP", "PADTO", "PREFETCH", "NONTEMPORAL"};
  const char* n = names[size_t(o.op)];
  return std::string("Opt(") + n + ", axis=" + std::to_string(o.axis) + ", amt=" + std::to_string(o.amt) + ")";
}

std::vector<const UOp*> streamed_loads(const UOp* ast, const UOp* r, int64_t l2_bytes) {
  std::vector<const UOp*> out;
  for (const UOp* u : toposort(ast)) {
    if (u->op != Ops::LOAD || u->src(0)->op != Ops::INDEX || u->src(0)->src(0)->op != Ops::PARAM) continue;
    const UOp* idx = u->src(0)->src(1);
    auto c = index_coef(idx, r);
    if (!c || *c == 0) continue;
    if (l2_bytes > 0) {
      if (!idx->bounds().known) continue;
      double span = (double(idx->vmax()) - double(idx->vmin()) + 1) * u->dtype.scalar_type().itemsize();
      if (span <= double(l2_bytes)) continue;
    }
    out.push_back(u);
  }
  return out;
}

std::vector<const UOp*> kernel_axes(const UOpRef& ast) {
  std::vector<const UOp*> out, red;
  for (const UOp* n : toposort(ast.get())) {
    if (n->op != Ops::RANGE) continue;
    if (is_out(range_type(n))) out.push_back(n);
    if (range_type(n) == AxisType::Reduce) red.push_back(n);
  }
  auto by_id = [](const UOp* a, const UOp* b) { return range_id(a) < range_id(b); };
  std::sort(out.begin(), out.end(), by_id);
  std::sort(red.begin(), red.end(), by_id);
  out.insert(out.end(), red.begin(), red.end());
  return out;
}

UOpRef substitute(const UOpRef& root, const std::vector<std::pair<const UOp*, UOpRef>>& map) {
  std::unordered_map<const UOp*, UOpRef> m(map.begin(), map.end());
  return substitute(root, [&](const UOp* u) {
    auto it = m.find(u);
    return it == m.end() ? UOpRef{} : it->second;
  });
}

UOpRef apply_opt(const UOpRef& ast, const Opt& opt) {
  if (opt.op == OptOp::TC) return apply_tc(ast);
  auto axes = kernel_axes(ast);
  size_t n_out = size_t(std::count_if(axes.begin(), axes.end(), [](const UOp* r) { return is_out(range_type(r)); }));
  auto fail = [&](const std::string& why) -> UOpRef { throw OptError("[opt] " + to_string(opt) + ": " + why); };
  if (opt.op == OptOp::NONTEMPORAL) {  // the graph is unchanged: lowering marks the stores (mark_nontemporal_stores)
    if (opt.axis != 0 || opt.amt != 1) return fail("takes axis 0 and amt 1 (it names no axis)");
    return ast;
  }
  if (opt.axis < 0 || size_t(opt.axis) >= axes.size())
    return fail("the kernel has " + std::to_string(axes.size()) + " axes");
  const UOp* r = axes[size_t(opt.axis)];
  bool out = size_t(opt.axis) < n_out;
  bool on_reduce = opt.op == OptOp::UNROLL || opt.op == OptOp::GROUP || opt.op == OptOp::GROUPTOP || opt.op == OptOp::PREFETCH;
  if (on_reduce && out) return fail("needs a reduce axis");
  if (opt.op == OptOp::PREFETCH) {  // the kernel's graph is unchanged: lowering adds the prefetches to r's loop
    if (opt.amt < 1) return fail("the distance must be at least 1 byte");
    return ast;
  }
  if (!on_reduce && !out) return fail("needs an output axis");
  if (opt.op == OptOp::SWAP) {  // the two RANGEs exchange ids (their order), at once
    if (opt.amt < 0 || size_t(opt.amt) >= n_out || opt.amt == opt.axis)
      return fail("needs another output axis as amt (the kernel has " + std::to_string(n_out) + ")");
    const UOp* o = axes[size_t(opt.amt)];
    return substitute(ast, {{r, UOp::range(UOpRef(r->src()[0]), range_id(o), range_type(r))},
                            {o, UOp::range(UOpRef(o->src()[0]), range_id(r), range_type(o))}});
  }
  auto n = range_size(r);
  if (!n) return fail("the axis has a symbolic size");
  if (opt.amt < 2) return fail("the amount must be at least 2");
  if (opt.op == OptOp::PADTO) {  // r of n -> r' of n rounded up to amt: loads read min(r', n-1), stores gated by r' < n
    if (*n % opt.amt == 0) return fail("the axis size " + std::to_string(*n) + " is already a multiple of " + std::to_string(opt.amt));
    if (*n < opt.amt) return fail("the axis size " + std::to_string(*n) + " is below the amount");
    UOpRef nr = UOp::range(ci((*n + opt.amt - 1) / opt.amt * opt.amt), range_id(r), range_type(r));
    UOpRef valid = nr->alu(Ops::CMPLT, ci(*n));
    const std::vector<std::pair<const UOp*, UOpRef>> clamp{{r, valid->alu(Ops::WHERE, nr, ci(*n - 1))}};
    // (the padding's copies never store: a kernel that reads the buffer it stores, an in-place update, reads it as
    // before; a store already gated, an index check's hit record, gets both gates). A gated store's address is r'
    // itself, affine as before: an elementwise kernel's store stays contiguous in its lanes.
    std::vector<std::pair<const UOp*, UOpRef>> gated;
    for (const UOp* u : toposort(ast.get()))
      if (u->op == Ops::STORE && depends_on(u->src(0), r))
        gated.emplace_back(u, UOp::make(Ops::STORE, u->dtype,
                                        {substitute(UOpRef(u->src(0)), {{r, nr}}), substitute(UOpRef(u->src(1)), clamp),
                                         u->nsrc() == 3 ? valid->alu(Ops::AND, substitute(UOpRef(u->src(2)), clamp)) : valid}));
    return substitute(substitute(ast, gated), clamp);
  }
  if (*n % opt.amt != 0)
    return fail("the axis size " + std::to_string(*n) + " is not divisible by " + std::to_string(opt.amt));
  int64_t max_id = 0;
  for (const UOp* u : toposort(ast.get())) {
    if (u->op == Ops::RANGE) max_id = std::max(max_id, range_id(u));
    if (opt.op == OptOp::THREAD && u->op == Ops::DEFINE_VAR && std::get<VarArg>(u->arg).name == "core_id")
      return fail("the kernel is already split across threads");
  }
  UOpRef outer, inner, repl;
  if (opt.op == OptOp::THREAD) {
    inner = UOp::range(ci(*n / opt.amt), range_id(r), range_type(r));
    outer = UOp::variable("core_id", 0, opt.amt - 1);
    repl = outer->alu(Ops::MUL, ci(*n / opt.amt))->alu(Ops::ADD, inner);
  } else {
    AxisType t = opt.op == OptOp::UPCAST ? AxisType::Upcast
                 : opt.op == OptOp::UNROLL ? AxisType::Unroll
                 : opt.op == OptOp::LOCAL  ? AxisType::Local
                                           : AxisType::Group;
    outer = UOp::range(ci(*n / opt.amt), range_id(r), range_type(r));
    inner = UOp::range(ci(opt.amt), max_id + 1, t);
    // GROUPTOP: the new part is the outer one (each work item reduces a contiguous chunk).
    repl = opt.op == OptOp::GROUPTOP ? inner->alu(Ops::MUL, ci(*n / opt.amt))->alu(Ops::ADD, outer)
                                     : outer->alu(Ops::MUL, ci(opt.amt))->alu(Ops::ADD, inner);
  }
  return split_range(ast, r, repl, outer, inner);
}

namespace {

// An output loop x read as x // f and x % f (one f, dividing its size; its other uses become affine in the two new
// loops), as tinygrad's split ranges: the view of a computed value reshaped back into windows that do not overlap
// (the input gradient of a 2x2 stride-2 convolution stores (n, c, 2 oh + a, 2 ow + b)). Splitting it into x // f and
// x % f loops leaves affine indices, so the heuristic sees which loads are contiguous along which loop.
std::pair<const UOp*, int64_t> loop_split(const UOpRef& k) {
  // loop -> its divisor, the largest where each divides the next (q4_0's k // 32, k % 16, k // 16 % 2: 32, after
  // which the inner loop splits again by 16); 0 where two do not (x // 3 and x // 4)
  std::unordered_map<const UOp*, int64_t> f;
  for (const UOp* n : toposort(k.get()))
    for (size_t i = 0; i < n->nsrc(); i++) {
      const UOp* x = n->src(i);
      if (x->op != Ops::RANGE || range_type(x) != AxisType::Loop) continue;
      if (i != 0 || (n->op != Ops::IDIV && n->op != Ops::MOD) || n->src(1)->op != Ops::CONST) continue;
      int64_t m = n->src(1)->const_int();
      auto [it, fresh] = f.try_emplace(x, m);
      if (fresh || it->second == 0 || m <= 0) continue;
      if (it->second % m == 0) continue;
      it->second = m % it->second == 0 ? m : 0;
    }
  for (auto [x, m] : f) {
    auto size = range_size(x);
    if (m > 1 && size && m < *size && *size % m == 0) return {x, m};
  }
  return {nullptr, 0};
}

// x (an output loop) becomes x // f and x % f, adjacent in the loop order: the later output loops' ids move up one.
UOpRef split_loop(const UOpRef& k, const UOp* x, int64_t f) {
  const int64_t id = range_id(x);
  std::vector<std::pair<const UOp*, UOpRef>> map;
  for (const UOp* n : toposort(k.get()))
    if (n->op == Ops::RANGE && n != x && is_out(range_type(n)) && range_id(n) > id)
      map.push_back({n, UOp::range(UOpRef(n->src()[0]), range_id(n) + 1, range_type(n))});
  UOpRef outer = UOp::range(ci(*range_size(x) / f), id, AxisType::Loop);
  UOpRef inner = UOp::range(ci(f), id + 1, AxisType::Loop);
  map.push_back({x, outer->alu(Ops::MUL, ci(f))->alu(Ops::ADD, inner)});
  return graph_rewrite(substitute(k, map), symbolic(), nullptr, false, "split ranges");
}

// The inverse, as tinygrad merges adjacent ranges: the loop the store is contiguous in (b, of size B) and the output
// loop just outside it (a) become one loop m of A*B when every access reads them as one, at a*B*s + b*s (the input
// gradient of a 1x1 convolution stores (n, c, h, w) and reads the output's gradient at (n, o, h, w): its 28x28 rows
// are one axis of 784, vectors of 16 instead of 28 = 16 + 8 + 4). Only where a and b appear nowhere else (a gate, a
// window's h * s + kh): substituted by m // B and m % B, the indices must fold back to affine ones. Elementwise
// kernels too: a rand of (N, 28) numbers its elements a * 28 + b, and as 28 copies of the threefry, lane 0's counter
// a * 28 against the others' a * 28 + k, its copies were not one vector op (scalar code, 15 ns an element against 1
// for rows of 32); rows of 12 or 7 took no vectors at all.
// Loops the store is not contiguous in merge only where the inner one takes no vector (its size not a multiple of 4):
// an NCHW -> NHWC copy of 10 x 10 planes had no tile along its loads (10 columns), scalar gathers 100 floats apart;
// as one axis of 100 it takes tiles of 32 channels x 4 pixels. Planes of 56 x 56 keep their rows (a merged axis of
// 3136 in tiles of 16 x 16 took twice as long, Zen 5; 3.4 -> 3.9 ms in one run each, Zen 4).
UOpRef merge_loops(const UOpRef& k) {
  Accesses acc = accesses(k);
  if (acc.stores.size() != 1) return k;
  std::vector<const UOp*> loops;
  for (const UOp* r : kernel_axes(k))
    if (range_type(r) == AxisType::Loop) loops.push_back(r);
  for (size_t i = 1; i < loops.size(); i++) {
    const UOp *a = loops[i - 1], *b = loops[i];
    auto sa = range_size(a), sb = range_size(b);
    if (!sa || !sb || *sa < 2 || *sb < 2) continue;
    bool one = true;
    for (const UOp* x : acc.loads) {
      auto ka = index_coef(x, a), kb = index_coef(x, b);
      one &= ka && kb && *ka == *sb * *kb;
    }
    auto ca = index_coef(acc.stores[0], a), cb = index_coef(acc.stores[0], b);
    if (!one || !ca || !cb || *cb < 1 || *ca != *sb * *cb) continue;
    if (*cb != 1 && *sb % 4 == 0) continue;  // (below)
    std::vector<std::pair<const UOp*, UOpRef>> map;
    for (const UOp* n : toposort(k.get()))
      if (n->op == Ops::RANGE && is_out(range_type(n)) && range_id(n) > range_id(b))
        map.push_back({n, UOp::range(UOpRef(n->src()[0]), range_id(n) - 1, range_type(n))});
    UOpRef m = UOp::range(ci(*sa * *sb), range_id(a), AxisType::Loop);
    map.push_back({a, m->alu(Ops::IDIV, ci(*sb))});
    map.push_back({b, m->alu(Ops::MOD, ci(*sb))});
    UOpRef out = graph_rewrite(substitute(k, map), symbolic(), nullptr, false, "merge loops");
    for (const UOp* n : toposort(out.get()))
      if ((n->op == Ops::IDIV || n->op == Ops::MOD) && n->dtype.scalar == Scalar::Index && depends_on(n->src(0), m.get()))
        return k;  // (an IDIV of data, the threefry's rotations of the counter, is not index arithmetic)
    return merge_loops(out);
  }
  return k;
}

}  // namespace

UOpRef split_ranges(const UOpRef& ast) {
  UOpRef k = ast;
  for (int round = 0; round < 8; round++) {
    int64_t max_id = 0;
    const UOp* r = nullptr;
    int64_t c = 0;
    for (const UOp* n : toposort(k.get())) {
      if (n->op == Ops::RANGE) max_id = std::max(max_id, range_id(n));
      if (r || (n->op != Ops::MOD && n->op != Ops::IDIV) || n->src(1)->op != Ops::CONST) continue;
      int64_t m = n->src(1)->const_int();
      if (n->src(0)->op == Ops::RANGE) {  // r % m, r // m (q6_K's scale of each 16 weights: sc[l // 16])
        const UOp* x = n->src(0);
        auto size = range_size(x);
        if (range_type(x) == AxisType::Reduce && size && m > 1 && m < *size && *size % m == 0) r = x, c = m;
        continue;
      }
      // (rest + x * k) % m (or // m) with 0 <= rest < k and k | m: x splits by m / k, and the MOD (IDIV) folds away
      // ((l + 32 g) % 64, l < 32: q6_K's bytes of the low nibbles)
      std::vector<const UOp*> terms, stack{n->src(0)};
      while (!stack.empty()) {
        const UOp* e = stack.back();
        stack.pop_back();
        if (e->op == Ops::ADD) stack.insert(stack.end(), {e->src(0), e->src(1)});
        else terms.push_back(e);
      }
      for (const UOp* t : terms) {
        const UOp* x = t->op == Ops::RANGE ? t : nullptr;
        int64_t kx = 1;
        if (t->op == Ops::MUL && t->src(1)->op == Ops::CONST && t->src(0)->op == Ops::RANGE) x = t->src(0), kx = t->src(1)->const_int();
        if (!x || range_type(x) != AxisType::Reduce || kx <= 0 || m % kx != 0) continue;
        auto size = range_size(x);
        int64_t f = m / kx, lo = 0, hi = 0;
        for (const UOp* o : terms)
          if (o != t) lo += o->vmin(), hi += o->vmax();
        if (size && f > 1 && f < *size && *size % f == 0 && lo >= 0 && hi < kx) {
          r = x, c = f;
          break;
        }
      }
    }
    if (!r) {
      if (auto [x, f] = loop_split(k); x) {  // an output loop read only as x // f and x % f
        k = split_loop(k, x, f);
        continue;
      }
      return merge_loops(k);
    }
    UOpRef outer = UOp::range(ci(*range_size(r) / c), range_id(r), AxisType::Reduce);
    UOpRef inner = UOp::range(ci(c), max_id + 1, AxisType::Reduce);
    // (in the same order: outer * c + inner runs r's values in order)
    UOpRef split = split_range(k, r, outer->alu(Ops::MUL, ci(c))->alu(Ops::ADD, inner), outer, inner);
    k = graph_rewrite(split, symbolic(), nullptr, false, "split ranges");
  }
  return k;
}

int64_t row_array_bytes(const OptConfig& cfg) { return std::max<int64_t>(0, cfg.l2_bytes / 4); }

namespace {
// whether e computes a transcendental (exp, log, sin: many vector ops an element)
bool transcendental(const UOp* e) {
  for (const UOp* u : toposort(e))
    if (u->op == Ops::EXP2 || u->op == Ops::LOG2 || u->op == Ops::SIN) return true;
  return false;
}
}  // namespace

OptConfig opt_config(const Device& dev) {
  MachineModel m = dev.machine();
  OptConfig c;
  c.threads = dev.threads();
  c.vector_width = std::max(4, m.vector_bits / 32);
  c.vector_registers = std::max(8, m.vector_registers);
  c.l2_bytes = m.l2_bytes;
  // the last-level cache: this process's share of the L3, else the threads' L2s
  c.llc_bytes = m.l3_share_bytes > 0 ? m.l3_share_bytes : m.l2_bytes * std::max(1, c.threads);
  c.fma_chains = std::max(1, int(std::lround((m.fma_latency + 1) * m.fma_per_cycle)));
  if (m.fma_per_cycle > 0) c.fma_per_cycle = m.fma_per_cycle;
  c.int8_dot = m.int8_dot;
  c.row_prefetch = m.row_prefetch;
  return c;
}

namespace {

// The heuristic's state while it picks one kernel's opts: the kernel's axes, their sizes as split so far, its loads
// and store, and the opts so far. Each step below reads what the earlier ones chose (the vectorised axis, the copies).
struct Heuristic {
  const OptConfig& cfg;
  size_t tile_rank;
  UOpRef ast;
  std::vector<const UOp*> axes;
  size_t n_out = 0;
  std::vector<int64_t> size;  // current sizes (0: symbolic, never split)
  std::vector<int64_t> size0;  // the sizes before any split
  double work = 1;
  Accesses acc;
  const UOp* st = nullptr;
  bool reduce = false;
  std::vector<Opt> opts;
  int64_t upcast = 1;
  int w = 4;
  int vec = -1;            // the vectorised axis (UPCAST of an output axis or UNROLL of a reduce axis)
  int64_t vec_amt = 1;     // its amount (the vector width used)
  bool short_vec = false;  // vec is a short output axis unrolled whole, no vector
  bool transposed = false;  // step 1d took a transpose tile
  bool rows = false;       // a row kernel (step "row lanes")
  bool ranked = false;     // the register tile was chosen by rank (step 2)
  int64_t accs = 1;        // accumulator arrays per output element: one per REDUCE, two for a float MAX's

  Heuristic(const UOpRef& ast_in, const OptConfig& c, size_t rank) : cfg(c), tile_rank(rank) {
    // Index expressions are read for strides: simplified first (a no-op on lower_kernel's already simplified AST).
    ast = graph_rewrite(ast_in, symbolic(), nullptr, false, "simplify for opts");
    axes = kernel_axes(ast);
    n_out = size_t(std::count_if(axes.begin(), axes.end(), [](const UOp* r) { return is_out(range_type(r)); }));
    size.assign(axes.size(), 0);
    for (size_t i = 0; i < axes.size(); i++) size[i] = range_size(axes[i]).value_or(0);
    size0 = size;
    work = loop_work();
    acc = accesses(ast);
    reduce = n_out < axes.size();
    w = std::max(4, cfg.vector_width);
    int64_t n = 0;
    for (const UOp* u : toposort(ast.get()))
      if (u->op == Ops::REDUCE) n += reduce_accumulators(Ops(std::get<int64_t>(u->arg)), u->dtype.scalar_type());
    accs = std::max<int64_t>(n, 1);
  }

  // The kernel's innermost iterations: the loops each accumulation (REDUCE) and the store run in, summed over the
  // nests that no other contains. A matmul's is the product of its axes; a row kernel's (layernorm: a row's two sums
  // and its output loop, one after another) is rows x (3 x 4096), not the product of all four axes (4096^4).
  double loop_work() const {
    std::vector<uint64_t> nests;
    for_each_axes([&](const UOp* u, uint64_t m) {
      if (u->op == Ops::REDUCE || u->op == Ops::STORE) nests.push_back(m);
    });
    double total = 0;
    for (size_t a = 0; a < nests.size(); a++) {
      bool inner = false;  // within another nest (or a repeat of an earlier one)
      for (size_t b = 0; b < nests.size() && !inner; b++)
        inner = b != a && (nests[a] & ~nests[b]) == 0 && (nests[a] != nests[b] || b < a);
      if (!inner) total += trips(nests[a]);
    }
    return std::max(total, 1.0);
  }

  // Visits each node of the AST in order with the axes (bits, by index into axes) it runs in; a REDUCE is visited
  // inside its reduce ranges, which end after it.
  template <class F>
  void for_each_axes(F&& visit) const {
    std::unordered_map<const UOp*, uint64_t> in;
    for (const UOp* u : toposort(ast.get())) {
      uint64_t m = 0;
      for (size_t i = 0; i < axes.size() && i < 64; i++)
        if (u == axes[i]) m |= uint64_t(1) << i;
      for (size_t k = 0; k < u->nsrc(); k++)
        if (auto it = in.find(u->src(k)); it != in.end()) m |= it->second;
      visit(u, m);
      if (u->op == Ops::REDUCE)
        for (size_t k = 1; k < u->nsrc(); k++) m &= ~in[u->src(k)];
      in[u] = m;
    }
  }

  // The iterations of the axes set in `bits`.
  double trips(uint64_t bits) const {
    double t = 1;
    for (size_t i = 0; i < axes.size() && i < 64; i++)
      if (bits >> i & 1) t *= double(std::max<int64_t>(size0[i], 1));
    return t;
  }

  // padding an elementwise axis to whole vectors (at most w - 1 lanes of w x kPadVectors computed for nothing)
  static constexpr int64_t kPadVectors = 64;
  static constexpr int64_t kLineBytes = kCacheLineBytes;
  // the lines a core's L1 takes from its L2 in a cycle, sustained: half the 64-byte port of Zen 3..5, Haswell and
  // later Intel cores
  static constexpr double kL2FillBytes = 32;
  static constexpr int64_t kPageBytes = 4096;  // a small page: L1's sets span one (64 sets x 64-byte lines)
  static constexpr double kSmallTable = 4 * kCacheLineBytes;  // a table of a few lines (small_table)
  int64_t load_isz = 4, load_row_stride = 0;  // transpose_tile: its heaviest transposed load's element size and
                                              // the bytes between the rows of its tile

  static int64_t pick(int64_t n, std::initializer_list<int64_t> amts) {
    for (int64_t a : amts)
      if (n > 0 && n % a == 0 && n / a >= 1) return a;
    return 0;
  }
  // some load does not depend on the axis: upcasting it reuses that load
  bool shares(size_t i) const {
    for (const UOp* l : acc.loads)
      if (!depends_on(l, axes[i])) return true;
    return false;
  }
  // Whether output axis i is bounded together with a reduce axis in a load's bounds test (a padded convolution's
  // output row and tap row: 0 <= h + kh - 4 < 20). As a loop it lets lowering's narrow_gated_reduces run the tap loop
  // over the rows in the data, and the test leaves the loads; upcast, each copy would keep the test at every load.
  // Only loads' tests (a causal mask's comparison is a value, not a load's bounds).
  bool gated_with_reduce(size_t i) const {
    for (const UOp* u : toposort(ast.get())) {
      if (u->op != Ops::LOAD || u->nsrc() != 3 || !depends_on(u->src(2), axes[i])) continue;
      std::vector<const UOp*> todo{u->src(2)};
      while (!todo.empty()) {
        const UOp* t = todo.back();
        todo.pop_back();
        if (t->op == Ops::AND) {
          todo.push_back(t->src(0)), todo.push_back(t->src(1));
          continue;
        }
        if (t->op != Ops::CMPLT || !depends_on(t, axes[i])) continue;
        for (size_t j = n_out; j < axes.size(); j++)
          if (depends_on(t, axes[j])) return true;
      }
    }
    return false;
  }
  // Copies of an upcast output axis that no vector width divides (the SLP vectoriser packs them into vectors): the
  // largest divisor between w/2 and 2w (6625 classes -> 25 copies: a vector of 16, one of 8 and a scalar; 162 -> 18).
  int64_t odd_amount(int64_t n) const {
    for (int64_t d = 2 * w; d >= w / 2; d--)
      if (n > d && n % d == 0) return d;
    return 0;
  }
  int64_t vector_amount(int64_t n) const {
    int64_t a = pick(n, {int64_t(w), int64_t(w / 2), 4});
    return a ? a : odd_amount(n);
  }
  // axis i is read as a value, not only as an address: cast from an index into the data (an arange's or a random
  // draw's counter). Copies of it are not one op for the vectorizers (each copy's constant folds its own way).
  bool counter_lanes(size_t i) const {
    for (const UOp* u : toposort(ast.get()))
      if (u->op == Ops::CAST && u->src(0)->dtype == dtypes::index && !(u->dtype == dtypes::index) && depends_on(u, axes[i]))
        return true;
    return false;
  }
  // some load's address moves along axis i
  bool reads_along(size_t i) const {
    return std::any_of(acc.loads.begin(), acc.loads.end(), [&](const UOp* l) { return depends_on(l, axes[i]); });
  }
  // every load depending on axis i is contiguous in it (and `any`: some load depends on it)
  bool loads_contiguous(size_t i, bool* any = nullptr) const {
    bool all = true, some = false;
    for (const UOp* l : acc.loads)
      if (depends_on(l, axes[i])) {
        auto c = index_coef(l, axes[i]);
        some = true;
        all &= c && *c == 1;
      }
    if (any) *any = some;
    return all;
  }
  // a load inside the reduce loop (its index depends on a reduce axis); the others are read once per output
  bool in_reduce_loop(const UOp* l) const {
    for (size_t j = n_out; j < axes.size(); j++)
      if (depends_on(l, axes[j])) return true;
    return false;
  }
  // the bytes load li's index spans (its buffer's part it reads); unknown bounds: the elements of its axes
  double span_bytes(size_t li) const {
    const UOp* l = acc.loads[li];
    if (!l->bounds().known) return iteration_bytes(li);
    return (double(l->vmax()) - double(l->vmin()) + 1) * acc.load_bytes[li];
  }
  // load li's bytes over the iterations of every axis it depends on (one element each)
  double iteration_bytes(size_t li) const {
    double elems = 1;
    for (size_t j = 0; j < axes.size(); j++)
      if (depends_on(acc.loads[li], axes[j])) elems *= double(std::max<int64_t>(size0[j], 1));
    return elems * acc.load_bytes[li];
  }
  // the bytes the store's index spans (0 where its bounds are unknown)
  // the element size of the store (0: not found)
  int64_t store_item() const {
    int64_t item = 0;
    for (const UOp* n : toposort(ast.get()))
      if (n->op == Ops::STORE && n->src(0)->op == Ops::INDEX && n->src(0)->src(1) == st)
        item = n->src(1)->dtype.scalar_type().itemsize();
    return item;
  }
  double store_bytes() const {
    if (!st->bounds().known) return 0;
    return (double(st->vmax()) - double(st->vmin()) + 1) * double(store_item());
  }
  // load li's bytes over the output axes it depends on, at the axis sizes sz (a load's weight among the kernel's)
  double out_bytes(size_t li, const std::vector<int64_t>& sz) const {
    double elems = 1;
    for (size_t j = 0; j < n_out; j++)
      if (depends_on(acc.loads[li], axes[j])) elems *= double(std::max<int64_t>(sz[j], 1));
    return acc.load_bytes[li] * elems;
  }
  void split(OptOp op, size_t i, int64_t a) {
    opts.push_back({op, int(i), a});
    size[i] /= a;
  }

  // Whether load li reads a small table (a few lines, kSmallTable) along output axis i and the reduce axes only, in
  // a kernel that streams a larger input through its reduce loop: its gathered lanes along i are the same for every
  // other output, in L1, and loaded once where the reduce over them is unrolled (Winograd's transforms, an 8 x 8
  // matrix applied along the tiles' rows: the store's vectors along the matrix's rows were refused for it, and the
  // reduce took lanes of 8 each summed across, 3.6 -> 2.0 ms for the 5x5 benchmark's first input-transform pass)
  bool small_table(size_t li, size_t i) const {
    if (span_bytes(li) > kSmallTable) return false;
    for (size_t o = 0; o < n_out; o++)
      if (o != i && depends_on(acc.loads[li], axes[o])) return false;
    for (size_t lj = 0; lj < acc.loads.size(); lj++)
      if (in_reduce_loop(acc.loads[lj]) && span_bytes(lj) > kSmallTable) return true;
    return false;
  }

  // 1. The output axis the store is contiguous in: vectorised stores (and loads, where they are contiguous too).
  void store_vectors() {
    for (size_t i = 0; i < n_out; i++) {
      auto c = index_coef(st, axes[i]);
      if (c && *c == 1 && size[i] > 1) vec = int(i);
    }
    // In a reduce kernel the copies must mostly not gather: of the loads inside the reduce loop that depend on the
    // axis, those contiguous in it span more bytes than those it strides (a row reduction's output axis strides its
    // input by the row length: no vectors). A few gathered lanes cost no more loads than the scalar loop, and the
    // contiguous loads become vectors: a batchnorm's backward sums over a channels-last input (26 MB, contiguous in
    // the channel it stores) read the max pool's NCHW output and counts (6.5 MB each, 100 floats apart along it),
    // and without vectors walked the channels-last rows one float per cache line (r_256_32, 2.6-8 GB/s).
    auto no_gather = [&](size_t i) {
      double contiguous = 0, gathered = 0;
      for (size_t li = 0; li < acc.loads.size(); li++) {
        const UOp* l = acc.loads[li];
        if (!in_reduce_loop(l) || !depends_on(l, axes[i])) continue;
        auto c = index_coef(l, axes[i]);
        if (!(c && *c == 1) && small_table(li, i)) continue;
        (c && *c == 1 ? contiguous : gathered) += span_bytes(li);
      }
      return gathered == 0 || contiguous > gathered;
    };
    auto some_contiguous = [&](size_t i) {
      for (const UOp* l : acc.loads)
        if (auto c = index_coef(l, axes[i]); c && *c == 1) return true;
      return false;
    };
    if (vec < 0 || (reduce && !(no_gather(size_t(vec)) && (shares(size_t(vec)) || some_contiguous(size_t(vec)))))) {
      vec = -1;
      return;
    }
    // an axis of w/2..2w elements is taken whole (20 = a vector of 16 and one of 4: a 5x5 conv's 20-wide output rows
    // run 2-3x faster than in vectors of 4), a longer one in vectors of w (or w/2, 4). An odd divisor only in a
    // reduce kernel, whose loads were checked above; an elementwise kernel's odd store axis may gather its loads
    // (a transposed read), and step 1c weighs that.
    // In a reduce kernel a short axis (at most 8, below a vector) that no vector of 4 divides takes the short path
    // below on every ISA, not a partial vector (5 under AVX2 was a vector of 4 and a scalar): a 5x5 conv's weight
    // gradient over one input channel (mnist's r_256_32_5_5) took 5 kernel columns x 8 output channels as 40
    // scalar copies under TG_CPU=haswell, no lane left for its contiguous reduce axis, where AVX-512 (5 < w/2)
    // unrolls the 5 columns as copies and gets lanes of 8 along that axis (step 1b).
    int64_t n = size[size_t(vec)];
    const bool whole = n >= w / 2 && n <= 2 * w && (!reduce || n >= w || n % 4 == 0 || n > 8);
    int64_t a = whole ? n : pick(n, {int64_t(w), int64_t(w / 2), 4});
    if (!a && reduce) a = odd_amount(n);
    // an elementwise axis that every load reads contiguously or not at all (rows merged by split_ranges: 14 x 14 =
    // 196) takes an odd divisor from w/2 to 2w before vectors of 4: 28 copies, vectors of 16, 8 and 4. Not an axis
    // whose lanes are read as values (a random draw's or an arange's counter): its copies are not one op (each
    // copy's constant folds its own way) and an odd number of them ran as scalar code (a dropout of 1000 x 999,
    // 999000 / 2 threads = 4 x 124875: 30 copies, 8-12 ms; vectors of 4 under TG_CPU=haswell, 2.9 ms). Such an
    // axis that reads nothing along it (Tensor::rand, randn) is padded to whole vectors instead (PADTO: the padding's
    // lanes compute and store nothing), a Lane loop LLVM runs as vectors of w: rand of 1000 x 999 8-13 -> 1.2 ms,
    // randn 23-33 -> 3.5 ms (Zen 4, 2 threads; libtorch 2.9 and 3.0); of 4194300 9.4 -> 1.2 ns an element. So is one
    // that half vectors divide: TG_CPU=haswell's vectors of 4 over 1000 x 999, rand 3.0 -> 1.6 ms, randn 8.9 -> 4.8;
    // natively 4194288 (8 x 524286) 1.8 -> 1.0 ns an element.
    if (!reduce && !whole && a < w && loads_contiguous(size_t(vec))) {
      if (!counter_lanes(size_t(vec))) {
        if (a < w / 2)
          if (int64_t o = odd_amount(n)) a = o;
      } else if (!reads_along(size_t(vec)) && n >= kPadVectors * w) {
        // (an axis reserved for the threads holds size / threads per thread: its padded length divides by both)
        const int64_t t = reserved && *reserved == size_t(vec) ? cfg.threads : 1, whole_axis = size0[size_t(vec)];
        opts.push_back({OptOp::PADTO, vec, w * t});
        size[size_t(vec)] = n = (whole_axis + w * t - 1) / (w * t) * w;
        a = w;
      }
    }
    // a short axis that no vector width divides (a 5x5 or 3x3 kernel's width) is unrolled whole in reduce kernels,
    // as copies rather than a vector (a reduce axis may still give the vectors, step 1b)
    if (!a && reduce && size[size_t(vec)] > 1 && size[size_t(vec)] <= 8) a = size[size_t(vec)], short_vec = true;
    if (!a) {
      vec = -1;
      return;
    }
    split(OptOp::UPCAST, size_t(vec), a);
    upcast *= a;
    vec_amt = a;
    if (short_vec) load_axis_vectors();
  }

  // 1a. A reduce kernel whose store axis is short, unrolled into copies: vectors along another output axis that
  //     every load depending on it is contiguous in, inside the reduce loop. The input gradient of a 2x2 stride-2
  //     convolution, split into (n, c, oh, a, ow, b) loops, stores along b (2 wide) and reads the output's gradient
  //     contiguously along ow: vectors of ow, strided stores (few: one per output, after the reduce), against
  //     scalar copies of (c, ow) tiles.
  void load_axis_vectors() {
    for (size_t i = 0; i < n_out; i++) {
      if (int(i) == vec || size[i] <= 1) continue;
      bool any = false, inner = false;
      if (!loads_contiguous(i, &any) || !any) continue;
      for (const UOp* l : acc.loads)
        for (size_t j = n_out; j < axes.size() && !inner; j++) inner = depends_on(l, axes[i]) && depends_on(l, axes[j]);
      const int64_t n = size[i];  // whole from w/2 to 2w elements, as the store's axis in step 1
      int64_t a = !inner ? 0 : n >= w / 2 && n <= 2 * w ? n : pick(n, {int64_t(w), int64_t(w / 2), 4});
      // up to 4w whole where no full vector divides it: AVX2's 28 columns had vectors of 4 (xmm; the 2x2 stride-2
      // convolution's input gradient at 86 GFLOPS), whole they are 3 ymm and a half, 128 GFLOPS (TG_CPU=haswell,
      // Zen 5; bench/torch_compare conv_dx, alternated: 35.1 / 37.4 -> 24.8 / 28.6 ms)
      if (inner && n > 2 * w && n <= 4 * w && a < w) a = n;
      if (!a) continue;
      split(OptOp::UPCAST, i, a);
      // the first upcast is the axis the copies are contiguous in (the expander's order): the vectors', not the
      // short store axis's (LLVM packed the 2 copies of b into <2 x float> FMAs with ow's values broadcast)
      std::swap(opts[opts.size() - 1], opts[opts.size() - 2]);
      upcast *= a;
      vec = int(i), vec_amt = a, short_vec = false;
      return;
    }
  }

  // 1c. An elementwise kernel whose store axis takes no vector (a padded output's odd rows: 322 = 320 + 2 for the
  //     next convolution's padding; 6625 classes): vectors (or copies of an odd divisor) along the output axis that
  //     the load bytes favour most. Each load weighs its element size times the elements it reads (the sizes of
  //     the axes it depends on): for the axis, contiguous along it counts plus, a gather (it depends on the axis
  //     with another stride) minus, a broadcast nothing. A transposed read (a channels-last result read back in
  //     NCHW order, its channels 32 floats apart along the row) then loads whole cache lines instead of one float
  //     per line (PaddleOCR det's E_32_322_322, 36 ms); a softmax's last kernel over 6625 classes reads its rows
  //     along the classes, not 40 rows at once with the per-row max and sum.
  //     Reduce kernels take this step after steps 1a-1b (`reduce_kernels`), where neither their store nor a reduce
  //     axis gave vectors: a max pool's input gradient stored NCHW from a channels-last input (mnist's
  //     r_512_32_10_10: its store's 10 columns read the input 64 floats apart, so step 1 declines them) took a
  //     register tile of 16 batch rows of scalar copies, 4.5 / 5.5 ms; vectors along the channels 3.0 / 3.6 ms
  //     (Zen 4, 2 threads; its 3x3 sibling r_512_64_3_3 0.66 -> 0.26 ms).
  void load_vectors(bool reduce_kernels = false) {
    if (reduce != reduce_kernels || vec >= 0 || rows) return;
    double best = 0;
    for (size_t i = 0; i < n_out; i++) {
      if (!vector_amount(size[i])) continue;
      double score = 0;
      for (size_t li = 0; li < acc.loads.size(); li++) {
        const UOp* l = acc.loads[li];
        if (!depends_on(l, axes[i])) continue;
        auto c = index_coef(l, axes[i]);
        score += (c && *c == 1 ? 1.0 : -1.0) * out_bytes(li, size);
      }
      if (score > best) best = score, vec = int(i);
    }
    if (vec >= 0) {
      int64_t a = vector_amount(size[size_t(vec)]);
      split(OptOp::UPCAST, size_t(vec), a);
      upcast *= a;
      vec_amt = a;
    }
  }

  // A tile's store: `copies` runs far apart, each `span` elements of `item` bytes within a line's distance, `elems`
  // elements in all. The lines it touches, and the bytes it writes per line touched in 8-byte steps (its fill).
  static std::pair<double, double> line_fill(double elems, double span, double copies, double item) {
    const double lines = copies * std::ceil(span * item / double(kLineBytes));
    return {std::floor(elems * item / lines / 8), lines};
  }

  // the gates of the kernel's gated loads, and whether one of them depends on output axis i (a padding's rows)
  std::vector<const UOp*> load_gates() const {
    std::vector<const UOp*> gates;
    for (const UOp* l : toposort(ast.get()))
      if (l->op == Ops::LOAD && l->nsrc() == 3) gates.push_back(l->src(2));
    return gates;
  }
  bool gated(const std::vector<const UOp*>& gates, size_t i) const {
    return std::any_of(gates.begin(), gates.end(), [&](const UOp* g) { return depends_on(g, axes[i]); });
  }

  // 1d. An elementwise kernel whose store is vectorised along one axis and whose loads, by bytes, run contiguously
  //     along another output axis while they stride along the store's: a transpose (a matrix's .T made contiguous,
  //     NCHW <-> NHWC). Upcasting that axis too makes a tile: each of its rows loads whole cache lines and each column
  //     stores them, instead of one float per line read at a stride (a 4096^2 transpose at 2.3 GB/s: 16 KiB apart,
  //     its lines map to a few cache sets and are evicted before the next row uses them).
  //     Where the tile's rows are read a multiple of 4 KiB apart (a power-of-two row of 1024 floats or more) and the
  //     store axis's loop runs inside the loop along the rows, the rows are 4 cache lines long where the axis and the
  //     copies allow. Such rows all fall in one L1 set and in a few of L2's: a tile row of one vector reads 64 bytes,
  //     and the next 64 (fetched with it: x86 prefetches lines in aligned pairs) are read only after the whole column
  //     of tiles below it, evicted by then. Zen 4, 2 threads, best of 25, alternated rounds: a 4096^2 .T with rows of
  //     16 floats 8.9-9.5 ms, 32 5.8-6.5, 64 3.8-5.9; TG_CPU=haswell (vectors of 8) rows of 8 8.0-8.1, 16 6.3-7.5,
  //     32 5.5-5.7, 64 5.5-5.6; 2048^2 0.74-0.83 -> 0.66-0.67 ms; 1024^2 (in L3) 0.12-0.20 -> 0.13-0.15 (noise).
  //     Other kernels keep rows of w. A store axis taken whole leaves no loop of tiles below: the next tile reads the
  //     rest of the lines at once (attention's K^T copies, 32 x 1024 x 32 and 24 x 3072 x 32, were no faster with
  //     longer rows; in vectors of 8 their axis of 32 keeps a loop, and TG_CPU=haswell took them 1.7-2.1x faster).
  //     Other strides spread the rows over the sets: mnist's NHWC -> NCHW copy (512 x 32 x 400, rows 128 bytes
  //     apart, the rest of a line read 50 KiB later from L2) took 1.9 ms with rows of 16 channels, 2.0-2.4 with all
  //     32 (twice the store streams); a 3000 x 2000 .T showed no difference beyond the noise.
  // 1e. An elementwise kernel whose store vector is narrower than the machine's (a 4-wide tile column on a machine of
  //     16 or 8 lanes) and that reads through gates: copies of the outermost output axis that no gate depends on, up
  //     to the machine's width (at most 4). A loop trip of one short vector is mostly its gates' branches, loop and
  //     index work: Winograd's sum of shifted tile gradients (E_128_32_28_28, 4 gated loads a vector of 4), alone,
  //     best of 10 calls (Zen 5, 2 threads, quiet): 2.06-2.18 -> 0.94-0.98 ms with 4 copies of the batch;
  //     TG_CPU=haswell 1.67 -> 1.14 ms with 2 (0.88 with 4). Copies of an axis a gate depends on are not taken: 2 of
  //     the tile's rows, 2.36-2.46 ms.
  void gated_copies() {
    if (reduce || rows || vec < 0 || upcast >= w) return;  // (a transpose tile has its copies already)
    const std::vector<const UOp*> gates = load_gates();
    if (gates.empty()) return;
    const int64_t want = std::min<int64_t>(w / upcast, 4);
    if (want < 2) return;
    for (size_t i = 0; i < n_out; i++) {
      if (int(i) == vec || size[i] < want || size[i] % want != 0) continue;
      if (gated(gates, i)) continue;
      split(OptOp::UPCAST, i, want);
      upcast *= want;
      return;
    }
  }

  // 1f. An elementwise kernel that writes less than a line of each output row a tile touches: its vector runs along its
  //     loads while its store gathers (a scalar per lane, planes apart), or its store's vector is a short row in a
  //     transpose tile (AVX2 takes a row of 6 whole: 24 bytes), and the output is past the threads' L2s. It takes the
  //     copies of the store's nearby axes (each within a line's distance along the store; the short row, srow, whole)
  //     that write the most bytes per line a tile touches (in 8-byte steps), and of those the fewest lines, at most 256
  //     copies in all: the tiles that complete a line come after every other plane's (the reduce kernels' store fill in
  //     step 2 for the same stores). Winograd's tile gradient moved into its (8, 8, C, N, 6, 6) planes
  //     (E_8_8_32_128_6_6, 8 points a vector), timed alone after a 64 MiB sweep (Zen 5, 2 threads): 2.11 ms as vectors
  //     alone, 1.97 with the row of 6 (24 bytes a line), 1.58 with 2 of its rows (48 bytes, 1 line), 1.69 with BEAM's
  //     pick (2 rows x 2 images); TG_CPU=haswell (the row as the store's vector, the points a transpose tile's rows)
  //     2.31 -> 1.97 ms with 2 rows. Not copies of an axis a load's gate depends on (a padding's rows: step 1e's
  //     measure): Winograd's padded tile rows (E_128_32_6_8_6_8, vectors of 4 along the store) took 2 of them in place
  //     of 2 copies of the batch, 1.07-1.27 -> 1.27-1.65 ms.
  void store_rows() {
    if (reduce || rows || vec < 0 || upcast >= kMaxUpcast || cfg.l2_bytes <= 0) return;
    const int64_t item = store_item();
    if (item <= 0 || store_bytes() <= double(cfg.l2_bytes * cfg.threads)) return;
    // a store along the vector: only a transpose tile's (its loads read whole lines along the tile's rows, its
    // stores less than a line of each where the vector is short); elsewhere the loads along the store's axes decide
    // (Winograd's output transform E_128_32_24_24, vectors of 4 along its rows, read 64 planes a tile column: 3
    // columns at once, 0.89-1.09 -> 1.20-1.29 ms)
    const auto cv = index_coef(st, axes[size_t(vec)]);
    if (cv && std::llabs(*cv) <= 1 && (!transposed || vec_amt * item >= kLineBytes)) return;
    // the nearby axes, each with its store coefficient and the copies an earlier step took (AVX2's row of 6 in
    // step 1, whole where it is from half to twice the vector)
    struct Near {
      size_t i;
      int64_t coef, before;
    };
    const std::vector<const UOp*> gates = load_gates();
    std::vector<Near> near;
    size_t srow = n_out;
    for (size_t i = 0; i < n_out; i++) {
      auto c = index_coef(st, axes[i]);
      if (!c || *c <= 0 || *c * item >= kLineBytes || size0[i] % size[i] != 0) continue;
      if (gated(gates, i)) continue;
      if (*c == 1 && size0[i] <= 8) srow = near.size();
      if (size0[i] > 1) near.push_back({i, *c, size0[i] / size[i]});
    }
    if (srow == n_out) return;
    std::vector<int64_t> am(near.size(), 1), best_am;
    double best_fill = 0, best_lines = 0;
    std::function<void(size_t, int64_t)> visit = [&](size_t k, int64_t copies) {
      if (k == near.size()) {
        double span = 1, elems = 1;
        for (size_t x = 0; x < near.size(); x++) {
          const double n = double(near[x].before * am[x]);
          span += (n - 1) * double(near[x].coef), elems *= n;
        }
        const auto [fill, lines] = line_fill(elems, span, 1, double(item));
        if (fill > best_fill || (fill == best_fill && lines < best_lines)) best_fill = fill, best_lines = lines, best_am = am;
        return;
      }
      const int64_t n = size[near[k].i];
      for (int64_t a : {int64_t(1), int64_t(2), int64_t(3), int64_t(4), int64_t(6), int64_t(8)}) {
        if (k == srow) a = n;  // the row whole
        if (n % a == 0 && copies * a <= kMaxUpcast) am[k] = a, visit(k + 1, copies * a);
        if (k == srow) break;
      }
      am[k] = 1;
    };
    visit(0, upcast);
    for (size_t x = 0; x < best_am.size(); x++)
      if (best_am[x] > 1) split(OptOp::UPCAST, near[x].i, best_am[x]), upcast *= best_am[x];
  }

  static constexpr int64_t kTileRowLines = 4, kMaxTileCopies = 1024;
  void transpose_tile() {
    if (reduce || vec < 0 || short_vec || !getenv_int("TRANSPOSE_TILE", 1)) return;
    double best = 0;
    int pick_axis = -1;
    for (size_t i = 0; i < n_out; i++) {
      if (int(i) == vec || size[i] <= 1 || !pick(size[i], {int64_t(w), int64_t(w / 2), 4})) continue;
      double score = 0, heaviest = 0;
      int64_t isz = 4, row_stride = 0;  // the heaviest transposed load's element size and row stride (bytes)
      for (size_t li = 0; li < acc.loads.size(); li++) {
        const UOp* l = acc.loads[li];
        auto ci = index_coef(l, axes[i]), cv = index_coef(l, axes[size_t(vec)]);
        if (!depends_on(l, axes[i]) || !depends_on(l, axes[size_t(vec)])) continue;
        if (ci && *ci == 1 && !(cv && *cv == 1)) {
          score += out_bytes(li, size0);
          if (out_bytes(li, size0) > heaviest) {
            heaviest = out_bytes(li, size0), isz = std::max<int64_t>(int64_t(acc.load_bytes[li]), 1);
            row_stride = cv ? std::abs(*cv) * isz : 0;
          }
        }
        if (cv && *cv == 1) score -= out_bytes(li, size0);
      }
      if (score > best) best = score, pick_axis = int(i), load_isz = isz, load_row_stride = row_stride;
    }
    if (pick_axis < 0) return;
    // Rows of w (or kTileRowLines lines, above): a store axis taken whole (up to 2w) makes up to 2w x w copies, past
    // the expander's 256 that BEAM keeps to; a copy kernel's body is small (a 32-channel NCHW -> NHWC copy, tiles of
    // 32 x 16 against 32 x 8: 40 against 19-28 GB/s, loaded; about 0.1 s more to compile). At most kMaxTileCopies.
    const int64_t line = std::max<int64_t>(kLineBytes / load_isz, 1), n = size[size_t(pick_axis)];
    const bool long_rows = load_row_stride > 0 && load_row_stride % kPageBytes == 0 && vec > pick_axis &&
                           size[size_t(vec)] > 1;  // the store axis's loop runs inside the tile rows' loop
    int64_t a = 0;
    for (int64_t c : {kTileRowLines * line, 2 * line, int64_t(w), int64_t(w / 2), int64_t(4)})
      if (!a && (long_rows || c <= w) && vec_amt * c <= kMaxTileCopies && pick(n, {c})) a = c;
    if (!a) return;
    // An output written past the caches (step 6) gets whole lines from each tile column: a vector shorter than a
    // line (AVX2's 8 floats) is widened to one, else the two halves of each line go out at different times and
    // the stores stay cached (mark_nontemporal_stores). The widening comes before the tile's rows, so the expander
    // puts a line's vectors next to each other, row by row: after them, the 64 rows' first halves went out before
    // their second halves, more lines partly written than the core's write-combining buffers hold (a 4096^2 .T
    // under TG_CPU=haswell, bench/bandwidth on Zen 5, alternated: 8.2 -> 3.6 ms; native vectors of 16: 2.9 ms).
    const int64_t item = store_item(), block = vec_amt * item;
    if (past_caches() && item > 0 && block < kLineBytes && kLineBytes % block == 0) {
      const int64_t widen = kLineBytes / block;
      if (size[size_t(vec)] % widen == 0 && a * vec_amt * widen <= kMaxTileCopies)
        split(OptOp::UPCAST, size_t(vec), widen), upcast *= widen, vec_amt *= widen;
    }
    split(OptOp::UPCAST, size_t(pick_axis), a);
    upcast *= a;
    transposed = true;
    store_loop_first(size_t(pick_axis), a);
  }

  // 1e. The loop order of a transpose tile: the tile reads its rows from lines load_row_stride bytes apart and
  //     writes a rows of the output. Rows a page (4 KiB) or more apart are streams of their own to the hardware
  //     prefetcher (which follows one stream within a page); rows closer are one stream. With the store axis's loop
  //     innermost (as the axes come) the loads read all of that axis's rows at once; with it outermost only the
  //     tile's, while the output rows along the loads' axis become the streams. The order with at most half the
  //     streams wins: an NCHW -> NHWC copy of 64 channels (64 x 64 x 56 x 56, planes 12.5 KiB apart, pixels 256
  //     bytes apart in the output) read 64 planes at once, 3.8-4.0 ms (Zen 4, 2 threads, alternated rounds); with
  //     the channel blocks outermost 16 planes and one output stream, 3.0-3.4. A 4096^2 .T keeps its order (its
  //     output rows are 16 KiB apart too: 4096 + 64 streams against 16 + 4096; swapped, 9.6 ms against 4.1-5.0).
  void store_loop_first(size_t pick_axis, int64_t a) {
    if (reserved || vec < 0 || size_t(vec) + 1 != n_out || size[size_t(vec)] <= 1) return;
    auto o = index_coef(st, axes[pick_axis]);
    if (!o) return;
    const int64_t item = store_item();
    // Outermost, the store axis's blocks write their part of each output row at a different time: whole lines only.
    // A block of vectors shorter than a line is widened to one (an NCHW -> NHWC copy in vectors of 8 channels,
    // TG_CPU=haswell: 32 of each 64 bytes at a time 5.5-5.9 ms, blocks of 16 channels 3.5-3.7, the axes' order
    // 4.3-4.5).
    const int64_t block = vec_amt * item, widen = block < kLineBytes ? kLineBytes / std::max<int64_t>(block, 1) : 1;
    if (block * widen != std::max(block, kLineBytes) || size[size_t(vec)] % widen != 0 || size[size_t(vec)] / widen <= 1)
      return;
    const bool load_rows_apart = load_row_stride >= kPageBytes, store_rows_apart = std::abs(*o) * item >= kPageBytes;
    const double inner = double(vec_amt) * double(size[size_t(vec)]);  // the store axis's rows in its loop
    const double streams_now = (load_rows_apart ? inner : 1) + (store_rows_apart ? double(a) : 1);
    const double streams_first = (load_rows_apart ? double(vec_amt * widen) : 1) +
                                 (store_rows_apart ? double(a) * double(size[pick_axis]) : 1);
    if (2 * streams_first > streams_now || a * vec_amt * widen > kMaxTileCopies) return;
    if (widen > 1) split(OptOp::UPCAST, size_t(vec), widen), upcast *= widen, vec_amt *= widen;
    for (size_t k = 0; k < size_t(vec); k++) {  // rotate: each SWAP exchanges two axes' places in the loop order
      opts.push_back({OptOp::SWAP, int(k), vec});
      std::swap(axes[k], axes[size_t(vec)]), std::swap(size[k], size[size_t(vec)]), std::swap(size0[k], size0[size_t(vec)]);
    }
    vec = 0;
  }

  // A row kernel (the scheduler's row fusion: softmax, layernorm): some reduce is computed once per row, outside
  // the output loops inside it. Every reduce axis the loads are contiguous in gets vector lanes; no register tile
  // (the loads of a row are not shared between rows).
  void row_lanes() {
    for (const UOp* n : toposort(ast.get()))
      if (n->op == Ops::REDUCE)
        for (size_t i = 0; i < n_out; i++) rows |= depends_on(st, axes[i]) && !depends_on(n, axes[i]);
    if (!rows) return;
    for (size_t i = n_out; i < axes.size(); i++)
      if (int64_t a = loads_contiguous(i) ? pick(size[i], {int64_t(2 * w), int64_t(w), int64_t(w / 2), 4}) : 0)
        split(OptOp::UNROLL, i, a);
  }

  // 1b. A reduce kernel with no vectorised output axis (a convolution's weight gradient: the output is the small
  //     kernel; a batch norm's per-channel variance): vector accumulators along a reduce axis that every load
  //     depending on it is contiguous in (UNROLL: one partial sum per lane, combined after the loop). Every REDUCE
  //     gets its own lanes on its innermost such axis: a variance whose mean is computed in the same kernel has two
  //     REDUCEs over different ranges, and the one left without lanes summed 4096 terms in one scalar chain (a
  //     relative error of 1.5e-5 against 6e-8 for libtorch's, and no vectors). Only the first when a short output
  //     axis was unrolled into copies: each copy's REDUCEs get lane loops of their own (ONNX GridSample's kernel,
  //     6 copies x 4 REDUCEs, went past the linearizer's limit, then 128 loops).
  void reduce_lanes() {
    if (!reduce || rows || (vec >= 0 && !short_vec)) return;
    bool first = true;
    int given = 0;  // at most 4 REDUCEs get lanes (each is ~5 lane loops: init, update, halving combine)
    for (const UOp* n : toposort(ast.get())) {
      if (n->op != Ops::REDUCE || (!first && short_vec) || given >= 4) continue;
      for (size_t i = axes.size(); i-- > n_out;) {
        if (std::find_if(n->src().begin() + 1, n->src().end(), [&](const UOpRef& r) { return r.get() == axes[i]; }) ==
            n->src().end())
          continue;  // not this REDUCE's axis
        bool any = false;
        bool all_contiguous = loads_contiguous(i, &any);
        int64_t a = any && all_contiguous ? pick(size[i], {int64_t(2 * w), int64_t(w), int64_t(w / 2), 4}) : 0;
        if (a) {
          split(OptOp::UNROLL, i, a);
          if (first) upcast *= a, vec = int(i), vec_amt = a, first = false;
          given++;
          break;
        }
      }
    }
  }

  // 2. Reduce kernels: a register tile over output axes whose loads are shared (matmul and conv shaped): the one
  //    with the fewest loads per accumulator (a load is repeated for every copy of the axes it depends on; one
  //    contiguous along the vectorised axis is one vector load per vector; one contiguous along a reduce loop
  //    counts a quarter: the next iterations find its cache line loaded). False when the kernel has fewer tiles
  //    than the rank asked for.
  bool register_tile() {
    if (!reduce || rows) return true;
    std::vector<int64_t> amt(axes.size(), 1);
    if (vec >= 0) amt[size_t(vec)] = vec_amt;
    // A broadcast (a load that does not depend on the vectorised axis) is an instruction of its own below AVX-512
    // (vbroadcastss into a register, each copy; AVX-512's FMA takes it as a {1to16} memory operand): it counts fully,
    // streaming or not. With TG_CPU=haswell mnist's 3x3 conv r_512_8_8_64 as 3 batch rows x 4 columns x 1 vector (12
    // broadcasts + 1 load per 12 FMAs, ranked first at a quarter each) took 16-17 ms on one core, as 3 rows x 4
    // vectors (3 + 4) 11.7-12.1 ms.
    const bool broadcast_instr = w < 16, out_vec = vec >= 0 && size_t(vec) < n_out;
    double reduce_trips = 1;  // the reduce loop's iterations per output
    for (size_t j = n_out; j < axes.size(); j++) reduce_trips *= double(std::max<int64_t>(size0[j], 1));
    // loads per accumulator of a tile: amounts `am` per axis (am[vec] includes the vector itself)
    auto loads_per_acc = [&](const std::vector<int64_t>& am) {
      double n = 0, total = 1;
      for (int64_t x : am) total *= double(x);
      for (const UOp* l : acc.loads) {
        // a load outside the reduce loop (a channel's mean or scale) is read once per output, not once per
        // accumulation: its share is amortised over the loop's trips (a 2x2 max pool's 4, a batchnorm sum's 800).
        // One that depends only on axes the tile holds whole is read once per kernel: the loop-invariant loads are
        // hoisted out of every loop (a batchnorm's scale and shift beside a max pool over its 32 channels; a tile of
        // 8 batch rows was ranked as sharing them, and its 2 x 8 x 2 accumulators spilled: 13 GB/s)
        bool invariant = !in_reduce_loop(l);
        for (size_t j = 0; j < n_out && invariant; j++)
          invariant = !depends_on(l, axes[j]) || (size0[j] > 0 && am[j] >= size0[j]);
        const double weight = invariant ? 0.0 : in_reduce_loop(l) ? 1.0 : 1.0 / reduce_trips;
        double copies = 1;
        // Streams: successive iterations of a reduce loop read adjacent memory: contiguous along it, or (the tile
        // reading a whole block per iteration) strided by exactly the block the tile reads along the vectorised
        // axis: B packed in panels of 32 columns, read 32 columns at a time. Such loads are served by lines already
        // fetched; a tile that reads part of each panel row instead (8 of 32) skips through memory. Only one block
        // stream: the packing keeps one panel (K x 128 bytes, 512 KiB at K=4096) in L2 while A streams past it, and
        // a tile reading several panels at once multiplies that.
        bool streams = false;
        std::optional<int64_t> cvec = vec >= 0 ? index_coef(l, axes[size_t(vec)]) : std::nullopt;
        for (size_t o = 0; o < n_out && cvec; o++)
          if (int(o) != vec && am[o] > 1 && depends_on(l, axes[o])) cvec.reset();
        for (size_t j = 0; j < axes.size(); j++) {
          auto c = index_coef(l, axes[j]);
          if (j >= n_out && size[j] > 1 && c && depends_on(l, axes[j]) &&
              (*c == 1 || (cvec && *cvec == 1 && *c == am[size_t(vec)])))
            streams = true;
          if (am[j] == 1 || !depends_on(l, axes[j])) continue;
          // contiguous along the vectorised axis: one load per register of it
          copies *= int(j) == vec && c && *c == 1 ? double((am[j] + w - 1) / w) : double(am[j]);
        }
        n += weight * copies * (streams && !(broadcast_instr && out_vec && !depends_on(l, axes[size_t(vec)])) ? 0.25 : 1.0);
      }
      return n / total;
    };
    // Cache lines a tile's loads bring in per trip of the innermost reduce loop: each trip moves a load's footprint
    // in the tile by its stride along that loop. A footprint moved by a line or more touches lines of its own every
    // trip (its bytes within a line's distance, rounded up to whole lines, for each copy further apart); one moved by
    // less shares its lines with the next trips (the stride's bytes a trip and copy). Where the tile's streams run
    // past L1 (assumed: a kernel whose data fits L1 is too short for the difference to show) these lines come from
    // L2, kL2FillBytes a cycle, and the tile waits on them where that is longer than its FMAs take (total / w vector
    // FMAs a trip at the machine model's rate). With TG_CPU=haswell mnist's weight gradient
    // r_128_32_5_5_32 (the input and the output's gradient channels-last, 128 bytes a position apart; the loads
    // model ranks the first first: the input's 4 vectors read a whole block a trip) took 74 ms a step at 140 GFLOPS
    // as 2 output channels x 4 vectors of input channels (2 + 1 lines a trip: 6 cycles of L2 for 4 of FMAs),
    // 63.5 ms at 170 as 4 x 2 vectors (1 + 1 lines: 4 cycles), 66 ms as 8 x 1 vector (1 + 1, 9 loads a trip).
    size_t trip = axes.size();  // the innermost reduce axis
    for (size_t j = axes.size(); j-- > n_out;)
      if (size0[j] > 1) {
        trip = j;
        break;
      }
    // per load read in the reduce loop and moved by its trips: its stride along the trip axis in bytes, and per
    // output axis it depends on, the bytes between copies (none: not affine there) and whether the copies slide with
    // the trips (index and depends_on walk the load's graph: once per kernel, not once per tile)
    struct AxisRead {
      size_t j;                     // the output axis
      std::optional<double> coef;   // |coefficient| in elements
      bool slides;                  // equal to the trip's
    };
    struct TripLoad {
      double step, isz;  // bytes a trip moves it; its element's bytes
      std::vector<AxisRead> axes;
    };
    // An access's footprint in a tile of amounts am: its elements within a line's distance of each other along the
    // tiled axes (span) and the copies further apart; copies that slide with the reduce loop's trips are not counted
    // (a convolution's kernel columns: each trip brings in one new copy, the others were the earlier trips')
    auto footprint = [&](const std::vector<AxisRead>& reads, const std::vector<int64_t>& am, double isz) {
      double span = 1, copies = 1;
      for (const auto& [j, c, slides] : reads) {
        if (am[j] == 1 || slides) continue;
        if (c && *c * isz < double(kLineBytes)) span += double(am[j] - 1) * *c;
        else copies *= double(am[j]);
      }
      return std::pair{span, copies};
    };
    std::vector<TripLoad> trip_loads;
    if (out_vec && vec_amt >= w && trip < axes.size())
      for (size_t li = 0; li < acc.loads.size(); li++) {
        const UOp* l = acc.loads[li];
        auto ct = index_coef(l, axes[trip]);
        if (!ct || *ct == 0 || !in_reduce_loop(l)) continue;
        const double isz = double(acc.load_bytes[li]);
        TripLoad t{double(std::llabs(*ct)) * isz, isz, {}};
        for (size_t j = 0; j < n_out; j++) {
          if (!depends_on(l, axes[j])) continue;
          auto c = index_coef(l, axes[j]);
          t.axes.push_back({j, c ? std::optional(double(std::llabs(*c))) : std::nullopt, c && *c == *ct});
        }
        trip_loads.push_back(std::move(t));
      }
    auto l2_excess = [&](const std::vector<int64_t>& am, int64_t total) {
      if (trip_loads.empty()) return 0.0;  // a tile of full vectors along an output axis, loads moved by the trips
      double lines = 0;
      for (const TripLoad& t : trip_loads) {
        const auto [span, copies] = footprint(t.axes, am, t.isz);
        lines += copies * (t.step >= double(kLineBytes) ? std::ceil(span * t.isz / double(kLineBytes)) : t.step / double(kLineBytes));
      }
      // in quarters: the lines are an estimate (prefetchers, lines shared between trips), so only a tile a quarter
      // or more past its FMAs' time ranks lower (a 2-row x 4-vector AVX2 matmul's 2.125 lines a trip: 4.25 cycles
      // for 4)
      const double fma_cycles = double(total) / double(w) / cfg.fma_per_cycle;
      return std::floor(std::max(0.0, lines * double(kLineBytes) / kL2FillBytes / fma_cycles - 1.0) * 4) / 4;
    };
    // Accumulators in at most half the vector registers: 16 of AVX-512's 32 (256 floats at its width of 16), 8 of
    // AVX2's 16 (64 floats); vectors narrower than the registers (lanes of 4 along a short reduce axis) may take
    // three quarters. A 1024 matmul: a 32x8 tile runs at 1.2-1.5x the speed of a 16x8 one; a 5x5 conv weight
    // gradient: 5x4 copies of 4 lanes at 1.7x 5x8x2 scalar copies. A kernel of several accumulators per output
    // (a float max's two, two sums over one input) shares them out.
    const int64_t regs = cfg.vector_registers;
    const int64_t vec_regs = (vec_amt + w - 1) / w * accs;  // registers one copy of the vector takes, all accumulators
    const int64_t half_acc =
        vec < 0 ? 16 / accs : vec_amt < w ? regs * 3 / 4 * vec_amt / accs : regs / 2 / vec_regs * vec_amt;
    // BEAM's seeds (ranks from 1) come from a wider space: row amounts of 3 and 6 too, and accumulators of full
    // vectors in up to three quarters of the registers (at most 256 copies): the search times what the load model
    // cannot tell apart (a 1536 matmul's 6 rows x 2 vectors ran at 0.44x OpenBLAS, 3 x 4 at 1.00x). Rank 0 stays the
    // heuristic's choice.
    const bool wide = tile_rank > 0;
    // FMA chains: each accumulator register is a chain of dependent FMAs, and the pipes idle unless about latency x
    // FMAs-per-cycle chains are in flight (cfg.fma_chains: LLVM's scheduling model of the CPU, plus slack). Where half
    // the registers hold fewer (AVX2's 8 of 16 ymm, against 10 for Zen's 4 cycles x 2 pipes, 12 for Haswell's 5 x 2),
    // the heuristic takes the wide space too (rows of 3, not 6: a 32 x 256^3 batched matmul's 6 x 2 tile took 20.7 ms,
    // its 8 x 1 one 12.2 ms) and ranks first the tiles with enough chains: on Zen 5 with TG_CPU=haswell
    // 8 chains gave 98 of the 111 GFLOPS one core reaches with 12, and a 1536 matmul's 3 rows x 4 vectors ran at 1.00x
    // OpenBLAS against 0.87x for 2 x 4. AVX-512's 16 of 32 zmm are above every CPU's need.
    const bool full_vec = vec >= 0 && vec_amt >= w;
    const bool latency_bound = full_vec && regs / 2 < cfg.fma_chains;
    const int64_t max_acc = (wide || latency_bound) && full_vec
                                ? std::max(half_acc, std::min<int64_t>(regs * 3 / 4 / vec_regs * vec_amt, 256))
                                : half_acc;
    // Registers a tile of full vectors holds in the reduce loop: its accumulators, the vector operand in flight and,
    // where the FMAs reuse operands across several vectors, every copy of the operands along the other tiled axes:
    // the expander puts the vectorised axis's copies innermost, and LLVM loads the copies of the outer axes (each
    // broadcast, each vector load at another row or kernel column) first, then walks the vectors one at a time. A
    // tile past the machine model's registers spills an accumulator in its inner loop, and that FMA chain then waits
    // on a store and reload each step. With TG_CPU=haswell mnist's 3x3 conv r_512_8_8_64 took 3 batch rows x 2
    // columns x 2 vectors (12 + 6 broadcasts + 1 = 19 of 16 ymm), 22-35 ms on one core, against 11-14 ms for 3 rows x
    // 4 vectors (12 + 3 + 1 = 16); its weight gradient r_128_64_3_3_32 4 output channels x 3 kernel columns x 1
    // vector (12 + 4 broadcasts + 3 vectors) 25 ms against 13 ms for 2 channels x 4 vectors.
    auto fits_registers = [&](const std::vector<int64_t>& am, int64_t total) {
      if (!full_vec || !out_vec) return true;
      const int64_t along_vec = (am[size_t(vec)] + w - 1) / w;  // vector registers along the vectorised axis
      int64_t held = 0, vector_copies = 1, broadcast_copies = 1;
      for (const UOp* l : acc.loads) {
        int64_t copies = 1;  // copies along the other tiled axes
        for (size_t j = 0; j < n_out; j++)
          if (int(j) != vec && am[j] > 1 && depends_on(l, axes[j])) copies *= am[j];
        if (depends_on(l, axes[size_t(vec)])) vector_copies = std::max(vector_copies, copies);
        else held += copies, broadcast_copies = std::max(broadcast_copies, copies);
      }
      // one vector operand: each broadcast feeds one FMA (one in flight); vector copies along another axis are held
      // where broadcast copies reuse them (each feeds one FMA otherwise: the rows of a row-wise sum)
      if (along_vec == 1 && vector_copies == 1) held = std::min<int64_t>(held, 1);
      if (vector_copies > 1 && broadcast_copies > 1) held += vector_copies;
      return total / vec_amt * vec_regs + 1 + held <= regs;
    };
    // rows of 3 that do not divide a long axis: PADTO rounds it up (at most 1/64 of the axis recomputed: 1024 rows in
    // 342 tiles of 3, 256 in 86; where latency-bound up to 1/16, weighing its loads (`busy`): 32 rows in 11 tiles of 3)
    auto padded = [&](size_t i, int64_t a) { return (size[i] + a - 1) / a * a; };  // axis i rounded up to a
    auto fits = [&](size_t i, int64_t a) {
      return size[i] % a == 0 || (a % 3 == 0 && int(i) != vec && (padded(i, a) - size[i]) * (latency_bound ? 16 : 64) <= size[i]);
    };
    // Every tile within max_acc (amounts 1, 2, 4, 8 and 16 on each output axis whose loads are shared; the vectorised
    // axis may widen by 2 or 4: several vectors of it share the other operand's broadcast); the fewest loads per
    // accumulator wins, ties by the smaller strides of the split axes (nearby addresses), then the bigger tile.
    // 16 rows fit where a row's accumulators are one vector (AVX-512's 16 of 32 zmm): q4_0's matvec (INT_DOT, one
    // vector of 16 lanes a row) shares each block's x work (its loads, the interleave and the -8 offset's products)
    // between twice the rows, 0.555-0.571 -> 0.510-0.513 ms (bench/qmatvec 8192 x 2048 in cache, Zen 5, THREADS=1,
    // alternated, load 2.5-4); BEAM found the same tile (452 us against 518 for 8 rows).
    std::vector<size_t> cand;
    for (size_t i = 0; i < n_out; i++)
      if (shares(i) && size[i] > 1 && !gated_with_reduce(i)) cand.push_back(i);
    auto strides_of = [&](const std::vector<int64_t>& am) {
      double s = 0;
      for (size_t i : cand)
        if (am[i] > (int(i) == vec ? vec_amt : 1))
          for (const UOp* l : acc.loads)
            if (depends_on(l, axes[i])) {
              auto c = index_coef(l, axes[i]);
              s += c ? double(std::llabs(*c)) : 1e18;
            }
      return s;
    };
    // The store's line fill, where the store is scalar copies along a short row past L2: the output axis the store
    // is contiguous in (srow) is short (at most 8) and not the vectorised one (its loads gather along it), and the
    // output is larger than the threads' L2s. Such a tile writes part of each line it touches, and the next tiles
    // complete those lines; by then evicted where the tile's copies fill the sets (output planes a multiple of 4 KiB
    // apart all fall in one). The bytes a tile writes per line it touches (in 8-byte steps) rank before the loads
    // per accumulation. Winograd's output-transform adjoint (dy read 4 floats a tile column, stored as (4, 8, C, N,
    // 6, 6), planes 576 KiB apart; Zen 5, 2 threads): 4 rows x 8 points x 2 x 2 tiles, 32 lines a tile 16 bytes
    // each, 9.5 ms (4 GB/s); 8 points x 6 columns x 4 rows (24 bytes) 6.1 ms; 8 x 6 x 2 rows x 2 tile rows (16
    // lines of 48 bytes, BEAM's pick) 2.0 ms.
    size_t srow = axes.size();
    const double sitem = double(store_item());
    if (sitem > 0 && cfg.l2_bytes > 0 && store_bytes() > double(cfg.l2_bytes * cfg.threads))
      for (size_t i = 0; i < n_out; i++)
        if (int(i) != vec && size[i] > 1 && size[i] <= 8)
          if (auto c = index_coef(st, axes[i]); c && *c == 1) srow = i;
    std::vector<AxisRead> st_reads;  // the output axes the store depends on, its |coefficient| along each
    for (size_t j = 0; j < n_out && srow < axes.size(); j++)
      if (depends_on(st, axes[j])) {
        auto c = index_coef(st, axes[j]);
        st_reads.push_back({j, c ? std::optional(double(std::llabs(*c))) : std::nullopt, false});
      }
    // Among tiles that fill their lines alike, the fewer lines a tile writes the better: each is a line the next
    // tiles complete (held in L1 until then) and a write stream of its own past L2; the loads such a tile shares
    // between more copies do not pay for that in a kernel that stores past the caches. The same adjoint with 16
    // planes x 48 bytes a tile (2 rows x 8 points x 2 tile rows x 6 columns, 192 accumulators: the fewest loads per
    // accumulation) against 8 planes x 48 bytes (96; BEAM's pick), timed alone after a 64 MiB sweep of other memory
    // (as it runs in the step; Zen 5, 2 threads): 1.30-1.89 ms against 0.48-0.66 ms.
    auto store_fill = [&](const std::vector<int64_t>& am) {
      if (srow == axes.size()) return std::pair{0.0, 0.0};
      double elems = 1;  // the elements a tile writes
      for (const AxisRead& r : st_reads) elems *= double(am[r.j]);
      const auto [span, copies] = footprint(st_reads, am, sitem);
      const auto [fill, lines] = line_fill(elems, span, copies, sitem);
      return std::pair{-fill, lines};
    };
    // Where latency-bound, a tile short of FMA chains ranks after every tile with enough (1). Short tiles stay ranked
    // by their loads: conv_dx's r_64_128_28_28 as 3 x 3 channels x 1 vector (9 chains) took 12.8-13.2 ms, 4 x 2
    // vectors (8) 10.2-10.4 ms (TG_CPU=haswell, Zen 5, alone, 2 threads). The rows a PADTO recomputes (a 3 that does
    // not divide its axis) weigh the loads per accumulation: each output computed costs its loads, and the padding's
    // outputs are computed for nothing (`busy`: the share of the tile's work that is kept). With TG_CPU=haswell
    // mnist's weight gradient r_128_32_5_5_32 (32 output channels) as 4 channels x 2 vectors (8 chains) took
    // 62.8-67.6 ms, as 3 channels (33 rows) x 4 vectors (12) 58.1-60.3 ms; its 3x3 siblings r_64_64_3_3_64 and
    // r_128_64_3_3_32 as 3 kernel columns x 4 vectors (a column's vectors are loads of their own: 13 loads per 12
    // FMAs) 9.8-10.3 and 8.2-8.4 ms, as 3 output channels (66 of 64, 3% padding) x 4 vectors (7 loads) 8.0-8.4 and
    // 7.0-7.2 ms (alone, alternated).
    auto idle = [&](int64_t total) {
      return latency_bound && total / vec_amt * vec_regs < cfg.fma_chains ? 1.0 : 0.0;
    };
    auto busy = [&](const std::vector<int64_t>& am) {
      double b = 1;
      for (size_t i : cand)
        if (const int64_t a = am[i] / amt[i]; a > 1 && size[i] % a) b *= double(size[i]) / double(padded(i, a));
      return b;
    };
    using Key = std::tuple<double, double, double, double, double, double, double>;
    auto key = [&](const std::vector<int64_t>& am, int64_t total, double strides) {
      const auto [fill, lines] = store_fill(am);
      return Key{idle(total), l2_excess(am, total), fill, lines, loads_per_acc(am) / busy(am), strides, -double(total)};
    };
    std::vector<std::pair<Key, std::vector<int64_t>>> tiles{{key(amt, upcast, 0), amt}};
    std::vector<int64_t> am = amt;
    // Rows of 3 and 6 outside the wide space: 3 alone where latency-bound. Output axes that every load and the store
    // read alike (one axis split in two: a weight's rows interleaved by R, viewed as (groups, R)) are one axis to
    // that rule, their amounts' product taken as its amount: the q4_0 matvec's rows interleaved by 4 took 3 groups x
    // 2 rows under TG_CPU=haswell (6 rows in 3 streams, 0.73x the plain layout's 4 rows) before.
    auto rows_of_three = [&](int64_t a) { return a % 3 == 0 && !(wide || (latency_bound && a == 3)); };
    // alike[x][y]: candidates x and y are not the vectorised axis and the store and every load read both or neither
    // (computed once, not per tile)
    std::vector<std::vector<bool>> alike(cand.size(), std::vector<bool>(cand.size(), false));
    for (size_t x = 0; x < cand.size(); x++)
      for (size_t y = x + 1; y < cand.size(); y++) {
        const UOp *a = axes[cand[x]], *b = axes[cand[y]];
        bool same = int(cand[x]) != vec && int(cand[y]) != vec && depends_on(st, a) == depends_on(st, b);
        for (const UOp* l : acc.loads) same = same && depends_on(l, a) == depends_on(l, b);
        alike[x][y] = same;
      }
    std::function<void(size_t, int64_t)> visit = [&](size_t k, int64_t total) {
      if (k == cand.size()) {
        // (the store's row taken whole counts as 1: its 3 or 6 is the row's, not a row count)
        auto rows_at = [&](size_t x) { return cand[x] == srow && am[srow] / amt[srow] == size[srow] ? 1 : am[cand[x]] / amt[cand[x]]; };
        for (size_t x = 0; x < cand.size(); x++) {
          int64_t rows = rows_at(x);
          size_t n_alike = 1;
          for (size_t y = x + 1; y < cand.size(); y++)
            if (alike[x][y]) rows *= rows_at(y), n_alike++;
          if (n_alike > 1 && rows_of_three(rows)) return;
        }
        if (am != amt && fits_registers(am, total))
          tiles.emplace_back(key(am, total, strides_of(am)), am);
        return;
      }
      size_t i = cand[k];
      bool v = int(i) == vec;
      std::vector<int64_t> amounts{1, 2, 3, 4, 6, 8, 16};
      if (i == srow && size[i] % 3 && size[i] % 4 && size[i] != 2) amounts.push_back(size[i]);  // 5, 7: the row whole
      for (int64_t a : amounts) {
        const bool whole_row = i == srow && a == size[i];  // of 3 or 6 too, outside the wide space
        if ((v && a > 4) || (a % 3 == 0 && !whole_row && (v || rows_of_three(a))) || !fits(i, a) || total * a > max_acc)
          continue;
        am[i] = amt[i] * a;
        visit(k + 1, total * a);
      }
      am[i] = amt[i];
    };
    visit(0, upcast);
    // A tile that saves under 1/16 of the loads per accumulation reuses nothing worth its registers: it only adds
    // streams (a batchnorm's backward sums, whose chunks of the batch share only per-channel values read outside
    // their 800-trip loop, took 8 chunks at once: 8 streams through a channels-last input)
    const double base_loads = std::get<4>(tiles[0].first);
    std::erase_if(tiles, [&](const auto& t) { return t.second != amt && std::get<4>(t.first) > base_loads * (1 - 1.0 / 16); });
    // ranked by the key (ties: the order of enumeration); BEAM seeds its search with the first few
    std::stable_sort(tiles.begin(), tiles.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const size_t at = wide ? tile_rank - 1 : tile_rank;  // the wide space's best is the first seed after rank 0
    if (at >= tiles.size()) return false;
    ranked = true;
    const std::vector<int64_t>& best_am = tiles[at].second;
    // opts: the other axes by decreasing amount, then the vectorised axis's widening
    std::vector<std::pair<int64_t, size_t>> order;
    for (size_t i : cand)
      if (best_am[i] != amt[i] && int(i) != vec) order.emplace_back(-best_am[i], i);
    std::sort(order.begin(), order.end());
    if (vec >= 0 && size_t(vec) < n_out && best_am[size_t(vec)] != amt[size_t(vec)]) order.emplace_back(0, size_t(vec));
    for (auto [neg, i] : order) {
      int64_t a = best_am[i] / amt[i];
      // (an axis reserved for the threads holds size / threads per thread: its padded length must divide by both)
      const int64_t pad = reserved && *reserved == i ? a * cfg.threads : a;
      if (size[i] % a) opts.push_back({OptOp::PADTO, int(i), pad}), size[i] = padded(i, a);
      split(OptOp::UPCAST, i, a);
      upcast *= a;
      amt[i] = best_am[i];
    }
    // 2b. Where latency-bound, a tile of one vector along the store (nothing shared along another axis, or too
    //     little to pay) takes up to 4 vectors of that axis: more accumulation chains over the same contiguous
    //     loads, not more streams. With TG_CPU=haswell a batch norm's sums over a channels-last (512, 24, 24, 32)
    //     input (r_256_32: 256 chunks of 1152 positions x 32 channels) waited on one add chain per 8 channels:
    //     511-1363 us alone against 288-673 us as the 32 channels' 4 vectors (Zen 5, 2 threads, alternated); the
    //     sums of (x * y) 1640 -> 852 us, of 64 channels 172-179 -> 91-106 us (4 of their 8 vectors; all 8 87-91).
    //     AVX-512 reads a whole line a trip in one vector: 4 vectors of 64 channels ran as fast as one there (83
    //     against 84 us).
    if (latency_bound && out_vec && upcast == vec_amt && vec_regs == 1)
      for (int64_t a : {4, 2}) {
        std::vector<int64_t> wider = amt;
        wider[size_t(vec)] *= a;
        if (size[size_t(vec)] % a || upcast * a > max_acc || !fits_registers(wider, upcast * a)) continue;
        split(OptOp::UPCAST, size_t(vec), a);
        upcast *= a;
        amt[size_t(vec)] = wider[size_t(vec)];
        break;
      }
    // 3. No output tile: independent accumulators over the reduce axis that a load is contiguous in.
    if (upcast == 1) {
      for (size_t i = n_out; i < axes.size(); i++) {
        bool contiguous = false;
        for (const UOp* l : acc.loads)
          if (auto c = index_coef(l, axes[i]); c && *c == 1) contiguous = true;
        if (int64_t a = contiguous ? pick(size[i], {int64_t(w), int64_t(w / 2), 4}) : 0) {
          split(OptOp::UNROLL, i, a);
          break;
        }
      }
    }
    return true;
  }

  // The kernel's work in vector operations: each float ALU op, reduce accumulation and load of the AST counted
  // over the axes it depends on (a load once per element it reads: the register tile reuses it across the others;
  // a reduce's result over the output axes only), divided by the vector width. One Zen 5 core ran about 6-7 of
  // them per ns in PaddleOCR's kernels (a 1x1 convolution of 154k in 23 us, a hard-swish of 68k in 11 us).
  double vector_ops() const {
    double ops = 0;
    for_each_axes([&](const UOp* u, uint64_t m) {
      // one accumulation per value reduced; a load or an ALU op on data (float or integer, not index arithmetic)
      // once per iteration of its axes. The threefry's integer rounds count: a randn of 256 x 256 (5.9 ns an element,
      // 387 us) ran on one thread when only its float ops did.
      if (u->op == Ops::REDUCE || u->op == Ops::LOAD ||
          (is_alu(u->op) && (dtypes::is_float(u->dtype) || (dtypes::is_int(u->dtype) && !(u->dtype == dtypes::index)))))
        ops += trips(m);
    });
    return ops / double(w);
  }

  // 4. (run last; alone for a large body) Threads: the outermost output axis that divides evenly, for kernels with
  //    enough work to pay for it: each thread's part at least kSplitVectorOps vector operations (about 10 us on
  //    Zen 5), which outlasts waking a worker and joining it. A smaller kernel runs on the launching thread alone:
  //    PaddleOCR's angle classifier has 155 kernels of 1-25 us, and a split of one of 2-4 us cost more than it
  //    saved (and 6x its time where the worker was not running: a busy machine). Where the register tile left no
  //    output axis divisible by the threads (40 rows upcast by 8: 5), heuristic_opts plans again with an axis
  //    reserved for them first (`reserved`: its size divided before the tile is chosen). In a reduce kernel an
  //    input of 8 MiB or more that this split would leave whole (every thread streams all of it again for each of
  //    its tiles: B of a 2048 matmul) is split instead, on the outermost axis it depends on (N=2048: 1.23x; each
  //    core's cache then holds its part).
  static constexpr double kSplitVectorOps = 65536;
  std::optional<size_t> reserved;  // an output axis set aside for THREAD before the tile
  bool unsplit = false;            // threads() wanted a split and found no axis for it
  // Or a kernel whose buffers do not fit in the cores' L2 (the bytes its loads span and its store writes, against
  // the machine model's L2 times the threads): its time is moving them, which a vector-operation count does not
  // see. mnist's max-pool output copied channels-last (E_512_10_10_32: 102k vector operations, 13 MB, its NCHW input
  // read 100 floats apart along the stored channels) ran 2.0 ms on one thread. Counting gathered lanes as
  // operations instead threaded small kernels too (PaddleOCR's classifier 0.90 -> 1.25 ms).
  double footprint() const {
    double b = store_bytes();
    // a load at most one element per iteration of its axes (a table lookup spans the whole table, reads a few rows)
    for (size_t li = 0; li < acc.loads.size(); li++) b += std::min(span_bytes(li), iteration_bytes(li));
    return b;
  }
  bool wants_threads() const {
    return cfg.threads > 1 && (vector_ops() >= kSplitVectorOps * cfg.threads ||
                               (cfg.l2_bytes > 0 && footprint() > double(cfg.l2_bytes) * cfg.threads));
  }
  // sets `reserved` to the outermost output axis whose full size the threads divide; false if none
  bool reserve_axis() {
    for (size_t i = 0; i < n_out; i++)
      if (size0[i] >= 2 * cfg.threads && size0[i] % cfg.threads == 0) {
        reserved = i;
        size[i] /= cfg.threads;
        return true;
      }
    return false;
  }
  void threads() {
    if (reserved) {
      opts.push_back({OptOp::THREAD, int(*reserved), cfg.threads});
      return;
    }
    if (!wants_threads()) return;
    auto splits = [&](size_t i) { return size[i] >= cfg.threads && size[i] % cfg.threads == 0; };
    std::optional<size_t> pick_axis;
    for (size_t i = 0; i < n_out && !pick_axis; i++)
      if (splits(i)) pick_axis = i;
    if (pick_axis && reduce) {
      const UOp* big = nullptr;
      double big_bytes = 0;
      for (size_t li = 0; li < acc.loads.size(); li++) {
        const UOp* l = acc.loads[li];
        double bytes = double(acc.load_bytes[li]);
        for (const UOp* r : axes)
          if (depends_on(l, r)) bytes *= double(range_size(r).value_or(1));
        if (!depends_on(l, axes[*pick_axis]) && bytes >= double(8 << 20) && bytes > big_bytes) big = l, big_bytes = bytes;
      }
      if (big)
        for (size_t i = 0; i < n_out; i++)
          if (splits(i) && depends_on(big, axes[i])) {
            pick_axis = i;
            break;
          }
    }
    if (pick_axis) opts.push_back({OptOp::THREAD, int(*pick_axis), cfg.threads});
    unsplit = !pick_axis;
  }

  // 5. (CPU) Software prefetch: a reduce kernel that streams a buffer larger than L2 about once (the kernel's work,
  //    its innermost iterations (loop_work), at most kStreamReuse times the elements the load spans: a matvec, a
  //    quantised one reading its blocks, the decode step's linears, a softmax or layernorm reading each row in 3
  //    loops) prefetches ahead in its outermost reduce loop that the stream moves with. Such a loop issues a few
  //    loads per row and block, too few and too scattered (a register tile of 8 rows is 8 streams) for the hardware
  //    prefetcher to keep DRAM busy: the loads wait on memory and the dequantising ALU work does not overlap them. A GEMM rereads its operands from cache (reuse of 32 and
  //    more) and is left alone, as is a kernel whose buffers fit in L2 or whose cache size is unknown.
  //    The distance is split between the streams the register tile issues (one a row of the tile the load moves
  //    with): kInFlightBytes ahead in all, whole cache lines a stream. Streaming from DRAM at a core's bandwidth
  //    needs about its bandwidth-latency product in flight (60 GB/s, a Zen 5 core's triad, times ~130 ns: 8 KiB),
  //    and a faster kernel runs out of a fixed per-stream distance sooner: 512 bytes a stream (4 KiB for the 8-row
  //    tile) was the best when the q8_0 kernel read 12-14 GB/s (float products); with INT_DOT's integer block sums
  //    (25-30 GB/s) the same tile ran 20% faster at 1024 (bench/qmatvec 8192 x 2048 from DRAM, Zen 5, THREADS=1,
  //    load 4-5: q8_0 20.6-24.1 -> 27.5-28.3 GB/s, q4_0 12.1-14.6 -> 12.3-15.0; 2048 a stream was slower again).
  //    The prefetched lines (8 KiB) stay well inside L1. A row kernel prefetches one row ahead (at least that far,
  //    at most a quarter of L2: this row, which its later loops reread, the next and the output's row stay in L2), in
  //    the loop of its last sum before the output loop (the REDUCE that reads the others: layernorm's variance,
  //    softmax's sum of exps), whatever the range ids' order: the next row's reads run on while the output loop writes
  //    this one. A hand-written 4096-wide layernorm (AVX-512, non-temporal output, Zen 5, 2 threads, paired with the
  //    triad, loaded) read 0.59-0.66x of the triad prefetching in its first loop (the mean), 0.69-0.83x in the second.
  //    The loop must walk the stream line by line: each iteration moves the load at most one cache line on, and one
  //    pass of the loop at least one (a row's elements, a q4_0 row's 32 blocks of 18 bytes). A loop that strides
  //    further, or is too short to leave its line, reads a few elements of lines far apart while the stream moves
  //    with the output loops around it, which the hardware prefetcher follows (a 2x2 max pool's window: rows 80
  //    bytes apart in NCHW, 2560 channels-last, and 2 elements of a row): prefetches ahead in it are one more
  //    instruction per stream and iteration for nothing (mnist's step: the max pool's r_512_32_10_10 in the
  //    backward took 28-40 ms a launch with them, 15-23 ms without; Zen 5, load 5-10).
  //    Only a kernel of kPrefetchOpsPerLine vector operations or more a line it streams (light_stream, below)
  //    prefetches: an out-of-order core keeps as many lines in flight as its window of 200-500 micro-ops holds
  //    iterations, at 8 operations a line 25-60 lines, below the ~50-130 a core's share of DRAM bandwidth needs. The
  //    dequantising matvecs do 15.6 (q8_0) and 47 (q4_0) a line; a float32 matvec 3 (a load, a multiply-add, x's
  //    load), whose window holds 70-170 lines by itself: its prefetches only compete with its loads and the hardware
  //    prefetcher. bench/llm's float32 decode step (its FFN's 1536 x 512 and 512 x 1536 matvecs prefetched; Zen 4,
  //    THREADS=1, five alternated pairs): 5.97-6.88 -> 4.50-4.97 ms a token. q8_0 and q4_0 keep theirs (the Zen 5
  //    figures above; on the Zen 4, alternated, PREFETCH=0 moved their decode within the noise).
  static constexpr int64_t kInFlightBytes = 8192;
  static constexpr double kStreamReuse = 4, kPrefetchOpsPerLine = 8;
  // Whether the kernel reads each element of load l about once: its work at most kStreamReuse times the elements
  // the load spans (step 5's streams; a GEMM rereads its operands)
  bool read_about_once(const UOp* l) const {
    const UOp* idx = l->src(0)->src(1);
    return work <= kStreamReuse * (double(idx->vmax()) - double(idx->vmin()) + 1);
  }
  // Whether the kernel streams buffers past L2 with fewer than kPrefetchOpsPerLine vector operations a line (step 5)
  bool light_stream() const {
    const double lines = streamed_lines();
    return lines > 0 && vector_ops() < kPrefetchOpsPerLine * lines;
  }
  // The cache lines of the buffers whose loads a reduce loop streams past L2 about once (the loads step 5 prefetches;
  // a q8_0 block's scale and quants are loads of one buffer: its span counted once)
  double streamed_lines() const {
    std::vector<std::pair<const UOp*, double>> spans;  // buffer (PARAM), bytes
    for (size_t i = n_out; i < axes.size(); i++)
      for (const UOp* l : streamed_loads(ast.get(), axes[i], cfg.l2_bytes)) {
        if (!read_about_once(l)) continue;
        const UOp* idx = l->src(0)->src(1);
        const double span = double(idx->vmax()) - double(idx->vmin()) + 1;
        const UOp* buf = l->src(0)->src(0);
        auto at = std::find_if(spans.begin(), spans.end(), [&](const auto& b) { return b.first == buf; });
        if (at == spans.end()) at = spans.insert(spans.end(), {buf, 0.0});
        at->second = std::max(at->second, span * double(l->dtype.scalar_type().itemsize()));
      }
    double lines = 0;
    for (const auto& [buf, bytes] : spans) lines += bytes / double(kLineBytes);
    return lines;
  }
  // 6. (CPU) Non-temporal stores: an output whose stores are vectors along a unit-stride axis and that, with what
  //    the kernel reads, spans more than the last-level cache is written past the caches (Opt NONTEMPORAL; the
  //    test is past_caches(), below): by the time a later kernel reads it,
  //    its first lines have left the cache anyway, so an ordinary store pays a read of every line (the write
  //    allocate) and evicts data for nothing. Lowering marks only the stores that qualify (full aligned vectors, a
  //    buffer the kernel does not read). Unknown cache size: left alone. NONTEMPORAL=0: never; NONTEMPORAL=2: every
  //    such output, whatever its size (a machine whose cache size reads wrong: a VM reporting the socket's L3).
  void nontemporal() {
    if (vec < 0 || size_t(vec) >= n_out || short_vec || vec_amt < 4 || !st->bounds().known) return;
    if (auto c = index_coef(st, axes[size_t(vec)]); !c || *c != 1) return;
    // A row kernel whose sum reads a transcendental (softmax's exp) keeps those values for its output loop
    // (reuse_row_values): with this opt in a row array on the stack, so that the output goes past the caches;
    // without it in the output row, cached, which adds a third pass over DRAM (the write allocate). bench/bandwidth's
    // softmax (4096 x 4096, Zen 4, 2 threads, quiet, alternated with a build leaving row kernels out of this opt):
    // 0.79 / 0.79 -> 0.88 / 0.89 of the triad, TG_CPU=haswell 0.75 / 0.74 -> 0.82 / 0.88; best of 30 calls
    // 2.9-4.1 -> 2.8-3.2 ms (10 alternated rounds). (An earlier measurement on a Zen 5 VM under load 4-6 had the cached output ahead,
    // 0.61-0.66 against 0.52-0.55: other processes' traffic there.) The row array's output loop is still a burst of
    // stores with no work beside it: a software pipeline (row r-1's output stored from a second row array inside
    // row r's loop of exps) is the next step. The others' output copies are packed into vector stores for this
    // opt (the expander), which only pays where they go past the caches.
    if (past_caches()) opts.push_back({OptOp::NONTEMPORAL, 0, 1});
  }
  // the output goes past the caches (step 6's test; NONTEMPORAL=0: never, 2: always): the output and what the
  // kernel reads beside it are more than the last-level cache, so the output's first lines leave it before the
  // kernel ends, whatever its own size (a cast of 2^24 floats to float16: 32 MiB written beside 64 MiB read, on a
  // 32 MiB L3). What a later kernel still finds cached of it is at most the cache's share of the output. A load
  // reads at most its span and one element an iteration (a gather's index spans its whole table).
  bool past_caches() const {
    const int64_t mode = getenv_int("NONTEMPORAL", 1);
    if (cfg.local_threads > 0 || mode == 0 || (cfg.llc_bytes <= 0 && mode != 2)) return false;
    if (mode == 2) return true;
    const double out = store_bytes();
    double moved = out;
    std::unordered_set<const UOp*> seen;  // a load's index once (x * x reads x once)
    for (size_t li = 0; li < acc.loads.size(); li++)
      if (seen.insert(acc.loads[li]).second) moved += std::min(span_bytes(li), iteration_bytes(li));
    return out > 0 && moved > double(cfg.llc_bytes);
  }

  void prefetch() {
    const int64_t env = getenv_int("PREFETCH", 1, 0, 1 << 20);  // PREFETCH=N: N bytes a stream
    if (!reduce || cfg.local_threads > 0 || cfg.l2_bytes <= 0 || env == 0) return;
    // the REDUCE over axis r (null: none)
    auto reduce_over = [&](const UOp* r) -> const UOp* {
      for (const UOp* n : toposort(ast.get()))
        if (n->op == Ops::REDUCE && std::any_of(n->src().begin() + 1, n->src().end(), [&](const UOpRef& x) { return x.get() == r; }))
          return n;
      return nullptr;
    };
    // the REDUCEs computed before the one over axis r (inside its value): a row kernel's loops in their order
    auto loops_before = [&](const UOp* r) {
      const UOp* n = reduce_over(r);
      if (!n) return std::ptrdiff_t(0);
      std::vector<const UOp*> inside = toposort(n->src(0));
      return std::count_if(inside.begin(), inside.end(), [](const UOp* u) { return u->op == Ops::REDUCE; });
    };
    // whether the sum over axis r computes a transcendental
    auto transcendental_in = [&](const UOp* r) {
      const UOp* n = reduce_over(r);
      return n && transcendental(n->src(0));
    };
    std::optional<Opt> pick;
    std::ptrdiff_t pick_before = -1;
    for (size_t i = n_out; i < axes.size(); i++) {
      if (size0[i] < 2) continue;
      for (const UOp* l : streamed_loads(ast.get(), axes[i], cfg.l2_bytes)) {
        const UOp* idx = l->src(0)->src(1);
        const int64_t step = std::abs(*index_coef(idx, axes[i])) * l->dtype.scalar_type().itemsize();
        const bool line_by_line = step <= kLineBytes && size0[i] * step >= kLineBytes;
        if (line_by_line && read_about_once(l)) {
          int64_t streams = 1;  // the tile's rows this load moves with: one prefetch each
          for (const Opt& o : opts)
            if (o.op == OptOp::UPCAST && size_t(o.axis) < n_out && depends_on(l, axes[size_t(o.axis)])) streams *= o.amt;
          int64_t bytes = env > 1 ? env : std::max<int64_t>(64, kInFlightBytes / streams / 64 * 64);
          if (!rows) {
            if (light_stream()) return;  // a float matvec: the core keeps up
            opts.push_back({OptOp::PREFETCH, int(i), bytes});
            return;
          }
          if (env <= 1)  // one row ahead (the loop's span of the load), within a quarter of L2
            bytes = std::clamp(size0[i] * step, bytes, std::max(bytes, cfg.l2_bytes / 4));
          // a row kernel: in its last loop over the row before the output loop, where that loop computes a
          // transcendental (softmax's exps): its row of prefetches then issues beside many vector ops an element.
          // A loop of a few adds (layernorm's mean and variance) prefetches only where the machine model's
          // row_prefetch says so (measured on the host, backends/cpu/machine.cpp): on Zen 4 its prefetches filled the
          // core's miss buffers in a burst (bench/bandwidth's layernorm, 4096 x 4096, 2 threads, alternated: 2.70 ms
          // without, 3.27-3.30 with; TG_CPU=haswell 2.60 against 2.81-2.91), on Zen 5 they overlap the next row's
          // reads with the output's stores (2.24-2.32 ms without, 1.90-2.03 with; TG_CPU=haswell 2.80-2.90 against
          // 1.94-2.08). The softmax keeps its prefetch on both (Zen 4: 3.26-3.48 ms with it, 3.85 without).
          if (std::ptrdiff_t before = loops_before(axes[i]); before > pick_before && (transcendental_in(axes[i]) || cfg.row_prefetch))
            pick = Opt{OptOp::PREFETCH, int(i), bytes}, pick_before = before;
          break;
        }
      }
    }
    if (pick) opts.push_back(*pick);
  }
};

// The heuristic with the register tile of the given rank (0: the best by its load model); nullopt when the kernel
// has fewer tiles than that. Its steps, in order: vectors along the store, else along the loads (elementwise),
// lanes for row kernels and for reduces without a vector, the register tile, threads.
std::optional<std::vector<Opt>> heuristic_opts(const UOpRef& ast_in, const OptConfig& cfg, size_t tile_rank) {
  Heuristic h(ast_in, cfg, tile_rank);
  if (h.acc.stores.size() != 1) {  // multi-output kernels keep their plain loops
    if (tile_rank > 0) return std::nullopt;
    return std::vector<Opt>{};
  }
  h.st = h.acc.stores[0];
  // A body of more than 2,048 nodes (10,000 shifted views summed) gets threads only, no copies: UPCAST multiplies
  // the body, and LLVM's register allocation and scheduling over 16 x 10,000 gated reads and adds grew
  // superlinearly (60 s at 5,000 views).
  if (toposort(h.ast.get()).size() > 2048) {
    h.threads();
    if (tile_rank > 0) return std::nullopt;
    return h.opts;
  }
  auto plan = [&](Heuristic& p) {
    p.store_vectors();
    p.load_vectors();
    p.transpose_tile();
    p.store_rows();
    p.gated_copies();
    p.row_lanes();
    p.reduce_lanes();
    p.load_vectors(true);
    if (!p.register_tile()) return false;
    p.threads();
    p.prefetch();
    p.nontemporal();
    return true;
  };
  if (!plan(h)) return std::nullopt;
  if (h.unsplit) {  // the tile left no axis for the threads: again, with one reserved for them first
    Heuristic r(ast_in, cfg, tile_rank);
    r.st = r.acc.stores[0];
    if (r.reserve_axis() && plan(r) && (tile_rank == 0 || r.ranked)) return r.opts;
  }
  if (tile_rank > 0 && !h.ranked) return std::nullopt;
  return h.opts;
}

}  // namespace

std::vector<Opt> hand_coded_optimizations(const UOpRef& ast, const OptConfig& cfg) {
  return *heuristic_opts(ast, cfg, 0);
}

std::vector<std::vector<Opt>> hand_coded_alternatives(const UOpRef& ast, const OptConfig& cfg, size_t n) {
  std::vector<std::vector<Opt>> out;
  for (size_t r = 0; out.size() < n; r++) {  // ranks until n distinct (the wide space holds rank 0's tile too)
    auto o = heuristic_opts(ast, cfg, r);
    if (!o) break;
    if (std::find(out.begin(), out.end(), *o) == out.end()) out.push_back(std::move(*o));
  }
  return out;
}

}  // namespace tg
