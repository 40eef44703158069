// Stages "linearize", "plan memory" and "items" of the scheduler: the kernels in the order they run as one LINEAR of
// CALLs (tinygrad's linear schedule), the intermediate buffers they share as a rewrite of that LINEAR, and the
// template's items read back from it.
//
// A CALL of the LINEAR holds all it runs: CALL(program, buffers..., diagnostic ASTs...) (linear_call), the program
// the kernel's AST or the copy's COPY; the items are read back from the LINEAR alone. A buffer is a BUFFER node
// numbered as the normalised graph numbers its inputs, -1 - slot: the first slots are the graph's own input BUFFERs,
// the others the buffers the schedule makes; its device is the device the CALL runs on (its first output's).
#include <algorithm>
#include <queue>

#include "tg/pattern.hpp"

#include "stages.hpp"

namespace tg::sched {

UOpRef slot_buffer(const Template& t, int sl) {
  const Slot& s = t.slots[size_t(sl)];
  UOpRef dev = UOp::make(Ops::DEVICE, dtypes::void_, {}, s.device);
  return UOp::make(Ops::BUFFER, s.dtype, {dev}, std::vector<int64_t>{-1 - int64_t(sl), s.size});
}

int slot_number(const UOp* b) { return int(-1 - std::get<std::vector<int64_t>>(b->arg)[0]); }

UOpRef linear_call(const Template::Item& it, std::vector<UOpRef> buffers) {
  std::vector<int64_t> arg{it.n_out, int64_t(buffers.size()), int64_t(it.index_check)};
  std::vector<UOpRef> src{it.ast};
  src.insert(src.end(), buffers.begin(), buffers.end());
  for (const IndexDiag& d : it.diags) {
    src.push_back(d.ast);
    arg.insert(arg.end(), {d.code, d.size, int64_t(d.params.size())});
    arg.insert(arg.end(), d.params.begin(), d.params.end());
  }
  return UOp::make(Ops::CALL, dtypes::void_, src, arg);
}

std::span<const UOpRef> call_buffers(const UOp* call) {
  return call->src().subspan(1, size_t(std::get<std::vector<int64_t>>(call->arg).at(1)));
}

Template::Item call_item(const UOp* call) {
  const auto& a = std::get<std::vector<int64_t>>(call->arg);
  const UOpRef& program = call->src()[0];
  Template::Item it{program->op == Ops::COPY ? ScheduleItem::Kind::Copy : ScheduleItem::Kind::Kernel, program, {}, {}, {}};
  for (auto& b : call_buffers(call)) it.slots.push_back(slot_number(b.get()));
  it.device = std::get<std::string>(call->src(1)->src(0)->arg);
  it.n_out = int(a.at(0));
  it.index_check = a.at(2) != 0;
  for (size_t k = 1 + size_t(a.at(1)), p = 3; k < call->nsrc(); k++) {
    IndexDiag d{a.at(p), call->src()[k], a.at(p + 1), {}};
    d.params.assign(a.begin() + std::ptrdiff_t(p + 3), a.begin() + std::ptrdiff_t(p + 3 + size_t(a.at(p + 2))));
    p += 3 + d.params.size();
    it.diags.push_back(std::move(d));
  }
  return it;
}

namespace {

using Item = Template::Item;

// plan memory's rule: a buffer the plan gives another's storage becomes that buffer
struct MemoryPlan {
  const Template* t;
  std::vector<int> remap;  // slot -> the slot whose storage it takes
};

const PatternMatcher& pm_plan_memory() {
  using namespace pat;
  static const PatternMatcher pm(table(
      // CALL(program, buffers...) -> the CALL with each buffer the plan gives another's storage as that buffer
      rule(op_any<opset<Ops::CALL>>, [](auto& m) -> UOpRef {
        const MemoryPlan& p = m.template ctx<MemoryPlan>();
        std::vector<UOpRef> src(m.root->src().begin(), m.root->src().end());
        bool changed = false;
        for (size_t k = 1; k <= call_buffers(m.root).size(); k++) {
          int sl = slot_number(src[k].get());
          if (sl < 0 || size_t(sl) >= p.remap.size() || p.remap[size_t(sl)] == sl) continue;
          src[k] = slot_buffer(*p.t, p.remap[size_t(sl)]);
          changed = true;
        }
        return changed ? m.root->replace_src(src) : nullptr;
      })));
  return pm;
}

}  // namespace

// Stage "linearize": the kernel graph's CALLs in an order it allows (tinygrad's linearisation of the kernel graph). A
// CALL runs after the CALLs under the AFTERs among its sources: the writers of the buffers it reads (RAW) and, for a
// buffer it writes in place, the readers of the old contents (WAR). A stable topological sort (Kahn's, lowest item
// first): the graph's order wherever both allow it.
void linearize(ScheduleCtx& ctx) {
  const size_t ni = ctx.t.items.size();
  std::vector<const UOp*> call_of(ni, nullptr);
  for (const UOp* u : toposort(ctx.kernels.get()))
    if (u->op == Ops::CALL) call_of.at(size_t(std::get<std::vector<int64_t>>(u->arg)[0])) = u;
  std::vector<std::vector<size_t>> next(ni);
  std::vector<int> deps(ni, 0);
  for (size_t i = 0; i < ni; i++) {
    if (!call_of[i]) throw Error("[schedule] internal: kernel " + std::to_string(i) + " is not in the kernel graph");
    for (auto& s : call_of[i]->src())
      if (s->op == Ops::AFTER)
        for (size_t k = 1; k < s->nsrc(); k++) {
          next.at(size_t(std::get<std::vector<int64_t>>(s->src(k)->arg)[0])).push_back(i);
          deps[i]++;
        }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < ni; i++)
    if (deps[i] == 0) ready.push(i);
  std::vector<UOpRef> calls;
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    std::vector<UOpRef> bufs;  // the graph's CALL with its buffers as they are: the AFTERs' ordering is in the LINEAR's
    for (auto& s : call_of[i]->src()) bufs.push_back(s->op == Ops::AFTER ? s->src()[0] : s);
    calls.push_back(linear_call(ctx.t.items[i], std::move(bufs)));  // with what it runs
    for (size_t b : next[i])
      if (--deps[b] == 0) ready.push(b);
  }
  if (calls.size() != ni) throw Error("[schedule] internal: the kernels' read/write order has a cycle");
  ctx.linear = UOp::make(Ops::LINEAR, dtypes::void_, calls);
}

