// nn functional: convolutions (sliding windows from movement ops, then multiply and sum, like tinygrad's
// _pool), transposed convolutions, pools, norms, dropout, attention, embedding and interpolation.
#include <algorithm>
#include <tuple>

#include "conv.hpp"
#include "tg/env.hpp"
#include "tg/multi.hpp"

namespace tg {
using namespace detail;

namespace {
using Pads = std::vector<std::pair<int64_t, int64_t>>;

std::string conv_name(int64_t nd, const char* base) { return std::string(base) + std::to_string(nd) + "d"; }

// Convolution of x (N, C, *sp) with w (Cout, C/groups, *k) and any (even negative) padding pairs: the window view
// of the padded input times the weight, summed over (C/groups, *k). How it is laid out in memory (channels-last on
// the CPU, a materialised padded input) is the scheduler's choice (src/schedule/layout.cpp). Both gradients come
// from autograd (pm_gradient): the input's is the sum of the window gradient over the window view's repeats, which
// the layout stage rewrites into the gather form of a transposed convolution (conv_input_grad in layout.cpp).
Tensor conv_impl(const Tensor& x0, const Tensor& w, const std::optional<Tensor>& bias, const std::vector<int64_t>& st,
                 const Pads& pads, const std::vector<int64_t>& dl, int64_t groups, const std::string& op) {
  size_t nd = size_t(w.ndim() - 2);
  std::vector<int64_t> k(w.shape().begin() + 2, w.shape().end());
  Tensor r = window_conv(pool_windows(pad_last(x0, pads), k, st, dl, op), w, groups);
  if (!bias) return r;
  Shape bsh{1, w.shape()[0]};
  bsh.insert(bsh.end(), nd, 1);
  return r + bias->reshape(bsh);
}

void check_bias(const std::optional<Tensor>& bias, int64_t cout, const std::string& op) {
  if (bias && (bias->ndim() != 1 || bias->shape()[0] != cout))
    fail(op, "bias " + shape_str(bias->shape()) + " must be (" + std::to_string(cout) + ",) for " +
                 std::to_string(cout) + " output channels");
}

// Explicit pads from a ConvPadding (never "same"/"valid").
Pads pads_of(const std::vector<int64_t>& v, size_t nd, const std::string& op) {
  Pads p;
  if (v.size() == 1) p.assign(nd, {v[0], v[0]});
  else if (v.size() == nd)
    for (int64_t x : v) p.push_back({x, x});
  else if (v.size() == 2 * nd)
    for (size_t i = 0; i < nd; i++) p.push_back({v[2 * i], v[2 * i + 1]});
  else fail(op, "padding " + ints_str(v) + " needs 1, " + std::to_string(nd) + " or " + std::to_string(2 * nd) + " values");
  return p;  // a negative pad crops the input (as tinygrad; conv_impl pads with pad_last, which shrinks for it)
}

// Whether conv computes a (checked) convolution by Winograd's minimal filtering (conv2d_winograd), where it applies
// (2-d, stride and dilation 1, a square kernel with a Winograd tile, float32 or float64): by default on a CPU where
// its cost model (winograd_pays: the multiplications it saves against the elements its passes move, in the machine
// model's vector lanes; the forward alone where nothing requires a gradient) expects it to be faster; WINO=1
// wherever it applies, WINO=0 never. A GPU keeps the direct convolution unless WINO=1 (not measured there).
bool use_winograd(const Tensor& x, const Tensor& w, const std::vector<int64_t>& st, const std::vector<int64_t>& dl,
                  const Pads& pads, int64_t groups) {
  if (w.ndim() != 4 || st[0] != 1 || st[1] != 1 || dl[0] != 1 || dl[1] != 1) return false;
  if (w.shape()[2] != w.shape()[3] || winograd_tile(w.shape()[2]) == 0) return false;
  if (x.dtype() != w.dtype() || (x.dtype() != dtypes::float32 && x.dtype() != dtypes::float64)) return false;
  if (x.is_symbolic() || w.is_symbolic()) return false;
  int64_t wino = getenv_int("WINO", -1, 0, 1);
  if (wino >= 0) return wino == 1;
  Device& dev = get_device(split_devices(x.device())[0]);  // a sharded tensor: as on one of its devices
  if (!dev.runs_kernels() || dev.renderer().grid_limits().threads != 0) return false;
  int64_t out[2];
  for (size_t i = 0; i < 2; i++) out[i] = x.shape()[2 + i] + pads[i].first + pads[i].second - w.shape()[2] + 1;
  bool backward = !NoGrad::active() && (x.requires_grad() || w.requires_grad());
  return winograd_pays(x.shape()[0], x.shape()[1], w.shape()[0], groups, w.shape()[2], out, backward, dev.machine());
}

// Checks the (batched or unbatched) input rank: returns x batched, and whether a batch dim was added.
std::pair<Tensor, bool> batched(const Tensor& x, size_t nd, const std::string& op, const std::string& what) {
  if (size_t(x.ndim()) == nd + 2) return {x, false};
  if (size_t(x.ndim()) == nd + 1) return {x.unsqueeze(0), true};
  fail(op, what + " needs a " + std::to_string(nd + 2) + "-d (N, C, ...) or " + std::to_string(nd + 1) +
               "-d input, got shape " + shape_str(x.shape()));
}
}  // namespace

Tensor detail::window_conv(const Tensor& x, const Tensor& w, int64_t groups) {
  size_t nd = size_t(w.ndim() - 2);
  int64_t bs = x.shape()[0], cout = w.shape()[0], cin = w.shape()[1], rcout = cout / groups;
  std::vector<int64_t> k(w.shape().begin() + 2, w.shape().end());
  std::vector<int64_t> o(x.shape().begin() + 2, x.shape().begin() + 2 + int64_t(nd));
  Shape s1{bs, groups, cin, 1}, s2{bs, groups, cin, rcout};
  s1.insert(s1.end(), o.begin(), o.end());
  s2.insert(s2.end(), o.begin(), o.end());
  s1.insert(s1.end(), k.begin(), k.end());
  s2.insert(s2.end(), k.begin(), k.end());
  std::vector<int64_t> perm{0, 1, 3};
  for (size_t i = 0; i < nd; i++) perm.push_back(int64_t(4 + i));
  perm.push_back(2);
  for (size_t i = 0; i < nd; i++) perm.push_back(int64_t(4 + nd + i));
  Tensor xw = x.reshape(s1).expand(s2).permute(perm);  // (N, G, Cout/G, *o, Cin/G, *k)
  Shape ws{1, groups, rcout};
  ws.insert(ws.end(), nd, 1);
  ws.push_back(cin);
  ws.insert(ws.end(), k.begin(), k.end());
  std::vector<int64_t> red;
  for (size_t i = 0; i <= nd; i++) red.push_back(-1 - int64_t(i));
  Shape out{bs, cout};
  out.insert(out.end(), o.begin(), o.end());
  return (xw * w.reshape(ws)).sum(red).reshape(out);
}

// ---------------------------------------------------------------- convolutions

Tensor Tensor::conv(const Tensor& weight, const std::optional<Tensor>& bias, IntArg stride, ConvPadding padding,
                    IntArg dilation, int64_t groups, const std::string& padding_mode) const {
  if (weight.ndim() < 3) fail("conv", "weight must be (C_out, C_in / groups, *kernel), got " + shape_str(weight.shape()));
  size_t nd = size_t(weight.ndim() - 2);
  std::string op = conv_name(int64_t(nd), "conv");
  auto [x, unb] = batched(*this, nd, op, "weight " + shape_str(weight.shape()));
  if (groups < 1) fail(op, "groups must be positive, got " + std::to_string(groups));
  int64_t cout = weight.shape()[0], cin = weight.shape()[1];
  if (cin * groups != x.shape()[1])
    fail(op, "weight " + shape_str(weight.shape()) + " needs " + std::to_string(cin * groups) + " input channels" +
                 (groups > 1 ? " (" + std::to_string(cin) + " x " + std::to_string(groups) + " groups)" : std::string()) +
                 ", input " + shape_str(shape()) + " has " + std::to_string(x.shape()[1]));
  if (cout % groups != 0)
    fail(op, "weight " + shape_str(weight.shape()) + " has " + std::to_string(cout) + " output channels, not divisible by " +
                 std::to_string(groups) + " groups");
  check_bias(bias, cout, op);
  auto st = expand_arg(stride, nd, op, "stride"), dl = expand_arg(dilation, nd, op, "dilation");
  for (size_t i = 0; i < nd; i++)
    if (st[i] < 1 || dl[i] < 1) fail(op, "stride " + ints_str(st) + " and dilation " + ints_str(dl) + " must be positive");
  Pads pads;
  if (padding.mode == "same") {
    for (int64_t s : st)
      if (s != 1) fail(op, "padding 'same' needs stride 1, got " + ints_str(st));
    for (size_t i = 0; i < nd; i++) {
      int64_t total = dl[i] * (weight.shape()[2 + i] - 1);
      pads.push_back({total / 2, total - total / 2});
    }
  } else if (padding.mode == "valid") {
    pads.assign(nd, {0, 0});
  } else if (!padding.mode.empty()) {
    fail(op, "padding '" + padding.mode + "' is not 'same' or 'valid'");
  } else {
    pads = pads_of(padding.v, nd, op);
  }
  if (padding_mode != "zeros") {
    if (padding_mode != "reflect" && padding_mode != "replicate" && padding_mode != "circular")
      fail(op, "padding_mode '" + padding_mode + "' is not one of 'zeros', 'reflect', 'replicate', 'circular'");
    for (auto& [b, a] : pads)
      if (b < 0 || a < 0)
        fail(op, "padding " + ints_str(padding.v) + " with padding_mode '" + padding_mode +
                     "' must be non-negative (a negative pad crops, with padding_mode 'zeros' only)");
    Pads all(2, {0, 0});
    all.insert(all.end(), pads.begin(), pads.end());
    x = x.pad(all, padding_mode);
    pads.assign(nd, {0, 0});
  }
  for (size_t i = 0; i < nd; i++)
    if (x.shape()[2 + i] + pads[i].first + pads[i].second < dl[i] * (weight.shape()[2 + i] - 1) + 1)
      fail(op, "kernel " + shape_str(Shape(weight.shape().begin() + 2, weight.shape().end())) + " with dilation " +
                   ints_str(dl) + " is larger than the padded (or cropped) input " + shape_str(shape()));
  Tensor r = use_winograd(x, weight, st, dl, pads, groups) ? conv2d_winograd(x, weight, bias, pads, groups)
                                             : conv_impl(x, weight, bias, st, pads, dl, groups, op);
  return unb ? r.squeeze(0) : r;
}

Tensor Tensor::conv1d(const Tensor& w, const std::optional<Tensor>& b, IntArg s, ConvPadding p, IntArg d, int64_t g,
                      const std::string& m) const {
  if (w.ndim() != 3) fail("conv1d", "weight must be 3-d (C_out, C_in / groups, k), got " + shape_str(w.shape()));
  return conv(w, b, std::move(s), std::move(p), std::move(d), g, m);
}
Tensor Tensor::conv2d(const Tensor& w, const std::optional<Tensor>& b, IntArg s, ConvPadding p, IntArg d, int64_t g,
                      const std::string& m, CallLoc loc) const {
  CallSite site(loc);
  if (w.ndim() != 4) fail("conv2d", "weight must be 4-d (C_out, C_in / groups, kh, kw), got " + shape_str(w.shape()));
  return conv(w, b, std::move(s), std::move(p), std::move(d), g, m);
}
Tensor Tensor::conv3d(const Tensor& w, const std::optional<Tensor>& b, IntArg s, ConvPadding p, IntArg d, int64_t g,
                      const std::string& m) const {
  if (w.ndim() != 5) fail("conv3d", "weight must be 5-d (C_out, C_in / groups, kd, kh, kw), got " + shape_str(w.shape()));
  return conv(w, b, std::move(s), std::move(p), std::move(d), g, m);
}

Tensor Tensor::conv_transpose(const Tensor& weight, const std::optional<Tensor>& bias, IntArg stride, IntArg padding,
                              IntArg output_padding, int64_t groups, IntArg dilation) const {
  if (weight.ndim() < 3)
    fail("conv_transpose", "weight must be (C_in, C_out / groups, *kernel), got " + shape_str(weight.shape()));
  size_t nd = size_t(weight.ndim() - 2);
  std::string op = conv_name(int64_t(nd), "conv_transpose");
  auto [x, unb] = batched(*this, nd, op, "weight " + shape_str(weight.shape()));
  if (groups < 1) fail(op, "groups must be positive, got " + std::to_string(groups));
  int64_t cin = weight.shape()[0], rcout = weight.shape()[1];
  if (cin != x.shape()[1])
    fail(op, "weight " + shape_str(weight.shape()) + " needs " + std::to_string(cin) + " input channels, input " +
                 shape_str(shape()) + " has " + std::to_string(x.shape()[1]));
  if (cin % groups != 0)
    fail(op, "weight " + shape_str(weight.shape()) + " has " + std::to_string(cin) + " input channels, not divisible by " +
                 std::to_string(groups) + " groups");
  check_bias(bias, rcout * groups, op);
  auto st = expand_arg(stride, nd, op, "stride"), dl = expand_arg(dilation, nd, op, "dilation");
  auto pd = expand_arg(padding, nd, op, "padding"), opd = expand_arg(output_padding, nd, op, "output_padding");
  for (size_t i = 0; i < nd; i++) {
    if (st[i] < 1 || dl[i] < 1) fail(op, "stride " + ints_str(st) + " and dilation " + ints_str(dl) + " must be positive");
    if (pd[i] < 0 || opd[i] < 0) fail(op, "padding and output_padding must be non-negative");
    if (opd[i] >= st[i] && opd[i] >= dl[i])
      fail(op, "output_padding " + ints_str(opd) + " must be smaller than stride " + ints_str(st) + " or dilation " + ints_str(dl));
  }
  // Stride equal to the kernel, without padding, dilation or groups (an FPN's 2x2 upsampling): every output element
  // takes exactly one tap, so it is a matmul over the input channels and a pixel shuffle, not a convolution over
  // an input with s-1 zeros between elements (s^nd times the work, most of it multiplying zeros).
  bool shuffle = groups == 1;
  for (size_t i = 0; i < nd; i++)
    shuffle = shuffle && st[i] == weight.shape()[2 + i] && pd[i] == 0 && opd[i] == 0 && dl[i] == 1;
  if (shuffle) {
    int64_t bs = x.shape()[0];
    Shape xs{bs, 1, cin}, ws{1, rcout, cin}, out{bs, rcout}, bsh{1, rcout};
    std::vector<int64_t> wperm{1, 0}, perm{0, 1};
    xs.insert(xs.end(), nd, 1);
    xs.insert(xs.end(), x.shape().begin() + 2, x.shape().end());
    ws.insert(ws.end(), weight.shape().begin() + 2, weight.shape().end());
    ws.insert(ws.end(), nd, 1);
    for (size_t i = 0; i < nd; i++) {
      wperm.push_back(int64_t(2 + i));
      perm.insert(perm.end(), {int64_t(2 + nd + i), int64_t(2 + i)});  // (N, C_out, *k, *in) -> (N, C_out, in0, k0, ...)
      out.push_back(x.shape()[2 + i] * st[i]);
      bsh.push_back(1);
    }
    Tensor prod = (x.reshape(xs) * weight.permute(wperm).reshape(ws)).sum(2);  // (N, C_out, *k, *in)
    Tensor r = prod.permute(perm).reshape(out);
    if (bias) r = r + bias->reshape(bsh);
    return unb ? r.squeeze(0) : r;
  }
  // The equivalent convolution: weight regrouped to (C_out, C_in / groups, *k) and flipped in space.
  Shape wg{groups, cin / groups};
  wg.insert(wg.end(), weight.shape().begin() + 1, weight.shape().end());
  std::vector<int64_t> flips;
  for (size_t i = 0; i < nd; i++) flips.push_back(int64_t(3 + i));
  Tensor w = weight.reshape(wg).transpose(1, 2).flip(flips).flatten(0, 1);
  // stride: put s-1 zeros between input elements
  int64_t bs = x.shape()[0], c = x.shape()[1];
  if (std::any_of(st.begin(), st.end(), [](int64_t s) { return s > 1; })) {
    Shape s1{bs, c}, s2{bs, c};
    Pads p1{{0, 0}, {0, 0}};
    for (size_t i = 0; i < nd; i++) {
      int64_t n = x.shape()[2 + i];
      s1.insert(s1.end(), {n, 1});
      p1.push_back({0, 0});
      p1.push_back({0, st[i] - 1});
      s2.push_back(n * st[i]);
    }
    x = x.reshape(s1).pad(p1).reshape(s2);
    std::vector<std::pair<int64_t, int64_t>> sh{{0, bs}, {0, c}};
    for (size_t i = 0; i < nd; i++) sh.push_back({0, s2[2 + i] - (st[i] - 1)});
    x = x.shrink(sh);
  }
  Pads pads;
  for (size_t i = 0; i < nd; i++) {
    int64_t k = weight.shape()[2 + i], e = (k - 1) * dl[i];
    pads.push_back({e - pd[i], e - pd[i] + opd[i]});
  }
  for (size_t i = 0; i < nd; i++)
    if (x.shape()[2 + i] + pads[i].first + pads[i].second < dl[i] * (weight.shape()[2 + i] - 1) + 1)
      fail(op, "padding " + ints_str(pd) + " leaves no output for input " + shape_str(shape()));
  Tensor r = conv_impl(x, w, bias, std::vector<int64_t>(nd, 1), pads, dl, groups, op);
  return unb ? r.squeeze(0) : r;
}

Tensor Tensor::conv_transpose1d(const Tensor& w, const std::optional<Tensor>& b, IntArg s, IntArg p, IntArg op,
                                int64_t g, IntArg d) const {
  if (w.ndim() != 3) fail("conv_transpose1d", "weight must be 3-d (C_in, C_out / groups, k), got " + shape_str(w.shape()));
  return conv_transpose(w, b, std::move(s), std::move(p), std::move(op), g, std::move(d));
}
Tensor Tensor::conv_transpose2d(const Tensor& w, const std::optional<Tensor>& b, IntArg s, IntArg p, IntArg op,
                                int64_t g, IntArg d) const {
  if (w.ndim() != 4)
    fail("conv_transpose2d", "weight must be 4-d (C_in, C_out / groups, kh, kw), got " + shape_str(w.shape()));
  return conv_transpose(w, b, std::move(s), std::move(p), std::move(op), g, std::move(d));
}

// ---------------------------------------------------------------- pools

namespace {
struct PoolArgs {
  std::vector<int64_t> k, s, d;
  Pads pads;  // (begin, end) per spatial dim
  std::string op;
};

PoolArgs pool_args(const Tensor& x, size_t nd, const IntArg& kernel, const IntArg& stride, const IntArg& padding,
                   const IntArg& dilation, const std::string& op) {
  PoolArgs a;
  a.op = op;
  a.k = expand_arg(kernel, nd, op, "kernel_size");
  a.s = expand_arg(stride, nd, op, "stride", a.k);
  if (padding.v.size() == 2 * nd) {  // (begin, end) for each spatial dim
    for (size_t i = 0; i < nd; i++) a.pads.push_back({padding.v[2 * i], padding.v[2 * i + 1]});
  } else {
    for (int64_t v : expand_arg(padding, nd, op, "padding")) a.pads.push_back({v, v});
  }
  a.d = expand_arg(dilation, nd, op, "dilation");
  if (size_t(x.ndim()) < nd + 1)
    fail(op, "needs at least " + std::to_string(nd + 1) + " dims (C, *spatial), got shape " + shape_str(x.shape()));
  for (size_t i = 0; i < nd; i++) {
    if (a.k[i] < 1 || a.s[i] < 1 || a.d[i] < 1)
      fail(op, "kernel_size " + ints_str(a.k) + ", stride " + ints_str(a.s) + " and dilation " + ints_str(a.d) + " must be positive");
    auto [pb, pa] = a.pads[i];
    if (pb < 0 || pa < 0 || 2 * pb > a.k[i] || 2 * pa > a.k[i]) {
      std::vector<int64_t> shown = padding.v;  // as given, or one value per dim
      if (shown.size() != 2 * nd) {
        shown.clear();
        for (const auto& pr : a.pads) shown.push_back(pr.first);
      }
      fail(op, "padding " + ints_str(shown) + " must be non-negative and at most half the kernel " + ints_str(a.k));
    }
    int64_t in = x.shape()[size_t(x.ndim()) - nd + i];
    if (in + pb + pa < a.d[i] * (a.k[i] - 1) + 1)
      fail(op, "kernel " + ints_str(a.k) + " is larger than the padded input " + shape_str(x.shape()));
  }
  return a;
}

// Right pads that make the window count ceil((i + 2p - d(k-1) - 1) / s) + 1, dropping a last window that would
// start in the right padding (torch's ceil_mode rule).
Pads ceil_pads(const Tensor& x, const PoolArgs& a) {
  size_t nd = a.k.size();
  Pads out;
  for (size_t i = 0; i < nd; i++) {
    int64_t in = x.shape()[size_t(x.ndim()) - nd + i], pb = a.pads[i].first, pa = a.pads[i].second, ek = a.d[i] * (a.k[i] - 1) + 1;
    int64_t o = (in + pb + pa - ek + a.s[i] - 1) / a.s[i] + 1;
    int64_t extra = a.s[i] * (o - 1) + ek - (in + pb + pa) - std::max<int64_t>(a.s[i] * (o - 1) - (pb + in - 1), 0);
    out.push_back({pb, pa + extra});
  }
  return out;
}

Pads sym_pads(const PoolArgs& a) { return a.pads; }

std::vector<int64_t> last_axes(size_t nd) {
  std::vector<int64_t> r;
  for (size_t i = 0; i < nd; i++) r.push_back(-1 - int64_t(i));
  return r;
}
}  // namespace

// A max pool's windows (N, C, *o, *k) of x padded with its dtype's minimum, the pool's arguments and its pads.
static std::tuple<Tensor, PoolArgs, Pads> max_pool_windows(const Tensor& x, IntArg kernel, IntArg stride, IntArg padding, IntArg dilation,
                                                         bool ceil_mode) {
  size_t nd = kernel.v.size();
  if (nd == 0) fail("max_pool", "kernel_size is empty");
  PoolArgs a = pool_args(x, nd, kernel, stride, padding, dilation, "max_pool" + std::to_string(nd) + "d");
  Pads pads = ceil_mode ? ceil_pads(x, a) : sym_pads(a);
  Tensor w = pool_windows(pad_last(x, pads, dtype_min(x.dtype())), a.k, a.s, a.d, a.op);
  return {w, a, pads};
}

Tensor Tensor::max_pool(IntArg kernel, IntArg stride, IntArg padding, IntArg dilation, bool ceil_mode) const {
  Tensor w = std::get<0>(max_pool_windows(*this, kernel, stride, padding, dilation, ceil_mode));
  return w.max(last_axes(kernel.v.size()));
}
Tensor Tensor::max_pool1d(IntArg k, IntArg s, IntArg p, IntArg d, bool c) const {
  PoolArgs a = pool_args(*this, 1, k, s, p, d, "max_pool1d");
  return max_pool(a.k, a.s, p, a.d, c);
}
Tensor Tensor::max_pool2d(IntArg k, IntArg s, IntArg p, IntArg d, bool c) const {
  PoolArgs a = pool_args(*this, 2, k, s, p, d, "max_pool2d");
  return max_pool(a.k, a.s, p, a.d, c);
}

Tensor Tensor::avg_pool(IntArg kernel, IntArg stride, IntArg padding, bool ceil_mode, bool count_include_pad) const {
  size_t nd = kernel.v.size();
  if (nd == 0) fail("avg_pool", "kernel_size is empty");
  PoolArgs a = pool_args(*this, nd, kernel, stride, padding, 1, "avg_pool" + std::to_string(nd) + "d");
  Pads reg = sym_pads(a), pads = ceil_mode ? ceil_pads(*this, a) : reg;
  auto pool = [&](const Tensor& t, const Pads& p) { return pool_windows(pad_last(t, p), a.k, a.s, a.d, a.op).sum(last_axes(nd)); };
  Tensor x = to_float(*this), sum = pool(x, pads);
  if (!count_include_pad) return sum / pool(x.ones_like(), pads);
  if (!ceil_mode) {
    int64_t n = 1;
    for (int64_t k : a.k) n *= k;
    return sum / double(n);
  }
  // count the explicit padding but not the extra right padding of ceil_mode
  Pads extra;
  for (size_t i = 0; i < nd; i++) extra.push_back({0, pads[i].second - reg[i].second});
  return sum / pool(pad_last(x, reg).ones_like(), extra);
}
Tensor Tensor::avg_pool1d(IntArg k, IntArg s, IntArg p, bool c, bool cip) const {
  PoolArgs a = pool_args(*this, 1, k, s, p, 1, "avg_pool1d");
  return avg_pool(a.k, a.s, p, c, cip);
}
Tensor Tensor::avg_pool2d(IntArg k, IntArg s, IntArg p, bool c, bool cip) const {
  PoolArgs a = pool_args(*this, 2, k, s, p, 1, "avg_pool2d");
  return avg_pool(a.k, a.s, p, c, cip);
}

namespace {
// Adaptive pooling, one dim at a time: window i covers [floor(i*I/O), ceil((i+1)*I/O)) (torch's rule).
Tensor adaptive_pool(const Tensor& x0, const std::vector<int64_t>& out, bool is_max, const std::string& op) {
  size_t nd = out.size();
  if (nd == 0 || size_t(x0.ndim()) < nd + 1)
    fail(op, "output_size " + ints_str(out) + " needs an input with at least " + std::to_string(nd + 1) + " dims, got " +
                 shape_str(x0.shape()));
  Tensor x = is_max ? x0 : to_float(x0);
  bool divides = true;
  std::vector<int64_t> k;
  for (size_t i = 0; i < nd; i++) {
    int64_t in = x.shape()[size_t(x.ndim()) - nd + i];
    if (out[i] <= 0) fail(op, "output_size " + ints_str(out) + " must be positive");
    if (in == 0) fail(op, "input " + shape_str(x.shape()) + " has an empty spatial dim");
    divides &= in % out[i] == 0;
    k.push_back(in / std::max<int64_t>(out[i], 1));
  }
  if (divides) return is_max ? x.max_pool(k, k) : x.avg_pool(k, k);
  for (size_t i = 0; i < nd; i++) {
    int64_t dim = x.ndim() - int64_t(nd) + int64_t(i), in = x.shape()[size_t(dim)], o = out[i];
    std::vector<float> w(size_t(o * in), 0.f);
    std::vector<bool> m(size_t(o * in), false);
    for (int64_t j = 0; j < o; j++) {
      int64_t b = (j * in) / o, e = ((j + 1) * in + o - 1) / o;
      for (int64_t t = b; t < e; t++) {
        w[size_t(j * in + t)] = 1.f / float(e - b);
        m[size_t(j * in + t)] = true;
      }
    }
    Tensor xt = x.transpose(dim, -1).unsqueeze(-2);  // (..., 1, I)
    Tensor r;
    if (is_max) {
      Tensor mask = Tensor::from_vector(m, {o, in}, x.device());
      r = mask.where(xt, const_like(x, dtype_min(x.dtype()))).max(-1);
    } else {
      Tensor wt = Tensor::from_vector(w, {o, in}, x.device()).cast(x.dtype());
      r = (xt * wt).sum(-1);
    }
    x = r.transpose(dim, -1);
  }
  return x;
}
}  // namespace

Tensor Tensor::adaptive_avg_pool(const std::vector<int64_t>& output_size) const {
  return adaptive_pool(*this, output_size, false, "adaptive_avg_pool" + std::to_string(output_size.size()) + "d");
}
Tensor Tensor::adaptive_max_pool(const std::vector<int64_t>& output_size) const {
  return adaptive_pool(*this, output_size, true, "adaptive_max_pool" + std::to_string(output_size.size()) + "d");
}
Tensor Tensor::adaptive_avg_pool2d(IntArg output_size) const {
  return adaptive_avg_pool(expand_arg(output_size, 2, "adaptive_avg_pool2d", "output_size"));
}
Tensor Tensor::adaptive_max_pool2d(IntArg output_size) const {
  return adaptive_max_pool(expand_arg(output_size, 2, "adaptive_max_pool2d", "output_size"));
}

// ---------------------------------------------------------------- norms

namespace {
void check_param(const std::optional<Tensor>& t, const Shape& want, const char* what, const std::string& op) {
  if (t && t->shape() != want)
    fail(op, std::string(what) + " " + shape_str(t->shape()) + " must be " + shape_str(want));
}
// (C,) -> (1, C, 1, ...) for an input of rank n
Tensor per_channel(const Tensor& t, int64_t n) {
  Shape s(size_t(n), 1);
  s[1] = t.shape()[0];
  return t.reshape(s);
}
}  // namespace

Tensor Tensor::batch_norm(const std::optional<Tensor>& running_mean, const std::optional<Tensor>& running_var,
                          const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, bool training,
                          double momentum, double eps) const {
  if (ndim() < 2) fail("batch_norm", "needs (N, C, ...) input, got shape " + shape_str(shape()));
  int64_t c = shape()[1];
  Shape cs{c};
  check_param(running_mean, cs, "running_mean", "batch_norm");
  check_param(running_var, cs, "running_var", "batch_norm");
  check_param(weight, cs, "weight", "batch_norm");
  check_param(bias, cs, "bias", "batch_norm");
  if (!training && (!running_mean || !running_var))
    fail("batch_norm", "evaluation (training=false) needs running_mean and running_var");
  // 16-bit floats in float32 (opmath_dtype), rounded once at the end
  DType out = float_dtype(dtype());
  Tensor x = to_opmath(*this), mean, invstd;
  std::vector<int64_t> axes{0};
  for (int64_t i = 2; i < ndim(); i++) axes.push_back(i);
  if (training) {
    int64_t n = numel() / std::max<int64_t>(c, 1);
    if (n <= 1) fail("batch_norm", "training needs more than one value per channel, input " + shape_str(shape()));
    mean = x.mean(axes, true);
    Tensor d = x - mean;
    Tensor var = (d * d).mean(axes, true);
    invstd = (var + eps).rsqrt();
    if (running_mean && running_var) {  // in-place update like torch (unbiased variance), outside autograd
      Tensor m = mean.detach().reshape(cs), v = var.detach().reshape(cs) * (double(n) / double(n - 1));
      Tensor rm = *running_mean, rv = *running_var;
      rm.assign((rm * (1 - momentum) + m * momentum).cast(rm.dtype()));
      rv.assign((rv * (1 - momentum) + v * momentum).cast(rv.dtype()));
    }
  } else {
    mean = per_channel(*running_mean, ndim());
    invstd = (per_channel(*running_var, ndim()) + eps).rsqrt();
  }
  Tensor y = (x - mean) * invstd;
  if (weight) y = y * per_channel(*weight, ndim());
  if (bias) y = y + per_channel(*bias, ndim());
  return y.cast(out);
}

Tensor Tensor::layer_norm(const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight,
                          const std::optional<Tensor>& bias, double eps, CallLoc loc) const {
  CallSite site(loc);
  size_t k = normalized_shape.size();
  if (k == 0 || size_t(ndim()) < k || !std::equal(normalized_shape.begin(), normalized_shape.end(), shape().end() - int64_t(k)))
    fail("layer_norm", "normalized_shape " + ints_str(normalized_shape) + " must be the trailing dims of input " + shape_str(shape()));
  check_param(weight, normalized_shape, "weight", "layer_norm");
  check_param(bias, normalized_shape, "bias", "layer_norm");
  std::vector<int64_t> axes;
  for (size_t i = 0; i < k; i++) axes.push_back(ndim() - int64_t(k) + int64_t(i));
  Tensor x = to_opmath(*this);  // 16-bit floats in float32, rounded once at the end
  Tensor d = x - x.mean(axes, true);
  Tensor y = d * ((d * d).mean(axes, true) + eps).rsqrt();
  if (weight) y = y * *weight;
  if (bias) y = y + *bias;
  return y.cast(float_dtype(dtype()));
}

Tensor Tensor::group_norm(int64_t num_groups, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                          double eps) const {
  if (ndim() < 2) fail("group_norm", "needs (N, C, ...) input, got shape " + shape_str(shape()));
  int64_t c = shape()[1];
  if (num_groups <= 0 || c % num_groups != 0)
    fail("group_norm", std::to_string(c) + " channels of input " + shape_str(shape()) + " do not split into " +
                           std::to_string(num_groups) + " groups");
  check_param(weight, {c}, "weight", "group_norm");
  check_param(bias, {c}, "bias", "group_norm");
  Tensor x = to_opmath(*this).reshape({shape()[0], num_groups, -1});  // 16-bit floats in float32
  Tensor d = x - x.mean(-1, true);
  Tensor y = (d * ((d * d).mean(-1, true) + eps).rsqrt()).reshape(shape());
  if (weight) y = y * per_channel(*weight, ndim());
  if (bias) y = y + per_channel(*bias, ndim());
  return y.cast(float_dtype(dtype()));
}

Tensor Tensor::rms_norm(const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight,
                        std::optional<double> eps) const {
  size_t k = normalized_shape.size();
  if (k == 0 || size_t(ndim()) < k || !std::equal(normalized_shape.begin(), normalized_shape.end(), shape().end() - int64_t(k)))
    fail("rms_norm", "normalized_shape " + ints_str(normalized_shape) + " must be the trailing dims of input " + shape_str(shape()));
  check_param(weight, normalized_shape, "weight", "rms_norm");
  std::vector<int64_t> axes;
  for (size_t i = 0; i < k; i++) axes.push_back(ndim() - int64_t(k) + int64_t(i));
  // 16-bit floats in float32, rounded once at the end; the default eps is the input dtype's epsilon (torch's)
  DType out = float_dtype(dtype());
  Tensor x = to_opmath(*this);
  double e = eps.value_or(out == dtypes::float64    ? 0x1p-52
                          : out == dtypes::float16  ? 0x1p-10
                          : out == dtypes::bfloat16 ? 0x1p-7
                                                    : 0x1p-23);
  Tensor y = x * ((x * x).mean(axes, true) + e).rsqrt();
  return (weight ? (y * *weight) : y).cast(out);
}

// ---------------------------------------------------------------- dropout, attention, embedding, interpolate

Tensor Tensor::dropout(double p, bool training) const {
  if (!(p >= 0 && p <= 1)) fail("dropout", "p must be in [0, 1], got " + std::to_string(p));
  if (!training || p == 0) return *this;
  if (p == 1) return *this * 0.0;
  Tensor keep = rand_like(dtypes::float32).ge(p);
  return keep.where(*this * (1.0 / (1.0 - p)), const_like(*this, 0));
}

Tensor Tensor::scaled_dot_product_attention(const Tensor& key, const Tensor& value, const std::optional<Tensor>& attn_mask,
                                            double dropout_p, bool is_causal, std::optional<double> scale,
                                            bool enable_gqa) const {
  const char* op = "scaled_dot_product_attention";
  if (enable_gqa && ndim() >= 3 && key.ndim() >= 3 && value.ndim() >= 3) {
    int64_t hq = shape()[size_t(ndim() - 3)], hk = key.shape()[size_t(key.ndim() - 3)], hv = value.shape()[size_t(value.ndim() - 3)];
    if (hk == 0 || hv == 0 || hq % hk != 0 || hq % hv != 0)
      fail(op, "enable_gqa: the query's " + std::to_string(hq) + " heads (dim -3 of " + shape_str(shape()) +
                   ") must be a multiple of the key's " + std::to_string(hk) + " and the value's " + std::to_string(hv));
    if (hq != hk || hq != hv)  // each key/value head serves hq / hk consecutive query heads
      return scaled_dot_product_attention(key.repeat_interleave(hq / hk, -3), value.repeat_interleave(hq / hv, -3),
                                          attn_mask, dropout_p, is_causal, scale, false);
  }
  // sym_shape: a key and value read from a KV cache up to a Variable's position attend like concrete ones
  SymShape qs = sym_shape(), ks = key.sym_shape(), vs = value.sym_shape();
  if (qs.size() < 2 || ks.size() < 2 || vs.size() < 2)
    fail(op, "query " + shape_str(qs) + ", key " + shape_str(ks) + " and value " + shape_str(vs) +
                 " need at least 2 dims (..., L, E)");
  if (!(qs.back() == ks.back()))
    fail(op, "query " + shape_str(qs) + " and key " + shape_str(ks) + " differ in the embedding dim");
  if (!(ks[ks.size() - 2] == vs[vs.size() - 2]))
    fail(op, "key " + shape_str(ks) + " and value " + shape_str(vs) + " differ in sequence length");
  if (is_causal && attn_mask) fail(op, "give either attn_mask or is_causal, not both");
  if (!qs.back().is_int()) fail(op, "the embedding dim of query " + shape_str(qs) + " must be an int");
  double sc = scale.value_or(1.0 / std::sqrt(double(qs.back().value())));
  Tensor qk = matmul(key.transpose(-2, -1)) * sc;
  std::optional<Tensor> mask = attn_mask;
  if (is_causal) {
    if (qk.is_symbolic()) fail(op, "is_causal needs concrete sequence lengths, got scores " + shape_str(qk.sym_shape()) + ": pass attn_mask");
    int64_t l = qk.shape()[size_t(qk.ndim() - 2)], s = qk.shape().back();
    mask = Tensor::ones({l, s}, dtypes::bool_, device()).tril();
  }
  if (mask) {
    if (qk.is_symbolic() || mask->is_symbolic()) {
      SymShape qks = qk.sym_shape(), ms = mask->sym_shape();
      bool ok = ms.size() <= qks.size();
      for (size_t i = 0; ok && i < ms.size(); i++) {
        const sint& m = ms[ms.size() - 1 - i];
        ok = m == qks[qks.size() - 1 - i] || (m.is_int() && m.value() == 1);
      }
      if (!ok) fail(op, "attn_mask " + shape_str(ms) + " does not broadcast to the scores " + shape_str(qks));
    } else {
      Shape bs = broadcast_shape(qk.shape(), mask->shape(), op);
      if (bs != qk.shape()) fail(op, "attn_mask " + shape_str(mask->shape()) + " does not broadcast to the scores " + shape_str(qk.shape()));
    }
    qk = dtypes::is_bool(mask->dtype()) ? mask->where(qk, -INFINITY) : (qk + *mask);
  }
  Tensor attn = qk.softmax(-1);
  if (dropout_p > 0) attn = attn.dropout(dropout_p, true);
  return attn.matmul(value);
}

Tensor embedding(const Tensor& indices, const Tensor& weight, CallLoc loc) {
  CallSite site(loc);
  if (weight.ndim() != 2) fail("embedding", "weight must be 2-d (num_embeddings, dim), got " + shape_str(weight.shape()));
  if (!dtypes::is_int(indices.dtype())) fail("embedding", "indices must be integer, got " + indices.dtype().name());
  Shape s = indices.shape();
  s.push_back(weight.shape()[1]);
  return weight.index_select(0, indices.reshape({-1})).reshape(s);
}

Tensor Tensor::interpolate(const std::vector<int64_t>& size, const std::string& mode, bool align_corners) const {
  const char* op = "interpolate";
  size_t nd = size.size();
  bool linear = mode == "linear" || mode == "bilinear" || mode == "trilinear";
  if (!linear && mode != "nearest" && mode != "nearest-exact")
    fail(op, "mode '" + mode + "' is not one of 'nearest', 'nearest-exact', 'linear', 'bilinear', 'trilinear'");
  if (align_corners && !linear) fail(op, "align_corners only applies to the linear modes");
  if (nd == 0 || size_t(ndim()) < nd)
    fail(op, "size " + ints_str(size) + " names more dims than input " + shape_str(shape()) + " has");
  for (int64_t v : size)
    if (v <= 0) fail(op, "size " + ints_str(size) + " must be positive");
  Tensor x = linear ? to_float(*this) : *this;
  for (size_t ii = nd; ii-- > 0;) {  // the last dim first, like ATen's separable loops
    int64_t dim = ndim() - int64_t(nd) + int64_t(ii), in = shape()[size_t(dim)], out = size[ii];
    std::vector<int64_t> i0(static_cast<size_t>(out)), i1(static_cast<size_t>(out));
    std::vector<float> l0(static_cast<size_t>(out)), l1(static_cast<size_t>(out));
    for (int64_t j = 0; j < out; j++) {
      if (!linear) {
        float scale = float(in) / float(out);
        float src = mode == "nearest" ? float(j) * scale : (float(j) + 0.5f) * scale;
        i0[size_t(j)] = in == out ? j : std::min<int64_t>(int64_t(std::floor(src)), in - 1);
        continue;
      }
      if (in == out) {
        i0[size_t(j)] = i1[size_t(j)] = j;
        l0[size_t(j)] = 1;
        l1[size_t(j)] = 0;
        continue;
      }
      float scale = align_corners ? (out > 1 ? float(in - 1) / float(out - 1) : 0.f) : float(in) / float(out);
      float src = align_corners ? scale * float(j) : std::max(scale * (float(j) + 0.5f) - 0.5f, 0.f);
      int64_t a = int64_t(src);
      i0[size_t(j)] = a;
      i1[size_t(j)] = a + (a < in - 1 ? 1 : 0);
      l1[size_t(j)] = std::min(std::max(src - float(a), 0.f), 1.f);
      l0[size_t(j)] = 1.f - l1[size_t(j)];
    }
    Tensor idx0 = Tensor::from_vector(i0, {out}, device());
    if (!linear) {
      x = x.index_select(dim, idx0);
      continue;
    }
    Shape ls(size_t(ndim()), 1);
    ls[size_t(dim)] = out;
    Tensor w0 = Tensor::from_vector(l0, {out}, device()).reshape(ls).cast(x.dtype());
    Tensor w1 = Tensor::from_vector(l1, {out}, device()).reshape(ls).cast(x.dtype());
    Tensor idx1 = Tensor::from_vector(i1, {out}, device());
    x = x.index_select(dim, idx0) * w0 + x.index_select(dim, idx1) * w1;
  }
  return x;
}

// ---------------------------------------------------------------- max pool indices and unpool, tinygrad's norms

ValuesIndices Tensor::max_pool_with_indices(IntArg kernel, IntArg stride, IntArg padding, IntArg dilation, bool ceil_mode) const {
  size_t nd = kernel.v.size();
  auto [w, a, pads] = max_pool_windows(*this, kernel, stride, padding, dilation, ceil_mode);
  Tensor values = w.max(last_axes(nd));
  // the flat index in the input plane of each window's first maximum: the smallest index holding the maximum
  // (indices grow in the window's scan order; the padding's index is larger than any)
  Shape plane(shape().end() - int64_t(nd), shape().end());
  int64_t count = 1;
  for (int64_t v : plane) count *= v;
  constexpr double kBig = double(int64_t(1) << 62);
  Tensor pos = Tensor::arange(0, double(count), 1, dtypes::int64, device()).reshape(plane);
  Tensor wi = pool_windows(pad_last(pos, pads, kBig), a.k, a.s, a.d, a.op);
  Tensor at_max = w == values.reshape([&] {
    Shape s = values.shape();
    for (size_t i = 0; i < nd; i++) s.push_back(1);
    return s;
  }());
  Tensor idx = at_max.where(wi, Tensor::full({}, kBig, dtypes::int64, device())).min(last_axes(nd));
  return {values, idx};
}

ValuesIndices Tensor::max_pool2d_with_indices(IntArg k, IntArg s, IntArg p, IntArg d, bool c) const {
  PoolArgs a = pool_args(*this, 2, k, s, p, d, "max_pool2d");
  return max_pool_with_indices(a.k, a.s, p, a.d, c);
}

Tensor Tensor::max_unpool2d(const Tensor& indices, IntArg kernel, IntArg stride, IntArg padding,
                            const std::vector<int64_t>& output_size) const {
  const char* op = "max_unpool2d";
  size_t nd = kernel.v.size() == 1 ? 2 : kernel.v.size();
  if (size_t(ndim()) < nd + 1) fail(op, "needs at least " + std::to_string(nd + 1) + " dims, got shape " + shape_str(shape()));
  if (indices.shape() != shape() || !dtypes::is_int(indices.dtype()))
    fail(op, "indices " + shape_str(indices.shape()) + " (" + indices.dtype().name() + ") must be integers of the values' shape " + shape_str(shape()));
  std::vector<int64_t> k = expand_arg(kernel, nd, op, "kernel_size"), s = expand_arg(stride, nd, op, "stride", k);
  std::vector<int64_t> p = expand_arg(padding, nd, op, "padding");
  Shape out(shape().begin(), shape().end() - int64_t(nd));
  std::vector<int64_t> spatial = output_size;
  if (spatial.size() == nd + 2) spatial = std::vector<int64_t>(spatial.end() - int64_t(nd), spatial.end());
  if (spatial.empty())
    for (size_t i = 0; i < nd; i++) spatial.push_back((shape()[size_t(ndim()) - nd + i] - 1) * s[i] - 2 * p[i] + k[i]);
  if (spatial.size() != nd) fail(op, "output_size " + ints_str(output_size) + " must give the " + std::to_string(nd) + " spatial dims");
  int64_t plane = 1;
  for (int64_t v : spatial) {
    if (v <= 0) fail(op, "output size " + ints_str(spatial) + " must be positive");
    plane *= v;
  }
  Shape flat_in(shape().begin(), shape().end() - int64_t(nd)), flat_out = flat_in;
  flat_in.push_back(-1);
  flat_out.push_back(plane);
  Tensor r = Tensor::zeros(flat_out, dtype(), device()).scatter(int64_t(flat_out.size()) - 1, indices.reshape(flat_in), reshape(flat_in));
  out.insert(out.end(), spatial.begin(), spatial.end());
  return r.reshape(out);
}

Tensor Tensor::layernorm(std::vector<int64_t> axes, double eps) const {
  Tensor x = to_opmath(*this);
  Tensor y = x - x.mean(axes, true);
  return (y * ((y * y).mean(axes, true) + eps).rsqrt()).cast(float_dtype(dtype()));
}

Tensor Tensor::batchnorm(const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, const Tensor& mean,
                         const Tensor& invstd) const {
  if (ndim() < 2) fail("batchnorm", "needs (N, C, ...), got shape " + shape_str(shape()));
  Shape s(size_t(ndim()), 1);
  s[1] = -1;
  auto at_c = [&](const Tensor& t) { return t.ndim() == 1 ? t.reshape(s) : t; };
  Tensor x = *this - at_c(mean);
  if (weight) x = x * at_c(*weight);
  Tensor r = x * at_c(invstd);
  return bias ? (r + at_c(*bias)) : r;
}

}  // namespace tg
