// The scheduler: decide what materialises, then build one kernel AST per materialised node by
// "rangeify": the output's dimensions become RANGEs and every movement op between the output and the
// buffers it reads becomes index arithmetic on them. Elementwise ops and reductions fuse into the kernel.
#include "tg/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <functional>
#include <list>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "tg/env.hpp"
#include "tg/opt.hpp"
#include "tg/pattern.hpp"
#include "tg/symbolic.hpp"
#include "tg/tensor.hpp"
#include "tg/variable.hpp"
#include "tg/viz.hpp"

namespace tg {

const UOp* contiguous_buffer(const UOp* u) {
  if (u->op == Ops::BUFFER) return u;
  if (u->op == Ops::RESHAPE && u->src(0)->op == Ops::BUFFER) return u->src(0);
  return nullptr;
}

namespace {

using ShapeMap = std::unordered_map<const UOp*, Shape>;

UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }
UOpRef add(const UOpRef& a, const UOpRef& b) { return a->alu(Ops::ADD, b); }
UOpRef mul(const UOpRef& a, int64_t c) { return c == 1 ? a : a->alu(Ops::MUL, ci(c)); }
UOpRef land(const UOpRef& a, const UOpRef& b) { return !a ? b : !b ? a : a->alu(Ops::AND, b); }

// The extent of dim i of node n: its symbolic expression (a DEFINE_VAR expression in a normalised graph) or the int.
UOpRef extent(const UOp* n, const Shape& s, size_t i) {
  if (const auto* sym = n->sym()) return (*sym)[i];
  return ci(s[i]);
}
bool is_one(const UOpRef& e) { return e->is_const() && e->const_int() == 1; }

struct Access {
  std::vector<UOpRef> idx;
  UOpRef valid;  // null: always valid
};

// An index simplified given its load's valid (tinygrad's uop_given_valid): a clause `c < x` or `x < c` bounds x
// wherever the load reads, so x is replaced by a variable with those bounds, the index simplified, and x put back.
// A padded tensor read through a reshape, (y-1)*320 + (x-1) decoded by // and %, loses its divisions and modulos
// once y-1 and x-1 are known to lie in [0, 320). Lanes where the valid is false read nothing (a gated load).
// SIMPLIFY_VALID=0 turns it off (to compare kernels).
bool simplify_valid_on() { return getenv_int("SIMPLIFY_VALID", 1) != 0; }
UOpRef simplify_given_valid(const UOpRef& idx, const UOpRef& valid) {
  std::vector<const UOp*> clauses, st{valid.get()};
  while (!st.empty()) {
    const UOp* c = st.back();
    st.pop_back();
    if (c->op == Ops::AND && c->dtype == dtypes::bool_) st.insert(st.end(), {c->src(0), c->src(1)});
    else clauses.push_back(c);
  }
  std::vector<std::pair<const UOp*, std::pair<int64_t, int64_t>>> bounds;  // x -> [lo, hi] where valid
  auto tighten = [&](const UOp* x, int64_t lo, int64_t hi) {
    if (!x->bounds().known || x->dtype != dtypes::index) return;
    for (auto& [y, b] : bounds)
      if (y == x) return void((b.first = std::max(b.first, lo), b.second = std::min(b.second, hi)));
    bounds.push_back({x, {std::max(x->vmin(), lo), std::min(x->vmax(), hi)}});
  };
  for (const UOp* c : clauses) {
    if (c->op != Ops::CMPLT) continue;
    if (c->src(1)->is_const()) tighten(c->src(0), INT64_MIN, c->src(1)->const_int() - 1);  // x < c
    else if (c->src(0)->is_const()) tighten(c->src(1), c->src(0)->const_int() + 1, INT64_MAX);  // c < x
  }
  std::vector<std::pair<const UOp*, UOpRef>> to_var, back;
  for (auto& [x, b] : bounds) {
    if (b.first > b.second || (b.first == x->vmin() && b.second == x->vmax())) continue;  // empty or no news
    UOpRef v = UOp::variable("valid_" + std::to_string(to_var.size()), b.first, b.second);
    to_var.push_back({x, v});
    back.push_back({v.get(), UOpRef(x)});
  }
  if (to_var.empty()) return idx;
  return substitute(graph_rewrite(substitute(idx, to_var), symbolic(), nullptr, false, "simplify given valid"), back);
}

// A memo key: the node and its access. The key owns the access's index nodes: identity is by address, and a node
// freed while its key is still in the memo could be replaced by another at the same address (an index that a load
// simplified under its valid no longer holds its parts; such a reuse gave one load another load's value).
struct AccessKey {
  const UOp* node;
  std::vector<UOpRef> parts;
  bool operator==(const AccessKey& o) const {
    if (node != o.node || parts.size() != o.parts.size()) return false;
    for (size_t i = 0; i < parts.size(); i++)
      if (parts[i].get() != o.parts[i].get()) return false;
    return true;
  }
};
struct AccessKeyHash {
  size_t operator()(const AccessKey& k) const {
    size_t h = std::hash<const void*>()(k.node);
    for (auto& p : k.parts) h = h * 1000003u ^ std::hash<const void*>()(p.get());
    return h;
  }
};

/** Builds the AST of one kernel. */
struct KernelBuilder {
  const ShapeMap& shapes;
  const std::unordered_set<const UOp*>& realized;
  const UOp* root;
  const std::unordered_set<const UOp*>& row_fused;  // EXPANDs of reduces that may stay in the kernel (see below)
  std::vector<const UOp*> params;  // realised nodes read (param i+1) ; param 0 is the output
  std::vector<const UOp*> not_hoisted;  // row_fused EXPANDs whose value would be recomputed in this kernel
  int next_range = 0;
  std::unordered_map<AccessKey, UOpRef, AccessKeyHash> memo;

  int param_of(const UOp* m) {
    for (size_t i = 0; i < params.size(); i++)
      if (params[i] == m) return int(i) + 1;
    params.push_back(m);
    return int(params.size());
  }

