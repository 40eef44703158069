// The scheduler: from the tensor graph under a realize's roots to a list of kernels. One list of named stages, run
// in order over one ScheduleCtx, as lower_kernel runs the lowering's (stages.hpp says which file holds each):
// early rewrites (bounds, split reduceop), the realize map (what materialises: BUFFERIZE nodes in the graph), bufferize
// to store (each BUFFERIZE a buffer and the kernel that stores it, built by rangeify: movement ops become index
// arithmetic, elementwise ops and reductions fuse), the kernels' order, and memory planning. The result is a
// template over buffer slots, cached by the graph's structure and instantiated with each realize's buffers. DEBUG=5
// prints each stage's output.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <list>
#include <mutex>
#include <optional>

#include "stages.hpp"
#include "tg/env.hpp"
#include "tg/opt.hpp"
#include "tg/variable.hpp"
#include "tg/viz.hpp"

namespace tg {

namespace sched {

std::vector<UOpRef> rewrite_roots(std::span<const UOpRef> roots, const PatternMatcher& pm, void* ctx, const char* name) {
  std::vector<UOpRef> out(roots.begin(), roots.end());
  UOpRef sink = graph_rewrite(UOp::make(Ops::SINK, dtypes::void_, out), pm, ctx, false, name);
  out.assign(sink->src().begin(), sink->src().end());
  return out;
}

Knobs Knobs::from_env() {
  Knobs k;
  k.packed_matmul = getenv_int("PACKED_MATMUL", 1) != 0;
  k.channels_last = getenv_int("CHANNELS_LAST", 1) != 0;
  k.conv_input_grad = getenv_int("CONV_INPUT_GRAD", 1) != 0;
  k.split_reduceop = getenv_int("SPLIT_REDUCEOP", 1) != 0;
  k.split_threshold = getenv_int("REDUCEOP_SPLIT_THRESHOLD", 16384, 1, INT64_MAX);
  k.fuse_rows = getenv_int("FUSE_REDUCE_ROWS", 1) != 0;
  k.simplify_valid = getenv_int("SIMPLIFY_VALID", 1) != 0;
  k.multi_output = getenv_int("MULTI_OUTPUT", 1) != 0;
  k.int_dot = getenv_int("INT_DOT", 1) != 0;
  k.share_layouts = getenv_int("SHARE_LAYOUTS", 1) != 0;
  k.int_gemm = getenv_int("INT_GEMM", 1) != 0;
  k.follow_layouts = getenv_int("FOLLOW_LAYOUTS", 1) != 0;
  k.pad_planes = getenv_int("PAD_PLANES", 1) != 0;
  return k;
}

std::string Knobs::key() const {
  return std::string(packed_matmul ? "p" : "-") + (channels_last ? "c" : "-") + (conv_input_grad ? "g" : "-") +
         (split_reduceop ? "s" : "-") +
         (fuse_rows ? "r" : "-") + (simplify_valid ? "v" : "-") + (multi_output ? "m" : "-") + (int_dot ? "i" : "-") +
         (share_layouts ? "l" : "-") + (int_gemm ? "q" : "-") + (follow_layouts ? "f" : "-") + (pad_planes ? "w" : "-") + std::to_string(split_threshold);
}

Arg BufferizeOpts::arg() const {
  std::vector<int64_t> a{int64_t(output) | int64_t(row) << 1 | int64_t(!strides.empty()) << 2};
  if (!strides.empty()) a.push_back(int64_t(perm.size()));
  a.insert(a.end(), perm.begin(), perm.end());
  a.insert(a.end(), strides.begin(), strides.end());
  return a;
}

BufferizeOpts BufferizeOpts::of(const UOp* b) {
  if (b->op != Ops::BUFFERIZE) throw Error(std::string("[schedule] internal: BufferizeOpts of ") + op_name(b->op));
  const auto& a = std::get<std::vector<int64_t>>(b->arg);
  BufferizeOpts o{(a.at(0) & 1) != 0, (a.at(0) & 2) != 0, {}, {}};
  if (!(a.at(0) & 4)) {
    o.perm.assign(a.begin() + 1, a.end());
    return o;
  }
  auto np = std::ptrdiff_t(a.at(1));
  o.perm.assign(a.begin() + 2, a.begin() + 2 + np);
  o.strides.assign(a.begin() + 2 + np, a.end());
  return o;
}

int64_t stored_numel(const Shape& s, const BufferizeOpts& o) {
  int64_t n = 1;
  if (o.strides.empty()) {
    for (int64_t d : s) n *= d;
    return n;
  }
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == 0) return 0;
    n += (s[i] - 1) * o.strides[i];
  }
  return n;
}

