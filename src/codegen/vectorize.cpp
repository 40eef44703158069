// Vector dtypes (tinygrad: the expander's vectors, codegen/late/devectorizer.py). The expander leaves one scalar
// copy per lane of an upcast axis; here the copies that store consecutive addresses of one buffer become one vector
// STORE, and their values vector ops over vector LOADs of consecutive addresses (pm_vectorize). pm_devectorize then
// splits what the renderer cannot take (CUDA's float4 has no arithmetic; a width or alignment it does not have)
// into lanes, folding GEPs of VECTORIZEs away.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "tg/device.hpp"
#include "tg/opt.hpp"
#include "tg/pattern.hpp"

namespace tg {
using namespace tg::pat;

namespace {

// Element kinds a vector LOAD/STORE moves, and those of the values in between (comparisons give bool lanes).
bool mem_kind(DType d) {
  if (d.ptr || d.count != 1) return false;
  switch (d.scalar) {
    case Scalar::Float16: case Scalar::BFloat16: case Scalar::Float32: case Scalar::Float64: case Scalar::Int16:
    case Scalar::UInt16: case Scalar::Int32: case Scalar::UInt32: case Scalar::Int64: case Scalar::UInt64: return true;
    default: return false;
  }
}
bool value_kind(DType d) { return mem_kind(d) || (!d.ptr && d.count == 1 && d.scalar == Scalar::Bool); }

bool packable(Ops o) {
  switch (o) {
    case Ops::ADD: case Ops::SUB: case Ops::MUL: case Ops::FDIV: case Ops::IDIV: case Ops::MOD: case Ops::NEG:
    case Ops::MAX: case Ops::MULACC: case Ops::RECIPROCAL: case Ops::SQRT: case Ops::TRUNC: case Ops::EXP2:
    case Ops::LOG2: case Ops::SIN: case Ops::CMPLT: case Ops::CMPNE: case Ops::CMPEQ: case Ops::WHERE: case Ops::AND:
    case Ops::OR: case Ops::XOR: case Ops::SHL: case Ops::SHR: case Ops::CAST: case Ops::BITCAST: return true;
    default: return false;
  }
}

UOpRef ci_like(const UOp* like, int64_t v) { return UOp::cnst_int(like->dtype, v); }

// An index as base + constant (base null: a constant index).
std::pair<const UOp*, int64_t> split_offset(const UOp* idx) {
  if (idx->op == Ops::CONST) return {nullptr, idx->const_int()};
  if (idx->op == Ops::ADD && idx->src(1)->op == Ops::CONST) return {idx->src(0), idx->src(1)->const_int()};
  return {idx, 0};
}
// The index idx + k, folded into its constant.
UOpRef offset_index(const UOp* idx, int64_t k) {
  if (k == 0) return UOpRef(idx);
  auto [base, off] = split_offset(idx);
  if (!base) return ci_like(idx, off + k);
  return UOpRef(base)->alu(Ops::ADD, ci_like(idx, off + k));
}

// Whether every value of index expression e is a multiple of n (a power of two); bounded by the expression's depth.
bool multiple_of(const UOp* e, int64_t n, int depth = 0) {
  if (!e) return true;
  if (depth > 32) return false;
  switch (e->op) {
    case Ops::CONST: return e->const_int() % n == 0;
    case Ops::MUL: return multiple_of(e->src(0), n, depth + 1) || multiple_of(e->src(1), n, depth + 1);
    case Ops::ADD: case Ops::SUB: return multiple_of(e->src(0), n, depth + 1) && multiple_of(e->src(1), n, depth + 1);
    case Ops::SHL:
      return (e->src(1)->op == Ops::CONST && e->src(1)->const_int() < 62 && (int64_t(1) << e->src(1)->const_int()) % n == 0) ||
             multiple_of(e->src(0), n, depth + 1);
    default: return false;
  }
}

const UOp* reg_of(const UOp* buf) {
  while (buf->op == Ops::AFTER) buf = buf->src(0);
  return buf;
}

struct VecCtx {
  const Renderer& r;
  int cap32;  // most lanes of a 32-bit element (the machine's vector width on a CPU)
  std::map<std::vector<const UOp*>, UOpRef> memo;
  std::vector<UOpRef> keep;  // the memo's key nodes stay alive (a freed node's address may be reused)
  std::map<const UOp*, int> reg_lanes;  // an accumulator array's width: that of its updates in the loop
  std::set<std::tuple<const UOp*, const UOp*, int64_t>> loaded;  // (buffer, base, offset) of the ungated loads