  static AccessKey key(const UOp* n, const Access& a) {
    AccessKey k{n, {}};
    for (auto& i : a.idx) k.parts.push_back(i);
    k.parts.push_back(a.valid);
    return k;
  }

  bool is_source(const UOp* n) const { return n != root && (n->op == Ops::BUFFER || realized.count(n)); }

  UOpRef linear(const Shape& s, const Access& a) {
    UOpRef lin = ci(0);
    int64_t stride = 1;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] != 1) lin = add(mul(a.idx[i], stride), lin);
      stride *= s[i];
    }
    return lin;
  }

  UOpRef load(const UOp* n, const Access& a) {
    const UOp* buf = n->op == Ops::BUFFER ? n : n;
    int p = param_of(buf);
    UOpRef param = UOp::make(Ops::PARAM, n->dtype.ptr_to(), {}, int64_t(p));
    UOpRef lin = linear(shapes.at(n), a);
    if (a.valid && simplify_valid_on()) lin = simplify_given_valid(lin, a.valid);
    UOpRef idx = UOp::make(Ops::INDEX, param->dtype, {param, lin});
    if (a.valid) return UOp::make(Ops::LOAD, n->dtype, {idx, UOp::cnst(n->dtype, 0), a.valid});
    return UOp::make(Ops::LOAD, n->dtype, {idx});
  }

  // The access of the source of movement op n, given the access of n.
  Access child_access(const UOp* n, const Access& a) {
    const Shape& out = shapes.at(n);
    const Shape& in = shapes.at(n->src(0));
    Access c;
    c.valid = a.valid;
    auto vec = [&]() -> const std::vector<int64_t>& { return std::get<std::vector<int64_t>>(n->arg); };
    switch (n->op) {
      case Ops::RESHAPE: {
        UOpRef lin = linear(out, a);
        int64_t stride = 1;
        c.idx.resize(in.size());
        for (size_t i = in.size(); i-- > 0;) {
          c.idx[i] = in[i] == 1 ? ci(0) : lin->alu(Ops::IDIV, ci(stride))->alu(Ops::MOD, ci(in[i]));
          stride *= in[i];
        }
        break;
      }
      case Ops::PERMUTE:
        c.idx.resize(in.size());
        for (size_t i = 0; i < vec().size(); i++) c.idx[size_t(vec()[i])] = a.idx[i];
        break;
      case Ops::EXPAND:
        for (size_t i = 0; i < in.size(); i++) c.idx.push_back(in[i] == 1 && out[i] != 1 ? ci(0) : a.idx[i]);
        break;
      case Ops::PAD: {
        UOpRef pv;
        if (n->nsrc() > 1) {  // symbolic amounts: valid where b <= idx < b + extent of the input
          for (size_t i = 0; i < in.size(); i++) {
            const UOpRef& b = n->src()[1 + 2 * i];
            UOpRef ext = extent(n->src(0), in, i);
            bool zero = b->is_const() && b->const_int() == 0;
            c.idx.push_back(zero ? a.idx[i] : a.idx[i]->alu(Ops::SUB, b));
            if (!zero) pv = land(pv, b->alu(Ops::ADD, ci(-1))->alu(Ops::CMPLT, a.idx[i]));
            pv = land(pv, a.idx[i]->alu(Ops::CMPLT, zero ? ext : b->alu(Ops::ADD, ext)));
          }
          c.valid = land(a.valid, pv);
          break;
        }
        for (size_t i = 0; i < in.size(); i++) {
          int64_t b = vec()[2 * i], e = vec()[2 * i + 1];
          UOpRef ext = extent(n->src(0), in, i);
          c.idx.push_back(b ? a.idx[i]->alu(Ops::ADD, ci(-b)) : a.idx[i]);
          if (b > 0) pv = land(pv, ci(b - 1)->alu(Ops::CMPLT, a.idx[i]));
          UOpRef hi = ext->is_const() ? ci(b + ext->const_int()) : b ? ext->alu(Ops::ADD, ci(b)) : ext;
          if (e > 0 || !ext->is_const()) pv = land(pv, a.idx[i]->alu(Ops::CMPLT, hi));
        }
        c.valid = land(a.valid, pv);
        break;
      }
      case Ops::SHRINK:
        for (size_t i = 0; i < in.size(); i++) {
          if (n->nsrc() > 1) {  // symbolic bounds: the begin is an index source
            const UOpRef& b = n->src()[1 + 2 * i];
            c.idx.push_back(b->is_const() && b->const_int() == 0 ? a.idx[i] : add(a.idx[i], b));
          } else {
            c.idx.push_back(vec()[2 * i] ? add(a.idx[i], ci(vec()[2 * i])) : a.idx[i]);
          }
        }
        break;
      case Ops::FLIP:
        for (size_t i = 0; i < in.size(); i++)
          c.idx.push_back(!vec()[i] ? a.idx[i]
                          : n->src(0)->sym() ? extent(n->src(0), in, i)->alu(Ops::ADD, ci(-1))->alu(Ops::SUB, a.idx[i])
                                             : ci(in[i] - 1)->alu(Ops::SUB, a.idx[i]));
        break;
      default: throw Error(std::string("[schedule] not a movement op: ") + op_name(n->op));
    }
    return c;
  }

  // Whether a value read at access `a` is computed once per value it depends on: `a` uses only output loops, and
  // they are the outermost ones (the loop nest runs them outside the others, so the code that computes it is
  // hoisted out of the inner output loops and of every reduce loop).
  bool hoisted(const Access& a) const {
    const Shape& s = shapes.at(root);
    std::vector<bool> used(s.size(), false);
    std::vector<UOpRef> exprs(a.idx.begin(), a.idx.end());
    if (a.valid) exprs.push_back(a.valid);
    for (const UOp* n : toposort(exprs))
      if (n->op == Ops::RANGE) {
        if (range_type(n) != AxisType::Loop) return false;
        used[size_t(range_id(n))] = true;
      }
    bool gap = false;
    for (size_t i = 0; i < s.size(); i++) {
      if (s[i] == 1) continue;
      if (!used[i]) gap = true;
      else if (gap) return false;
    }
    return true;
  }

  // Iterative post-order over (node, access) pairs.
  UOpRef build(const UOp* start, const Access& start_access) {
    struct Frame {
      const UOp* n;
      Access a;
      std::vector<Access> child;  // accesses of the sources (same order as srcs evaluated)
      std::vector<UOpRef> ranges;  // reduce ranges
      UOpRef pad_valid;
      bool expanded = false;
    };
    std::vector<Frame> stack;
    stack.push_back({start, start_access, {}, {}, {}, false});
    while (!stack.empty()) {
      Frame& f = stack.back();
      const UOp* n = f.n;
      AccessKey k = key(n, f.a);
      if (memo.count(k)) {
        stack.pop_back();
        continue;
      }
      // Leaves.
      if (is_source(n)) {
        memo[k] = load(n, f.a);
        stack.pop_back();
        continue;
      }
      if (n->op == Ops::RANGE) {  // an arange: the index of its one dim
        const UOpRef& i = f.a.idx[0];
        memo[k] = i->dtype == n->dtype ? i : i->cast(n->dtype);
        stack.pop_back();
        continue;
      }
      if (n->op == Ops::CONST || n->op == Ops::DEFINE_VAR) {
        memo[k] = n->op == Ops::CONST ? UOp::make(Ops::CONST, n->dtype, {}, n->arg) : n->ref();
        stack.pop_back();
        continue;
      }
      // Which sources, with which accesses.
      std::vector<const UOp*> srcs;
      if (!f.expanded) {
        f.expanded = true;
        if (is_movement(n->op)) {
          f.child.push_back(child_access(n, f.a));
          if (n->op == Ops::PAD) f.pad_valid = f.child[0].valid;
          if (n->op == Ops::EXPAND && row_fused.count(n) && !hoisted(f.child[0])) not_hoisted.push_back(n);
        } else if (n->op == Ops::REDUCE_AXIS) {
          const Shape& in = shapes.at(n->src(0));
          Access c;
          c.valid = f.a.valid;
          auto& axes = std::get<ReduceArg>(n->arg).axes;
          for (size_t i = 0; i < in.size(); i++) {
            if (std::find(axes.begin(), axes.end(), int64_t(i)) != axes.end()) {
              UOpRef ext = extent(n->src(0), in, i);
              if (is_one(ext)) {
                c.idx.push_back(ci(0));
              } else {
                UOpRef r = UOp::range(ext, 1000 + next_range++, AxisType::Reduce);
                f.ranges.push_back(r);
                c.idx.push_back(r);
              }
            } else {
              c.idx.push_back(f.a.idx[i]);
            }
          }
          f.child.push_back(std::move(c));
        } else if (n->op == Ops::ASSIGN) {
          f.child.push_back(f.a);  // the value (source 1)
        } else {
          for (size_t i = 0; i < n->nsrc(); i++) f.child.push_back(f.a);
        }
      }
      auto src_of = [&](size_t i) -> const UOp* { return n->op == Ops::ASSIGN ? n->src(1) : n->src(i); };
      std::vector<Frame> pending;  // pushing invalidates f: collect first
      for (size_t i = 0; i < f.child.size(); i++)
        if (!memo.count(key(src_of(i), f.child[i]))) pending.push_back(Frame{src_of(i), f.child[i], {}, {}, {}, false});
      if (!pending.empty()) {
        for (auto& p : pending) stack.push_back(std::move(p));
        continue;
      }
      Frame& g = stack.back();
      std::vector<UOpRef> vals;
      for (size_t i = 0; i < g.child.size(); i++) vals.push_back(memo.at(key(g.n == nullptr ? nullptr : src_of(i), g.child[i])));
      UOpRef v;
      if (is_movement(g.n->op)) {
        v = vals[0];
        if (g.n->op == Ops::PAD && g.pad_valid && g.pad_valid != g.a.valid)
          v = g.pad_valid->alu(Ops::WHERE, v, UOp::cnst(v->dtype, 0));
      } else if (g.n->op == Ops::REDUCE_AXIS) {
        if (g.ranges.empty()) {
          v = vals[0];
        } else {
          std::vector<UOpRef> s{vals[0]};
          s.insert(s.end(), g.ranges.begin(), g.ranges.end());
          v = UOp::make(Ops::REDUCE, g.n->dtype, s, int64_t(std::get<ReduceArg>(g.n->arg).op));
        }
      } else if (g.n->op == Ops::CONTIGUOUS || g.n->op == Ops::DETACH || g.n->op == Ops::ASSIGN) {
        v = vals[0];
      } else if (is_alu(g.n->op) || g.n->op == Ops::CAST || g.n->op == Ops::BITCAST) {
        v = UOp::make(g.n->op, g.n->dtype, vals);
      } else {
        throw Error(std::string("[schedule] cannot put ") + op_name(g.n->op) + " in a kernel");
      }
      memo[key(g.n, g.a)] = v;
      stack.pop_back();
    }
    return memo.at(key(start, start_access));
  }

  UOpRef kernel_ast() {
    const Shape& s = shapes.at(root);
    Access out;
    for (size_t i = 0; i < s.size(); i++) {
      UOpRef ext = extent(root, s, i);  // a symbolic dim loops to its variable's value
      out.idx.push_back(is_one(ext) ? ci(0) : UOp::range(ext, int64_t(i), AxisType::Loop));
    }
    UOpRef value = build(root, out);
    UOpRef param = UOp::make(Ops::PARAM, root->dtype.ptr_to(), {}, int64_t(0));
    UOpRef st = UOp::make(Ops::STORE, dtypes::void_, {UOp::make(Ops::INDEX, param->dtype, {param, linear(s, out)}), value});
    return UOp::make(Ops::SINK, dtypes::void_, {st});
  }
};

