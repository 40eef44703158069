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

UOpRef slot_buffer(const std::vector<Slot>& bufs, int sl) {
  const Slot& s = bufs[size_t(sl)];
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
  std::vector<int> remap;           // slot -> the slot whose storage it takes
  std::vector<const UOp*> buffer;  // slot -> its BUFFER node in the LINEAR
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
          src[k] = p.buffer[size_t(p.remap[size_t(sl)])]->ref();
          changed = true;
        }
        return changed ? m.root->replace_src(src) : nullptr;
      })));
  return pm;
}

}  // namespace

// A buffer of the kernel graph or the LINEAR: the BUFFER itself, or the BUFFER under an AFTER.
const UOp* buffer_node(const UOp* u) {
  if (u->op == Ops::AFTER) u = u->src(0);
  if (u->op != Ops::BUFFER) throw Error(std::string("[schedule] internal: a kernel's buffer is a ") + op_name(u->op));
  return u;
}

// The kernel graph's CALLs, each after those it runs after (a depth-first walk from the SINK's roots, sources in
// order, iterative; a CALL's program is not walked: only its buffers).
std::vector<const UOp*> kernel_calls(const UOp* kernels) {
  std::vector<const UOp*> order;
  std::unordered_set<const UOp*> seen{kernels};
  std::vector<std::pair<const UOp*, size_t>> st{{kernels, 0}};
  while (!st.empty()) {
    auto& [u, next] = st.back();
    std::span<const UOpRef> src = u->op == Ops::CALL ? call_buffers(u) : u->src();
    if (u->op == Ops::BUFFER || next == src.size()) {
      if (u->op == Ops::CALL) order.push_back(u);
      st.pop_back();
      continue;
    }
    const UOp* s = src[next++].get();
    if (seen.insert(s).second) st.emplace_back(s, 0);
  }
  return order;
}

// Stage "linearize": the kernel graph's CALLs in an order it allows (tinygrad's linearisation of the kernel graph). A
// CALL runs after the CALLs under the AFTERs among its buffers: the writers of the buffers it reads (RAW) and, for a
// buffer it writes in place, the readers of the old contents (WAR). A stable topological sort (Kahn's, earliest in
// the kernel graph's walk first).
void linearize(ScheduleCtx& ctx) {
  const std::vector<const UOp*> call_of = kernel_calls(ctx.kernels.get());
  const size_t ni = call_of.size();
  std::unordered_map<const UOp*, size_t> index;
  for (size_t i = 0; i < ni; i++) index[call_of[i]] = i;
  std::vector<std::vector<size_t>> next(ni);
  std::vector<int> deps(ni, 0);
  for (size_t i = 0; i < ni; i++)
    for (auto& s : call_buffers(call_of[i]))
      if (s->op == Ops::AFTER)
        for (size_t k = 1; k < s->nsrc(); k++) {
          next.at(index.at(s->src(k))).push_back(i);
          deps[i]++;
        }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < ni; i++)
    if (deps[i] == 0) ready.push(i);
  std::vector<UOpRef> calls;
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    // the CALL with its buffers as they are: the AFTERs' ordering is in the LINEAR's
    const UOp* c = call_of[i];
    std::vector<UOpRef> src(c->src().begin(), c->src().end());
    for (size_t k = 1; k <= call_buffers(c).size(); k++) src[k] = buffer_node(src[k].get())->ref();
    calls.push_back(c->replace_src(src));
    for (size_t b : next[i])
      if (--deps[b] == 0) ready.push(b);
  }
  if (calls.size() != ni) throw Error("[schedule] internal: the kernels' read/write order has a cycle");
  ctx.linear = UOp::make(Ops::LINEAR, dtypes::void_, calls);
}

// The facts of a BUFFER of the LINEAR.
Slot buffer_slot(const UOp* b) {
  return {-1, std::get<std::string>(b->src(0)->arg), b->dtype, std::get<std::vector<int64_t>>(b->arg).at(1)};
}

}  // namespace tg::sched

namespace tg {

std::vector<int> plan_reuse(const std::vector<ReuseBuffer>& bufs, const std::vector<std::vector<int>>& steps,
                            const std::vector<size_t>& n_out) {
  const size_t n = bufs.size();
  std::vector<int> remap(n), last(n, -1);  // buffer -> the buffer whose storage holds it; its last step
  for (size_t b = 0; b < n; b++) remap[b] = int(b);
  for (size_t i = 0; i < steps.size(); i++)
    for (int b : steps[i]) last[size_t(b)] = int(i);
  std::vector<bool> seen(n, false), read_first(n, false);  // read_first: holds a value from before the steps
  std::vector<int> free_storage;  // storage no live buffer holds
  for (size_t i = 0; i < steps.size(); i++) {
    for (size_t k = 0; k < steps[i].size(); k++) {
      const size_t b = size_t(steps[i][k]);
      if (seen[b]) continue;
      seen[b] = true;
      read_first[b] = k >= n_out[i];
      if (read_first[b] || !bufs[b].take) continue;
      const ReuseBuffer& want = bufs[b];
      auto best = free_storage.end();
      for (auto it = free_storage.begin(); it != free_storage.end(); ++it) {
        const ReuseBuffer& f = bufs[size_t(*it)];
        bool fits = f.size == want.size || (!want.exact && !f.exact && f.size > want.size);
        if (f.device == want.device && f.dtype == want.dtype && fits &&
            (best == free_storage.end() || f.size < bufs[size_t(*best)].size))
          best = it;
      }
      if (best != free_storage.end()) {
        remap[b] = *best;
        free_storage.erase(best);
      }
    }
    for (int b : steps[i])  // a buffer touched for the last time frees the storage that holds it
      if (bufs[size_t(b)].release && !read_first[size_t(b)] && last[size_t(b)] == int(i) &&
          std::find(free_storage.begin(), free_storage.end(), remap[size_t(b)]) == free_storage.end())
        free_storage.push_back(remap[size_t(b)]);
  }
  return remap;
}

}  // namespace tg

