// Running an ONNX graph: nodes in their (topological) order, each looked up in the operator table and handed a Ctx
// with its inputs and attributes. Values stay lazy Tensors; only inputs that decide shapes are read on the host.
#include "onnx_impl.hpp"

#include "tg/device.hpp"
#include "tg/env.hpp"
#include "tg/schedule.hpp"

namespace tg::onnx {

namespace {

std::string op_key(const pb::NodeProto& n) {
  const std::string& d = n.domain();
  return d.empty() || d == "ai.onnx" ? n.op_type() : d + "::" + n.op_type();
}

std::string node_desc(const pb::NodeProto& n, int64_t opset) {
  std::string s = n.op_type();
  if (!n.domain().empty() && n.domain() != "ai.onnx") s = n.domain() + "." + s;
  s += " (opset " + std::to_string(opset) + ")";
  if (!n.name().empty()) s = "node '" + n.name() + "' " + s;
  return s;
}

}  // namespace

void Ctx::error(const std::string& what) const { fail(model.name, node_desc(node, opset) + ": " + what); }

const Tensor& Ctx::t(size_t i) const {
  if (i >= in.size() || in[i].kind == Value::Kind::None) error("input " + std::to_string(i) + " is required");
  if (in[i].kind != Value::Kind::Tensor) error("input " + std::to_string(i) + " must be a numeric tensor (not a sequence or strings)");
  return in[i].tensor;
}

std::vector<int64_t> Ctx::ints(size_t i) const {
  const Tensor& x = t(i);
  if (dtypes::is_float(x.dtype())) {
    std::vector<int64_t> out;
    for (double v : x.to_doubles()) out.push_back(int64_t(v));
    return out;
  }
  return x.cast(dtypes::int64).to_vector<int64_t>();
}

std::vector<double> Ctx::floats(size_t i) const { return t(i).to_doubles(); }

const pb::AttributeProto* Ctx::attr(const std::string& name) const {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t Ctx::i(const std::string& name, int64_t def) const {
  const auto* a = attr(name);
  if (!a) return def;
  if (a->type() != pb::AttributeProto::INT && !a->has_i()) error("attribute '" + name + "' must be an int");
  return a->i();
}

double Ctx::f(const std::string& name, double def) const {
  const auto* a = attr(name);
  if (!a) return def;
  if (a->type() == pb::AttributeProto::INT) return double(a->i());
  return double(a->f());
}

std::string Ctx::s(const std::string& name, const std::string& def) const {
  const auto* a = attr(name);
  return a ? a->s() : def;
}

std::vector<int64_t> Ctx::ints_attr(const std::string& name, std::vector<int64_t> def) const {
  const auto* a = attr(name);
  if (!a) return def;
  return {a->ints().begin(), a->ints().end()};
}

std::vector<double> Ctx::floats_attr(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) return {};
  return {a->floats().begin(), a->floats().end()};
}

const pb::GraphProto& main_graph(const Model::Impl& m, const std::map<std::string, Value>& overrides) {
  if (!m.folded) return m.proto.graph();
  for (const auto& [k, v] : overrides)
    if (m.folded_from.count(k)) return m.proto.graph();
  return *m.folded;
}

std::vector<Value> run_graph(const Model::Impl& m, const pb::GraphProto& g, const std::map<std::string, Value>& scope,
                             const std::vector<Value>& args) {
  std::map<std::string, Value> env = scope;
  if (&g == &m.proto.graph() || &g == m.folded.get()) {  // the main graph's initializers were read once by load
    for (const auto& [k, v] : m.initializers) env.emplace(k, Value::of(v));  // inputs may override them
    if (&g == m.folded.get())
      for (const auto& [k, v] : m.folded_initializers) env.emplace(k, Value::of(v));
  } else {
    for (const auto& t : g.initializer()) env[t.name()] = Value::of(tensor_of_proto(t, m.name, m.base_dir));
  }
  // Graph inputs: bound in order to args (the main graph's are bound by name in Model::run through scope).
  if (!args.empty()) {
    if (int(args.size()) > g.input_size())
      fail(m.name, "subgraph '" + g.name() + "' takes " + std::to_string(g.input_size()) + " inputs, given " + std::to_string(args.size()));
    for (size_t i = 0; i < args.size(); i++) env[g.input(int(i)).name()] = args[i];
  }
  const auto& table = op_table();
  for (const auto& node : g.node()) {
    std::string dom = node.domain() == "ai.onnx" ? "" : node.domain();
    auto os = m.opsets.find(dom);
    int64_t opset = os == m.opsets.end() ? 0 : os->second;
    auto it = table.find(op_key(node));
    if (it == table.end()) fail(m.name, "unsupported operator " + node_desc(node, opset));
    Ctx ctx{m, node, opset, {}, env};
    for (const auto& name : node.input()) {
      if (name.empty()) {
        ctx.in.emplace_back();
        continue;
      }
      auto v = env.find(name);
      if (v == env.end()) fail(m.name, node_desc(node, opset) + ": input '" + name + "' is not defined before this node");
      ctx.in.push_back(v->second);
    }
    std::vector<Value> outs;
    try {
      outs = it->second(ctx);
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind("[onnx]", 0) == 0) throw;
      fail(m.name, node_desc(node, opset) + ": " + msg);
    }
    for (int i = 0; i < node.output_size(); i++) {
      if (node.output(i).empty()) continue;
      if (size_t(i) >= outs.size()) {
        if (i == 0) fail(m.name, node_desc(node, opset) + ": produced no output");
        ctx.error("output " + std::to_string(i) + " ('" + node.output(i) + "') is not supported");
      }
      env[node.output(i)] = outs[size_t(i)];
    }
  }
  std::vector<Value> res;
  for (const auto& o : g.output()) {
    auto v = env.find(o.name());
    if (v == env.end()) fail(m.name, "graph output '" + o.name() + "' is never computed");
    res.push_back(v->second);
  }
  return res;
}

