// Lowering one kernel: a named list of rewrite passes from the scheduler's AST to a linear program.
#include <algorithm>
#include <cmath>
#include <bitset>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "src/uop/spec_pause.hpp"
#include "gpudims.hpp"
#include "opt/expander.hpp"
#include "tg/codegen.hpp"
#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/opt.hpp"
#include "tg/symbolic.hpp"
#include "tg/viz.hpp"

namespace tg {
using namespace tg::pat;

namespace {

UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }

UOpRef identity_of(Ops op, DType d) {
  switch (op) {
    case Ops::ADD: return UOp::cnst(d, 0);
    case Ops::MUL: return UOp::cnst(d, 1);
    case Ops::MAX:
      if (dtypes::is_float(d)) return UOp::cnst(d, -INFINITY);
      if (dtypes::is_bool(d)) return UOp::cnst_int(d, 0);
      if (d.scalar == Scalar::UInt64) return UOp::cnst_int(d, 0);
      return UOp::cnst_int(d, dtypes::min_int(d));
    default: throw Error(std::string("[codegen] no identity for reduce op ") + op_name(op));
  }
}

// A float MAX accumulator is two (expand_reduces): a plain maximum that a NaN does not enter, acc < v ? v : acc
// (x86's maxps, one instruction: the loop-carried chain is its latency, where the NaN-carrying max was a compare, a
// select, an unordered compare, an add and a select), and a NaN carrier, v != v ? v : nan (a blend, off the max's
// chain), merged after the loop: nan != nan ? nan : acc. Equal to the NaN-carrying max (exec_alu's a < b ? b : a,
// a + b when either is NaN) on every value, +-0 and ties included (the accumulator is kept on ties), and NaN
// wherever a NaN was summed.
UOpRef plain_max(const UOpRef& acc, const UOpRef& v) { return acc->alu(Ops::CMPLT, v)->alu(Ops::WHERE, v, acc); }
UOpRef carry_nan(const UOpRef& nan, const UOpRef& v) { return v->alu(Ops::CMPNE, v)->alu(Ops::WHERE, v, nan); }
bool splits_nan(Ops op, DType d) { return op == Ops::MAX && dtypes::is_float(d); }

// The RANGEs still open at every node of the graph (an END closes its range), in one pass.
std::unordered_map<const UOp*, std::vector<const UOp*>> open_ranges(const UOpRef& root) {
  std::unordered_map<const UOp*, std::vector<const UOp*>> open;
  for (const UOp* n : toposort(root.get())) {
    std::vector<const UOp*> o;
    for (auto& s : n->src())
      for (const UOp* r : open[s.get()])
        if (std::find(o.begin(), o.end(), r) == o.end()) o.push_back(r);
    if (n->op == Ops::RANGE) o.push_back(n);
    if (n->op == Ops::END) std::erase(o, n->src(n->nsrc() - 1));
    open[n] = std::move(o);
  }
  return open;
}

// The ranges an index expression depends on, each with its coefficient, if it is a sum of range * coefficient
// terms over `rs` that runs over 0 .. n-1 exactly once (a mixed radix: sorted by coefficient, each coefficient is
// the product of the extents below it); n, else 0.
int64_t dense_extent(const UOp* idx, const std::vector<const UOp*>& rs) {
  std::vector<std::pair<int64_t, int64_t>> terms;  // (coefficient, extent)
  for (const UOp* r : rs) {
    if (!depends_on(idx, r)) continue;
    auto c = index_coef(idx, r);
    if (!c || *c <= 0 || r->src(0)->op != Ops::CONST) return 0;
    terms.emplace_back(*c, r->src(0)->const_int());
  }
  std::sort(terms.begin(), terms.end());
  int64_t n = 1;
  for (auto [c, e] : terms) {
    if (c != n) return 0;
    n *= e;
  }
  return n;
}

// Row kernels (the scheduler's row fusion, serial devices): softmax sums E = exp(x - max) over its row and then
// computes E again for every output element. Where the output's value contains the summed value E at the output's
// own position, E is kept from the sum's loop and read back in the output loop: one exp per element instead of two.
// Where the output goes past the caches (Opt NONTEMPORAL: `row_bytes` > 0) and the row fits in row_bytes, E goes
// into a row array on the stack (DEFINE_REG, in L1/L2), so the output loop reads it from cache and its stores stay
// pure streaming ones; otherwise E goes into the output buffer and is scaled in place (the store allocates the
// output's lines in the cache). The stored and the recomputed E are the same value, so results are bit-identical
// (ROW_REUSE=0 turns this off). Runs before the expander (the output loop's copies are then one STORE). Conditions:
// one STORE, ungated; E has the output's dtype; E contains a transcendental and one load of a buffer other than the
// output at an index that runs densely over the row, as the output's does, with a fixed offset between the two; the
// output buffer is not read, and the input not read by the output otherwise.
UOpRef reuse_row_values(const UOpRef& k, int64_t row_bytes) {
  if (!getenv_int("ROW_REUSE", 1) || k->nsrc() != 1 || k->src(0)->op != Ops::STORE) return k;
  const UOp* st = k->src(0);
  const UOp* oidx = st->src(0);
  if (oidx->op != Ops::INDEX || oidx->nsrc() != 2 || oidx->src(0)->op != Ops::PARAM) return k;
  const UOp* pout = oidx->src(0);
  const UOp* value = st->src(1);
  std::vector<const UOp*> topo = toposort(k.get());
  std::vector<const UOp*> ranges;
  for (const UOp* n : topo) {
    if (n->op == Ops::RANGE) ranges.push_back(n);
    if (n->op == Ops::INDEX && n->src(0) == pout && n != oidx) return k;  // the output is read somewhere
  }
  std::vector<const UOp*> vtopo = toposort(value);
  std::unordered_set<const UOp*> in_value(vtopo.begin(), vtopo.end());
  auto transcendental = [](const UOp* e) {
    for (const UOp* n : toposort(e))
      if (n->op == Ops::EXP2 || n->op == Ops::LOG2 || n->op == Ops::SIN) return true;
    return false;
  };
  for (const UOp* red : vtopo) {
    if (red->op != Ops::REDUCE || Ops(std::get<int64_t>(red->arg)) != Ops::ADD || !dtypes::is_float(red->dtype) ||
        red->dtype.count != 1 || !transcendental(red->src(0)))
      continue;
    std::vector<const UOp*> rr;
    for (size_t i = 1; i < red->nsrc(); i++) rr.push_back(red->src(i));
    auto in_row = [&](const UOp* e) {
      for (const UOp* r : rr)
        if (depends_on(e, r)) return true;
      return false;
    };
    const UOp* es = red->src(0);
    // E goes into the output buffer as it is and comes back bit-identical only where it has the buffer's dtype:
    // a float16 softmax sums E in float32 and a float16 store would round it (and render a float32 STORE into a
    // float16 pointer); there E is recomputed.
    if (es->dtype != pout->dtype.base()) continue;
    const UOp* ls = nullptr;  // the one load of E that moves with the sum's ranges
    bool ok = true;
    for (const UOp* n : toposort(es))
      if (n->op == Ops::LOAD && in_row(n)) ok &= !ls, ls = n;
    if (!ok || !ls || ls->src(0)->op != Ops::INDEX || ls->src(0)->nsrc() != 2) continue;
    const UOp* xbuf = ls->src(0)->src(0);
    if (xbuf->op != Ops::PARAM || xbuf == pout) continue;
    const UOp* as = ls->src(0)->src(1);
    // The output's ranges: those of its index that the REDUCE does not run inside.
    std::vector<const UOp*> outr;
    for (const UOp* r : ranges)
      if (depends_on(oidx, r) && !depends_on(red, r) && std::find(rr.begin(), rr.end(), r) == rr.end()) outr.push_back(r);
    for (const UOp* lo : vtopo) {
      if (lo->op != Ops::LOAD || lo->src(0)->op != Ops::INDEX || lo->src(0)->nsrc() != 2 || lo->src(0)->src(0) != xbuf ||
          in_row(lo))
        continue;
      const UOp* ao = lo->src(0)->src(1);
      UOpRef eo = substitute(UOpRef(es), {{ls->src(0), UOpRef(lo->src(0))}});
      if (!in_value.count(eo.get())) continue;
      // Both indices run densely over the same n elements from the same base, and the output's index is the
      // input's plus a fixed offset.
      int64_t n_s = dense_extent(as, rr), n_o = dense_extent(ao, outr);
      if (n_s == 0 || n_s != n_o || dense_extent(oidx->src(1), outr) != n_o) continue;
      std::vector<std::pair<const UOp*, UOpRef>> zs, zo;
      for (const UOp* r : rr) zs.emplace_back(r, ci(0));
      for (const UOp* r : outr) zo.emplace_back(r, ci(0));
      auto simp = [](const UOpRef& e) { return graph_rewrite(e, symbolic(), nullptr, false, "row reuse"); };
      if (simp(substitute(UOpRef(as), zs)) != simp(substitute(UOpRef(ao), zo))) continue;
      UOpRef delta = simp(UOpRef(oidx->src(1))->alu(Ops::SUB, UOpRef(ao)));
      bool fixed = true;
      for (const UOp* r : outr) fixed &= !depends_on(delta.get(), r);
      if (!fixed) continue;
      // Build: the sum stores E at its position (in the output, or at its place in the row array); the output loads
      // it back after the sum's loop.
      UOpRef es_ref(es), buf(pout), at_sum = simp(UOpRef(as)->alu(Ops::ADD, delta)), at_out(oidx->src(1));
      if (row_bytes > 0 && n_s * int64_t(es->dtype.itemsize()) <= row_bytes) {
        int64_t reg = 0;  // an id no other register array of the kernel has
        for (const UOp* n : topo)
          if (n->op == Ops::DEFINE_REG) reg = std::max(reg, std::get<int64_t>(n->arg) + 1);
        buf = UOp::make(Ops::DEFINE_REG, es->dtype.ptr_to(n_s, AddrSpace::Reg), {}, reg);
        UOpRef base = simp(substitute(UOpRef(as), zs));
        at_sum = simp(UOpRef(as)->alu(Ops::SUB, base)), at_out = simp(UOpRef(ao)->alu(Ops::SUB, base));
      }
      UOpRef inner_store = UOp::make(Ops::STORE, dtypes::void_, {UOp::make(Ops::INDEX, buf->dtype, {buf, at_sum}), es_ref});
      std::vector<UOpRef> rs{UOp::make(Ops::AFTER, es->dtype, {es_ref, inner_store})};
      for (const UOp* r : rr) rs.emplace_back(r);
      UOpRef red2 = UOp::make(Ops::REDUCE, red->dtype, rs, red->arg);
      UOpRef back = UOp::make(
          Ops::LOAD, es->dtype, {UOp::make(Ops::INDEX, buf->dtype, {UOp::make(Ops::AFTER, buf->dtype, {buf, red2}), at_out})});
      UOpRef v2 = substitute(UOpRef(value), {{red, red2}, {eo.get(), back}});
      // The output reads the input at its position only through E (the store above may overwrite it in place).
      bool other_reads = false;
      for (const UOp* n : toposort(v2.get()))
        if (n->op == Ops::LOAD && n->src(0)->op == Ops::INDEX && n->src(0)->src(0) == xbuf && !in_row(n) &&
            !depends_on(n, red2.get()))
          for (const UOp* r : outr) other_reads |= depends_on(n, r);
      if (other_reads) continue;
      std::vector<UOpRef> sink{UOp::make(Ops::STORE, dtypes::void_, {UOpRef(oidx), v2})};
      return k->replace_src(sink);
    }
  }
  return k;
}

// Whether e casts to float an integer of at most 8 bits that it reads from memory (a quantised weight: q8_0's int8,
// a nibble of a uint8; int_gemm's bytes of loaded int32 words, masked); a bool (a comparison's mask) is not one.
bool dequantises(const UOp* e) {
  auto reads_load = [](const UOp* x) {
    for (const UOp* y : toposort(x))
      if (y->op == Ops::LOAD) return true;
    return false;
  };
  auto small_int = [](DType d) { return dtypes::is_int(d) && d.bitsize() <= 8; };
  for (const UOp* n : toposort(e)) {
    if (n->op != Ops::CAST || !dtypes::is_float(n->dtype) || !dtypes::is_int(n->src(0)->dtype)) continue;
    for (const UOp* m : toposort(n->src(0)))
      if ((m->op == Ops::LOAD && small_int(m->dtype)) ||
          (m->op == Ops::CAST && small_int(m->dtype) && dtypes::is_int(m->src(0)->dtype) && !small_int(m->src(0)->dtype)) ||
          (m->op == Ops::AND && dtypes::is_int(m->dtype) && m->src(1)->op == Ops::CONST && m->src(1)->const_int() >= 0 &&
           m->src(1)->const_int() <= 255 && reads_load(m->src(0))))
        return true;
  }
  return false;
}

// Whether a is float(int32(nibble) [+ c] * int32(b)) or its mirror: a nibble (& 15) of a loaded byte times a loaded
// int8 (int_dot_product's q4_0 terms).
bool nibble_times_byte(const UOp* a) {
  if (a->op != Ops::CAST || !dtypes::is_float(a->dtype)) return false;
  const UOp* m = a->src(0);
  if (m->op != Ops::MUL || m->dtype != dtypes::int32) return false;
  auto int8_load = [](const UOp* x) {
    return x->op == Ops::CAST && x->src(0)->op == Ops::LOAD && x->src(0)->dtype == dtypes::int8;
  };
  auto nibble = [](const UOp* x) {
    if (x->op == Ops::ADD && (x->src(0)->op == Ops::CONST || x->src(1)->op == Ops::CONST))
      x = x->src(x->src(1)->op == Ops::CONST ? 0 : 1);
    if (x->op != Ops::CAST || x->src(0)->op != Ops::AND) return false;
    const UOp* n = x->src(0);
    const UOp* k = n->src(1)->op == Ops::CONST ? n->src(1) : n->src(0);
    const UOp* v = k == n->src(1) ? n->src(0) : n->src(1);
    if (k->op != Ops::CONST || k->const_int() != 15 || n->dtype != dtypes::uint8) return false;
    if (v->op == Ops::SHR) v = v->src(0);
    return v->op == Ops::LOAD;
  };
  return (nibble(m->src(0)) && int8_load(m->src(1))) || (nibble(m->src(1)) && int8_load(m->src(0)));
}

// A factor of a float sum's terms that does not move with its inner terms multiplies once per group of them, not per
// term (a quantised weight's block scale, constant over the block's 32 weights):
// REDUCE(a * s, outer..., inner...) -> REDUCE(s * REDUCE(a, inner...), outer...), s independent of `inner`, which
// is (1) the longest suffix of the sum's loops that s does not read (loops nest in source order: the inner sum's
// stay innermost), and (2) of each unrolled range u that s does not read and that is longer than a vector (`lanes`),
// the part above the vector: u = t * lanes + l, the copies t summed inside, l kept (each lane keeps its own inner
// sum: no horizontal sum per block; q4_0's lane l sums byte l's two nibbles). Applied only where s reads an outer
// loop, the inner sum has 2 terms or more, and a dequantises: it casts an integer of at most 8 bits read from memory
// to float (q8_0's int8, the nibbles of q4_0's and the K-quants' bytes). Float sums of float data (training's
// kernels) keep their order: there the factor saves a multiply in a few terms and only moves the rounding, which
// Adam amplifies (the 2-rank beautiful_mnist of tests/multi_mnist.sh drifted 3.4e-4 from one process with it; the
// gradients of the same weights agreed within 1e-6 either way: a ReLU or max-pool switch at step 3 under a 1e-6
// weight change, not a wrong sum). CPU only (a GPU's grouped reduces are left as they are). FACTOR_REDUCE=0 turns
// it off.
// Where the machine sums 4 byte products into an int32 lane in one instruction (`quad_dot`: x86 vpdpbusd) and the
// terms are a nibble of a loaded byte times a loaded int8 (q4_0's decode product), each lane takes 4 terms instead
// of 2: half the lanes (vector_width / 2: 8 on AVX-512, a q4_0 block's 32 products), lane l the two nibbles of bytes
// 2l and 2l + 1 (the pairs' indexing below), so one 4-byte dot does a whole lane: one vpdpbusd of 8 lanes a row and
// block (ByteMulAdd's quads, llvm_jit.cpp) where the 2-term lanes took one of 16, half its bytes zero.
UOpRef factor_reduce_invariants(const UOpRef& k, int64_t lanes, bool quad_dot) {
  constexpr int64_t kMaxCopies = 8;  // an inner loop of at most this many terms is summed as copies
  if (!getenv_int("FACTOR_REDUCE", 1) || lanes < 1) return k;
  int64_t next_id = 0;
  for (const UOp* n : toposort(k.get()))
    if (n->op == Ops::RANGE) next_id = std::max(next_id, range_id(n) + 1);
  auto size_of = [](const UOp* r) { return r->src(0)->op == Ops::CONST ? r->src(0)->const_int() : 0; };
  std::vector<std::pair<const UOp*, UOpRef>> repl;
  std::vector<UOpRef> keep;  // fresh RANGEs
  for (const UOp* n : toposort(k.get())) {
    if (n->op != Ops::REDUCE || Ops(std::get<int64_t>(n->arg)) != Ops::ADD || !dtypes::is_float(n->dtype) || n->dtype.count != 1)
      continue;
    bool nested = false, quads = false;  // sums of sums are left as they are
    for (const UOp* e : toposort(n->src(0))) {
      nested |= e->op == Ops::REDUCE;
      quads |= quad_dot && lanes >= 2 && nibble_times_byte(e);
    }
    if (nested) continue;
    const int64_t L = quads ? lanes / 2 : lanes;  // the lanes of this sum
    std::vector<const UOp*> loops, unrolls;
    for (size_t i = 1; i < n->nsrc(); i++) {
      const UOp* r = n->src(i);
      if (r->op != Ops::RANGE || size_of(r) == 1) continue;
      if (range_type(r) == AxisType::Reduce) loops.push_back(r);
      if (range_type(r) == AxisType::Unroll && size_of(r) > L && size_of(r) % L == 0) unrolls.push_back(r);
    }
    std::vector<const UOp*> factors, stack{n->src(0)};
    while (!stack.empty()) {
      const UOp* e = stack.back();
      stack.pop_back();
      if (e->op == Ops::MUL && e->dtype == n->dtype) stack.insert(stack.end(), {e->src(1), e->src(0)});
      else factors.push_back(e);
    }
    if (factors.size() < 2) continue;
    // s: the factors that read no unroll in `unrolls` and no loop from `cut` on, the outermost cut where s reads a loop
    std::vector<std::vector<bool>> reads(factors.size());
    for (size_t i = 0; i < factors.size(); i++)
      for (const UOp* r : loops) reads[i].push_back(depends_on(factors[i], r));
    std::vector<bool> reads_unroll;
    for (const UOp* f : factors) {
      bool u = false;
      for (const UOp* r : unrolls) u |= depends_on(f, r);
      reads_unroll.push_back(u);
    }
    auto invariant = [&](size_t i, size_t cut) {
      if (reads_unroll[i]) return false;
      for (size_t j = cut; j < loops.size(); j++)
        if (reads[i][j]) return false;
      return true;
    };
    std::optional<size_t> pick;
    for (size_t cut = 0; cut <= loops.size() && !pick; cut++) {
      bool any = false, rest = false;
      for (size_t i = 0; i < factors.size(); i++) {
        if (!invariant(i, cut)) rest = true;
        else
          for (size_t j = 0; j < cut; j++) any |= reads[i][j];
      }
      int64_t terms = 1;
      for (size_t j = cut; j < loops.size(); j++) terms *= std::max<int64_t>(size_of(loops[j]), 2);
      for (const UOp* u : unrolls) terms *= size_of(u) / L;
      if (any && rest && terms >= 2) pick = cut;
    }
    if (!pick) continue;
    UOpRef a, sc;
    auto times = [](UOpRef& p, const UOp* f) { p = p ? p->alu(Ops::MUL, UOpRef(f)) : UOpRef(f); };
    for (size_t i = 0; i < factors.size(); i++) times(invariant(i, *pick) ? sc : a, factors[i]);
    if (!dequantises(a.get())) continue;
    // the unrolled ranges' parts above the vector, and inner loops of few terms: copies of a, summed
    int64_t loop_terms = 1;
    for (size_t j = *pick; j < loops.size(); j++) loop_terms *= size_of(loops[j]) > 0 ? size_of(loops[j]) : kMaxCopies + 1;
    bool copy_loops = loop_terms <= kMaxCopies;
    std::vector<std::pair<const UOp*, UOpRef>> kept;  // u -> its lane part
    std::vector<UOpRef> parts{a};
    auto copies = [&](const UOp* r, int64_t count, auto at) {
      std::vector<UOpRef> next;
      for (const UOpRef& p : parts)
        for (int64_t t = 0; t < count; t++) next.push_back(substitute(p, {{r, at(t)}}));
      parts = std::move(next);
    };
    // Integer products (int_dot_product's) sum adjacent pairs in each lane: lane l of copy t takes element
    // (t / 2) * 2 * lanes + 2 * l + t % 2, so the lane loop reads each pair's two operands as the even and odd
    // elements of one vector, the form the CPU compiler turns into pair multiply-adds (vpmaddwd; llvm_jit.cpp).
    // Only where both factors are loaded integers (q8_0's int8s; q4_0's nibbles would be read two bytes apart).
    const UOp* ai = a->op == Ops::CAST ? a->src(0) : nullptr;
    auto loaded = [](const UOp* f) {
      if (f->op != Ops::CAST) return false;
      f = f->src(0);
      if (f->op == Ops::BITCAST) f = f->src(0);
      return f->op == Ops::LOAD;
    };
    const bool pairs = (ai && ai->dtype == dtypes::int32 && ai->op == Ops::MUL && loaded(ai->src(0)) && loaded(ai->src(1))) ||
                       nibble_times_byte(a.get());
    auto copy_inner_loops = [&] {
      if (copy_loops)
        for (size_t j = *pick; j < loops.size(); j++)
          copies(loops[j], size_of(loops[j]), [](int64_t t) { return ci(t); });
    };
    if (pairs) copy_inner_loops();  // the unrolled copies innermost: a pair's two terms stay next to each other
    for (const UOp* u : unrolls) {
      UOpRef l = UOp::range(ci(L), next_id++, AxisType::Unroll);
      keep.push_back(l);
      kept.emplace_back(u, l);
      const int64_t count = size_of(u) / L;
      if (pairs && count % 2 == 0)
        copies(u, count, [&](int64_t t) {
          return ci(t / 2 * 2 * L + t % 2)->alu(Ops::ADD, l->alu(Ops::MUL, ci(2)));
        });
      else
        copies(u, count, [&](int64_t t) { return ci(t * L)->alu(Ops::ADD, l); });
    }
    if (!pairs) copy_inner_loops();
    // Terms that are integers cast to float (int_dot_product's 8-bit products, in int32) are summed as integers and
    // cast once: the same value (float sums of integers below 2^24 are exact; past it the integer sum is the exact
    // one), one vector integer add a copy, and the form LLVM turns into multiply-adds of 16-bit pairs.
    int64_t terms = int64_t(parts.size());
    if (!copy_loops)
      for (size_t j = *pick; j < loops.size(); j++) terms *= size_of(loops[j]);
    const UOp* ie = a->op == Ops::CAST ? a->src(0) : nullptr;
    const bool ints = ie && ie->dtype == dtypes::int32 && ie->bounds().known && terms > 0 &&
                      std::max(-ie->vmin(), ie->vmax()) < (int64_t(1) << 31) / terms;
    // summed in order, each product fused into the sum (as an accumulator's update: pm_mulacc)
    // (integers: each pair added first, (p0 + p1) + (p2 + p3) + ...)
    auto pair = [&](size_t i) {
      UOpRef p = parts[i]->src()[0];
      return pairs && i + 1 < parts.size() ? p->alu(Ops::ADD, parts[i + 1]->src()[0]) : p;
    };
    const size_t step = ints && pairs ? 2 : 1;
    UOpRef inner = ints ? pair(0) : parts[0];
    for (size_t i = step; i < parts.size(); i += step)
      inner = ints                         ? inner->alu(Ops::ADD, pair(i))
              : parts[i]->op == Ops::MUL ? UOp::make(Ops::MULACC, n->dtype, {parts[i]->src()[0], parts[i]->src()[1], inner})
                                         : inner->alu(Ops::ADD, parts[i]);
    if (!copy_loops) {
      // an inner loop inside the outer sum's unrolled copies would keep them from being one vector of lanes
      bool unrolled = false;
      for (size_t i = 1; i < n->nsrc(); i++)
        unrolled |= n->src(i)->op == Ops::RANGE && range_type(n->src(i)) == AxisType::Unroll && size_of(n->src(i)) > 1;
      if (unrolled) continue;
      std::vector<UOpRef> is{inner};
      for (size_t j = *pick; j < loops.size(); j++) is.emplace_back(loops[j]);
      inner = UOp::make(Ops::REDUCE, inner->dtype, is, n->arg);
    }
    if (ints) inner = UOp::make(Ops::CAST, n->dtype, {inner});
    std::vector<UOpRef> os{sc->alu(Ops::MUL, inner)};
    for (size_t i = 1; i < n->nsrc(); i++) {
      const UOp* r = n->src(i);
      if (std::find(loops.begin() + std::ptrdiff_t(*pick), loops.end(), r) != loops.end()) continue;
      auto it = std::find_if(kept.begin(), kept.end(), [&](const auto& p) { return p.first == r; });
      os.push_back(it == kept.end() ? UOpRef(r) : it->second);
    }
    repl.emplace_back(n, UOp::make(Ops::REDUCE, n->dtype, os, n->arg));
  }
  return repl.empty() ? k : substitute(k, repl);
}

// A sum whose terms are all zero outside an interval of one of its loops runs that loop over the interval. The
// terms: a product with WHERE(gate, x, 0) (a padded input read through its bounds test: a convolution's taps in the
// padding, see channels_last_padded in src/schedule/layout.cpp). The interval: the gate's comparisons a < b with
// b - a = +-r + d, r a reduce loop and d depending on the loops outside the sum and nothing inside it (not on
// copies: an upcast axis's copies would each want their own loop). REDUCE(v, r, ...) -> REDUCE(v[r := lo + r', those comparisons :=
// true], r', ...), r' a loop of hi - lo trips (none where lo >= hi), lo = max(0, the lower bounds), hi = min(end,
// the upper bounds): the test leaves the inner loop with the zeros. A weight that is inf or NaN at a skipped tap
// no longer makes that output NaN (0 x inf: the padding multiplied by it). mnist's second convolution's input
// gradient (5 tap rows, 20 of 24 output rows see all 5) summed 1/6 fewer products.
UOpRef narrow_gated_reduces(const UOpRef& k) {
  if (!getenv_int("NARROW_GATES", 1)) return k;
  // how many REDUCEs run over each range (a range two sums share is left alone)
  std::unordered_map<const UOp*, int> sums;
  const std::vector<const UOp*> topo = toposort(k.get());
  for (const UOp* n : topo)
    if (n->op == Ops::REDUCE)
      for (size_t i = 1; i < n->nsrc(); i++) sums[n->src(i)]++;
  // the gate under which v is zero: v = WHERE(g, x, 0), or a product (or cast) of such a value
  std::function<const UOp*(const UOp*)> zero_gate = [&](const UOp* v) -> const UOp* {
    if (v->op == Ops::WHERE && v->src(2)->is_const() && v->src(2)->const_float() == 0.0) return v->src(0);
    if (v->op == Ops::CAST) return zero_gate(v->src(0));
    if (v->op != Ops::MUL) return nullptr;
    const UOp* g = zero_gate(v->src(0));
    return g ? g : zero_gate(v->src(1));
  };
  auto ranges_of = [](const UOp* e) {
    std::vector<const UOp*> rs;
    for (const UOp* u : toposort(e))
      if (u->op == Ops::RANGE) rs.push_back(u);
    return rs;
  };
  std::vector<std::pair<const UOp*, UOpRef>> repl;
  for (const UOp* red : topo) {
    if (red->op != Ops::REDUCE || Ops(std::get<int64_t>(red->arg)) != Ops::ADD) continue;
    const UOp* gate = zero_gate(red->src(0));
    if (!gate) continue;
    std::vector<const UOp*> terms, todo{gate};
    while (!todo.empty()) {
      const UOp* t = todo.back();
      todo.pop_back();
      if (t->op == Ops::AND && t->dtype.count == 1) todo.push_back(t->src(0)), todo.push_back(t->src(1));
      else if (t->op == Ops::CMPLT && t->src(0)->dtype.count == 1 && dtypes::is_int(t->src(0)->dtype)) terms.push_back(t);
    }
    const auto own = std::span(red->src()).subspan(1);
    auto outside = [&](const UOp* q) {  // a loop around the sum, one value for all its terms
      const AxisType t = range_type(q);
      return std::none_of(own.begin(), own.end(), [&](const UOpRef& o) { return o.get() == q; }) &&
             (t == AxisType::Loop || t == AxisType::Global || t == AxisType::Local);
    };
    std::vector<std::pair<const UOp*, UOpRef>> sub;
    std::vector<UOpRef> srcs{red->src()[0]};
    std::vector<bool> used(terms.size(), false);
    for (const UOpRef& rr : own) {
      const UOp* r = rr.get();
      srcs.push_back(rr);
      if (r->op != Ops::RANGE || range_type(r) != AxisType::Reduce || !r->src(0)->is_const() || sums[r] != 1) continue;
      UOpRef lo, hi;
      for (size_t ti = 0; ti < terms.size(); ti++) {
        const UOp *a = terms[ti]->src(0), *b = terms[ti]->src(1);
        if (used[ti] || (!depends_on(a, r) && !depends_on(b, r))) continue;
        auto ca = index_coef(a, r), cb = index_coef(b, r);
        if (!ca || !cb || std::llabs(*cb - *ca) != 1) continue;
        // bounds that move with an outer loop (a constant bound is a shorter loop, not this stage's: a top-k's
        // one-hot r < 1 over 7 terms)
        const auto qs = ranges_of(terms[ti]);
        if (qs.size() < 2 || !std::all_of(qs.begin(), qs.end(), [&](const UOp* q) { return q == r || outside(q); }))
          continue;
        // b - a = c r + d > 0: r >= 1 - d (c = 1) or r < d (c = -1)
        const UOpRef zero = UOp::cnst_int(r->dtype, 0);
        UOpRef d = substitute(UOpRef(b), {{r, zero}})->alu(Ops::SUB, substitute(UOpRef(a), {{r, zero}}));
        if (*cb - *ca == 1) {
          UOpRef l = UOp::cnst_int(r->dtype, 1)->alu(Ops::SUB, d);
          lo = lo ? lo->alu(Ops::MAX, l) : l;
        } else {
          hi = hi ? hi->alu(Ops::CMPLT, d)->alu(Ops::WHERE, hi, d) : d;
        }
        used[ti] = true;
        sub.emplace_back(terms[ti], UOp::cnst(dtypes::bool_, 1));
      }
      if (!lo && !hi) continue;
      const UOpRef end = r->src()[0];
      lo = lo ? lo->alu(Ops::MAX, UOp::cnst_int(r->dtype, 0)) : UOp::cnst_int(r->dtype, 0);
      hi = hi ? hi->alu(Ops::CMPLT, end)->alu(Ops::WHERE, hi, end) : end;
      UOpRef nr = UOp::make(Ops::RANGE, r->dtype, {hi->alu(Ops::SUB, lo)}, r->arg);
      sub.emplace_back(r, lo->alu(Ops::ADD, nr));
      srcs.back() = nr;
    }
    if (sub.empty()) continue;
    srcs[0] = substitute(red->src()[0], sub);
    repl.emplace_back(red, UOp::make(Ops::REDUCE, red->dtype, srcs, red->arg));
  }
  return repl.empty() ? k : substitute(k, repl);
}

// Float sums over many terms with few accumulators (a batch norm's statistics: one per channel, or 16 vectorised
// channels of a channels-last activation) are summed in blocks: REDUCE(x, outer..., inner...) ->
// REDUCE(REDUCE(x, inner...), outer...), about sqrt(n) terms each way (a single range is split). The rounding error
// of a chain of n terms grows like sqrt(n): beautiful_mnist's second batch norm summed 2304 terms per chain, for
// 7.8e-6 relative error against libtorch's (blocked) 5.8e-8, and its logits carried 7.8e-6 against 1.5e-6.
// Register tiles (more than kMaxCopies accumulators: matmul's K loop, as in BLAS) and lane arrays keep their chains:
// blocking doubles the registers they hold.
UOpRef block_long_sums(const UOpRef& k) {
  constexpr int64_t kMinTerms = 1024, kMinBlock = 16;
  constexpr size_t kMaxCopies = 32;
  std::map<std::vector<const UOp*>, std::vector<const UOp*>> groups;  // own ranges -> the REDUCEs over them
  std::map<std::vector<const UOp*>, bool> ok;
  int64_t next_id = 0;
  for (const UOp* n : toposort(k.get())) {
    if (n->op == Ops::RANGE) next_id = std::max(next_id, range_id(n) + 1);
    if (n->op != Ops::REDUCE) continue;
    std::vector<const UOp*> own;
    for (size_t i = 1; i < n->nsrc(); i++) own.push_back(n->src(i));
    bool fits = Ops(std::get<int64_t>(n->arg)) == Ops::ADD && dtypes::is_float(n->dtype) && n->dtype.count == 1;
    int64_t terms = 1;
    for (const UOp* r : own) {
      fits &= r->op == Ops::RANGE && range_type(r) == AxisType::Reduce && r->src(0)->op == Ops::CONST;
      if (fits) terms *= r->src(0)->const_int();
    }
    fits &= !own.empty() && terms >= kMinTerms;
    ok[own] = (ok.count(own) ? ok[own] : true) && fits;
    groups[own].push_back(n);
  }
  std::vector<std::pair<const UOp*, UOpRef>> repl;
  for (auto& [own_p, members] : groups) {
    if (!ok[own_p] || members.size() > kMaxCopies) continue;
    // Another group sharing one of these ranges (its loop) would need the same split: left alone.
    bool shared = false;
    for (auto& [o2, m2] : groups)
      if (o2 != own_p)
        for (const UOp* r : own_p) shared |= std::find(o2.begin(), o2.end(), r) != o2.end();
    if (shared) continue;
    std::vector<UOpRef> own;
    int64_t terms = 1;
    for (const UOp* r : own_p) own.emplace_back(r), terms *= r->src(0)->const_int();
    auto off = [&](int64_t in) { return std::fabs(std::log(double(in)) - 0.5 * std::log(double(terms))); };
    // The split point (ranges run outer to inner) nearest sqrt(terms), each side at least kMinBlock terms.
    std::vector<UOpRef> outer, inner;
    std::vector<std::pair<const UOp*, UOpRef>> split;
    double best = 1e30;
    for (size_t cut = 1; cut < own.size(); cut++) {
      int64_t in = 1;
      for (size_t i = cut; i < own.size(); i++) in *= own[i]->src(0)->const_int();
      if (in >= kMinBlock && terms / in >= kMinBlock && off(in) < best) {
        best = off(in);
        outer.assign(own.begin(), own.begin() + std::ptrdiff_t(cut));
        inner.assign(own.begin() + std::ptrdiff_t(cut), own.end());
      }
    }
    if (outer.empty()) {
      // No split between ranges: the longest range is split into outer * c + inner, c the divisor nearest sqrt.
      size_t li = 0;
      for (size_t i = 0; i < own.size(); i++)
        if (own[i]->src(0)->const_int() > own[li]->src(0)->const_int()) li = i;
      int64_t len = own[li]->src(0)->const_int(), c = 0;
      for (int64_t d = kMinBlock; d * kMinBlock <= len; d++)
        if (len % d == 0 && (!c || off(d) < off(c))) c = d;
      if (!c) continue;
      UOpRef ro = UOp::range(ci(len / c), next_id++, AxisType::Reduce);
      UOpRef ri = UOp::range(ci(c), next_id++, AxisType::Reduce);
      split.emplace_back(own[li].get(), ro->alu(Ops::MUL, ci(c))->alu(Ops::ADD, ri));
      outer.assign(own.begin(), own.begin() + std::ptrdiff_t(li));
      outer.push_back(ro);
      inner.push_back(ri);
      inner.insert(inner.end(), own.begin() + std::ptrdiff_t(li) + 1, own.end());
    }
    for (const UOp* n : members) {
      std::vector<UOpRef> is{split.empty() ? UOpRef(n->src(0)) : substitute(n->src()[0], split)}, os;
      is.insert(is.end(), inner.begin(), inner.end());
      os.push_back(UOp::make(Ops::REDUCE, n->dtype, is, n->arg));
      os.insert(os.end(), outer.begin(), outer.end());
      repl.emplace_back(n, UOp::make(Ops::REDUCE, n->dtype, os, n->arg));
    }
  }
  return repl.empty() ? k : substitute(k, repl);
}

// REDUCE(src, r...) -> accumulator registers: init, loop update, read after the loop. REDUCEs over the same
// ranges (the expander's independent accumulators) share one loop: one END closes all their updates, and
// those of one op and dtype share one register array. Innermost REDUCEs first, until none is left.
UOpRef expand_reduces(UOpRef k) {
  int64_t next_reg = 0;  // past the register arrays the kernel has (reuse_row_values' row array)
  int64_t next_id = 0;
  for (const UOp* n : toposort(k.get())) {
    if (n->op == Ops::RANGE) next_id = std::max(next_id, range_id(n) + 1);
    if (n->op == Ops::DEFINE_REG) next_reg = std::max(next_reg, std::get<int64_t>(n->arg) + 1);
  }
  std::unordered_set<const UOp*> used;  // RANGEs that already have their loop (one END each)
  std::vector<UOpRef> keep;             // fresh RANGEs stay alive with the graph
  for (;;) {
    std::vector<const UOp*> topo = toposort(k.get());
    auto open = open_ranges(k);
    std::unordered_map<const UOp*, bool> has_red;
    // Innermost REDUCEs grouped by (own ranges, enclosing ranges): only those may share a loop.
    using Key = std::pair<std::vector<const UOp*>, std::vector<const UOp*>>;
    std::map<Key, std::vector<const UOp*>> groups;
    std::vector<Key> order;
    for (const UOp* n : topo) {
      bool h = false;
      for (auto& s : n->src()) h |= has_red[s.get()] || s->op == Ops::REDUCE;
      has_red[n] = h;
      if (n->op == Ops::REDUCE && !h) {
        Key key;
        for (size_t i = 1; i < n->nsrc(); i++)
          if (n->src(i)->op == Ops::RANGE) key.first.push_back(n->src(i));  // a loop of 1 simplifies to a constant
        // the loops around the sum: those its terms run in, and those its loops' ends depend on (a narrowed tap
        // loop's: narrow_gated_reduces; an average pool's count of 1s has no terms that depend on its row)
        std::vector<const UOp*> ends{n->src(0)};
        for (const UOp* r : key.first) ends.push_back(r->src(0));
        for (const UOp* e : ends)
          for (const UOp* r : open[e])
            if (std::find(key.first.begin(), key.first.end(), r) == key.first.end() &&
                std::find(key.second.begin(), key.second.end(), r) == key.second.end())
              key.second.push_back(r);
        std::sort(key.second.begin(), key.second.end(), [](const UOp* a, const UOp* b) { return range_id(a) < range_id(b); });
        if (!groups.count(key)) order.push_back(key);
        groups[key].push_back(n);
      }
    }
    if (order.empty()) return k;
    std::vector<std::pair<const UOp*, UOpRef>> repl;
    for (const Key& key : order) {
      const auto& members = groups[key];
      std::vector<UOpRef> own(key.first.begin(), key.first.end()), outer(key.second.begin(), key.second.end());
      // Reduces over the same loops but inside different outer loops (e.g. an average pool's sum and count
      // after an UPCAST) cannot share a loop: a later group gets fresh copies of the RANGEs.
      std::vector<std::pair<const UOp*, UOpRef>> fresh;
      for (UOpRef& r : own)
        if (used.count(r.get())) {
          UOpRef nr = UOp::range(r->src()[0], next_id++, range_type(r.get()));
          fresh.emplace_back(r.get(), nr);
          keep.push_back(nr);
          r = nr;
        }
      for (const UOpRef& r : own) used.insert(r.get());
      auto value_of = [&](const UOp* m) { return fresh.empty() ? UOpRef(m->src(0)) : substitute(m->src()[0], fresh); };
      // Sub-groups by (op, dtype): one register array each.
      std::map<std::pair<int64_t, std::string>, std::vector<const UOp*>> sub;
      std::vector<std::pair<int64_t, std::string>> sub_order;
      for (const UOp* m : members) {
        auto sk = std::make_pair(std::get<int64_t>(m->arg), m->dtype.name());
        if (!sub.count(sk)) sub_order.push_back(sk);
        sub[sk].push_back(m);
      }
      struct Acc { UOpRef acc, nan; std::vector<const UOp*> ms; };  // nan: a float MAX's NaN carrier (plain_max)
      std::vector<Acc> accs;
      std::vector<UOpRef> updates;
      // A Lane range (the expander's kept UNROLL, innermost): each REDUCE gets an array of that many
      // accumulators, indexed by the lane, set by a lane loop of its own and combined after the loop.
      UOpRef lane;
      for (const UOpRef& r : own)
        if (range_type(r.get()) == AxisType::Lane) lane = r;
      if (lane) {
        sub.clear(), sub_order.clear();
        for (const UOp* m : members) {
          auto sk = std::make_pair(int64_t(sub_order.size()), std::string());
          sub_order.push_back(sk);
          sub[sk] = {m};
        }
      }
      const int64_t lanes = lane ? lane->src()[0]->const_int() : 1;
      for (const auto& sk : sub_order) {
        const auto& ms = sub[sk];
        Ops op = Ops(std::get<int64_t>(ms[0]->arg));
        DType d = ms[0]->dtype;
        const bool split_nan = splits_nan(op, d);
        // One register array with its init stores (before the loop) and its view inside the loop.
        auto registers = [&](const UOpRef& identity) {
          UOpRef acc = UOp::make(Ops::DEFINE_REG, d.ptr_to(int64_t(ms.size()) * lanes, AddrSpace::Reg), {},
                                 int64_t(next_reg++));
          std::vector<UOpRef> os{acc};
          os.insert(os.end(), outer.begin(), outer.end());
          UOpRef acc_outer = outer.empty() ? acc : UOp::make(Ops::AFTER, acc->dtype, os);
          std::vector<UOpRef> is{acc};
          if (lane) {
            UOpRef l0 = UOp::range(lane->src()[0], next_id++, AxisType::Lane);
            keep.push_back(l0);
            is.push_back(UOp::make(Ops::END, dtypes::void_,
                                   {UOp::make(Ops::STORE, dtypes::void_,
                                              {UOp::make(Ops::INDEX, acc->dtype, {acc_outer, l0}), identity}),
                                    l0}));
          } else {
            for (size_t i = 0; i < ms.size(); i++)
              is.push_back(UOp::make(Ops::STORE, dtypes::void_,
                                     {UOp::make(Ops::INDEX, acc->dtype, {acc_outer, ci(int64_t(i))}), identity}));
          }
          is.insert(is.end(), own.begin(), own.end());
          return std::make_pair(acc, UOp::make(Ops::AFTER, acc->dtype, is));
        };
        auto [acc, acc_in] = registers(identity_of(op, d));
        UOpRef nan, nan_in;
        if (split_nan) std::tie(nan, nan_in) = registers(UOp::cnst(d, 0));
        for (size_t i = 0; i < ms.size(); i++) {
          UOpRef at = lane ? lane : ci(int64_t(i)), v = value_of(ms[i]);
          UOpRef idx = UOp::make(Ops::INDEX, acc->dtype, {acc_in, at});
          UOpRef cur = UOp::make(Ops::LOAD, d, {idx});
          updates.push_back(UOp::make(Ops::STORE, dtypes::void_,
                                      {idx, split_nan ? plain_max(cur, v) : UOp::make(op, d, {cur, v})}));
          if (!split_nan) continue;
          UOpRef nidx = UOp::make(Ops::INDEX, nan->dtype, {nan_in, at});
          updates.push_back(UOp::make(Ops::STORE, dtypes::void_, {nidx, carry_nan(UOp::make(Ops::LOAD, d, {nidx}), v)}));
        }
        accs.push_back({acc, nan, ms});
      }
      // One END chain closes every update of the group.
      std::vector<UOpRef> e = updates;
      for (size_t i = own.size(); i-- > 0;) {
        e.push_back(own[i]);
        e = {UOp::make(Ops::END, dtypes::void_, e)};
      }
      for (const Acc& a : accs) {
        Ops rop = Ops(std::get<int64_t>(a.ms[0]->arg));
        DType d = a.ms[0]->dtype;
        // How two partial results of one array combine: the reduce's op, or plain_max / carry_nan for a float MAX.
        auto combine = [&](bool nan, const UOpRef& x, const UOpRef& y) {
          return !a.nan ? UOp::make(rop, d, {x, y}) : nan ? carry_nan(x, y) : plain_max(x, y);
        };
        // The array's value at i (0 after the lanes are combined) after the loop.
        auto finish = [&](const UOpRef& reg, bool nan) -> std::function<UOpRef(int64_t)> {
          UOpRef after = UOp::make(Ops::AFTER, reg->dtype, {reg, e[0]});
          auto read = [reg, d](const UOpRef& aft, int64_t i) {
            return UOp::make(Ops::LOAD, d, {UOp::make(Ops::INDEX, reg->dtype, {aft, ci(i)})});
          };
          if (lane && (lanes & (lanes - 1)) == 0) {
            // The lanes combine as reduce_tree's halving order, but in place: a Lane loop per level,
            // acc[l] = acc[l] op acc[l + h] for l < h, so each level is one vector op (as scalar reads, LLVM
            // left the tree scalar: ~60 instructions for 32 lanes, as many as a linear layer's whole K loop).
            // The last levels (h < 4, narrower than a vector) are plain stores.
            for (int64_t h = lanes / 2; h >= 1; h /= 2) {
              auto at = [&](const UOpRef& i) { return UOp::make(Ops::INDEX, reg->dtype, {after, i}); };
              auto level = [&](const UOpRef& l) {
                UOpRef v = combine(nan, UOp::make(Ops::LOAD, d, {at(l)}), UOp::make(Ops::LOAD, d, {at(l->alu(Ops::ADD, ci(h)))}));
                return UOp::make(Ops::STORE, dtypes::void_, {at(l), v});
              };
              std::vector<UOpRef> deps{reg};
              if (h >= 4) {
                UOpRef l = UOp::range(ci(h), next_id++, AxisType::Lane);
                keep.push_back(l);
                deps.push_back(UOp::make(Ops::END, dtypes::void_, {level(l), l}));
              } else {
                for (int64_t i = 0; i < h; i++) deps.push_back(level(ci(i)));
              }
              after = UOp::make(Ops::AFTER, reg->dtype, deps);
            }
            UOpRef r = read(after, 0);
            return [r](int64_t) { return r; };
          }
          if (lane) {
            UOpRef r = read(after, 0);
            if (!a.nan) {
              std::vector<UOpRef> parts;
              for (int64_t i = 0; i < lanes; i++) parts.push_back(read(after, i));
              r = reduce_tree(rop, std::move(parts));
            } else {
              for (int64_t i = 1; i < lanes; i++) r = combine(nan, r, read(after, i));
            }
            return [r](int64_t) { return r; };
          }
          return [read, after](int64_t i) { return read(after, i); };
        };
        auto value = finish(a.acc, false);
        std::function<UOpRef(int64_t)> nan_value = a.nan ? finish(a.nan, true) : nullptr;
        for (size_t i = 0; i < (lane ? 1 : a.ms.size()); i++) {
          UOpRef m = value(int64_t(i));
          if (nan_value) {
            UOpRef n = nan_value(int64_t(i));
            m = n->alu(Ops::CMPNE, n)->alu(Ops::WHERE, n, m);
          }
          repl.emplace_back(a.ms[i], m);
        }
      }
    }
    k = substitute(k, repl);
  }
}

// Opt PREFETCH (`prefetch`: the reduce RANGE's id, bytes ahead): the END of that range's loop gets a PREFETCH of
// each load inside it that streams a buffer larger than L2 (streamed_loads) at the address it reads `bytes` ahead
// (whole iterations: ceil(bytes / the load's stride along the range)), with every loop inside at 0 (one prefetch per
// iteration of the loop, not per lane or inner step: the linearizer places a node in the innermost loop it depends
// on). Ahead means in the order of the loops: where the address reads one enclosing loop (a matvec's tile of rows),
// an iteration past the range's end is the next iteration of that loop (r -> (r + d) % n, g -> g + (r + d) // n),
// not the next row of the same tile, which another of the tile's streams reads already: with rows of 64 blocks
// (q8_0 2048 wide) and 15 blocks ahead, the first quarter of every tile's rows was never prefetched (gate/up 13 GB/s
// against down's 20, whose rows are 256 blocks). Prefetches of one buffer whose addresses differ by a constant of
// less than a cache line (a q4_0 block's scale and its nibbles) are one. The values computed do not change.
// One prefetch an iteration also where an iteration moves the load over more lines (AVX-512's UNROLL 32: 128 bytes,
// every other line of the next row; the hardware's adjacent-line prefetch takes the other): a prefetch for each line
// was slower (bench/bandwidth, Zen 5, main and it alternating, load 2.6-3.3: softmax 0.73-0.84x -> 0.55-0.70x of
// the triad, layernorm 0.99-1.06x -> 0.80-0.96x; mixed at load 4-8).
UOpRef add_prefetches(const UOpRef& k, const std::vector<std::pair<int64_t, int64_t>>& prefetch, int64_t l2_bytes) {
  if (prefetch.empty()) return k;
  auto end_range = [](const UOp* e) -> const UOp* {
    const UOp* r = e->op == Ops::END && e->nsrc() ? e->src(e->nsrc() - 1) : nullptr;
    return r && r->op == Ops::RANGE ? r : nullptr;
  };
  std::vector<std::pair<const UOp*, UOpRef>> repl;
  for (const UOp* e : toposort(k.get())) {
    const UOp* r = end_range(e);
    if (!r || range_type(r) != AxisType::Reduce) continue;
    auto it = std::find_if(prefetch.begin(), prefetch.end(), [&](const auto& p) { return p.first == range_id(r); });
    if (it == prefetch.end()) continue;
    std::unordered_set<const UOp*> inner;  // the loops inside this one
    for (const UOp* u : toposort(e))
      if (u != e && end_range(u)) inner.insert(end_range(u));
    std::vector<UOpRef> srcs(e->src().begin(), e->src().end() - 1);
    std::vector<std::tuple<const UOp*, const UOp*, int64_t>> have;  // (buffer, address but its constant, bytes)
    for (const UOp* l : streamed_loads(e, r, l2_bytes)) {
      const UOp *buf = l->src(0)->src(0), *idx = l->src(0)->src(1);
      int64_t item = l->dtype.scalar_type().itemsize(), stride = std::abs(*index_coef(idx, r)) * item;
      UOpRef ahead = UOpRef(r)->alu(Ops::ADD, ci((it->second + stride - 1) / stride));
      std::vector<std::pair<const UOp*, UOpRef>> sub;
      std::vector<const UOp*> outer;  // the loops around this one that the address reads
      for (const UOp* q : toposort(idx))
        if (q->op == Ops::RANGE && inner.count(q)) sub.emplace_back(q, ci(0));
        else if (q->op == Ops::RANGE && q != r && (range_type(q) == AxisType::Loop || range_type(q) == AxisType::Global))
          outer.push_back(q);
      if (outer.size() == 1 && r->src(0)->op == Ops::CONST) {  // the next iteration of the enclosing loop
        UOpRef n = UOpRef(r->src(0));
        sub.emplace_back(r, ahead->alu(Ops::MOD, n));
        sub.emplace_back(outer[0], UOpRef(outer[0])->alu(Ops::ADD, ahead->alu(Ops::IDIV, n)));
      } else {
        sub.emplace_back(r, ahead);
      }
      UOpRef at = graph_rewrite(substitute(UOpRef(idx), sub), symbolic(), nullptr, false, "prefetch address");
      const UOp* base = at.get();
      int64_t off = 0;
      if (at->op == Ops::ADD && at->src(1)->op == Ops::CONST) base = at->src(0), off = at->src(1)->const_int();
      bool dup = false;
      for (const auto& [b, a, o] : have) dup |= b == buf && a == base && std::abs(o - off * item) < 64;
      if (dup) continue;
      have.emplace_back(buf, base, off * item);
      srcs.push_back(UOp::make(Ops::PREFETCH, dtypes::void_, {UOpRef(buf), at}));
    }
    if (srcs.size() + 1 == e->nsrc()) continue;
    srcs.push_back(UOpRef(r));
    repl.emplace_back(e, UOp::make(Ops::END, dtypes::void_, srcs));
  }
  return repl.empty() ? k : substitute(k, repl);
}

// Close every output loop after the stores: SINK(STORE...) -> SINK(END(...END(STORE..., rN)..., r0)). Stores in
// the same loops (the expander's copies) share one END chain.
UOpRef add_ends(const UOpRef& sink) {
  std::map<std::vector<const UOp*>, std::vector<UOpRef>> groups;
  std::vector<std::vector<const UOp*>> order;
  auto open = open_ranges(sink);
  for (auto& st : sink->src()) {
    std::vector<const UOp*> out;
    for (const UOp* r : open[st.get()])
      if (range_type(r) != AxisType::Reduce) out.push_back(r);
    std::sort(out.begin(), out.end(), [](const UOp* a, const UOp* b) { return range_id(a) < range_id(b); });
    if (!groups.count(out)) order.push_back(out);
    groups[out].push_back(st);
  }
  // A store in fewer loops than another (an index check's hit record, which depends on the output's rows only)
  // joins the other's loops: two END chains would close a shared range twice. It is repeated, with the same value.
  auto less = [](const UOp* a, const UOp* b) { return range_id(a) < range_id(b); };
  for (size_t i = 0; i < order.size();) {
    size_t into = order.size();
    for (size_t j = 0; j < order.size(); j++)
      if (j != i && order[j].size() > order[i].size() &&
          std::includes(order[j].begin(), order[j].end(), order[i].begin(), order[i].end(), less))
        into = j;
    if (into == order.size()) {
      i++;
      continue;
    }
    auto& dst = groups[order[into]];
    dst.insert(dst.end(), groups[order[i]].begin(), groups[order[i]].end());
    groups.erase(order[i]);
    order.erase(order.begin() + std::ptrdiff_t(i));
  }
  std::vector<UOpRef> srcs;
  for (const auto& out : order) {
    std::vector<UOpRef> e = groups[out];
    for (size_t i = out.size(); i-- > 0;) {
      e.push_back(out[i]);
      e = {UOp::make(Ops::END, dtypes::void_, e)};
    }
    srcs.insert(srcs.end(), e.begin(), e.end());
  }
  return sink->replace_src(srcs);
}

// An accumulator's update acc = acc + a*b as one fused multiply-add (MULACC; the reduce order already differs from a
// plain sum). Only register accumulators: a store into a buffer (an assign's out + a*b) keeps its two roundings.
const PatternMatcher& pm_mulacc() {
  using namespace pat;
  static const PatternMatcher pm(table(rule(op<Ops::STORE>(x, op<Ops::ADD>(op<Ops::LOAD>(x), op<Ops::MUL>(y, z))), [](auto& m) -> UOpRef {
    const UOp *idx = m[x], *sum = m.root->src(1);
    if (!dtypes::is_float(sum->dtype) || idx->op != Ops::INDEX) return {};
    const UOp* base = idx->src(0)->op == Ops::AFTER ? idx->src(0)->src(0) : idx->src(0);
    if (base->op != Ops::DEFINE_REG) return {};
    return UOp::make(Ops::STORE, dtypes::void_, {idx->ref(), UOp::make(Ops::MULACC, sum->dtype, {m[y]->ref(), m[z]->ref(), sum->src()[0]})});
  })));
  return pm;
}

struct IndexCtx {
  DType to;
};
// index dtype -> int32 (or int64 when some value needs it)
const PatternMatcher& pm_lower_index_dtype() {
  static const PatternMatcher pm(table(rule(op_any<all_ops>, [](auto& m) -> UOpRef {
    const UOp* u = m.root;
    DType to = m.template ctx<IndexCtx>().to;
    if (u->dtype.scalar != Scalar::Index) return {};
    DType nd = to;
    nd.count = u->dtype.count;
    return u->with_dtype(nd);
  })));
  return pm;
}

// ---------------------------------------------------------------- linearise

using RangeSet = std::bitset<512>;

}  // namespace

