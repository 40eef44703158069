// The end of stage "bufferize to store": the kernel graph. Once every BUFFERIZE has its slot and the item that fills
// it, the graph is rewritten so that what orders the kernels is in it, as tinygrad's bufferize_to_store and
// split_kernels leave AFTER(BUFFER, KERNEL) nodes:
//   BUFFERIZE(value)  ->  AFTER(BUFFER slot, CALL item)             (pm_bufferize_after)
//   CALL item         =   CALL(program, outputs..., reads..., diagnostic ASTs...)   (linear_call)
// A CALL holds what it runs (the kernel's AST, the copy's COPY): the graph alone is the schedule, no list beside it.
// A CALL's read is the buffer it reads: AFTER(BUFFER, CALL writer) for a value this schedule computes (RAW), the
// BUFFER alone for an input's contents before the schedule. An output written in place (an ASSIGN's target) whose old
// contents other kernels read is AFTER(BUFFER, CALL reader...) (WAR): the write comes after those reads. A
// multi-output kernel is one CALL under several AFTERs. The value itself is dropped: the CALL holds its AST.
#include <algorithm>

#include "tg/pattern.hpp"

#include "stages.hpp"

namespace tg::sched {

namespace {

using Item = Template::Item;

bool reads_old(const Item& it, size_t pos) {
  return std::find(it.old_reads.begin(), it.old_reads.end(), int(pos)) != it.old_reads.end();
}

// A kernel that reads a buffer both before and after an assign to it (a reader of the old values combined with the
// assigned tensor) reads the old values from a copy made before the write.
void copy_old_contents(ScheduleCtx& ctx, std::vector<Item>& items, std::unordered_map<int, size_t>& writer) {
  std::vector<Slot>& bufs = ctx.bufs;
  for (size_t j = 0, n0 = items.size(); j < n0; j++) {
    for (size_t r = 0; r < items[j].old_reads.size(); r++) {
      int pos = items[j].old_reads[r];
      int sl = items[j].slots[size_t(pos)];
      auto w = writer.find(sl);
      if (sl >= ctx.n_inputs || w == writer.end() || w->second == j) continue;
      bool reads_new = false;
      for (size_t k = size_t(items[j].n_out); k < items[j].slots.size(); k++) reads_new |= items[j].slots[k] == sl && !reads_old(items[j], k);
      if (!reads_new) continue;
      const UOp* bnode = nullptr;
      for (auto& [node, v] : ctx.slot_of)
        if (v == sl && node->op == Ops::BUFFER) bnode = node;
      if (!bnode) continue;
      int copy = int(bufs.size());
      const Slot old = bufs[size_t(sl)];
      bufs.push_back({-1, old.device, old.dtype, old.size});
      UOpRef dev = UOp::make(Ops::DEVICE, dtypes::void_, {}, old.device);
      items.push_back(Item{ScheduleItem::Kind::Copy, UOp::make(Ops::COPY, bnode->dtype, {UOpRef(bnode), dev}), {copy, sl},
                             old.device, {1}});
      items[j].slots[size_t(pos)] = copy;  // now a read of the copy's result: after the copy
      items[j].old_reads.erase(items[j].old_reads.begin() + std::ptrdiff_t(r--));
      writer[copy] = items.size() - 1;
    }
  }
}

struct GraphCtx {
  ScheduleCtx& c;
  std::vector<Item> items;
  std::unordered_map<int, size_t> writer;            // slot -> the (last) item that writes it
  std::unordered_map<int, std::vector<size_t>> old;  // input slot -> the items that read its old contents
  std::vector<UOpRef> calls;                          // item -> its CALL

