// Stage "realize map" of the scheduler: which nodes of the tensor graph are computed into buffers of their own.
// Every other node fuses into the kernel of the materialised node that reads it.
//
// The decisions are the rules of pm_realize_map, visited over the graph in topological order (graph_visit): each
// rule looks at one node, with what the rules decided about the nodes below it in the context (which are realised,
// which still carry an unrealised reduce), and marks. A node's rules run in table order. Then pm_add_bufferize,
// visited over the graph the same way, rebuilds it with each marked node wrapped in a BUFFERIZE whose arg carries
// what rangeify needs (the device, whether it is a result, its layout): the stage's output is that graph
// (ctx.graph), as tinygrad's rangeify marks what materialises with BUFFERIZE nodes.
#include <cstdio>
#include <functional>
#include <optional>

#include "stages.hpp"
#include "tg/env.hpp"
#include "tg/opt.hpp"

namespace tg::sched {

namespace {

struct RealizeCtx {
  ScheduleCtx& s;
  bool fuse_rows;
  NodeSet realized;   // the decisions: nodes computed into a buffer of their own
  NodeSet row_fused;  // EXPANDs of reduces that stay in their consumer's kernel (row fusion)
  std::unordered_map<std::string, bool> serial;  // device -> its output loops run in order
  std::unordered_map<const UOp*, bool> has_reduce;  // an unrealised reduce lies below (within the kernel)
  std::unordered_map<const UOp*, int> layout_copies;  // value -> CONTIGUOUS copies of views of it
  NodeSet read_as_stored;  // values a custom kernel or a copy reads (through views): their buffers' order is theirs
  // the node being visited
  bool hr = false;     // its value carries an unrealised reduce
  bool inner = false;  // an unrealised reduce lies below it
  bool row = false;    // it is a row-fused EXPAND

