// The scheduler: decide what materialises, then build one kernel AST per materialised node by
// "rangeify": the output's dimensions become RANGEs and every movement op between the output and the
// buffers it reads becomes index arithmetic on them. Elementwise ops and reductions fuse into the kernel.
#include "tg/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "tg/env.hpp"
#include "tg/symbolic.hpp"
#include "tg/tensor.hpp"

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

struct Access {
  std::vector<UOpRef> idx;
  UOpRef valid;  // null: always valid
};

struct AccessKey {
  const UOp* node;
  std::vector<const UOp*> parts;
  bool operator==(const AccessKey&) const = default;
};
struct AccessKeyHash {
  size_t operator()(const AccessKey& k) const {
    size_t h = std::hash<const void*>()(k.node);
    for (auto* p : k.parts) h = h * 1000003u ^ std::hash<const void*>()(p);
    return h;
  }
};

/** Builds the AST of one kernel. */
struct KernelBuilder {
  const ShapeMap& shapes;
  const std::unordered_set<const UOp*>& realized;
  const UOp* root;
  std::vector<const UOp*> params;  // realised nodes read (param i+1) ; param 0 is the output
  int next_range = 0;
  std::unordered_map<AccessKey, UOpRef, AccessKeyHash> memo;
  std::vector<Access> keep;

  int param_of(const UOp* m) {
    for (size_t i = 0; i < params.size(); i++)
      if (params[i] == m) return int(i) + 1;
    params.push_back(m);
    return int(params.size());
  }

  static AccessKey key(const UOp* n, const Access& a) {
    AccessKey k{n, {}};
    for (auto& i : a.idx) k.parts.push_back(i.get());
    k.parts.push_back(a.valid.get());
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
    UOpRef idx = UOp::make(Ops::INDEX, param->dtype, {param, linear(shapes.at(n), a)});
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
        for (size_t i = 0; i < in.size(); i++) {
          int64_t b = vec()[2 * i], e = vec()[2 * i + 1];
          c.idx.push_back(b ? a.idx[i]->alu(Ops::ADD, ci(-b)) : a.idx[i]);
          if (b > 0) pv = land(pv, ci(b - 1)->alu(Ops::CMPLT, a.idx[i]));
          if (e > 0) pv = land(pv, a.idx[i]->alu(Ops::CMPLT, ci(b + in[i])));
        }
        c.valid = land(a.valid, pv);
        break;
      }
      case Ops::SHRINK:
        for (size_t i = 0; i < in.size(); i++) c.idx.push_back(vec()[2 * i] ? add(a.idx[i], ci(vec()[2 * i])) : a.idx[i]);
        break;
      case Ops::FLIP:
        for (size_t i = 0; i < in.size(); i++)
          c.idx.push_back(vec()[i] ? ci(in[i] - 1)->alu(Ops::SUB, a.idx[i]) : a.idx[i]);
        break;
      default: throw Error(std::string("[schedule] not a movement op: ") + op_name(n->op));
    }
    return c;
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
              if (in[i] == 1) {
                c.idx.push_back(ci(0));
              } else {
                UOpRef r = UOp::range(ci(in[i]), 1000 + next_range++, AxisType::Reduce);
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
      bool ready = true;
      for (size_t i = 0; i < f.child.size(); i++) {
        if (!memo.count(key(src_of(i), f.child[i]))) {
          ready = false;
          Frame nf{src_of(i), f.child[i], {}, {}, {}, false};
          stack.push_back(std::move(nf));
        }
      }
      if (!ready) continue;
      Frame& g = stack.back();  // may have moved: re-fetch
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
    for (size_t i = 0; i < s.size(); i++)
      out.idx.push_back(s[i] == 1 ? ci(0) : UOp::range(ci(s[i]), int64_t(i), AxisType::Loop));
    UOpRef value = build(root, out);
    UOpRef param = UOp::make(Ops::PARAM, root->dtype.ptr_to(), {}, int64_t(0));
    UOpRef st = UOp::make(Ops::STORE, dtypes::void_, {UOp::make(Ops::INDEX, param->dtype, {param, linear(s, out)}), value});
    return UOp::make(Ops::SINK, dtypes::void_, {st});
  }
};

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
  static bool hooked = (set_buffer_free_hook(&on_buffer_free), true);
  (void)hooked;
  int64_t id = g_next_buffer++;
  auto b = std::make_shared<Buffer>(device, dtype, size);
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