// ---------------------------------------------------------------- kernel AST rules

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

UOpRef kernel_ast_rules(const UOpRef& ast) {
  bool has = false;  // only kernels with a one-hot compare inside a reduce
  for (const UOp* u : toposort(ast.get())) has |= u->op == Ops::CMPEQ;
  if (!has) return ast;
  KernelAstCtx ctx;
  UOpRef k = graph_rewrite(ast, pm_kernel_ast(), &ctx, false, "kernel ast");
  return ctx.folded ? k : ast;  // a kernel with nothing to fold keeps its AST (and its cache keys) as built
}

// ---------------------------------------------------------------- buffers

std::mutex g_buf_mu;
std::unordered_map<int64_t, std::shared_ptr<Buffer>> g_buffers;
std::atomic<int64_t> g_next_buffer{1};

void on_buffer_free(const UOp* u) {
  int64_t id = std::get<std::vector<int64_t>>(u->arg)[0];
  std::shared_ptr<Buffer> b;
  std::lock_guard lk(g_buf_mu);
  if (auto it = g_buffers.find(id); it != g_buffers.end()) {
    b = std::move(it->second);
    g_buffers.erase(it);
  }
}

}  // namespace

UOpRef new_buffer_uop(const std::string& device, DType dtype, size_t size) {
  return buffer_uop(std::make_shared<Buffer>(device, dtype, size));
}

