// Stages "order" and "plan memory" of the scheduler: the kernels in the order they run, and which buffers they
// share.
#include <algorithm>
#include <queue>

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
    for (int pos : t.items[j].old_reads) {
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
      t.items[j].slots[size_t(pos)] = copy;
      writer[copy] = t.items.size() - 1;
    }
  }
}

}  // namespace

// Order: a kernel runs after the kernels whose results it reads (RAW; an ASSIGN's result is its target buffer after
// the write), and an in-place write (ASSIGN) after every kernel that reads the old contents of its buffer (WAR). A
// stable topological sort: the graph's order wherever both allow it. Without an assign or a multi-output kernel (which
// runs where its last member was, after readers of its first) the graph's order is one.
void order_items(ScheduleCtx& ctx) {
  if (!ctx.has_assign && ctx.groups.empty()) return;
  Template& t = ctx.t;
  std::unordered_map<int, size_t> writer;  // slot -> the item that writes it
  for (size_t i = 0; i < t.items.size(); i++)
    for (int k = 0; k < t.items[i].n_out; k++) writer[t.items[i].slots[size_t(k)]] = i;
  copy_old_contents(ctx, writer);
  size_t ni = t.items.size();
  std::vector<std::vector<size_t>> next(ni);
  std::vector<int> deps(ni, 0);
  auto edge = [&](size_t a, size_t b) {
    if (a == b) return;
    next[a].push_back(b);
    deps[b]++;
  };
  for (size_t j = 0; j < ni; j++) {
    const Item& it = t.items[j];
    for (size_t k = size_t(it.n_out); k < it.slots.size(); k++) {
      int sl = it.slots[k];
      auto w = writer.find(sl);
      if (w == writer.end()) continue;
      bool old = reads_old(it, k);
      if (old && sl < ctx.n_inputs) edge(j, w->second);  // WAR: only an ASSIGN writes an input
      else if (!old) edge(w->second, j);                  // RAW
    }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < ni; i++)
    if (deps[i] == 0) ready.push(i);
  std::vector<size_t> order;
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t b : next[i])
      if (--deps[b] == 0) ready.push(b);
  }
  if (order.size() != ni) throw Error("[schedule] internal: the kernels' read/write order has a cycle");
  std::vector<Item> sorted;
  for (size_t i : order) sorted.push_back(std::move(t.items[i]));
  t.items = std::move(sorted);
}

// Memory planner: an intermediate buffer (not a root's, not an input) whose last reader has run can be reused by a
// later intermediate of the same device, dtype and size. An index check's record, and what a checked kernel reads,
// stay for the whole run: the records are read after it (one sync), and a hit's diagnostic kernel reads the
// checked kernel's inputs again; reusing one would make the run read its records before the overwrite.
void plan_memory(ScheduleCtx& ctx) {
  Template& t = ctx.t;
  const int n_inputs = ctx.n_inputs;
  std::vector<bool> exposed(t.slots.size(), false);
  for (auto& [r, sl] : t.becomes) exposed[size_t(sl)] = true;
  std::vector<bool> pinned(t.slots.size(), false);  // never freed: a checked kernel's inputs and record
  for (const auto& it : t.items)
    if (it.index_check)
      for (size_t k = size_t(it.n_out); k < it.slots.size(); k++) pinned[size_t(it.slots[k])] = true;
  std::vector<size_t> last_use(t.slots.size(), 0);
  for (size_t i = 0; i < t.items.size(); i++)
    for (int sl : t.items[i].slots) last_use[size_t(sl)] = i;
  std::vector<int> remap(t.slots.size());
  for (size_t i = 0; i < remap.size(); i++) remap[i] = int(i);
  std::vector<int> free_slots;
  for (size_t i = 0; i < t.items.size(); i++) {
    for (int k = 0; k < t.items[i].n_out; k++) {
      int out = t.items[i].slots[size_t(k)];
      if (out < n_inputs || exposed[size_t(out)] || remap[size_t(out)] != out) continue;
      const Slot& so = t.slots[size_t(out)];
      for (auto it = free_slots.begin(); it != free_slots.end(); ++it) {
        const Slot& sf = t.slots[size_t(*it)];
        if (sf.device == so.device && sf.dtype == so.dtype && sf.size == so.size) {
          remap[size_t(out)] = *it;
          free_slots.erase(it);
          break;
        }
      }
    }
    const std::vector<int>& ss = t.items[i].slots;
    for (int sl : ss)
      if (sl >= n_inputs && !exposed[size_t(sl)] && !pinned[size_t(sl)] && last_use[size_t(sl)] == i && remap[size_t(sl)] == sl &&
          std::find(free_slots.begin(), free_slots.end(), sl) == free_slots.end())
        free_slots.push_back(sl);
  }
  for (auto& it : t.items)
    for (int& sl : it.slots) sl = remap[size_t(sl)];
}

}  // namespace tg::sched