  bool is_realized(const UOp* u) const { return realized.count(u) != 0; }
  double numel(const UOp* u) const {
    double n = 1;
    for (int64_t d : s.shapes.at(u)) n *= double(d);
    return n;
  }
};

// Work of the kernel-local computation under `v`: ALU ops plus buffer reads (stops at realised nodes); 0 when
// it reads no buffer (an arange or a constant costs nothing to recompute).
int recompute_cost(const UOp* v, const NodeSet& realized) {
  std::vector<const UOp*> st{v};
  NodeSet seen;
  int alu = 0, reads = 0;
  while (!st.empty()) {
    const UOp* n = st.back();
    st.pop_back();
    if (!seen.insert(n).second) continue;
    if (n->op == Ops::BUFFER || (n != v && realized.count(n))) {
      reads++;
      continue;
    }
    if (is_alu(n->op) || n->op == Ops::CAST) alu += n->op == Ops::POW ? 20 : 1;  // POW lowers to ~20 ops (xpow)
    for (auto& s : n->src()) st.push_back(s.get());
  }
  return reads ? alu + reads : 0;
}

// Whether a value is decoded from stored bytes within its own expression: a BITCAST below it before any
// materialised node or reduce (a GGUF block's f16 scale read from the weight's bytes).
bool decoded_from_bytes(const UOp* v, const NodeSet& realized) {
  std::vector<const UOp*> st{v};
  NodeSet seen{v};
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

// Row fusion applies on devices whose output loops run in order (the CPU), to a broadcast of at most 128 KiB of
// floats per row (re-read from cache).
bool row_fusable(RealizeCtx& c, const UOp* u) {
  const Shape& in = c.s.shapes.at(u->src(0));
  const Shape& out = c.s.shapes.at(u);
  double copies = 1;
  for (size_t i = 0; i < in.size(); i++)
    if (in[i] == 1) copies *= double(out[i]);
  if (copies > double(1 << 15)) return false;
  std::string dev = device_of(u);
  if (!c.serial.count(dev)) c.serial[dev] = get_device(dev).renderer().grid_limits().threads == 0;
  return c.serial[dev];
}

// The reduces below `top` (down to buffers and realised nodes) are computed into buffers.
void realize_reduces_below(RealizeCtx& c, const UOp* top) {
  std::vector<const UOp*> st{top};
  NodeSet seen;
  while (!st.empty()) {
    const UOp* v = st.back();
    st.pop_back();
    if (!seen.insert(v).second || v->op == Ops::BUFFER || (c.is_realized(v) && v != top)) continue;
    if (v->op == Ops::REDUCE_AXIS) {
      c.realized.insert(v);
      continue;
    }
    for (auto& s : v->src()) st.push_back(s.get());
  }
}

// Fusion cost: computation under a broadcast runs again for every copy. When the copies' work (ALU ops and reads,
// times the copies) clearly exceeds a write and a read of the value, it is computed once into a buffer instead
// (e.g. relu(conv + bias) feeding the next conv, or a normalisation feeding a reduce). One op on a reduce's result
// (softmax's reciprocal of the sum) stays fused.
//
// Float values decoded from stored bytes (a BITCAST below: a quantised block's f16 scale) and copied along the
// innermost dims ((..., n, 1) -> (..., n, 32)) are consecutive elements: the matmul's reduce over them runs them in
// an inner loop (split ranges) or in the lanes of one vector, where the value is computed once; those copies do not
// count (quantised weights' scales stay fused), and the decoded weights themselves stay fused below 32 copies. Other broadcasts keep their cost: a batch norm's per-channel scale
// over H x W recomputed per element made beautiful_mnist's step 25% slower. Integer values (indices) still
// materialise: the one-hot fold reads them as loads.
void broadcast_cost(RealizeCtx& c, const UOp* u) {
  const UOp* v = u->src(0);
  while (is_movement(v->op) && !c.is_realized(v)) v = v->src(0);
  double copies = c.numel(u) / std::max(c.numel(u->src(0)), 1.0);
  const Shape& in_s = c.s.shapes.at(u->src(0));
  const Shape& out_s = c.s.shapes.at(u);
  double run = 1;
  for (size_t i = in_s.size(); i-- > 0 && in_s[i] == 1;) run *= double(out_s[i]);
  if (run >= 8 && dtypes::is_float(u->dtype) && decoded_from_bytes(v, c.realized)) copies /= run;
  int cost = (is_alu(v->op) || v->op == Ops::CAST) && !c.is_realized(v) ? recompute_cost(v, c.realized) : 0;
  // A value decoded from stored bytes (a quantised weight) broadcast over fewer than 32 copies (the rows of a short
  // prompt) stays fused: the product's register tile over the rows decodes each weight once per tile, while a
  // float32 buffer writes and reads back 4 bytes a weight against the 0.5-1 it is decoded from (1B-shaped q8_0
  // model, 1 thread: a 14-token prompt 2.1 -> 0.57 s, 23 tokens 7.4 -> 2.9 s). From 32 rows the layout rule's packed
  // product takes the buffer (src/schedule/layout.cpp, kPackMinRows).
  double limit = dtypes::is_float(u->dtype) && decoded_from_bytes(v, c.realized) ? 32 : 4;
  if (copies >= limit && cost >= 4) {
    c.realized.insert(v);
    c.hr = false;
  }
}

using Ctx = RealizeCtx;
inline Ctx& ctx_of(auto& m) { return m.template ctx<Ctx>(); }

/** The realize map's rules. Each returns null (it marks the context); all that match a node run, in this order. */
const PatternMatcher& pm_realize_map() {
  using namespace pat;
  static const PatternMatcher pm(table(
      // A computed value copied into two layouts (the layout stage's copies: a convolution's output gradient
      // stored channels-last for the weight gradient, and padded and channels-last for the input gradient's
      // transposed convolution) is computed once, and both copies read it: each copy recomputing it (a pool's
      // backward with its index arithmetic) cost 17% of an mnist step.
      rule(op_any<alu_ops | opset<Ops::CAST>>, [](auto& m) -> UOpRef {
        Ctx& c = ctx_of(m);
        if (auto it = c.layout_copies.find(m.root); it != c.layout_copies.end() && it->second > 1)
          c.realized.insert(m.root);
        return {};
      }),
      // contiguous, copies and in-place writes are buffers by definition, and so is a BUFFERIZE already in the
      // graph (a reduce whose row fusion a kernel refused: pm_refuse_row_fusion)
      rule(op_any<opset<Ops::CONTIGUOUS, Ops::COPY, Ops::ASSIGN, Ops::BUFFERIZE>>, [](auto& m) -> UOpRef {
        ctx_of(m).realized.insert(m.root);
        return {};
      }),
      // a custom kernel's outputs are buffers, and the sources it reads are realised before it (contiguous, as its
      // AST indexes them)
      rule(op_any<opset<Ops::CALL, Ops::AFTER>>, [](auto& m) -> UOpRef {
        Ctx& c = ctx_of(m);
        const UOp* u = m.root;
        if (u->op == Ops::AFTER) {
          if (is_custom_after(u)) c.realized.insert(u);
          return {};
        }
        if (std::get<int64_t>(u->arg) == kCallifyArg) return {};
        CallParams p = call_params(u, u->nsrc());
        for (size_t i = 0; i < u->nsrc(); i++)
          if (p.read[i] && !p.stored[i] && !contiguous_buffer(u->src(i))) c.realized.insert(u->src(i));
        return {};
      }),
      // a reduce read by several nodes runs once
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) -> UOpRef {
        if (ctx_of(m).s.consumers[m.root] > 1) ctx_of(m).realized.insert(m.root);
        return {};
      }),
      // what the node carries from below: an unrealised reduce in a source, or its own
      rule(op_any<all_ops>, [](auto& m) -> UOpRef {
        Ctx& c = ctx_of(m);
        const UOp* u = m.root;
        c.hr = u->op == Ops::REDUCE_AXIS && !c.is_realized(u);
        c.inner = c.row = false;
        for (auto& s : u->src())
          if (!c.is_realized(s.get()) && c.has_reduce[s.get()]) c.hr = c.inner = true;
        return {};
      }),
      // Row fusion: a reduce broadcast back over the axes it reduced (softmax's max and sum, layernorm's mean and
      // variance) stays in the kernel of its consumer when those axes are its innermost output loops: the reduce
      // runs once per row, before the row's output loop, and the row's second and third passes read it from cache.
      // pm_add_bufferize puts the EXPAND's source in a row BUFFERIZE. Kernels where the broadcast value would be
      // recomputed (the axes are not the inner ones after the movement ops above) are found by rangeify, and
      // pm_refuse_row_fusion materialises those reduces for the next pass. FUSE_REDUCE_ROWS=0: off.
      rule(op_any<opset<Ops::EXPAND>>, [](auto& m) -> UOpRef {
        Ctx& c = ctx_of(m);
        if (c.fuse_rows && c.hr && row_fusable(c, m.root)) {
          c.row_fused.insert(m.root);
          c.row = true;
          c.hr = false;  // computed once per row: no recompute for the rules below
        }
        return {};
      }),
      // An expanded reduce would be recomputed for every output element, and a reduce over a reduce's results
      // (a max pool over a convolution) nested inside the outer reduce's loops gets no register tile or vectors of
      // its own (a pool over an eval-mode conv ran 20x slower fused): the reduces below are computed into buffers.
      rule(op_any<opset<Ops::EXPAND, Ops::REDUCE_AXIS>>, [](auto& m) -> UOpRef {
        Ctx& c = ctx_of(m);
        const UOp* u = m.root;
        if (!((u->op == Ops::EXPAND && c.hr) || (u->op == Ops::REDUCE_AXIS && c.inner))) return {};
        realize_reduces_below(c, u->src(0));
        c.hr = u->op == Ops::REDUCE_AXIS && !c.is_realized(u);  // the outer reduce itself stays
        return {};
      }),
      rule(op_any<opset<Ops::EXPAND>>, [](auto& m) -> UOpRef {
        if (!ctx_of(m).row) broadcast_cost(ctx_of(m), m.root);
        return {};
      }),
      // A value with a reduce inside and several users would run its reduce once per user: computed once. A view
      // of it with several users (RoPE's even and odd halves of a projection, each read by both rotated halves:
      // the fused K projection ran its reduce 4 times per output) realises the value it views. Then the node's
      // state is final.
      rule(op_any<all_ops>, [](auto& m) -> UOpRef {
        Ctx& c = ctx_of(m);
        const UOp* u = m.root;
        if (c.hr && c.s.consumers[u] > 1 && !c.is_realized(u)) {
          const UOp* v = u;
          while (is_movement(v->op) && !c.is_realized(v)) c.has_reduce[v] = false, v = v->src(0);
          if (!c.is_realized(v)) c.realized.insert(v);
          c.hr = false;
        }
        c.has_reduce[u] = c.hr;
        return {};
      })));
  return pm;
}

// ---- pm_add_bufferize: the decisions as nodes of the graph

struct BufferizeCtx {
  const RealizeCtx& r;
  NodeSet outputs;                                 // the roots
  std::unordered_map<const UOp*, UOpRef> rebuilt;  // tensor graph node -> its node in the bufferized graph
  NodeSet followed;                                // materialised values stored in a followed layout
  std::unordered_map<const UOp*, std::vector<const UOp*>> readers;  // tensor graph node -> the nodes reading it
  bool have_readers = false;  // readers is filled on first use (padded_strides' candidates only)
};

// The layout the layout stage chose for a materialised value: a CONTIGUOUS of a view of a computed value stores
// it in the order of the view's permutation nearest the store (channels-last: (0, 2, 3, 1); a matmul operand's
// panels: (0, 2, 1) of (n/32, 32, k)).
std::vector<int64_t> stored_layout(const UOp* u) {
  if (u->op != Ops::CONTIGUOUS) return {};
  for (const UOp* v = u->src(0); is_movement(v->op); v = v->src(0))
    if (v->op == Ops::PERMUTE) return std::get<std::vector<int64_t>>(v->arg);
  return {};
}

// Whether an unrealised reduce lies below v (down to realised nodes): a row-fused EXPAND's reduce may have been
// realised after its visit (a reduce read by an outer one), and then the EXPAND reads a buffer.
bool keeps_reduce(const RealizeCtx& c, const UOp* v) {
  std::vector<const UOp*> st{v};
  NodeSet seen;
  while (!st.empty()) {
    const UOp* n = st.back();
    st.pop_back();
    if (!seen.insert(n).second || n->op == Ops::BUFFER || c.is_realized(n)) continue;
    if (n->op == Ops::REDUCE_AXIS) return true;
    for (auto& x : n->src()) st.push_back(x.get());
  }
  return false;
}

// The layout a materialised intermediate takes from the values it is computed from (FOLLOW_LAYOUTS=0: none):
// channels-last, (0, 2, ..., r - 1, 1), for a float value of shape (N, C, ...) with 8 or more channels on a serial
// device (the CPU) whose kernel reads a value of the same N and C stored channels-last: a convolution's result or
// a channels-last copy (a PERMUTE (0, r - 1, 1, ..., r - 2) of a materialised value), or a value that took this
// layout itself. Stored NCHW, its kernel's vectors along C load that value contiguously but store one element a
// row (rows H x W apart), and every later reader vectorised along C gathers it. mnist's batch norms and max pools
// between its convolutions (the pools' forward and backward values, the batch norms' backward sums) ran at 7-17
// GB/s so. Values read by a custom kernel or a copy (which index their buffers as stored) keep their order.
std::vector<int64_t> followed_layout(const RealizeCtx& c, const NodeSet& followed, const UOp* u, bool output) {
  if (output || !c.s.knobs.follow_layouts || !c.s.knobs.channels_last || !dtypes::is_float(u->dtype) ||
      c.read_as_stored.count(u))
    return {};
  const UOp* val = u;  // a BUFFERIZE in the graph (a reduce whose row fusion a kernel refused): its value
  if (u->op == Ops::BUFFERIZE) {
    const BufferizeOpts o = BufferizeOpts::of(u);
    if (o.output || o.row || !o.perm.empty()) return {};
    val = u->src(0);
  }
  if (!(is_alu(val->op) || val->op == Ops::CAST || val->op == Ops::REDUCE_AXIS)) return {};
  const Shape& us = c.s.shapes.at(u);
  const size_t r = us.size();
  if (r < 3 || us[1] < 8 || get_device(device_of(u)).renderer().grid_limits().threads != 0) return {};
  auto same_lead = [&](const UOp* v) { return c.s.shapes.at(v)[0] == us[0] && c.s.shapes.at(v)[1] == us[1]; };
  // a read-back view of a channels-last value: PERMUTE (0, r - 1, 1, ..., r - 2) over a materialised value
  auto reads_back = [&](const UOp* v) {
    if (v->op != Ops::PERMUTE || !same_lead(v)) return false;
    const auto& perm = std::get<std::vector<int64_t>>(v->arg);
    if (perm.size() < 3 || perm != inverse_permutation(channels_last_perm(perm.size()))) return false;
    const UOp* b = v->src(0);
    while (is_movement(b->op) && !c.is_realized(b)) b = b->src(0);
    return c.is_realized(b) || b->op == Ops::BUFFER;
  };
  std::vector<const UOp*> st{u};
  NodeSet seen{u};
  while (!st.empty()) {
    const UOp* v = st.back();
    st.pop_back();
    if (reads_back(v) || (v != u && followed.count(v) && same_lead(v))) return channels_last_perm(r);
    if (v->op == Ops::BUFFER || (v != u && c.is_realized(v))) continue;
    for (auto& x : v->src())
      if (seen.insert(x.get()).second) st.push_back(x.get());
  }
  return {};
}

// ---- padded planes: a materialised intermediate whose outer planes lie a multiple of 4 KiB apart, from 64 KiB,
// where a kernel reads across them (a few elements of each plane in its inner loops), is stored with each such
// plane a cache line further from the next (BufferizeOpts::strides), as BLAS libraries pad a leading dimension.
// Row-major, all those planes map to the same sets of L1 (a set spans 4 KiB of addresses) and of L2 (64 KiB), so
// the reader's lines evict each other however its loops are tiled: the Winograd input gradient read its (8, 8,
// C, N x 36) domain's 64 planes, 576 KiB apart, for every tile of its output (README, conv2d).

// A view of the materialised value u from a node above it: for each of the node's axes the loops it runs over u,
// outer to inner, each a size and a stride in u's row-major elements (0: broadcast). An axis is one loop, or
// several where a reshape merged axes that are not contiguous in u: a merged axis iterates its parts in order (the
// Winograd output's (N, Cout, ty, m, tx, m) read as (N, Cout, H, W) reads its m x m planes in the inner loops).
using Loop = std::pair<int64_t, int64_t>;
using StrideView = std::vector<std::vector<Loop>>;

// v reshaped to `to`: its loops of size > 1, contiguous neighbours joined, taken in order, an axis of `to` taking
// whole loops and the outer part of a loop it divides; nullopt where a size does not divide so
std::optional<StrideView> reshape_view(const StrideView& v, const Shape& to) {
  std::vector<Loop> in;
  for (const auto& axis : v)
    for (Loop l : axis)
      if (l.first == 1) continue;
      else if (!in.empty() && in.back().second == l.first * l.second) in.back() = {in.back().first * l.first, l.second};
      else in.push_back(l);
  StrideView out;
  size_t i = 0;
  for (int64_t n : to) {
    if (n <= 0) return std::nullopt;
    std::vector<Loop> axis;
    while (n > 1) {
      if (i >= in.size()) return std::nullopt;
      if (n % in[i].first == 0) {  // the whole loop
        n /= in[i].first;
        axis.push_back(in[i++]);
      } else if (in[i].first % n == 0) {  // the outer part of it
        axis.push_back({n, in[i].second * (in[i].first / n)});
        in[i].first /= n;
        n = 1;
      } else {
        return std::nullopt;
      }
    }
    if (axis.empty()) axis.push_back({1, 0});
    out.push_back(std::move(axis));
  }
  if (i != in.size()) return std::nullopt;
  return out;
}

// v's axis resized to n (a pad or a shrink): its outer loop, to cover n with the inner loops as they are
std::vector<Loop> resized(std::vector<Loop> axis, int64_t n) {
  int64_t inner = 1;
  for (size_t k = 1; k < axis.size(); k++) inner *= axis[k].first;
  axis[0].first = (n + inner - 1) / inner;
  return axis;
}

// Whether some kernel reads u across planes: along the loops of a kernel that reads it through views and
// elementwise ops (its output axes in order, a reduce's summed axes innermost), an axis whose stride is a plane's
// (plane(stride)) lies inside an axis of a smaller stride, and what the loops inside it span of u apart from
// other planes is 1 KiB or less: a few lines of each plane (16 at most, a quarter of L1's sets) before the next.
// (A direct convolution's weight gradient reads 2.3 KiB of each 72 KiB image plane, mnist's (512, 32, 24, 24): it
// stays row-major, its time the same either way within the VM's noise.)
bool read_across_planes(BufferizeCtx& b, const UOp* u, const std::function<bool(int64_t)>& plane) {
  if (!b.have_readers) {
    for (const UOp* n : b.r.s.topo)
      for (auto& x : n->src()) b.readers[x.get()].push_back(n);
    b.have_readers = true;
  }
  const Shape& us = b.r.s.shapes.at(u);
  StrideView v0(us.size());
  int64_t st = 1;
  for (size_t i = us.size(); i-- > 0;) v0[i] = {{us[i], st}}, st *= us[i];
  const int64_t item = int64_t(u->dtype.itemsize());
  auto across = [&](const StrideView& axes) {
    std::vector<Loop> loops;
    for (const auto& axis : axes) loops.insert(loops.end(), axis.begin(), axis.end());
    for (size_t j = 0; j < loops.size(); j++) {
      if (loops[j].first < 2 || !plane(loops[j].second)) continue;
      int64_t span = 0;
      for (size_t k = j + 1; k < loops.size(); k++)
        if (!plane(loops[k].second)) span += (loops[k].first - 1) * loops[k].second;
      bool outer_smaller = false;
      for (size_t i = 0; i < j; i++) outer_smaller |= loops[i].first > 1 && loops[i].second > 0 && loops[i].second < loops[j].second;
      if (outer_smaller && (span + 1) * item <= 1024) return true;
    }
    return false;
  };
  std::vector<std::pair<const UOp*, StrideView>> todo{{u, v0}};
  NodeSet seen{u};
  while (!todo.empty()) {
    auto [n, v] = todo.back();
    todo.pop_back();
    auto it = b.readers.find(n);
    if (it == b.readers.end()) continue;
    for (const UOp* c : it->second) {
      if (!seen.insert(c).second) continue;
      std::optional<StrideView> w;
      const Shape& cs = b.r.s.shapes.at(c);
      switch (c->op) {
        case Ops::RESHAPE: w = reshape_view(v, cs); break;
        case Ops::PERMUTE: {
          const auto& p = std::get<std::vector<int64_t>>(c->arg);
          w.emplace();
          for (int64_t a : p) w->push_back(v[size_t(a)]);
          break;
        }
        case Ops::EXPAND:
          w.emplace();
          for (size_t i = 0; i < cs.size(); i++)
            w->push_back(b.r.s.shapes.at(n)[i] == cs[i] ? v[i] : std::vector<Loop>{{cs[i], 0}});
          break;
        case Ops::PAD: case Ops::SHRINK: case Ops::FLIP:
          w.emplace();
          for (size_t i = 0; i < cs.size(); i++) w->push_back(resized(v[i], cs[i]));
          break;
        case Ops::REDUCE_AXIS: {
          const auto& axes = std::get<ReduceArg>(c->arg).axes;
          StrideView loops;
          for (size_t i = 0; i < v.size(); i++)
            if (std::find(axes.begin(), axes.end(), int64_t(i)) == axes.end()) loops.push_back(v[i]);
          for (int64_t a : axes) loops.push_back(v[size_t(a)]);
          if (across(loops)) return true;
          continue;
        }
        default:
          if ((is_alu(c->op) || c->op == Ops::CAST || c->op == Ops::CONTIGUOUS) && cs == b.r.s.shapes.at(n)) w = v;
      }
      if (!w) continue;
      if (b.r.is_realized(c)) {  // its kernel's loops: its own axes
        if (across(*w)) return true;
        continue;
      }
      todo.push_back({c, std::move(*w)});
    }
  }
  return false;
}

// The strides of a materialised intermediate float value u read across its planes (PAD_PLANES=0: none): row-major,
// each plane of 64 KiB or more whose size is a multiple of 4 KiB followed by one cache line. On a serial device
// (the CPU) only, for a value no copy or custom kernel reads as stored.
std::vector<int64_t> padded_strides(BufferizeCtx& b, const UOp* u, const UOp* val, bool output) {
  const RealizeCtx& c = b.r;
  if (output || !c.s.knobs.pad_planes || !dtypes::is_float(u->dtype) || c.read_as_stored.count(u)) return {};
  if (!(is_alu(val->op) || val->op == Ops::CAST || val->op == Ops::REDUCE_AXIS ||
        (val->op == Ops::CONTIGUOUS && !contiguous_buffer(val->src(0)))))
    return {};
  if (get_device(device_of(u)).renderer().grid_limits().threads != 0) return {};
  const Shape& s = c.s.shapes.at(u);
  if (s.size() < 2 || std::any_of(s.begin(), s.end(), [](int64_t d) { return d <= 0; })) return {};
  const int64_t item = int64_t(u->dtype.itemsize());
  auto plane = [&](int64_t stride) { return stride * item >= 65536 && stride * item % 4096 == 0; };
  bool any = false;
  std::vector<int64_t> st(s.size(), 1);
  for (size_t i = s.size() - 1; i-- > 0;) {
    st[i] = st[i + 1] * s[i + 1];
    any |= s[i] > 1 && plane(st[i]);
  }
  if (!any || !read_across_planes(b, u, plane)) return {};
  for (size_t i = s.size() - 1; i-- > 0;) {
    st[i] = st[i + 1] * s[i + 1];
    if (s[i] > 1 && plane(st[i])) st[i] += 64 / item;
  }
  return st;
}

const PatternMatcher& pm_add_bufferize() {
  using namespace pat;
  static const PatternMatcher pm(table(
      // x -> x with its sources' replacements, in a BUFFERIZE where the realize map materialises it; a row-fused
      // EXPAND(v) -> EXPAND(BUFFERIZE(v) row), v computed once per row in the reader's kernel
      rule(op_any<all_ops>, [](auto& m) -> UOpRef {
        auto& c = m.template ctx<BufferizeCtx>();
        const UOp* u = m.root;
        bool changed = false;
        std::vector<UOpRef> src = mapped_sources(u, c.rebuilt, changed);
        if (c.r.row_fused.count(u) && keeps_reduce(c.r, u->src(0))) {
          src[0] = bufferize(src[0], device_of(u), {false, true, {}});
          changed = true;
        }
        UOpRef v = changed ? u->replace_src(src) : UOpRef(u);
        if (c.r.is_realized(u)) {
          const bool out = c.outputs.count(u) != 0;
          if (std::vector<int64_t> perm = followed_layout(c.r, c.followed, u, out); !perm.empty()) {
            c.followed.insert(u);
            const UOpRef val = v->op == Ops::BUFFERIZE ? v->src()[0] : v;
            UOpRef stored = bufferize(UOp::make(Ops::PERMUTE, v->dtype, {val}, perm), device_of(u), {out, false, perm});
            v = UOp::make(Ops::PERMUTE, v->dtype, {stored}, inverse_permutation(perm));
          } else if (u->op != Ops::BUFFERIZE) {
            v = bufferize(v, device_of(u), {out, false, stored_layout(u), padded_strides(c, u, u, out)});
          } else if (BufferizeOpts o = BufferizeOpts::of(u); !o.row && o.perm.empty() && o.strides.empty()) {
            if (o.strides = padded_strides(c, u, u->src(0), o.output); !o.strides.empty())
              v = bufferize(v->src()[0], device_of(u), o);
          }
        }
        c.rebuilt.emplace(u, v);
        return {};
      })));
  return pm;
}

}  // namespace