bool is_row_bufferize(const UOp* u) {
  return u->op == Ops::BUFFERIZE && (std::get<std::vector<int64_t>>(u->arg).at(0) & 2) != 0;
}

std::string BufferizeOpts::str() const {
  if (row) return "row: once per row, in its reader's kernel";
  std::string s = output ? "output" : "intermediate";
  auto list = [](const std::vector<int64_t>& v) {
    std::string l = "(";
    for (size_t i = 0; i < v.size(); i++) l += (i ? ", " : "") + std::to_string(v[i]);
    return l + ")";
  };
  s += perm.empty() ? ", as computed" : ", layout " + list(perm);
  return strides.empty() ? s : s + ", strides " + list(strides);
}

UOpRef bufferize(const UOpRef& value, const std::string& device, const BufferizeOpts& opts) {
  UOpRef dev = UOp::make(Ops::DEVICE, dtypes::void_, {}, device);
  return UOp::make(Ops::BUFFERIZE, value->dtype, {value, dev}, opts.arg());
}

std::vector<UOpRef> mapped_sources(const UOp* u, const std::unordered_map<const UOp*, UOpRef>& done, bool& changed) {
  std::vector<UOpRef> src;
  src.reserve(u->nsrc());
  for (auto& s : u->src()) {
    src.push_back(done.at(s.get()));
    changed |= src.back().get() != s.get();
  }
  return src;
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); i++) inv[size_t(perm[i])] = int64_t(i);
  return inv;
}

std::vector<int64_t> channels_last_perm(size_t rank) {
  std::vector<int64_t> perm{0};
  for (size_t i = 2; i < rank; i++) perm.push_back(int64_t(i));
  perm.push_back(1);
  return perm;
}

