// Symbolic autograd: one gradient rule per primitive op; backward() and gradient() on Tensor.
#include "tg/gradient.hpp"
#include "tg/multi.hpp"
#include "tg/schedule.hpp"

#include <cmath>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace tg {
using namespace tg::pat;

namespace {

thread_local bool g_no_grad = false;

/** What a gradient rule sees besides the forward node: the incoming gradient and the forward shapes. */
struct GradCtx {
  Tensor grad;
  const std::unordered_map<const UOp*, Shape>* shapes;
  const std::unordered_map<const UOp*, std::string>* devices;  // each forward node's device
  std::string dev(const UOp* u) const { return devices->at(u); }
  Tensor T(const UOp* u) const { return Tensor(UOpRef(u), shapes->at(u), dev(u)); }
  const std::unordered_set<const UOp*>* targets;  // the nodes whose gradients are asked for
  // gradients a composite's rule gives to a node below its sources (sigmoid's input): the nodes between get none
  std::vector<std::pair<const UOp*, Tensor>> below;
};

UOpRef none() { return UOp::make(Ops::NOOP, dtypes::void_); }
UOpRef tup(std::initializer_list<UOpRef> g) { return UOp::make(Ops::TUPLE, dtypes::void_, g); }
UOpRef tup(std::vector<UOpRef> g) { return UOp::make(Ops::TUPLE, dtypes::void_, g); }

const std::vector<int64_t>& vec_arg(const UOp* u) { return std::get<std::vector<int64_t>>(u->arg); }

// What a rule reads: the context, the incoming gradient, the forward node's sources and value, as Tensors.
template <class M>
GradCtx& ctx_of(M& m) {
  return m.template ctx<GradCtx>();
}
template <class M>
Tensor g_of(M& m) {
  return ctx_of(m).grad;
}
template <class M>
Tensor src_of(M& m, size_t i) {
  return ctx_of(m).T(m.root->src(i));
}
template <class M>
Tensor ret_of(M& m) {
  return ctx_of(m).T(m.root);
}
template <class M>
const Shape& in_shape(M& m) {
  return ctx_of(m).shapes->at(m.root->src(0));
}
// A constant seen through its broadcast (the scalar 0 of max(x, 0)).
bool const_view(const UOp* u) {
  while (is_movement(u->op)) u = u->src(0);
  return u->op == Ops::CONST;
}
// The value of a float constant seen through its broadcast, else NaN.
double const_value(const UOp* u) {
  while (is_movement(u->op)) u = u->src(0);
  return u->op == Ops::CONST && dtypes::is_float(u->dtype) ? u->const_float() : NAN;
}
// Sigmoid, 1 / (1 + exp2(-x * log2(e))) with no node between asked for a gradient: x, else null.
const UOp* sigmoid_input(const UOp* r, const std::unordered_set<const UOp*>& targets) {
  if (const_value(r->src(0)) != 1.0) return nullptr;
  const UOp* u = r->src(1);
  if (u->op != Ops::ADD) return nullptr;
  const UOp* e = const_value(u->src(0)) == 1.0 ? u->src(1) : const_value(u->src(1)) == 1.0 ? u->src(0) : nullptr;
  if (!e || e->op != Ops::EXP2 || e->src(0)->op != Ops::MUL) return nullptr;
  const UOp* t = e->src(0);
  double k = const_value(t->src(1));
  const UOp* n = t->src(0);
  if (!(std::fabs(k * M_LN2 - 1) < 1e-6)) k = const_value(t->src(0)), n = t->src(1);
  if (!(std::fabs(k * M_LN2 - 1) < 1e-6) || n->op != Ops::NEG) return nullptr;
  for (const UOp* between : {u, e, t, n})
    if (targets.count(between)) return nullptr;
  return n->src(0);
}
UOpRef tup1(const Tensor& a) { return tup({a.uop()}); }
UOpRef tup2(const Tensor& a, const Tensor& b) { return tup({a.uop(), b.uop()}); }

UOpRef do_grad_where(const UOp* r, GradCtx& c) {
  Tensor cond = c.T(r->src(0)), g = c.grad, z = 0.0;
  return tup({none(), cond.where(g, z).cast(g.dtype()).uop(), cond.where(z, g).cast(g.dtype()).uop()});
}

UOpRef do_grad_reduce(const UOp* r, GradCtx& c) {
  auto& ra = std::get<ReduceArg>(r->arg);
  Tensor g = c.grad, x = c.T(r->src(0)), ret = c.T(r);
  const Shape& in = c.shapes->at(r->src(0));
  switch (ra.op) {
    case Ops::ADD: return tup({g.expand(in).uop()});
    case Ops::MAX: {  // shared among the maxima
      Tensor is_max = (x == ret.expand(in)).cast(g.dtype());
      Tensor count = is_max.sum(ra.axes, true).expand(in);
      return tup({(is_max / count * g.expand(in)).uop()});
    }
    case Ops::MUL: {
      // d prod / d x_i = the product of the others: prod / x_i without zeros (as torch), else exact: with one zero
      // the zero's gradient is the product of the rest and the others' is 0; with two or more all are 0 (no 0/0)
      Tensor is0 = x == 0.0, ge = g.expand(in);
      Tensor rest = is0.where(1.0, x).prod(ra.axes, true).expand(in);
      Tensor zeros = is0.cast(x.dtype()).sum(ra.axes, true).expand(in);
      Tensor at0 = (zeros == 1.0).where(rest, 0.0), other = (zeros == 0.0).where(rest / x, 0.0);
      return tup({(is0.where(at0, other) * ge).uop()});
    }
    default: return tup({none()});
  }
}

// Custom gradients (Tensor::custom_gradient): a FUNCTION node (value, inputs...) whose arg indexes this registry.
// Entries are keyed by name, so the registry grows with the number of distinct rules, not with calls.
struct CustomRegistry {
  std::mutex mu;
  std::unordered_map<std::string, int64_t> ids;
  std::vector<std::shared_ptr<const Tensor::CustomBackward>> fns;
};
CustomRegistry& custom_registry() {
  static CustomRegistry* r = new CustomRegistry();
  return *r;
}

UOpRef do_grad_custom(const UOp* r, GradCtx& c) {
  std::shared_ptr<const Tensor::CustomBackward> fn;
  {
    CustomRegistry& reg = custom_registry();
    std::lock_guard lk(reg.mu);
    fn = reg.fns.at(size_t(std::get<int64_t>(r->arg)));
  }
  std::vector<Tensor> ins;
  for (size_t k = 1; k < r->nsrc(); k++) ins.push_back(c.T(r->src(k)));
  auto gs = (*fn)(c.grad, c.T(r->src(0)), ins);
  if (gs.size() != ins.size())
    throw Error("[custom_gradient] backward returned " + std::to_string(gs.size()) + " gradients for " +
                std::to_string(ins.size()) + " inputs");
  std::vector<UOpRef> out{none()};  // the forward graph gets no gradient: the rule replaces it
  for (size_t i = 0; i < gs.size(); i++) {
    if (gs[i] && gs[i]->shape() != ins[i].shape())
      throw Error("[custom_gradient] backward's gradient " + std::to_string(i) + " has shape " + shape_str(gs[i]->shape()) +
                  ", input is " + shape_str(ins[i].shape()));
    out.push_back(gs[i] ? gs[i]->uop() : none());
  }
  return tup(out);
}

}  // namespace

