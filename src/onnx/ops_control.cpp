// ONNX control flow (If, Loop, Scan: subgraphs run with the enclosing values in scope; conditions and trip counts
// are read on the host), sequences and optionals.
#include <algorithm>

#include "onnx_impl.hpp"

namespace tg::onnx {

namespace {

using Vals = std::vector<Value>;
Vals one(Tensor t) { return {Value::of(std::move(t))}; }

const pb::GraphProto& graph_attr(const Ctx& c, const std::string& name) {
  const auto* a = c.attr(name);
  if (!a || !a->has_g()) c.error("attribute '" + name + "' (a graph) is required");
  return a->g();
}

bool host_bool(const Tensor& t) { return t.cast(dtypes::float64).to_doubles().at(0) != 0; }

Tensor i64(int64_t v) { return Tensor::from_vector(std::vector<int64_t>{v}).reshape({}); }

const std::vector<Tensor>& seq(const Ctx& c, size_t i) {
  if (i >= c.in.size() || c.in[i].kind != Value::Kind::Sequence) c.error("input " + std::to_string(i) + " must be a sequence");
  return c.in[i].sequence;
}

int64_t position(const Ctx& c, size_t i, int64_t def, int64_t n, bool insert) {
  if (!c.has(i)) return def;
  int64_t p = c.ints(i).at(0);
  if (p < 0) p += n;
  if (p < 0 || p > n || (!insert && p == n)) c.error("position " + std::to_string(p) + " out of range for a sequence of " + std::to_string(n));
  return p;
}

Vals op_if(Ctx& c) {
  bool cond = host_bool(c.t(0));
  return run_graph(c.model, graph_attr(c, cond ? "then_branch" : "else_branch"), c.scope, {});
}

Vals op_loop(Ctx& c) {
  const pb::GraphProto& body = graph_attr(c, "body");
  std::optional<int64_t> max_trip;
  if (c.has(0)) max_trip = c.ints(0).at(0);
  bool cond = c.has(1) ? host_bool(c.t(1)) : true;
  Vals state(c.in.begin() + 2, c.in.end());
  size_t n_state = state.size();
  std::vector<std::vector<Tensor>> scans;
  int64_t it = 0;
  constexpr int64_t kMaxIterations = 1 << 20;
  while ((!max_trip || it < *max_trip) && cond) {
    if (it >= kMaxIterations) c.error("more than 2^20 iterations");
    Vals args{Value::of(i64(it)), Value::of(Tensor::full({}, 1, dtypes::bool_))};
    args.insert(args.end(), state.begin(), state.end());
    Vals outs = run_graph(c.model, body, c.scope, args);
    if (outs.size() < 1 + n_state) c.error("the body returns " + std::to_string(outs.size()) + " values, needs at least " + std::to_string(1 + n_state));
    cond = host_bool(outs[0].tensor);
    for (size_t i = 0; i < n_state; i++) {
      state[i] = outs[1 + i];
      if (state[i].kind == Value::Kind::Tensor) state[i].tensor.realize();
    }
    scans.resize(outs.size() - 1 - n_state);
    for (size_t j = 0; j < scans.size(); j++) scans[j].push_back(outs[1 + n_state + j].tensor.realize());
    it++;
  }
  Vals res = state;
  for (auto& s : scans) res.push_back(Value::of(s.empty() ? Tensor::zeros({0}) : stack(s, 0)));
  return res;
}

// One Scan (opset 9+) over states and scan inputs whose scan axis is given per input.
Vals scan_once(Ctx& c, const pb::GraphProto& body, Vals state, const std::vector<Tensor>& xs, const std::vector<int64_t>& in_axes,
               const std::vector<int64_t>& in_dirs, size_t n_scan_out, const std::vector<int64_t>& out_axes,
               const std::vector<int64_t>& out_dirs) {
  int64_t T = xs.empty() ? 0 : xs[0].shape()[size_t(in_axes[0])];
  std::vector<std::vector<Tensor>> outs(n_scan_out);
  for (int64_t t = 0; t < T; t++) {
    Vals args = state;
    for (size_t j = 0; j < xs.size(); j++) {
      int64_t ti = in_dirs[j] ? T - 1 - t : t;
      std::vector<Slice> sl(size_t(xs[j].ndim()), Slice::all());
      sl[size_t(in_axes[j])] = Slice::index(ti);
      std::vector<int64_t> keep;
      Tensor s = xs[j].slice(sl);
      Shape sh;
      for (int64_t d = 0; d < xs[j].ndim(); d++)
        if (d != in_axes[j]) sh.push_back(xs[j].shape()[size_t(d)]);
      args.push_back(Value::of(s.reshape(sh)));
    }
    Vals r = run_graph(c.model, body, c.scope, args);
    for (size_t i = 0; i < state.size(); i++) state[i] = r[i];
    for (size_t j = 0; j < n_scan_out; j++) outs[j].push_back(r[state.size() + j].tensor);
  }
  Vals res = state;
  for (size_t j = 0; j < n_scan_out; j++) {
    if (out_dirs[j]) std::reverse(outs[j].begin(), outs[j].end());
    int64_t ax = out_axes[j];
    if (ax < 0) ax += outs[j][0].ndim() + 1;
    res.push_back(Value::of(stack(outs[j], ax)));
  }
  return res;
}

Vals op_scan(Ctx& c) {
  const pb::GraphProto& body = graph_attr(c, "body");
  int64_t m = c.i("num_scan_inputs", 0);
  size_t first = c.opset < 9 ? 1 : 0;  // opset 8 starts with sequence_lens and has a batch dim
  size_t n_state = c.n() - first - size_t(m);
  size_t n_scan_out = size_t(body.output_size()) - n_state;
  std::vector<int64_t> in_axes = c.ints_attr("scan_input_axes", std::vector<int64_t>(size_t(m), 0));
  std::vector<int64_t> in_dirs = c.ints_attr(c.opset < 9 ? "directions" : "scan_input_directions", std::vector<int64_t>(size_t(m), 0));
  std::vector<int64_t> out_axes = c.ints_attr("scan_output_axes", std::vector<int64_t>(n_scan_out, 0));
  std::vector<int64_t> out_dirs = c.ints_attr("scan_output_directions", std::vector<int64_t>(n_scan_out, 0));
  Vals state(c.in.begin() + long(first), c.in.begin() + long(first + n_state));
  std::vector<Tensor> xs;
  for (size_t j = 0; j < size_t(m); j++) xs.push_back(c.t(first + n_state + j));
  if (c.opset >= 9) {
    for (size_t j = 0; j < xs.size(); j++)
      if (in_axes[j] < 0) in_axes[j] += xs[j].ndim();
    return scan_once(c, body, state, xs, in_axes, in_dirs, n_scan_out, out_axes, out_dirs);
  }
  // opset 8: run each batch entry separately (scan axis 1 of the batched inputs), then stack along the batch.
  int64_t B = xs.empty() ? state[0].tensor.shape()[0] : xs[0].shape()[0];
  std::vector<std::vector<Tensor>> per(n_state + n_scan_out);
  for (int64_t b = 0; b < B; b++) {
    Vals st;
    for (auto& s : state) st.push_back(Value::of(s.tensor.slice({Slice::index(b)}).squeeze(0)));
    std::vector<Tensor> xb;
    for (auto& x : xs) xb.push_back(x.slice({Slice::index(b)}).squeeze(0));
    Vals r = scan_once(c, body, st, xb, std::vector<int64_t>(size_t(m), 0), in_dirs, n_scan_out, std::vector<int64_t>(n_scan_out, 0),
                       std::vector<int64_t>(n_scan_out, 0));
    for (size_t i = 0; i < r.size(); i++) per[i].push_back(r[i].tensor);
  }
  Vals res;
  for (auto& p : per) res.push_back(Value::of(stack(p, 0)));
  return res;
}

// ---------------------------------------------------------------- sequences

Vals op_sequence_empty(Ctx&) { return {Value::seq({})}; }

Vals op_sequence_construct(Ctx& c) {
  std::vector<Tensor> ts;
  for (size_t i = 0; i < c.n(); i++) ts.push_back(c.t(i));
  return {Value::seq(ts)};
}

Vals op_sequence_insert(Ctx& c) {
  std::vector<Tensor> s = seq(c, 0);
  auto n = int64_t(s.size());
  s.insert(s.begin() + position(c, 2, n, n, true), c.t(1));
  return {Value::seq(s)};
}

Vals op_sequence_at(Ctx& c) {
  const auto& s = seq(c, 0);
  auto n = int64_t(s.size());
  return one(s[size_t(position(c, 1, 0, n, false))]);
}

Vals op_sequence_erase(Ctx& c) {
  std::vector<Tensor> s = seq(c, 0);
  auto n = int64_t(s.size());
  if (n == 0) c.error("erase from an empty sequence");
  s.erase(s.begin() + position(c, 1, n - 1, n, false));
  return {Value::seq(s)};
}

Vals op_sequence_length(Ctx& c) { return one(i64(int64_t(seq(c, 0).size()))); }

Vals op_concat_from_sequence(Ctx& c) {
  const auto& s = seq(c, 0);
  if (s.empty()) c.error("empty sequence");
  int64_t axis = c.i("axis", 0);
  if (c.i("new_axis", 0)) {
    if (axis < 0) axis += s[0].ndim() + 1;
    return one(stack(s, axis));
  }
  if (axis < 0) axis += s[0].ndim();
  return one(cat(s, axis));
}

Vals op_split_to_sequence(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t axis = c.i("axis", 0);
  if (axis < 0) axis += x.ndim();
  int64_t n = x.shape()[size_t(axis)];
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (!c.has(1)) {
    sizes.assign(size_t(n), 1);
    squeeze = !c.i("keepdims", 1);
  } else if (c.t(1).ndim() == 0) {
    int64_t k = c.ints(1)[0];
    for (int64_t o = 0; o < n; o += k) sizes.push_back(std::min(k, n - o));
  } else {
    sizes = c.ints(1);
  }
  std::vector<Tensor> parts = x.split(sizes, axis);
  if (squeeze)
    for (auto& p : parts) p = p.squeeze(axis);
  return {Value::seq(parts)};
}

Vals op_sequence_map(Ctx& c) {
  const pb::GraphProto& body = graph_attr(c, "body");
  size_t n = seq(c, 0).size();
  std::vector<std::vector<Tensor>> outs(size_t(body.output_size()));
  for (size_t i = 0; i < n; i++) {
    Vals args;
    for (size_t j = 0; j < c.n(); j++)
      args.push_back(c.in[j].kind == Value::Kind::Sequence ? Value::of(c.in[j].sequence.at(i)) : c.in[j]);
    Vals r = run_graph(c.model, body, c.scope, args);
    for (size_t k = 0; k < r.size(); k++) outs[k].push_back(r[k].tensor);
  }
  Vals res;
  for (auto& o : outs) res.push_back(Value::seq(o));
  return res;
}

// ---------------------------------------------------------------- optionals

Vals op_optional(Ctx& c) { return {c.n() > 0 ? c.in[0] : Value{}}; }
Vals op_optional_has(Ctx& c) {
  bool has = c.n() > 0 && c.in[0].kind != Value::Kind::None;
  return one(Tensor::full({}, has ? 1 : 0, dtypes::bool_));
}
Vals op_optional_get(Ctx& c) {
  if (c.n() == 0 || c.in[0].kind == Value::Kind::None) c.error("the optional is empty");
  return {c.in[0]};
}

}  // namespace

void register_control_ops(std::unordered_map<std::string, OpFn>& t) {
  t["If"] = op_if;
  t["Loop"] = op_loop;
  t["Scan"] = op_scan;
  t["SequenceEmpty"] = op_sequence_empty;
  t["SequenceConstruct"] = op_sequence_construct;
  t["SequenceInsert"] = op_sequence_insert;
  t["SequenceAt"] = op_sequence_at;
  t["SequenceErase"] = op_sequence_erase;
  t["SequenceLength"] = op_sequence_length;
  t["ConcatFromSequence"] = op_concat_from_sequence;
  t["SplitToSequence"] = op_split_to_sequence;
  t["SequenceMap"] = op_sequence_map;
  t["Optional"] = op_optional;
  t["OptionalHasElement"] = op_optional_has;
  t["OptionalGetElement"] = op_optional_get;
}

}  // namespace tg::onnx
