// Helpers shared by the ops_*.cpp files.
#include "ops_util.hpp"

#include "tg/device.hpp"
#include "tg/multi.hpp"
#include "tg/schedule.hpp"

#include <algorithm>

#include <range/v3/algorithm/sort.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/concat.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/single.hpp>
#include <range/v3/view/transform.hpp>
#include <range/v3/view/unique.hpp>

namespace tg::detail {

namespace rv = ranges::views;

std::string ints_str(const std::vector<int64_t>& v) { return shape_str(v); }

void fail(const std::string& op, const std::string& msg) { throw Error("[" + op + "] " + msg); }

int64_t norm_dim(int64_t d, int64_t ndim, const std::string& op, bool extra) {
  int64_t n = std::max<int64_t>(ndim + (extra ? 1 : 0), 1);
  if (d < -n || d >= n)
    fail(op, "dim " + std::to_string(d) + " is out of range for a tensor with " + std::to_string(ndim) + " dims");
  return d < 0 ? d + n : d;
}

std::vector<int64_t> norm_axes(const std::vector<int64_t>& axes, int64_t ndim, const std::string& op) {
  if (axes.empty()) return rv::iota(int64_t(0), ndim) | ranges::to<std::vector>();
  auto out = axes | rv::transform([&](int64_t a) { return ndim == 0 ? (norm_dim(a, 0, op), 0) : norm_dim(a, ndim, op); }) |
             ranges::to<std::vector>();
  if (ndim == 0) return {};
  ranges::sort(out);
  return out | rv::unique | ranges::to<std::vector>();
}

Tensor const_of(const Tensor& t, double v, DType d) { return Tensor::full({}, v, d, t.device()); }

double dtype_min(DType d) {
  if (dtypes::is_float(d)) return -std::numeric_limits<double>::infinity();
  if (dtypes::is_bool(d)) return 0;
  return double(dtypes::min_int(d));
}
double dtype_max(DType d) {
  if (dtypes::is_float(d)) return std::numeric_limits<double>::infinity();
  if (dtypes::is_bool(d)) return 1;
  return double(dtypes::max_uint(d));
}

DType float_dtype(DType d) { return dtypes::is_float(d) ? d : least_upper_float(dtypes::strong(d)); }

Tensor to_float(const Tensor& t) {
  if (dtypes::is_float(t.dtype())) return t;
  return t.cast(float_dtype(t.dtype()));
}

DType opmath_dtype(DType d) {
  DType f = least_upper_float(dtypes::strong(d));
  return f.scalar == Scalar::Float64 ? f : dtypes::float32;
}

Tensor to_opmath(const Tensor& t) {
  DType o = opmath_dtype(t.dtype());
  return t.dtype() == o ? t : t.cast(o);
}

Tensor arange_at(int64_t n, int64_t dim, int64_t ndim, const std::string& device, DType d) {
  Shape s(size_t(ndim), 1);
  s[size_t(dim)] = n;
  return Tensor::arange(0, double(n), 1, d, device).reshape(s);
}

std::vector<int64_t> expand_arg(const IntArg& a, size_t n, const std::string& op, const char* what,
                                const std::vector<int64_t>& dflt) {
  if (a.v.empty()) {
    if (dflt.size() == n) return dflt;
    fail(op, std::string(what) + " is empty; give one value or " + std::to_string(n));
  }
  if (a.v.size() == 1) return std::vector<int64_t>(n, a.v[0]);
  if (a.v.size() != n)
    fail(op, std::string(what) + " " + ints_str(a.v) + " needs 1 or " + std::to_string(n) + " values");
  return a.v;
}

namespace {
int64_t ceildiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
Tensor shrink_to(const Tensor& x, const Shape& s) {
  return x.shrink(s | rv::transform([](int64_t d) { return std::pair<int64_t, int64_t>{0, d}; }) | ranges::to<std::vector>());
}
// The leading dims, then one dim of each of the nk (a, b) pairs that follow them (a first when first == 0), then the other.
std::vector<int64_t> window_perm(size_t noop, size_t nk, int64_t first) {
  auto pair_dim = [&](int64_t which) {
    return rv::iota(int64_t(0), int64_t(nk)) | rv::transform([=](int64_t j) { return int64_t(noop) + 2 * j + which; });
  };
  return rv::concat(rv::iota(int64_t(0), int64_t(noop)), pair_dim(first), pair_dim(1 - first)) | ranges::to<std::vector>();
}
}  // namespace

Tensor pool_windows(const Tensor& x, const std::vector<int64_t>& k, const std::vector<int64_t>& stride,
                    const std::vector<int64_t>& dilation, const std::string& op) {
  size_t nk = k.size();
  if (size_t(x.ndim()) < nk) fail(op, "cannot pool " + shape_str(x.shape()) + " with a " + std::to_string(nk) + "-d kernel");
  size_t noop = size_t(x.ndim()) - nk;
  Shape pre(x.shape().begin(), x.shape().begin() + int64_t(noop));
  std::vector<int64_t> in(x.shape().begin() + int64_t(noop), x.shape().end()), o(nk), f(nk);
  for (size_t j = 0; j < nk; j++) {
    if (k[j] < 1 || stride[j] < 1 || dilation[j] < 1)
      fail(op, "kernel " + ints_str(k) + ", stride " + ints_str(stride) + " and dilation " + ints_str(dilation) +
                   " must be positive");
    if (dilation[j] * (k[j] - 1) + 1 > in[j])
      fail(op, "kernel " + ints_str(k) + " with dilation " + ints_str(dilation) + " does not fit the (padded) input " +
                   shape_str(x.shape()));
    o[j] = ceildiv(in[j] - dilation[j] * (k[j] - 1), stride[j]);
    f[j] = std::max<int64_t>(1, ceildiv(o[j] * stride[j] - dilation[j], in[j]));
  }
  // Windows that do not overlap (kernel <= stride, no dilation, as a 2x2 max pool): each spatial dim fitted to o*s
  // (the cut or added tail lies in no window), split into (o, s) and cut to (o, k). Plain views: the gradient is
  // a broadcast, not the sum over repeats the general path below needs.
  bool disjoint = true;
  for (size_t j = 0; j < nk; j++) disjoint &= k[j] <= stride[j] && dilation[j] == 1;
  if (disjoint) {
    std::vector<std::pair<int64_t, int64_t>> cut, pad, win;
    Shape split = pre;
    for (size_t j = 0; j < noop; j++) cut.push_back({0, pre[j]}), pad.push_back({0, 0}), win.push_back({0, pre[j]});
    for (size_t j = 0; j < nk; j++) {
      int64_t n = o[j] * stride[j];
      cut.push_back({0, std::min(in[j], n)});
      pad.push_back({0, std::max<int64_t>(0, n - in[j])});
      split.insert(split.end(), {o[j], stride[j]});
      win.insert(win.end(), {{0, o[j]}, {0, k[j]}});
    }
    Tensor t = x.shrink(cut).pad(pad).reshape(split).shrink(win);
    return t.permute(window_perm(noop, nk, 0));
  }
  // Repeat each spatial dim so that a reshape to (k, i*f + d) puts window element j at column j*d + o*s.
  std::vector<int64_t> rep(noop, 1);
  Shape s1 = pre, s2 = pre, s3 = pre, s4 = pre, s5 = pre, s6 = pre;
  for (size_t j = 0; j < nk; j++) {
    int64_t row = in[j] * f[j] + dilation[j];
    rep.push_back(ceildiv(k[j] * row, in[j]));
    s1.push_back(k[j] * row);
    s2.insert(s2.end(), {k[j], row});
    s3.insert(s3.end(), {k[j], o[j] * stride[j]});
    s4.insert(s4.end(), {k[j], o[j], stride[j]});
    s5.insert(s5.end(), {k[j], o[j], 1});
    s6.insert(s6.end(), {k[j], o[j]});
  }
  Tensor t = shrink_to(x.repeat(rep), s1).reshape(s2);
  t = shrink_to(t, s3).reshape(s4);
  t = shrink_to(t, s5).reshape(s6);
  return t.permute(window_perm(noop, nk, 1));
}

Tensor pad_last(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value) {
  std::vector<std::pair<int64_t, int64_t>> p(size_t(x.ndim()) - pads.size(), {0, 0});
  p.insert(p.end(), pads.begin(), pads.end());
  return x.pad(p, value);
}

Tensor one_hot_mask(const Tensor& index, int64_t n, const char* checked_op, std::optional<int64_t> except) {
  Tensor idx = index.unsqueeze(-1);
  Tensor m = idx.eq(arange_at(n, idx.ndim() - 1, idx.ndim(), index.device(), dtypes::strong(index.dtype())));
  return checked_op ? mark_index_check(m, checked_op, except) : m;
}

Tensor mark_index_check(const Tensor& mask, const char* op, std::optional<int64_t> except) {
  const UOp* u = mask.uop().get();
  bool detached = u->op == Ops::DETACH;  // under NoGrad
  if (detached) u = u->src(0);
  if (u->op != Ops::CMPEQ) return mask;
  std::vector<int64_t> mark{IndexCheck::code(op)};
  if (except) mark.push_back(*except);
  UOpRef c = UOp::make(Ops::CMPEQ, u->dtype, u->src(), mark);
  return Tensor(detached ? UOp::make(Ops::DETACH, c->dtype, {c}) : c, mask.shape(), mask.device());
}

void check_reduction(const std::string& reduction, const std::string& op) {
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    fail(op, "reduction '" + reduction + "' is not one of 'mean', 'sum', 'none'");
}

Tensor reduce_loss(const Tensor& t, const std::string& reduction, const std::string& op) {
  check_reduction(reduction, op);
  if (reduction == "sum") return t.sum();
  if (reduction == "mean") return t.mean();
  return t;
}

}  // namespace tg::detail