Tensor Tensor::custom_gradient(const std::vector<Tensor>& inputs, const std::string& key, CustomBackward backward) const {
  if (NoGrad::active()) return *this;
  int64_t id;
  {
    CustomRegistry& reg = custom_registry();
    std::lock_guard lk(reg.mu);
    auto [it, fresh] = reg.ids.emplace(key, int64_t(reg.fns.size()));
    if (fresh) reg.fns.push_back(std::make_shared<const CustomBackward>(std::move(backward)));
    id = it->second;
  }
  std::vector<UOpRef> src{uop()};
  for (auto& t : inputs) src.push_back(t.uop());
  return Tensor(UOp::make(Ops::FUNCTION, dtype(), src, id), shape(), device());
}

// One rule per op: the op's local derivative applied to the incoming gradient, a TUPLE with one gradient per source
// (NOOP: none). Ops not listed have no rule: differentiating through them is an error naming the op.
const PatternMatcher& pm_gradient() {
  static const PatternMatcher pm(table(
      // d f(x) = f'(x) dx
      rule(op_any<opset<Ops::NEG>>, [](auto& m) { return tup1(-g_of(m)); }),
      rule(op_any<opset<Ops::RECIPROCAL>>, [](auto& m) { return tup1(-g_of(m) * ret_of(m) * ret_of(m)); }),
      // (cos as Tensor::cos: 1 - 2 sin^2(x/2), exact in its argument; sin(pi/2 - x) rounds pi/2 - x first)
      rule(op_any<opset<Ops::SIN>>, [](auto& m) { return tup1(src_of(m, 0).cos() * g_of(m)); }),
      rule(op_any<opset<Ops::LOG2>>, [](auto& m) { return tup1(g_of(m) / (src_of(m, 0) * M_LN2)); }),
      rule(op_any<opset<Ops::EXP2>>, [](auto& m) { return tup1(ret_of(m) * g_of(m) * M_LN2); }),
      rule(op_any<opset<Ops::SQRT>>, [](auto& m) { return tup1(g_of(m) / (ret_of(m) * 2)); }),
      rule(op_any<opset<Ops::TRUNC>>, [](auto& m) { return tup1(g_of(m) * 0); }),
      rule(op_any<opset<Ops::CAST>>,  // back to the source's float dtype; an int source gets none
           [](auto& m) {
             DType d = m.root->src(0)->dtype;
             return tup({dtypes::is_float(d) ? g_of(m).cast(d).uop() : none()});
           }),
      // d(x op y)
      rule(op_any<opset<Ops::ADD>>, [](auto& m) { return tup2(g_of(m), g_of(m)); }),
      rule(op_any<opset<Ops::SUB>>, [](auto& m) { return tup2(g_of(m), -g_of(m)); }),
      rule(op_any<opset<Ops::MUL>>, [](auto& m) { return tup2(src_of(m, 1) * g_of(m), src_of(m, 0) * g_of(m)); }),
      // sigmoid, s = 1 / (1 + exp(-x)): x gets s (1 - s) (torch's), finite everywhere and exact where it underflows;
      // through the graph, d/de = -s^2 underflows from x < -44 and exp' = inf times 0 is NaN from x < -88
      rule(op_any<opset<Ops::FDIV>>,
           [](auto& m) -> UOpRef {
             const UOp* x = sigmoid_input(m.root, *ctx_of(m).targets);
             if (!x) return {};
             Tensor s = ret_of(m);
             ctx_of(m).below.push_back({x, g_of(m) * (s * (1.0 - s))});
             return tup({none(), none()});
           }),
      rule(op_any<opset<Ops::FDIV>>,
           [](auto& m) {
             Tensor g = g_of(m), x = src_of(m, 0), y = src_of(m, 1);
             return tup2(g / y, -g * x / (y * y));
           }),
      rule(op_any<opset<Ops::POW>>,  // torch's: d/dx = y x^(y-1), 0 where y == 0; d/dy = x^y ln x, 0 where x == 0, y >= 0
           [](auto& m) {
             Tensor g = g_of(m), x = src_of(m, 0), y = src_of(m, 1);
             Tensor gx = (y == 0.0).where(0.0, g * y * x.pow(y - 1.0));
             Tensor gy = ((x == 0.0) & (y >= 0.0)).where(0.0, g * ret_of(m) * x.log());  // NaN for x < 0, as torch
             return tup2(gx.cast(g.dtype()), gy.cast(g.dtype()));
           }),
      rule(op_any<opset<Ops::MAX>>,  // max(x, c), a threshold (relu): the constant takes the tie, x gets [x > c]
           [](auto& m) -> UOpRef {
             bool cx = const_view(m.root->src(0)), cy = const_view(m.root->src(1));
             if (cx == cy) return {};
             Tensor g = g_of(m), x = src_of(m, cy ? 0 : 1), c = src_of(m, cy ? 1 : 0);
             UOpRef gx = (x > c).where(g, 0.0).uop();
             return cy ? tup({gx, none()}) : tup({none(), gx});
           }),
      rule(op_any<opset<Ops::MAX>>,  // ties split the gradient evenly, as tinygrad and torch.maximum
           [](auto& m) {
             Tensor g = g_of(m), x = src_of(m, 0), y = src_of(m, 1);
             Tensor half = (x == y).where(g * 0.5, 0.0);
             return tup2((x > y).where(g, half), (x < y).where(g, half));
           }),
      rule(op_any<opset<Ops::CMPLT, Ops::CMPNE, Ops::CMPEQ, Ops::IDIV, Ops::MOD, Ops::AND, Ops::OR, Ops::XOR, Ops::SHL,
                        Ops::SHR, Ops::BITCAST>>,  // comparisons, integer and bitwise ops: not differentiable
           [](auto& m) { return tup(std::vector<UOpRef>(m.root->nsrc(), none())); }),
      rule(op_any<opset<Ops::WHERE>>, [](auto& m) { return do_grad_where(m.root, ctx_of(m)); }),  // d where(c,x,y)
      rule(op_any<opset<Ops::REDUCE_AXIS>>, [](auto& m) { return do_grad_reduce(m.root, ctx_of(m)); }),  // sum/max/prod
      // movement ops: the inverse view
      rule(op_any<opset<Ops::RESHAPE>>, [](auto& m) { return tup1(g_of(m).reshape(in_shape(m))); }),
      rule(op_any<opset<Ops::PERMUTE>>,
           [](auto& m) {
             const auto& order = vec_arg(m.root);
             std::vector<int64_t> inv(order.size());
             for (size_t i = 0; i < inv.size(); i++) inv[size_t(order[i])] = int64_t(i);
             return tup1(g_of(m).permute(inv));
           }),
      rule(op_any<opset<Ops::EXPAND>>,  // summed over the expanded axes
           [](auto& m) {
             const Shape &in = in_shape(m), &out = ctx_of(m).shapes->at(m.root);
             std::vector<int64_t> axes;
             for (size_t i = 0; i < in.size(); i++)
               if (in[i] != out[i]) axes.push_back(int64_t(i));
             return tup1(g_of(m).sum(axes, true).cast(g_of(m).dtype()));
           }),
      rule(op_any<opset<Ops::PAD>>,
           [](auto& m) {
             const Shape& in = in_shape(m);
             std::vector<std::pair<int64_t, int64_t>> s;
             for (size_t i = 0; i < in.size(); i++) s.push_back({vec_arg(m.root)[2 * i], vec_arg(m.root)[2 * i] + in[i]});
             return tup1(g_of(m).shrink(s));
           }),
      rule(op_any<opset<Ops::SHRINK>>,
           [](auto& m) {
             const Shape& in = in_shape(m);
             std::vector<std::pair<int64_t, int64_t>> p;
             for (size_t i = 0; i < in.size(); i++) p.push_back({vec_arg(m.root)[2 * i], in[i] - vec_arg(m.root)[2 * i + 1]});
             return tup1(g_of(m).pad(p));
           }),
      rule(op_any<opset<Ops::FLIP>>,
           [](auto& m) {
             std::vector<int64_t> axes;
             for (size_t i = 0; i < vec_arg(m.root).size(); i++)
               if (vec_arg(m.root)[i]) axes.push_back(int64_t(i));
             return tup1(g_of(m).flip(axes));
           }),
      rule(op_any<opset<Ops::FUNCTION>>, [](auto& m) { return do_grad_custom(m.root, ctx_of(m)); }),  // custom_gradient
      // d callify(x) = dx (the CALL gets none); a custom kernel's output has the gradient its backward gives (a
      // FUNCTION above it): reaching the kernel itself means it has none
      rule(op_any<opset<Ops::AFTER>>, [](auto& m) -> UOpRef {
        if (is_callify_after(m.root)) return tup({g_of(m).uop(), none()});
        throw Error("[backward] a custom kernel's output has no gradient: pass a backward to Tensor::custom_kernel");
      }),
      rule(op_any<opset<Ops::CONTIGUOUS>>, [](auto& m) { return tup1(g_of(m)); }),  // d contiguous(x) = dx
      rule(op_any<opset<Ops::CONTIGUOUS_BACKWARD>>, [](auto& m) { return tup1(g_of(m).contiguous()); }),
      rule(op_any<opset<Ops::COPY>>,  // d x.to(dev) = the gradient copied back to x's device
           [](auto& m) { return tup({g_of(m).to(ctx_of(m).dev(m.root->src(0))).uop(), none()}); }),
      // each part gets its device's part of the gradient (include/tg/multi.hpp); replicated parts are copies of one
      // value, whose gradient is the logical one, once: the first part gets it, the others none (giving each its
      // copy summed n of them into the source, shard(devs)'s gradient n times too large)
      rule(op_any<opset<Ops::MULTI>>,
           [](auto& m) {
             size_t n = m.root->nsrc() - 1;
             int64_t axis = std::get<int64_t>(m.root->arg);
             std::vector<UOpRef> g;
             for (size_t i = 0; i < n; i++)
               g.push_back(axis < 0 && i > 0 ? none()
                                             : UOp::make(Ops::MSELECT, g_of(m).dtype(), {g_of(m).uop(), m.root->src()[n]},
                                                         std::vector<int64_t>{int64_t(i), axis, int64_t(n)}));
             g.push_back(none());
             return tup(g);
           }),
      rule(op_any<opset<Ops::DETACH, Ops::ASSIGN>>,
           [](auto& m) { return tup(std::vector<UOpRef>(m.root->nsrc(), none())); })));  // stop gradients
  return pm;
}

