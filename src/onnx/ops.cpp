// ONNX operators as tg Tensor ops: elementwise math, casts, shapes and movement, reductions, nn (conv, pool, norms),
// losses. Each entry reads its inputs and attributes from a Ctx; shape-deciding inputs are read on the host.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "onnx_impl.hpp"

namespace tg::onnx {

namespace {

using Vals = std::vector<Value>;
Vals one(Tensor t) { return {Value::of(std::move(t))}; }

int64_t norm_axis(const Ctx& c, int64_t a, int64_t rank) {
  if (a < -rank || a >= std::max<int64_t>(rank, 1)) c.error("axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
  return a < 0 ? a + rank : a;
}

Tensor like(const Tensor& x, double v) { return Tensor::full({}, v, x.dtype(), x.device()); }
Tensor scalar(double v, DType d) { return Tensor::full({}, v, d); }
Tensor int64s(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v).reshape(s); }

int64_t prod(const Shape& s, size_t from = 0, size_t to = SIZE_MAX) {
  to = std::min(to, s.size());
  if (from >= to) return 1;
  return std::accumulate(s.begin() + long(from), s.begin() + long(to), int64_t(1), std::multiplies<>());
}

// ---------------------------------------------------------------- elementwise

Tensor to_float(const Tensor& x) { return dtypes::is_float(x.dtype()) ? x : x.cast(dtypes::float32); }

template <class F>
OpFn unary(F f) {
  return [f](Ctx& c) { return one(f(c.t(0))); };
}
template <class F>
OpFn float_unary(F f) {
  return [f](Ctx& c) {
    const Tensor& x = c.t(0);
    return one(f(x).cast(x.dtype()));
  };
}

Tensor binop(const Ctx& c, const std::string& op, const Tensor& a, const Tensor& b) {
  if (op == "Add") return a + b;
  if (op == "Sub") return a - b;
  if (op == "Mul") return a * b;
  if (op == "Div") {
    if (dtypes::is_float(a.dtype())) return a / b;
    return a.alu(Ops::IDIV, b);  // C (truncating) division, like numpy's int divide cast back
  }
  c.error("unknown binary op " + op);
}

Vals op_binary(Ctx& c) {
  const std::string& op = c.node.op_type();
  Tensor a = c.t(0), b = c.t(1);
  if (a.dtype() != b.dtype()) b = b.cast(a.dtype());
  Tensor r = binop(c, op, a, b);
  return one(r.cast(a.dtype()));
}

Vals op_pow(Ctx& c) {
  Tensor x = c.t(0), y = c.t(1);
  if (!dtypes::is_float(x.dtype())) {
    // integer base: exact repeated products are not available lazily; pow in float64 and round
    Tensor r = x.cast(dtypes::float64).pow(y.cast(dtypes::float64));
    return one(r.round().cast(x.dtype()));
  }
  if (!dtypes::is_float(y.dtype())) y = y.cast(x.dtype());
  DType wide = x.dtype() == dtypes::float64 ? dtypes::float64 : dtypes::float32;
  return one(x.cast(wide).pow(y.cast(wide)).cast(x.dtype()));
}

Vals op_mod(Ctx& c) {
  Tensor a = c.t(0), b = c.t(1);
  if (a.dtype() != b.dtype()) b = b.cast(a.dtype());
  if (c.i("fmod", 0)) {
    if (dtypes::is_float(a.dtype())) {
      Tensor q = (a / b).trunc();
      return one((a - q * b).cast(a.dtype()));
    }
    return one(a.alu(Ops::MOD, b));
  }
  return one(a.mod(b).cast(a.dtype()));
}

Vals op_compare(Ctx& c) {
  const std::string& op = c.node.op_type();
  Tensor a = c.t(0), b = c.t(1);
  if (a.dtype() != b.dtype()) b = b.cast(a.dtype());
  if (op == "Equal") return one(a.eq(b));
  if (op == "Less") return one(a.lt(b));
  if (op == "Greater") return one(a.gt(b));
  if (op == "LessOrEqual") return one(a.le(b));
  if (op == "GreaterOrEqual") return one(a.ge(b));
  c.error("unknown comparison");
}

Vals op_logical(Ctx& c) {
  const std::string& op = c.node.op_type();
  Tensor a = c.t(0).cast(dtypes::bool_), b = c.t(1).cast(dtypes::bool_);
  if (op == "And") return one(a.logical_and(b));
  if (op == "Or") return one(a.logical_or(b));
  return one(a.logical_xor(b));
}

Vals op_bitwise(Ctx& c) {
  const std::string& op = c.node.op_type();
  Tensor a = c.t(0);
  if (op == "BitwiseNot") return one(a.bitwise_not());
  Tensor b = c.t(1);
  if (op == "BitwiseAnd") return one(a.bitwise_and(b));
  if (op == "BitwiseOr") return one(a.bitwise_or(b));
  if (op == "BitwiseXor") return one(a.bitwise_xor(b));
  std::string dir = c.s("direction", "");
  if (dir == "LEFT") return one(a.lshift(b.cast(a.dtype())));
  if (dir == "RIGHT") return one(a.rshift(b.cast(a.dtype())));
  c.error("direction must be LEFT or RIGHT, got '" + dir + "'");
}

Vals op_variadic(Ctx& c) {
  const std::string& op = c.node.op_type();
  Tensor r = c.t(0);
  for (size_t i = 1; i < c.n(); i++) {
    Tensor b = c.t(i).cast(r.dtype());
    if (op == "Sum" || op == "Mean") r = r + b;
    else if (op == "Max") r = r.maximum(b);
    else r = r.minimum(b);
  }
  if (op == "Mean") r = r / double(c.n());
  if (c.n() == 1) r = r + like(r, 0);  // broadcast-free copy
  return one(r.cast(c.t(0).dtype()));
}

Tensor cast_to(const Tensor& x, DType d) {
  if (d == dtypes::bool_) return x.ne(like(x, 0));
  if (d == dtypes::bfloat16 && x.dtype() == dtypes::float32) {
    // ONNX (to 1.13, which this test data follows) truncates float32 to bfloat16: the upper 16 bits
    Tensor hi = x.bitcast(dtypes::uint32).rshift(Tensor::full({}, 16, dtypes::uint32));
    return hi.cast(dtypes::uint16).bitcast(dtypes::bfloat16);
  }
  return x.cast(d);
}

// Casts from and to strings go through the host: numbers print in their shortest round-trip form (as numpy's str).
Value strings_of(const Tensor& x) {
  std::vector<std::string> out;
  bool is_f32 = x.dtype() != dtypes::float64 && dtypes::is_float(x.dtype());
  for (double v : x.to_doubles()) {
    char buf[64];
    std::string str;
    if (std::isnan(v)) str = "NaN";
    else if (std::isinf(v)) str = v > 0 ? "INF" : "-INF";
    else if (!dtypes::is_float(x.dtype())) str = std::to_string(int64_t(v));
    else {
      auto r = is_f32 ? std::to_chars(buf, buf + sizeof buf, float(v)) : std::to_chars(buf, buf + sizeof buf, v);
      str.assign(buf, r.ptr);
    }
    out.push_back(str);
  }
  return Value::of_strings(out, x.shape());
}

Tensor parse_strings(const Ctx& c, const Value& v, DType d) {
  std::vector<double> vals;
  for (const auto& s : v.strings) {
    char* end = nullptr;
    double x = std::strtod(s.c_str(), &end);
    if (end == s.c_str()) c.error("cannot parse '" + s + "' as a number");
    vals.push_back(x);
  }
  return cast_to(Tensor::from_vector(vals).reshape(v.strings_shape), d);
}

Vals cast_value(const Ctx& c, int32_t to) {
  if (c.is_strings(0)) {
    if (to == pb::TensorProto::STRING) return {c.in[0]};
    return one(parse_strings(c, c.in[0], dtype_of_onnx(to, c.model.name)));
  }
  if (to == pb::TensorProto::STRING) return {strings_of(c.t(0))};
  return one(cast_to(c.t(0), dtype_of_onnx(to, c.model.name)));
}

Vals op_cast(Ctx& c) { return cast_value(c, int32_t(c.i("to", 0))); }

Vals op_castlike(Ctx& c) { return cast_value(c, c.is_strings(1) ? int32_t(pb::TensorProto::STRING) : onnx_of_dtype(c.t(1).dtype())); }

Vals op_string_normalizer(Ctx& c) {
  if (!c.is_strings(0)) c.error("input must be a tensor of strings");
  const Value& x = c.in[0];
  std::string action = c.s("case_change_action", "NONE");
  bool sensitive = c.i("is_case_sensitive", 0);
  std::vector<std::string> stop;
  if (const auto* a = c.attr("stopwords")) stop.assign(a->strings().begin(), a->strings().end());
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  std::vector<std::string> out;
  for (const auto& s : x.strings) {
    bool drop = std::any_of(stop.begin(), stop.end(), [&](const std::string& w) { return sensitive ? w == s : lower(w) == lower(s); });
    if (drop) continue;
    std::string r = s;
    if (action == "LOWER") r = lower(r);
    else if (action == "UPPER")
      for (auto& ch : r) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    out.push_back(r);
  }
  bool two_d = x.strings_shape.size() == 2;
  if (out.empty()) return {Value::of_strings({""}, two_d ? Shape{1, 1} : Shape{1})};
  auto n = int64_t(out.size());
  return {Value::of_strings(out, two_d ? Shape{1, n} : Shape{n})};
}

Vals op_clip(Ctx& c) {
  Tensor x = c.t(0);
  std::optional<Tensor> lo, hi;
  if (c.opset < 11) {
    if (c.has_attr("min")) lo = like(x, c.f("min", 0));
    if (c.has_attr("max")) hi = like(x, c.f("max", 0));
  } else {
    if (c.has(1)) lo = c.t(1).cast(x.dtype());
    if (c.has(2)) hi = c.t(2).cast(x.dtype());
  }
  if (lo) x = x.maximum(*lo);
  if (hi) x = x.minimum(*hi);
  return one(x);
}

Vals op_where(Ctx& c) {
  Tensor a = c.t(1), b = c.t(2);
  return one(where(c.t(0).cast(dtypes::bool_), a, b.cast(a.dtype())));
}

Vals op_isinf(Ctx& c) {
  Tensor x = c.t(0);
  bool neg = c.i("detect_negative", 1), pos = c.i("detect_positive", 1);
  Tensor r = (x == like(x, INFINITY)).logical_and(pos);
  r = r.logical_or((x == like(x, -INFINITY)).logical_and(neg));
  return one(r);
}

Vals op_prelu(Ctx& c) {
  Tensor x = c.t(0), s = c.t(1).cast(x.dtype());
  return one((x < like(x, 0)).where(x * s, x));
}

Tensor selu(const Tensor& x, double alpha, double gamma) {
  return (x > 0.0).where(x * gamma, ((x.exp() - 1.0) * alpha) * gamma);
}

// ---------------------------------------------------------------- constants and shapes

Vals op_constant(Ctx& c) {
  if (auto it = c.model.constants.find(&c.node); it != c.model.constants.end()) return {it->second};  // read by load
  if (const auto* a = c.attr("value")) return {value_of_proto(a->t(), c.model.name, c.model.base_dir)};
  if (const auto* a = c.attr("value_float")) return one(Tensor::full({}, a->f(), dtypes::float32));
  if (const auto* a = c.attr("value_int")) return one(int64s({a->i()}, {}));
  if (const auto* a = c.attr("value_floats")) {
    std::vector<float> v(a->floats().begin(), a->floats().end());
    return one(Tensor::from_vector(v, {int64_t(v.size())}));
  }
  if (const auto* a = c.attr("value_ints")) {
    std::vector<int64_t> v(a->ints().begin(), a->ints().end());
    return one(Tensor::from_vector(v, {int64_t(v.size())}));
  }
  c.error("only tensor, float(s) and int(s) constants are supported");
}

Vals op_constant_of_shape(Ctx& c) {
  Shape s = c.ints(0);
  Tensor v = Tensor::full({}, 0, dtypes::float32);
  if (const auto* a = c.attr("value")) v = tensor_of_proto(a->t(), c.model.name, "").reshape({});
  return one(v.reshape(Shape(s.size(), 1)).expand(s).contiguous());
}

Vals op_shape(Ctx& c) {
  const Shape& s = c.t(0).shape();
  auto r = int64_t(s.size());
  int64_t start = c.i("start", 0), end = c.i("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, start, r);
  std::vector<int64_t> v(s.begin() + start, s.begin() + end);
  return one(int64s(v, {int64_t(v.size())}));
}

Vals op_size(Ctx& c) { return one(int64s({c.t(0).numel()}, {})); }

Vals op_reshape(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<int64_t> s = c.opset < 5 ? c.ints_attr("shape") : c.ints(1);
  bool allowzero = c.i("allowzero", 0);
  for (size_t i = 0; i < s.size(); i++)
    if (s[i] == 0 && !allowzero) {
      if (i >= x.shape().size()) c.error("shape has a 0 at dim " + std::to_string(i) + " past the input's rank");
      s[i] = x.shape()[i];
    }
  return one(x.reshape(s));
}

Vals op_flatten(Ctx& c) {
  const Tensor& x = c.t(0);
  auto r = int64_t(x.ndim());
  int64_t axis = c.i("axis", 1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) c.error("axis out of range");
  return one(x.reshape({prod(x.shape(), 0, size_t(axis)), prod(x.shape(), size_t(axis))}));
}

std::vector<int64_t> axes_of(Ctx& c, size_t input) {
  if (c.opset >= 13 && c.has(input)) return c.ints(input);
  return c.ints_attr("axes");
}

Vals op_squeeze(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<int64_t> axes = axes_of(c, 1);
  Shape out;
  auto r = int64_t(x.ndim());
  std::vector<bool> drop(size_t(r), false);
  if (axes.empty()) {
    for (int64_t i = 0; i < r; i++) drop[size_t(i)] = x.shape()[size_t(i)] == 1;
  } else {
    for (int64_t a : axes) drop[size_t(norm_axis(c, a, r))] = true;
  }
  for (int64_t i = 0; i < r; i++)
    if (!drop[size_t(i)]) out.push_back(x.shape()[size_t(i)]);
  return one(x.reshape(out));
}

Vals op_unsqueeze(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<int64_t> axes = axes_of(c, 1);
  auto r = int64_t(x.ndim() + axes.size());
  std::vector<bool> add(size_t(r), false);
  for (int64_t a : axes) add[size_t(norm_axis(c, a, r))] = true;
  Shape out;
  size_t j = 0;
  for (int64_t i = 0; i < r; i++) out.push_back(add[size_t(i)] ? 1 : x.shape()[j++]);
  return one(x.reshape(out));
}

Vals op_transpose(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<int64_t> perm = c.ints_attr("perm");
  if (perm.empty())
    for (int64_t i = x.ndim() - 1; i >= 0; i--) perm.push_back(i);
  return one(x.permute(perm));
}

Vals op_concat(Ctx& c) {
  std::vector<Tensor> ts;
  for (size_t i = 0; i < c.n(); i++) ts.push_back(c.t(i));
  int64_t axis = norm_axis(c, c.i("axis", 0), ts[0].ndim());
  std::vector<Tensor> nonempty;
  for (auto& t : ts)
    if (t.shape()[size_t(axis)] != 0) nonempty.push_back(t);
  if (nonempty.empty()) return one(ts[0]);
  if (nonempty.size() == 1) return one(nonempty[0]);
  return one(cat(nonempty, axis));
}

Vals op_split(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t axis = norm_axis(c, c.i("axis", 0), x.ndim());
  int64_t dim = x.shape()[size_t(axis)];
  std::vector<int64_t> sizes = c.opset >= 13 ? (c.has(1) ? c.ints(1) : std::vector<int64_t>{}) : c.ints_attr("split");
  if (sizes.empty()) {
    int64_t n = c.has_attr("num_outputs") ? c.i("num_outputs", 1) : c.node.output_size();
    int64_t each = (dim + n - 1) / n;
    for (int64_t i = 0; i < n; i++) sizes.push_back(std::max<int64_t>(0, std::min(each, dim - i * each)));
  }
  Vals out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    std::vector<std::pair<int64_t, int64_t>> sh;
    for (int64_t d = 0; d < x.ndim(); d++) sh.push_back(d == axis ? std::pair{off, off + s} : std::pair{int64_t(0), x.shape()[size_t(d)]});
    out.push_back(Value::of(x.shrink(sh)));
    off += s;
  }
  return out;
}

// ONNX Slice semantics for one axis, as a shrink (+ flip) and a stride.
Tensor slice_axis(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  int64_t n = x.shape()[size_t(axis)];
  if (step == 0) throw Error("[onnx] Slice step must not be 0");
  if (start < 0) start += n;
  if (end < 0) end += n;
  Tensor y = x;
  std::vector<std::pair<int64_t, int64_t>> sh;
  for (int64_t d = 0; d < x.ndim(); d++) sh.push_back({0, x.shape()[size_t(d)]});
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, n);
    end = std::clamp<int64_t>(end, 0, n);
    end = std::max(end, start);
    sh[size_t(axis)] = {start, end};
    y = y.shrink(sh);
  } else {
    start = std::clamp<int64_t>(start, -1, n - 1);
    end = std::clamp<int64_t>(end, -1, n - 1);
    if (end > start) end = start;
    sh[size_t(axis)] = {end + 1, start + 1};
    y = y.shrink(sh).flip({axis});
    step = -step;
  }
  if (step != 1) {
    std::vector<Slice> sl(size_t(x.ndim()), Slice::all());
    sl[size_t(axis)] = Slice{std::nullopt, std::nullopt, step};
    y = y.slice(sl);
  }
  return y;
}