std::string device_of(const UOp* u) {
  if (u->op == Ops::BUFFERIZE) return std::get<std::string>(u->src(1)->arg);
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

void graph_facts(ScheduleCtx& c) {
  c.topo = toposort(c.roots);
  c.consumers.clear();
  for (const UOp* u : c.topo) {
    std::vector<const Shape*> in;
    for (auto& s : u->src()) {
      in.push_back(&c.shapes.at(s.get()));
      c.consumers[s.get()]++;
    }
    c.shapes[u] = infer_shape(u->op, in, u->arg, u->dtype);
  }
}

namespace {

// ---- the stages' drivers over the context

void run_split_reduceop(ScheduleCtx& c) {
  c.roots = split_reduceop(c.roots, c.knobs);
  graph_facts(c);
  // the graph's input buffers are the first slots, by their normalised number (an input the graph no longer
  // reads, one under a custom gradient's marker, keeps its number and an unused slot)
  for (const UOp* u : c.topo)
    if (u->op == Ops::BUFFER) c.n_inputs = std::max(c.n_inputs, int(-std::get<std::vector<int64_t>>(u->arg)[0]));
  for (int i = 0; i < c.n_inputs; i++) c.bufs.push_back({i, "", dtypes::void_, 0});
  for (const UOp* u : c.topo)
    if (u->op == Ops::BUFFER) {
      const auto& a = std::get<std::vector<int64_t>>(u->arg);
      int input = int(-1 - a[0]);
      if (input < 0)
        throw Error("[schedule] internal: a BUFFER that is not normalised (number " + std::to_string(a[0]) + ", device " +
                    std::get<std::string>(u->src(0)->arg) + ", " + u->dtype.name() + ")");
      c.slot_of[u] = input;
      c.bufs[size_t(input)] = {input, std::get<std::string>(u->src(0)->arg), u->dtype, a[1]};
    }
}

}  // namespace

int value_slot(const ScheduleCtx& c, const UOp* u) {  // the slot holding u's value (contiguous)
  if (auto it = c.slot_of.find(u); it != c.slot_of.end()) return it->second;
  if (u->op == Ops::BUFFERIZE) u = u->src(0);  // a view of a buffer stored as it is: the buffer
  if (const UOp* b = contiguous_buffer(u)) return c.slot_of.at(b);
  throw Error(std::string("[schedule] internal: no buffer for ") + op_name(u->op));
}

namespace {

// ---- stage "bufferize to store": each BUFFERIZE becomes the boundary of a kernel. Its value is computed by a kernel
// that STOREs it into a buffer slot of its own (a kernel AST built by rangeify: range propagation over the value, the
// BUFFERIZEs below read as LOADs of their slots), or copied into one, or it is a buffer already. pm_bufferize_to_store
// visits the bufferized graph's nodes in order: the rules of one BUFFERIZE give it a buffer number, then what fills it
// (an item, a CALL of the kernel graph once kernel_graph has ordered them).

struct StoreCtx {
  ScheduleCtx& c;
  std::vector<const UOp*> retry;  // row BUFFERIZEs a kernel would recompute
  const UOp* at = nullptr;  // the BUFFERIZE visited
  int slot = -1;          // its slot; -1: none yet (or none needed: a view of a buffer)
  bool aliased = false;   // its value is a buffer already: no item
  NodeSet grouped;        // the members of multi-output kernels (stored by their leader's)
  std::vector<Template::Item> items;  // what fills each buffer, in the graph's order: the kernel graph's CALLs
  std::unordered_map<const UOp*, std::vector<int>> call_slots;  // a custom kernel's CALL -> its sources' output slots

  int64_t numel(const UOp* b) const {
    return stored_numel(c.shapes.at(b), b->op == Ops::BUFFERIZE ? BufferizeOpts::of(b) : BufferizeOpts{});
  }
  StoreCtx& visit(const UOp* b) {  // the state of b (the first of its rules resets it)
    if (at != b) at = b, slot = -1, aliased = false;
    return *this;
  }
  // Whether b gets an item of its own: a slot, something to compute, not stored by its group's kernel.
  bool stores(const UOp* b) const { return slot >= 0 && !aliased && numel(b) != 0 && !grouped.count(b); }
  Template::Item item_for(const UOp* b) {
    Template::Item item{ScheduleItem::Kind::Kernel, {}, {slot}, c.bufs[size_t(slot)].device, {}};
    if (auto ms = group_members(b); !ms.empty()) {  // a multi-output kernel: the members' slots, then its own
      item.slots.clear();
      for (auto& m : ms) item.slots.push_back(c.slot_of.at(m.get()));
      item.slots.push_back(slot);
      item.n_out = int(item.slots.size());
    }
    return item;
  }
};

// The item storing b: its kernel, as rangeify builds it.
void kernel_item(StoreCtx& s, const UOp* b) {
  ScheduleCtx& c = s.c;
  Template::Item item = s.item_for(b);
  KernelAst k = rangeify(c, b);
  item.ast = k.ast;
  s.retry.insert(s.retry.end(), k.not_hoisted.begin(), k.not_hoisted.end());
  for (const UOp* p : k.params) {
    item.slots.push_back(value_slot(c, p));
    if (p->op == Ops::BUFFER) item.old_reads.push_back(int(item.slots.size() - 1));
  }
  if (k.index_check) {  // the hit record: a slot of its own, after the parameters
    item.slots.push_back(int(c.bufs.size()));
    c.bufs.push_back({-1, item.device, dtypes::int64, IndexCheck::kSlots});
    item.index_check = true;
    item.diags = std::move(k.diags);
  }
  s.items.push_back(std::move(item));
}

// The item of a custom kernel (Tensor::custom_kernel), made at the first of its outputs visited: a new slot for each
// source its AST stores, then the slots of the sources it reads, its PARAMs renumbered to those (outputs first).
// Each output BUFFERIZE(AFTER(source i, CALL)) is source i's slot: no item of its own.
void custom_call_item(StoreCtx& s, const UOp* b) {
  ScheduleCtx& c = s.c;
  const UOp* after = b->src(0);
  const UOp* call = after->src(1);
  auto [it, fresh] = s.call_slots.try_emplace(call);
  if (fresh) {
    CallParams p = call_params(call, call->nsrc());
    std::vector<int>& slots = it->second;
    slots.assign(call->nsrc(), -1);
    std::vector<int64_t> to(call->nsrc(), -1);
    Template::Item item{ScheduleItem::Kind::Kernel, {}, {}, device_of(b), {}};
    for (size_t k = 0; k < call->nsrc(); k++) {
      if (!p.stored[k]) continue;
      slots[k] = int(c.bufs.size());
      c.bufs.push_back({-1, item.device, call->src(k)->dtype, s.numel(call->src(k))});
      to[k] = int64_t(item.slots.size());
      item.slots.push_back(slots[k]);
    }
    item.n_out = int(item.slots.size());
    for (size_t k = 0; k < call->nsrc(); k++) {
      if (p.stored[k] || !p.read[k]) continue;
      to[k] = int64_t(item.slots.size());
      item.slots.push_back(value_slot(c, call->src(k)));
      if (contiguous_buffer(call->src(k))) item.old_reads.push_back(int(item.slots.size() - 1));  // the contents before
    }
    item.ast = renumber_params(call_ast(std::get<int64_t>(call->arg)), to);
    s.items.push_back(std::move(item));
  }
  s.slot = c.slot_of[b] = it->second.at(size_t(std::get<int64_t>(after->arg)));
  s.aliased = true;  // stored by the call's item
}

const PatternMatcher& pm_bufferize_to_store() {
  using namespace pat;
  static const PatternMatcher pm(table(
      // BUFFERIZE(AFTER(source, CALL)) -> a custom kernel's output: its slot, written by the call's one item
      rule(op_any<opset<Ops::BUFFERIZE>>, [](auto& m) -> UOpRef {
        if (!is_custom_after(m.root->src(0))) return {};
        custom_call_item(m.template ctx<StoreCtx>().visit(m.root), m.root);
        return {};
      }),
      // BUFFERIZE(CONTIGUOUS(view of a buffer)) -> the buffer's slot: already contiguous, no kernel
      rule(op<Ops::BUFFERIZE>(op<Ops::CONTIGUOUS>(x), y), [](auto& m) -> UOpRef {
        StoreCtx& s = m.template ctx<StoreCtx>().visit(m.root);
        if (const UOp* buf = contiguous_buffer(m.root->src(0)->src(0))) {
          s.slot = s.c.slot_of[m.root] = s.c.slot_of.at(buf);
          s.aliased = true;
        }
        return {};
      }),
      // BUFFERIZE(ASSIGN(target, value), ...) -> the target buffer's slot, written in place (a multi-output
      // kernel's leader has its members as further sources)
      rule(op_any<opset<Ops::BUFFERIZE>>, [](auto& m) -> UOpRef {
        if (m.root->src(0)->op != Ops::ASSIGN) return {};
        StoreCtx& s = m.template ctx<StoreCtx>().visit(m.root);
        const UOp* tb = assign_buffer(m.root->src(0)->src(0));
        if (!tb) throw Error("[assign] the target must be a realised buffer or a view of one");
        s.slot = s.c.slot_of[m.root] = s.c.slot_of.at(tb);
        s.c.has_assign = true;
        return {};
      }),
      // any other computed BUFFERIZE -> a new slot of its device, dtype and size (a view of a buffer needs none)
      rule(op_any<opset<Ops::BUFFERIZE>>, [](auto& m) -> UOpRef {
        StoreCtx& s = m.template ctx<StoreCtx>().visit(m.root);
        if (s.slot >= 0 || s.aliased || contiguous_buffer(m.root->src(0))) return {};
        s.slot = s.c.slot_of[m.root] = int(s.c.bufs.size());
        s.c.bufs.push_back({-1, device_of(m.root), m.root->dtype, s.numel(m.root)});
        return {};
      }),
      // BUFFERIZE(COPY(x, DEVICE)) -> a copy of x's slot into its slot
      rule(op<Ops::BUFFERIZE>(op<Ops::COPY>(x, y), z), [](auto& m) -> UOpRef {
        StoreCtx& s = m.template ctx<StoreCtx>().visit(m.root);
        if (!s.stores(m.root)) return {};
        const UOp* from = m.root->src(0)->src(0);
        Template::Item item = s.item_for(m.root);
        item.kind = ScheduleItem::Kind::Copy;
        item.slots.push_back(value_slot(s.c, from));
        if (contiguous_buffer(from)) item.old_reads.push_back(1);  // the contents before
        item.ast = m.root->src(0)->ref();
        s.items.push_back(std::move(item));
        return {};
      }),
      // BUFFERIZE(value) -> a kernel that STOREs the value into its slot
      rule(op_any<opset<Ops::BUFFERIZE>>, [](auto& m) -> UOpRef {
        StoreCtx& s = m.template ctx<StoreCtx>().visit(m.root);
        if (m.root->src(0)->op != Ops::COPY && s.stores(m.root)) kernel_item(s, m.root);
        return {};
      })));
  return pm;
}

// One item per BUFFERIZE that is not a buffer already, then the kernel graph (kernel_graph.cpp). False when a kernel
// would recompute a row-fused broadcast: those EXPANDs are refused row fusion, and the realize map runs again.
bool bufferize_to_store(ScheduleCtx& c) {
  c.bufs.resize(size_t(c.n_inputs));
  for (auto it = c.slot_of.begin(); it != c.slot_of.end();)
    it = it->first->op == Ops::BUFFER ? std::next(it) : c.slot_of.erase(it);
  c.has_assign = false;
  StoreCtx s{c};
  std::vector<const UOp*> nodes;  // the graph but its row BUFFERIZEs: those stay inside their readers' kernels
  for (const UOp* u : c.gtopo) {
    for (auto& m : group_members(u)) s.grouped.insert(m.get());
    if (!is_row_bufferize(u)) nodes.push_back(u);
  }
  graph_visit(nodes, pm_bufferize_to_store(), &s, "bufferize to store");
  if (!s.retry.empty()) {
    refuse_row_fusion(c, s.retry);
    return false;
  }
  kernel_graph(c, std::move(s.items));  // the graph with each BUFFERIZE as AFTER(BUFFER, CALL)
  return true;
}

struct ScheduleStage {
  const char* name;
  bool (*run)(ScheduleCtx&);  // false: run again from the realize map
};

// The scheduler, as tinygrad's get_kernel_graph: one list of named stages in order.
const std::vector<ScheduleStage>& schedule_stages() {
  static const std::vector<ScheduleStage> stages = {
      {"layouts", [](ScheduleCtx& c) { return c.roots = apply_layouts(c.roots, c.knobs), true; }},
      {"bounds", [](ScheduleCtx& c) { return c.roots = apply_bounds(c.roots), true; }},
      {"split reduceop", [](ScheduleCtx& c) { return run_split_reduceop(c), true; }},
      {"realize map", [](ScheduleCtx& c) { return realize_map(c), true; }},
      {"group outputs", [](ScheduleCtx& c) { return group_outputs(c), true; }},
      {"bufferize to store", bufferize_to_store},
      {"linearize", [](ScheduleCtx& c) { return linearize(c), true; }},
      {"plan memory", [](ScheduleCtx& c) { return plan_memory(c), true; }},
      {"items", [](ScheduleCtx& c) { return items_from_linear(c), true; }},
  };
  return stages;
}

void print_stage(const char* name, const ScheduleCtx& c) {
  std::fprintf(stderr, "--- schedule: %s\n", name);
  if (std::string(name) == "layouts" || std::string(name) == "bounds" || std::string(name) == "split reduceop") {
    std::fprintf(stderr, "%s", print_graph(UOp::make(Ops::SINK, dtypes::void_, c.roots).get()).c_str());
    return;
  }
  if (std::string(name) == "realize map") {  // the graph with its BUFFERIZE nodes, then one line for each
    std::fprintf(stderr, "%s", print_graph(UOp::make(Ops::SINK, dtypes::void_, c.graph).get()).c_str());
    size_t n = 0, rows = 0;
    for (const UOp* u : c.gtopo)
      if (u->op == Ops::BUFFERIZE)
        std::fprintf(stderr, "  %s %zu: %s %s on %s, %s\n", is_row_bufferize(u) ? "row BUFFERIZE" : "BUFFERIZE",
                     is_row_bufferize(u) ? rows++ : n++, op_name(u->src(0)->op), shape_str(c.shapes.at(u)).c_str(),
                     device_of(u).c_str(), BufferizeOpts::of(u).str().c_str());
    std::fprintf(stderr, "  %zu BUFFERIZE, %zu row-fused\n", n, rows);
    return;
  }
  if (std::string(name) == "group outputs") {  // the graph: a multi-output kernel's leader has its members as sources
    std::fprintf(stderr, "%s", print_graph(UOp::make(Ops::SINK, dtypes::void_, c.graph).get()).c_str());
    return;
  }
  if (std::string(name) == "bufferize to store") {  // the kernel graph
    std::fprintf(stderr, "%s", print_graph(c.kernels.get()).c_str());
    return;
  }
  if (std::string(name) == "linearize" || std::string(name) == "plan memory") {  // the LINEAR: a CALL per line
    std::fprintf(stderr, "  LINEAR\n");
    for (auto& call : c.linear->src()) {
      const Template::Item it = call_item(call.get());
      std::fprintf(stderr, "    CALL %s on %s, buffers", it.kind == ScheduleItem::Kind::Copy ? "copy" : "kernel",
                   it.device.c_str());
      for (int sl : it.slots) std::fprintf(stderr, " %d", sl);
      std::fprintf(stderr, ", program %s %s", op_name(it.ast->op), it.ast->key().c_str());  // the AST's content key
      if (it.index_check) std::fprintf(stderr, ", index check (%zu diagnostic kernels)", it.diags.size());
      std::fprintf(stderr, "\n");
    }
    return;
  }
  for (const Template::Item& it : c.t.items) {
    std::fprintf(stderr, "  %s on %s, slots", it.kind == ScheduleItem::Kind::Copy ? "copy" : "kernel", it.device.c_str());
    for (int s : it.slots) std::fprintf(stderr, " %d", s);
    std::fprintf(stderr, "\n");
  }
}

std::atomic<size_t> g_schedules_built{0};

Template build_template(std::span<const UOpRef> roots, const Knobs& knobs) {
  g_schedules_built++;
  ScheduleCtx ctx;
  ctx.knobs = knobs;
  ctx.roots.assign(roots.begin(), roots.end());
  const auto& stages = schedule_stages();
  const bool dbg5 = debug_level() >= 5;
  size_t again = 0;  // where a stage that returns false sends the schedule: the realize map
  while (std::string(stages[again].name) != "realize map") again++;
  for (size_t i = 0; i < stages.size();) {
    if (!stages[i].run(ctx)) {
      i = again;
      continue;
    }
    if (dbg5) print_stage(stages[i].name, ctx);
    i++;
  }
  if (debug_level() >= 3)
    for (auto& it : ctx.t.items)
      if (it.kind == ScheduleItem::Kind::Kernel) std::fprintf(stderr, "kernel AST:\n%s", print_graph(it.ast.get()).c_str());
  return std::move(ctx.t);
}

/** Templates by normalised graph (every BUFFER replaced by its order of appearance) and knobs. Bounded LRU. */
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

}  // namespace sched

using sched::Slot;
using sched::Template;

size_t schedules_built() { return sched::g_schedules_built.load(); }

Schedule create_schedule(std::span<const UOpRef> given_roots) {
  viz::Context vctx("schedule", "schedule");  // VIZ / PROFILE stage label
  profile::Span span("schedule", "create_schedule");
  std::span<const UOpRef> orig_roots = given_roots;
  std::vector<const UOp*> topo = toposort(orig_roots);
  std::vector<UOpRef> with_siblings;  // a callified tensor is realised with its CALL's other values (Tensor::callify)
  if (std::any_of(topo.begin(), topo.end(), is_callify_after)) {
    with_siblings = sched::with_callify_siblings(given_roots);
    orig_roots = with_siblings;
    topo = toposort(orig_roots);
  }
  std::span<const UOpRef> roots = orig_roots;
  std::optional<sched::MultiLowered> multi;  // stage "multi": per-device graphs
  if (sched::has_multi(topo)) {
    multi = sched::lower_multi(roots);
    roots = multi->roots;
    topo = toposort(roots);
  }
  // Normalise: the schedule depends on the graph's structure, not on which buffers it reads.
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
    // gradient markers: the value is the first source (NoGrad wraps every new tensor's node in a DETACH: left in,
    // they hid a convolution from the layout stage's rules, an inference's conv2d NCHW at 307 GFLOPS against 415)
    if (u->op == Ops::FUNCTION || u->op == Ops::CONTIGUOUS_BACKWARD || u->op == Ops::DETACH) {
      norm[u] = norm.at(u->src(0));
      continue;
    }
    if (is_callify_after(u)) {  // a callified value: the value itself (every value of its CALL is a root)
      norm[u] = norm.at(u->src(0));
      continue;
    }
    if (u->op == Ops::BIND) {  // the kernels take the variable; its value goes with the schedule
      norm[u] = u->src(0)->ref();
      continue;
    }
    bool changed = false;
    std::vector<UOpRef> src = sched::mapped_sources(u, norm, changed);
    if (u->op == Ops::CONTIGUOUS && std::holds_alternative<int64_t>(u->arg)) {  // unique ids by order too
      // a copy of a buffer (assign's copy on write, CONTIGUOUS(DETACH(buffer))) keeps its DETACH: without it the
      // copy would be the buffer itself
      if (u->src(0)->op == Ops::DETACH) src = {UOp::make(Ops::DETACH, u->src(0)->dtype, {norm.at(u->src(0)->src(0))})};
      norm[u] = UOp::make(Ops::CONTIGUOUS, u->dtype, src, -1 - int64_t(n_contig++));
      continue;
    }
    norm[u] = changed ? u->replace_src(src) : UOpRef(u);
  }
  std::vector<UOpRef> nroots;
  for (auto& r : roots) nroots.push_back(norm.at(r.get()));
  const sched::Knobs knobs = sched::Knobs::from_env();  // a template is built for one setting of them
  UOpRef key = UOp::make(Ops::SINK, dtypes::void_, nroots, knobs.key());
  std::shared_ptr<Template> t;
  sched::TemplateCache& tc = sched::template_cache();
  {
    std::lock_guard lk(tc.mu);
    if (auto it = tc.index.find(key.get()); it != tc.index.end()) {
      tc.lru.splice(tc.lru.begin(), tc.lru, it->second);
      t = it->second->second;
    }
  }
  if (!t) {
    t = std::make_shared<Template>(sched::build_template(nroots, knobs));
    std::lock_guard lk(tc.mu);
    tc.lru.emplace_front(key, t);
    tc.index[key.get()] = tc.lru.begin();
    while (tc.lru.size() > sched::TemplateCache::kMax) {
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
    si.index_check = it.index_check;
    si.index_diags = it.diags;
    si.n_out = size_t(it.n_out);
    for (int k = 0; k < it.n_out && k < int(it.slots.size()); k++)
      si.writes_existing |= t->slots[size_t(it.slots[size_t(k)])].input >= 0;
    for (int sl : it.slots) si.bufs.push_back(buffer_of(slot_uop[size_t(sl)].get()));
    sched.items.push_back(std::move(si));
  }
  for (auto& [r, sl] : t->becomes) {
    const Shape& s = t->root_shapes[r];
    const UOpRef& bu = slot_uop[size_t(sl)];
    if (roots[r]->op == Ops::ASSIGN && !contiguous_buffer(roots[r]->src(0))) {  // written through a view: that view
      sched.becomes.emplace_back(roots[r], roots[r]->src()[0]);
      continue;
    }
    if (const auto* sym = roots[r]->sym()) {  // the buffer at the largest dims, viewed with the root's symbolic ones
      std::vector<UOpRef> src{bu};
      src.insert(src.end(), sym->begin(), sym->end());
      sched.becomes.emplace_back(roots[r], UOp::make(Ops::RESHAPE, bu->dtype, src, std::vector<int64_t>(s)));
      continue;
    }
    bool flat = s.size() == 1 && s[0] == std::get<std::vector<int64_t>>(bu->arg)[1];
    sched.becomes.emplace_back(roots[r], flat ? bu : UOp::make(Ops::RESHAPE, bu->dtype, {bu}, std::vector<int64_t>(s)));
  }
  if (multi) {  // the original roots become their parts' results (a MULTI root: the MULTI of them)
    std::unordered_map<const UOp*, UOpRef> done;
    for (auto& [a, b] : sched.becomes) done[a.get()] = b;
    auto result = [&](size_t k) { return done.count(roots[k].get()) ? done.at(roots[k].get()) : roots[k]; };
    sched.becomes.clear();
    for (size_t r = 0; r < orig_roots.size(); r++) {
      const auto& br = multi->by_root[r];
      UOpRef b;
      if (br.dev) {
        std::vector<UOpRef> src;
        for (size_t k : br.parts) src.push_back(result(k));
        src.push_back(br.dev);
        b = UOp::make(Ops::MULTI, orig_roots[r]->dtype, src, br.axis);
      } else {
        b = result(br.parts[0]);
      }
      if (b != orig_roots[r]) sched.becomes.emplace_back(orig_roots[r], b);
    }
  }
  return sched;
}

}  // namespace tg