std::vector<UOpRef> compute_gradient(const UOpRef& root, const UOpRef& root_grad, std::span<const UOpRef> targets,
                                     const std::string& device) {
  std::vector<const UOp*> topo = toposort(root.get());
  std::unordered_map<const UOp*, Shape> shapes;
  for (const UOp* u : topo) {
    std::vector<const Shape*> in;
    for (auto& s : u->src()) in.push_back(&shapes.at(s.get()));
    shapes[u] = infer_shape(u->op, in, u->arg, u->dtype);
  }
  // Each node's device: a buffer's, a copy's target, else its first source's that has one (the root's for none).
  std::unordered_map<const UOp*, std::string> devices;
  for (const UOp* u : topo) {
    std::string d;
    if (u->op == Ops::BUFFER) d = std::get<std::string>(u->src(0)->arg);
    else if (u->op == Ops::COPY || u->op == Ops::MULTI) d = std::get<std::string>(u->src(u->nsrc() - 1)->arg);
    else if (u->op == Ops::MSELECT) d = split_devices(std::get<std::string>(u->src(1)->arg))[size_t(vec_arg(u)[0])];
    else
      for (auto& s : u->src())
        if (auto it = devices.find(s.get()); it != devices.end() && !it->second.empty() && s->op != Ops::DEVICE) {
          d = it->second;
          break;
        }
    devices[u] = d;
  }
  for (auto& [u, d] : devices)
    if (d.empty()) d = device;
  // Only nodes on a path from a target to the root need a gradient.
  std::unordered_set<const UOp*> tset;
  for (auto& t : targets) tset.insert(t.get());
  std::unordered_set<const UOp*> on_path;
  for (const UOp* u : topo) {
    bool p = tset.count(u) > 0;
    for (auto& s : u->src())
      if (on_path.count(s.get())) p = true;
    if (p) on_path.insert(u);
  }
  std::unordered_map<const UOp*, Tensor> grads;
  grads.emplace(root.get(), Tensor(root_grad, shapes.at(root.get()), device));
  for (size_t i = topo.size(); i-- > 0;) {
    const UOp* u = topo[i];
    auto git = grads.find(u);
    if (git == grads.end() || !on_path.count(u) || u->nsrc() == 0) continue;
    bool any_src = false;
    for (auto& s : u->src()) any_src |= on_path.count(s.get()) > 0;
    if (!any_src) continue;
    GradCtx ctx{git->second, &shapes, &devices, &tset, {}};
    UOpRef t = pm_gradient().rewrite(u, &ctx);
    if (!t) throw Error(std::string("[gradient] no gradient rule for ") + op_name(u->op));
    auto add = [&](const UOp* s, Tensor gt) {
      if (!on_path.count(s)) return;
      if (!(gt.dtype() == s->dtype) && dtypes::is_float(s->dtype)) gt = gt.cast(s->dtype);
      auto it = grads.find(s);
      if (it == grads.end()) grads.emplace(s, gt);
      else it->second = it->second + gt;
    };
    for (size_t k = 0; k < u->nsrc(); k++)
      if (const UOp* g = t->src(k); g->op != Ops::NOOP) add(u->src(k), Tensor(UOpRef(g), shapes.at(u->src(k)), devices.at(u->src(k))));
    for (auto& [s, gt] : ctx.below) add(s, gt);
  }
  std::vector<UOpRef> out;
  for (auto& t : targets) {
    auto it = grads.find(t.get());
    out.push_back(it == grads.end() ? UOpRef{} : it->second.uop());
  }
  return out;
}

