// CALL nodes in the tensor graph, from the front end: Tensor::custom_kernel (a kernel written in UOps, run as one
// CALL over its sources) and Tensor::callify (a computation made one CALL). The scheduler's side is
// src/schedule/call.cpp.
#include <unordered_set>

#include "tg/multi.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

namespace tg {

UOpRef KernelParam::index(const std::vector<UOpRef>& idx) const {
  if (idx.size() != shape.size())
    throw Error("[custom_kernel] PARAM " + std::to_string(std::get<int64_t>(param->arg)) + " has shape " +
                shape_str(shape) + ": give " + std::to_string(shape.size()) + " indices, not " + std::to_string(idx.size()));
  UOpRef off = UOp::cnst_int(dtypes::index, 0);
  int64_t stride = 1;
  for (size_t i = idx.size(); i-- > 0;) {
    if (!idx[i] || idx[i]->dtype != dtypes::index)
      throw Error("[custom_kernel] index " + std::to_string(i) + " must be a node of dtype index (a RANGE or an expression of ranges)");
    UOpRef term = stride == 1 ? idx[i] : idx[i]->alu(Ops::MUL, UOp::cnst_int(dtypes::index, stride));
    off = i + 1 == idx.size() ? term : term->alu(Ops::ADD, off);
    stride *= shape[i];
  }
  return UOp::make(Ops::INDEX, param->dtype, {param, off});
}

UOpRef KernelParam::load(const std::vector<UOpRef>& idx) const { return UOp::make(Ops::LOAD, dtype, {index(idx)}); }

UOpRef KernelParam::store(const std::vector<UOpRef>& idx, const UOpRef& v) const {
  if (!v || v->dtype != dtype)
    throw Error("[custom_kernel] storing " + (v ? v->dtype.name() : std::string("nothing")) + " into PARAM " +
                std::to_string(std::get<int64_t>(param->arg)) + " of " + dtype.name() + ": cast the value first");
  return UOp::make(Ops::STORE, dtypes::void_, {index(idx), v});
}

namespace {

bool kernel_op(Ops o) {
  return is_alu(o) || o == Ops::CAST || o == Ops::BITCAST || o == Ops::CONST || o == Ops::PARAM || o == Ops::RANGE ||
         o == Ops::INDEX || o == Ops::LOAD || o == Ops::STORE || o == Ops::SINK || o == Ops::REDUCE;
}

// The checks of a custom kernel's AST against its sources; returns which sources it stores.
std::vector<bool> check_kernel_ast(const UOpRef& ast, const std::vector<KernelParam>& ps) {
  if (!ast || ast->op != Ops::SINK)
    throw Error(std::string("[custom_kernel] the kernel function must return a SINK of STOREs, not ") +
                (ast ? op_name(ast->op) : "nothing"));
  if (ast->nsrc() == 0) throw Error("[custom_kernel] the kernel stores nothing: it has no output");
  for (auto& s : ast->src())
    if (s->op != Ops::STORE) throw Error(std::string("[custom_kernel] the SINK's sources must be STOREs, not ") + op_name(s->op));
  std::vector<bool> stored(ps.size(), false);
  std::vector<const UOp*> topo = toposort(ast.get());
  for (const UOp* u : topo) {
    if (!kernel_op(u->op))
      throw Error(std::string("[custom_kernel] ") + op_name(u->op) + " is not a kernel op (a kernel AST has PARAM, RANGE, "
                  "INDEX, LOAD, STORE, REDUCE, CONST, CAST and ALU ops)");
    if (u->op == Ops::PARAM) {
      int64_t i = std::holds_alternative<int64_t>(u->arg) ? std::get<int64_t>(u->arg) : -1;
      if (i < 0 || size_t(i) >= ps.size())
        throw Error("[custom_kernel] PARAM " + std::to_string(i) + " but the kernel has " + std::to_string(ps.size()) +
                    " sources (PARAM 0.." + std::to_string(ps.size() - 1) + ")");
      if (u->dtype != ps[size_t(i)].param->dtype)
        throw Error("[custom_kernel] PARAM " + std::to_string(i) + " is " + u->dtype.name() + " but source " +
                    std::to_string(i) + " is " + ps[size_t(i)].dtype.name() + " " + shape_str(ps[size_t(i)].shape));
    }
    if (u->op == Ops::INDEX) {
      if (u->nsrc() != 2 || u->src(0)->op != Ops::PARAM) throw Error("[custom_kernel] an INDEX must be INDEX(PARAM, offset)");
      const KernelParam& p = ps[size_t(std::get<int64_t>(u->src(0)->arg))];
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      const UOp* off = u->src(1);
      if (!off->bounds().known || off->vmin() < 0 || off->vmax() >= n)
        throw Error("[custom_kernel] PARAM " + std::to_string(std::get<int64_t>(u->src(0)->arg)) + " is indexed at " +
                    (off->bounds().known ? std::to_string(off->vmin()) + ".." + std::to_string(off->vmax()) : std::string("unbounded offsets")) +
                    " but source " + std::to_string(std::get<int64_t>(u->src(0)->arg)) + " " + shape_str(p.shape) +
                    " holds " + std::to_string(n) + " elements");
    }
    if (u->op == Ops::LOAD || u->op == Ops::STORE) {
      if (u->src(0)->op != Ops::INDEX) throw Error(std::string("[custom_kernel] a ") + op_name(u->op) + " must address an INDEX");
      size_t i = size_t(std::get<int64_t>(u->src(0)->src(0)->arg));
      DType d = u->op == Ops::LOAD ? u->dtype : u->src(1)->dtype;
      if (d != ps[i].dtype)
        throw Error(std::string("[custom_kernel] a ") + op_name(u->op) + " of " + d.name() + " from/into PARAM " +
                    std::to_string(i) + " of " + ps[i].dtype.name());
      if (u->op == Ops::STORE) stored[i] = true;
    }
  }
  try {
    spec_check(ast.get());
  } catch (const Error& e) {
    throw Error(std::string("[custom_kernel] the AST is not valid: ") + e.what());
  }
  return stored;
}

}  // namespace

std::vector<Tensor> Tensor::custom_kernel(const std::vector<Tensor>& srcs, const CustomKernelFn& fxn, CustomBackward backward) {
  if (srcs.empty()) throw Error("[custom_kernel] needs at least one source (a tensor the kernel writes, e.g. Tensor::empty)");
  if (!fxn) throw Error("[custom_kernel] no kernel function given");
  const std::string& dev = srcs[0].device();
  std::vector<KernelParam> ps;
  for (size_t i = 0; i < srcs.size(); i++) {
    const Tensor& t = srcs[i];
    if (is_multi_device(t.device()) || t.device() != dev)
      throw Error("[custom_kernel] source " + std::to_string(i) + " is on " + t.device() + ", source 0 on " + dev +
                  ": a custom kernel runs on one device (move its sources there with to())");
    if (t.is_symbolic()) throw Error("[custom_kernel] source " + std::to_string(i) + " has a symbolic shape");
    DType d = dtypes::strong(t.dtype());
    ps.push_back({UOp::make(Ops::PARAM, d.ptr_to(), {}, int64_t(i)), t.shape(), d});
  }
  UOpRef ast = fxn(ps);
  std::vector<bool> stored = check_kernel_ast(ast, ps);
  std::vector<UOpRef> src;
  for (size_t i = 0; i < srcs.size(); i++) src.push_back(dtypes::strong(srcs[i].dtype()) == srcs[i].dtype() ? srcs[i].uop() : srcs[i].cast(ps[i].dtype).uop());
  UOpRef call = UOp::make(Ops::CALL, dtypes::void_, src, register_call_ast(ast));
  std::vector<Tensor> out;
  for (size_t i = 0; i < srcs.size(); i++) {
    if (!stored[i]) {
      out.push_back(srcs[i]);
      continue;
    }
    Tensor o(UOp::make(Ops::AFTER, ps[i].dtype, {src[i], call}, int64_t(i)), ps[i].shape, dev);
    if (backward) o = o.custom_gradient(srcs, "custom_kernel " + ast->key() + " output " + std::to_string(i), backward);
    out.push_back(o);
  }
  return out;
}

Tensor& Tensor::callify(const std::vector<Tensor*>& others) {
  std::vector<Tensor*> ts{this};
  ts.insert(ts.end(), others.begin(), others.end());
  std::vector<Tensor*> todo;
  std::unordered_set<const UOp*> seen;
  for (Tensor* t : ts) {
    if (!t) throw Error("[callify] a null tensor pointer");
    const UOp* u = t->uop().get();
    if (is_multi_device(t->device())) throw Error("[callify] a tensor on several devices (" + t->device() + ") is not supported");
    if (contiguous_buffer(u) || u->op == Ops::CONST || !seen.insert(u).second) continue;  // realised, or listed twice
    todo.push_back(t);
  }
  if (todo.empty()) return *this;
  std::vector<UOpRef> src;
  for (Tensor* t : todo) src.push_back(t->uop());
  UOpRef call = UOp::make(Ops::CALL, dtypes::void_, src, kCallifyArg);
  for (size_t i = 0; i < todo.size(); i++) todo[i]->im().uop = UOp::make(Ops::AFTER, src[i]->dtype, {src[i], call}, int64_t(i));
  return *this;
}

}  // namespace tg
