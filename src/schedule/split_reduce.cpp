// Stage "split reduceop" of the scheduler: early rewrites of the tensor graph.
//
// Split reduce: a reduce whose input is many times its output (a convolution's weight gradient, a batch
// statistic, a full sum) runs as two kernels: partial reduces over chunks of its outermost reduce axis, the chunk
// index the outermost output axis (so the chunks spread over threads, and each chunk's inputs stay in cache while
// every output is accumulated from them), then a reduce over the chunks. As tinygrad's split_reduceop, which puts
// the chunk index innermost for GPUs. SPLIT_REDUCEOP=0 turns it off; REDUCEOP_SPLIT_THRESHOLD is the input/output
// ratio from which it applies (a quarter of it for a reduction over axis 0 and more: see split_reduce).
#include <algorithm>
#include <cstdio>

#include "stages.hpp"
#include "tg/env.hpp"

namespace tg::sched {

const Shape& ShapeCache::of(const UOp* u) {
  if (auto it = shapes.find(u); it != shapes.end()) return it->second;
  std::vector<std::pair<const UOp*, bool>> st{{u, false}};  // (node, its sources have shapes)
  while (!st.empty()) {
    auto [n, ready] = st.back();
    st.pop_back();
    if (shapes.count(n)) continue;
    if (!ready) {
      st.push_back({n, true});
      for (auto& s : n->src())
        if (!shapes.count(s.get())) st.push_back({s.get(), false});
      continue;
    }
    std::vector<const Shape*> in;
    for (auto& s : n->src()) in.push_back(&shapes.at(s.get()));
    shapes[n] = infer_shape(n->op, in, n->arg, n->dtype);
    keep.push_back(UOpRef(n));
  }
  return shapes.at(u);
}

namespace {

struct SplitCtx {
  ShapeCache shapes;
  double threshold;
  NodeSet made;  // the partial reduces this stage made: not split again
  std::vector<UOpRef> keep;
};

double numel(const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= double(d);
  return n;
}

// A sum of where(index == arange, x, 0) whose compare is marked for an index check (IndexCheck): the kernel AST
// stage folds it into one load per output (and checks the index there), so it is not split.
bool checked_one_hot_sum(const UOp* u) {
  const UOp* v = u->src(0);
  while (v->op == Ops::CAST || v->op == Ops::DETACH) v = v->src(0);
  if (v->op != Ops::WHERE) return false;
  std::vector<const UOp*> stack{v->src(0)};  // the condition's conjuncts (advanced indexing ANDs one per index)
  while (!stack.empty()) {
    const UOp* c = stack.back();
    stack.pop_back();
    while (is_movement(c->op) || c->op == Ops::DETACH) c = c->src(0);
    if (c->op == Ops::AND) stack.push_back(c->src(0)), stack.push_back(c->src(1));
    else if (c->op == Ops::CMPEQ && std::holds_alternative<std::vector<int64_t>>(c->arg)) return true;
  }
  return false;
}

constexpr double kStoreOwn = 1024;  // outputs from which the reduce over the chunks is a kernel of its own

// (.., n, ..) -> (.., d, n/d, ..) -> (d, .., n/d, ..): reduce the original axes (shifted by one), then d.
UOpRef split_reduce(const UOp* u, SplitCtx& ctx) {
  if (ctx.made.count(u) || checked_one_hot_sum(u)) return {};
  const Shape& xs = ctx.shapes.of(u->src(0));
  const Shape& out = ctx.shapes.of(u);
  const auto& ra = std::get<ReduceArg>(u->arg);
  double in_n = numel(xs), out_n = numel(out);
  std::vector<int64_t> axes = ra.axes;
  std::sort(axes.begin(), axes.end());
  if (const auto* sy = u->src(0)->sym())  // a symbolic reduce axis is not split (its size is not known here)
    for (int64_t a : axes)
      if (!(*sy)[size_t(a)]->is_const()) return {};
  // A reduction over the batch and more (a convolution's weight gradient, a batch statistic) splits from a quarter
  // of the threshold: unsplit, each output walks its windows across every sample (beautiful_mnist's 64->64 3x3
  // weight gradient at batch 256, 9216 per output: 65-80 ms against 2-3 ms split, 2-core Zen 5); a data-parallel
  // device's half batch would otherwise fall under the threshold where the whole batch does not
  const bool over_batch = axes.size() > 1 && axes[0] == 0 && xs[0] > 1;
  const double threshold = over_batch ? ctx.threshold / 4 : ctx.threshold;
  if (out_n < 1 || in_n / out_n < threshold || axes.empty()) return {};
  int64_t dmax = int64_t(std::min(256.0, double(1 << 22) / std::max(out_n, 1.0)));
  for (int64_t a : axes) {
    int64_t n = xs[size_t(a)], d = dmax;
    while (d >= 8 && n % d) d--;
    if (d < 8) continue;
    Shape s1(xs.begin(), xs.begin() + a);
    s1.push_back(d);
    s1.push_back(n / d);
    s1.insert(s1.end(), xs.begin() + a + 1, xs.end());
    std::vector<int64_t> perm{a};
    for (int64_t i = 0; i < int64_t(s1.size()); i++)
      if (i != a) perm.push_back(i);
    UOpRef x = UOp::make(Ops::RESHAPE, u->dtype, {u->src()[0]}, std::vector<int64_t>(s1));
    x = UOp::make(Ops::PERMUTE, u->dtype, {x}, perm);
    std::vector<int64_t> ax1;
    for (int64_t j : axes) ax1.push_back(j + 1);
    UOpRef r1 = UOp::make(Ops::REDUCE_AXIS, u->dtype, {x}, ReduceArg{ra.op, ax1});
    UOpRef r2 = UOp::make(Ops::REDUCE_AXIS, u->dtype, {UOp::make(Ops::CONTIGUOUS, u->dtype, {r1})}, ReduceArg{ra.op, {0}});
    ctx.made.insert(r1.get());
    ctx.made.insert(r2.get());
    ctx.keep.insert(ctx.keep.end(), {r1, r2});
    if (debug_level() >= 3)
      std::fprintf(stderr, "split reduce %s by %lld on axis %lld\n", shape_str(xs).c_str(), (long long)d, (long long)a);
    // A large result is stored in the chunks' order: fused with a consumer that permutes it (a convolution's
    // weight gradient into OIHW), the reduce over the chunks would load each element's d partials as gathers
    UOpRef done = out_n >= kStoreOwn ? UOp::make(Ops::CONTIGUOUS, u->dtype, {r2}) : r2;
    return UOp::make(Ops::RESHAPE, u->dtype, {done}, std::vector<int64_t>(out));
  }
  return {};
}

const PatternMatcher& pm_split_reduceop() {
  using namespace pat;
  static const PatternMatcher pm(
      table(rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return split_reduce(m.root, m.template ctx<SplitCtx>()); })));
  return pm;
}

}  // namespace

std::vector<UOpRef> split_reduceop(std::span<const UOpRef> roots, const Knobs& knobs) {
  if (!knobs.split_reduceop) return {roots.begin(), roots.end()};
  SplitCtx ctx{{}, double(knobs.split_threshold), {}, {}};
  return rewrite_roots(roots, pm_split_reduceop(), &ctx, "split reduceop");
}

}  // namespace tg::sched