// ---------------------------------------------------------------- Tensor API

NoGrad::NoGrad() : prev_(g_no_grad) { g_no_grad = true; }
NoGrad::~NoGrad() { g_no_grad = prev_; }
bool NoGrad::active() { return g_no_grad; }

Tensor& Tensor::requires_grad_(bool on) {
  if (on && !dtypes::is_float(dtype()))
    throw Error("[requires_grad_] only float tensors can require gradients, got " + dtype().name() + " " + shape_str(shape()));
  im().requires_grad = on;
  return *this;
}

bool Tensor::has_grad() const { return im().grad != nullptr; }
Tensor Tensor::grad() const {
  if (!im().grad) throw Error("[grad] no gradient: call backward() on a result that depends on this tensor");
  Tensor g;
  g.impl_ = im().grad;
  return g;
}
void Tensor::zero_grad() { im().grad.reset(); }

std::vector<Tensor> Tensor::gradient(const std::vector<Tensor>& wrt, const Tensor* seed) const {
  if (!dtypes::is_float(dtype()))
    throw Error("[gradient] result " + dtype().name() + " " + shape_str(shape()) +
                " is not differentiable (comparisons, argmax/argmin, sort indices, int and bool ops); differentiate a float result");
  for (size_t i = 0; i < wrt.size(); i++)
    if (!dtypes::is_float(wrt[i].dtype()))
      throw Error("[gradient] target " + std::to_string(i) + " is " + wrt[i].dtype().name() + " " + shape_str(wrt[i].shape()) +
                  ": only float tensors have gradients");
  if (!seed && numel() != 1)
    throw Error("[gradient] of a non-scalar " + shape_str(shape()) + " needs a seed gradient of that shape");
  if (seed && seed->shape() != shape())
    throw Error("[gradient] seed shape " + shape_str(seed->shape()) + " does not match " + shape_str(shape()));
  Tensor s = seed ? seed->cast(dtype()) : Tensor::ones(shape(), dtype(), device());
  std::vector<UOpRef> targets;
  for (auto& t : wrt) targets.push_back(t.uop());
  auto g = compute_gradient(uop(), s.uop(), targets, device());
  std::vector<Tensor> out;
  for (size_t i = 0; i < wrt.size(); i++)
    out.push_back(g[i] ? Tensor(g[i], wrt[i].shape(), wrt[i].device()) : Tensor::zeros(wrt[i].shape(), wrt[i].dtype(), wrt[i].device()));
  return out;
}

}  // namespace tg
