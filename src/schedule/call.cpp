// CALL nodes in the tensor graph: the registry of custom kernels' ASTs (Tensor::custom_kernel) and what the
// scheduler reads from one: which parameters the kernel stores (its outputs, new buffers) and which it reads, and
// the AST with its PARAMs renumbered to the kernel item's buffers (outputs first).
#include <mutex>
#include <unordered_map>

#include "stages.hpp"

namespace tg {

namespace {
struct CallRegistry {
  std::mutex mu;
  std::unordered_map<std::string, int64_t> ids;  // AST content key -> id
  std::vector<UOpRef> asts;
};
CallRegistry& call_registry() {
  static CallRegistry* r = new CallRegistry();  // never destroyed: CALL nodes may outlive static destruction
  return *r;
}
}  // namespace

int64_t register_call_ast(const UOpRef& ast) {
  CallRegistry& r = call_registry();
  std::string key = ast->key();
  std::lock_guard lk(r.mu);
  auto [it, fresh] = r.ids.emplace(key, int64_t(r.asts.size()));
  if (fresh) r.asts.push_back(ast);
  return it->second;
}

UOpRef call_ast(int64_t id) {
  CallRegistry& r = call_registry();
  std::lock_guard lk(r.mu);
  if (id < 0 || size_t(id) >= r.asts.size()) throw Error("[schedule] internal: no custom kernel AST " + std::to_string(id));
  return r.asts[size_t(id)];
}

// (a tensor-graph CALL's arg is one integer; the kernel graph's CALLs carry {item, outputs})
bool is_custom_after(const UOp* u) {
  return u->op == Ops::AFTER && u->nsrc() == 2 && u->src(1)->op == Ops::CALL &&
         std::holds_alternative<int64_t>(u->src(1)->arg) && std::get<int64_t>(u->src(1)->arg) != kCallifyArg;
}
bool is_callify_after(const UOp* u) {
  return u->op == Ops::AFTER && u->nsrc() == 2 && u->src(1)->op == Ops::CALL &&
         std::holds_alternative<int64_t>(u->src(1)->arg) && std::get<int64_t>(u->src(1)->arg) == kCallifyArg;
}

namespace sched {

CallParams call_params(const UOp* call, size_t nsrc) {
  CallParams p{std::vector<bool>(nsrc, false), std::vector<bool>(nsrc, false)};
  UOpRef ast = call_ast(std::get<int64_t>(call->arg));
  std::unordered_set<const UOp*> store_targets;
  for (const UOp* u : toposort(ast.get()))
    if (u->op == Ops::STORE) store_targets.insert(u->src(0));
  for (const UOp* u : toposort(ast.get())) {
    if (u->op != Ops::INDEX || u->src(0)->op != Ops::PARAM) continue;
    size_t slot = size_t(std::get<int64_t>(u->src(0)->arg));
    (store_targets.count(u) ? p.stored : p.read).at(slot) = true;
  }
  return p;
}

UOpRef renumber_params(const UOpRef& ast, const std::vector<int64_t>& to) {
  return substitute(ast, [&](const UOp* u) -> UOpRef {
    if (u->op != Ops::PARAM) return {};
    return UOp::make(Ops::PARAM, u->dtype, {}, to.at(size_t(std::get<int64_t>(u->arg))));
  });
}

std::vector<UOpRef> with_callify_siblings(std::span<const UOpRef> roots) {
  std::vector<UOpRef> out(roots.begin(), roots.end());
  std::unordered_set<const UOp*> have;
  for (auto& r : out) have.insert(r.get());
  for (size_t done = 0; done < out.size();) {  // the siblings' graphs may hold further callified tensors
    std::vector<UOpRef> more;
    for (const UOp* u : toposort(std::span<const UOpRef>(out).subspan(done))) {
      if (!is_callify_after(u)) continue;
      const UOp* call = u->src(1);
      for (size_t i = 0; i < call->nsrc(); i++) {
        UOpRef sib = UOp::make(Ops::AFTER, call->src(i)->dtype, {call->src()[i], UOpRef(call)}, int64_t(i));
        if (have.insert(sib.get()).second) more.push_back(sib);
      }
    }
    done = out.size();
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

}  // namespace sched

}  // namespace tg
