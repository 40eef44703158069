// ONNX operators, second part: quantisation, Resize/Upsample, signal windows, the preview training optimisers,
// and ops whose output shape depends on values (NonZero, Unique), computed on the host.
#include <algorithm>
#include <array>
#include <map>
#include <cmath>
#include <numeric>

#include "onnx_impl.hpp"

namespace tg::onnx {

namespace {

using Vals = std::vector<Value>;
Vals one(Tensor t) { return {Value::of(std::move(t))}; }
Tensor scalar(double v, DType d) { return Tensor::full({}, v, d); }

int64_t norm_axis(const Ctx& c, int64_t a, int64_t rank) {
  if (a < -rank || a >= std::max<int64_t>(rank, 1)) c.error("axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
  return a < 0 ? a + rank : a;
}

// ---------------------------------------------------------------- quantisation

// A per-axis parameter (1-D, one value per entry of `axis`) reshaped to broadcast against rank-r data.
Tensor per_axis(const Tensor& p, int64_t axis, int64_t r) {
  if (p.ndim() == 0 || p.numel() == 1) return p.reshape({});
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) throw Error("[onnx] per-axis parameter of shape " + shape_str(p.shape()) + ": axis out of range for rank " + std::to_string(r));
  Shape s(size_t(r), 1);
  s[size_t(axis)] = p.numel();
  return p.reshape(s);
}

Tensor saturate_round(const Tensor& x, DType to) {
  double lo = double(dtypes::min_int(to)), hi = double(dtypes::max_int(to));
  Tensor r = x.round();
  return r.maximum(Tensor::full({}, lo, r.dtype())).minimum(Tensor::full({}, hi, r.dtype())).cast(to);
}

Vals op_quantize(Ctx& c) {
  Tensor x = c.t(0).cast(dtypes::float32);
  int64_t axis = c.i("axis", 1);
  Tensor scale = per_axis(c.t(1).cast(dtypes::float32), axis, x.ndim());
  DType to = c.has(2) ? c.t(2).dtype() : dtypes::uint8;
  Tensor zp = c.has(2) ? per_axis(c.t(2), axis, x.ndim()).cast(dtypes::float32) : scalar(0, dtypes::float32);
  return one(saturate_round((x / scale).round() + zp, to));
}

Vals op_dequantize(Ctx& c) {
  Tensor x = c.t(0);
  int64_t axis = c.i("axis", 1);
  Tensor scale = per_axis(c.t(1), axis, x.ndim());
  Tensor xf = x.cast(dtypes::float32);
  if (c.has(2)) xf = xf - per_axis(c.t(2), axis, x.ndim()).cast(dtypes::float32);
  return one((xf * scale.cast(dtypes::float32)).cast(scale.dtype()));
}

Vals op_dynamic_quantize(Ctx& c) {
  Tensor x = c.t(0).cast(dtypes::float32);
  Tensor zero = scalar(0, dtypes::float32);
  Tensor hi = x.max().maximum(zero), lo = x.min().minimum(zero);
  Tensor scale = (hi - lo) / 255.0;
  Tensor zp = saturate_round(zero - lo / scale, dtypes::uint8);
  Tensor y = saturate_round((x / scale).round() + zp.cast(dtypes::float32), dtypes::uint8);
  return {Value::of(y), Value::of(scale), Value::of(zp)};
}

// x - zero_point in int32; a 1-D zero point applies along `axis`.
Tensor minus_zp(const Ctx& c, const Tensor& x, size_t zp_input, int64_t axis) {
  Tensor xi = x.cast(dtypes::int32);
  if (!c.has(zp_input)) return xi;
  return xi - per_axis(c.t(zp_input), axis, x.ndim()).cast(dtypes::int32);
}

Vals op_matmul_integer(Ctx& c) {
  Tensor a = minus_zp(c, c.t(0), 2, c.t(0).ndim() - 2), b = minus_zp(c, c.t(1), 3, c.t(1).ndim() - 1);
  return one(a.matmul(b).cast(dtypes::int32));
}

Vals conv_of(Ctx& c, const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias) {
  // Reuse the Conv operator's attribute handling by running it on prepared inputs.
  Ctx inner{c.model, c.node, c.opset, {Value::of(x), Value::of(w)}, c.scope};
  if (bias) inner.in.push_back(Value::of(*bias));
  return op_table().at("Conv")(inner);
}

Vals op_conv_integer(Ctx& c) {
  Tensor x = minus_zp(c, c.t(0), 2, 1), w = minus_zp(c, c.t(1), 3, 0);
  return one(conv_of(c, x, w, std::nullopt)[0].tensor.cast(dtypes::int32));
}

Vals op_qlinear_matmul(Ctx& c) {
  Tensor a = c.t(0).cast(dtypes::int32) - c.t(2).cast(dtypes::int32);
  Tensor b = c.t(3).cast(dtypes::int32) - per_axis(c.t(5), c.t(3).ndim() - 1, c.t(3).ndim()).cast(dtypes::int32);
  Tensor acc = a.matmul(b).cast(dtypes::float32);
  Tensor as = c.t(1).cast(dtypes::float32).reshape({}), bs = per_axis(c.t(4).cast(dtypes::float32), c.t(3).ndim() - 1, c.t(3).ndim());
  Tensor real = acc * (as * bs);
  Tensor y = (real / c.t(6).cast(dtypes::float32).reshape({})).round() + c.t(7).cast(dtypes::float32).reshape({});
  return one(saturate_round(y, c.t(7).dtype()));
}

Vals op_qlinear_conv(Ctx& c) {
  Tensor x = c.t(0).cast(dtypes::int32) - c.t(2).cast(dtypes::int32).reshape({});
  Tensor w = c.t(3).cast(dtypes::int32) - per_axis(c.t(5), 0, c.t(3).ndim()).cast(dtypes::int32);
  std::optional<Tensor> bias;
  if (c.has(8)) bias = c.t(8).cast(dtypes::int32);
  Tensor acc = conv_of(c, x, w, bias)[0].tensor.cast(dtypes::float32);
  Tensor ws = per_axis(c.t(4).cast(dtypes::float32), 1, acc.ndim());
  Tensor real = acc * (c.t(1).cast(dtypes::float32).reshape({}) * ws);
  Tensor y = (real / c.t(6).cast(dtypes::float32).reshape({})).round() + c.t(7).cast(dtypes::float32).reshape({});
  return one(saturate_round(y, c.t(7).dtype()));
}

// ---------------------------------------------------------------- Resize

struct Taps {
  std::vector<std::vector<int64_t>> idx;  // [tap][out]
  std::vector<std::vector<double>> w;     // [tap][out]
  std::vector<bool> outside;              // tf_crop_and_resize: out of the input, takes extrapolation_value
  bool identity = true;
};

std::vector<double> cubic_coeffs(double r, double A) {
  return {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
          ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
          ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) - 4 * A};
}

// The taps of one axis, following the ONNX reference implementation (edge-padded neighbours, ratio in (0, 1]).
Taps taps_of(const Ctx& c, int64_t in, int64_t out, double scale, double roi_start, double roi_end, const std::string& mode) {
  std::string ctm = c.s("coordinate_transformation_mode", c.opset < 11 ? "asymmetric" : "half_pixel");
  std::string nm = c.s("nearest_mode", "round_prefer_floor");
  double A = c.f("cubic_coeff_a", -0.75);
  bool exclude = c.i("exclude_outside", 0);
  int ntaps = mode == "cubic" ? 4 : mode == "linear" ? 2 : 1;
  Taps t;
  t.idx.assign(size_t(ntaps), std::vector<int64_t>(size_t(out)));
  t.w.assign(size_t(ntaps), std::vector<double>(size_t(out)));
  t.outside.assign(size_t(out), false);
  double out_f = scale * double(in);
  for (int64_t o = 0; o < out; o++) {
    double x = double(o), xo;
    if (ctm == "half_pixel") xo = (x + 0.5) / scale - 0.5;
    else if (ctm == "pytorch_half_pixel") xo = out_f > 1 ? (x + 0.5) / scale - 0.5 : 0;
    else if (ctm == "align_corners") xo = out_f == 1 ? 0 : x * double(in - 1) / (out_f - 1);
    else if (ctm == "asymmetric") xo = x / scale;
    else if (ctm == "tf_half_pixel_for_nn") xo = (x + 0.5) / scale;
    else if (ctm == "tf_crop_and_resize") {
      xo = out_f > 1 ? roi_start * double(in - 1) + x * (roi_end - roi_start) * double(in - 1) / (out_f - 1)
                     : 0.5 * (roi_start + roi_end) * double(in - 1);
      if (xo < 0 || xo > double(in - 1)) t.outside[size_t(o)] = true;
    } else {
      c.error("coordinate_transformation_mode '" + ctm + "' is not supported");
    }
    double fl = std::floor(xo);
    bool integral = xo == fl;
    int64_t i0 = integral ? int64_t(fl) - 1 : int64_t(fl);  // left neighbour; ratio in (0, 1]
    double r = xo - double(i0);
    std::vector<double> co;
    std::vector<int64_t> ix;
    if (mode == "nearest") {
      bool right;
      if (integral) right = true;
      else if (nm == "round_prefer_floor") right = r > 0.5;
      else if (nm == "round_prefer_ceil") right = r >= 0.5;
      else if (nm == "floor") right = false;
      else if (nm == "ceil") right = true;
      else c.error("nearest_mode '" + nm + "' is not supported");
      ix = {right ? i0 + 1 : i0};
      co = {1.0};
    } else if (mode == "linear") {
      ix = {i0, i0 + 1};
      co = {1 - r, r};
    } else if (mode == "cubic") {
      ix = {i0 - 1, i0, i0 + 1, i0 + 2};
      co = cubic_coeffs(r, A);
    } else {
      c.error("mode '" + mode + "' is not supported");
    }
    if (exclude) {
      double s = 0;
      for (size_t k = 0; k < ix.size(); k++) {
        if (ix[k] < 0 || ix[k] >= in) co[k] = 0;
        s += co[k];
      }
      for (auto& v : co) v /= s;
    }
    for (size_t k = 0; k < ix.size(); k++) {
      int64_t i = std::clamp<int64_t>(ix[k], 0, in - 1);
      t.idx[k][size_t(o)] = i;
      t.w[k][size_t(o)] = co[k];
      if (co[k] != 0 && !(i == o && co[k] == 1)) t.identity = false;
      if (co[k] == 1 && i != o) t.identity = false;
    }
    if (t.outside[size_t(o)]) t.identity = false;
  }
  if (out != in) t.identity = false;
  return t;
}

Tensor apply_taps(const Tensor& x, int64_t axis, const Taps& t, double extrapolation) {
  int64_t out = int64_t(t.outside.size());
  Shape ws(size_t(x.ndim()), 1);
  ws[size_t(axis)] = out;
  Tensor acc;
  DType fd = dtypes::is_float(x.dtype()) ? x.dtype() : dtypes::float32;
  // One tap repeating each input element r times (nearest upsampling by an integer factor): a broadcast, which
  // fuses as index arithmetic, instead of a gather (a one-hot reduce over the whole axis per output element).
  const int64_t in = x.shape()[size_t(axis)];
  bool none_outside = std::none_of(t.outside.begin(), t.outside.end(), [](bool b) { return b; });
  if (t.idx.size() == 1 && none_outside && in > 0 && out % in == 0) {
    int64_t rep = out / in;
    bool repeat = true;
    for (int64_t j = 0; repeat && j < out; j++) repeat = t.idx[0][size_t(j)] == j / rep;
    if (repeat) {
      Shape s1(x.shape()), s2(x.shape()), s3(x.shape());
      s1.insert(s1.begin() + axis + 1, 1);
      s2.insert(s2.begin() + axis + 1, rep);
      s3[size_t(axis)] = out;
      return x.reshape(s1).expand(s2).reshape(s3).cast(fd);
    }
  }
  for (size_t k = 0; k < t.idx.size(); k++) {
    Tensor g = x.index_select(axis, Tensor::from_vector(t.idx[k], {out})).cast(fd);
    if (t.idx.size() > 1) {
      std::vector<float> wf(t.w[k].begin(), t.w[k].end());
      g = g * Tensor::from_vector(wf, ws).cast(fd);
    }
    acc = k == 0 ? g : (acc + g);
  }
  if (std::any_of(t.outside.begin(), t.outside.end(), [](bool b) { return b; })) {
    std::vector<bool> m(t.outside.begin(), t.outside.end());
    acc = Tensor::from_vector(m, ws).where(Tensor::full({}, extrapolation, fd), acc);
  }
  return acc;
}

Tensor resize(const Ctx& c, const Tensor& x, std::vector<double> scales, std::vector<int64_t> sizes, const std::vector<double>& roi,
              const std::string& mode) {
  auto r = int64_t(x.ndim());
  std::vector<int64_t> axes = c.ints_attr("axes");
  if (axes.empty())
    for (int64_t i = 0; i < r; i++) axes.push_back(i);
  std::vector<double> sc(size_t(r), 1.0);
  std::vector<int64_t> out(x.shape().begin(), x.shape().end());
  std::vector<double> rs(size_t(r), 0.0), re(size_t(r), 1.0);
  if (!sizes.empty()) {
    if (sizes.size() != axes.size()) c.error("sizes has " + std::to_string(sizes.size()) + " values for " + std::to_string(axes.size()) + " axes");
    std::string policy = c.s("keep_aspect_ratio_policy", "stretch");
    double common = policy == "not_larger" ? INFINITY : -INFINITY;
    for (size_t i = 0; i < axes.size(); i++) {
      double s = double(sizes[i]) / double(x.shape()[size_t(axes[i])]);
      common = policy == "not_larger" ? std::min(common, s) : std::max(common, s);
    }
    for (size_t i = 0; i < axes.size(); i++) {
      auto a = size_t(norm_axis(c, axes[i], r));
      if (policy == "stretch") {
        out[a] = sizes[i];
        sc[a] = double(sizes[i]) / double(x.shape()[a]);
      } else {
        sc[a] = common;
        out[a] = int64_t(std::round(common * double(x.shape()[a])));
      }
    }
  } else {
    if (scales.size() != axes.size()) c.error("scales has " + std::to_string(scales.size()) + " values for " + std::to_string(axes.size()) + " axes");
    for (size_t i = 0; i < axes.size(); i++) {
      auto a = size_t(norm_axis(c, axes[i], r));
      if (!(scales[i] > 0)) c.error("scales must be positive");
      sc[a] = scales[i];
      out[a] = int64_t(std::floor(double(x.shape()[a]) * scales[i]));
    }
  }
  if (!roi.empty()) {
    if (roi.size() != 2 * axes.size()) c.error("roi needs 2 values per axis");
    for (size_t i = 0; i < axes.size(); i++) {
      auto a = size_t(norm_axis(c, axes[i], r));
      rs[a] = roi[i];
      re[a] = roi[i + axes.size()];
    }
  }
  Tensor y = x;
  double extrapolation = c.f("extrapolation_value", 0.0);
  for (int64_t a = 0; a < r; a++) {
    Taps t = taps_of(c, x.shape()[size_t(a)], out[size_t(a)], sc[size_t(a)], rs[size_t(a)], re[size_t(a)], mode);
    if (!t.identity) y = apply_taps(y, a, t, extrapolation);
  }
  return y.cast(x.dtype());
}

Vals op_resize(Ctx& c) {
  const Tensor& x = c.t(0);
  std::string mode = c.s("mode", "nearest");
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  if (c.opset < 11) {
    scales = c.floats(1);
  } else {
    if (c.has(1)) roi = c.floats(1);
    if (c.has(2)) scales = c.floats(2);
    if (c.has(3)) sizes = c.ints(3);
    if (!sizes.empty()) scales.clear();
  }
  if (c.s("coordinate_transformation_mode", "") != "tf_crop_and_resize") roi.clear();
  if (c.i("antialias", 0)) c.error("antialias is not supported");
  return one(resize(c, x, scales, sizes, roi, mode));
}

Vals op_upsample(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<double> scales = c.opset < 9 ? c.floats_attr("scales") : c.floats(1);
  std::string mode = c.s("mode", "nearest");
  // Upsample is Resize with asymmetric coordinates; nearest rounds down (numpy.repeat in the reference).
  auto r = int64_t(x.ndim());
  Tensor y = x;
  for (int64_t a = 0; a < r; a++) {
    int64_t in = x.shape()[size_t(a)], out = int64_t(std::floor(double(in) * scales[size_t(a)]));
    if (out == in && scales[size_t(a)] == 1) continue;
    Taps t;
    if (mode == "nearest") {
      t.idx.assign(1, std::vector<int64_t>(size_t(out)));
      t.w.assign(1, std::vector<double>(size_t(out), 1.0));
      t.outside.assign(size_t(out), false);
      for (int64_t o = 0; o < out; o++) t.idx[0][size_t(o)] = std::min<int64_t>(in - 1, int64_t(std::floor(double(o) / scales[size_t(a)])));
    } else {
      t = taps_of(c, in, out, scales[size_t(a)], 0, 1, "linear");
    }
    y = apply_taps(y, a, t, 0);
  }
  return one(y.cast(x.dtype()));
}

// ---------------------------------------------------------------- signal windows

Vals op_window(Ctx& c) {
  const std::string& op = c.node.op_type();
  auto n = int64_t(c.floats(0)[0]);
  bool periodic = c.i("periodic", 1);
  DType d = dtype_of_onnx(int32_t(c.i("output_datatype", 1)), c.model.name);
  double den = double(periodic ? n : n - 1);
  std::vector<double> v(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; i++) {
    double a = 2 * M_PI * double(i) / den;
    if (op == "HannWindow") v[size_t(i)] = 0.5 - 0.5 * std::cos(a);
    else if (op == "HammingWindow") v[size_t(i)] = 25.0 / 46 - (1 - 25.0 / 46) * std::cos(a);
    else v[size_t(i)] = 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a);
  }
  return one(Tensor::from_vector(v, {n}).cast(d));
}