UOpRef buffer_uop(std::shared_ptr<Buffer> b) {
  static bool hooked = (set_buffer_free_hook(&on_buffer_free), true);
  (void)hooked;
  int64_t id = g_next_buffer++;
  std::string device = b->device();
  DType dtype = b->dtype();
  size_t size = b->size();
  {
    std::lock_guard lk(g_buf_mu);
    g_buffers[id] = b;
  }
  UOpRef dev = UOp::make(Ops::DEVICE, dtypes::void_, {}, device);
  return UOp::make(Ops::BUFFER, dtype, {dev}, std::vector<int64_t>{id, int64_t(size)});
}

std::shared_ptr<Buffer> buffer_of(const UOp* u) {
  if (!u || u->op != Ops::BUFFER) return nullptr;
  std::lock_guard lk(g_buf_mu);
  auto it = g_buffers.find(std::get<std::vector<int64_t>>(u->arg)[0]);
  return it == g_buffers.end() ? nullptr : it->second;
}

// ---------------------------------------------------------------- the schedule

namespace {

/** Where a kernel's buffer comes from: an input BUFFER of the graph (by order of appearance) or a new one. */
struct Slot {
  int input = -1;  // >= 0: the input-th BUFFER of the graph
  std::string device;
  DType dtype;
  int64_t size = 0;
};

// Work of the kernel-local computation under `v`: ALU ops plus buffer reads (stops at realised nodes); 0 when
// it reads no buffer (an arange or a constant costs nothing to recompute).
int recompute_cost(const UOp* v, const std::unordered_set<const UOp*>& realized) {
  std::vector<const UOp*> st{v};
  std::unordered_set<const UOp*> seen;
  int alu = 0, reads = 0;
  while (!st.empty()) {
    const UOp* n = st.back();
    st.pop_back();
    if (!seen.insert(n).second) continue;
    if (n->op == Ops::BUFFER || (n != v && realized.count(n))) {
      reads++;
      continue;
    }
    if (is_alu(n->op) || n->op == Ops::CAST) alu++;
    for (auto& s : n->src()) st.push_back(s.get());
  }
  return reads ? alu + reads : 0;
}

/** A schedule with buffers as slots: built once per graph structure, instantiated for each realize. */
struct Template {
  struct Item {
    ScheduleItem::Kind kind;
    UOpRef ast;
    std::vector<int> slots;  // outputs first
    std::string device;
    std::vector<int> old_reads;  // positions in slots read through their BUFFER node: the contents before this schedule
  };
  std::vector<Slot> slots;
  std::vector<Item> items;
  std::vector<std::pair<size_t, int>> becomes;  // root index -> slot
  std::vector<Shape> root_shapes;
};

std::string device_of(const UOp* u) {
  auto dev = [](const UOp* n) { return std::get<std::string>(n->op == Ops::BUFFER ? n->src(0)->arg : n->src(1)->arg); };
  const UOp* v = u;
  while (v->nsrc() && v->op != Ops::BUFFER && v->op != Ops::COPY) v = v->src(0);
  if (v->op == Ops::BUFFER || v->op == Ops::COPY) return dev(v);
  // the first source chain ends at a leaf without a device (a CONST, an arange's RANGE): any buffer below decides
  // (nearest the root first: a buffer under a COPY belongs to the copy's source device)
  std::vector<const UOp*> order = toposort(u);
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (((*it)->op == Ops::BUFFER || (*it)->op == Ops::COPY) && *it != u) return dev(*it);
  return default_device();
}

// Whether a value is decoded from stored bytes within its own expression: a BITCAST below it before any
// materialised node or reduce (a GGUF block's f16 scale read from the weight's bytes).
bool decoded_from_bytes(const UOp* v, const std::unordered_set<const UOp*>& realized) {
  std::vector<const UOp*> st{v};
  std::unordered_set<const UOp*> seen{v};
  while (!st.empty()) {
    const UOp* u = st.back();
    st.pop_back();
    if (u->op == Ops::BITCAST) return true;
    if ((u != v && realized.count(u)) || u->op == Ops::REDUCE_AXIS) continue;
    for (auto& x : u->src())
      if (seen.insert(x.get()).second) st.push_back(x.get());
  }
  return false;
}

std::atomic<size_t> g_schedules_built{0};

// Split reduce: a reduce whose input is many times its output (a convolution's weight gradient, a batch
// statistic, a full sum) runs as two kernels: partial reduces over chunks of its outermost reduce axis, the chunk
// index the outermost output axis (so the chunks spread over threads, and each chunk's inputs stay in cache while
// every output is accumulated from them), then a reduce over the chunks. As tinygrad's split_reduceop, which puts
// the chunk index innermost for GPUs. SPLIT_REDUCEOP=0 turns it off; REDUCEOP_SPLIT_THRESHOLD is the input/output
// ratio from which it applies.
std::vector<UOpRef> split_reduces(std::span<const UOpRef> roots) {
  std::vector<UOpRef> out(roots.begin(), roots.end());
  if (!getenv_int("SPLIT_REDUCEOP", 1)) return out;
  double threshold = double(getenv_int("REDUCEOP_SPLIT_THRESHOLD", 16384));
  std::vector<const UOp*> topo = toposort(roots);
  std::unordered_map<const UOp*, UOpRef> memo;
  std::unordered_map<const UOp*, Shape> shapes;
  bool any = false;
  for (const UOp* u : topo) {
    std::vector<UOpRef> src;
    std::vector<const Shape*> in;
    bool changed = false;
    for (auto& x : u->src()) {
      src.push_back(memo.at(x.get()));
      changed |= src.back().get() != x.get();
      in.push_back(&shapes.at(x.get()));
    }
    shapes[u] = infer_shape(u->op, in, u->arg, u->dtype);
    UOpRef v = changed ? u->replace_src(src) : UOpRef(u);
    if (u->op == Ops::REDUCE_AXIS) {
      const Shape& xs = *in[0];
      const auto& ra = std::get<ReduceArg>(u->arg);
      double in_n = 1, out_n = 1;
      for (int64_t d : xs) in_n *= double(d);
      for (int64_t d : shapes[u]) out_n *= double(d);
      int64_t dmax = int64_t(std::min(256.0, double(1 << 22) / std::max(out_n, 1.0)));
      std::vector<int64_t> axes = ra.axes;
      std::sort(axes.begin(), axes.end());
      bool sym_axis = false;  // a symbolic reduce axis is not split (its size is not known here)
      if (const auto* sy = u->src(0)->sym())
        for (int64_t a : axes) sym_axis |= !(*sy)[size_t(a)]->is_const();
      if (!sym_axis && out_n >= 1 && in_n / out_n >= threshold && !axes.empty()) {
        for (int64_t a : axes) {
          int64_t n = xs[size_t(a)], d = dmax;
          while (d >= 8 && n % d) d--;
          if (d < 8) continue;
          // (.., n, ..) -> (.., d, n/d, ..) -> (d, .., n/d, ..): reduce the original axes (shifted by one), then d
          Shape s1(xs.begin(), xs.begin() + a);
          s1.push_back(d);
          s1.push_back(n / d);
          s1.insert(s1.end(), xs.begin() + a + 1, xs.end());
          std::vector<int64_t> perm{a};
          for (int64_t i = 0; i < int64_t(s1.size()); i++)
            if (i != a) perm.push_back(i);
          UOpRef x = UOp::make(Ops::RESHAPE, u->dtype, {v->src()[0]}, std::vector<int64_t>(s1));
          x = UOp::make(Ops::PERMUTE, u->dtype, {x}, perm);
          std::vector<int64_t> ax1;
          for (int64_t j : axes) ax1.push_back(j + 1);
          UOpRef r1 = UOp::make(Ops::REDUCE_AXIS, u->dtype, {x}, ReduceArg{ra.op, ax1});
          UOpRef r2 = UOp::make(Ops::REDUCE_AXIS, u->dtype, {UOp::make(Ops::CONTIGUOUS, u->dtype, {r1})},
                                ReduceArg{ra.op, {0}});
          v = UOp::make(Ops::RESHAPE, u->dtype, {r2}, std::vector<int64_t>(shapes[u]));
          if (debug_level() >= 3)
            std::fprintf(stderr, "split reduce %s by %lld on axis %lld\n", shape_str(xs).c_str(), (long long)d, (long long)a);
          any = true;
          break;
        }
      }
    }
    memo[u] = v;
  }
  if (!any) return out;
  for (auto& r : out) r = memo.at(r.get());
  return out;
}

Template build_template(std::span<const UOpRef> roots_in) {
  g_schedules_built++;
  std::vector<UOpRef> split_roots = split_reduces(roots_in);
  std::span<const UOpRef> roots(split_roots);
  std::vector<const UOp*> topo = toposort(roots);
  ShapeMap shapes;
  std::unordered_map<const UOp*, int> consumers;
  for (const UOp* u : topo) {
    std::vector<const Shape*> in;
    for (auto& s : u->src()) {
      in.push_back(&shapes.at(s.get()));
      consumers[s.get()]++;
    }
    shapes[u] = infer_shape(u->op, in, u->arg, u->dtype);
  }
  // Row fusion: on devices whose output loops run in order (the CPU), a reduce broadcast back over the axes it
  // reduced (softmax's max and sum, layernorm's mean and variance) stays in the kernel of its consumer when those
  // axes are its innermost output loops: the reduce runs once per row, before the row's output loop, and the
  // row's second and third passes read it from cache. Kernels where the broadcast value would be recomputed (the
  // axes are not the inner ones after the movement ops above) are found when the kernels are built, and those
  // EXPANDs materialise as before. FUSE_REDUCE_ROWS=0 turns it off.
  const bool fuse_rows = getenv_int("FUSE_REDUCE_ROWS", 1) != 0;
  std::unordered_map<std::string, bool> serial;
  auto row_fusable = [&](const UOp* u) {
    const Shape& in = shapes.at(u->src(0));
    const Shape& out = shapes.at(u);
    double copies = 1;
    for (size_t i = 0; i < in.size(); i++)
      if (in[i] == 1) copies *= double(out[i]);
    if (copies > double(1 << 15)) return false;  // a row re-read from cache: at most 128 KiB of floats
    std::string dev = device_of(u);
    if (!serial.count(dev)) serial[dev] = get_device(dev).renderer().grid_limits().threads == 0;
    return serial[dev];
  };
  std::unordered_set<const UOp*> no_row_fuse;  // EXPANDs a kernel would recompute
  for (;;) {
    std::unordered_set<const UOp*> realized, row_fused;
    for (auto& r : roots)
      if (!contiguous_buffer(r.get())) realized.insert(r.get());
    // Materialisation rules.
    std::unordered_map<const UOp*, bool> has_reduce;  // an unrealised reduce lies below (within the kernel)
    for (const UOp* u : topo) {
      if (u->op == Ops::CONTIGUOUS || u->op == Ops::COPY || u->op == Ops::ASSIGN) realized.insert(u);
      if (u->op == Ops::REDUCE_AXIS && consumers[u] > 1) realized.insert(u);
      bool hr = u->op == Ops::REDUCE_AXIS && !realized.count(u);
      bool inner = false;  // an unrealised reduce below
      for (auto& s : u->src())
        if (!realized.count(s.get()) && has_reduce[s.get()]) hr = inner = true;
      // A reduce over a reduce's results (a max pool over a convolution): the inner one is computed into a buffer.
      // Nested inside the outer reduce's loops it gets no register tile or vectors of its own (a pool over an eval
      // mode conv ran 20x slower fused).
      const bool row = fuse_rows && u->op == Ops::EXPAND && hr && !no_row_fuse.count(u) && row_fusable(u);
      if (row) {
        row_fused.insert(u);
        hr = false;  // computed once per row: no recompute for the rules below
      } else if ((u->op == Ops::EXPAND && hr) || (u->op == Ops::REDUCE_AXIS && inner)) {
        // an expanded reduce would be recomputed for every output element: materialise the reduces below
        std::vector<const UOp*> st{u->src(0)};
        std::unordered_set<const UOp*> seen;
        while (!st.empty()) {
          const UOp* v = st.back();
          st.pop_back();
          if (!seen.insert(v).second || v->op == Ops::BUFFER || (realized.count(v) && v != u->src(0))) continue;
          if (v->op == Ops::REDUCE_AXIS) {
            realized.insert(v);
            continue;
          }
          for (auto& s : v->src()) st.push_back(s.get());
        }
        hr = u->op == Ops::REDUCE_AXIS && !realized.count(u);  // the outer reduce itself stays
      }
      if (u->op == Ops::EXPAND && !row) {
        // Fusion cost: computation under a broadcast runs again for every copy. When the copies' work (ALU ops
        // and reads, times the copies) clearly exceeds a write and a read of the value, it is computed once into
        // a buffer instead (e.g. relu(conv + bias) feeding the next conv, or a normalisation feeding a reduce).
        // One op on a reduce's result (softmax's reciprocal of the sum) stays fused.
        const UOp* v = u->src(0);
        while (is_movement(v->op) && !realized.count(v)) v = v->src(0);
        double in_n = 1, out_n = 1;
        for (int64_t d : shapes.at(u->src(0))) in_n *= double(d);
        for (int64_t d : shapes.at(u)) out_n *= double(d);
        double copies = out_n / std::max(in_n, 1.0);
        // Float values decoded from stored bytes (a BITCAST below: a quantised block's f16 scale) and copied along
        // the innermost dims ((..., n, 1) -> (..., n, 32)) are consecutive elements: the matmul's reduce over them
        // runs them in an inner loop (split ranges) or in the lanes of one vector, where the value is computed once;
        // those copies do not count (quantised weights' scales stay fused). Other broadcasts keep their cost: a
        // batch norm's per-channel scale over H x W recomputed per element made beautiful_mnist's step 25% slower.
        // Integer values (indices) still materialise: the one-hot fold reads them as loads.
        const Shape& in_s = shapes.at(u->src(0));
        const Shape& out_s = shapes.at(u);
        double run = 1;
        for (size_t i = in_s.size(); i-- > 0 && in_s[i] == 1;) run *= double(out_s[i]);
        if (run >= 8 && dtypes::is_float(u->dtype) && decoded_from_bytes(v, realized)) copies /= run;
        int cost = (is_alu(v->op) || v->op == Ops::CAST) && !realized.count(v) ? recompute_cost(v, realized) : 0;
        if (copies >= 4 && cost >= 4) {
          realized.insert(v);
          hr = false;
        }
      }
      if (hr && consumers[u] > 1 && !is_movement(u->op) && !realized.count(u)) {
        // A value with a reduce inside and several users would run its reduce once per user: computed once.
        realized.insert(u);
        hr = false;
      }
      has_reduce[u] = hr;
    }
    Template t;
    std::unordered_map<const UOp*, int> slot_of;  // BUFFERs and realised nodes
    for (const UOp* u : topo)
      if (u->op == Ops::BUFFER) {
        slot_of[u] = int(t.slots.size());
        t.slots.push_back({int(t.slots.size()), std::get<std::string>(u->src(0)->arg), u->dtype,
                           std::get<std::vector<int64_t>>(u->arg)[1]});
      }
    int n_inputs = int(t.slots.size());
    auto value_slot = [&](const UOp* u) -> int {  // the slot holding u's value (contiguous)
      if (auto it = slot_of.find(u); it != slot_of.end()) return it->second;
      if (const UOp* b = contiguous_buffer(u)) return slot_of.at(b);
      throw Error(std::string("[schedule] internal: no buffer for ") + op_name(u->op));
    };
    std::vector<int> assign_items;
    std::unordered_set<const UOp*> retry;
    for (const UOp* u : topo) {
      if (!realized.count(u) || contiguous_buffer(u)) continue;
      if (u->op == Ops::CONTIGUOUS && contiguous_buffer(u->src(0))) {  // already contiguous: same buffer
        slot_of[u] = value_slot(u->src(0));
        continue;
      }
      const Shape& sh = shapes.at(u);
      int64_t n = 1;
      for (int64_t d : sh) n *= d;
      int out;
      if (u->op == Ops::ASSIGN) {
        const UOp* tb = contiguous_buffer(u->src(0));
        if (!tb) throw Error("[assign] the target must be a realised buffer");
        out = slot_of.at(tb);
      } else {
        out = int(t.slots.size());
        t.slots.push_back({-1, device_of(u), u->dtype, n});
      }
      slot_of[u] = out;
      if (n == 0) continue;  // nothing to compute
      Template::Item item{ScheduleItem::Kind::Kernel, {}, {out}, t.slots[size_t(out)].device, {}};
      if (u->op == Ops::COPY) {
        item.kind = ScheduleItem::Kind::Copy;
        item.slots.push_back(value_slot(u->src(0)));
        if (contiguous_buffer(u->src(0))) item.old_reads.push_back(1);  // the contents before
        item.ast = UOpRef(u);
      } else {
        KernelBuilder kb{shapes, realized, u, row_fused, {}, {}, 0, {}};
        item.ast = kernel_ast_rules(kb.kernel_ast());
        retry.insert(kb.not_hoisted.begin(), kb.not_hoisted.end());
        for (const UOp* p : kb.params) {
          item.slots.push_back(value_slot(p));
          if (p->op == Ops::BUFFER) item.old_reads.push_back(int(item.slots.size() - 1));
        }
      }
      if (u->op == Ops::ASSIGN) assign_items.push_back(int(t.items.size()));
      t.items.push_back(std::move(item));
    }
    if (!retry.empty()) {
      no_row_fuse.insert(retry.begin(), retry.end());
      continue;
    }
    for (size_t i = 0; i < roots.size(); i++) {
      t.root_shapes.push_back(shapes.at(roots[i].get()));
      if (!contiguous_buffer(roots[i].get())) t.becomes.emplace_back(i, slot_of.at(roots[i].get()));
    }
    // Order: a kernel runs after the kernels whose results it reads (RAW; an ASSIGN's result is its target
    // buffer after the write), and an in-place write (ASSIGN) after every kernel that reads the old contents of
    // its buffer (WAR). A stable topological sort: the graph's order wherever both allow it.
    if (!assign_items.empty()) {
      std::unordered_map<int, size_t> writer;  // slot -> the item that writes it
      for (size_t i = 0; i < t.items.size(); i++) writer[t.items[i].slots[0]] = i;
      // A kernel that reads a buffer both before and after an assign to it (a reader of the old values combined
      // with the assigned tensor) reads the old values from a copy made before the write.
      for (size_t j = 0, n0 = t.items.size(); j < n0; j++) {
        for (int pos : t.items[j].old_reads) {
          int sl = t.items[j].slots[size_t(pos)];
          auto w = writer.find(sl);
          if (sl >= n_inputs || w == writer.end() || w->second == j) continue;
          bool reads_new = false;
          for (size_t k = 1; k < t.items[j].slots.size(); k++)
            reads_new |= t.items[j].slots[k] == sl &&
                         std::find(t.items[j].old_reads.begin(), t.items[j].old_reads.end(), int(k)) == t.items[j].old_reads.end();
          if (!reads_new) continue;
          const UOp* bnode = nullptr;
          for (auto& [node, v] : slot_of)
            if (v == sl && node->op == Ops::BUFFER) bnode = node;
          if (!bnode) continue;
          int copy = int(t.slots.size());
          t.slots.push_back({-1, t.slots[size_t(sl)].device, t.slots[size_t(sl)].dtype, t.slots[size_t(sl)].size});
          UOpRef dev = UOp::make(Ops::DEVICE, dtypes::void_, {}, t.slots[size_t(sl)].device);
          t.items.push_back(Template::Item{ScheduleItem::Kind::Copy, UOp::make(Ops::COPY, bnode->dtype, {UOpRef(bnode), dev}),
                                           {copy, sl}, t.slots[size_t(sl)].device, {1}});
          t.items[j].slots[size_t(pos)] = copy;
          writer[copy] = t.items.size() - 1;
        }
      }
      size_t ni = t.items.size();
      std::vector<std::vector<size_t>> next(ni);
      std::vector<int> deps(ni, 0);
      auto edge = [&](size_t a, size_t b) {
        if (a == b) return;
        next[a].push_back(b);
        deps[b]++;
      };
      for (size_t j = 0; j < ni; j++) {
        const Template::Item& it = t.items[j];
        for (size_t k = 1; k < it.slots.size(); k++) {
          int sl = it.slots[k];
          auto w = writer.find(sl);
          if (w == writer.end()) continue;
          bool old = std::find(it.old_reads.begin(), it.old_reads.end(), int(k)) != it.old_reads.end();
          if (old && sl < n_inputs) edge(j, w->second);  // WAR: only an ASSIGN writes an input
          else if (!old) edge(w->second, j);             // RAW
        }
      }
      std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
      for (size_t i = 0; i < ni; i++)
        if (deps[i] == 0) ready.push(i);
      std::vector<size_t> order;
      while (!ready.empty()) {
        size_t i = ready.top();
        ready.pop();
        order.push_back(i);
        for (size_t b : next[i])
          if (--deps[b] == 0) ready.push(b);
      }
      if (order.size() != ni) throw Error("[schedule] internal: the kernels' read/write order has a cycle");
      std::vector<Template::Item> sorted;
      for (size_t i : order) sorted.push_back(std::move(t.items[i]));
      t.items = std::move(sorted);
    }
    // Memory planner: an intermediate buffer (not a root's, not an input) whose last reader has run can be
    // reused by a later intermediate of the same device, dtype and size.
    std::vector<bool> exposed(t.slots.size(), false);
    for (auto& [r, sl] : t.becomes) exposed[size_t(sl)] = true;
    std::vector<size_t> last_use(t.slots.size(), 0);
    for (size_t i = 0; i < t.items.size(); i++)
      for (int sl : t.items[i].slots) last_use[size_t(sl)] = i;
    std::vector<int> remap(t.slots.size());
    for (size_t i = 0; i < remap.size(); i++) remap[i] = int(i);
    std::vector<int> free_slots;
    for (size_t i = 0; i < t.items.size(); i++) {
      int out = t.items[i].slots[0];
      if (out >= n_inputs && !exposed[size_t(out)] && remap[size_t(out)] == out) {
        const Slot& so = t.slots[size_t(out)];
        for (auto it = free_slots.begin(); it != free_slots.end(); ++it) {
          const Slot& sf = t.slots[size_t(*it)];
          if (sf.device == so.device && sf.dtype == so.dtype && sf.size == so.size) {
            remap[size_t(out)] = *it;
            free_slots.erase(it);
            break;
          }
        }
      }
      for (int sl : t.items[i].slots)
        if (sl >= n_inputs && !exposed[size_t(sl)] && last_use[size_t(sl)] == i && remap[size_t(sl)] == sl &&
            std::find(free_slots.begin(), free_slots.end(), sl) == free_slots.end())
          free_slots.push_back(sl);
    }
    for (auto& it : t.items)
      for (int& sl : it.slots) sl = remap[size_t(sl)];
    if (debug_level() >= 3)
      for (auto& it : t.items)
        if (it.kind == ScheduleItem::Kind::Kernel) std::fprintf(stderr, "kernel AST:\n%s", print_graph(it.ast.get()).c_str());
    return t;
  }
}

/** Templates by normalised graph (every BUFFER replaced by its order of appearance). Bounded LRU. */
struct TemplateCache {
  std::mutex mu;
  std::list<std::pair<UOpRef, std::shared_ptr<Template>>> lru;
  std::unordered_map<const UOp*, decltype(lru)::iterator> index;
  static constexpr size_t kMax = 512;
};
TemplateCache& template_cache() {
  static TemplateCache* c = new TemplateCache();
  return *c;
}

}  // namespace

