// GPU launch dimensions (tinygrad: codegen/gpudims.py): the output loops of a kernel become work-item indices.
// The innermost output loop is launch axis 0 (neighbouring work items touch neighbouring addresses), the next one
// axis 1, the remaining outer ones are flattened into axis 2 (each recovered by a division and a modulo). A loop
// whose size is not a known constant >= 1, or that would exceed the device's grid, stays a serial loop.
// With LOCAL/GROUP/TC ranges, those become the items of a work group (local ids, SPECIAL kind LocalId) and the
// output loops the group indices (GroupId); the launch then needs exactly that group size (exact_local).
#include "gpudims.hpp"

#include <algorithm>
#include <unordered_map>

#include "tg/opt.hpp"
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

namespace {

// Flattened loops, innermost first: r_i = (sp / prod(sizes of the loops inside it)) % size_i.
void map_flattened(const std::vector<const UOp*>& rs, const UOpRef& sp, SubCtx& ctx) {
  auto ci = [](int64_t v) { return UOp::cnst_int(dtypes::index, v); };
  int64_t stride = 1;
  for (size_t i = 0; i < rs.size(); i++) {
    const UOp* r = rs[i];
    UOpRef e = sp;
    if (stride > 1) e = e->alu(Ops::IDIV, ci(stride));
    if (i + 1 < rs.size()) e = e->alu(Ops::MOD, ci(r->src(0)->const_int()));
    ctx.map[r] = e;
    stride *= r->src(0)->const_int();
  }
}

UOpRef special(int64_t size, int64_t axis, SpecialKind kind) {
  std::vector<int64_t> arg{axis};
  if (kind != SpecialKind::GlobalId) arg.push_back(int64_t(kind));
  return UOp::make(Ops::SPECIAL, dtypes::index, {UOp::cnst_int(dtypes::index, size)}, arg);
}

}  // namespace

UOpRef add_gpu_dims(const UOpRef& ast, const Renderer::GridLimits& lim, LaunchDims& dims) {
  std::vector<const UOp*> loops, locals;
  bool symbolic_loop = false;
  for (const UOp* u : toposort(ast.get())) {
    if (u->op != Ops::RANGE) continue;
    auto t = static_cast<AxisType>(std::get<std::vector<int64_t>>(u->arg)[1]);
    if ((t == AxisType::Local || t == AxisType::Group) && u->src(0)->op == Ops::CONST) locals.push_back(u);
    if (is_output_loop(u) && u->src(0)->op == Ops::CONST && u->src(0)->const_int() >= 1) loops.push_back(u);
    if (is_output_loop(u) && u->src(0)->op != Ops::CONST) symbolic_loop = true;
  }
  std::sort(loops.begin(), loops.end(), [](const UOp* a, const UOp* b) { return range_id(a) > range_id(b); });
  loops.erase(std::unique(loops.begin(), loops.end()), loops.end());
  auto size = [](const UOp* r) { return r->src(0)->const_int(); };
  bool local_mode = !locals.empty();

  // Which loops go to which axis: innermost first; axis 2 takes a run of the outer ones while they fit. With
  // explicit work-group items (LOCAL/GROUP/TC) the loops are group indices and the groups keep their size.
  std::vector<std::vector<const UOp*>> axes;
  size_t next = 0;
  for (int ax = 0; ax < 3 && next < loops.size(); ax++) {
    std::vector<const UOp*> take;
    int64_t total = 1;
    while (next < loops.size()) {
      int64_t n = size(loops[next]);
      int64_t per = local_mode ? 1 : lim.threads > 0 && ax == 0 ? lim.threads : 1;
      int64_t groups = (total * n) / divisor_at_most(total * n, per);
      if (total > (int64_t(1) << 40) / n || groups > lim.groups[ax]) break;
      take.push_back(loops[next++]);
      total *= n;
      if (ax < 2) break;  // axes 0 and 1 take one loop each
    }
    if (take.empty()) break;
    axes.push_back(std::move(take));
  }

  SubCtx ctx;
  if (local_mode) {
    if (next < loops.size() || symbolic_loop)
      throw OptError(std::string("[gpu dims] LOCAL/GROUP/TC need every output loop on the grid of work groups: ") +
                     (symbolic_loop ? "an output size is symbolic" : "the output loops do not fit the device's grid"));
    // Work-group items: GROUP ranges first (adjacent items read adjacent elements), then LOCAL ones in the
    // order they were made; axes 0 and 1 take one each, axis 2 the rest.
    std::sort(locals.begin(), locals.end(), [](const UOp* a, const UOp* b) {
      bool ga = range_type(a) == AxisType::Group, gb = range_type(b) == AxisType::Group;
      return ga != gb ? ga : range_id(a) < range_id(b);
    });
    locals.erase(std::unique(locals.begin(), locals.end()), locals.end());
    int64_t items = 1;
    for (const UOp* r : locals) items *= size(r);
    if (items > lim.threads)
      throw OptError("[gpu dims] LOCAL/GROUP/TC ask for " + std::to_string(items) +
                     " work items per group; the device allows " + std::to_string(lim.threads));
    dims.exact_local = true;
    for (size_t ax = 0; ax < 3 && ax < locals.size(); ax++) {
      std::vector<const UOp*> rs{locals[ax]};
      if (ax == 2) rs.assign(locals.begin() + 2, locals.end());
      std::reverse(rs.begin(), rs.end());  // the last made varies fastest within axis 2
      int64_t total = 1;
      for (const UOp* r : rs) total *= size(r);
      dims.local[ax] = total;
      map_flattened(rs, special(total, int64_t(ax), SpecialKind::LocalId), ctx);
    }
    for (size_t ax = 0; ax < axes.size(); ax++) {
      int64_t total = 1;
      for (const UOp* r : axes[ax]) total *= size(r);
      dims.global[ax] = total;
      map_flattened(axes[ax], special(total, int64_t(ax), SpecialKind::GroupId), ctx);
    }
  } else {
    for (size_t ax = 0; ax < axes.size(); ax++) {
      int64_t total = 1;
      for (const UOp* r : axes[ax]) total *= size(r);
      int64_t local = ax == 0 ? divisor_at_most(total, lim.threads) : 1;
      dims.local[ax] = local;
      dims.global[ax] = total / local;
      map_flattened(axes[ax], special(total, int64_t(ax), SpecialKind::GlobalId), ctx);
    }
  }
  if (ctx.map.empty()) return ast;
  return graph_rewrite(ast, pm_ranges_to_special(), &ctx, false, "gpu dims");
}

}  // namespace tg