void realize_map(ScheduleCtx& s) {
  RealizeCtx c{s, s.knobs.fuse_rows, {}, {}, {}, {}, {}, {}};
  for (auto& r : s.roots)  // the roots are the results
    if (!contiguous_buffer(r.get())) c.realized.insert(r.get());
  for (const UOp* u : s.topo) {  // the layout copies: a CONTIGUOUS of a view of a computed value
    if (u->op != Ops::CONTIGUOUS || !is_movement(u->src(0)->op)) continue;
    const UOp* v = u->src(0);
    while (is_movement(v->op)) v = v->src(0);
    c.layout_copies[v]++;
  }
  for (const UOp* u : s.topo) {  // what custom kernels and copies read
    if (u->op != Ops::CALL && u->op != Ops::COPY && u->op != Ops::AFTER) continue;
    for (auto& x : u->src()) {
      const UOp* v = x.get();
      while (is_movement(v->op)) v = v->src(0);
      c.read_as_stored.insert(v);
    }
  }
  graph_visit(s.topo, pm_realize_map(), &c, "realize map");
  BufferizeCtx b{c, {}, {}, {}, {}, false};
  for (auto& r : s.roots) b.outputs.insert(r.get());
  graph_visit(s.topo, pm_add_bufferize(), &b, "add bufferize");
  if (!s.graph.empty()) s.old_graphs.push_back(std::move(s.graph));  // a pass before: its nodes stay keys of shapes
  s.graph.clear();
  for (auto& r : s.roots) s.graph.push_back(b.rebuilt.at(r.get()));
  s.gtopo = toposort(s.graph);
  s.origin.clear();
  for (auto& [u, v] : b.rebuilt) {  // a BUFFERIZE's key: its value
    const UOp* from = v->op == Ops::BUFFERIZE ? v->src(0) : v.get();
    if (b.followed.count(u)) from = v->src(0)->src(0)->src(0);  // a followed layout: PERMUTE(BUFFERIZE(PERMUTE(value)))
    const UOp* to = u->op == Ops::BUFFERIZE ? u->src(0) : u;
    if (from != to) s.origin[from] = to;
  }
  for (const UOp* u : s.gtopo) {  // the new nodes' shapes (a BUFFERIZE's: its value's)
    if (s.shapes.count(u)) continue;
    std::vector<const Shape*> in;
    for (auto& x : u->src()) in.push_back(&s.shapes.at(x.get()));
    s.shapes[u] = infer_shape(u->op, in, u->arg, u->dtype);
  }
}

