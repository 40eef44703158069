// Lowering one kernel: a named list of rewrite passes from the scheduler's AST to a linear program.
#include <algorithm>
#include <cmath>
#include <bitset>
#include <cstdio>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "gpudims.hpp"
#include "tg/codegen.hpp"
#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/symbolic.hpp"

namespace tg {
using namespace tg::pat;

namespace {

UOpRef ci(int64_t v) { return UOp::cnst_int(dtypes::index, v); }

// The RANGEs a node depends on that are still open (an END closes its range).
std::vector<UOpRef> ranges_in(const UOp* u) {
  std::unordered_map<const UOp*, std::vector<const UOp*>> open;
  for (const UOp* n : toposort(u)) {
    std::vector<const UOp*> o;
    for (auto& s : n->src())
      for (const UOp* r : open[s.get()])
        if (std::find(o.begin(), o.end(), r) == o.end()) o.push_back(r);
    if (n->op == Ops::RANGE) o.push_back(n);
    if (n->op == Ops::END) std::erase(o, n->src(n->nsrc() - 1));
    open[n] = std::move(o);
  }
  std::vector<UOpRef> r;
  for (const UOp* x : open[u]) r.push_back(x);
  return r;
}

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

struct ReduceCtx {
  int next_reg = 0;
};

// REDUCE(src, r...) -> an accumulator register: init, loop update, read after the loop.
UOpRef do_expand_reduce(const UOp* red, ReduceCtx& ctx) {
  Ops op = Ops(std::get<int64_t>(red->arg));
  std::vector<UOpRef> own(red->src().begin() + 1, red->src().end());
  std::vector<UOpRef> outer;
  for (auto& r : ranges_in(red->src(0)))
    if (std::find(own.begin(), own.end(), r) == own.end()) outer.push_back(r);
  DType d = red->dtype;
  UOpRef acc = UOp::make(Ops::DEFINE_REG, d.ptr_to(1, AddrSpace::Reg), {}, int64_t(ctx.next_reg++));
  std::vector<UOpRef> os{acc};
  os.insert(os.end(), outer.begin(), outer.end());
  UOpRef acc_outer = outer.empty() ? acc : UOp::make(Ops::AFTER, acc->dtype, os);
  UOpRef init = UOp::make(Ops::STORE, dtypes::void_, {UOp::make(Ops::INDEX, acc->dtype, {acc_outer, ci(0)}), identity_of(op, d)});
  std::vector<UOpRef> is{acc, init};
  is.insert(is.end(), own.begin(), own.end());
  UOpRef acc_in = UOp::make(Ops::AFTER, acc->dtype, is);
  UOpRef idx_in = UOp::make(Ops::INDEX, acc->dtype, {acc_in, ci(0)});
  UOpRef cur = UOp::make(Ops::LOAD, d, {idx_in});
  UOpRef upd = UOp::make(Ops::STORE, dtypes::void_, {idx_in, UOp::make(op, d, {cur, red->src()[0]})});
  UOpRef e = upd;
  for (size_t i = own.size(); i-- > 0;) e = UOp::make(Ops::END, dtypes::void_, {e, own[i]});
  UOpRef after = UOp::make(Ops::AFTER, acc->dtype, {acc, e});
  return UOp::make(Ops::LOAD, d, {UOp::make(Ops::INDEX, acc->dtype, {after, ci(0)})});
}

const PatternMatcher& pm_reduce() {
  static const PatternMatcher pm(table(rule(op_any<opset<Ops::REDUCE>>, [](auto& m) -> UOpRef {
    return do_expand_reduce(m.root, m.template ctx<ReduceCtx>());
  })));
  return pm;
}

// Close every output loop after the stores: SINK(STORE) -> SINK(END(...END(STORE, rN)..., r0)).
UOpRef add_ends(const UOpRef& sink) {
  std::vector<UOpRef> srcs;
  for (auto& st : sink->src()) {
    auto rs = ranges_in(st.get());
    std::vector<UOpRef> out;
    for (auto& r : rs)
      if (static_cast<AxisType>(std::get<std::vector<int64_t>>(r->arg)[1]) != AxisType::Reduce) out.push_back(r);
    std::sort(out.begin(), out.end(), [](const UOpRef& a, const UOpRef& b) {
      return std::get<std::vector<int64_t>>(a->arg)[0] < std::get<std::vector<int64_t>>(b->arg)[0];
    });
    UOpRef e = st;
    for (size_t i = out.size(); i-- > 0;) e = UOp::make(Ops::END, dtypes::void_, {e, out[i]});
    srcs.push_back(e);
  }
  return sink->replace_src(srcs);
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

using RangeSet = std::bitset<128>;

}  // namespace

std::vector<const UOp*> linearize(const UOpRef& sink) {
  std::vector<const UOp*> topo = toposort(sink.get());
  std::unordered_map<const UOp*, int> rid;
  std::vector<const UOp*> ranges;
  for (const UOp* u : topo)
    if (u->op == Ops::RANGE) {
      if (ranges.size() >= 128) throw Error("[linearize] more than 128 loops in one kernel");
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

CompiledKernel lower_kernel(const UOpRef& ast, const std::string& name, Renderer& renderer) {
  int dbg = debug_level();
  auto trace = [&](const char* pass, const UOpRef& u) {
    if (dbg >= 5) std::fprintf(stderr, "--- %s: %s\n%s", name.c_str(), pass, print_graph(u.get()).c_str());
  };
  trace("input", ast);
  UOpRef k = graph_rewrite(ast, symbolic(), nullptr, false, "simplify");
  trace("simplify", k);
  LaunchDims dims;
  if (Renderer::GridLimits lim = renderer.grid_limits(); lim.threads > 0) {
    k = add_gpu_dims(k, lim, dims);
    trace("gpu dims", k);
  }
  ReduceCtx rctx;
  k = graph_rewrite(k, pm_reduce(), &rctx, false, "expand reduce");
  k = add_ends(k);
  trace("expand reduce", k);
  k = graph_rewrite(k, symbolic(), nullptr, false, "simplify after reduce");
  // Pick the index width from the bounds of every index value.
  bool wide = false;
  for (const UOp* u : toposort(k.get()))
    if (u->dtype.scalar == Scalar::Index && (!u->bounds().known || u->vmin() < INT32_MIN || u->vmax() > INT32_MAX)) wide = true;
  IndexCtx ictx{wide ? dtypes::int64 : dtypes::int32};
  k = graph_rewrite(k, pm_lower_index_dtype(), &ictx, false, "lower index dtype");
  trace("lower index dtype", k);
  CompiledKernel ck;
  ck.name = name;
  ck.sink = k;
  ck.dims = dims;
  ck.program = linearize(k);
  for (const UOp* u : ck.program) {
    if (u->op == Ops::PARAM) ck.n_params = std::max(ck.n_params, int(std::get<int64_t>(u->arg)) + 1);
    if (u->op == Ops::DEFINE_VAR) ck.var_names.push_back(std::get<VarArg>(u->arg).name);
  }
  // Work estimates for DEBUG=2: ALU ops and bytes moved, counted through loop trip counts.
  std::unordered_map<const UOp*, double> trips;
  double mult = 1;
  std::vector<double> stack;
  for (const UOp* u : ck.program) {
    if (u->op == Ops::RANGE) {
      stack.push_back(mult);
      mult *= double(std::max<int64_t>(1, u->src(0)->op == Ops::CONST ? u->src(0)->const_int() : 1));
    } else if (u->op == Ops::END) {
      if (!stack.empty()) mult = stack.back(), stack.pop_back();
    } else if (is_alu(u->op) && !dtypes::is_int(u->dtype)) {
      ck.flops += mult;
    } else if ((u->op == Ops::LOAD || u->op == Ops::STORE) && u->src(0)->src(0)->op == Ops::PARAM) {
      const UOp* p = u->src(0)->src(0);
      ck.mem_bytes += mult * double(p->dtype.base().scalar_type().itemsize());
    }
  }
  if (dbg >= 6) {
    std::fprintf(stderr, "--- %s: linear program\n", name.c_str());
    for (size_t i = 0; i < ck.program.size(); i++)
      std::fprintf(stderr, "%4zu %s %s\n", i, op_name(ck.program[i]->op), ck.program[i]->dtype.name().c_str());
  }
  ck.src = renderer.render(name, ck.program);
  if (dbg >= 4) std::fprintf(stderr, "%s\n", ck.src.c_str());
  return ck;
}

}  // namespace tg
