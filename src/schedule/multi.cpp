// Stage "multi" of the scheduler (tinygrad's multi_pm and handle_allreduce): a graph over multi-device values
// (MULTI nodes, see include/tg/multi.hpp) becomes per-device graphs joined by COPY. Bottom up, every op whose
// sources are MULTIs is rebuilt once per device on that device's parts, and the result is a MULTI again:
//   elementwise ops     the operands brought to one sharding (a replicated operand is shrunk to each device's
//                       part locally; a differently sharded one is gathered and re-split), then one op per device
//   movement ops        per device, with the argument on the sharded axis scaled to the shard; where the sharded
//                       axis cannot stay split (a pad or shrink of it, a reshape that moves data across shards) the
//                       value is gathered onto every device first (replicated)
//   REDUCE_AXIS         per device; across the sharded axis the partial results are combined by an ALLREDUCE and
//                       the result is replicated
//   COPY to one device  the parts copied there and concatenated (PAD + ADD)
//   ASSIGN              per device, the value brought to the target's sharding
//   MSELECT             one device's part (autograd's gradient of a MULTI's source)
// Each ALLREDUCE is then lowered into COPY and ALU nodes: naive (every device sums all parts, in device order) or
// ring (the flattened value in n chunks; chunk c is summed along the ring c, c+1, ... and its owner's result copied
// to the others). Interning makes the per-device lowerings of one ALLREDUCE share their nodes, so each partial sum
// is computed once and every device receives the same bits.
//
// It runs before the graph is normalised (schedule.cpp), and only on graphs that hold a MULTI: a root that is a
// MULTI becomes one root per part, and its result is the MULTI of the parts' buffers.
#include <algorithm>
#include <atomic>
#include <optional>

#include "stages.hpp"
#include "tg/env.hpp"
#include "tg/multi.hpp"