Vals op_slice(Ctx& c) {
  Tensor x = c.t(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset < 10) {
    starts = c.ints_attr("starts");
    ends = c.ints_attr("ends");
    axes = c.ints_attr("axes");
  } else {
    starts = c.ints(1);
    ends = c.ints(2);
    if (c.has(3)) axes = c.ints(3);
    if (c.has(4)) steps = c.ints(4);
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); i++) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.error("starts, ends, axes and steps differ in length");
  for (size_t i = 0; i < starts.size(); i++) x = slice_axis(x, norm_axis(c, axes[i], x.ndim()), starts[i], ends[i], steps[i]);
  return one(x);
}

Tensor norm_index(const Tensor& idx, int64_t n) {
  Tensor i = idx.cast(dtypes::int64);
  return (i < scalar(0, dtypes::int64)).where(i + scalar(double(n), dtypes::int64), i);
}

Vals op_gather(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t axis = norm_axis(c, c.i("axis", 0), x.ndim());
  Tensor idx = norm_index(c.t(1), x.shape()[size_t(axis)]);
  Shape out(x.shape().begin(), x.shape().begin() + axis);
  for (int64_t d : idx.shape()) out.push_back(d);
  for (size_t d = size_t(axis) + 1; d < x.shape().size(); d++) out.push_back(x.shape()[d]);
  if (idx.numel() == 0) return one(Tensor::zeros(out, x.dtype()));
  return one(x.index_select(axis, idx.reshape({idx.numel()})).reshape(out));
}