size_t schedules_built() { return g_schedules_built.load(); }

Schedule create_schedule(std::span<const UOpRef> roots) {
  viz::Context vctx("schedule", "schedule");  // VIZ / PROFILE stage label
  profile::Span span("schedule", "create_schedule");
  // Normalise: the schedule depends on the graph's structure, not on which buffers it reads.
  std::vector<const UOp*> topo = toposort(roots);
  std::unordered_map<const UOp*, UOpRef> norm;
  std::vector<const UOp*> inputs;
  size_t n_contig = 0;
  for (const UOp* u : topo) {
    if (u->op == Ops::BUFFER) {
      auto& a = std::get<std::vector<int64_t>>(u->arg);
      norm[u] = UOp::make(Ops::BUFFER, u->dtype, u->src(), std::vector<int64_t>{-1 - int64_t(inputs.size()), a[1]});
      inputs.push_back(u);
      continue;
    }
    if (u->op == Ops::FUNCTION) {  // a custom gradient's marker: the value is its first source
      norm[u] = norm.at(u->src(0));
      continue;
    }
    if (u->op == Ops::BIND) {  // the kernels take the variable; its value goes with the schedule
      norm[u] = u->src(0)->ref();
      continue;
    }
    bool changed = false;
    std::vector<UOpRef> src;
    for (auto& s : u->src()) {
      src.push_back(norm.at(s.get()));
      changed |= src.back().get() != s.get();
    }
    if (u->op == Ops::CONTIGUOUS && std::holds_alternative<int64_t>(u->arg)) {  // unique ids by order too
      norm[u] = UOp::make(Ops::CONTIGUOUS, u->dtype, src, -1 - int64_t(n_contig++));
      continue;
    }
    norm[u] = changed ? u->replace_src(src) : UOpRef(u);
  }
  std::vector<UOpRef> nroots;
  for (auto& r : roots) nroots.push_back(norm.at(r.get()));
  UOpRef key = UOp::make(Ops::SINK, dtypes::void_, nroots);
  std::shared_ptr<Template> t;
  TemplateCache& tc = template_cache();
  {
    std::lock_guard lk(tc.mu);
    if (auto it = tc.index.find(key.get()); it != tc.index.end()) {
      tc.lru.splice(tc.lru.begin(), tc.lru, it->second);
      t = it->second->second;
    }
  }
  if (!t) {
    t = std::make_shared<Template>(build_template(nroots));
    std::lock_guard lk(tc.mu);
    tc.lru.emplace_front(key, t);
    tc.index[key.get()] = tc.lru.begin();
    while (tc.lru.size() > TemplateCache::kMax) {
      tc.index.erase(tc.lru.back().first.get());
      tc.lru.pop_back();
    }
  }
  // Instantiate: inputs are this graph's buffers, every other slot a new buffer.
  std::vector<UOpRef> slot_uop(t->slots.size());
  for (const Slot& sl : t->slots)  // refuse a buffer whose bytes overflow before making any
    if (sl.input < 0) checked_nbytes("realize", {int64_t(sl.size)}, sl.dtype);
  for (size_t i = 0; i < t->slots.size(); i++) {
    const Slot& sl = t->slots[i];
    slot_uop[i] = sl.input >= 0 ? UOpRef(inputs[size_t(sl.input)]) : new_buffer_uop(sl.device, sl.dtype, size_t(sl.size));
  }
  Schedule sched;
  sched.var_vals = bound_vars(roots, "realize");
  for (const UOp* u : topo)
    if (u->op == Ops::DEFINE_VAR) {
      const std::string& name = std::get<VarArg>(u->arg).name;
      bool bound = false;
      for (auto& [k, v] : sched.var_vals) bound |= k == name;
      if (!bound) throw Error("[realize] variable " + name + " has no value: bind it (Variable::bind) before realising");
    }
  for (auto& it : t->items) {
    ScheduleItem si;
    si.kind = it.kind;
    si.ast = it.ast;
    si.device = it.device;
    for (int sl : it.slots) si.bufs.push_back(buffer_of(slot_uop[size_t(sl)].get()));
    sched.items.push_back(std::move(si));
  }
  for (auto& [r, sl] : t->becomes) {
    const Shape& s = t->root_shapes[r];
    const UOpRef& bu = slot_uop[size_t(sl)];
    if (const auto* sym = roots[r]->sym()) {  // the buffer at the largest dims, viewed with the root's symbolic ones
      std::vector<UOpRef> src{bu};
      src.insert(src.end(), sym->begin(), sym->end());
      sched.becomes.emplace_back(roots[r], UOp::make(Ops::RESHAPE, bu->dtype, src, std::vector<int64_t>(s)));
      continue;
    }
    bool flat = s.size() == 1 && s[0] == std::get<std::vector<int64_t>>(bu->arg)[1];
    sched.becomes.emplace_back(roots[r], flat ? bu : UOp::make(Ops::RESHAPE, bu->dtype, {bu}, std::vector<int64_t>(s)));
  }
  return sched;
}

}  // namespace tg