int reduce_accumulators(Ops op, DType d) { return splits_nan(op, d) ? 2 : 1; }

std::vector<const UOp*> linearize(const UOpRef& sink) {
  std::vector<const UOp*> topo = toposort(sink.get());
  std::unordered_map<const UOp*, int> rid;
  std::vector<const UOp*> ranges;
  for (const UOp* u : topo)
    if (u->op == Ops::RANGE) {
      if (ranges.size() >= 512) throw Error("[linearize] more than 512 loops in one kernel");
      rid[u] = int(ranges.size());
      ranges.push_back(u);
    }
  // deps: the loops a node must be inside.
  std::unordered_map<const UOp*, RangeSet> deps;
  std::unordered_map<const UOp*, const UOp*> end_of;  // range -> its END
  for (const UOp* u : topo) {
    RangeSet d;
    for (auto& s : u->src()) d |= deps[s.get()];
    if (u->op == Ops::RANGE) d.set(size_t(rid[u]));
    if (u->op == Ops::END) {
      const UOp* r = u->src(u->nsrc() - 1);
      d.reset(size_t(rid.at(r)));
      end_of[r] = u;
    }
    deps[u] = d;
  }
  // Loop depth: a loop lies inside every loop its END still depends on.
  std::vector<int> depth(ranges.size(), -1);
  std::function<int(int)> depth_of = [&](int r) -> int {
    if (depth[size_t(r)] >= 0) return depth[size_t(r)];
    if (depth[size_t(r)] == -2) throw Error("[linearize] loops nest inside each other (a cycle through RANGE " + std::to_string(r) + ")");
    depth[size_t(r)] = -2;
    auto it = end_of.find(ranges[size_t(r)]);
    if (it == end_of.end()) throw Error("[linearize] a RANGE without an END");
    int d = 0;
    const RangeSet& ed = deps[it->second];
    for (size_t i = 0; i < ranges.size(); i++)
      if (ed.test(i)) d = std::max(d, depth_of(int(i)) + 1);
    return depth[size_t(r)] = d;
  };
  for (size_t i = 0; i < ranges.size(); i++) depth_of(int(i));
  auto scope_of = [&](const UOp* u) -> int {
    int best = -1, bd = -1;
    const RangeSet& d = deps[u];
    for (size_t i = 0; i < ranges.size(); i++)
      if (d.test(i) && depth[i] > bd) bd = depth[i], best = int(i);
    return best;  // -1: the kernel's top level
  };
  std::unordered_map<int, std::vector<const UOp*>> body;  // scope -> nodes in topo order
  for (const UOp* u : topo) {
    if (u->op == Ops::SINK) continue;
    if (u->op == Ops::RANGE) continue;  // emitted when its loop opens
    body[scope_of(u)].push_back(u);
  }
  std::vector<const UOp*> out;
  // Emit a scope; an END of a child loop triggers the loop: RANGE, its body, END.
  std::function<void(int)> emit = [&](int s) {
    for (const UOp* u : body[s]) {
      if (u->op == Ops::END) {
        const UOp* r = u->src(u->nsrc() - 1);
        out.push_back(r);
        emit(rid.at(r));
      }
      out.push_back(u);
    }
  };
  emit(-1);
  out.push_back(sink.get());
  return out;
}