Schedule create_schedule(std::span<const UOpRef> roots) {
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
  std::unordered_set<const UOp*> realized;
  for (auto& r : roots)
    if (!contiguous_buffer(r.get())) realized.insert(r.get());
  // Materialisation rules.
  std::unordered_map<const UOp*, bool> has_reduce;  // an unrealised reduce lies below (within the kernel)
  for (const UOp* u : topo) {
    if (u->op == Ops::CONTIGUOUS || u->op == Ops::COPY || u->op == Ops::ASSIGN) realized.insert(u);
    if (u->op == Ops::REDUCE_AXIS && consumers[u] > 1) realized.insert(u);
    bool hr = u->op == Ops::REDUCE_AXIS && !realized.count(u);
    for (auto& s : u->src())
      if (!realized.count(s.get()) && has_reduce[s.get()]) hr = true;
    if (u->op == Ops::EXPAND && hr) {
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
      hr = false;
    }
    has_reduce[u] = hr;
  }
  // Already materialised: buffers and views of them need no kernel.
  for (auto it = realized.begin(); it != realized.end();) {
    const UOp* u = *it;
    if (u->op == Ops::CONTIGUOUS && contiguous_buffer(u->src(0))) it = realized.erase(it);
    else ++it;
  }

  Schedule sched;
  std::unordered_map<const UOp*, std::shared_ptr<Buffer>> out_buf;
  std::unordered_map<const UOp*, UOpRef> buf_uop;  // realised node -> its BUFFER node
  std::unordered_map<const UOp*, size_t> item_of;
  for (const UOp* u : topo) {
    if (u->op == Ops::CONTIGUOUS && contiguous_buffer(u->src(0)) && !realized.count(u)) {
      sched.becomes.emplace_back(UOpRef(u), UOpRef(u->src(0)->op == Ops::BUFFER ? u->src(0) : u->src(0)));
      continue;
    }
    if (!realized.count(u) || contiguous_buffer(u)) continue;
    const Shape& s = shapes.at(u);
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    std::string device;
    UOpRef bu;
    if (u->op == Ops::ASSIGN) {
      const UOp* tb = contiguous_buffer(u->src(0));
      if (!tb) throw Error("[assign] the target must be a realised buffer");
      bu = UOpRef(tb);
    } else if (u->op == Ops::COPY) {
      bu = new_buffer_uop(std::get<std::string>(u->src(1)->arg), u->dtype, size_t(n));
    } else {
      const UOp* b = u;
      while (b->nsrc() && b->op != Ops::BUFFER) b = b->src(0);
      std::string dev = b->op == Ops::BUFFER ? std::get<std::string>(b->src(0)->arg) : default_device();
      bu = new_buffer_uop(dev, u->dtype, size_t(n));
    }
    device = std::get<std::string>(bu->src(0)->arg);
    buf_uop[u] = bu;
    if (n == 0) {  // nothing to compute
      sched.becomes.emplace_back(UOpRef(u), UOp::make(Ops::RESHAPE, u->dtype, {bu}, std::vector<int64_t>(s)));
      continue;
    }
    ScheduleItem item;
    item.device = device;
    item.bufs.push_back(buffer_of(bu.get()));
    if (u->op == Ops::COPY) {
      item.kind = ScheduleItem::Kind::Copy;
      const UOp* src = u->src(0);
      const UOp* sb = contiguous_buffer(src);
      if (!sb) sb = buf_uop.count(src) ? buf_uop.at(src).get() : nullptr;
      if (!sb) throw Error("[schedule] COPY of an unrealised value");
      item.bufs.push_back(buffer_of(sb));
      item.ast = UOpRef(u);
    } else {
      KernelBuilder kb{shapes, realized, u, {}, 0, {}, {}};
      item.ast = kb.kernel_ast();
      for (const UOp* p : kb.params) {
        const UOp* b = p->op == Ops::BUFFER ? p : buf_uop.count(p) ? buf_uop.at(p).get() : contiguous_buffer(p);
        if (!b) throw Error(std::string("[schedule] internal: no buffer for ") + op_name(p->op));
        item.bufs.push_back(buffer_of(b));
      }
    }
    buf_uop[u] = bu;
    item_of[u] = sched.items.size();
    sched.items.push_back(std::move(item));
    sched.becomes.emplace_back(UOpRef(u), s.size() == 1 && s[0] == n ? bu : UOp::make(Ops::RESHAPE, u->dtype, {bu}, std::vector<int64_t>(s)));
  }
  // Order: RAW edges (a kernel reads another's output) come from the topological order; an in-place write
  // (ASSIGN) must also wait for every kernel that reads the old contents of its buffer (WAR).
  std::vector<size_t> order(sched.items.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = i;
  for (size_t i = 0; i < sched.items.size(); i++) {
    const Buffer* target = sched.items[i].bufs[0].get();
    bool is_assign = false;
    for (auto& [u, idx] : item_of)
      if (idx == i && u->op == Ops::ASSIGN) is_assign = true;
    if (!is_assign) continue;
    // move i after the last later-or-earlier reader that does not depend on it
    size_t last = i;
    for (size_t j = i + 1; j < sched.items.size(); j++)
      for (size_t b = 1; b < sched.items[j].bufs.size(); b++)
        if (sched.items[j].bufs[b].get() == target) last = j;
    if (last != i) {
      auto pos = std::find(order.begin(), order.end(), i);
      order.erase(pos);
      order.insert(std::find(order.begin(), order.end(), last) + 1, i);
    }
  }
  std::vector<ScheduleItem> items;
  for (size_t i : order) items.push_back(std::move(sched.items[i]));
  sched.items = std::move(items);
  if (debug_level() >= 3)
    for (auto& it : sched.items)
      if (it.kind == ScheduleItem::Kind::Kernel) std::fprintf(stderr, "kernel AST:\n%s", print_graph(it.ast.get()).c_str());
  return sched;
}

}  // namespace tg