namespace {

std::string declared_shape(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + (s[i] < 0 ? std::string("?") : std::to_string(s[i]));
  return r + (s.size() == 1 ? ",)" : ")");
}

// A given input against the graph's declaration: element type, rank and every fixed dimension (as ONNX Runtime
// checks them: a float64 tensor for a float32 input is refused, not run in float64).
void check_input(const Model::Impl& m, const ValueInfo& vi, const Value& v) {
  if (!vi.dtype || v.kind == Value::Kind::None) return;  // strings, sequences, an absent optional
  const std::string what = "input '" + vi.name + "'";
  if (v.kind != Value::Kind::Tensor) fail(m.name, what + " must be a tensor of " + vi.dtype->name() + ", given a " +
                                                    (v.kind == Value::Kind::Sequence ? "sequence" : "tensor of strings"));
  const Tensor& t = v.tensor;
  DType got = dtypes::strong(t.dtype());
  if (got != *vi.dtype)
    fail(m.name, what + " is " + got.name() + ", the graph declares " + vi.dtype->name() + ": cast it with .cast(" +
                     vi.dtype->name() + ")");
  if (!vi.has_shape) return;
  bool ok = t.shape().size() == vi.shape.size();
  for (size_t i = 0; ok && i < vi.shape.size(); i++) ok = vi.shape[i] < 0 || vi.shape[i] == t.shape()[i];
  if (!ok)
    fail(m.name, what + " has shape " + shape_str(t.shape()) + ", the graph declares " + declared_shape(vi.shape) +
                     " ('?': any size)");
}

}  // namespace