// ---------------------------------------------------------------- ai.onnx.preview.training optimisers

Vals op_adagrad(Ctx& c) {
  double r = c.floats(0)[0], t = c.floats(1)[0];
  double decay = c.f("decay_factor", 0), eps = c.f("epsilon", 0), norm = c.f("norm_coefficient", 0);
  size_t n = (c.n() - 2) / 3;
  double lr = r / (1 + t * decay);
  Vals xs, hs;
  for (size_t i = 0; i < n; i++) {
    Tensor x = c.t(2 + i), g = c.t(2 + n + i), h = c.t(2 + 2 * n + i);
    Tensor greg = x * norm + g;
    Tensor hn = h + greg * greg;
    Tensor xn = x - (greg / (hn.sqrt() + eps)) * lr;
    xs.push_back(Value::of(xn.cast(x.dtype())));
    hs.push_back(Value::of(hn.cast(h.dtype())));
  }
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

Vals op_adam(Ctx& c) {
  double r = c.floats(0)[0], t = c.floats(1)[0];
  double alpha = c.f("alpha", 0.9), beta = c.f("beta", 0.999), eps = c.f("epsilon", 0), norm = c.f("norm_coefficient", 0),
         post = c.f("norm_coefficient_post", 0);
  size_t n = (c.n() - 2) / 4;
  double ra = t > 0 ? r * std::sqrt(1 - std::pow(beta, t)) / (1 - std::pow(alpha, t)) : r;
  Vals xs, vs, hs;
  for (size_t i = 0; i < n; i++) {
    Tensor x = c.t(2 + i), g = c.t(2 + n + i), v = c.t(2 + 2 * n + i), h = c.t(2 + 3 * n + i);
    Tensor greg = x * norm + g;
    Tensor vn = v * alpha + greg * (1 - alpha);
    Tensor hn = h * beta + (greg * greg) * (1 - beta);
    Tensor xn = (x - (vn / (hn.sqrt() + eps)) * ra) * (1 - post);
    xs.push_back(Value::of(xn.cast(x.dtype())));
    vs.push_back(Value::of(vn.cast(v.dtype())));
    hs.push_back(Value::of(hn.cast(h.dtype())));
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

Vals op_momentum(Ctx& c) {
  double r = c.floats(0)[0], t = c.floats(1)[0];
  double alpha = c.f("alpha", 0), beta = c.f("beta", 0), norm = c.f("norm_coefficient", 0);
  bool nesterov = c.s("mode", "standard") == "nesterov";
  size_t n = (c.n() - 2) / 3;
  double badj = t > 0 ? beta : 1;
  Vals xs, vs;
  for (size_t i = 0; i < n; i++) {
    Tensor x = c.t(2 + i), g = c.t(2 + n + i), v = c.t(2 + 2 * n + i);
    Tensor greg = x * norm + g;
    Tensor vn = v * alpha + greg * badj;
    Tensor xn = nesterov ? (x - (greg + vn * alpha) * r) : (x - vn * r);
    xs.push_back(Value::of(xn.cast(x.dtype())));
    vs.push_back(Value::of(vn.cast(v.dtype())));
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  return xs;
}

// ---------------------------------------------------------------- value-dependent shapes (host)

Vals op_nonzero(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<double> v = x.to_doubles();
  const Shape& s = x.shape();
  std::vector<std::vector<int64_t>> coords(s.size());
  for (size_t i = 0; i < v.size(); i++) {
    if (v[i] == 0) continue;
    size_t rem = i;
    for (size_t d = s.size(); d-- > 0;) {
      coords[d].push_back(int64_t(rem % size_t(s[d])));
      rem /= size_t(s[d]);
    }
  }
  size_t nnz = coords.empty() ? (v.size() == 1 && v[0] != 0 ? 1 : 0) : coords[0].size();
  std::vector<int64_t> flat;
  for (auto& row : coords) flat.insert(flat.end(), row.begin(), row.end());
  if (flat.empty()) return one(Tensor::zeros({int64_t(s.size()), int64_t(nnz)}, dtypes::int64));
  return one(Tensor::from_vector(flat, {int64_t(s.size()), int64_t(nnz)}));
}

Vals op_reverse_sequence(Ctx& c) {
  const Tensor& x = c.t(0);
  std::vector<int64_t> lens = c.ints(1);
  int64_t ba = c.i("batch_axis", 1), ta = c.i("time_axis", 0);
  int64_t T = x.shape()[size_t(ta)], B = x.shape()[size_t(ba)];
  std::vector<int64_t> idx(size_t(T * B));
  for (int64_t t = 0; t < T; t++)
    for (int64_t b = 0; b < B; b++) idx[size_t(t * B + b)] = t < lens[size_t(b)] ? lens[size_t(b)] - 1 - t : t;
  Shape is(size_t(x.ndim()), 1);
  is[size_t(ta)] = T;
  is[size_t(ba)] = B;
  Tensor index = Tensor::from_vector(idx, {T, B});
  if (ta > ba) index = index.T();
  return one(x.gather(ta, index.reshape(is).expand(x.shape())));
}

Vals op_unique(Ctx& c) {
  Tensor x = c.t(0);
  bool sorted = c.i("sorted", 1);
  int64_t axis = 0;
  if (c.has_attr("axis")) axis = norm_axis(c, c.i("axis", 0), x.ndim());
  else x = x.reshape({x.numel()});
  int64_t n = x.shape()[size_t(axis)];
  Tensor moved = x.permute([&] {
    std::vector<int64_t> p{axis};
    for (int64_t d = 0; d < x.ndim(); d++)
      if (d != axis) p.push_back(d);
    return p;
  }());
  std::vector<double> v = moved.contiguous().to_doubles();
  size_t inner = n ? v.size() / size_t(n) : 0;
  // slices compared in place (GCC 12 warned falsely on the copies -Wfree-nonheap-object once inlining changed)
  auto at = [&](int64_t i) { return v.data() + size_t(i) * inner; };
  auto same = [&](int64_t a, int64_t b) { return std::equal(at(a), at(a) + inner, at(b)); };
  auto less = [&](int64_t a, int64_t b) { return std::lexicographical_compare(at(a), at(a) + inner, at(b), at(b) + inner); };
  std::vector<int64_t> first;  // first occurrence of each distinct slice, in order of appearance
  std::vector<int64_t> inverse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    size_t k = 0;
    for (; k < first.size(); k++)
      if (same(first[k], i)) break;
    if (k == first.size()) first.push_back(i);
    inverse[size_t(i)] = int64_t(k);
  }
  std::vector<size_t> order(first.size());
  std::iota(order.begin(), order.end(), 0);
  if (sorted) std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return less(first[a], first[b]); });
  std::vector<int64_t> rank(first.size()), idx, counts(first.size(), 0);
  for (size_t j = 0; j < order.size(); j++) {
    rank[order[j]] = int64_t(j);
    idx.push_back(first[order[j]]);
  }
  for (auto& i : inverse) {
    i = rank[size_t(i)];
    counts[size_t(i)]++;
  }
  auto m = int64_t(idx.size());
  Tensor y = x.index_select(axis, Tensor::from_vector(idx, {m}));
  return {Value::of(y), Value::of(Tensor::from_vector(idx, {m})), Value::of(Tensor::from_vector(inverse, {n})),
          Value::of(Tensor::from_vector(counts, {m}))};
}

// ---------------------------------------------------------------- recurrent layers (unrolled over time)

Tensor activation(const Ctx& c, const std::string& name, const Tensor& x) {
  if (name == "Sigmoid") return x.sigmoid();
  if (name == "Tanh") return x.tanh();
  if (name == "Relu") return x.relu();
  c.error("activation '" + name + "' is not supported");
}

// RNN, GRU and LSTM share inputs X, W, R, B, sequence_lens, initial_h (LSTM: initial_c, P) and outputs Y, Y_h (Y_c).
Vals op_recurrent(Ctx& c) {
  const std::string& op = c.node.op_type();
  int gates = op == "RNN" ? 1 : op == "GRU" ? 3 : 4;
  Tensor X = c.t(0), W = c.t(1), R = c.t(2);
  bool batch_first = c.i("layout", 0) == 1;
  if (batch_first) X = X.permute({1, 0, 2});
  int64_t T = X.shape()[0], Bn = X.shape()[1], H = c.i("hidden_size", R.shape().back());
  std::string dir = c.s("direction", "forward");
  int64_t ndir = dir == "bidirectional" ? 2 : 1;
  std::vector<std::string> acts;
  if (const auto* a = c.attr("activations"))
    for (const auto& s : a->strings()) acts.push_back(s);
  if (acts.empty()) {
    std::vector<std::string> def = op == "RNN" ? std::vector<std::string>{"Tanh"}
                                   : op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                 : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (int64_t d = 0; d < ndir; d++) acts.insert(acts.end(), def.begin(), def.end());
  }
  size_t per_dir = acts.size() / size_t(ndir);
  double clip = c.f("clip", 0);
  bool lbr = c.i("linear_before_reset", 0);
  std::vector<int64_t> lens(size_t(Bn), T);
  if (c.has(4)) lens = c.ints(4);
  std::vector<uint8_t> valid(size_t(T * Bn));
  for (int64_t t = 0; t < T; t++)
    for (int64_t b = 0; b < Bn; b++) valid[size_t(t * Bn + b)] = t < lens[size_t(b)];
  Tensor mask_all = Tensor::from_blob(valid.data(), {T, Bn, 1}, dtypes::bool_);
  auto init = [&](size_t i) -> std::optional<Tensor> {
    if (!c.has(i)) return std::nullopt;
    Tensor v = c.t(i);
    return batch_first ? v.permute({1, 0, 2}) : v;
  };
  std::optional<Tensor> h0 = init(5), c0 = op == "LSTM" ? init(6) : std::nullopt;
  std::vector<Tensor> ys, hs, cs;
  for (int64_t d = 0; d < ndir; d++) {
    bool reverse = dir == "reverse" || d == 1;
    Tensor w = W.slice({Slice::index(d)}).reshape({gates * H, -1}), r = R.slice({Slice::index(d)}).reshape({gates * H, H});
    Tensor wb = Tensor::zeros({gates * H}, X.dtype()), rb = wb;
    if (c.has(3)) {
      Tensor b = c.t(3).slice({Slice::index(d)}).reshape({2 * gates * H});
      wb = b.shrink({{0, gates * H}});
      rb = b.shrink({{gates * H, 2 * gates * H}});
    }
    Tensor h = h0 ? h0->slice({Slice::index(d)}).reshape({Bn, H}) : Tensor::zeros({Bn, H}, X.dtype());
    Tensor cell = c0 ? c0->slice({Slice::index(d)}).reshape({Bn, H}) : Tensor::zeros({Bn, H}, X.dtype());
    std::optional<Tensor> P;
    if (op == "LSTM" && c.has(7)) P = c.t(7).slice({Slice::index(d)}).reshape({3 * H});
    auto part = [&](const Tensor& v, int64_t k) { return v.shrink({{0, v.shape()[0]}, {k * H, (k + 1) * H}}); };
    auto vpart = [&](const Tensor& v, int64_t k) { return v.shrink({{k * H, (k + 1) * H}}); };
    auto f = [&](size_t k, const Tensor& x) {
      Tensor y = x;
      if (clip > 0) y = y.clamp(-clip, clip);
      return activation(c, acts[size_t(d) * per_dir + k], y);
    };
    std::vector<Tensor> yd(static_cast<size_t>(T));
    for (int64_t s = 0; s < T; s++) {
      int64_t t = reverse ? T - 1 - s : s;
      Tensor xt = X.slice({Slice::index(t)}).reshape({Bn, -1});
      Tensor xw = xt.matmul(w.T()) + wb, hr = h.matmul(r.T()) + rb;
      Tensor hn, cn = cell;
      if (op == "RNN") {
        hn = f(0, xw + hr);
      } else if (op == "GRU") {
        Tensor z = f(0, part(xw, 0) + part(hr, 0)), rr = f(0, part(xw, 1) + part(hr, 1));
        Tensor hh = lbr ? f(1, part(xw, 2) + rr * part(hr, 2))
                        : f(1, part(xw, 2) + ((rr * h).matmul(part(r.T(), 2)) + vpart(rb, 2)));
        hn = (1.0 - z) * hh + z * h;
      } else {
        Tensor gi = part(xw, 0) + part(hr, 0), go = part(xw, 1) + part(hr, 1);
        Tensor gf = part(xw, 2) + part(hr, 2), gc = part(xw, 3) + part(hr, 3);
        if (P) {
          gi = gi + vpart(*P, 0) * cell;
          gf = gf + vpart(*P, 2) * cell;
        }
        Tensor i = f(0, gi), fg = f(0, gf), cc = f(1, gc);
        cn = fg * cell + i * cc;
        if (P) go = go + vpart(*P, 1) * cn;
        hn = f(0, go) * f(2, cn);
      }
      Tensor m = mask_all.slice({Slice::index(t)}).reshape({Bn, 1});
      h = m.where(hn, h).cast(X.dtype());
      cell = m.where(cn, cell).cast(X.dtype());
      yd[size_t(t)] = m.where(hn, Tensor::zeros({}, X.dtype())).cast(X.dtype());
    }
    ys.push_back(stack(yd, 0));  // (T, B, H)
    hs.push_back(h);
    cs.push_back(cell);
  }
  Tensor Y = stack(ys, 1), Yh = stack(hs, 0), Yc = stack(cs, 0);  // (T, D, B, H), (D, B, H)
  if (batch_first) {
    Y = Y.permute({2, 0, 1, 3});
    Yh = Yh.permute({1, 0, 2});
    Yc = Yc.permute({1, 0, 2});
  }
  return {Value::of(Y), Value::of(Yh), Value::of(Yc)};
}

// ---------------------------------------------------------------- NonMaxSuppression (host: output size depends on values)

Vals op_nms(Ctx& c) {
  const Tensor& boxes = c.t(0);
  const Tensor& scores = c.t(1);
  int64_t max_out = c.has(2) ? c.ints(2).at(0) : 0;
  double iou_th = c.has(3) ? c.floats(3).at(0) : 0, score_th = c.has(4) ? c.floats(4).at(0) : -INFINITY;
  bool center = c.i("center_point_box", 0);
  int64_t B = boxes.shape()[0], N = boxes.shape()[1], C = scores.shape()[1];
  std::vector<double> bx = boxes.to_doubles(), sc = scores.to_doubles();
  auto corners = [&](int64_t b, int64_t i) {
    const double* p = &bx[size_t((b * N + i) * 4)];
    if (center) return std::array<double, 4>{p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
    return std::array<double, 4>{std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
  };
  auto iou = [&](int64_t b, int64_t i, int64_t j) {
    auto a = corners(b, i), o = corners(b, j);
    double ih = std::max(0.0, std::min(a[2], o[2]) - std::max(a[0], o[0])), iw = std::max(0.0, std::min(a[3], o[3]) - std::max(a[1], o[1]));
    double inter = ih * iw, ua = (a[2] - a[0]) * (a[3] - a[1]) + (o[2] - o[0]) * (o[3] - o[1]) - inter;
    return ua > 0 ? inter / ua : 0.0;
  };
  std::vector<int64_t> sel;
  for (int64_t b = 0; b < B; b++)
    for (int64_t k = 0; k < C; k++) {
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < N; i++)
        if (sc[size_t((b * C + k) * N + i)] > score_th) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return sc[size_t((b * C + k) * N + x)] > sc[size_t((b * C + k) * N + y)]; });
      std::vector<int64_t> kept;
      for (int64_t i : cand) {
        if (int64_t(kept.size()) >= max_out) break;
        bool ok = true;
        for (int64_t j : kept)
          if (iou(b, i, j) > iou_th) {
            ok = false;
            break;
          }
        if (ok) kept.push_back(i);
      }
      for (int64_t i : kept) sel.insert(sel.end(), {b, k, i});
    }
  auto n = int64_t(sel.size() / 3);
  if (n == 0) return one(Tensor::zeros({0, 3}, dtypes::int64));
  return one(Tensor::from_vector(sel, {n, 3}));
}