Vals op_gather_elements(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t axis = norm_axis(c, c.i("axis", 0), x.ndim());
  return one(x.gather(axis, norm_index(c.t(1), x.shape()[size_t(axis)])));
}

Vals op_gather_nd(Ctx& c) {
  const Tensor& x = c.t(0);
  Tensor idx = c.t(1).cast(dtypes::int64);
  int64_t b = c.i("batch_dims", 0);
  int64_t k = idx.shape().back();
  // flatten the batch dims, turn the k-tuples into flat offsets into (batch, prod(dims[b:b+k])) rows
  int64_t batch = prod(x.shape(), 0, size_t(b));
  Shape inner(x.shape().begin() + b + k, x.shape().end());
  int64_t inner_n = prod(inner);
  Tensor flat = x.reshape({batch * prod(x.shape(), size_t(b), size_t(b + k)), inner_n});
  Shape ishape(idx.shape().begin(), idx.shape().end() - 1);
  int64_t per_batch = prod(ishape, size_t(b));
  Tensor off = Tensor::zeros(ishape, dtypes::int64);
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; j--) {
    int64_t n = x.shape()[size_t(b + j)];
    std::vector<Slice> sl(idx.shape().size(), Slice::all());
    sl.back() = Slice::index(j);
    Tensor ij = norm_index(idx.slice(sl).reshape(ishape), n);
    off = off + ij * scalar(double(stride), dtypes::int64);
    stride *= n;
  }
  Tensor base = Tensor::arange(0, double(batch), 1, dtypes::int64) * scalar(double(stride), dtypes::int64);
  off = off.reshape({batch, per_batch}) + base.reshape({batch, 1});
  Tensor r = flat.index_select(0, off.reshape({batch * per_batch}));
  Shape out = ishape;
  for (int64_t d : inner) out.push_back(d);
  return one(r.reshape(out));
}

Vals op_scatter_elements(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t axis = norm_axis(c, c.i("axis", 0), x.ndim());
  Tensor idx = norm_index(c.t(1), x.shape()[size_t(axis)]);
  std::string red = c.s("reduction", "none");
  if (red == "none") return one(x.scatter(axis, idx, c.t(2)));
  std::string r = red == "add" ? "sum" : red == "mul" ? "prod" : red == "max" ? "amax" : red == "min" ? "amin" : red;
  return one(x.scatter_reduce(axis, idx, c.t(2), r, true));
}

Vals op_scatter_nd(Ctx& c) {
  const Tensor& x = c.t(0);
  Tensor idx = c.t(1).cast(dtypes::int64);
  const Tensor& upd = c.t(2);
  int64_t k = idx.shape().back();
  Shape inner(x.shape().begin() + k, x.shape().end());
  int64_t rows = prod(x.shape(), 0, size_t(k)), inner_n = prod(inner);
  Shape ishape(idx.shape().begin(), idx.shape().end() - 1);
  Tensor off = Tensor::zeros(ishape, dtypes::int64);
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; j--) {
    int64_t n = x.shape()[size_t(j)];
    std::vector<Slice> sl(idx.shape().size(), Slice::all());
    sl.back() = Slice::index(j);
    off = off + norm_index(idx.slice(sl).reshape(ishape), n) * scalar(double(stride), dtypes::int64);
    stride *= n;
  }
  int64_t m = prod(ishape);
  Tensor flat = x.reshape({rows, inner_n});
  Tensor u = upd.reshape({m, inner_n}).cast(x.dtype());
  Tensor index = off.reshape({m, 1}).expand({m, inner_n});
  std::string red = c.s("reduction", "none");
  if (red == "none") return one(flat.scatter(0, index, u).reshape(x.shape()));
  std::string r = red == "add" ? "sum" : red == "mul" ? "prod" : red == "max" ? "amax" : "amin";
  return one(flat.scatter_reduce(0, index, u, r, true).reshape(x.shape()));
}

Vals op_tile(Ctx& c) { return one(c.t(0).repeat(c.ints(1))); }