namespace {

// What the lowering stages share: the renderer (its capabilities decide which stages apply), the options, and what
// the stages decide (the opts applied, a GPU kernel's launch dimensions).
struct LowerCtx {
  Renderer& renderer;
  const LowerOptions& opt;
  const std::string& name;
  Renderer::GridLimits lim;
  std::vector<Opt> opts;
  LaunchDims dims;
  std::vector<std::pair<int64_t, int64_t>> prefetch;  // Opt PREFETCH: (the reduce RANGE's id, bytes ahead)
  bool nontemporal = false;                           // Opt NONTEMPORAL
  bool gpu() const { return lim.threads > 0; }
};

UOpRef simplify(const UOpRef& k, const char* why) { return graph_rewrite(k, symbolic(), nullptr, false, why); }

// Optimisations: the given opts, or the heuristic's (none with NOOPT=1): the CPU one (LLVM vectorises the copies,
// threads split the outer loop) or, for GPU renderers (grid limits), the GPU one (work groups, local memory, tensor
// cores).
UOpRef do_apply_opts(const UOpRef& k0, LowerCtx& c) {
  OptConfig cfg = c.opt.config;
  if (c.gpu()) cfg.local_threads = c.lim.threads, cfg.tensor_cores = c.lim.tensor_cores;
  c.opts = c.opt.opts                 ? *c.opt.opts
           : getenv_int("NOOPT", 0)   ? std::vector<Opt>{}
           : c.gpu()                  ? gpu_hand_coded_optimizations(k0, cfg)
                                      : hand_coded_optimizations(k0, cfg);
  auto opts_str = [&] {
    std::string s;
    for (const Opt& o : c.opts) s += (s.empty() ? "" : ", ") + to_string(o);
    return s;
  };
  UOpRef k = k0;
  for (const Opt& o : c.opts) try {
    bool gpu_only = o.op == OptOp::LOCAL || o.op == OptOp::GROUP || o.op == OptOp::GROUPTOP || o.op == OptOp::TC;
    if (gpu_only && (!c.gpu() || !c.renderer.has_local()))
      throw OptError("[opt] " + to_string(o) + " needs a GPU renderer with work groups and local memory");
    if (o.op == OptOp::TC && !c.lim.tensor_cores) throw OptError("[opt] Opt(TC): this renderer has no tensor cores");
    if (o.op == OptOp::NONTEMPORAL) {
      if (c.gpu()) throw OptError("[opt] " + to_string(o) + " needs a CPU renderer");
      k = apply_opt(k, o);  // checks axis and amt
      c.nontemporal = true;
      continue;
    }
    if (o.op == OptOp::PREFETCH) {
      if (c.gpu()) throw OptError("[opt] " + to_string(o) + " needs a CPU renderer");
      UOpRef same = apply_opt(k, o);  // checks the axis and amount
      c.prefetch.emplace_back(range_id(kernel_axes(k)[size_t(o.axis)]), o.amt);
      k = same;
      continue;
    }
    k = apply_opt(k, o);
  } catch (const OptError& e) {  // which kernel, and the whole list the failing opt came from
    throw OptError(std::string(e.what()) + " (kernel " + c.name + ", opts [" + opts_str() + "])");
  }
  if (debug_level() >= 3 && !c.opts.empty()) std::fprintf(stderr, "opts %s: [%s]\n", c.name.c_str(), opts_str().c_str());
  return k;
}

// Index arithmetic in int32 where every index value's bounds fit (and the device does not ask for int64).
UOpRef do_lower_index_dtype(const UOpRef& k, LowerCtx& c) {
  bool wide = false;
  for (const UOp* u : toposort(k.get()))
    if (u->dtype.scalar == Scalar::Index && (!u->bounds().known || u->vmin() < INT32_MIN || u->vmax() > INT32_MAX)) wide = true;
  IndexCtx ictx{wide || c.opt.index64 ? dtypes::int64 : dtypes::int32};
  UOpRef r;
  {
    SpecPause pause;  // the rewrite builds parents with retyped sources before retyping them
    r = graph_rewrite(k, pm_lower_index_dtype(), &ictx, false, "lower index dtype");
  }
  if (spec_enabled()) spec_check(r.get());
  return r;
}

// Whether the vectorize stage will pack the expander's copies into vector ops of the machine's width.
bool packs_copies(const LowerCtx& c) {
  return getenv_int("VECTORIZE", 1) && !c.gpu() && c.opt.config.vector_width >= 2 &&
         c.renderer.vector_lanes_of(dtypes::float32) >= c.opt.config.vector_width;
}

// Whether every STORE of k writes a value of the same op tree as the first STORE into its buffer, but for constants
// and the loads' addresses: copies the vectorize stage packs into vector ops without gathering lanes.
bool copies_alike(const UOpRef& k) {
  std::map<const UOp*, const UOp*> first;  // buffer -> its first stored value
  std::vector<std::pair<const UOp*, const UOp*>> todo;
  for (const UOpRef& st : k->src()) {
    if (st->op != Ops::STORE || st->src(0)->op != Ops::INDEX) continue;
    auto [it, fresh] = first.emplace(st->src(0)->src(0), st->src(1));
    if (!fresh) todo.emplace_back(it->second, st->src(1));
  }
  std::set<std::pair<const UOp*, const UOp*>> seen;
  while (!todo.empty()) {
    auto [x, y] = todo.back();
    todo.pop_back();
    if (x == y || !seen.insert({x, y}).second) continue;
    if (x->op != y->op || x->dtype != y->dtype || x->nsrc() != y->nsrc()) return false;
    if (x->op == Ops::CONST) continue;                                  // a vector of constants
    if (x->op == Ops::INDEX && x->src(0) == y->src(0)) continue;         // one buffer, other addresses
    if (x->arg != y->arg) return false;
    for (size_t i = 0; i < x->nsrc(); i++) todo.emplace_back(x->src(i), y->src(i));
  }
  return true;
}

// A row kernel's summed value kept for its output loop (CPU): in a row array where the output goes past the caches.
UOpRef do_reuse_row_values(const UOpRef& k, LowerCtx& c) {
  if (c.gpu()) return k;
  return reuse_row_values(k, c.nontemporal ? row_array_bytes(c.opt.config) : 0);
}

// The expander (opt/expander.cpp). An elementwise kernel's copies that simplify into different op trees (the
// simplifier folds each copy's constants its own way) would be gathered lane by lane: a Lane loop instead.
UOpRef do_expand_upcasts(const UOpRef& k, LowerCtx& c) {
  bool kept = false;
  UOpRef e = expand_upcasts(k, c.renderer.vector_lanes(), packs_copies(c), &kept, c.nontemporal);
  if (kept && !copies_alike(simplify(e, "copies alike"))) e = expand_upcasts(k, c.renderer.vector_lanes(), false, nullptr);
  return e;
}

// The expander's copies as vector ops (VECTORIZE=0: scalars): on a CPU up to the machine's vector width, on a GPU the
// renderer's widths (float4).
UOpRef do_vectorize(const UOpRef& k, LowerCtx& c) {
  if (!getenv_int("VECTORIZE", 1)) return k;
  return vectorize(k, c.renderer, c.gpu() ? 64 : c.opt.config.vector_width);
}

// A loop's mean trip count for the work estimates: its end, or where the end depends on outer loops (a narrowed tap
// loop: narrow_gated_reduces) and the thread's index (a THREAD split of the output row) its mean over their values (at
// most 4096 points); 1 where it depends on another variable.
double mean_trips(const UOp* end) {
  if (end->op == Ops::CONST) return double(end->const_int());
  const std::vector<const UOp*> order = toposort(end);
  std::vector<const UOp*> loops;  // RANGEs (0 .. end - 1) and the core_id variable (min .. max)
  auto first = [](const UOp* u) { return u->op == Ops::RANGE ? 0 : std::get<VarArg>(u->arg).min; };
  auto count = [&](const UOp* u) {
    return std::max<int64_t>(u->op == Ops::RANGE ? u->src(0)->const_int() : std::get<VarArg>(u->arg).max - first(u) + 1, 1);
  };
  double points = 1;
  for (const UOp* u : order) {
    if ((u->op == Ops::RANGE && u->src(0)->op == Ops::CONST) ||
        (u->op == Ops::DEFINE_VAR && std::get<VarArg>(u->arg).name == "core_id")) {
      loops.push_back(u), points *= double(count(u));
    } else if (u->op != Ops::CONST && !is_alu(u->op)) {
      return 1;
    }
  }
  if (points > 4096) return 1;
  std::unordered_map<const UOp*, Value> val;
  std::vector<int64_t> at(loops.size(), 0);
  double sum = 0;
  for (int64_t p = 0; p < int64_t(points); p++) {
    for (size_t i = 0, q = size_t(p); i < loops.size(); i++) {  // p's digits in the loops' sizes
      const auto n = size_t(count(loops[i]));
      at[i] = first(loops[i]) + int64_t(q % n), q /= n;
    }
    for (const UOp* u : order) {
      Value& v = val[u];
      if (u->op == Ops::CONST) {
        v = Value{};
        if (auto* f = std::get_if<double>(&u->arg)) v.f = *f;
        else v.i = std::get<int64_t>(u->arg);
      } else if (u->op == Ops::RANGE || u->op == Ops::DEFINE_VAR) {
        v = Value{}, v.i = at[size_t(std::find(loops.begin(), loops.end(), u) - loops.begin())];
      } else {
        std::array<Value, 3> a;
        for (size_t j = 0; j < u->nsrc() && j < 3; j++) a[j] = val[u->src(j)];
        v = exec_alu(u->op, u->dtype, std::span<const Value>(a.data(), std::min<size_t>(u->nsrc(), 3)), u->src(0)->dtype);
      }
    }
    sum += double(std::max<int64_t>(val[end].i, 0));
  }
  return sum / points;
}

struct LowerStage {
  const char* name;
  UOpRef (*run)(const UOpRef&, LowerCtx&);
};

// The lowering of one kernel, as tinygrad's full_rewrite_to_sink: one list of named stages in order, each a rewrite
// of the whole kernel (a stage that does not apply to the renderer returns its input). DEBUG=5 prints each output.
const std::vector<LowerStage>& lowering_stages() {
  static const std::vector<LowerStage> stages = {
      {"decompose pow", [](const UOpRef& k, LowerCtx&) { return decompose_pow(k); }},
      {"simplify", [](const UOpRef& k, LowerCtx&) { return simplify(k, "simplify"); }},
      {"split ranges", [](const UOpRef& k, LowerCtx&) { return split_ranges(k); }},
      {"apply opts", do_apply_opts},
      {"factor reduce invariants", [](const UOpRef& k, LowerCtx& c) { return c.gpu() ? k : factor_reduce_invariants(k, c.opt.config.vector_width, c.opt.config.int8_dot); }},
      {"reuse row values", do_reuse_row_values},
      {"narrow gated reduces", [](const UOpRef& k, LowerCtx&) { return narrow_gated_reduces(k); }},
      {"expand upcasts", do_expand_upcasts},
      {"simplify after opts", [](const UOpRef& k, LowerCtx&) { return simplify(k, "simplify after opts"); }},
      {"group reduces", [](const UOpRef& k, LowerCtx& c) { return c.gpu() ? lower_group_reduces(k) : k; }},
      {"gpu dims", [](const UOpRef& k, LowerCtx& c) { return c.gpu() ? add_gpu_dims(k, c.lim, c.dims) : k; }},
      {"block long sums", [](const UOpRef& k, LowerCtx&) { return block_long_sums(k); }},
      {"expand reduces", [](const UOpRef& k, LowerCtx&) { return expand_reduces(k); }},
      {"add prefetches", [](const UOpRef& k, LowerCtx& c) { return add_prefetches(k, c.prefetch, c.opt.config.l2_bytes); }},
      {"mulacc", [](const UOpRef& k, LowerCtx&) { return graph_rewrite(k, pm_mulacc(), nullptr, false, "mulacc"); }},
      {"fuse wmma accumulators", [](const UOpRef& k, LowerCtx&) { return fuse_wmma_accumulators(k); }},
      {"add ends", [](const UOpRef& k, LowerCtx&) { return add_ends(k); }},
      {"simplify after reduce", [](const UOpRef& k, LowerCtx&) { return simplify(k, "simplify after reduce"); }},
      {"decompose transcendentals",
       [](const UOpRef& k, LowerCtx& c) { return want_transcendental_decomposition(c.renderer) ? decompose_transcendentals(k) : k; }},
      {"lower index dtype", do_lower_index_dtype},
      {"vectorize", do_vectorize},
      {"devectorize", [](const UOpRef& k, LowerCtx& c) { return devectorize(k, c.renderer); }},
      {"nontemporal stores", [](const UOpRef& k, LowerCtx& c) { return c.nontemporal ? mark_nontemporal_stores(k) : k; }},
  };
  return stages;
}

}  // namespace