namespace tg {

namespace {
std::atomic<size_t> g_allreduces{0};
}

size_t allreduces_lowered() { return g_allreduces.load(); }

AllreduceAlgo allreduce_algo(int64_t numel, size_t ndev) {
  std::string a = getenv_str("ALLREDUCE", "");
  if (a == "ring") return AllreduceAlgo::Ring;
  if (a == "naive") return AllreduceAlgo::Naive;
  if (!a.empty()) throw EnvError("[getenv] ALLREDUCE=" + a + ": expected ring or naive");
  return ndev > 2 && numel >= 256000 ? AllreduceAlgo::Ring : AllreduceAlgo::Naive;
}

namespace sched {

namespace {

using namespace pat;

struct MultiCtx {
  ShapeCache shapes;
  std::unordered_map<const UOp*, bool> free_memo;  // device-free graphs (no BUFFER or COPY below)
};

// The axis of a MULTI whose logical value is the sum of its parts (a sum across the sharded axis not yet
// allreduced): sums, concatenations (PAD + ADD) and movement ops of such values stay partial, so a fused optimizer's
// flat gradient (the gradients concatenated) is allreduced once. Any other use allreduces it first.
constexpr int64_t kPartial = -2;

[[noreturn]] void fail(const std::string& why) { throw Error("[multi] " + why); }

const std::vector<int64_t>& vec(const UOp* u) { return std::get<std::vector<int64_t>>(u->arg); }

// A MULTI node's parts, sharded axis and devices.
struct Mv {
  std::vector<UOpRef> parts;
  int64_t axis = -1;
  UOpRef dev;  // DEVICE("CPU,CPU:1")
  std::vector<std::string> devs;
};
Mv mv_of(const UOp* m) {
  Mv v;
  v.parts.assign(m->src().begin(), m->src().end() - 1);
  v.dev = m->src().back();
  v.axis = std::get<int64_t>(m->arg);
  v.devs = split_devices(std::get<std::string>(v.dev->arg));
  return v;
}
UOpRef make_multi(std::vector<UOpRef> parts, int64_t axis, const UOpRef& dev) {
  DType dt = parts[0]->dtype;
  parts.push_back(dev);
  return UOp::make(Ops::MULTI, dt, parts, axis);
}

bool device_free(MultiCtx& c, const UOp* u) {
  if (auto it = c.free_memo.find(u); it != c.free_memo.end()) return it->second;
  bool f = true;
  for (const UOp* n : toposort(u))
    if (n->op == Ops::BUFFER || n->op == Ops::COPY || n->op == Ops::MULTI) f = false;
  return c.free_memo[u] = f;
}

UOpRef dev_node(const std::string& d) { return UOp::make(Ops::DEVICE, dtypes::void_, {}, d); }
UOpRef copy_to(const UOpRef& x, const std::string& d) {
  UOpRef src = contiguous_buffer(x.get()) ? x : UOp::make(Ops::CONTIGUOUS, x->dtype, {x});
  return UOp::make(Ops::COPY, x->dtype, {src, dev_node(d)});
}
UOpRef shrink_axis(const UOpRef& x, const Shape& s, int64_t axis, int64_t lo, int64_t hi) {
  std::vector<int64_t> a;
  for (size_t k = 0; k < s.size(); k++) {
    a.push_back(int64_t(k) == axis ? lo : 0);
    a.push_back(int64_t(k) == axis ? hi : s[k]);
  }
  return UOp::make(Ops::SHRINK, x->dtype, {x}, a);
}
UOpRef pad_axis(const UOpRef& x, const Shape& s, int64_t axis, int64_t before, int64_t after) {
  std::vector<int64_t> a;
  for (size_t k = 0; k < s.size(); k++) {
    a.push_back(int64_t(k) == axis ? before : 0);
    a.push_back(int64_t(k) == axis ? after : 0);
  }
  for (int64_t d : s) a.push_back(d);  // PAD's argument also holds the input's dims
  return UOp::make(Ops::PAD, x->dtype, {x}, a);
}

// ALLREDUCE of the parts: one node per device (each lowered by lower_allreduce).
std::vector<UOpRef> allreduce(const std::vector<UOpRef>& parts, const UOpRef& dev, Ops op) {
  std::vector<UOpRef> srcs = parts, out;
  srcs.push_back(dev);
  for (size_t i = 0; i < parts.size(); i++)
    out.push_back(UOp::make(Ops::ALLREDUCE, parts[0]->dtype, srcs, std::vector<int64_t>{int64_t(op), int64_t(i)}));
  return out;
}
Mv settled(const Mv& v) {  // a partial sum allreduced (replicated); any other value as it is
  if (v.axis != kPartial) return v;
  return Mv{allreduce(v.parts, v.dev, Ops::ADD), -1, v.dev, v.devs};
}

// The whole logical value on device d.
UOpRef gather(MultiCtx& c, const Mv& pv, const std::string& d) {
  const Mv v = settled(pv);
  auto on_d = [&](size_t j) { return v.devs[j] == d ? v.parts[j] : copy_to(v.parts[j], d); };
  if (v.axis < 0) {
    for (size_t j = 0; j < v.devs.size(); j++)
      if (v.devs[j] == d) return v.parts[j];
    return on_d(0);
  }
  Shape s = c.shapes.of(v.parts[0].get());
  int64_t n = int64_t(v.parts.size()), sz = s[size_t(v.axis)];
  UOpRef acc;
  for (size_t j = 0; j < v.parts.size(); j++) {
    UOpRef p = pad_axis(on_d(j), s, v.axis, int64_t(j) * sz, (n - 1 - int64_t(j)) * sz);
    acc = acc ? acc->alu(Ops::ADD, p) : p;
  }
  return acc;
}

// v's parts sharded on `axis` (-1: replicated).
std::vector<UOpRef> to_axis(MultiCtx& c, const Mv& pv, int64_t axis) {
  if (pv.axis == axis) return pv.parts;
  const Mv v = settled(pv);
  if (v.axis == axis) return v.parts;
  std::vector<UOpRef> out;
  size_t n = v.parts.size();
  for (size_t i = 0; i < n; i++) {
    UOpRef full = v.axis < 0 ? v.parts[i] : gather(c, v, v.devs[i]);
    if (axis < 0) {
      out.push_back(full);
      continue;
    }
    Shape s = c.shapes.of(full.get());
    if (s[size_t(axis)] % int64_t(n))
      fail("axis " + std::to_string(axis) + " of shape " + shape_str(s) + " does not split over " + std::to_string(n) + " devices");
    int64_t sz = s[size_t(axis)] / int64_t(n);
    out.push_back(shrink_axis(full, s, axis, int64_t(i) * sz, int64_t(i + 1) * sz));
  }
  return out;
}

// An operand x brought to the layout (axis, devices) of a MULTI: its parts.
std::vector<UOpRef> parts_like(MultiCtx& c, const UOp* x, int64_t axis, const Mv& like) {
  if (x->op == Ops::MULTI) {
    Mv v = mv_of(x);
    if (v.devs != like.devs)
      fail("operands on different devices: " + join_devices(v.devs) + " and " + join_devices(like.devs));
    return to_axis(c, v, axis);
  }
  if (!device_free(c, x))
    fail("an operand on " + device_of(x) + " is used with a tensor on " + join_devices(like.devs) +
         ": move it there first (.shard() or .to())");
  Mv v{std::vector<UOpRef>(like.devs.size(), UOpRef(x)), -1, like.dev, like.devs};  // a constant: on every device
  return to_axis(c, v, axis);
}

const UOp* first_multi(const UOp* u) {
  for (auto& s : u->src())
    if (s->op == Ops::MULTI) return s.get();
  return nullptr;
}

// Elementwise ops (and CAST, BITCAST, CONTIGUOUS, DETACH, ASSIGN): one per device on the operands' parts.
UOpRef lower_elementwise(MultiCtx& c, const UOp* u) {
  const UOp* m = first_multi(u);
  if (!m) return {};
  Mv like = mv_of(m);
  if (u->op == Ops::ADD || u->op == Ops::DETACH || u->op == Ops::CONTIGUOUS) {  // partial sums stay partial
    bool all_partial = true;
    for (auto& s : u->src()) all_partial &= s->op == Ops::MULTI && std::get<int64_t>(s->arg) == kPartial;
    if (all_partial) {
      std::vector<UOpRef> parts;
      for (size_t i = 0; i < like.devs.size(); i++) {
        std::vector<UOpRef> src;
        for (auto& s : u->src()) src.push_back(s->src()[i]);
        parts.push_back(u->replace_src(src));
      }
      return make_multi(parts, kPartial, like.dev);
    }
  }
  int64_t axis = -1;
  if (u->op == Ops::ASSIGN) {
    if (u->src(0)->op != Ops::MULTI) fail("assign of a multi-device value into a tensor on one device");
    axis = like.axis;
  } else {
    for (auto& s : u->src())
      if (s->op == Ops::MULTI && std::get<int64_t>(s->arg) >= 0) {
        axis = std::get<int64_t>(s->arg);
        break;
      }
  }
  std::vector<std::vector<UOpRef>> srcs;
  for (auto& s : u->src()) srcs.push_back(parts_like(c, s.get(), axis, like));
  std::vector<UOpRef> parts;
  for (size_t i = 0; i < like.devs.size(); i++) {
    std::vector<UOpRef> src;
    for (auto& p : srcs) src.push_back(p[i]);
    parts.push_back(u->replace_src(src));
  }
  return make_multi(parts, axis, like.dev);
}

// Movement ops: per device, or on the gathered (replicated) value where the sharded axis cannot stay split.
UOpRef lower_movement(MultiCtx& c, const UOp* u) {
  if (u->src(0)->op != Ops::MULTI) return {};
  if (u->nsrc() > 1) fail(std::string(op_name(u->op)) + " with a symbolic shape of a multi-device tensor");
  Mv v = mv_of(u->src(0));
  const int64_t n = int64_t(v.parts.size()), a = v.axis;
  const Shape in = c.shapes.of(u->src(0)), out = c.shapes.of(u);
  auto each = [&](const std::vector<UOpRef>& parts, int64_t axis, Arg arg) {
    std::vector<UOpRef> ps;
    for (auto& p : parts) ps.push_back(UOp::make(u->op, u->dtype, {p}, arg));
    return make_multi(ps, axis, v.dev);
  };
  auto replicated = [&] { return each(to_axis(c, v, -1), -1, u->arg); };
  if (a < 0) return each(v.parts, a, u->arg);  // replicated, or a partial sum (movement commutes with the sum)
  std::vector<int64_t> arg = vec(u);
  switch (u->op) {
    case Ops::PERMUTE: {
      int64_t na = int64_t(std::find(arg.begin(), arg.end(), a) - arg.begin());
      return each(v.parts, na, arg);
    }
    case Ops::EXPAND: arg[size_t(a)] = in[size_t(a)] / n; return each(v.parts, a, arg);
    case Ops::FLIP: {
      if (!arg[size_t(a)]) return each(v.parts, a, arg);
      std::vector<UOpRef> ps;  // part i holds the flipped part n-1-i
      for (int64_t i = 0; i < n; i++) {
        UOpRef f = UOp::make(Ops::FLIP, u->dtype, {v.parts[size_t(n - 1 - i)]}, arg);
        ps.push_back(n - 1 - i == i ? f : copy_to(f, v.devs[size_t(i)]));
      }
      return make_multi(ps, a, v.dev);
    }
    case Ops::PAD:  // (before, after) per axis: a pad of other axes is the same for every part
      if (arg[2 * size_t(a)] || arg[2 * size_t(a) + 1]) return replicated();
      return each(v.parts, a, arg);
    case Ops::SHRINK:
      if (arg[2 * size_t(a)] != 0 || arg[2 * size_t(a) + 1] != in[size_t(a)]) return replicated();
      arg[2 * size_t(a) + 1] = in[size_t(a)] / n;
      return each(v.parts, a, arg);
    case Ops::RESHAPE: {
      // the sharded axis maps onto a new axis k when the dims before it hold as many elements, and k splits
      int64_t before = 1, acc = 1;
      for (int64_t k = 0; k < a; k++) before *= in[size_t(k)];
      for (size_t k = 0; k < out.size(); k++) {
        if (acc == before && out[k] % n == 0 && out[k] > 1) {
          arg[k] = out[k] / n;
          return each(v.parts, int64_t(k), arg);
        }
        acc *= out[k];
      }
      return replicated();
    }
    default: return {};
  }
}

// A reduction: per device; across the sharded axis, the partial results allreduced (replicated).
UOpRef lower_reduce(MultiCtx&, const UOp* u) {
  if (u->src(0)->op != Ops::MULTI) return {};
  Mv v = mv_of(u->src(0));
  const auto& ra = std::get<ReduceArg>(u->arg);
  if (v.axis == kPartial && ra.op != Ops::ADD) v = settled(v);  // a sum of a partial sum stays partial
  std::vector<UOpRef> partial;
  for (auto& p : v.parts) partial.push_back(UOp::make(Ops::REDUCE_AXIS, u->dtype, {p}, u->arg));
  if (v.axis < 0 || std::find(ra.axes.begin(), ra.axes.end(), v.axis) == ra.axes.end()) return make_multi(partial, v.axis, v.dev);
  if (ra.op == Ops::ADD) {  // allreduced where it is used; each device's sum in a buffer of its own (a concatenation
    for (UOpRef& p : partial) p = UOp::make(Ops::CONTIGUOUS, p->dtype, {p});  // of them is then a copy, not a kernel
    return make_multi(partial, kPartial, v.dev);                             // that runs every sum for each element)
  }
  if (ra.op != Ops::MAX && ra.op != Ops::MUL) fail(std::string("a ") + op_name(ra.op) + " reduction across the sharded axis");
  return make_multi(allreduce(partial, v.dev, ra.op), -1, v.dev);
}

// ALLREDUCE(x_0, ..., x_{n-1}, DEVICE) {op, i}: the reduction of all parts, on device i.
UOpRef lower_allreduce(MultiCtx& c, const UOp* u) {
  const Ops op = Ops(vec(u)[0]);
  const size_t i = size_t(vec(u)[1]), n = u->nsrc() - 1;
  if (i == 0) g_allreduces++;  // one count per allreduce (its device 0 node, lowered once per rewrite)
  const std::vector<std::string> devs = split_devices(std::get<std::string>(u->src(n)->arg));
  const Shape s = c.shapes.of(u->src(0));
  int64_t numel = 1;
  for (int64_t d : s) numel *= d;
  auto on = [&](const UOpRef& x, size_t from, size_t to) { return from == to ? x : copy_to(x, devs[to]); };
  if (allreduce_algo(numel, n) == AllreduceAlgo::Naive || numel < int64_t(n)) {
    UOpRef acc = on(u->src()[0], 0, i);
    for (size_t j = 1; j < n; j++) acc = acc->alu(op, on(u->src()[j], j, i));
    return acc;
  }
  std::vector<UOpRef> flat;
  for (size_t j = 0; j < n; j++) flat.push_back(UOp::make(Ops::RESHAPE, u->dtype, {u->src()[j]}, std::vector<int64_t>{numel}));
  UOpRef result;
  int64_t start = 0;
  for (size_t ch = 0; ch < n; ch++) {
    int64_t len = numel / int64_t(n) + (int64_t(ch) < numel % int64_t(n) ? 1 : 0), end = start + len;
    auto chunk = [&](size_t j) { return shrink_axis(flat[j], {numel}, 0, start, end); };
    UOpRef acc = chunk(ch);  // reduce-scatter: along the ring from device ch
    size_t at = ch;
    for (size_t k = 1; k < n; k++) {
      size_t d = (ch + k) % n;
      acc = on(acc, at, d)->alu(op, chunk(d));
      at = d;
    }
    UOpRef p = pad_axis(on(acc, at, i), {len}, 0, start, numel - end);  // all-gather from the chunk's owner
    result = result ? result->alu(Ops::ADD, p) : p;
    start = end;
  }
  return UOp::make(Ops::RESHAPE, u->dtype, {result}, std::vector<int64_t>(s));
}

UOpRef lower_copy(MultiCtx& c, const UOp* u) {
  if (u->src(0)->op != Ops::MULTI) return {};
  return gather(c, mv_of(u->src(0)), std::get<std::string>(u->src(1)->arg));
}

// MSELECT(x, DEVICE) {i, axis, n}: part i of x sharded on axis.
UOpRef lower_mselect(MultiCtx& c, const UOp* u) {
  const size_t i = size_t(vec(u)[0]);
  const int64_t axis = vec(u)[1];
  std::vector<std::string> devs = split_devices(std::get<std::string>(u->src(1)->arg));
  Mv like{{}, axis, u->src()[1], devs};
  const UOp* x = u->src(0);
  if (x->op != Ops::MULTI && !device_free(c, x)) {  // one device's value: the part copied over
    Mv v{std::vector<UOpRef>(devs.size(), UOpRef(x)), -1, like.dev, devs};
    UOpRef p = to_axis(c, v, axis)[i];
    return device_of(x) == devs[i] ? p : copy_to(p, devs[i]);
  }
  return parts_like(c, x, axis, like)[i];
}

// A gradient marker (a custom gradient's FUNCTION, CONTIGUOUS_BACKWARD): the value is its first source (gradients
// were taken before realize).
UOpRef lower_function(const UOp* u) { return first_multi(u) ? u->src()[0] : UOpRef{}; }

UOpRef refuse(const UOp* u) {
  if (first_multi(u)) fail(std::string(op_name(u->op)) + " of a multi-device tensor is not supported");
  return {};
}

// Every op but MULTI and the roots' SINK: refused when a multi-device source reaches it unhandled.
inline constexpr OpSet other_ops = [] {
  OpSet s;
  for (int i = 0; i < kNumOps; i++)
    if (Ops(i) != Ops::MULTI && Ops(i) != Ops::SINK) s = s.with(Ops(i));
  return s;
}();

const PatternMatcher& pm_multi() {
  static const PatternMatcher pm(table(
      rule(op_any<alu_ops | opset<Ops::CAST, Ops::BITCAST, Ops::CONTIGUOUS, Ops::DETACH, Ops::ASSIGN>>,
           [](auto& m) { return lower_elementwise(m.template ctx<MultiCtx>(), m.root); }),
      rule(op_any<opset<Ops::RESHAPE, Ops::PERMUTE, Ops::EXPAND, Ops::PAD, Ops::SHRINK, Ops::FLIP>>,
           [](auto& m) { return lower_movement(m.template ctx<MultiCtx>(), m.root); }),
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return lower_reduce(m.template ctx<MultiCtx>(), m.root); }),
      rule(op_any<opset<Ops::ALLREDUCE>>, [](auto& m) { return lower_allreduce(m.template ctx<MultiCtx>(), m.root); }),
      rule(op_any<opset<Ops::COPY>>, [](auto& m) { return lower_copy(m.template ctx<MultiCtx>(), m.root); }),
      rule(op_any<opset<Ops::MSELECT>>, [](auto& m) { return lower_mselect(m.template ctx<MultiCtx>(), m.root); }),
      rule(op_any<opset<Ops::FUNCTION, Ops::CONTIGUOUS_BACKWARD>>, [](auto& m) { return lower_function(m.root); }),
      rule(op_any<other_ops>, [](auto& m) { return refuse(m.root); })));
  return pm;
}

}  // namespace