Shape broadcast(const Ctx& c, Shape a, Shape b) {
  while (a.size() < b.size()) a.insert(a.begin(), 1);
  while (b.size() < a.size()) b.insert(b.begin(), 1);
  for (size_t i = 0; i < a.size(); i++) {
    if (a[i] == b[i] || b[i] == 1) continue;
    if (a[i] == 1) a[i] = b[i];
    else c.error("shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
  }
  return a;
}

Vals op_expand(Ctx& c) {
  const Tensor& x = c.t(0);
  Shape out = broadcast(c, x.shape(), c.ints(1));
  Shape xs = x.shape();
  while (xs.size() < out.size()) xs.insert(xs.begin(), 1);
  return one(x.reshape(xs).expand(out));
}

Vals op_range(Ctx& c) {
  DType d = c.t(0).dtype();
  double start = c.floats(0)[0], limit = c.floats(1)[0], delta = c.floats(2)[0];
  return one(Tensor::arange(start, limit, delta, d));
}

Vals op_trilu(Ctx& c) {
  int64_t k = c.has(1) ? c.ints(1)[0] : 0;
  const Tensor& x = c.t(0);
  return one(c.i("upper", 1) ? x.triu(k) : x.tril(k));
}

Vals op_pad(Ctx& c) {
  Tensor x = c.t(0);
  auto r = int64_t(x.ndim());
  std::vector<int64_t> pads;
  double value = 0;
  if (c.opset < 11) {
    pads = c.ints_attr(c.opset < 2 ? "paddings" : "pads");
    value = c.f("value", 0);
  } else {
    pads = c.ints(1);
    if (c.has(2)) value = c.floats(2)[0];
  }
  std::vector<int64_t> axes;
  if (c.has(3)) axes = c.ints(3);
  else
    for (int64_t i = 0; i < r; i++) axes.push_back(i);
  if (pads.size() != 2 * axes.size()) c.error("pads has " + std::to_string(pads.size()) + " values for " + std::to_string(axes.size()) + " axes");
  std::vector<std::pair<int64_t, int64_t>> p(size_t(r), {0, 0});
  for (size_t i = 0; i < axes.size(); i++) p[size_t(norm_axis(c, axes[i], r))] = {pads[i], pads[i + axes.size()]};
  std::string mode = c.s("mode", "constant");
  if (mode == "edge") mode = "replicate";
  else if (mode == "wrap") mode = "circular";
  return one(x.pad(p, mode, value));
}

Vals op_depth_to_space(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t b = c.i("blocksize", 1);
  auto s = x.shape();
  int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  if (c.s("mode", "DCR") == "DCR")
    return one(x.reshape({N, b, b, C / (b * b), H, W}).permute({0, 3, 4, 1, 5, 2}).reshape({N, C / (b * b), H * b, W * b}));
  return one(x.reshape({N, C / (b * b), b, b, H, W}).permute({0, 1, 4, 2, 5, 3}).reshape({N, C / (b * b), H * b, W * b}));
}

Vals op_space_to_depth(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t b = c.i("blocksize", 1);
  auto s = x.shape();
  int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  return one(x.reshape({N, C, H / b, b, W / b, b}).permute({0, 3, 5, 1, 2, 4}).reshape({N, C * b * b, H / b, W / b}));
}

Vals op_onehot(Ctx& c) {
  Tensor idx = c.t(0);
  int64_t depth = int64_t(c.floats(1)[0]);
  Tensor vals = c.t(2);
  int64_t r = idx.ndim() + 1;
  int64_t axis = norm_axis(c, c.i("axis", -1), r);
  Tensor i = idx.cast(dtypes::int64);
  i = (i < scalar(0, dtypes::int64)).where(i + scalar(double(depth), dtypes::int64), i);
  Shape rs(size_t(r), 1);
  rs[size_t(axis)] = depth;
  Tensor ar = Tensor::arange(0, double(depth), 1, dtypes::int64).reshape(rs);
  Tensor hit = i.unsqueeze(axis).eq(ar);
  std::vector<Slice> s0{Slice::index(0)}, s1{Slice::index(1)};
  Tensor off = vals.slice(s0).reshape({}), on = vals.slice(s1).reshape({});
  return one(hit.where(on, off));
}

Vals op_eyelike(Ctx& c) {
  const Tensor& x = c.t(0);
  DType d = c.has_attr("dtype") ? dtype_of_onnx(int32_t(c.i("dtype", 1)), c.model.name) : x.dtype();
  int64_t k = c.i("k", 0), n = x.shape()[0], m = x.shape()[1];
  Tensor rows = Tensor::arange(0, double(n), 1, dtypes::int64).reshape({n, 1});
  Tensor cols = Tensor::arange(0, double(m), 1, dtypes::int64).reshape({1, m});
  return one((rows + scalar(double(k), dtypes::int64)).eq(cols).cast(d));
}

Vals op_compress(Ctx& c) {
  Tensor x = c.t(0);
  std::vector<int64_t> cond = c.ints(1);
  int64_t axis;
  if (!c.has_attr("axis")) {
    x = x.reshape({x.numel()});
    axis = 0;
  } else {
    axis = norm_axis(c, c.i("axis", 0), x.ndim());
  }
  std::vector<int64_t> keep;
  for (size_t i = 0; i < cond.size() && int64_t(i) < x.shape()[size_t(axis)]; i++)
    if (cond[i]) keep.push_back(int64_t(i));
  if (keep.empty()) {
    Shape s = x.shape();
    s[size_t(axis)] = 0;
    return one(Tensor::zeros(s, x.dtype()));
  }
  return one(x.index_select(axis, int64s(keep, {int64_t(keep.size())})));
}

Vals op_cumsum(Ctx& c) {
  Tensor x = c.t(0);
  int64_t axis = norm_axis(c, c.ints(1)[0], x.ndim());
  bool rev = c.i("reverse", 0), excl = c.i("exclusive", 0);
  if (rev) x = x.flip({axis});
  if (excl) {
    std::vector<std::pair<int64_t, int64_t>> p(size_t(x.ndim()), {0, 0}), sh;
    p[size_t(axis)] = {1, 0};
    for (int64_t d = 0; d < x.ndim(); d++) sh.push_back({0, x.shape()[size_t(d)]});
    x = x.pad(p).shrink(sh);
  }
  Tensor r = x.cumsum(axis).cast(x.dtype());
  if (rev) r = r.flip({axis});
  return one(r);
}

// ---------------------------------------------------------------- reductions

Vals op_reduce(Ctx& c) {
  const std::string& op = c.node.op_type();
  Tensor x = c.t(0);
  std::vector<int64_t> axes;
  bool from_input = op == "ReduceSum" ? c.opset >= 13 : c.opset >= 18;
  if (from_input) {
    if (c.has(1)) axes = c.ints(1);
  } else {
    axes = c.ints_attr("axes");
  }
  bool keep = c.i("keepdims", 1);
  if (axes.empty()) {
    if (c.i("noop_with_empty_axes", 0)) return one(x);
    for (int64_t i = 0; i < x.ndim(); i++) axes.push_back(i);
  }
  for (auto& a : axes) a = norm_axis(c, a, x.ndim());
  DType d = x.dtype();
  if (x.numel() == 0 && (op == "ReduceMax" || op == "ReduceMin")) {
    Shape s = x.shape();
    for (auto a : axes) s[size_t(a)] = 1;
    double v = op == "ReduceMax" ? -INFINITY : INFINITY;
    if (!dtypes::is_float(d)) v = op == "ReduceMax" ? double(dtypes::min_int(d)) : double(dtypes::max_int(d));
    Tensor r = Tensor::full(s, v, d);
    if (!keep) {
      Shape o;
      for (int64_t i = 0; i < x.ndim(); i++)
        if (std::find(axes.begin(), axes.end(), i) == axes.end()) o.push_back(s[size_t(i)]);
      r = r.reshape(o);
    }
    return one(r);
  }
  Tensor r;
  if (op == "ReduceSum") r = x.sum(axes, keep);
  else if (op == "ReduceMean") r = x.mean(axes, keep);
  else if (op == "ReduceMax") r = x.max(axes, keep);
  else if (op == "ReduceMin") r = x.min(axes, keep);
  else if (op == "ReduceProd") r = x.prod(axes, keep);
  else if (op == "ReduceSumSquare") r = (x * x).sum(axes, keep);
  else if (op == "ReduceL1") r = x.abs().sum(axes, keep);
  else if (op == "ReduceL2") r = (to_float(x) * to_float(x)).sum(axes, keep).sqrt();
  else if (op == "ReduceLogSum") r = to_float(x).sum(axes, keep).log();
  else if (op == "ReduceLogSumExp") r = to_float(x).logsumexp(axes, keep);
  else c.error("unknown reduction");
  return one(r.cast(d));
}

Vals op_arg(Ctx& c) {
  Tensor x = c.t(0);
  int64_t axis = norm_axis(c, c.i("axis", 0), x.ndim());
  bool keep = c.i("keepdims", 1), last = c.i("select_last_index", 0);
  bool is_max = c.node.op_type() == "ArgMax";
  if (last) x = x.flip({axis});
  Tensor r = (is_max ? x.argmax(axis, keep) : x.argmin(axis, keep)).cast(dtypes::int64);
  if (last) r = scalar(double(x.shape()[size_t(axis)] - 1), dtypes::int64) - r;
  return one(r);
}

// Softmax-like ops: opset < 13 works on the input coerced to 2-D at `axis` (default 1).
template <class F>
OpFn softmax_like(F f) {
  return [f](Ctx& c) {
    const Tensor& x = c.t(0);
    if (c.opset < 13) {
      int64_t axis = c.i("axis", 1);
      if (axis < 0) axis += x.ndim();
      Tensor x2 = x.reshape({prod(x.shape(), 0, size_t(axis)), prod(x.shape(), size_t(axis))});
      return one(f(x2, 1).reshape(x.shape()));
    }
    return one(f(x, norm_axis(c, c.i("axis", -1), x.ndim())));
  };
}

Tensor hardmax(const Tensor& x, int64_t axis) {
  Tensor am = x.argmax(axis, true).cast(dtypes::int64);
  Shape rs(size_t(x.ndim()), 1);
  rs[size_t(axis)] = x.shape()[size_t(axis)];
  Tensor ar = Tensor::arange(0, double(x.shape()[size_t(axis)]), 1, dtypes::int64).reshape(rs);
  return am.eq(ar).cast(x.dtype());
}

Vals op_topk(Ctx& c) {
  const Tensor& x = c.t(0);
  int64_t k = c.ints(1)[0];
  int64_t axis = norm_axis(c, c.i("axis", -1), x.ndim());
  auto [v, i] = x.topk(k, axis, c.i("largest", 1) != 0);
  return {Value::of(v), Value::of(i.cast(dtypes::int64))};
}

// ---------------------------------------------------------------- linear algebra

Vals op_matmul(Ctx& c) { return one(c.t(0).matmul(c.t(1))); }

Vals op_gemm(Ctx& c) {
  Tensor a = c.t(0), b = c.t(1);
  if (c.i("transA", 0)) a = a.T();
  if (c.i("transB", 0)) b = b.T();
  double alpha = c.f("alpha", 1), beta = c.f("beta", 1);
  Tensor r = a.matmul(b);
  if (alpha != 1) r = r * like(r, alpha);
  if (c.has(2)) {
    Tensor cc = c.t(2).cast(r.dtype());
    r = r + (beta != 1 ? (cc * like(cc, beta)) : cc);
  }
  return one(r);
}

Vals op_einsum(Ctx& c) {
  std::string eq;
  for (char ch : c.s("equation", ""))
    if (ch != ' ') eq += ch;
  std::vector<Tensor> ts;
  for (size_t i = 0; i < c.n(); i++) ts.push_back(c.t(i));
  return one(einsum(eq, ts).cast(ts[0].dtype()));
}

// ---------------------------------------------------------------- convolution and pooling

struct Window {
  std::vector<int64_t> kernel, strides, dilations, pad_begin, pad_end;
};

// Kernel, strides, dilations and (auto_pad resolved) pads of a conv or pool over `spatial` = input spatial dims.
Window window_of(const Ctx& c, const Shape& spatial, std::vector<int64_t> kernel) {
  size_t n = spatial.size();
  Window w;
  w.kernel = kernel;
  w.strides = c.ints_attr("strides", std::vector<int64_t>(n, 1));
  w.dilations = c.ints_attr("dilations", std::vector<int64_t>(n, 1));
  std::vector<int64_t> pads = c.ints_attr("pads", std::vector<int64_t>(2 * n, 0));
  if (w.strides.size() != n || w.dilations.size() != n || pads.size() != 2 * n || kernel.size() != n)
    c.error("kernel, strides, dilations or pads do not match " + std::to_string(n) + " spatial dims");
  std::string ap = c.s("auto_pad", "NOTSET");
  for (size_t i = 0; i < n; i++) {
    int64_t b = pads[i], e = pads[i + n];
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      int64_t out = (spatial[i] + w.strides[i] - 1) / w.strides[i];
      int64_t total = std::max<int64_t>(0, (out - 1) * w.strides[i] + (kernel[i] - 1) * w.dilations[i] + 1 - spatial[i]);
      b = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      e = total - b;
    } else if (ap == "VALID") {
      b = e = 0;
    }
    w.pad_begin.push_back(b);
    w.pad_end.push_back(e);
  }
  return w;
}