std::map<std::string, Value> Model::run(const std::map<std::string, Value>& inputs) const {
  std::map<std::string, Value> scope;
  for (const auto& vi : impl_->inputs) {
    auto it = inputs.find(vi.name);
    if (it == inputs.end()) {
      if (impl_->kinds.count(vi.name) && impl_->kinds.at(vi.name) == "optional") {
        scope[vi.name] = Value{};
        continue;
      }
      fail(impl_->name, "input '" + vi.name + "' was not given");
    }
    check_input(*impl_, vi, it->second);
    scope[vi.name] = it->second;
  }
  for (const auto& [k, v] : inputs)
    if (!scope.count(k)) {
      bool is_init = impl_->initializers.count(k) > 0;
      if (!is_init) fail(impl_->name, "the model has no input '" + k + "'");
      scope[k] = v;  // overriding an initializer
    }
  const Impl& m = *impl_;
  auto eager = [&]() {
    std::vector<Value> outs = run_graph(m, main_graph(m, inputs), scope, {});
    std::map<std::string, Value> res;
    for (size_t i = 0; i < outs.size(); i++) res[m.outputs[i].name] = outs[i];
    return res;
  };
  // Replayed runs (ONNX_JIT=0 turns them off): the graph's kernels for one input signature are captured by
  // TinyJit and launched again without building, scheduling or lowering anything. Inputs that are all tensors
  // and are all declared inputs (not initializer overrides) qualify; a graph that reads input data on the host
  // (a shape or a branch taken from values) or returns sequences runs eagerly from then on.
  std::vector<std::string> names;
  std::vector<Tensor> ins;
  std::string sig;
  for (const auto& vi : m.inputs) {
    auto it = inputs.find(vi.name);
    if (it == inputs.end()) {
      sig += vi.name + "=none;";
      continue;
    }
    if (it->second.kind != Value::Kind::Tensor) return eager();
    const Tensor& t = it->second.tensor;
    if (t.is_symbolic()) return eager();
    names.push_back(vi.name);
    ins.push_back(t);
    sig += vi.name + "=" + t.dtype().name() + shape_str(t.shape()) + "@" + t.device() + ";";
  }
  if (names.size() != inputs.size() || getenv_int("ONNX_JIT", 1) == 0) return eager();
  std::shared_ptr<RunJit> rj;
  {
    std::lock_guard lk(m.jits_mu);
    auto it = m.jits.find(sig);
    if (it != m.jits.end()) rj = it->second;
    else if (m.jits.size() < Impl::kMaxJits) rj = m.jits[sig] = std::make_shared<RunJit>();
  }
  if (!rj) return eager();  // too many signatures: new shapes run eagerly
  std::lock_guard lk(rj->mu);
  if (rj->eager) return eager();
  if (!rj->jit) {
    RunJit* state = rj.get();
    const Impl* mp = &m;
    std::map<std::string, Value> fixed;  // the omitted optional inputs
    for (const auto& [k, v] : scope)
      if (!inputs.count(k)) fixed[k] = v;
    rj->jit = std::make_unique<TinyJit>([state, mp, names, fixed](const std::vector<Tensor>& in) {
      std::map<std::string, Value> sc = fixed;
      for (size_t i = 0; i < names.size(); i++) sc[names[i]] = Value::of(in[i]);
      std::vector<Value> outs = run_graph(*mp, main_graph(*mp, {}), sc, {});  // no overrides: those run eagerly
      std::vector<Tensor> ts;
      for (const Value& v : outs) {
        if (v.kind != Value::Kind::Tensor) {
          state->non_tensor = true;
          throw Error("[onnx] an output is not a tensor");
        }
        ts.push_back(v.tensor);
      }
      return ts;
    });
  }
  if (rj->jit->calls() == 2) {
    // The initializers (not overridden: such runs are eager) and Constant nodes' values are the same every run:
    // kernels computing only from them (layout copies of the weights) run in the capture, not in replays.
    std::vector<const Buffer*> weights;
    auto add = [&](const Tensor& t) {
      if (const UOp* b = contiguous_buffer(t.uop().get()))
        if (auto buf = buffer_of(b)) weights.push_back(buf.get());
    };
    for (const auto& [k, t] : m.initializers) add(t);
    for (const auto& [k, t] : m.folded_initializers) add(t);
    for (const auto& [n, v] : m.constants)
      if (v.kind == Value::Kind::Tensor) add(v.tensor);
    rj->jit->set_constant_buffers(std::move(weights));
  }
  std::vector<Tensor> outs;
  try {
    outs = (*rj->jit)(ins);
  } catch (const Error&) {
    if (!rj->jit->reads_inputs_on_host() && !rj->non_tensor) throw;
    rj->eager = true;
    rj->jit.reset();
    return eager();
  }
  // The JIT's outputs are its buffers, overwritten by the next replay: the caller gets copies (buffer to buffer,
  // nothing scheduled).
  std::map<std::string, Value> res;
  std::vector<uint8_t> host;
  for (size_t i = 0; i < outs.size(); i++) {
    const Tensor& t = outs[i];
    const UOp* b = contiguous_buffer(t.uop().get());
    if (!b) {  // a constant or a view: its own contiguous copy, made now
      Tensor c = t.contiguous();
      c.realize();
      res[m.outputs[i].name] = Value::of(c);
      continue;
    }
    std::shared_ptr<Buffer> src = buffer_of(b);
    auto dst = std::make_shared<Buffer>(src->device(), src->dtype(), src->size());
    host.resize(src->nbytes());
    if (!host.empty()) src->copyout(host.data(), host.size()), dst->copyin(host.data(), host.size());
    res[m.outputs[i].name] = Value::of(Tensor(buffer_uop(dst), {int64_t(src->size())}, t.device()).reshape(t.shape()));
  }
  return res;
}

}  // namespace tg::onnx
