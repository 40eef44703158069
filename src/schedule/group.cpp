// Stage "group outputs" of the scheduler: multi-output kernels. A materialised node that reads another one element
// for element (through elementwise ops only, at the same shape, on the same device) computes it in its own kernel
// and stores both, as tinygrad's scheduler lets a kernel store several buffers: an optimiser step's parameter, first
// and second moments become one kernel that reads the gradient and the old state once; `y = f(x).contiguous(); z =
// g(y)` realised together is one kernel. MULTI_OUTPUT=0 turns it off (one output per kernel).
//
// A group's members are elementwise (no reduce in their kernels), and nothing outside the group lies between them:
// no member reads another through a movement op (a value another lane computes), through another kernel, or reads
// the old contents of a buffer that another member assigns.
#include <algorithm>
#include <set>

#include "stages.hpp"

namespace tg::sched {

namespace {

/** What one materialised node's kernel reads. */
struct KernelReads {
  bool elementwise = true;  // no reduce inside
  NodeSet direct;           // materialised nodes read element for element (through elementwise ops only)
  NodeSet moved;            // materialised nodes (and buffers) read through a movement op
  NodeSet buffers;          // BUFFERs read (their contents before the schedule)
};

KernelReads kernel_reads(const UOp* root) {  // root: a BUFFERIZE
  KernelReads r;
  std::vector<std::pair<const UOp*, bool>> st;  // (node, reached through elementwise ops only)
  auto push_sources = [&](const UOp* n, bool direct) {
    if (n->op == Ops::ASSIGN) return st.push_back({n->src(1), direct});  // the value; src 0 is the target
    bool d = direct && !is_movement(n->op);
    for (auto& s : n->src())
      if (s->op != Ops::DEVICE) st.push_back({s.get(), d});
  };
  push_sources(root->src(0), true);  // the value's sources
  std::set<std::pair<const UOp*, bool>> seen;
  while (!st.empty()) {
    auto [n, direct] = st.back();
    st.pop_back();
    if (!seen.insert({n, direct}).second) continue;
    if (n->op == Ops::BUFFER) {
      r.buffers.insert(n);
      if (!direct) r.moved.insert(n);
      continue;
    }
    if (is_stored_bufferize(n)) {
      (direct ? r.direct : r.moved).insert(n);
      continue;
    }
    if (n->op == Ops::REDUCE_AXIS) {
      r.elementwise = false;
      return r;
    }
    push_sources(n, direct);
  }
  return r;
}

// A BUFFERIZE computed by a kernel of its own that may join a group: elementwise, concrete shape, something to
// compute.
bool groupable(const ScheduleCtx& c, const UOp* b, const KernelReads& r) {
  const UOp* u = b->src(0);
  // a custom kernel's output (AFTER of a CALL) is stored by that kernel, as written
  if (!r.elementwise || u->op == Ops::COPY || u->op == Ops::AFTER || contiguous_buffer(u) || u->sym()) return false;
  if (u->op == Ops::CONTIGUOUS && contiguous_buffer(u->src(0))) return false;
  if (u->op == Ops::ASSIGN && !contiguous_buffer(u->src(0))) return false;  // stored through its view
  for (int64_t d : c.shapes.at(b))
    if (d == 0) return false;
  return true;
}

// Whether `from` depends on any of `targets` (through any path, kernels included).
bool reaches(const UOp* from, const NodeSet& targets, std::unordered_map<const UOp*, bool>& memo) {
  std::vector<std::pair<const UOp*, bool>> st{{from, false}};
  while (!st.empty()) {
    auto [n, expanded] = st.back();
    st.pop_back();
    if (memo.count(n)) continue;
    if (targets.count(n)) {
      memo[n] = true;
      continue;
    }
    if (!expanded) {
      st.push_back({n, true});
      for (auto& s : n->src())
        if (!memo.count(s.get())) st.push_back({s.get(), false});
      continue;
    }
    bool any = false;
    for (auto& s : n->src()) any |= memo.at(s.get());
    memo[n] = any;
  }
  return memo.at(from);
}

// Leader -> members, sources first, leader last; member -> its leader.
struct Groups {
  std::unordered_map<const UOp*, std::vector<const UOp*>> groups;
  std::unordered_map<const UOp*, const UOp*> leader_of;
};

Groups find_groups(const ScheduleCtx& c) {
  Groups gs;
  auto& groups = gs.groups;
  auto& leader_of = gs.leader_of;
  std::unordered_map<const UOp*, KernelReads> reads;
  std::unordered_map<const UOp*, size_t> pos;  // topological position: members are kept sources first
  for (size_t i = 0; i < c.gtopo.size(); i++) pos[c.gtopo[i]] = i;
  auto by_pos = [&](const UOp* a, const UOp* b) { return pos.at(a) < pos.at(b); };
  for (const UOp* u : c.gtopo) {
    if (!is_stored_bufferize(u)) continue;
    KernelReads r = kernel_reads(u);
    if (!groupable(c, u, r)) continue;
    // the groups (or single nodes) u reads element for element, of its shape and device
    std::vector<const UOp*> join;
    for (const UOp* w : r.direct)
      if (reads.count(w) && !leader_of.count(w) && c.shapes.at(w) == c.shapes.at(u) && device_of(w) == device_of(u))
        join.push_back(w);
    std::sort(join.begin(), join.end(), by_pos);
    std::vector<const UOp*> members;
    for (const UOp* w : join) {
      auto g = groups.find(w);
      std::vector<const UOp*> add = g != groups.end() ? g->second : std::vector<const UOp*>{w};
      NodeSet group(add.begin(), add.end());
      bool ok = true;
      for (const UOp* x : r.moved) ok &= !group.count(x);  // read at another element
      std::unordered_map<const UOp*, bool> memo;
      for (const UOp* x : r.direct)  // through another kernel
        if (!group.count(x)) ok &= !reaches(x, group, memo);
      for (const UOp* x : r.moved)
        if (ok && !group.count(x)) ok &= !reaches(x, group, memo);
      if (ok) members.insert(members.end(), add.begin(), add.end());
    }
    reads.emplace(u, std::move(r));
    if (members.empty()) continue;
    members.push_back(u);
    // no member reads the old contents of a buffer another member assigns (its store could land first)
    bool ok = true;
    for (const UOp* a : members)
      if (a->src(0)->op == Ops::ASSIGN)
        for (const UOp* m : members)
          if (m != a) ok &= !reads.at(m).buffers.count(contiguous_buffer(a->src(0)->src(0)));
    if (!ok) continue;
    for (const UOp* m : members) {
      groups.erase(m);
      leader_of[m] = u;
    }
    leader_of.erase(u);
    std::sort(members.begin(), members.end(), by_pos);
    members.erase(std::unique(members.begin(), members.end()), members.end());
    groups[u] = std::move(members);
  }
  return gs;
}

}  // namespace

// The groups in the graph: a leader becomes BUFFERIZE(value, DEVICE, members...), its kernel's outputs (members
// sources first, the leader last); the nodes above it are rebuilt over it and keep their shapes and origins.
void group_outputs(ScheduleCtx& c) {
  if (!c.knobs.multi_output) return;
  Groups gs = find_groups(c);
  if (gs.groups.empty()) return;
  std::unordered_map<const UOp*, UOpRef> rebuilt;
  for (const UOp* u : c.gtopo) {
    bool changed = false;
    std::vector<UOpRef> src = mapped_sources(u, rebuilt, changed);
    if (auto g = gs.groups.find(u); g != gs.groups.end()) {
      for (const UOp* m : g->second)
        if (m != u) src.push_back(rebuilt.at(m));
      changed = true;
    }
    UOpRef v = changed ? u->replace_src(src) : UOpRef(u);
    if (changed) {
      c.shapes[v.get()] = c.shapes.at(u);
      const UOp* uv = u->op == Ops::BUFFERIZE ? u->src(0) : u;  // origin's key: a BUFFERIZE's value
      const UOp* vv = v->op == Ops::BUFFERIZE ? v->src(0) : v.get();
      if (vv != uv) {  // a node not in origin is the tensor graph's own
        auto o = c.origin.find(uv);
        c.origin[vv] = o != c.origin.end() ? o->second : uv;
      }
    }
    rebuilt.emplace(u, std::move(v));
  }
  c.old_graphs.push_back(c.graph);  // its nodes stay keys of shapes
  for (auto& r : c.graph) r = rebuilt.at(r.get());
  c.gtopo = toposort(c.graph);
}

std::span<const UOpRef> group_members(const UOp* b) {
  if (b->op != Ops::BUFFERIZE || b->nsrc() <= 2) return {};
  return b->src().subspan(2);
}

}  // namespace tg::sched