std::vector<std::pair<int64_t, int64_t>> full_pads(const Window& w, int64_t lead) {
  std::vector<std::pair<int64_t, int64_t>> p(size_t(lead), {0, 0});
  for (size_t i = 0; i < w.kernel.size(); i++) p.push_back({w.pad_begin[i], w.pad_end[i]});
  return p;
}

Vals op_conv(Ctx& c) {
  Tensor x = c.t(0), wt = c.t(1);
  Shape spatial(x.shape().begin() + 2, x.shape().end());
  Shape ks(wt.shape().begin() + 2, wt.shape().end());
  Window w = window_of(c, spatial, c.ints_attr("kernel_shape", ks));
  std::vector<int64_t> pads;
  for (size_t i = 0; i < ks.size(); i++) {
    pads.push_back(w.pad_begin[i]);
    pads.push_back(w.pad_end[i]);
  }
  std::optional<Tensor> bias;
  if (c.has(2)) bias = c.t(2);
  return one(x.conv(wt, bias, w.strides, pads, w.dilations, c.i("group", 1)));
}

Vals op_conv_transpose(Ctx& c) {
  Tensor x = c.t(0), wt = c.t(1);
  size_t n = size_t(x.ndim() - 2);
  Shape ks(wt.shape().begin() + 2, wt.shape().end());
  std::vector<int64_t> kernel = c.ints_attr("kernel_shape", ks);
  std::vector<int64_t> strides = c.ints_attr("strides", std::vector<int64_t>(n, 1));
  std::vector<int64_t> dil = c.ints_attr("dilations", std::vector<int64_t>(n, 1));
  std::vector<int64_t> outpad = c.ints_attr("output_padding", std::vector<int64_t>(n, 0));
  std::vector<int64_t> pads = c.ints_attr("pads", std::vector<int64_t>(2 * n, 0));
  std::vector<int64_t> out_shape = c.ints_attr("output_shape");
  std::string ap = c.s("auto_pad", "NOTSET");
  int64_t group = c.i("group", 1);
  Tensor y = x.conv_transpose(wt, std::nullopt, strides, 0, 0, group, dil);
  std::vector<std::pair<int64_t, int64_t>> sh{{0, y.shape()[0]}, {0, y.shape()[1]}}, pp(2, {0, 0});
  for (size_t i = 0; i < n; i++) {
    int64_t in = x.shape()[i + 2];
    int64_t full = (in - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1;
    int64_t b = pads[i], e = pads[i + n];
    if (!out_shape.empty() || ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      int64_t target = !out_shape.empty() ? out_shape[out_shape.size() - n + i] : in * strides[i];
      int64_t total = full + outpad[i] - target;
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor division, as the ONNX reference
      if (ap == "SAME_UPPER") {
        b = half;
        e = total - b;
      } else {
        e = half;
        b = total - e;
      }
    }
    // negative pads (an output_shape larger than the full result) grow the output with zeros
    pp.push_back({std::max<int64_t>(0, -b), outpad[i] + std::max<int64_t>(0, -e)});
    int64_t nb = std::max<int64_t>(0, b), len = full + outpad[i] + std::max<int64_t>(0, -b) + std::max<int64_t>(0, -e);
    sh.push_back({nb, len - std::max<int64_t>(0, e)});
  }
  y = y.pad(pp).shrink(sh);
  if (c.has(2)) {
    Shape bs(size_t(y.ndim()), 1);
    bs[1] = y.shape()[1];
    y = y + c.t(2).reshape(bs);
  }
  return one(y);
}

// MaxPool's Indices output: each window's first maximum as a flat index into the input (row-major, or with
// storage_order 1 column-major over the spatial dims), found by scanning the kernel offsets.
Vals maxpool_with_indices(const Ctx& c, const Tensor& x, const Tensor& xp, const Window& w) {
  size_t n = w.kernel.size();
  const Shape& s = x.shape();
  int64_t plane = prod(s, 2), lead = s[0] * s[1];
  bool col_major = c.i("storage_order", 0) == 1;
  if (col_major && n != 2) c.error("storage_order 1 needs 2 spatial dims");
  std::vector<int64_t> idx(size_t(lead * plane));
  for (int64_t l = 0; l < lead; l++)
    for (int64_t i = 0; i < plane; i++)
      idx[size_t(l * plane + i)] = l * plane + (col_major ? (i % s[3]) * s[2] + i / s[3] : i);
  Tensor ip = Tensor::from_vector(idx, s).pad([&] {
    std::vector<std::pair<int64_t, int64_t>> p(2, {0, 0});
    for (size_t i = 0; i < n; i++) p.push_back({w.pad_begin[i], xp.shape()[i + 2] - s[i + 2] - w.pad_begin[i]});
    return p;
  }(), -1);
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; i++) out.push_back((xp.shape()[i + 2] - ((w.kernel[i] - 1) * w.dilations[i] + 1)) / w.strides[i] + 1);
  std::optional<Tensor> best, best_i;
  std::vector<int64_t> off(n, 0);
  while (true) {
    std::vector<Slice> sl{Slice::all(), Slice::all()};
    for (size_t i = 0; i < n; i++) {
      int64_t st = off[i] * w.dilations[i];
      sl.push_back(Slice{st, st + (out[i] - 1) * w.strides[i] + 1, w.strides[i]});
    }
    Tensor v = xp.slice(sl), vi = ip.slice(sl);
    if (!best) {
      best = v;
      best_i = vi;
    } else {
      Tensor better = v > *best;
      best = better.where(v, *best);
      best_i = better.where(vi, *best_i);
    }
    size_t d = n;
    while (d-- > 0) {
      if (++off[d] < w.kernel[d]) break;
      off[d] = 0;
    }
    if (d == size_t(-1)) break;
  }
  return {Value::of(*best), Value::of(*best_i)};
}

