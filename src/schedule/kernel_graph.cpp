// The end of stage "bufferize to store": the kernel graph. Once every BUFFERIZE has its slot and the item that fills
// it, the graph is rewritten so that what orders the kernels is in it, as tinygrad's bufferize_to_store and
// split_kernels leave AFTER(BUFFER, KERNEL) nodes:
//   BUFFERIZE(value)  ->  AFTER(BUFFER slot, CALL item)             (pm_bufferize_after)
//   CALL item         =   CALL(outputs..., reads...), arg {item, number of outputs}
// A CALL's read is the buffer it reads: AFTER(BUFFER, CALL writer) for a value this schedule computes (RAW), the
// BUFFER alone for an input's contents before the schedule. An output written in place (an ASSIGN's target) whose old
// contents other kernels read is AFTER(BUFFER, CALL reader...) (WAR): the write comes after those reads. A
// multi-output kernel is one CALL under several AFTERs. The value itself is dropped: the CALL's item holds its AST
// (linearize puts it in the LINEAR's CALL).
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
void copy_old_contents(ScheduleCtx& ctx, std::unordered_map<int, size_t>& writer) {
  Template& t = ctx.t;
  for (size_t j = 0, n0 = t.items.size(); j < n0; j++) {
    for (size_t r = 0; r < t.items[j].old_reads.size(); r++) {
      int pos = t.items[j].old_reads[r];
      int sl = t.items[j].slots[size_t(pos)];
      auto w = writer.find(sl);
      if (sl >= ctx.n_inputs || w == writer.end() || w->second == j) continue;
      bool reads_new = false;
      for (size_t k = size_t(t.items[j].n_out); k < t.items[j].slots.size(); k++) reads_new |= t.items[j].slots[k] == sl && !reads_old(t.items[j], k);
      if (!reads_new) continue;
      const UOp* bnode = nullptr;
      for (auto& [node, v] : ctx.slot_of)
        if (v == sl && node->op == Ops::BUFFER) bnode = node;
      if (!bnode) continue;
      int copy = int(t.slots.size());
      const Slot old = t.slots[size_t(sl)];
      t.slots.push_back({-1, old.device, old.dtype, old.size});
      UOpRef dev = UOp::make(Ops::DEVICE, dtypes::void_, {}, old.device);
      t.items.push_back(Item{ScheduleItem::Kind::Copy, UOp::make(Ops::COPY, bnode->dtype, {UOpRef(bnode), dev}), {copy, sl},
                             old.device, {1}});
      t.items[j].slots[size_t(pos)] = copy;  // now a read of the copy's result: after the copy
      t.items[j].old_reads.erase(t.items[j].old_reads.begin() + std::ptrdiff_t(r--));
      writer[copy] = t.items.size() - 1;
    }
  }
}

struct GraphCtx {
  ScheduleCtx& c;
  std::unordered_map<int, size_t> writer;            // slot -> the (last) item that writes it
  std::unordered_map<int, std::vector<size_t>> old;  // input slot -> the items that read its old contents
  std::vector<UOpRef> calls;                          // item -> its CALL

  // the node a reader of slot sl reads: the buffer after its writer's CALL, or the buffer alone
  UOpRef read(int sl, bool old_contents, size_t reader) const {
    UOpRef b = slot_buffer(c.t, sl);
    auto w = writer.find(sl);
    if (old_contents || w == writer.end() || w->second == reader) return b;
    return UOp::make(Ops::AFTER, b->dtype, {b, calls.at(w->second)});
  }
  // the items item i runs after: the writers of what it reads, and the readers of the old contents it overwrites
  std::vector<size_t> deps(size_t i) const {
    const Item& it = c.t.items[i];
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
    const Item& it = c.t.items[i];
    std::vector<UOpRef> src;
    for (size_t k = 0; k < it.slots.size(); k++) {
      int sl = it.slots[k];
      if (k >= size_t(it.n_out)) {
        src.push_back(read(sl, reads_old(it, k), i));
        continue;
      }
      UOpRef b = slot_buffer(c.t, sl);
      std::vector<UOpRef> after{b};
      if (auto w = writer.find(sl); w != writer.end() && w->second == i && old.count(sl))
        for (size_t r : old.at(sl))
          if (r != i) after.push_back(calls.at(r));
      src.push_back(after.size() > 1 ? UOp::make(Ops::AFTER, b->dtype, after) : b);
    }
    return UOp::make(Ops::CALL, dtypes::void_, src, std::vector<int64_t>{int64_t(i), it.n_out});
  }
  // every item's CALL, each made after the CALLs it runs after (an iterative depth-first walk)
  void make_calls() {
    const size_t ni = c.t.items.size();
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

}  // namespace

void kernel_graph(ScheduleCtx& c) {
  GraphCtx g{c, {}, {}, {}};
  for (size_t i = 0; i < c.t.items.size(); i++)
    for (int k = 0; k < c.t.items[i].n_out; k++) g.writer[c.t.items[i].slots[size_t(k)]] = i;
  if (c.has_assign) copy_old_contents(c, g.writer);
  for (size_t i = 0; i < c.t.items.size(); i++)
    for (int pos : c.t.items[i].old_reads)
      if (int sl = c.t.items[i].slots[size_t(pos)]; sl < c.n_inputs) g.old[sl].push_back(i);
  g.make_calls();
  UOpRef sink = UOp::make(Ops::SINK, dtypes::void_, c.graph);
  c.kernels = graph_rewrite(sink, pm_bufferize_after(), &g, true, "bufferize to store");
}

}  // namespace tg::sched
