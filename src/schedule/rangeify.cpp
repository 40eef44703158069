// Rangeify, for the scheduler's stage "bufferize to store": the AST of one kernel, for one BUFFERIZE. The output's
// dimensions become RANGEs, and every movement op between the output and the buffers it reads becomes index
// arithmetic on them; elementwise ops and reductions fuse into the kernel, up to the BUFFERIZE nodes the realize map
// put in the graph: the kernel's BUFFERIZE becomes its STORE, the others it reads become LOADs of their buffers
// (tinygrad's bufferize to store). Range propagation is one iterative walk over (node, access) pairs (as tinygrad's
// run_rangeify).
#include <algorithm>
#include <functional>

#include "stages.hpp"
#include "tg/env.hpp"
#include "tg/opt.hpp"
#include "tg/variable.hpp"

namespace tg::sched {

namespace {

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
// SIMPLIFY_VALID=0 turns it off (to compare kernels; Knobs).
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
  const UOp* root;  // a BUFFERIZE
  std::vector<const UOp*> params;  // BUFFERs and BUFFERIZEs read (param n_out + i); params 0.. are the outputs
  std::vector<const UOp*> not_hoisted;  // row BUFFERIZEs whose value would be recomputed in this kernel
  int next_range = 0;
  std::unordered_map<AccessKey, UOpRef, AccessKeyHash> memo;
  bool simplify_valid = true;
  std::vector<const UOp*> outputs;  // the BUFFERIZEs stored (a multi-output kernel's group; else the root)

  int param_of(const UOp* m) {
    for (size_t i = 0; i < params.size(); i++)
      if (params[i] == m) return int(i + outputs.size());
    params.push_back(m);
    return int(params.size() - 1 + outputs.size());
  }

  static AccessKey key(const UOp* n, const Access& a) {
    AccessKey k{n, {}};
    for (auto& i : a.idx) k.parts.push_back(i);
    k.parts.push_back(a.valid);
    return k;
  }

  bool is_source(const UOp* n) const {
    if (n->op != Ops::BUFFER && !is_stored_bufferize(n)) return false;
    return std::find(outputs.begin(), outputs.end(), n) == outputs.end();
  }

  // The index of access `a` into a buffer of shape s: row-major, or through `strides` (one per axis) where given.
  UOpRef linear(const Shape& s, const Access& a, const std::vector<int64_t>& strides = {}) {
    UOpRef lin = ci(0);
    int64_t stride = 1;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] != 1) lin = add(mul(a.idx[i], strides.empty() ? stride : strides[i]), lin);
      stride *= s[i];
    }
    return lin;
  }

  // The index into the buffer behind `n` for access `a` of n: an assign into a view of a buffer (its target a
  // movement op) addresses the buffer through the view; a BUFFERIZE stored with strides through them; any other
  // materialised node is contiguous.
  UOpRef address(const UOp* n, const Access& a) {
    const UOp* val = n->op == Ops::BUFFERIZE ? n->src(0) : n;
    if (n->op == Ops::BUFFERIZE)
      if (BufferizeOpts o = BufferizeOpts::of(n); !o.strides.empty()) return linear(shapes.at(n), a, o.strides);
    if (val->op != Ops::ASSIGN || contiguous_buffer(val->src(0))) return linear(shapes.at(n), a);
    Access v = a;
    const UOp* t = val->src(0);
    for (; t->op != Ops::BUFFER; t = t->src(0)) v = child_access(t, v);
    return linear(shapes.at(t), v);
  }

  UOpRef load(const UOp* n, const Access& a) {
    int p = param_of(n);
    UOpRef param = UOp::make(Ops::PARAM, n->dtype.ptr_to(), {}, int64_t(p));
    UOpRef lin = address(n, a);
    if (a.valid && simplify_valid) lin = simplify_given_valid(lin, a.valid);
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
  // hoisted out of the inner output loops and of every reduce loop), and some inner output loop is not among them:
  // a value whose index or valid mask uses every loop runs once per element (PaddleOCR det's squeeze-excite scale,
  // read through a padded, upsampled, channels-last copy, ran its 6-term reduce for each of 162x162x96 elements).
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
    return gap;
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
        } else if (n->op == Ops::ASSIGN || n->op == Ops::BUFFERIZE) {
          f.child.push_back(f.a);  // the value (an ASSIGN's source 1; a stored or row BUFFERIZE's source 0)
          if (is_row_bufferize(n) && !hoisted(f.a)) not_hoisted.push_back(n);
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
      } else if (g.n->op == Ops::CONTIGUOUS || g.n->op == Ops::DETACH || g.n->op == Ops::ASSIGN ||
                 g.n->op == Ops::BUFFERIZE) {
        v = vals[0];
      } else if (is_alu(g.n->op) || g.n->op == Ops::CAST || g.n->op == Ops::BITCAST) {
        v = UOp::make(g.n->op, g.n->dtype, vals, g.n->arg);  // the arg: a compare's IndexCheck mark
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
    std::vector<UOpRef> stores;  // one per output, PARAM i for output i: members read by later ones are values here
    for (size_t i = 0; i < outputs.size(); i++) {
      UOpRef value = build(outputs[i], out);
      UOpRef param = UOp::make(Ops::PARAM, outputs[i]->dtype.ptr_to(), {}, int64_t(i));
      stores.push_back(UOp::make(Ops::STORE, dtypes::void_, {UOp::make(Ops::INDEX, param->dtype, {param, address(outputs[i], out)}), value}));
    }
    return UOp::make(Ops::SINK, dtypes::void_, stores);
  }
};


}  // namespace

KernelAst rangeify(ScheduleCtx& ctx, const UOp* root) {
  KernelBuilder kb{ctx.shapes, root, {}, {}, 0, {}, ctx.knobs.simplify_valid, {root}};
  if (auto ms = group_members(root); !ms.empty()) {  // a multi-output kernel: the members, then the leader
    kb.outputs.clear();
    for (auto& m : ms) kb.outputs.push_back(m.get());
    kb.outputs.push_back(root);
  }
  UOpRef built = kb.kernel_ast();
  bool check = false;
  std::vector<IndexDiag> diags;
  UOpRef ast = kernel_ast_rules(built, int(kb.outputs.size() + kb.params.size()), &check, &diags);
  return {ast, std::move(kb.params), std::move(kb.not_hoisted), check, std::move(diags)};
}

}  // namespace tg::sched