  // Most lanes of d in one op, a power of two (1: none).
  int lanes(DType d) const {
    int n = std::min(r.vector_lanes_of(d), std::max(1, cap32 * 32 / std::max(8, d.bitsize())));
    int p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
  }
  // Whether INDEXes idx[0..n) address consecutive elements of one buffer from idx[0], as one vector access may.
  bool consecutive(const std::vector<const UOp*>& idx) const {
    const UOp* i0 = idx[0];
    if (i0->op != Ops::INDEX || i0->nsrc() != 2) return false;
    const UOp* buf = i0->src(0);
    bool param = buf->op == Ops::PARAM;
    if (!param && reg_of(buf)->op != Ops::DEFINE_REG) return false;  // (an aligned renderer aligns register arrays)
    auto [base, off] = split_offset(i0->src(1));
    int64_t n = int64_t(idx.size());
    if (r.vector_aligned() && (off % n != 0 || !multiple_of(base, n))) return false;
    for (int64_t k = 1; k < n; k++) {
      const UOp* ik = idx[size_t(k)];
      if (ik->op != Ops::INDEX || ik->nsrc() != 2 || ik->src(0) != buf) return false;
      auto [b, o] = split_offset(ik->src(1));
      if (b != base || o != off + k) return false;
    }
    return true;
  }
};

bool gathers(const UOpRef& v);
bool broadcast(const UOp* v);

// The aligned block of n elements that holds the element INDEX ix reads, as one vector LOAD, and the element's
// lane in it; null where ix is not an offset into a PARAM or the kernel does not load the whole block anyway (a
// vector would then read addresses the kernel does not: past the buffer's end).
std::optional<std::pair<UOpRef, int64_t>> block_of(VecCtx& c, const UOp* ix, int n, DType d) {
  if (ix->op != Ops::INDEX || ix->nsrc() != 2 || ix->src(0)->op != Ops::PARAM) return std::nullopt;
  auto [base, off] = split_offset(ix->src(1));
  const int64_t start = off - ((off % n) + n) % n;
  for (int64_t k = 0; k < n; k++)
    if (!c.loaded.count({ix->src(0), base, start + k})) return std::nullopt;
  UOpRef at = base ? UOpRef(base)->alu(Ops::ADD, ci_like(ix->src(1), start)) : ci_like(ix->src(1), start);
  if (base && start == 0) at = UOpRef(base);
  UOpRef blk = UOp::make(Ops::LOAD, d.vec(n), {UOp::make(Ops::INDEX, ix->dtype, {UOpRef(ix->src(0)), at})});
  return std::make_pair(blk, off - start);
}

// Lanes that load idx[0..n) at a stride (a transpose: the store runs along one axis, the loads along another) where
// the kernel loads each lane's whole aligned block of n elements anyway (the tile's other copies): one vector LOAD a
// block and a lane of each (GEP), so that each block is loaded once as a vector and the lanes are shuffles, not n
// scalar loads of n cache lines that must stay in L1 between the copies (at a power-of-two row stride they share a
// cache set and do not: a 4096^2 transpose read each line 16 times from L2). Null when some block is not loaded
// whole: then a vector would read addresses the kernel does not (past the buffer's end).
UOpRef transposed(VecCtx& c, const std::vector<const UOp*>& idx, int n, DType d) {
  if (c.r.vector_aligned() || c.lanes(d) < n) return {};
  std::vector<UOpRef> lanes;
  for (const UOp* ix : idx) {
    auto b = block_of(c, ix, n, d);
    if (!b) return {};
    lanes.push_back(UOp::make(Ops::GEP, d, {b->first}, std::vector<int64_t>{b->second}));
  }
  return UOp::make(Ops::VECTORIZE, d.vec(n), lanes);
}

// Lane j of each of n vectors of n lanes (rows: a transposed block, or values computed from such blocks): the rows
// and j; nullopt for any other VECTORIZE.
std::optional<std::pair<std::vector<UOpRef>, int64_t>> rows_of(const UOpRef& v) {
  const int n = v->dtype.count;
  if (v->op != Ops::VECTORIZE || n < 2) return std::nullopt;
  std::vector<UOpRef> rows;
  int64_t j = -1;
  for (const UOpRef& g : v->src()) {
    if (g->op != Ops::GEP || g->src(0)->dtype.count != n) return std::nullopt;
    const auto& a = std::get<std::vector<int64_t>>(g->arg);
    if (a.size() != 1 || (j >= 0 && a[0] != j)) return std::nullopt;
    j = a[0];
    rows.push_back(g->src()[0]);
  }
  return std::make_pair(rows, j);
}

// An op over the lanes of transposed blocks, computed on the blocks' rows instead (rows_of): lane i of op(s...) is
// lane j of op over row i of each source, so the op runs once per row in the loads' layout, and only its result is
// transposed into the store's lanes, where each source was transposed before (a relu gradient read back in NCHW
// order: the input and the gradient, two transposes, against one). A source the same in every lane (a channel's
// bias: a broadcast) takes its block's row in every row, where it is a constant or a load whose block the kernel
// loads whole with the element in lane j. Only for blocks of 4 lanes or more (a 2 x 2 block's transpose is a shuffle
// a row; the op on whole rows would double the work where the other lane is not used), and not for IDIV and MOD: the
// rows' other lanes hold the other copies' operands only where those copies compute the same expression. Null where
// the sources are not of this form.
UOpRef row_op(VecCtx& c, const UOp* a, const std::vector<UOpRef>& s, int n) {
  if (n < 4 || a->op == Ops::IDIV || a->op == Ops::MOD) return {};
  int64_t j = -1;
  std::vector<std::optional<std::vector<UOpRef>>> rows(s.size());
  for (size_t k = 0; k < s.size(); k++)
    if (auto r = rows_of(s[k])) {
      if (j >= 0 && r->second != j) return {};
      j = r->second, rows[k] = std::move(r->first);
    }
  if (j < 0) return {};
  std::vector<UOpRef> same(s.size());  // a broadcast source as one row of n lanes
  for (size_t k = 0; k < s.size(); k++) {
    if (rows[k]) continue;
    if (s[k]->op != Ops::VECTORIZE || !broadcast(s[k].get())) return {};
    const UOp* x = s[k]->src(0);
    DType d = x->dtype;
    if (x->op == Ops::CONST) {
      same[k] = UOp::make(Ops::VECTORIZE, d.vec(n), std::vector<UOpRef>(size_t(n), UOpRef(x)));
    } else if (x->op == Ops::LOAD && x->nsrc() == 1 && mem_kind(d) && c.lanes(d) >= n) {
      auto b = block_of(c, x->src(0), n, d);
      if (!b || b->second != j) return {};
      same[k] = b->first;
    } else {
      return {};
    }
  }
  std::vector<UOpRef> lanes;
  for (size_t i = 0; i < size_t(n); i++) {
    std::vector<UOpRef> src;
    for (size_t k = 0; k < s.size(); k++) src.push_back(rows[k] ? (*rows[k])[i] : same[k]);
    UOpRef row = UOp::make(a->op, a->dtype.vec(n), src, a->arg);
    lanes.push_back(UOp::make(Ops::GEP, a->dtype, {row}, std::vector<int64_t>{j}));
  }
  return UOp::make(Ops::VECTORIZE, a->dtype.vec(n), lanes);
}

// The lanes v[0..n) as one vector value: a broadcast, a vector LOAD, a vector op over packed sources, or the
// scalars gathered (VECTORIZE). Recursion bounded by `depth` (deeper values are gathered).
UOpRef pack(VecCtx& c, const std::vector<const UOp*>& v, int depth = 0) {
  if (auto it = c.memo.find(v); it != c.memo.end()) return it->second;
  const UOp* a = v[0];
  DType d = a->dtype;
  int n = int(v.size());
  auto gather = [&] {
    std::vector<UOpRef> s;
    for (const UOp* x : v) s.emplace_back(x);
    return UOp::make(Ops::VECTORIZE, d.vec(n), s);
  };
  bool same = true, iso = value_kind(d) && depth < 256;
  for (const UOp* x : v) {
    same &= x == a;
    iso &= x->op == a->op && x->dtype == d && x->nsrc() == a->nsrc() && x->arg == a->arg;
    for (size_t k = 0; iso && k < a->nsrc(); k++)  // one op over sources of other dtypes (a CMPLT of indices in one
      iso &= x->src(k)->dtype == a->src(k)->dtype;  // lane, of floats in another) is not one vector op
  }
  UOpRef res;
  if (same || !iso) {
    res = gather();
  } else if (a->op == Ops::LOAD && a->nsrc() == 1 && mem_kind(d)) {
    std::vector<const UOp*> idx;
    for (const UOp* x : v) idx.push_back(x->src(0));
    if (c.consecutive(idx)) res = UOp::make(Ops::LOAD, d.vec(n), {UOpRef(a->src(0))});
    else if (UOpRef t = transposed(c, idx, n, d)) res = t;
    else res = gather();
  } else if (a->op == Ops::LOAD && a->nsrc() == 3 && mem_kind(d) && a->src(2)->dtype.count == 1 &&
             std::all_of(v.begin(), v.end(), [&](const UOp* x) { return x->src(2) == a->src(2); })) {
    // lanes under one gate (a padded input's tile row: the gate depends on the row, the lanes on the column): one
    // vector LOAD under the scalar gate, its lanes' values else packed (a branch per vector, not one per lane)
    std::vector<const UOp*> idx, alt;
    for (const UOp* x : v) idx.push_back(x->src(0)), alt.push_back(x->src(1));
    if (c.consecutive(idx) && value_kind(a->src(1)->dtype))
      res = UOp::make(Ops::LOAD, d.vec(n), {UOpRef(a->src(0)), pack(c, alt, depth + 1), UOpRef(a->src(2))});
    else res = gather();
  } else if (packable(a->op)) {
    std::vector<UOpRef> s;
    bool kinds = true;
    for (size_t k = 0; k < a->nsrc(); k++) kinds &= value_kind(a->src(k)->dtype);
    if (kinds) {
      for (size_t k = 0; k < a->nsrc(); k++) {
        std::vector<const UOp*> lane;
        for (const UOp* x : v) lane.push_back(x->src(k));
        s.push_back(pack(c, lane, depth + 1));
      }
      // a BITCAST's lanes only over a source that is vector work throughout (the decomposed exp2's scale); over
      // gathered scalars (a threefry counter's copies) the scalar chain stays, and a vector of it would only add
      // inserts
      if (!(res = row_op(c, a, s, n)))
        res = a->op == Ops::BITCAST && gathers(s[0]) ? gather() : UOp::make(a->op, d.vec(n), s, a->arg);
    } else {
      res = gather();
    }
  } else {
    res = gather();
  }
  c.memo.emplace(v, res);
  for (const UOp* x : v) c.keep.emplace_back(x);
  return res;
}

bool broadcast(const UOp* v) {
  return std::all_of(v->src().begin(), v->src().end(), [&](const UOpRef& x) { return x == v->src()[0]; });
}
// Whether a packed value does vector work: a gather of different scalars does none (their stores stay scalar).
// A VECTORIZE of lanes of vector LOADs (a transposed block, `transposed`) or of vector ops over such blocks' rows
// (`row_op`) is shuffles of whole vectors.
bool vector_work(const UOpRef& v) {
  if (v->op != Ops::VECTORIZE || broadcast(v.get())) return true;
  return std::all_of(v->src().begin(), v->src().end(), [](const UOpRef& g) {
    return g->op == Ops::GEP && g->src(0)->dtype.count > 1 && (g->src(0)->op == Ops::LOAD || packable(g->src(0)->op));
  });
}
// Whether a packed value gathers different scalars anywhere (lanes that are not one vector load or broadcast).
bool gathers(const UOpRef& v) {
  for (const UOp* u : toposort(v.get()))
    if (u->op == Ops::VECTORIZE && !broadcast(u)) return true;
  return false;
}

// The width for the stores vals[i..] at idx[i..] (consecutive offsets): the widest the renderer takes whose lanes
// are vector loads and broadcasts throughout (a matmul tile's 2 x 8 accumulators are two vectors of 8, not one
// of 16 over gathered loads), else the widest with vector work; 0: none. `cap` limits it.
std::pair<int, UOpRef> choose_width(VecCtx& c, const std::vector<const UOp*>& idx, const std::vector<const UOp*>& vals,
                                    int cap) {
  DType d = vals[0]->dtype;
  std::pair<int, UOpRef> fallback{0, {}};
  for (int n = std::min(cap, c.lanes(d)); n >= 2; n /= 2) {
    if (size_t(n) > vals.size()) continue;
    std::vector<const UOp*> ix(idx.begin(), idx.begin() + n), vs(vals.begin(), vals.begin() + n);
    bool one_type = std::all_of(vs.begin(), vs.end(), [&](const UOp* x) { return x->dtype == d; });
    if (!one_type || !c.consecutive(ix)) continue;
    UOpRef v = pack(c, vs);
    if (!vector_work(v)) continue;
    if (!gathers(v)) return {n, v};
    if (!fallback.first) fallback = {n, v};
  }
  return fallback;
}

// The STOREs among a SINK's, END's or AFTER's sources that write consecutive addresses of one buffer (the copies
// of an upcast axis) -> one vector STORE each run of a power-of-two length the renderer takes.
UOpRef do_vectorize_stores(const UOp* p, VecCtx& c) {
  struct Cand {
    int64_t off;
    size_t pos;
  };
  std::map<std::pair<const UOp*, const UOp*>, std::vector<Cand>> groups;  // (buffer, base) -> stores
  for (size_t i = 0; i < p->nsrc(); i++) {
    const UOp* st = p->src(i);
    if (st->op != Ops::STORE || st->nsrc() != 2 || !mem_kind(st->src(1)->dtype) || st->src(0)->op != Ops::INDEX) continue;
    const UOp* idx = st->src(0);
    if (idx->nsrc() != 2) continue;
    auto [base, off] = split_offset(idx->src(1));
    groups[{idx->src(0), base}].push_back({off, i});
  }
  std::vector<UOpRef> src(p->src().begin(), p->src().end());
  std::vector<bool> drop(src.size(), false);
  bool changed = false;
  for (auto& [key, cs] : groups) {
    if (cs.size() < 2) continue;
    std::sort(cs.begin(), cs.end(), [](const Cand& a, const Cand& b) { return a.off < b.off; });
    const UOp* reg = reg_of(key.first);
    int cap = c.reg_lanes.count(reg) ? c.reg_lanes[reg] : 1 << 20;
    for (size_t i = 0; i < cs.size();) {
      std::vector<const UOp*> idx, vals;
      for (size_t k = i; k < cs.size(); k++) {
        const UOp* st = p->src(cs[k].pos);
        idx.push_back(st->src(0));
        vals.push_back(st->src(1));
      }
      auto [n, v] = choose_width(c, idx, vals, cap);
      if (n) {
        src[cs[i].pos] = UOp::make(Ops::STORE, dtypes::void_, {UOpRef(idx[0]), v});
        for (size_t k = i + 1; k < i + size_t(n); k++) drop[cs[k].pos] = true;
        changed = true;
      }
      i += n ? size_t(n) : 1;
    }
  }
  if (!changed) return {};
  std::vector<UOpRef> out;
  for (size_t i = 0; i < src.size(); i++)
    if (!drop[i]) out.push_back(src[i]);
  return p->replace_src(out);
}

const PatternMatcher& pm_vectorize() {
  static const PatternMatcher pm(table(rule(op_any<opset<Ops::SINK, Ops::END, Ops::AFTER>>, [](auto& m) -> UOpRef {
    return do_vectorize_stores(m.root, m.template ctx<VecCtx>());  // STORE lanes of consecutive addresses -> one vector STORE
  })));
  return pm;
}

// ---------------------------------------------------------------- devectorize

struct DevecCtx {
  const Renderer& r;
};

UOpRef gep(const UOpRef& v, int64_t i) {
  if (v->dtype.count == 1) return v;
  return UOp::make(Ops::GEP, v->dtype.scalar_type(), {v}, std::vector<int64_t>{i});
}

// Whether the renderer takes a vector LOAD/STORE of dtype d at INDEX idx.
bool fits_memory(const Renderer& r, DType d, const UOp* idx) {
  int n = d.count;
  if (r.vector_lanes_of(d.scalar_type()) < n) return false;
  if (!r.vector_aligned()) return true;
  if (Ops b = reg_of(idx->src(0))->op; b != Ops::PARAM && b != Ops::DEFINE_REG) return false;
  auto [base, off] = split_offset(idx->src(1));
  return off % n == 0 && multiple_of(base, n);
}

UOpRef do_split_alu(const UOp* u, const Renderer& r) {
  bool vec = u->dtype.count > 1;
  for (const UOpRef& s : u->src()) vec |= s->dtype.count > 1;
  if (!vec || r.vector_alu(u)) return {};
  int n = 1;
  for (const UOpRef& s : u->src()) n = std::max<int>(n, s->dtype.count);
  n = std::max<int>(n, u->dtype.count);
  std::vector<UOpRef> lanes;
  for (int64_t i = 0; i < n; i++) {
    std::vector<UOpRef> s;
    for (const UOpRef& x : u->src()) s.push_back(gep(x, i));
    lanes.push_back(UOp::make(u->op, u->dtype.scalar_type(), s, u->arg));
  }
  return UOp::make(Ops::VECTORIZE, u->dtype, lanes);
}

UOpRef do_split_load(const UOp* u, const Renderer& r) {
  // a gated vector LOAD stays whole under a scalar gate (the renderer branches around it)
  bool scalar_gate = u->nsrc() == 1 || (u->nsrc() == 3 && u->src(2)->dtype.count == 1 && u->src(1)->dtype == u->dtype);
  if (u->dtype.count == 1 || (scalar_gate && fits_memory(r, u->dtype, u->src(0)))) return {};
  const UOp* idx = u->src(0);
  std::vector<UOpRef> lanes;
  for (int64_t i = 0; i < u->dtype.count; i++) {
    UOpRef ix = UOp::make(Ops::INDEX, idx->dtype, {UOpRef(idx->src(0)), offset_index(idx->src(1), i)});
    std::vector<UOpRef> s{ix};
    for (size_t k = 1; k < u->nsrc(); k++) s.push_back(gep(u->src()[k], i));
    lanes.push_back(UOp::make(Ops::LOAD, u->dtype.scalar_type(), s));
  }
  return UOp::make(Ops::VECTORIZE, u->dtype, lanes);
}

// Vector STOREs among p's sources that the renderer cannot take -> one scalar STORE per lane.
UOpRef do_split_stores(const UOp* p, const Renderer& r) {
  std::vector<UOpRef> out;
  bool changed = false;
  for (const UOpRef& st : p->src()) {
    if (st->op != Ops::STORE || st->src(1)->dtype.count == 1 ||
        (st->nsrc() == 2 && fits_memory(r, st->src(1)->dtype, st->src(0)))) {
      out.push_back(st);
      continue;
    }
    const UOp* idx = st->src(0);
    for (int64_t i = 0; i < st->src(1)->dtype.count; i++) {
      std::vector<UOpRef> s{UOp::make(Ops::INDEX, idx->dtype, {UOpRef(idx->src(0)), offset_index(idx->src(1), i)}),
                            gep(st->src()[1], i)};
      if (st->nsrc() == 3) s.push_back(gep(st->src()[2], i));
      out.push_back(UOp::make(Ops::STORE, dtypes::void_, s));
    }
    changed = true;
  }
  return changed ? p->replace_src(out) : UOpRef{};
}

constexpr OpSet kVectorOps = opset<Ops::ADD, Ops::SUB, Ops::MUL, Ops::FDIV, Ops::IDIV, Ops::MOD, Ops::NEG, Ops::MAX,
                                   Ops::MULACC, Ops::RECIPROCAL, Ops::SQRT, Ops::TRUNC, Ops::EXP2, Ops::LOG2, Ops::SIN,
                                   Ops::CMPLT, Ops::CMPNE, Ops::CMPEQ, Ops::WHERE, Ops::AND, Ops::OR, Ops::XOR,
                                   Ops::SHL, Ops::SHR, Ops::CAST, Ops::POW, Ops::BITCAST>;

const PatternMatcher& pm_devectorize() {
  static const PatternMatcher pm(table(
      // vector op the renderer cannot take -> VECTORIZE(op(GEP(src, i))...)
      rule(op_any<kVectorOps>, [](auto& m) -> UOpRef { return do_split_alu(m.root, m.template ctx<DevecCtx>().r); }),
      // too wide or unaligned vector LOAD -> VECTORIZE(LOAD(INDEX(buf, idx + i))...)
      rule(op_any<opset<Ops::LOAD>>, [](auto& m) -> UOpRef { return do_split_load(m.root, m.template ctx<DevecCtx>().r); }),
      // the same for STOREs, in the node that holds them
      rule(op_any<opset<Ops::SINK, Ops::END, Ops::AFTER>>,
           [](auto& m) -> UOpRef { return do_split_stores(m.root, m.template ctx<DevecCtx>().r); }),
      // GEP(VECTORIZE(x0, ..., xn), i) -> xi
      rule(op<Ops::GEP>(op_any<opset<Ops::VECTORIZE>>), [](auto& m) -> UOpRef {
        const auto& a = std::get<std::vector<int64_t>>(m.root->arg);
        if (a.size() != 1) return {};
        return UOpRef(m.root->src(0)->src(size_t(a[0])));
      }),
      // VECTORIZE(GEP(v, 0), ..., GEP(v, n-1)) -> v
      rule(op_any<opset<Ops::VECTORIZE>>, [](auto& m) -> UOpRef {
        const UOp* u = m.root;
        const UOp* v = nullptr;
        for (size_t i = 0; i < u->nsrc(); i++) {
          const UOp* g = u->src(i);
          if (g->op != Ops::GEP || (v && g->src(0) != v) || std::get<std::vector<int64_t>>(g->arg) != std::vector<int64_t>{int64_t(i)})
            return {};
          v = g->src(0);
        }
        return v && v->dtype == u->dtype ? UOpRef(v) : UOpRef{};
      })));
  return pm;
}

}  // namespace

UOpRef vectorize(const UOpRef& k, const Renderer& r, int cap32) {
  if (cap32 < 2) return k;
  VecCtx c{r, cap32, {}, {}, {}, {}};
  for (const UOp* u : toposort(k.get()))
    if (u->op == Ops::LOAD && u->nsrc() == 1 && u->dtype.count == 1 && u->src(0)->op == Ops::INDEX &&
        u->src(0)->nsrc() == 2 && u->src(0)->src(0)->op == Ops::PARAM) {
      auto [base, off] = split_offset(u->src(0)->src(1));
      c.loaded.emplace(u->src(0)->src(0), base, off);
    }
  // Accumulator arrays first: the width of their updates in the loop (an END's stores of a value that reads the
  // array), so that their initial stores and final reads use the same vectors (SROA keeps them in registers).
  {
    VecCtx pre{r, cap32, {}, {}, {}, {}};
    for (const UOp* e : toposort(k.get())) {
      if (e->op != Ops::END) continue;
      std::map<std::pair<const UOp*, const UOp*>, std::vector<std::pair<int64_t, const UOp*>>> groups;
      for (const UOpRef& st : e->src()) {
        if (st->op != Ops::STORE || st->nsrc() != 2 || st->src(0)->op != Ops::INDEX || st->src(0)->nsrc() != 2 ||
            !mem_kind(st->src(1)->dtype) || reg_of(st->src(0)->src(0))->op != Ops::DEFINE_REG)
          continue;
        auto [base, off] = split_offset(st->src(0)->src(1));
        groups[{st->src(0)->src(0), base}].emplace_back(off, st.get());
      }
      for (auto& [key, g] : groups) {
        std::sort(g.begin(), g.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        std::vector<const UOp*> idx, vals;
        for (auto& [off, st] : g) idx.push_back(st->src(0)), vals.push_back(st->src(1));
        int n = choose_width(pre, idx, vals, 1 << 20).first;
        const UOp* reg = reg_of(key.first);
        c.reg_lanes[reg] = c.reg_lanes.count(reg) ? std::min(c.reg_lanes[reg], std::max(n, 1)) : std::max(n, 1);
      }
    }
  }
  return graph_rewrite(k, pm_vectorize(), &c, false, "vectorize");
}

UOpRef mark_nontemporal_stores(const UOpRef& k) {
  std::vector<const UOp*> topo = toposort(k.get());
  std::set<const UOp*> read;  // buffers the kernel loads
  for (const UOp* u : topo)
    if (u->op == Ops::LOAD && u->src(0)->op == Ops::INDEX) read.insert(reg_of(u->src(0)->src(0)));
  // The vector stores of each (buffer, base index): full vectors, aligned to their width.
  std::map<std::pair<const UOp*, const UOp*>, std::vector<const UOp*>> groups;
  for (const UOp* u : topo) {
    if (u->op != Ops::STORE || u->nsrc() != 2 || u->src(0)->op != Ops::INDEX || u->src(0)->nsrc() != 2) continue;
    const UOp* buf = u->src(0)->src(0);
    int64_t n = u->src(1)->dtype.count;
    if (buf->op != Ops::PARAM || read.count(buf) || n < 2 || (n & (n - 1)) != 0 || !mem_kind(u->src(1)->dtype.scalar_type())) continue;
    auto [base, off] = split_offset(u->src(0)->src(1));
    if (!base || off % n != 0 || !multiple_of(base, n)) continue;
    groups[{buf, base}].push_back(u);
  }
  // Contiguous: one step of some loop moves the base by exactly the lanes the group's stores cover, and they cover
  // them without a gap (each iteration writes the next whole block: its lines are written in full).
  std::vector<std::pair<const UOp*, UOpRef>> map;
  for (auto& [key, sts] : groups) {
    std::vector<std::pair<int64_t, int64_t>> spans;  // (offset, lanes)
    for (const UOp* st : sts) spans.emplace_back(split_offset(st->src(0)->src(1)).second, st->src(1)->dtype.count);
    std::sort(spans.begin(), spans.end());
    int64_t covered = 0;
    bool dense = true;
    for (auto [off, n] : spans) dense &= off == spans[0].first + covered, covered += n;
    bool steps = false;
    for (const UOp* u : topo)
      if (u->op == Ops::RANGE) steps |= index_coef(key.second, u) == std::optional<int64_t>(covered);
    // Or the group's stores write whole cache lines, each line all at once (a transpose tile's columns: a line
    // of each output row, 4096 floats apart): no line is left partly written for the write-combining buffers.
    // A 4096^2 .T (Zen 5, 2 threads, best of 25 calls, three alternated pairs, quiet): 4.9-5.5 ms with cached
    // stores, 2.8-4.0 non-temporal.
    const int64_t item = sts[0]->src(1)->dtype.scalar_type().itemsize(), line = kCacheLineBytes / std::max<int64_t>(item, 1);
    bool lines = item > 0 && kCacheLineBytes % item == 0 && multiple_of(key.second, line);
    for (size_t i = 0; lines && i < spans.size();) {  // each line from its first element to its end, no gap
      const int64_t start = spans[i].first;
      int64_t at = start;
      while (i < spans.size() && spans[i].first == at && (at == start || at % line != 0)) at += spans[i].second, i++;
      lines = start % line == 0 && at % line == 0;
    }
    if (!(dense && steps) && !lines) continue;
    for (const UOp* st : sts)
      map.emplace_back(st, UOp::make(Ops::STORE, st->dtype, {UOpRef(st->src(0)), UOpRef(st->src(1))}, int64_t(1)));
  }
  return map.empty() ? k : substitute(k, map);
}

UOpRef devectorize(const UOpRef& k, const Renderer& r) {
  DevecCtx c{r};
  return graph_rewrite(k, pm_devectorize(), &c, false, "devectorize");
}

}  // namespace tg
