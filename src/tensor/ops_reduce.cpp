// Reductions and scans: var/std, argmax/argmin, any/all, cumulative ops, logsumexp, log_softmax, sort and topk.
#include <algorithm>

#include "ops_util.hpp"

namespace tg {
using namespace detail;

namespace {
// Squeezed shape of x after reducing `axes` (already normalised).
Shape squeezed(const Shape& s, const std::vector<int64_t>& axes) {
  Shape out;
  for (size_t i = 0; i < s.size(); i++)
    if (std::find(axes.begin(), axes.end(), int64_t(i)) == axes.end()) out.push_back(s[i]);
  return out;
}
int64_t count_of(const Shape& s, const std::vector<int64_t>& axes) {
  int64_t n = 1;
  for (int64_t a : axes) n *= s[size_t(a)];
  return n;
}
}  // namespace

// 16-bit floats are computed in float32 and rounded once (opmath_dtype): their squares overflow float16 at 256.
Tensor Tensor::var(std::vector<int64_t> axes, bool keepdim, double correction) const {
  axes = norm_axes(axes, ndim(), "var");
  Tensor x = to_opmath(*this);
  Tensor d = x - x.mean(axes, true);
  double n = double(count_of(shape(), axes));
  return ((d * d).sum(axes, keepdim) / std::max(n - correction, 0.0)).cast(float_dtype(dtype()));
}
Tensor Tensor::std(std::vector<int64_t> axes, bool keepdim, double correction) const {
  return to_opmath(*this).var(std::move(axes), keepdim, correction).sqrt().cast(float_dtype(dtype()));
}
std::pair<Tensor, Tensor> Tensor::var_mean(std::vector<int64_t> axes, bool keepdim, double correction) const {
  return {var(axes, keepdim, correction), to_float(*this).mean(axes, keepdim)};
}
std::pair<Tensor, Tensor> Tensor::std_mean(std::vector<int64_t> axes, bool keepdim, double correction) const {
  return {std(axes, keepdim, correction), to_float(*this).mean(axes, keepdim)};
}

Tensor Tensor::argmax(std::optional<int64_t> axis, bool keepdim) const {
  if (!axis) {
    Tensor r = flatten().argmax(0);
    return keepdim ? r.reshape(Shape(size_t(ndim()), 1)) : r;
  }
  int64_t a = norm_dim(*axis, ndim(), "argmax");  // on a 0-d tensor, 0 or -1 (as torch)
  if (ndim() == 0) return full({}, 0, dtypes::int64, device());
  int64_t n = shape()[size_t(a)];
  if (n == 0) fail("argmax", "cannot take the argmax of an empty dim of " + shape_str(shape()));
  // n - max((x == max) * (n, n-1, ..., 1)) is the first index of the maximum; NaN is the maximum (as torch): a row
  // with NaN has max NaN, equal to nothing, and its first NaN is taken
  Tensor is_max = eq(max(a, true));
  if (dtypes::is_float(dtype())) is_max = is_max | isnan();
  Shape rs(size_t(ndim()), 1);
  rs[size_t(a)] = n;
  Tensor rev = arange(double(n), 0, -1, dtypes::int64, device()).reshape(rs);
  Tensor best = is_max.where(rev, full({}, 0, dtypes::int64, device())).max(a, keepdim);
  return full({}, double(n), dtypes::int64, device()) - best;
}
ValuesIndices Tensor::max_with_indices(int64_t dim, bool keepdim) const {
  return {max(dim, keepdim), argmax(dim, keepdim)};
}
ValuesIndices Tensor::min_with_indices(int64_t dim, bool keepdim) const {
  return {min(dim, keepdim), argmin(dim, keepdim)};
}
Tensor Tensor::argmin(std::optional<int64_t> axis, bool keepdim) const {
  Tensor inv = dtypes::is_float(dtype()) ? neg() : bitwise_not();
  return inv.argmax(axis, keepdim);
}

Tensor Tensor::any(std::vector<int64_t> axes, bool keepdim) const {
  Tensor b = dtypes::is_bool(dtype()) ? *this : ne(0);
  // max has no identity for an empty axis; counting does: any of nothing is false
  if (numel() == 0) return b.cast(dtypes::int32).sum(norm_axes(axes, ndim(), "any"), keepdim).ne(0);
  return b.max(norm_axes(axes, ndim(), "any"), keepdim);
}
Tensor Tensor::all(std::vector<int64_t> axes, bool keepdim) const {
  Tensor b = dtypes::is_bool(dtype()) ? logical_not() : eq(0);
  if (numel() == 0) return b.cast(dtypes::int32).sum(norm_axes(axes, ndim(), "all"), keepdim).eq(0);  // all of nothing is true
  return b.max(norm_axes(axes, ndim(), "all"), keepdim).logical_not();
}

// ---------------------------------------------------------------- scans

namespace {
Tensor reduce_last(const Tensor& t, Ops op) {
  if (op == Ops::ADD) return t.sum(-1);
  if (op == Ops::MUL) return t.prod(-1);
  return t.max(-1);
}
double identity_of(Ops op, DType d) { return op == Ops::ADD ? 0 : op == Ops::MUL ? 1 : dtype_min(d); }
Tensor combine(const Tensor& a, const Tensor& b, Ops op) {
  if (op == Ops::ADD) return a + b;
  if (op == Ops::MUL) return a * b;
  return a.maximum(b);
}

Tensor shrink_last(const Tensor& t, int64_t b, int64_t e) {
  std::vector<std::pair<int64_t, int64_t>> s;
  for (int64_t d : t.shape()) s.push_back({0, d});
  s.back() = {b, e};
  return t.shrink(s);
}

// Inclusive scan along the last dim: out[j] = op(x[0..j]) as windows of a padded copy (tinygrad's _cumalu).
Tensor scan_last(const Tensor& x, Ops op) {
  int64_t n = x.shape().back();
  Tensor p = pad_last(x, {{n - 1, 0}}, identity_of(op, x.dtype()));
  return reduce_last(pool_windows(p, {n}, {1}, {1}, "cumsum"), op);
}

// The same along `axis`; long dims scan in chunks of 256 and add the chunk totals (O(n * 256) work, not O(n^2)).
Tensor scan(const Tensor& self, int64_t axis, Ops op, const char* name) {
  axis = norm_dim(axis, self.ndim(), name);  // on a 0-d tensor, 0 or -1 (as torch)
  if (self.ndim() == 0) return op == Ops::ADD ? self.sum() : self;
  // sums and products of bools and ints accumulate in int64 (like torch), floats keep their dtype
  DType out = dtypes::strong(self.dtype());
  if (op != Ops::MAX && !dtypes::is_float(out) && out != dtypes::uint64) out = dtypes::int64;
  Tensor x = self.cast(out).transpose(axis, -1);
  int64_t n = x.shape().back();
  if (n == 0) return x.transpose(axis, -1);
  constexpr int64_t kSplit = 256;
  Tensor r;
  if (n <= 2 * kSplit) {
    r = scan_last(x, op);
  } else {
    int64_t padded = (n + kSplit - 1) / kSplit * kSplit, nc = padded / kSplit;
    Tensor c = pad_last(x, {{padded - n, 0}}, identity_of(op, out)).unflatten(-1, {nc, kSplit});
    Tensor chunks = scan_last(c, op);                                                 // (..., nc, 256)
    Tensor totals = shrink_last(chunks, kSplit - 1, kSplit).squeeze(-1);              // (..., nc)
    Tensor base = pad_last(scan_last(totals, op), {{1, -1}}, identity_of(op, out));  // exclusive scan
    r = shrink_last(combine(chunks, base.unsqueeze(-1), op).flatten(-2), padded - n, padded);
  }
  return r.cast(out).transpose(axis, -1);
}
}  // namespace

Tensor Tensor::cumsum(int64_t axis) const { return scan(*this, axis, Ops::ADD, "cumsum"); }
Tensor Tensor::cumprod(int64_t axis) const { return scan(*this, axis, Ops::MUL, "cumprod"); }

std::pair<Tensor, Tensor> Tensor::cummax(int64_t axis) const {
  axis = norm_dim(axis, ndim(), "cummax");  // on a 0-d tensor, 0 or -1 (as torch)
  if (ndim() == 0) return {*this, full({}, 0, dtypes::int64, device())};
  Tensor values = scan(*this, axis, Ops::MAX, "cummax");
  int64_t n = shape()[size_t(axis)];
  if (n == 0) return {values, full(shape(), 0, dtypes::int64, device())};  // an empty axis: empty results (torch)
  Tensor x = transpose(axis, -1), v = values.transpose(axis, -1);
  // index of value j: the last i <= j with x[i] == v[j]
  Tensor i_le_j = Tensor::ones({n, n}, dtypes::bool_, device()).triu();
  Tensor same = x.unsqueeze(-1).eq(v.unsqueeze(-2));  // (..., i, j); a NaN maximum is matched by a NaN (as torch)
  if (dtypes::is_float(dtype())) same = same | (x.unsqueeze(-1).isnan() & v.unsqueeze(-2).isnan());
  Tensor match = same & i_le_j;
  Tensor ii = arange(0, double(n), 1, dtypes::int64, device()).reshape({n, 1});
  Tensor idx = match.where(ii, full({}, -1, dtypes::int64, device())).max(-2);
  return {values, idx.transpose(-1, axis)};
}
std::pair<Tensor, Tensor> Tensor::cummin(int64_t axis) const {
  Tensor inv = dtypes::is_float(dtype()) ? neg() : bitwise_not();
  auto [v, i] = inv.cummax(axis);
  return {dtypes::is_float(dtype()) ? v.neg() : v.bitwise_not(), i};
}

Tensor Tensor::logsumexp(std::vector<int64_t> axes, bool keepdim) const {
  axes = norm_axes(axes, ndim(), "logsumexp");
  Tensor x = to_opmath(*this);
  Tensor m = x.max(axes, true).detach();
  m = m.isinf().where(0.0, m);  // all -inf (or +inf) rows: no shift
  Tensor r = (x - m).exp().sum(axes, keepdim).log();
  return (r + (keepdim ? m : m.reshape(squeezed(m.shape(), axes)))).cast(float_dtype(dtype()));
}

Tensor Tensor::logcumsumexp(int64_t axis) const {
  axis = norm_dim(axis, ndim(), "logcumsumexp");
  if (ndim() == 0) return to_float(*this);
  Tensor x = to_float(*this).transpose(axis, -1);
  int64_t n = x.shape().back();
  Tensor cm = x.cummax(-1).first.detach();
  cm = cm.isinf().where(0.0, cm);
  Tensor i_le_j = Tensor::ones({n, n}, dtypes::bool_, device()).tril();  // (j, i): i <= j
  Tensor sh = i_le_j.where(x.unsqueeze(-2) - cm.unsqueeze(-1), -INFINITY);
  Tensor r = sh.exp().sum(-1).log() + cm;
  return r.transpose(-1, axis);
}

Tensor Tensor::log_softmax(int64_t axis, CallLoc loc) const {
  CallSite site(loc);
  DType out = float_dtype(dtype());
  Tensor x = to_opmath(*this);
  axis = norm_dim(axis, ndim(), "log_softmax");
  if (ndim() == 0) return (x * 0.0).cast(out);
  if (max_shape()[size_t(axis)] == 0) return x.cast(out);  // an empty axis: an empty result (torch)
  Tensor m = x - x.max(axis, true).detach();
  return (m - m.exp().sum(axis, true).log()).cast(out);
}
Tensor Tensor::log_softmax(int64_t axis, DType dtype, CallLoc loc) const {
  CallSite site(loc);
  return cast(dtype).log_softmax(axis).cast(dtype);
}
Tensor Tensor::softmin(int64_t axis) const { return to_float(*this).neg().softmax(axis); }

// ---------------------------------------------------------------- sort, topk

namespace {
// One compare-exchange layer of the bitonic network: along `d` (size 2), the pair that comes first in the order
// (value, then index: a strict order, so the network's result is the stable sort) moves to position 0. NaN is
// the largest value and equal to NaN (torch's order); the padding (index >= n) comes after every real element.
void compare_exchange(Tensor& x, Tensor& idx, int64_t d, bool descending, int64_t n) {
  auto half = [&](const Tensor& t, int64_t i) {
    std::vector<std::pair<int64_t, int64_t>> r;
    for (int64_t s : t.shape()) r.push_back({0, s});
    r[size_t(d)] = {i, i + 1};
    return t.shrink(r);
  };
  Tensor a = half(x, 0), b = half(x, 1), ia = half(idx, 0), ib = half(idx, 1);
  Tensor ahead = descending ? a.gt(b) : a.lt(b), same = a.eq(b);
  if (dtypes::is_float(x.dtype())) {
    Tensor na = a.isnan(), nb = b.isnan();
    ahead = ahead | (descending ? (na & nb.logical_not()) : (nb & na.logical_not()));
    same = same | (na & nb);
  }
  Tensor lim = Tensor::full({}, double(n), dtypes::int64, x.device());
  Tensor pa = ia >= lim, pb = ib >= lim, real = pa.logical_not() & pb.logical_not();
  Tensor first = (real & (ahead | (same & ia.lt(ib)))) | (pa.logical_not() & pb) | (pa & pb & ia.lt(ib));
  x = cat({first.where(a, b), first.where(b, a)}, d).contiguous();
  idx = cat({first.where(ia, ib), first.where(ib, ia)}, d).contiguous();
}
}  // namespace

std::pair<Tensor, Tensor> Tensor::sort(int64_t dim, bool descending) const {
  dim = norm_dim(dim, ndim(), "sort");  // on a 0-d tensor, 0 or -1 (as torch)
  if (ndim() == 0) return {*this, full({}, 0, dtypes::int64, device())};
  int64_t n = shape()[size_t(dim)];
  if (n <= 1) return {*this, zeros_like(dtypes::int64)};
  if (dtypes::is_bool(dtype())) {
    auto [v, i] = cast(dtypes::uint8).sort(dim, descending);
    return {v.cast(dtypes::bool_), i};
  }
  // Bitonic network (tinygrad's) on (value, index) pairs along the last dim, padded to 2^k (the padding sorts
  // last), viewed as k dims of size 2: stage s sorts blocks of 2^s, the upper half of each 2^(s+1) block reversed
  // (a "crossover" flip) so every compare-exchange points the same way.
  int64_t k = 0;
  while ((int64_t(1) << k) < n) k++;
  int64_t p2 = int64_t(1) << k, nd = ndim();
  Tensor x = detach().transpose(dim, -1);  // the gradient goes to each value's source position (below)
  Shape lead(x.shape().begin(), x.shape().end() - 1), bits = lead;
  for (int64_t i = 0; i < k; i++) bits.push_back(2);
  std::vector<std::pair<int64_t, int64_t>> pads(size_t(nd), {0, 0});
  pads.back() = {0, p2 - n};
  x = x.pad(pads).reshape(bits);
  Tensor idx = Tensor::arange(0, double(p2), 1, dtypes::int64, device());
  Shape full_s = lead;
  full_s.push_back(p2);
  Shape ones(lead.size(), 1);
  ones.push_back(p2);
  idx = idx.reshape(ones).expand(full_s).reshape(bits);
  int64_t base = nd - 1;  // the first bit dim (the most significant)
  auto flip_low = [&](const Tensor& t, int64_t cross, int64_t stage) {  // reverse the upper half's low `stage` bits
    std::vector<std::pair<int64_t, int64_t>> lo, hi;
    for (int64_t s : t.shape()) lo.push_back({0, s}), hi.push_back({0, s});
    lo[size_t(cross)] = {0, 1};
    hi[size_t(cross)] = {1, 2};
    std::vector<int64_t> axes;
    for (int64_t j = 0; j < stage; j++) axes.push_back(base + k - 1 - j);
    return cat({t.shrink(lo), t.shrink(hi).flip(axes)}, cross);
  };
  for (int64_t stage = 1; stage <= k; stage++) {
    int64_t cross = base + k - stage - 1;
    if (stage != k) x = flip_low(x, cross, stage), idx = flip_low(idx, cross, stage);
    for (int64_t sub = stage - 1; sub >= 0; sub--) compare_exchange(x, idx, base + k - sub - 1, descending, n);
    if (stage != k) x = flip_low(x, cross, stage), idx = flip_low(idx, cross, stage);
  }
  std::vector<std::pair<int64_t, int64_t>> keep;
  for (int64_t s : lead) keep.push_back({0, s});
  keep.push_back({0, n});
  x = x.reshape(full_s).shrink(keep);
  idx = idx.reshape(full_s).shrink(keep);
  Tensor values = x.transpose(dim, -1), indices = idx.transpose(dim, -1);
  // Float values are read back by their indices: a gather, whose gradient rules scatter each value's gradient back
  // where it came from (through the network's every layer, the gradient would fuse into one kernel that re-reads
  // each layer twice over). The gather is an indexed load (the one-hot sum folds, src/schedule/kernel_ast.cpp).
  if (dtypes::is_float(dtype())) values = gather(dim, indices);
  return {values, indices};
}
Tensor Tensor::argsort(int64_t dim, bool descending) const { return sort(dim, descending).second; }

std::pair<Tensor, Tensor> Tensor::topk(int64_t k, int64_t dim, bool largest) const {
  if (ndim() == 0) {
    (void)norm_dim(dim, 0, "topk");  // 0 or -1 (as torch)
    if (k > 1) fail("topk", "k " + std::to_string(k) + " is out of range for a 0-d tensor");
    return sort(0, largest);
  }
  dim = norm_dim(dim, ndim(), "topk");
  int64_t n = shape()[size_t(dim)];
  if (k < 0 || k > n)
    fail("topk", "k " + std::to_string(k) + " is out of range for dim " + std::to_string(dim) + " of " + shape_str(shape()));
  auto [v, i] = sort(dim, largest);
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t d : shape()) r.push_back({0, d});
  r[size_t(dim)] = {0, k};
  return {v.shrink(r), i.shrink(r)};
}

Tensor Tensor::normalize(double p, int64_t dim, double eps) const {
  Tensor x = to_float(*this);
  Tensor a = x.abs(), norm;
  if (std::isinf(p) && p > 0) norm = a.max(dim, true);
  else if (p == 1) norm = a.sum(dim, true);
  else if (p == 2) norm = x.square().sum(dim, true).sqrt();
  else norm = a.pow(p).sum(dim, true).pow(1.0 / p);
  return x / norm.maximum(const_like(norm, eps));
}

}  // namespace tg