// ---- pm_refuse_row_fusion: a row BUFFERIZE a kernel would recompute (its reduce would run again for every output
// element) -> the reduces it keeps in the kernel materialise: BUFFERIZE in the tensor graph, for the next pass

namespace {

struct RefuseCtx {
  NodeSet reduces;                                 // the tensor graph's reduces to materialise
  std::unordered_map<const UOp*, UOpRef> rebuilt;  // tensor graph node -> its node in the next pass's graph
};

const PatternMatcher& pm_refuse_row_fusion() {
  using namespace pat;
  static const PatternMatcher pm(table(
      // x -> x with its sources' replacements; a reduce a kernel would recompute r -> BUFFERIZE(r, DEVICE)
      rule(op_any<all_ops>, [](auto& m) -> UOpRef {
        auto& c = m.template ctx<RefuseCtx>();
        const UOp* u = m.root;
        bool changed = false;
        std::vector<UOpRef> src = mapped_sources(u, c.rebuilt, changed);
        UOpRef v = changed ? u->replace_src(src) : UOpRef(u);
        if (c.reduces.count(u)) v = bufferize(v, device_of(u), {});
        c.rebuilt.emplace(u, std::move(v));
        return {};
      })));
  return pm;
}

}  // namespace

void refuse_row_fusion(ScheduleCtx& s, std::span<const UOp* const> row_bufferizes) {
  // the reduces each keeps in its kernel: those below it down to the kernel's loads (a reduce below another runs in
  // that one's kernel), as the tensor graph's nodes
  RefuseCtx c;
  std::vector<const UOp*> st;
  for (const UOp* b : row_bufferizes) st.push_back(b->src(0));
  NodeSet seen;
  while (!st.empty()) {
    const UOp* v = st.back();
    st.pop_back();
    if (!seen.insert(v).second || v->op == Ops::BUFFER || v->op == Ops::DEVICE || is_stored_bufferize(v)) continue;
    if (v->op == Ops::REDUCE_AXIS) {
      c.reduces.insert(s.origin.count(v) ? s.origin.at(v) : v);
      continue;
    }
    for (auto& x : v->src()) st.push_back(x.get());
  }
  // each row BUFFERIZE keeps a reduce (keeps_reduce): every pass materialises one more, and the passes end
  if (c.reduces.empty()) throw Error("[schedule] internal: a row fusion refused without a reduce to materialise");
  graph_visit(s.topo, pm_refuse_row_fusion(), &c, "refuse row fusion");
  s.old_graphs.push_back(s.roots);  // its nodes stay keys of shapes
  for (auto& r : s.roots) r = c.rebuilt.at(r.get());
  graph_facts(s);
}

}  // namespace tg::sched
