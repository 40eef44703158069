// GPU launch dimensions (tinygrad: codegen/gpudims.py): the output loops of a kernel become work-item indices.
// The innermost output loop is launch axis 0 (neighbouring work items touch neighbouring addresses), the next one
// axis 1, the remaining outer ones are flattened into axis 2 (each recovered by a division and a modulo). A loop
// whose size is not a known constant >= 1, or that would exceed the device's grid, stays a serial loop.
#include "gpudims.hpp"

#include <algorithm>
#include <unordered_map>

#include "tg/pattern.hpp"

namespace tg {
using namespace tg::pat;

namespace {

struct SubCtx {
  std::unordered_map<const UOp*, UOpRef> map;
};

// RANGE -> its index expression over the SPECIALs
const PatternMatcher& pm_ranges_to_special() {
  static const PatternMatcher pm(table(rule(op_any<opset<Ops::RANGE>>, [](auto& m) -> UOpRef {
    auto& c = m.template ctx<SubCtx>();
    auto it = c.map.find(m.root);
    return it == c.map.end() ? UOpRef{} : it->second;
  })));
  return pm;
}

int64_t range_id(const UOp* r) { return std::get<std::vector<int64_t>>(r->arg)[0]; }
bool is_output_loop(const UOp* r) {
  return static_cast<AxisType>(std::get<std::vector<int64_t>>(r->arg)[1]) == AxisType::Loop;
}

// The largest divisor of n that is at most `cap`.
int64_t divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t d = std::min(n, cap); d > 1; d--)
    if (n % d == 0) return d;
  return 1;
}

}  // namespace

UOpRef add_gpu_dims(const UOpRef& ast, const Renderer::GridLimits& lim, LaunchDims& dims) {
  std::vector<const UOp*> loops;
  for (const UOp* u : toposort(ast.get()))
    if (u->op == Ops::RANGE && is_output_loop(u) && u->src(0)->op == Ops::CONST && u->src(0)->const_int() >= 1)
      loops.push_back(u);
  std::sort(loops.begin(), loops.end(), [](const UOp* a, const UOp* b) { return range_id(a) > range_id(b); });
  loops.erase(std::unique(loops.begin(), loops.end()), loops.end());
  auto size = [](const UOp* r) { return r->src(0)->const_int(); };
  auto ci = [](int64_t v) { return UOp::cnst_int(dtypes::index, v); };

  // Which loops go to which axis: innermost first; axis 2 takes a run of the outer ones while they fit.
  std::vector<std::vector<const UOp*>> axes;
  size_t next = 0;
  for (int ax = 0; ax < 3 && next < loops.size(); ax++) {
    std::vector<const UOp*> take;
    int64_t total = 1;
    while (next < loops.size()) {
      int64_t n = size(loops[next]);
      int64_t groups = (total * n) / divisor_at_most(total * n, lim.threads > 0 && ax == 0 ? lim.threads : 1);
      if (total > (int64_t(1) << 40) / n || groups > lim.groups[ax]) break;
      take.push_back(loops[next++]);
      total *= n;
      if (ax < 2) break;  // axes 0 and 1 take one loop each
    }
    if (take.empty()) break;
    axes.push_back(std::move(take));
  }

  SubCtx ctx;
  for (size_t ax = 0; ax < axes.size(); ax++) {
    int64_t total = 1;
    for (const UOp* r : axes[ax]) total *= size(r);
    int64_t local = ax == 0 ? divisor_at_most(total, lim.threads) : 1;
    dims.local[ax] = local;
    dims.global[ax] = total / local;
    UOpRef sp = UOp::make(Ops::SPECIAL, dtypes::index, {ci(total)}, std::vector<int64_t>{int64_t(ax)});
    // Flattened loops, innermost first: r_i = (sp / prod(sizes of the loops inside it)) % size_i.
    int64_t stride = 1;
    for (size_t i = 0; i < axes[ax].size(); i++) {
      const UOp* r = axes[ax][i];
      UOpRef e = sp;
      if (stride > 1) e = e->alu(Ops::IDIV, ci(stride));
      if (i + 1 < axes[ax].size()) e = e->alu(Ops::MOD, ci(size(r)));
      ctx.map[r] = e;
      stride *= size(r);
    }
  }
  if (ctx.map.empty()) return ast;
  return graph_rewrite(ast, pm_ranges_to_special(), &ctx, false, "gpu dims");
}

}  // namespace tg