Vals op_maxpool(Ctx& c) {
  Tensor x = c.t(0);
  Shape spatial(x.shape().begin() + 2, x.shape().end());
  Window w = window_of(c, spatial, c.ints_attr("kernel_shape"));
  double lo = dtypes::is_float(x.dtype()) ? -INFINITY : double(dtypes::min_int(x.dtype()));
  Tensor xp = x.pad(full_pads(w, 2), lo);
  bool ceil = c.i("ceil_mode", 0);
  if (ceil) {
    // windows that start inside the (padded) input but hang over its end see only real values
    std::vector<std::pair<int64_t, int64_t>> extra(2, {0, 0});
    for (size_t i = 0; i < spatial.size(); i++) {
      int64_t len = xp.shape()[i + 2], eff = (w.kernel[i] - 1) * w.dilations[i] + 1;
      int64_t out = (len - eff + w.strides[i] - 1) / w.strides[i] + 1;
      if ((out - 1) * w.strides[i] >= len - w.pad_end[i]) out--;
      extra.push_back({0, std::max<int64_t>(0, (out - 1) * w.strides[i] + eff - len)});
    }
    xp = xp.pad(extra, lo);
  }
  if (c.node.output_size() < 2 || c.node.output(1).empty()) return one(xp.max_pool(w.kernel, w.strides, 0, w.dilations, false));
  return maxpool_with_indices(c, x, xp, w);
}

Vals op_avgpool(Ctx& c) {
  Tensor x = c.t(0);
  Shape spatial(x.shape().begin() + 2, x.shape().end());
  Window w = window_of(c, spatial, c.ints_attr("kernel_shape"));
  bool include = c.i("count_include_pad", 0), ceil = c.i("ceil_mode", 0);
  auto p = full_pads(w, 2);
  Tensor xp = x.pad(p, 0.0);
  Tensor ones = Tensor::ones(x.shape(), x.dtype()).pad(p, include ? 1.0 : 0.0);
  if (ceil) {
    std::vector<std::pair<int64_t, int64_t>> extra(2, {0, 0});
    for (size_t i = 0; i < spatial.size(); i++) {
      int64_t len = xp.shape()[i + 2], eff = (w.kernel[i] - 1) * w.dilations[i] + 1;
      int64_t out = (len - eff + w.strides[i] - 1) / w.strides[i] + 1;
      if ((out - 1) * w.strides[i] >= len - w.pad_end[i]) out--;
      extra.push_back({0, std::max<int64_t>(0, (out - 1) * w.strides[i] + eff - len)});
    }
    xp = xp.pad(extra, 0.0);
    ones = ones.pad(extra, 0.0);
  }
  for (int64_t d : w.dilations)
    if (d != 1) c.error("dilations are not supported");
  Tensor s = xp.avg_pool(w.kernel, w.strides, 0, false, true), n = ones.avg_pool(w.kernel, w.strides, 0, false, true);
  return one((s / n).cast(x.dtype()));
}

Vals op_global_pool(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<int64_t> axes;
  for (int64_t i = 2; i < x.ndim(); i++) axes.push_back(i);
  return one(c.node.op_type() == "GlobalMaxPool" ? x.max(axes, true) : x.mean(axes, true));
}

// ---------------------------------------------------------------- normalisation

Shape channel_shape(const Tensor& x) {
  Shape s(size_t(x.ndim()), 1);
  s[1] = x.shape()[1];
  return s;
}