  // the node a reader of slot sl reads: the buffer after its writer's CALL, or the buffer alone
  UOpRef read(int sl, bool old_contents, size_t reader) const {
    UOpRef b = slot_buffer(c.bufs, sl);
    auto w = writer.find(sl);
    if (old_contents || w == writer.end() || w->second == reader) return b;
    return UOp::make(Ops::AFTER, b->dtype, {b, calls.at(w->second)});
  }
  // the items item i runs after: the writers of what it reads, and the readers of the old contents it overwrites
  std::vector<size_t> deps(size_t i) const {
    const Item& it = items[i];
    std::vector<size_t> d;
    for (size_t k = 0; k < it.slots.size(); k++) {
      int sl = it.slots[k];
      auto w = writer.find(sl);
      if (k >= size_t(it.n_out) && !reads_old(it, k) && w != writer.end() && w->second != i) d.push_back(w->second);
      if (k < size_t(it.n_out) && w != writer.end() && w->second == i && old.count(sl))
        for (size_t r : old.at(sl))
          if (r != i) d.push_back(r);
    }
    return d;
  }
  UOpRef make_call(size_t i) const {
    const Item& it = items[i];
    std::vector<UOpRef> src;
    for (size_t k = 0; k < it.slots.size(); k++) {
      int sl = it.slots[k];
      if (k >= size_t(it.n_out)) {
        src.push_back(read(sl, reads_old(it, k), i));
        continue;
      }
      UOpRef b = slot_buffer(c.bufs, sl);
      std::vector<UOpRef> after{b};
      if (auto w = writer.find(sl); w != writer.end() && w->second == i && old.count(sl))
        for (size_t r : old.at(sl))
          if (r != i) after.push_back(calls.at(r));
      src.push_back(after.size() > 1 ? UOp::make(Ops::AFTER, b->dtype, after) : b);
    }
    return linear_call(it, std::move(src));
  }
  // every item's CALL, each made after the CALLs it runs after (an iterative depth-first walk)
  void make_calls() {
    const size_t ni = items.size();
    calls.assign(ni, nullptr);
    std::vector<char> state(ni, 0);  // 0: not seen, 1: its deps being made, 2: made
    for (size_t root = 0; root < ni; root++) {
      std::vector<size_t> st{root};
      while (!st.empty()) {
        size_t i = st.back();
        if (state[i] == 2) {
          st.pop_back();
          continue;
        }
        bool ready = true;
        for (size_t d : deps(i)) {
          if (state[d] == 1) throw Error("[schedule] internal: the kernels' read/write order has a cycle");
          if (state[d] == 0) st.push_back(d), ready = false;
        }
        if (ready) {
          calls[i] = make_call(i);
          state[i] = 2;
          st.pop_back();
          continue;
        }
        state[i] = 1;
      }
    }
  }
};

const PatternMatcher& pm_bufferize_after() {
  using namespace pat;
  static const PatternMatcher pm(table(
      // BUFFERIZE(value) -> AFTER(BUFFER, CALL): the buffer holding the value, after the kernel that stores it
      rule(op_any<opset<Ops::BUFFERIZE>>, [](auto& m) -> UOpRef {
        if (is_row_bufferize(m.root)) return {};  // inside its reader's kernel (a root is never one)
        const GraphCtx& g = m.template ctx<GraphCtx>();
        return g.read(value_slot(g.c, m.root), false, SIZE_MAX);
      })));
  return pm;
}

// The graph from its roots down to its stored BUFFERIZEs, each rewritten once by pm_bufferize_after, the nodes
// above them rebuilt (iterative). The walk stops at what the rules rewrite: below a BUFFERIZE is its value, which its
// CALL's program computes (a graph_rewrite would walk on into the CALLs' programs, and a copy's COPY reads the tensor
// graph's BUFFERIZEs, which stay as they are there).
UOpRef bufferize_after(const UOpRef& sink, GraphCtx& g) {
  std::unordered_map<const UOp*, UOpRef> memo;
  std::vector<std::pair<const UOp*, bool>> st{{sink.get(), false}};  // a node, whether its sources are pushed
  while (!st.empty()) {
    const UOp* u = st.back().first;
    if (memo.count(u)) {
      st.pop_back();
      continue;
    }
    if (!st.back().second) {
      if (UOpRef r = pm_bufferize_after().rewrite(u, &g)) {
        memo[u] = std::move(r);
        st.pop_back();
        continue;
      }
      st.back().second = true;
      for (auto& s : u->src())
        if (!memo.count(s.get())) st.emplace_back(s.get(), false);
      continue;
    }
    st.pop_back();
    bool changed = false;
    std::vector<UOpRef> src = mapped_sources(u, memo, changed);
    memo[u] = changed ? u->replace_src(src) : UOpRef(u);
  }
  return memo.at(sink.get());
}

}  // namespace

void kernel_graph(ScheduleCtx& c, std::vector<Item> items) {
  GraphCtx g{c, std::move(items), {}, {}, {}};
  for (size_t i = 0; i < g.items.size(); i++)
    for (int k = 0; k < g.items[i].n_out; k++) g.writer[g.items[i].slots[size_t(k)]] = i;
  if (c.has_assign) copy_old_contents(c, g.items, g.writer);
  for (size_t i = 0; i < g.items.size(); i++)
    for (int pos : g.items[i].old_reads)
      if (int sl = g.items[i].slots[size_t(pos)]; sl < c.n_inputs) g.old[sl].push_back(i);
  g.make_calls();
  c.kernels = bufferize_after(UOp::make(Ops::SINK, dtypes::void_, c.graph), g);
}

}  // namespace tg::sched