// ---------------------------------------------------------------- TfIdfVectorizer (host: n-gram counting)

Vals op_tfidf(Ctx& c) {
  const Tensor& x = c.t(0);
  if (!dtypes::is_int(x.dtype())) c.error("only integer inputs are supported (tg has no strings)");
  std::vector<int64_t> v = c.ints(0);
  int64_t rows = x.ndim() == 2 ? x.shape()[0] : 1, cols = x.ndim() == 2 ? x.shape()[1] : (x.ndim() == 1 ? x.shape()[0] : 0);
  int64_t minn = c.i("min_gram_length", 1), maxn = c.i("max_gram_length", 1), maxskip = c.i("max_skip_count", 0);
  std::vector<int64_t> pool = c.ints_attr("pool_int64s"), counts = c.ints_attr("ngram_counts"), indexes = c.ints_attr("ngram_indexes");
  std::vector<double> weights = c.floats_attr("weights");
  std::string mode = c.s("mode", "TF");
  if (indexes.empty()) c.error("ngram_indexes is empty");
  int64_t width = *std::max_element(indexes.begin(), indexes.end()) + 1;
  // n-gram -> output column, for every n-gram in the pool (ngram_counts[n-1] is where the n-grams start)
  std::map<std::vector<int64_t>, int64_t> col_of;
  size_t k = 0;
  for (size_t n = 1; n <= counts.size(); n++) {
    auto start = size_t(counts[n - 1]), end = n < counts.size() ? size_t(counts[n]) : pool.size();
    if (start > end || end > pool.size()) c.error("ngram_counts does not fit pool_int64s");
    for (size_t i = start; i + n <= end; i += n, k++) {
      if (k >= indexes.size()) c.error("fewer ngram_indexes than n-grams in the pool");
      col_of[std::vector<int64_t>(pool.begin() + long(i), pool.begin() + long(i + n))] = indexes[k];
    }
  }
  std::vector<double> out(size_t(rows * width), 0.0);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t* row = v.data() + r * cols;
    for (int64_t n = minn; n <= maxn; n++)
      for (int64_t skip = 0; skip <= (n == 1 ? 0 : maxskip); skip++)
        for (int64_t i = 0; i + (n - 1) * (skip + 1) < cols; i++) {
          std::vector<int64_t> g;
          for (int64_t j = 0; j < n; j++) g.push_back(row[i + j * (skip + 1)]);
          auto it = col_of.find(g);
          if (it != col_of.end()) out[size_t(r * width + it->second)] += 1;
        }
  }
  for (size_t i = 0; i < out.size(); i++) {
    auto col = size_t(int64_t(i) % width);
    double w = col < weights.size() ? weights[col] : 1.0;
    if (mode == "IDF") out[i] = out[i] > 0 ? w : 0;
    else if (mode == "TFIDF") out[i] *= w;
    else if (mode != "TF") c.error("mode '" + mode + "' is not TF, IDF or TFIDF");
  }
  Shape shape = x.ndim() == 2 ? Shape{rows, width} : Shape{width};
  return one(Tensor::from_vector(out, shape).cast(dtypes::float32));
}

}  // namespace

void register_extra_ops(std::unordered_map<std::string, OpFn>& t) {
  t["QuantizeLinear"] = op_quantize;
  t["DequantizeLinear"] = op_dequantize;
  t["DynamicQuantizeLinear"] = op_dynamic_quantize;
  t["MatMulInteger"] = op_matmul_integer;
  t["ConvInteger"] = op_conv_integer;
  t["QLinearMatMul"] = op_qlinear_matmul;
  t["QLinearConv"] = op_qlinear_conv;
  t["Resize"] = op_resize;
  t["Upsample"] = op_upsample;
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) t[op] = op_window;
  t["ai.onnx.preview.training::Adagrad"] = op_adagrad;
  t["ai.onnx.preview.training::Adam"] = op_adam;
  t["ai.onnx.preview.training::Momentum"] = op_momentum;
  t["NonZero"] = op_nonzero;
  t["ReverseSequence"] = op_reverse_sequence;
  t["Unique"] = op_unique;
  for (const char* op : {"RNN", "GRU", "LSTM"}) t[op] = op_recurrent;
  t["NonMaxSuppression"] = op_nms;
  t["TfIdfVectorizer"] = op_tfidf;
}

}  // namespace tg::onnx