Vals op_batchnorm(Ctx& c) {
  Tensor x = c.t(0);
  Shape cs = channel_shape(x);
  double eps = c.f("epsilon", 1e-5);
  Tensor scale = c.t(1).reshape(cs), bias = c.t(2).reshape(cs);
  bool training = c.i("training_mode", 0) || (c.opset < 9 && c.i("is_test", 1) == 0 && c.node.output_size() > 1);
  if (training) {
    std::vector<int64_t> axes{0};
    for (int64_t i = 2; i < x.ndim(); i++) axes.push_back(i);
    Tensor mean = x.mean(axes), var = x.var(axes, false, 0);
    double mom = c.f("momentum", 0.9);
    Tensor y = (x - mean.reshape(cs)) / (var.reshape(cs) + eps).sqrt() * scale + bias;
    Tensor rm = c.t(3) * mom + mean * (1 - mom), rv = c.t(4) * mom + var * (1 - mom);
    return {Value::of(y.cast(x.dtype())), Value::of(rm.cast(c.t(3).dtype())), Value::of(rv.cast(c.t(4).dtype()))};
  }
  Tensor mean = c.t(3).reshape(cs), var = c.t(4).reshape(cs);
  Tensor y = (x - mean) / (var + eps).sqrt() * scale + bias;
  return one(y.cast(x.dtype()));
}

Vals op_instancenorm(Ctx& c) {
  Tensor x = c.t(0);
  Shape cs = channel_shape(x);
  std::vector<int64_t> axes;
  for (int64_t i = 2; i < x.ndim(); i++) axes.push_back(i);
  Tensor mean = x.mean(axes, true), var = x.var(axes, true, 0);
  Tensor y = (x - mean) / (var + c.f("epsilon", 1e-5)).sqrt() * c.t(1).reshape(cs) + c.t(2).reshape(cs);
  return one(y);
}

Vals op_layernorm(Ctx& c) {
  Tensor x = c.t(0);
  int64_t axis = norm_axis(c, c.i("axis", -1), x.ndim());
  std::vector<int64_t> axes;
  for (int64_t i = axis; i < x.ndim(); i++) axes.push_back(i);
  Tensor xf = x.cast(dtypes::float32);
  Tensor mean = xf.mean(axes, true), var = ((xf - mean) * (xf - mean)).mean(axes, true);
  Tensor inv = (var + c.f("epsilon", 1e-5)).rsqrt();
  Tensor y = ((xf - mean) * inv).cast(x.dtype()) * c.t(1);
  if (c.has(2)) y = y + c.t(2);
  return {Value::of(y), Value::of(mean), Value::of(inv)};
}

Vals op_lrn(Ctx& c) {
  Tensor x = c.t(0);
  int64_t size = c.i("size", 1);
  double alpha = c.f("alpha", 1e-4), beta = c.f("beta", 0.75), bias = c.f("bias", 1.0);
  auto s = x.shape();
  int64_t rest = prod(s, 2);
  Tensor sq = (x * x).reshape({s[0], 1, s[1], rest});
  int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  Tensor sum = sq.pad({{0, 0}, {0, 0}, {lo, hi}, {0, 0}}).avg_pool({size, 1}, {1, 1}) * double(size);
  Tensor den = ((sum.reshape(s) * (alpha / double(size))) + bias).pow(beta);
  return one((x / den).cast(x.dtype()));
}

Vals op_mvn(Ctx& c) {
  Tensor x = c.t(0);
  std::vector<int64_t> axes = c.ints_attr("axes", {0, 2, 3});
  Tensor mean = x.mean(axes, true);
  Tensor var = ((x - mean) * (x - mean)).mean(axes, true);
  return one((x - mean) / (var.sqrt() + 1e-9));
}

// ---------------------------------------------------------------- losses

// -input[n, target[n, ...], ...] * weight[target], with ignore_index, reduced like torch's nll_loss.
Tensor nll(const Ctx& c, const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight,
           const std::string& reduction, std::optional<int64_t> ignore) {
  Tensor t = target.cast(dtypes::int64);
  Tensor mask = Tensor::ones(t.shape(), dtypes::bool_);
  if (ignore) mask = t.ne(scalar(double(*ignore), dtypes::int64));
  Tensor safe = mask.where(t, scalar(0, dtypes::int64));
  Tensor picked = input.gather(1, safe.unsqueeze(1)).squeeze(1);
  Tensor w = mask.cast(input.dtype());
  if (weight) w = w * weight->index_select(0, safe.reshape({safe.numel()})).reshape(safe.shape());
  Tensor loss = -picked * w;
  if (reduction == "none") return loss;
  if (reduction == "sum") return loss.sum();
  if (reduction == "mean") return loss.sum() / w.sum();
  c.error("reduction must be none, sum or mean, got '" + reduction + "'");
}

Vals op_nll(Ctx& c) {
  std::optional<Tensor> w;
  if (c.has(2)) w = c.t(2);
  std::optional<int64_t> ig;
  if (c.has_attr("ignore_index")) ig = c.i("ignore_index", 0);
  return one(nll(c, c.t(0), c.t(1), w, c.s("reduction", "mean"), ig).cast(c.t(0).dtype()));
}

Vals op_sce(Ctx& c) {
  Tensor x = c.t(0);
  Tensor logp = x.log_softmax(1);
  std::optional<Tensor> w;
  if (c.has(2)) w = c.t(2);
  std::optional<int64_t> ig;
  if (c.has_attr("ignore_index")) ig = c.i("ignore_index", 0);
  Tensor loss = nll(c, logp, c.t(1), w, c.s("reduction", "mean"), ig).cast(x.dtype());
  return {Value::of(loss), Value::of(logp.cast(x.dtype()))};
}

// ---------------------------------------------------------------- misc

Vals op_identity(Ctx& c) { return {c.in[0]}; }

Vals op_dropout(Ctx& c) {
  Tensor x = c.t(0);
  Vals out = one(x);
  bool training = c.has(2) && c.ints(2)[0] != 0;
  double ratio = c.has(1) ? c.floats(1)[0] : c.f("ratio", 0.5);
  if (!training || ratio == 0) {
    out.push_back(Value::of(Tensor::ones(x.shape(), dtypes::bool_)));
    return out;
  }
  // tg's counter-based generator (a `seed` attribute reseeds it): the values differ from numpy's
  if (c.has_attr("seed")) Tensor::manual_seed(uint64_t(c.f("seed", 0)));
  Tensor keep = Tensor::rand(x.shape()) >= ratio;
  return {Value::of(keep.where(x / (1 - ratio), Tensor::zeros({}, x.dtype())).cast(x.dtype())), Value::of(keep)};
}

// Random generators: tg's threefry, reseeded by a `seed` attribute (so the values differ from numpy's).
Vals op_random(Ctx& c) {
  const std::string& op = c.node.op_type();
  if (c.has_attr("seed")) Tensor::manual_seed(uint64_t(c.f("seed", 0)));
  bool like_input = op == "RandomUniformLike" || op == "RandomNormalLike" || op == "Bernoulli";
  Shape shape = like_input ? c.t(0).shape() : Shape(c.ints_attr("shape"));
  DType d = c.has_attr("dtype") ? dtype_of_onnx(int32_t(c.i("dtype", 1)), c.model.name) : like_input ? c.t(0).dtype() : dtypes::float32;
  if (op == "Bernoulli") return one((Tensor::rand(shape, dtypes::float32) < c.t(0).cast(dtypes::float32)).cast(d));
  if (op == "RandomUniform" || op == "RandomUniformLike") return one(Tensor::uniform(shape, c.f("low", 0), c.f("high", 1), dtypes::float32).cast(d));
  return one(Tensor::normal(shape, c.f("mean", 0), c.f("scale", 1), dtypes::float32).cast(d));
}

}  // namespace