CompiledKernel lower_kernel(const UOpRef& ast, const std::string& name, Renderer& renderer, const LowerOptions& opt) {
  int dbg = debug_level();
  if (dbg >= 5) std::fprintf(stderr, "--- %s: input\n%s", name.c_str(), print_graph(ast.get()).c_str());
  LowerCtx ctx{renderer, opt, name, renderer.grid_limits(), {}, {}};
  viz::Context vctx("kernel", name);
  profile::Span span("lower", name);
  UOpRef k = ast;
  for (const LowerStage& st : lowering_stages()) {
    size_t recorded = viz::enabled() ? viz::thread_records() : 0;
    UOpRef next = st.run(k, ctx);
    // VIZ: a stage that changed the kernel without a graph_rewrite (a hand pass) is recorded as a whole
    if (viz::enabled() && viz::thread_records() == recorded) viz::record_rewrite(st.name, k, {}, next);
    if (dbg >= 5)
      std::fprintf(stderr, "--- %s: %s%s\n%s", name.c_str(), st.name, next == k ? " (unchanged)" : "",
                   next == k ? "" : print_graph(next.get()).c_str());
    k = next;
  }
  std::vector<Opt>& opts = ctx.opts;
  LaunchDims& dims = ctx.dims;
  CompiledKernel ck;
  ck.name = name;
  ck.dims = dims;
  // Every buffer of the AST stays a parameter, read or not: a load whose gate folded to false (a slice that falls
  // inside one input of a cat) leaves its buffer unread, and the launch still passes buffers by position.
  {
    std::vector<UOpRef> src(k->src().begin(), k->src().end());
    std::unordered_set<const UOp*> have;
    for (const UOp* u : toposort(k.get()))
      if (u->op == Ops::PARAM) have.insert(u);
    for (const UOp* u : toposort(ast.get()))
      if (u->op == Ops::PARAM && !have.count(u)) src.push_back(UOpRef(u));
    if (src.size() != k->nsrc()) k = k->replace_src(src);
  }
  ck.sink = k;  // the program's nodes live as long as the kernel
  ck.program = linearize(k);
  for (const UOp* u : ck.program) {
    if (u->op == Ops::PARAM) ck.n_params = std::max(ck.n_params, int(std::get<int64_t>(u->arg)) + 1);
    if (u->op == Ops::DEFINE_VAR) {
      const VarArg& v = std::get<VarArg>(u->arg);
      if (v.name == "core_id") ck.core_var = int(ck.var_names.size()), ck.threads = int(v.max + 1);
      ck.var_names.push_back(v.name);
    }
  }
  // Work estimates for DEBUG=2: ALU ops and bytes moved, counted through loop trip counts.
  double mult = 1;
  std::vector<double> stack;
  for (const UOp* u : ck.program) {
    if (u->op == Ops::RANGE) {
      stack.push_back(mult);
      mult *= std::max(1.0, mean_trips(u->src(0)));
    } else if (u->op == Ops::END) {
      if (!stack.empty()) mult = stack.back(), stack.pop_back();
    } else if (is_alu(u->op) && !dtypes::is_int(u->dtype)) {
      // a MULACC is a multiply and an add (as tinygrad counts it); a vector op one per lane
      ck.flops += mult * (u->op == Ops::MULACC ? 2 : 1) * std::max(1, int(u->dtype.count));
    } else if ((u->op == Ops::LOAD || u->op == Ops::STORE) && u->src(0)->src(0)->op == Ops::PARAM) {
      const UOp* p = u->src(0)->src(0);
      int lanes = std::max(1, int((u->op == Ops::LOAD ? u->dtype : u->src(1)->dtype).count));
      ck.mem_bytes += mult * double(p->dtype.base().scalar_type().itemsize()) * lanes;
    }
  }
  ck.flops *= ck.threads;
  ck.mem_bytes *= ck.threads;
  ck.opts = opts;
  if (dbg >= 6) {
    std::fprintf(stderr, "--- %s: linear program\n", name.c_str());
    for (size_t i = 0; i < ck.program.size(); i++)
      std::fprintf(stderr, "%4zu %s %s\n", i, op_name(ck.program[i]->op), ck.program[i]->dtype.name().c_str());
  }
  ck.src = renderer.render(name, ck.program);
  if (viz::enabled()) viz::attach_source(ck.src);
  if (dbg >= 4) std::fprintf(stderr, "%s\n", ck.src.c_str());
  return ck;
}

}  // namespace tg