namespace tg::sched {

// Stage "plan memory": an intermediate buffer (not a root's, not an input) whose last reader has run can be reused by
// a later intermediate of the same device, dtype and size (plan_reuse). An index check's record, and what a checked
// kernel reads, stay for the whole run: the records are read after it (one sync), and a hit's diagnostic kernel reads
// the checked kernel's inputs again; reusing one would make the run read its records before the overwrite. A copy's
// buffers are reused only at exactly their size. The plan is read off the LINEAR (its BUFFER nodes: device, dtype,
// size) and the kernel graph's roots (the buffers the schedule's results are); a rewrite of the LINEAR
// (pm_plan_memory) puts it in place.
void plan_memory(ScheduleCtx& ctx) {
  const int n_inputs = ctx.n_inputs;
  const auto& calls = ctx.linear->src();
  MemoryPlan plan;
  for (auto& call : calls)
    for (auto& b : call_buffers(call.get())) {
      size_t sl = size_t(slot_number(b.get()));
      if (sl >= plan.buffer.size()) plan.buffer.resize(sl + 1, nullptr);
      plan.buffer[sl] = b.get();
    }
  const size_t n = plan.buffer.size();
  std::vector<ReuseBuffer> bufs(n);
  for (size_t sl = 0; sl < n; sl++) {
    if (!plan.buffer[sl]) continue;  // a number no CALL names: never touched
    const Slot s = buffer_slot(plan.buffer[sl]);
    bufs[sl] = {s.device, s.dtype, s.size, false, int(sl) >= n_inputs, int(sl) >= n_inputs};
  }
  for (auto& r : ctx.kernels->src())  // a result's buffer (the kernel graph's roots) is neither
    if (const UOp* b = r->op == Ops::AFTER ? r->src(0) : r.get(); b->op == Ops::BUFFER)
      if (size_t sl = size_t(slot_number(b)); sl < n) bufs[sl].take = bufs[sl].release = false;
  std::vector<std::vector<int>> steps;
  std::vector<size_t> n_out;
  for (auto& call : calls) {
    const auto& a = std::get<std::vector<int64_t>>(call->arg);
    std::vector<int>& step = steps.emplace_back();
    for (auto& b : call_buffers(call.get())) step.push_back(slot_number(b.get()));
    n_out.push_back(size_t(a.at(0)));
    for (size_t k = size_t(a[0]); a.at(2) && k < step.size(); k++) bufs[size_t(step[k])].release = false;  // checked
    if (call->src(0)->op == Ops::COPY)
      for (int sl : step) bufs[size_t(sl)].exact = true;
  }
  plan.remap = plan_reuse(bufs, steps, n_out);
  std::vector<UOpRef> planned;  // each CALL rewritten once (a walk of the whole LINEAR would visit the programs too)
  for (auto& call : calls) {
    UOpRef p = pm_plan_memory().rewrite(call.get(), &plan);
    planned.push_back(p ? p : call);
  }
  ctx.linear = ctx.linear->replace_src(planned);
}

// Stage "items": the template read off the LINEAR (each CALL holds what it runs, over BUFFER nodes holding their
// device, dtype and size) and the kernel graph's roots (the buffers the results are). The buffers are numbered anew:
// the graph's inputs keep their numbers, the others in the order the LINEAR first names them (a buffer the plan
// folded into another is gone), then a result no CALL writes (an empty one).
void items_from_linear(ScheduleCtx& ctx) {
  Template t;
  std::unordered_map<int, int> number;  // the LINEAR's buffer number -> the template's slot
  for (int i = 0; i < ctx.n_inputs; i++) {
    t.slots.push_back({i, "", dtypes::void_, 0});
    number[i] = i;
  }
  auto slot = [&](const UOp* b) {
    int sl = slot_number(b);
    auto [it, fresh] = number.emplace(sl, int(t.slots.size()));
    Slot s = buffer_slot(b);
    if (sl < ctx.n_inputs) s.input = sl, t.slots[size_t(sl)] = s;
    else if (fresh) t.slots.push_back(s);
    return it->second;
  };
  for (auto& call : ctx.linear->src()) {
    Item it = call_item(call.get());
    auto bufs = call_buffers(call.get());
    for (size_t k = 0; k < bufs.size(); k++) it.slots[k] = slot(bufs[k].get());
    t.items.push_back(std::move(it));
  }
  for (size_t i = 0; i < ctx.graph.size(); i++) {
    t.root_shapes.push_back(ctx.shapes.at(ctx.graph[i].get()));
    if (!contiguous_buffer(ctx.graph[i].get())) t.becomes.emplace_back(i, slot(buffer_node(ctx.kernels->src(i))));
  }
  ctx.t = std::move(t);
}

}  // namespace tg::sched