const std::unordered_map<std::string, OpFn>& op_table() {
  static const std::unordered_map<std::string, OpFn> table = [] {
    std::unordered_map<std::string, OpFn> t;
    // elementwise unary
    t["Identity"] = op_identity;
    t["Abs"] = unary([](const Tensor& x) { return x.abs(); });
    t["Neg"] = unary([](const Tensor& x) { return x.neg(); });
    t["Sign"] = unary([](const Tensor& x) { return x.sign(); });
    t["Not"] = unary([](const Tensor& x) { return x.logical_not(); });
    t["Floor"] = unary([](const Tensor& x) { return x.floor(); });
    t["Ceil"] = unary([](const Tensor& x) { return x.ceil(); });
    t["Round"] = unary([](const Tensor& x) { return x.round(); });
    t["Relu"] = unary([](const Tensor& x) { return x.maximum(like(x, 0)); });
    t["IsNaN"] = unary([](const Tensor& x) { return x.isnan(); });
    t["Exp"] = float_unary([](const Tensor& x) { return x.exp(); });
    t["Log"] = float_unary([](const Tensor& x) { return x.log(); });
    t["Sqrt"] = float_unary([](const Tensor& x) { return x.sqrt(); });
    t["Reciprocal"] = float_unary([](const Tensor& x) { return x.reciprocal(); });
    t["Sin"] = float_unary([](const Tensor& x) { return x.sin(); });
    t["Cos"] = float_unary([](const Tensor& x) { return x.cos(); });
    t["Tan"] = float_unary([](const Tensor& x) { return x.tan(); });
    t["Asin"] = float_unary([](const Tensor& x) { return x.asin(); });
    t["Acos"] = float_unary([](const Tensor& x) { return x.acos(); });
    t["Atan"] = float_unary([](const Tensor& x) { return x.atan(); });
    t["Sinh"] = float_unary([](const Tensor& x) { return x.sinh(); });
    t["Cosh"] = float_unary([](const Tensor& x) { return x.cosh(); });
    t["Tanh"] = float_unary([](const Tensor& x) { return x.tanh(); });
    t["Asinh"] = float_unary([](const Tensor& x) { return x.asinh(); });
    t["Acosh"] = float_unary([](const Tensor& x) { return x.acosh(); });
    t["Atanh"] = float_unary([](const Tensor& x) { return x.atanh(); });
    t["Erf"] = float_unary([](const Tensor& x) { return x.erf(); });
    t["Sigmoid"] = float_unary([](const Tensor& x) { return x.sigmoid(); });
    t["Softsign"] = float_unary([](const Tensor& x) { return x.softsign(); });
    t["Softplus"] = float_unary([](const Tensor& x) { return (x.exp() + 1.0).log(); });
    t["Mish"] = float_unary([](const Tensor& x) { return x.mish(); });
    t["HardSwish"] = float_unary([](const Tensor& x) { return x.hardswish(); });
    // activations with attributes
    t["Elu"] = [](Ctx& c) {
      Tensor x = c.t(0);
      double a = c.f("alpha", 1.0);
      return one((x > 0.0).where(x, (x.exp() - 1.0) * a).cast(x.dtype()));
    };
    t["Celu"] = [](Ctx& c) { return one(c.t(0).celu(c.f("alpha", 1.0)).cast(c.t(0).dtype())); };
    t["Selu"] = [](Ctx& c) {
      return one(selu(c.t(0), c.f("alpha", 1.67326319217681884765625), c.f("gamma", 1.05070102214813232421875)).cast(c.t(0).dtype()));
    };
    t["LeakyRelu"] = [](Ctx& c) {
      Tensor x = c.t(0);
      return one((x < 0.0).where(x * c.f("alpha", 0.01), x).cast(x.dtype()));
    };
    t["ThresholdedRelu"] = [](Ctx& c) {
      Tensor x = c.t(0);
      return one((x > c.f("alpha", 1.0)).where(x, like(x, 0)));
    };
    t["HardSigmoid"] = [](Ctx& c) {
      Tensor x = c.t(0);
      Tensor y = x * c.f("alpha", 0.2) + c.f("beta", 0.5);
      return one(y.maximum(like(y, 0)).minimum(like(y, 1)).cast(x.dtype()));
    };
    t["Shrink"] = [](Ctx& c) {
      Tensor x = c.t(0);
      double l = c.f("lambd", 0.5), b = c.f("bias", 0.0);
      Tensor xf = to_float(x);
      Tensor y = (xf < -l).where(xf + b, (xf > l).where(xf - b, like(xf, 0)));
      return one(y.cast(x.dtype()));
    };
    t["Gelu"] = [](Ctx& c) { return one(c.t(0).gelu(c.s("approximate", "none"))); };
    t["PRelu"] = op_prelu;
    t["IsInf"] = op_isinf;
    // binary
    for (const char* op : {"Add", "Sub", "Mul", "Div"}) t[op] = op_binary;
    t["Pow"] = op_pow;
    t["Mod"] = op_mod;
    for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) t[op] = op_compare;
    for (const char* op : {"And", "Or", "Xor"}) t[op] = op_logical;
    for (const char* op : {"BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"}) t[op] = op_bitwise;
    for (const char* op : {"Sum", "Mean", "Max", "Min"}) t[op] = op_variadic;
    t["Where"] = op_where;
    t["Clip"] = op_clip;
    t["Cast"] = op_cast;
    t["CastLike"] = op_castlike;
    t["StringNormalizer"] = op_string_normalizer;
    // constants, shapes, movement
    t["Constant"] = op_constant;
    t["ConstantOfShape"] = op_constant_of_shape;
    t["Shape"] = op_shape;
    t["Size"] = op_size;
    t["Reshape"] = op_reshape;
    t["Flatten"] = op_flatten;
    t["Squeeze"] = op_squeeze;
    t["Unsqueeze"] = op_unsqueeze;
    t["Transpose"] = op_transpose;
    t["Concat"] = op_concat;
    t["Split"] = op_split;
    t["Slice"] = op_slice;
    t["Gather"] = op_gather;
    t["GatherElements"] = op_gather_elements;
    t["GatherND"] = op_gather_nd;
    t["ScatterElements"] = op_scatter_elements;
    t["Scatter"] = op_scatter_elements;
    t["ScatterND"] = op_scatter_nd;
    t["Tile"] = op_tile;
    t["Expand"] = op_expand;
    t["Range"] = op_range;
    t["Trilu"] = op_trilu;
    t["Pad"] = op_pad;
    t["DepthToSpace"] = op_depth_to_space;
    t["SpaceToDepth"] = op_space_to_depth;
    t["OneHot"] = op_onehot;
    t["EyeLike"] = op_eyelike;
    t["Compress"] = op_compress;
    t["CumSum"] = op_cumsum;
    // reductions
    for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
                           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"})
      t[op] = op_reduce;
    t["ArgMax"] = op_arg;
    t["ArgMin"] = op_arg;
    t["Softmax"] = softmax_like([](const Tensor& x, int64_t a) { return x.softmax(a); });
    t["LogSoftmax"] = softmax_like([](const Tensor& x, int64_t a) { return x.log_softmax(a); });
    t["Hardmax"] = softmax_like(hardmax);
    t["TopK"] = op_topk;
    // linear algebra, nn
    t["MatMul"] = op_matmul;
    t["Gemm"] = op_gemm;
    t["Einsum"] = op_einsum;
    t["Conv"] = op_conv;
    t["ConvTranspose"] = op_conv_transpose;
    t["MaxPool"] = op_maxpool;
    t["AveragePool"] = op_avgpool;
    t["GlobalMaxPool"] = op_global_pool;
    t["GlobalAveragePool"] = op_global_pool;
    t["BatchNormalization"] = op_batchnorm;
    t["InstanceNormalization"] = op_instancenorm;
    t["LayerNormalization"] = op_layernorm;
    t["LRN"] = op_lrn;
    t["MeanVarianceNormalization"] = op_mvn;
    t["NegativeLogLikelihoodLoss"] = op_nll;
    t["SoftmaxCrossEntropyLoss"] = op_sce;
    t["Dropout"] = op_dropout;
    for (const char* op : {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli"}) t[op] = op_random;
    register_extra_ops(t);
    register_control_ops(t);
    register_image_ops(t);
    return t;
  }();
  return table;
}

}  // namespace tg::onnx