std::optional<int> multi_axis(const UOpRef& u) {
  MultiCtx ctx;
  UOpRef r = rewrite_roots(std::span<const UOpRef>(&u, 1), pm_multi(), &ctx, "multi")[0];
  if (r->op != Ops::MULTI || std::get<int64_t>(r->arg) < 0) return std::nullopt;
  return int(std::get<int64_t>(r->arg));
}

bool has_multi(std::span<const UOp* const> topo) {
  return std::any_of(topo.begin(), topo.end(), [](const UOp* u) { return u->op == Ops::MULTI || u->op == Ops::MSELECT; });
}

MultiLowered lower_multi(std::span<const UOpRef> roots) {
  MultiCtx ctx;
  std::vector<UOpRef> low = rewrite_roots(roots, pm_multi(), &ctx, "multi");
  bool partial = false;  // a root that is a partial sum: allreduced (and that lowered)
  for (UOpRef& r : low)
    if (r->op == Ops::MULTI && std::get<int64_t>(r->arg) == kPartial) {
      Mv v = settled(mv_of(r.get()));
      r = make_multi(v.parts, -1, v.dev);
      partial = true;
    }
  if (partial) low = rewrite_roots(low, pm_multi(), &ctx, "multi");
  MultiLowered out;
  const std::string& def = default_device();
  for (size_t r = 0; r < low.size(); r++) {
    const UOp* u = low[r].get();
    MultiLowered::Root root;
    if (u->op != Ops::MULTI) {
      root.parts.push_back(out.roots.size());
      out.roots.push_back(low[r]);
      out.by_root.push_back(root);
      continue;
    }
    Mv v = mv_of(u);
    root.dev = v.dev;
    root.axis = v.axis;
    for (size_t i = 0; i < v.parts.size(); i++) {
      UOpRef p = v.parts[i];
      // a part without a buffer below (a constant's) would be computed on the default device: placed on its own
      if (device_free(ctx, p.get()) && v.devs[i] != def) p = copy_to(p, v.devs[i]);
      root.parts.push_back(out.roots.size());
      out.roots.push_back(p);
    }
    out.by_root.push_back(root);
  }
  return out;
}

}  // namespace sched

}  // namespace tg
