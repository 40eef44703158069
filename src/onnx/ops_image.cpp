// ONNX operators on images and matrices: GridSample (lazy: taps gathered from the grid's coordinates), RoiAlign
// (sampling points from the host-read boxes), MaxUnpool, MaxPool with indices, Det (elimination with partial
// pivoting, unrolled), and DFT/STFT/MelWeightMatrix (as matmuls with host-made bases).
#include <algorithm>
#include <cmath>

#include "onnx_impl.hpp"

namespace tg::onnx {

namespace {

using Vals = std::vector<Value>;
Vals one(Tensor t) { return {Value::of(std::move(t))}; }
Tensor i64(double v) { return Tensor::full({}, v, dtypes::int64); }

// ---------------------------------------------------------------- GridSample (torch's grid_sampler semantics)

// Reflect coordinates into [twice_low/2, twice_high/2] (torch's reflect_coordinates).
Tensor reflect(const Tensor& x, double twice_low, double twice_high) {
  if (twice_low == twice_high) return x.zeros_like();
  double mn = twice_low / 2, span = (twice_high - twice_low) / 2;
  Tensor in = (x - mn).abs();
  Tensor flips = (in / span).floor();
  Tensor extra = in - flips * span;
  Tensor even = (flips - (flips / 2.0).floor() * 2.0) == 0.0;
  return even.where(extra + mn, (span - extra) + mn);
}

// Values of X (N, C, H, W) at integer pixel (iy, ix) of shape (N, Ho, Wo), zero where `valid` is false.
Tensor pixels(const Tensor& X, const Tensor& iy, const Tensor& ix, const std::optional<Tensor>& valid) {
  int64_t N = X.shape()[0], C = X.shape()[1], H = X.shape()[2], W = X.shape()[3];
  int64_t Ho = iy.shape()[1], Wo = iy.shape()[2];
  Tensor y = iy.clamp(0, double(H - 1)).cast(dtypes::int64), x = ix.clamp(0, double(W - 1)).cast(dtypes::int64);
  Tensor idx = (y * i64(double(W)) + x).reshape({N, 1, Ho * Wo}).expand({N, C, Ho * Wo});
  Tensor v = X.reshape({N, C, H * W}).gather(2, idx).reshape({N, C, Ho, Wo});
  if (valid) v = valid->reshape({N, 1, Ho, Wo}).where(v, Tensor::zeros({}, X.dtype()));
  return v;
}

std::vector<Tensor> cubic_weights(const Tensor& t) {
  const double A = -0.75;
  auto near = [&](const Tensor& x) { return ((x * (A + 2)) - (A + 3)) * x * x + 1.0; };      // |x| <= 1
  auto far = [&](const Tensor& x) { return (((x * A) - 5 * A) * x + 8 * A) * x - 4 * A; };  // 1 < |x| < 2
  return {far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)};
}

Vals op_grid_sample(Ctx& c) {
  Tensor X = c.t(0), grid = c.t(1).cast(dtypes::float32);
  if (X.ndim() != 4) c.error("only 4-D inputs (N, C, H, W) are supported");
  std::string mode = c.s("mode", "bilinear"), pad = c.s("padding_mode", "zeros");
  bool ac = c.i("align_corners", 0);
  int64_t H = X.shape()[2], W = X.shape()[3];
  Tensor Xf = X.cast(dtypes::float32);
  auto coord = [&](int64_t k) { return grid.slice({Slice::all(), Slice::all(), Slice::all(), Slice::index(k)}).squeeze(-1); };
  auto unnorm = [&](const Tensor& g, int64_t size) {
    return ac ? ((g + 1.0) / 2.0 * double(size - 1)) : (((g + 1.0) * double(size) - 1.0) / 2.0);
  };
  auto source = [&](const Tensor& g, int64_t size) {
    Tensor x = unnorm(g, size);
    if (pad == "border") x = x.clamp(0, double(size - 1));
    else if (pad == "reflection") {
      x = ac ? reflect(x, 0, 2.0 * double(size - 1)) : reflect(x, -1, 2.0 * double(size) - 1);
      x = x.clamp(0, double(size - 1));
    }
    return x;
  };
  auto inside = [&](const Tensor& iy, const Tensor& ix) {
    return (iy >= 0.0).logical_and(iy <= double(H - 1)).logical_and(ix >= 0.0).logical_and(ix <= double(W - 1));
  };
  std::optional<Tensor> out;  // the sum of the taps
  if (mode == "nearest" || mode == "bilinear") {
    Tensor y = source(coord(1), H), x = source(coord(0), W);
    if (mode == "nearest") {
      Tensor iy = y.round(), ix = x.round();
      out = pixels(Xf, iy, ix, inside(iy, ix));
    } else {
      Tensor y0 = y.floor(), x0 = x.floor();
      Tensor ty = y - y0, tx = x - x0;
      for (int dy = 0; dy < 2; dy++)
        for (int dx = 0; dx < 2; dx++) {
          Tensor iy = y0 + double(dy), ix = x0 + double(dx);
          Tensor w = (dy ? ty : (1.0 - ty)) * (dx ? tx : (1.0 - tx));
          Tensor v = pixels(Xf, iy, ix, inside(iy, ix)) * w.unsqueeze(1);
          out = out ? (*out + v) : v;
        }
    }
  } else if (mode == "bicubic") {
    Tensor y = unnorm(coord(1), H), x = unnorm(coord(0), W);
    Tensor y0 = y.floor(), x0 = x.floor();
    std::vector<Tensor> wy = cubic_weights(y - y0), wx = cubic_weights(x - x0);
    auto bound = [&](const Tensor& i, int64_t size) {
      if (pad == "border") return i.clamp(0, double(size - 1));
      if (pad == "reflection") return (ac ? reflect(i, 0, 2.0 * double(size - 1)) : reflect(i, -1, 2.0 * double(size) - 1)).clamp(0, double(size - 1));
      return i;
    };
    for (int dy = 0; dy < 4; dy++)
      for (int dx = 0; dx < 4; dx++) {
        Tensor iy = bound(y0 + double(dy - 1), H), ix = bound(x0 + double(dx - 1), W);
        std::optional<Tensor> valid;
        if (pad == "zeros") valid = inside(iy, ix);
        Tensor v = pixels(Xf, iy, ix, valid) * (wy[size_t(dy)] * wx[size_t(dx)]).unsqueeze(1);
        out = out ? (*out + v) : v;
      }
  } else {
    c.error("mode '" + mode + "' is not supported");
  }
  return one(out->cast(X.dtype()));
}

// ---------------------------------------------------------------- RoiAlign (onnxruntime's sampling rules)

Vals op_roi_align(Ctx& c) {
  Tensor X = c.t(0);
  std::vector<double> rois = c.floats(1);
  std::vector<int64_t> bidx = c.ints(2);
  int64_t C = X.shape()[1], H = X.shape()[2], W = X.shape()[3];
  int64_t PH = c.i("output_height", 1), PW = c.i("output_width", 1), sr = c.i("sampling_ratio", 0);
  double scale = c.f("spatial_scale", 1.0);
  bool half = c.s("coordinate_transformation_mode", c.opset >= 16 ? "half_pixel" : "output_half_pixel") == "half_pixel";
  bool is_max = c.s("mode", "avg") == "max";
  auto R = int64_t(bidx.size());
  if (int64_t(rois.size()) != R * 4) c.error("rois must be (num_rois, 4)");
  // Per roi and bin: a fixed number of samples (the largest over rois), each 4 taps; unused samples weigh 0.
  std::vector<std::vector<int64_t>> idx(static_cast<size_t>(R));
  std::vector<std::vector<float>> wt(static_cast<size_t>(R));
  std::vector<double> count(static_cast<size_t>(R));
  int64_t S = 1;
  std::vector<std::pair<int64_t, int64_t>> grids(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; r++) {
    double off = half ? 0.5 : 0.0;
    double x1 = rois[size_t(r * 4)] * scale - off, y1 = rois[size_t(r * 4 + 1)] * scale - off;
    double x2 = rois[size_t(r * 4 + 2)] * scale - off, y2 = rois[size_t(r * 4 + 3)] * scale - off;
    double rw = x2 - x1, rh = y2 - y1;
    if (!half) {
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    int64_t gh = sr > 0 ? sr : int64_t(std::ceil(rh / double(PH))), gw = sr > 0 ? sr : int64_t(std::ceil(rw / double(PW)));
    gh = std::max<int64_t>(gh, 1);
    gw = std::max<int64_t>(gw, 1);
    grids[size_t(r)] = {gh, gw};
    S = std::max(S, gh * gw);
  }
  for (int64_t r = 0; r < R; r++) {
    double off = half ? 0.5 : 0.0;
    double x1 = rois[size_t(r * 4)] * scale - off, y1 = rois[size_t(r * 4 + 1)] * scale - off;
    double x2 = rois[size_t(r * 4 + 2)] * scale - off, y2 = rois[size_t(r * 4 + 3)] * scale - off;
    double rw = x2 - x1, rh = y2 - y1;
    if (!half) {
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    double bh = rh / double(PH), bw = rw / double(PW);
    auto [gh, gw] = grids[size_t(r)];
    count[size_t(r)] = double(gh * gw);
    auto& I = idx[size_t(r)];
    auto& Wt = wt[size_t(r)];
    I.assign(size_t(PH * PW * S * 4), 0);
    Wt.assign(size_t(PH * PW * S * 4), 0.f);
    for (int64_t ph = 0; ph < PH; ph++)
      for (int64_t pw = 0; pw < PW; pw++)
        for (int64_t iy = 0; iy < gh; iy++)
          for (int64_t ix = 0; ix < gw; ix++) {
            double y = y1 + double(ph) * bh + (double(iy) + 0.5) * bh / double(gh);
            double x = x1 + double(pw) * bw + (double(ix) + 0.5) * bw / double(gw);
            size_t base = size_t((((ph * PW + pw) * S) + iy * gw + ix) * 4);
            if (y < -1.0 || y > double(H) || x < -1.0 || x > double(W)) continue;
            y = std::max(y, 0.0);
            x = std::max(x, 0.0);
            auto yl = int64_t(y), xl = int64_t(x);
            int64_t yh, xh;
            if (yl >= H - 1) {
              yh = yl = H - 1;
              y = double(yl);
            } else {
              yh = yl + 1;
            }
            if (xl >= W - 1) {
              xh = xl = W - 1;
              x = double(xl);
            } else {
              xh = xl + 1;
            }
            double ly = y - double(yl), lx = x - double(xl), hy = 1 - ly, hx = 1 - lx;
            int64_t p[4] = {yl * W + xl, yl * W + xh, yh * W + xl, yh * W + xh};
            double w[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
            for (int k = 0; k < 4; k++) {
              I[base + size_t(k)] = p[k];
              Wt[base + size_t(k)] = float(w[k]);
            }
          }
  }
  std::vector<int64_t> flat_i;
  std::vector<float> flat_w, cnt;
  for (int64_t r = 0; r < R; r++) {
    flat_i.insert(flat_i.end(), idx[size_t(r)].begin(), idx[size_t(r)].end());
    flat_w.insert(flat_w.end(), wt[size_t(r)].begin(), wt[size_t(r)].end());
    cnt.push_back(float(count[size_t(r)]));
  }
  int64_t K = PH * PW * S * 4;
  Tensor xs = X.cast(dtypes::float32).reshape({X.shape()[0], C, H * W}).index_select(0, Tensor::from_vector(bidx, {R}));
  Tensor taps = xs.gather(2, Tensor::from_vector(flat_i, {R, 1, K}).expand({R, C, K}));
  Tensor weighted = (taps * Tensor::from_vector(flat_w, {R, 1, K})).reshape({R, C, PH, PW, S, 4});
  Tensor y;
  if (is_max) y = weighted.max({4, 5});
  else y = weighted.sum({4, 5}) / Tensor::from_vector(cnt, {R, 1, 1, 1});
  return one(y.cast(X.dtype()));
}

// ---------------------------------------------------------------- MaxUnpool

Vals op_max_unpool(Ctx& c) {
  Tensor X = c.t(0);
  Tensor I = c.t(1).cast(dtypes::int64);
  size_t n = size_t(X.ndim() - 2);
  std::vector<int64_t> k = c.ints_attr("kernel_shape"), s = c.ints_attr("strides", std::vector<int64_t>(n, 1)),
                       p = c.ints_attr("pads", std::vector<int64_t>(2 * n, 0));
  if (k.size() != n) c.error("kernel_shape must have one entry per spatial dim");
  // indices address the inferred shape; a larger output_shape pads it at the end (as the ONNX reference)
  Shape out{X.shape()[0], X.shape()[1]};
  for (size_t i = 0; i < n; i++) out.push_back((X.shape()[i + 2] - 1) * s[i] + k[i] - p[i] - p[i + n]);
  int64_t total = 1;
  for (int64_t d : out) total *= d;
  Tensor y = Tensor::zeros({total}, X.dtype()).scatter(0, I.reshape({-1}), X.reshape({-1})).reshape(out);
  if (c.has(2)) {
    Shape want = c.ints(2);
    if (want.size() != out.size()) c.error("output_shape has the wrong rank");
    std::vector<std::pair<int64_t, int64_t>> pad;
    for (size_t d = 0; d < out.size(); d++) pad.push_back({0, want[d] - out[d]});
    y = y.pad(pad);
  }
  return one(y);
}

// ---------------------------------------------------------------- Det

Vals op_det(Ctx& c) {
  Tensor A = c.t(0).cast(dtypes::float64);
  int64_t n = A.shape().back();
  Shape batch(A.shape().begin(), A.shape().end() - 2);
  int64_t B = 1;
  for (int64_t d : batch) B *= d;
  A = A.reshape({B, n, n});
  Tensor sign = Tensor::ones({B}, dtypes::float64);
  Tensor rows = Tensor::arange(0, double(n), 1, dtypes::int64);
  Tensor eye = Tensor::eye(n, n, dtypes::float64);
  for (int64_t k = 0; k < n; k++) {
    // partial pivoting: swap row k with the row (>= k) of the largest |A[:, k]|
    Tensor col = A.slice({Slice::all(), Slice::all(), Slice::index(k)}).squeeze(-1).abs();
    col = (rows < i64(double(k))).unsqueeze(0).where(Tensor::full({}, -1, dtypes::float64), col);
    Tensor r = col.argmax(1, false).cast(dtypes::int64);  // (B)
    Tensor er = rows.unsqueeze(0).eq(r.unsqueeze(1)).cast(dtypes::float64), ek = rows.eq(i64(double(k))).cast(dtypes::float64).unsqueeze(0);
    Tensor P = eye.unsqueeze(0) - ek.unsqueeze(2) * ek.unsqueeze(1) - er.unsqueeze(2) * er.unsqueeze(1) + ek.unsqueeze(2) * er.unsqueeze(1) +
                      er.unsqueeze(2) * ek.unsqueeze(1);
    Tensor same = r == i64(double(k));
    P = same.reshape({B, 1, 1}).where(eye.unsqueeze(0), P);
    sign = same.where(sign, -sign);
    A = P.matmul(A);
    Tensor piv = A.slice({Slice::all(), Slice::index(k), Slice::index(k)}).reshape({B, 1, 1});
    Tensor rowk = A.slice({Slice::all(), Slice::index(k), Slice::all()}).reshape({B, 1, n});
    Tensor colk = A.slice({Slice::all(), Slice::all(), Slice::index(k)}).reshape({B, n, 1});
    Tensor below = (rows > i64(double(k))).cast(dtypes::float64).reshape({1, n, 1});
    Tensor safe = (piv == 0.0).where(Tensor::ones({}, dtypes::float64), piv);
    A = (A - (colk / safe) * below * rowk).realize();
  }
  Tensor diag = (A * eye.unsqueeze(0)).sum(2);  // (B, n)
  Tensor det = diag.prod(1) * sign;
  return one(det.reshape(batch).cast(c.t(0).dtype()));
}

// ---------------------------------------------------------------- DFT, STFT, MelWeightMatrix

// Real/imag DFT bases (n_in x n_out) for e^{-+2 pi i j k / n}.
std::pair<Tensor, Tensor> dft_basis(int64_t n_in, int64_t n, int64_t n_out, bool inverse) {
  std::vector<double> cs(size_t(n_in * n_out)), sn(size_t(n_in * n_out));
  for (int64_t j = 0; j < n_in; j++)
    for (int64_t k = 0; k < n_out; k++) {
      double a = 2 * M_PI * double((j * k) % n) / double(n);
      cs[size_t(j * n_out + k)] = std::cos(a);
      sn[size_t(j * n_out + k)] = inverse ? std::sin(a) : -std::sin(a);
    }
  return {Tensor::from_vector(cs, {n_in, n_out}), Tensor::from_vector(sn, {n_in, n_out})};
}

// x: (..., L, 2) complex along `axis` (the dim before the last) -> (..., n_out, 2).
Tensor dft(const Tensor& x, int64_t axis, int64_t n, bool inverse, bool onesided) {
  int64_t r = x.ndim();
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < r - 1; d++)
    if (d != axis) perm.push_back(d);
  perm.push_back(axis);
  perm.push_back(r - 1);
  Tensor xt = x.permute(perm).cast(dtypes::float64);
  int64_t L = xt.shape()[size_t(r - 2)];
  std::vector<std::pair<int64_t, int64_t>> fit(size_t(r), {0, 0});
  if (L < n) fit[size_t(r - 2)] = {0, n - L};
  xt = xt.pad(fit);
  std::vector<std::pair<int64_t, int64_t>> sh;
  for (int64_t d = 0; d < r; d++) sh.push_back({0, d == r - 2 ? n : xt.shape()[size_t(d)]});
  xt = xt.shrink(sh);
  int64_t n_out = onesided ? n / 2 + 1 : n;
  auto [cs, sn] = dft_basis(n, n, n_out, inverse);
  std::vector<Slice> s_re(size_t(r), Slice::all()), s_im(size_t(r), Slice::all());
  s_re.back() = Slice::index(0);
  s_im.back() = Slice::index(1);
  Tensor a = xt.slice(s_re).squeeze(-1), b = xt.slice(s_im).squeeze(-1);
  // (a + ib)(cos + i sin) with sin already signed: re = a cos - b sin, im = a sin + b cos
  Tensor out_re = a.matmul(cs) - b.matmul(sn), out_im = a.matmul(sn) + b.matmul(cs);
  if (inverse) {
    out_re = out_re / double(n);
    out_im = out_im / double(n);
  }
  Tensor y = stack({out_re, out_im}, -1);
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); i++) inv[size_t(perm[i])] = int64_t(i);
  return y.permute(inv);
}

Tensor as_complex(const Tensor& x) {
  if (x.shape().back() == 2) return x;
  return x.pad([&] {
    std::vector<std::pair<int64_t, int64_t>> p(size_t(x.ndim()), {0, 0});
    p.back() = {0, 1};
    return p;
  }());
}

Vals op_dft(Ctx& c) {
  Tensor x = as_complex(c.t(0));
  int64_t axis = c.i("axis", 1);
  if (axis < 0) axis += x.ndim();
  if (axis < 0 || axis >= x.ndim() - 1) c.error("axis out of range");
  int64_t n = c.has(1) ? c.ints(1).at(0) : x.shape()[size_t(axis)];
  return one(dft(x, axis, n, c.i("inverse", 0), c.i("onesided", 0)).cast(c.t(0).dtype()));
}

Vals op_stft(Ctx& c) {
  Tensor sig = as_complex(c.t(0));  // (B, L, 2)
  int64_t step = c.ints(1).at(0);
  std::optional<Tensor> window;
  if (c.has(2)) window = c.t(2);
  int64_t len = c.has(3) ? c.ints(3).at(0) : window->shape()[0];
  int64_t B = sig.shape()[0], L = sig.shape()[1];
  int64_t frames = 1 + (L - len) / step;
  std::vector<int64_t> idx;
  for (int64_t f = 0; f < frames; f++)
    for (int64_t j = 0; j < len; j++) idx.push_back(f * step + j);
  Tensor fr = sig.index_select(1, Tensor::from_vector(idx, {frames * len})).reshape({B, frames, len, 2});
  if (window) fr = fr * window->cast(fr.dtype()).reshape({1, 1, len, 1});
  return one(dft(fr, 2, len, false, c.i("onesided", 1)).cast(c.t(0).dtype()));
}

Vals op_mel(Ctx& c) {
  int64_t nmel = c.ints(0).at(0), dft_len = c.ints(1).at(0), rate = c.ints(2).at(0);
  double lo = c.floats(3).at(0), hi = c.floats(4).at(0);
  DType d = dtype_of_onnx(int32_t(c.i("output_datatype", 1)), c.model.name);
  int64_t bins = dft_len / 2 + 1;
  auto hz_to_mel = [](double hz) { return 2595 * std::log10(1 + hz / 700); };
  auto mel_to_hz = [](double m) { return 700 * (std::pow(10, m / 2595) - 1); };
  // as the ONNX reference: nmel + 2 points spaced by (mhi - mlo) / (nmel + 2), floored to bins
  double mlo = hz_to_mel(lo), mhi = hz_to_mel(hi), step = (mhi - mlo) / double(nmel + 2);
  std::vector<int64_t> fb(size_t(nmel + 2));
  for (int64_t i = 0; i < nmel + 2; i++) fb[size_t(i)] = int64_t(std::floor(double(dft_len + 1) * mel_to_hz(mlo + double(i) * step) / double(rate)));
  std::vector<double> m(size_t(bins * nmel), 0.0);
  auto at = [&](int64_t j, int64_t i) -> double& {
    if (j < 0 || j >= bins) c.error("a mel band edge falls outside the spectrogram bins");
    return m[size_t(j * nmel + i)];
  };
  for (int64_t i = 0; i < nmel; i++) {
    int64_t l = fb[size_t(i)], ctr = fb[size_t(i + 1)], h = fb[size_t(i + 2)];
    if (ctr == l) at(ctr, i) = 1;
    else
      for (int64_t j = l; j <= ctr; j++) at(j, i) = double(j - l) / double(ctr - l);
    if (h > ctr)
      for (int64_t j = ctr; j < h; j++) at(j, i) = double(h - j) / double(h - ctr);
  }
  return one(Tensor::from_vector(m, {bins, nmel}).cast(d));
}

}  // namespace

void register_image_ops(std::unordered_map<std::string, OpFn>& t) {
  t["GridSample"] = op_grid_sample;
  t["RoiAlign"] = op_roi_align;
  t["MaxUnpool"] = op_max_unpool;
  t["Det"] = op_det;
  t["DFT"] = op_dft;
  t["STFT"] = op_stft;
  t["MelWeightMatrix"] = op_mel;
}

}  // namespace tg::onnx