// Stage "plan memory": an intermediate buffer (not a root's, not an input) whose last reader has run can be reused by
// a later intermediate of the same device, dtype and size. An index check's record, and what a checked kernel reads,
// stay for the whole run: the records are read after it (one sync), and a hit's diagnostic kernel reads the checked
// kernel's inputs again; reusing one would make the run read its records before the overwrite. The plan is read off
// the LINEAR; a rewrite of the LINEAR (pm_plan_memory) puts it in place.
void plan_memory(ScheduleCtx& ctx) {
  const Template& t = ctx.t;
  const int n_inputs = ctx.n_inputs;
  const auto& calls = ctx.linear->src();
  std::vector<bool> exposed(t.slots.size(), false);
  for (auto& [r, sl] : t.becomes) exposed[size_t(sl)] = true;
  std::vector<bool> pinned(t.slots.size(), false);  // never freed: a checked kernel's inputs and record
  for (auto& call : calls)
    if (std::get<std::vector<int64_t>>(call->arg).at(2))  // an index check
      for (size_t k = size_t(std::get<std::vector<int64_t>>(call->arg)[0]); k < call_buffers(call.get()).size(); k++)
        pinned[size_t(slot_number(call_buffers(call.get())[k].get()))] = true;
  std::vector<size_t> last_use(t.slots.size(), 0);
  for (size_t i = 0; i < calls.size(); i++)
    for (auto& b : call_buffers(calls[i].get())) last_use[size_t(slot_number(b.get()))] = i;
  std::vector<bool> copied(t.slots.size(), false);  // read or written by a copy: a buffer of exactly its size
  for (auto& call : calls)
    if (call->src(0)->op == Ops::COPY)
      for (auto& b : call_buffers(call.get())) copied[size_t(slot_number(b.get()))] = true;
  MemoryPlan plan{&t, std::vector<int>(t.slots.size())};
  std::vector<int>& remap = plan.remap;  // slot -> the slot whose buffer holds it
  for (size_t i = 0; i < remap.size(); i++) remap[i] = int(i);
  std::vector<int> free_slots;  // buffers no live slot holds
  for (size_t i = 0; i < calls.size(); i++) {
    const auto& call = calls[i];
    const auto& a = std::get<std::vector<int64_t>>(call->arg);
    for (int k = 0; k < int(a[0]); k++) {
      int out = slot_number(call_buffers(call.get())[size_t(k)].get());
      if (out < n_inputs || exposed[size_t(out)] || remap[size_t(out)] != out) continue;
      const Slot& so = t.slots[size_t(out)];
      // the smallest free buffer of its device and dtype that holds it (a kernel reads and writes only the elements
      // its shape covers); a copy's buffers only of exactly their size
      auto best = free_slots.end();
      for (auto it = free_slots.begin(); it != free_slots.end(); ++it) {
        const Slot& sf = t.slots[size_t(*it)];
        bool fits = sf.size == so.size || (!copied[size_t(out)] && !copied[size_t(*it)] && sf.size > so.size);
        if (sf.device == so.device && sf.dtype == so.dtype && fits && (best == free_slots.end() || sf.size < t.slots[size_t(*best)].size))
          best = it;
      }
      if (best != free_slots.end()) {
        remap[size_t(out)] = *best;
        free_slots.erase(best);
      }
    }
    for (auto& b : call_buffers(call.get())) {  // a slot read for the last time frees the buffer that holds it
      int sl = slot_number(b.get());
      int held = remap[size_t(sl)];
      if (sl >= n_inputs && !exposed[size_t(sl)] && !pinned[size_t(sl)] && last_use[size_t(sl)] == i &&
          std::find(free_slots.begin(), free_slots.end(), held) == free_slots.end())
        free_slots.push_back(held);
    }
  }
  std::vector<UOpRef> planned;  // each CALL rewritten once (a walk of the whole LINEAR would visit the programs too)
  for (auto& call : calls) {
    UOpRef p = pm_plan_memory().rewrite(call.get(), &plan);
    planned.push_back(p ? p : call);
  }
  ctx.linear = ctx.linear->replace_src(planned);
}

// Stage "items": the template's items, read off the LINEAR alone (each CALL holds what it runs), in its order.
void items_from_linear(ScheduleCtx& ctx) {
  std::vector<Item> items;
  for (auto& call : ctx.linear->src()) items.push_back(call_item(call.get()));
  ctx.t.items = std::move(items);
}

}  // namespace tg::sched
