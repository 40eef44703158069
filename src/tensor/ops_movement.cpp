// Movement and indexing: cat, stack, repeat, split, roll, gather, scatter, advanced indexing, setitem, pad modes.
// Gathers and scatters are one-hot masks reduced with sum (no data-dependent addressing), as in tinygrad.
#include <algorithm>
#include <cctype>
#include <numeric>
#include <sstream>

#include "ops_util.hpp"

namespace tg {
using namespace detail;

namespace {
std::vector<std::pair<int64_t, int64_t>> full_range(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t d : t.shape()) r.push_back({0, d});
  return r;
}
Tensor shrink_dim(const Tensor& t, int64_t dim, int64_t b, int64_t e) {
  auto r = full_range(t);
  r[size_t(dim)] = {b, e};
  return t.shrink(r);
}
Tensor pad_dim(const Tensor& t, int64_t dim, int64_t b, int64_t e, double value = 0) {
  std::vector<std::pair<int64_t, int64_t>> p(size_t(t.ndim()), {0, 0});
  p[size_t(dim)] = {b, e};
  return t.pad(p, value);
}
int64_t floor_mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }
}  // namespace

// ---------------------------------------------------------------- cat, stack, repeat, split

Tensor cat(const std::vector<Tensor>& ts, int64_t dim, CallLoc loc) {
  CallSite site(loc);
  if (ts.empty()) fail("cat", "needs at least one tensor");
  const Tensor& t0 = ts[0];
  if (t0.ndim() == 0) fail("cat", "zero-dimensional tensors cannot be concatenated");
  dim = norm_dim(dim, t0.ndim(), "cat");
  bool sym = false;
  for (auto& t : ts) sym |= t.is_symbolic();
  if (sym) {  // symbolic dims: the same pieces padded by sints (each piece after the ones before it)
    SymShape s0 = t0.sym_shape();
    DType o = dtypes::strong(t0.dtype());
    sint total = 0;
    for (size_t i = 0; i < ts.size(); i++) {
      SymShape s = ts[i].sym_shape();
      bool ok = s.size() == s0.size();
      for (size_t d = 0; ok && d < s0.size(); d++) ok = int64_t(d) == dim || s[d] == s0[d];
      if (!ok)
        fail("cat", "tensor " + std::to_string(i) + " has shape " + shape_str(s) + ", expected " + shape_str(s0) +
                        " except in dim " + std::to_string(dim));
      o = dtypes::strong(least_upper_dtype({o, ts[i].dtype()}));
      total = total + s[size_t(dim)];
    }
    Tensor r;
    sint off = 0;
    for (size_t i = 0; i < ts.size(); i++) {
      sint n = ts[i].sym_shape()[size_t(dim)];
      std::vector<std::pair<sint, sint>> p(s0.size(), {sint(0), sint(0)});
      p[size_t(dim)] = {off, total - off - n};
      Tensor piece = ts[i].cast(o).pad(p);
      off = off + n;
      r = i == 0 ? piece : (dtypes::is_bool(o) ? r.alu(Ops::OR, piece) : r.alu(Ops::ADD, piece));
    }
    return r;
  }
  DType out = dtypes::strong(t0.dtype());
  for (size_t i = 0; i < ts.size(); i++) {
    const Tensor& t = ts[i];
    bool ok = t.ndim() == t0.ndim();
    for (int64_t d = 0; ok && d < t0.ndim(); d++) ok = d == dim || t.shape()[size_t(d)] == t0.shape()[size_t(d)];
    if (!ok)
      fail("cat", "tensor " + std::to_string(i) + " has shape " + shape_str(t.shape()) + ", expected " +
                      shape_str(t0.shape()) + " except in dim " + std::to_string(dim));
    out = dtypes::strong(least_upper_dtype({out, t.dtype()}));
  }
  if (ts.size() == 1) return t0.cast(out);
  int64_t total = 0;
  for (auto& t : ts) total += t.shape()[size_t(dim)];
  Tensor r;
  int64_t off = 0;
  bool first = true;
  for (size_t i = 0; i < ts.size(); i++) {
    int64_t n = ts[i].shape()[size_t(dim)];
    if (n == 0 && (total > 0 || !first)) continue;  // an empty piece adds nothing (and no buffer to the kernel)
    Tensor p = pad_dim(ts[i].cast(out), dim, off, total - off - n);
    off += n;
    r = first ? p : (dtypes::is_bool(out) ? r.alu(Ops::OR, p) : r.alu(Ops::ADD, p));
    first = false;
  }
  return r;
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim, CallLoc loc) {
  CallSite site(loc);
  if (ts.empty()) fail("stack", "needs at least one tensor");
  for (size_t i = 1; i < ts.size(); i++)
    if (ts[i].shape() != ts[0].shape())
      fail("stack", "tensor " + std::to_string(i) + " has shape " + shape_str(ts[i].shape()) + ", expected " +
                        shape_str(ts[0].shape()));
  dim = norm_dim(dim, ts[0].ndim(), "stack", true);
  std::vector<Tensor> u;
  for (auto& t : ts) u.push_back(t.unsqueeze(dim));
  return cat(u, dim);
}

Tensor Tensor::repeat(const std::vector<int64_t>& repeats, CallLoc loc) const {
  CallSite site(loc);
  if (int64_t(repeats.size()) < ndim())
    fail("repeat", "needs at least " + std::to_string(ndim()) + " repeats for shape " + shape_str(shape()) + ", got " +
                       ints_str(repeats));
  for (int64_t r : repeats)
    if (r < 0) fail("repeat", "repeats must be non-negative, got " + ints_str(repeats));
  Shape base(repeats.size() - size_t(ndim()), 1);
  base.insert(base.end(), shape().begin(), shape().end());
  Shape unsq, expd, fin;
  for (size_t i = 0; i < repeats.size(); i++) {
    if (repeats[i] != 1) {
      unsq.push_back(1);
      expd.push_back(repeats[i]);
    }
    unsq.push_back(base[i]);
    expd.push_back(base[i]);
    fin.push_back(base[i] * repeats[i]);
  }
  return reshape(unsq).expand(expd).reshape(fin);
}

Tensor Tensor::repeat_interleave(int64_t repeats, std::optional<int64_t> dim) const {
  if (repeats < 0) fail("repeat_interleave", "repeats must be non-negative, got " + std::to_string(repeats));
  Tensor x = dim ? *this : flatten();
  int64_t d = dim ? norm_dim(*dim, ndim(), "repeat_interleave") : 0;
  Shape s = x.shape(), s1 = s, s2 = s, s3 = s;
  s1.insert(s1.begin() + d + 1, 1);
  s2.insert(s2.begin() + d + 1, repeats);
  s3[size_t(d)] *= repeats;
  return x.reshape(s1).expand(s2).reshape(s3);
}

std::vector<Tensor> Tensor::split(int64_t size, int64_t dim) const {
  dim = norm_dim(dim, ndim(), "split");
  if (size <= 0) fail("split", "split size must be positive, got " + std::to_string(size));
  int64_t n = shape()[size_t(dim)];
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < std::max<int64_t>(n, 1); i += size) sizes.push_back(std::min(size, n - i));
  return split(sizes, dim);
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t dim) const {
  dim = norm_dim(dim, ndim(), "split");
  int64_t n = shape()[size_t(dim)], sum = 0;
  for (int64_t s : sizes) {
    if (s < 0) fail("split", "sizes must be non-negative, got " + ints_str(sizes));
    sum += s;
  }
  if (sum != n) fail("split", "sizes " + ints_str(sizes) + " sum to " + std::to_string(sum) + ", dim " +
                                  std::to_string(dim) + " of " + shape_str(shape()) + " has " + std::to_string(n));
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(shrink_dim(*this, dim, off, off + s));
    off += s;
  }
  return out;
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const {
  if (chunks <= 0) fail("chunk", "chunks must be positive, got " + std::to_string(chunks));
  dim = norm_dim(dim, ndim(), "chunk");
  int64_t n = shape()[size_t(dim)];
  if (n == 0) return std::vector<Tensor>(size_t(chunks), *this);
  return split((n + chunks - 1) / chunks, dim);
}

Tensor Tensor::roll(const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) const {
  if (dims.empty()) {
    if (shifts.size() != 1) fail("roll", "without dims needs one shift, got " + ints_str(shifts));
    return flatten().roll(shifts, {0}).reshape(shape());
  }
  if (dims.size() != shifts.size())
    fail("roll", "shifts " + ints_str(shifts) + " and dims " + ints_str(dims) + " differ in length");
  if (numel() == 0) return *this;
  std::vector<int64_t> rep(size_t(ndim()), 1);
  auto r = full_range(*this);
  for (size_t i = 0; i < dims.size(); i++) {
    int64_t d = norm_dim(dims[i], ndim(), "roll"), n = shape()[size_t(d)];
    rep[size_t(d)] = 2;
    int64_t delta = n - floor_mod(shifts[i], n);
    r[size_t(d)] = {delta, delta + n};
  }
  return repeat(rep).shrink(r);
}

Tensor Tensor::unflatten(int64_t dim, const std::vector<int64_t>& sizes) const {
  dim = norm_dim(dim, ndim(), "unflatten");
  Shape s(shape().begin(), shape().begin() + dim);
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < sizes.size(); i++) {
    if (sizes[i] == -1) {
      if (infer >= 0) fail("unflatten", "only one -1 allowed in " + ints_str(sizes));
      infer = int64_t(i);
    } else {
      known *= sizes[i];
    }
  }
  std::vector<int64_t> sz = sizes;
  int64_t n = shape()[size_t(dim)];
  if (infer >= 0 && known != 0 && n % known == 0) sz[size_t(infer)] = n / known;
  int64_t prod = 1;
  for (int64_t v : sz) prod *= v;
  if (prod != n) fail("unflatten", "sizes " + ints_str(sizes) + " do not multiply to dim " + std::to_string(dim) +
                                       " of shape " + shape_str(shape()));
  s.insert(s.end(), sz.begin(), sz.end());
  s.insert(s.end(), shape().begin() + dim + 1, shape().end());
  return reshape(s);
}

Tensor Tensor::diagonal(int64_t offset, int64_t dim1, int64_t dim2) const {
  if (ndim() < 2) fail("diagonal", "needs at least 2 dims, got shape " + shape_str(shape()));
  dim1 = norm_dim(dim1, ndim(), "diagonal");
  dim2 = norm_dim(dim2, ndim(), "diagonal");
  if (dim1 == dim2) fail("diagonal", "dim1 and dim2 are both " + std::to_string(dim1));
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < ndim(); i++)
    if (i != dim1 && i != dim2) perm.push_back(i);
  perm.push_back(dim1);
  perm.push_back(dim2);
  Tensor x = permute(perm);
  int64_t nd = x.ndim(), r = x.shape()[size_t(nd - 2)], c = x.shape()[size_t(nd - 1)];
  if (offset >= 0) x = shrink_dim(x, nd - 1, std::min(offset, c), c);
  else x = shrink_dim(x, nd - 2, std::min(-offset, r), r);
  int64_t d = std::min(x.shape()[size_t(nd - 2)], x.shape()[size_t(nd - 1)]);
  Shape pre(x.shape().begin(), x.shape().end() - 2);
  if (d <= 0) {  // an empty diagonal
    Shape s = pre;
    s.push_back(0);
    return shrink_dim(shrink_dim(x, nd - 2, 0, 0), nd - 1, 0, 0).reshape(s);
  }
  x = shrink_dim(shrink_dim(x, nd - 2, 0, d), nd - 1, 0, d).flatten(nd - 2);  // (..., d*d)
  x = pad_dim(x, nd - 2, 0, d).unflatten(-1, {d, d + 1});                     // row i starts at the diagonal
  return shrink_dim(x, nd - 1, 0, 1).squeeze(-1);
}

// ---------------------------------------------------------------- gather, scatter

namespace {
void check_index_dtype(const Tensor& index, const char* op) {
  if (!dtypes::is_int(index.dtype())) fail(op, "index must be an integer tensor, got " + index.dtype().name());
}
}  // namespace

Tensor Tensor::gather(int64_t dim, const Tensor& index, CallLoc loc) const {
  CallSite site(loc);
  check_index_dtype(index, "gather");
  if (index.ndim() != ndim())
    fail("gather", "index " + shape_str(index.shape()) + " and input " + shape_str(shape()) + " differ in rank");
  dim = norm_dim(dim, ndim(), "gather");
  if (ndim() == 0) return *this;
  for (int64_t d = 0; d < ndim(); d++)
    if (d != dim && index.shape()[size_t(d)] > shape()[size_t(d)])
      fail("gather", "index " + shape_str(index.shape()) + " is larger than input " + shape_str(shape()) + " in dim " +
                         std::to_string(d));
  int64_t n = shape()[size_t(dim)];
  auto r = full_range(index);
  r[size_t(dim)] = {0, n};
  Tensor x = shrink(r).unsqueeze(-1).transpose(-1, dim);  // (index dims with dim -> 1, n)
  Tensor picked = one_hot_mask(index, n, "gather").where(x, const_like(*this, 0));
  return picked.sum(-1).cast(dtype());
}

Tensor Tensor::index_select(int64_t dim, const Tensor& index, CallLoc loc) const {
  CallSite site(loc);
  check_index_dtype(index, "index_select");
  if (index.ndim() > 1) fail("index_select", "index must be 0-d or 1-d, got shape " + shape_str(index.shape()));
  if (ndim() == 0) fail("index_select", "needs at least 1 dim");
  dim = norm_dim(dim, ndim(), "index_select");
  int64_t n = shape()[size_t(dim)];
  Tensor idx = index.reshape({-1});
  int64_t k = idx.shape()[0];
  Tensor wrapped = (idx < 0).where(idx + const_like(idx, double(n)), idx);
  Shape ms(size_t(ndim() + 1), 1);
  ms[size_t(dim)] = k;
  ms[size_t(dim + 1)] = n;
  Tensor mask = one_hot_mask(wrapped, n, "index_select").reshape(ms);
  return mask.where(unsqueeze(dim), const_like(*this, 0)).sum(dim + 1).cast(dtype());
}

namespace {
// src spread over `dim` of self: (src values, one-hot mask), both shaped self.shape + (index.shape[dim],).
std::pair<Tensor, Tensor> pre_scatter(const Tensor& self, int64_t& dim, const Tensor& index, const Tensor& src,
                                      const char* op) {
  check_index_dtype(index, op);
  if (index.ndim() != self.ndim() || src.ndim() != self.ndim())
    fail(op, "self " + shape_str(self.shape()) + ", index " + shape_str(index.shape()) + " and src " +
                 shape_str(src.shape()) + " must have the same rank");
  if (dtypes::strong(src.dtype()) != dtypes::strong(self.dtype()))
    fail(op, "src of dtype " + src.dtype().name() + " into self of dtype " + self.dtype().name() +
                 ": they must be the same dtype (as torch; cast src first)");
  dim = norm_dim(dim, self.ndim(), op);
  for (int64_t d = 0; d < self.ndim(); d++) {
    int64_t i = index.shape()[size_t(d)];
    if (i > src.shape()[size_t(d)] || (d != dim && i > self.shape()[size_t(d)]))
      fail(op, "index " + shape_str(index.shape()) + " must not be larger than src " + shape_str(src.shape()) +
                   ", nor than self " + shape_str(self.shape()) + " outside dim " + std::to_string(dim));
  }
  int64_t n = self.shape()[size_t(dim)];
  Tensor s = src.cast(self.dtype()).shrink(full_range(index));
  Shape es = s.shape();
  es.push_back(n);
  s = s.unsqueeze(-1).expand(es).transpose(-1, dim);
  Tensor mask = one_hot_mask(index, n, op).transpose(-1, dim);
  std::vector<std::pair<int64_t, int64_t>> p;
  for (int64_t d = 0; d < self.ndim(); d++) p.push_back({0, self.shape()[size_t(d)] - s.shape()[size_t(d)]});
  p.push_back({0, 0});
  return {s.pad(p), mask.pad(p)};
}
}  // namespace

Tensor Tensor::scatter(int64_t dim, const Tensor& index, const Tensor& src) const {
  auto [s, mask] = pre_scatter(*this, dim, index, src, "scatter");
  Tensor any = mask.any({-1});
  // a position several indices name takes the last one's value (as torch on the CPU), not their sum
  int64_t k = mask.shape().back();
  Tensor pos = arange_at(k, mask.ndim() - 1, mask.ndim(), device());
  Tensor last = mask.where(pos, Tensor::full({}, -1, dtypes::int32, device())).max(-1, true);
  Tensor sel = mask & (pos == last);
  Tensor vals = sel.where(s, const_like(*this, 0)).sum(-1).cast(dtype());
  return any.where(vals, *this);
}

Tensor Tensor::scatter(int64_t dim, const Tensor& index, double value) const {
  return scatter(dim, index, full(index.shape(), value, dtype(), device()));
}

Tensor Tensor::scatter_reduce(int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce,
                              bool include_self) const {
  if (reduce != "sum" && reduce != "prod" && reduce != "mean" && reduce != "amax" && reduce != "amin")
    fail("scatter_reduce", "reduce '" + reduce + "' is not one of 'sum', 'prod', 'mean', 'amax', 'amin'");
  auto [s, mask] = pre_scatter(*this, dim, index, src, "scatter_reduce");
  Tensor hit = mask.any({-1});
  auto self_or = [&](double v) { return include_self ? *this : hit.where(const_like(*this, v), *this); };
  if (reduce == "sum") return (mask.where(s, const_like(*this, 0)).sum(-1) + self_or(0)).cast(dtype());
  if (reduce == "prod") return (mask.where(s, const_like(*this, 1)).prod(-1) * self_or(1)).cast(dtype());
  if (reduce == "amax") {
    double lo = dtype_min(dtype());
    return mask.where(s, const_like(*this, lo)).max(-1).maximum(self_or(lo));
  }
  if (reduce == "amin") {
    double hi = dtype_max(dtype());
    return mask.where(s, const_like(*this, hi)).min(-1).minimum(self_or(hi));
  }
  Tensor count = mask.cast(dtypes::int64).sum(-1);
  if (include_self) count = count + 1;
  else count = hit.where(count, Tensor::full({}, 1, dtypes::int64, device()));
  Tensor total = mask.where(s, const_like(*this, 0)).sum(-1) + self_or(0);
  if (dtypes::is_float(dtype())) return total / count.cast(dtype());
  return total.idiv(count.cast(total.dtype())).cast(dtype());
}

Tensor Tensor::masked_fill(const Tensor& mask, const Tensor& value) const {
  if (!dtypes::is_bool(mask.dtype())) fail("masked_fill", "mask must be bool, got " + mask.dtype().name());
  if (value.ndim() != 0) fail("masked_fill", "value must be 0-d, got shape " + shape_str(value.shape()));
  Tensor r = mask.where(value.cast(dtype()), *this);
  if (r.shape() != shape())
    fail("masked_fill", "mask " + shape_str(mask.shape()) + " does not broadcast to " + shape_str(shape()));
  return r;
}

Tensor Tensor::masked_select(const Tensor& mask) const {
  if (!dtypes::is_bool(mask.dtype())) fail("masked_select", "mask must be bool, got " + mask.dtype().name());
  Shape s = broadcast_shape(shape(), mask.shape(), "masked_select");
  if (s.empty()) s = {1};
  Tensor x = (ndim() == 0 ? reshape({1}) : *this), m = (mask.ndim() == 0 ? mask.reshape({1}) : mask);
  while (x.ndim() < int(s.size())) x = x.unsqueeze(0);
  while (m.ndim() < int(s.size())) m = m.unsqueeze(0);
  x = x.expand(s).flatten();
  Tensor cs = m.expand(s).flatten().cast(dtypes::int32).cumsum(0);
  int64_t n = x.numel() == 0 ? 0 : cs.index({-1}).cast(dtypes::int64).item<int64_t>();  // the data-dependent output size
  // output k is the first position whose running count exceeds k: the number of positions with count <= k
  Tensor k = Tensor::arange(n).reshape({n, 1});
  Tensor idx = (cs.reshape({1, -1}) <= k).cast(dtypes::int32).sum(1).cast(dtypes::int32);
  return x.index_select(0, idx);
}

// ---------------------------------------------------------------- indexing

namespace detail {
SliceBounds slice_bounds(const Slice& s, int64_t n) {
  auto clampi = [&](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v < 0 ? v + n : v, lo), hi); };
  int64_t start, stop;
  if (s.step > 0) {
    start = s.start ? clampi(*s.start, 0, n) : 0;
    stop = s.stop ? clampi(*s.stop, 0, n) : n;
  } else {
    start = s.start ? clampi(*s.start, -1, n - 1) : n - 1;
    stop = s.stop ? clampi(*s.stop, -1, n - 1) : -1;
  }
  int64_t step = std::abs(s.step), lo, hi;
  if (s.step > 0) {
    lo = start;
    hi = std::max(start, stop);
  } else {
    lo = std::min(start, stop) + 1;
    hi = start + 1;
    if (stop >= start) lo = hi;
  }
  int64_t len = hi > lo ? (hi - lo + step - 1) / step : 0;
  if (s.step > 0) return {lo, lo + std::min(hi - lo, len * step), step, len};
  return {std::max(lo, hi - len * step), hi, step, len};
}
}  // namespace detail

namespace {

// An index list with the Ellipsis expanded and trailing full slices added; counts consumed dims.
std::vector<TensorIndex> expand_index(const std::vector<TensorIndex>& idx, int64_t ndim, const char* op) {
  int64_t consumed = 0, ell = 0;
  for (auto& i : idx) {
    if (i.kind == TensorIndex::Kind::Ellipsis) ell++;
    else if (i.kind != TensorIndex::Kind::NewAxis) consumed++;
    if (i.kind == TensorIndex::Kind::Tensor && dtypes::is_bool(i.t.dtype()))
      fail(op, "bool mask indices are not supported; use where or masked_fill");
    if (i.kind == TensorIndex::Kind::Tensor && !dtypes::is_int(i.t.dtype()))
      fail(op, "index tensors must be integer, got " + i.t.dtype().name());
  }
  if (ell > 1) fail(op, "at most one Ellipsis");
  if (consumed > ndim) fail(op, std::to_string(consumed) + " indices for a tensor with " + std::to_string(ndim) + " dims");
  std::vector<TensorIndex> out;
  for (auto& i : idx) {
    if (i.kind == TensorIndex::Kind::Ellipsis) {
      for (int64_t k = 0; k < ndim - consumed; k++) out.push_back(Slice::all());
    } else {
      out.push_back(i);
    }
  }
  if (!ell)
    for (int64_t k = consumed; k < ndim; k++) out.push_back(Slice::all());
  return out;
}

// The basic part of an index: every consumed dim as a Slice (ints as one-element slices, tensors as all), ints
// checked against the dim size.
struct BasicIndex {
  std::vector<Slice> slices;
  std::vector<bool> collapse;       // per consumed dim: an int (collapsed in getitem)
  std::vector<int64_t> tensor_dim;  // per consumed dim: -1, or which tensor index
};
BasicIndex basic_of(const std::vector<TensorIndex>& ex, const Shape& shape, const char* op) {
  BasicIndex b;
  size_t d = 0;
  for (auto& i : ex) {
    if (i.kind == TensorIndex::Kind::NewAxis) continue;
    int64_t n = shape[d];
    if (i.kind == TensorIndex::Kind::Int) {
      if (i.i < -n || i.i >= n)
        fail(op, "index " + std::to_string(i.i) + " is out of range for dim " + std::to_string(d) + " of size " +
                     std::to_string(n));
      b.slices.push_back(Slice::index(i.i < 0 ? i.i + n : i.i));
      b.collapse.push_back(true);
    } else if (i.kind == TensorIndex::Kind::Slice) {
      if (i.s.step == 0) fail(op, "slice step must not be 0");
      b.slices.push_back(i.s);
      b.collapse.push_back(false);
    } else {
      b.slices.push_back(Slice::all());
      b.collapse.push_back(false);
    }
    d++;
  }
  return b;
}

// Advanced indexing on x (basic indexing already applied, nothing collapsed): the tensors at dims `dims` select
// positions. Returns the mask (x.shape[:d0] + big + x.shape[d0:], bool), big's rank, and whether torch moves
// the broadcast dims to the front (non-adjacent index dims).
struct AdvMask {
  Tensor mask;
  int64_t nbig;
  bool to_front;
  Shape big;
};
AdvMask adv_mask(const Tensor& x, const std::vector<int64_t>& dims, const std::vector<Tensor>& tensors, const char* op) {
  Shape big;
  for (auto& t : tensors) big = Tensor::broadcast_shape(big, t.shape(), op);
  int64_t d0 = dims[0], nbig = int64_t(big.size());
  Shape pre(x.shape().begin(), x.shape().begin() + d0);
  pre.insert(pre.end(), big.begin(), big.end());
  pre.insert(pre.end(), x.shape().begin() + d0, x.shape().end());
  Tensor mask;
  for (size_t k = 0; k < dims.size(); k++) {
    int64_t n = x.shape()[size_t(dims[k])];
    Tensor t = tensors[k];
    t = (t < 0).where(t + const_like(t, double(n)), t);
    Shape ts = t.shape();
    ts.insert(ts.end(), size_t(x.ndim() - d0), 1);
    Tensor e = t.reshape(ts).expand(pre);
    int64_t pos = dims[k] + nbig;
    Tensor m = mark_index_check(e.eq(arange_at(n, pos, int64_t(pre.size()), x.device(), dtypes::strong(t.dtype()))), op);
    if (k == 0) mask = m;
    else mask = mask & m;
  }
  bool adjacent = true;
  for (size_t k = 1; k < dims.size(); k++) adjacent &= dims[k] == dims[k - 1] + 1;
  return {mask, nbig, d0 != 0 && !adjacent, big};
}
}  // namespace

namespace {
// Basic indexing applied (ints collapsed like torch's select, NewAxis inserted), and the tensor indices left.
struct Prepared {
  BasicIndex b;
  Shape sliced;  // shape after the slices, before collapsing ints and inserting NewAxis
  Tensor x;
  std::vector<int64_t> dims;  // positions of the tensor indices in x
  std::vector<Tensor> tensors;
};
Prepared prepare(const Tensor& self, const std::vector<TensorIndex>& idx, const char* op) {
  auto ex = expand_index(idx, self.ndim(), op);
  Prepared p;
  p.b = basic_of(ex, self.shape(), op);
  Tensor x = self.slice(p.b.slices);
  p.sliced = x.shape();
  Shape s;
  size_t d = 0;
  for (auto& i : ex) {
    if (i.kind == TensorIndex::Kind::NewAxis) {
      s.push_back(1);
      continue;
    }
    if (i.kind == TensorIndex::Kind::Tensor) {
      p.dims.push_back(int64_t(s.size()));
      p.tensors.push_back(i.t);
    }
    if (!p.b.collapse[d]) s.push_back(x.shape()[d]);
    d++;
  }
  p.x = x.reshape(s);
  return p;
}
}  // namespace

Tensor Tensor::operator[](const TensorIndex& i) const { return index({i}); }
Tensor Tensor::operator[](std::initializer_list<TensorIndex> idx) const { return index(std::vector<TensorIndex>(idx)); }

Tensor Tensor::index(const std::vector<TensorIndex>& idx, CallLoc loc) const {
  CallSite site(loc);
  Prepared p = prepare(*this, idx, "index");
  const Tensor& x = p.x;
  if (p.tensors.empty()) return x;
  AdvMask am = adv_mask(x, p.dims, p.tensors, "index");
  int64_t d0 = p.dims[0];
  Shape xr(x.shape().begin(), x.shape().begin() + d0);
  xr.insert(xr.end(), size_t(am.nbig), 1);
  xr.insert(xr.end(), x.shape().begin() + d0, x.shape().end());
  std::vector<int64_t> sum_axes;
  for (int64_t dd : p.dims) sum_axes.push_back(dd + am.nbig);
  Tensor r = am.mask.where(x.reshape(xr), const_like(x, 0)).sum(sum_axes).cast(x.dtype());
  if (am.to_front) {
    std::vector<int64_t> perm;
    for (int64_t i = 0; i < am.nbig; i++) perm.push_back(d0 + i);
    for (int64_t i = 0; i < d0; i++) perm.push_back(i);
    for (int64_t i = d0 + am.nbig; i < r.ndim(); i++) perm.push_back(i);
    r = r.permute(perm);
  }
  return r;
}

Tensor Tensor::set_slice(const std::vector<Slice>& sl, const Tensor& value) const {
  if (int64_t(sl.size()) > ndim())
    fail("set_slice", std::to_string(sl.size()) + " slices for shape " + shape_str(shape()));
  for (auto& s : sl)
    if (s.step == 0) fail("set_slice", "slice step must not be 0");
  std::vector<Slice> all = sl;
  all.resize(size_t(ndim()), Slice::all());
  Shape target;
  std::vector<detail::SliceBounds> bounds;
  for (int64_t d = 0; d < ndim(); d++) {
    bounds.push_back(detail::slice_bounds(all[size_t(d)], shape()[size_t(d)]));
    target.push_back(bounds.back().len);
  }
  Shape bs = broadcast_shape(value.shape(), target, "set_slice");
  if (bs != target)
    fail("set_slice", "value " + shape_str(value.shape()) + " does not broadcast to the slice " + shape_str(target));
  Tensor vb = value.cast(dtype()).expand(target);
  if (ndim() == 0) return vb;
  Tensor mask;
  std::vector<int64_t> flips;
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (int64_t d = 0; d < ndim(); d++) {
    auto [lo, hi, step, len] = bounds[size_t(d)];
    bool neg = all[size_t(d)].step < 0;
    if (step != 1 && len > 1) {  // un-stride: each value followed by step-1 zeros
      vb = pad_dim(vb.unsqueeze(d + 1), d + 1, 0, step - 1).flatten(d, d + 1);
      vb = shrink_dim(vb, d, 0, hi - lo);
    } else if (step != 1) {
      vb = pad_dim(vb, d, 0, (hi - lo) - len);
    }
    if (neg) flips.push_back(d);
    pads.push_back({lo, shape()[size_t(d)] - hi});
    int64_t n = shape()[size_t(d)];
    std::vector<bool> m(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) m[size_t(i)] = i >= lo && i < hi && ((neg ? hi - 1 - i : i - lo) % step == 0);
    Shape ms(size_t(ndim()), 1);
    ms[size_t(d)] = n;
    Tensor md = Tensor::from_vector(m, {n}, device()).reshape(ms);
    mask = d == 0 ? md : (mask & md);
  }
  vb = vb.flip(flips).pad(pads);
  return mask.where(vb, *this);
}

Tensor Tensor::index_put(const std::vector<TensorIndex>& idx, const Tensor& value) const {
  Prepared p = prepare(*this, idx, "index_put");
  Shape res = index(idx).shape();  // what getitem returns: value broadcasts to it
  Tensor v = value.cast(dtype());
  Shape bs = broadcast_shape(v.shape(), res, "index_put");
  if (bs != res) fail("index_put", "value " + shape_str(value.shape()) + " does not broadcast to " + shape_str(res));
  v = v.expand(res);
  if (p.tensors.empty()) return set_slice(p.b.slices, v.reshape(p.sliced));
  const Tensor& x = p.x;
  AdvMask am = adv_mask(x, p.dims, p.tensors, "index_put");
  int64_t d0 = p.dims[0];
  if (am.to_front) {  // value is (big, x dims without index dims): move big to d0
    std::vector<int64_t> perm;
    for (int64_t i = 0; i < d0; i++) perm.push_back(am.nbig + i);
    for (int64_t i = 0; i < am.nbig; i++) perm.push_back(i);
    for (int64_t i = d0 + am.nbig; i < v.ndim(); i++) perm.push_back(i);
    v = v.permute(perm);
  }
  for (int64_t dd : p.dims) v = v.unsqueeze(dd + am.nbig);  // index dims back as size 1
  std::vector<int64_t> big_axes;
  for (int64_t i = 0; i < am.nbig; i++) big_axes.push_back(d0 + i);
  // summing over big leaves x's shape; where several indices hit one element their values add
  Tensor vals = am.mask.where(v, const_like(x, 0)).sum(big_axes).cast(dtype());
  Tensor merged = am.mask.any(big_axes).where(vals, x);
  return set_slice(p.b.slices, merged.reshape(p.sliced));
}

// ---------------------------------------------------------------- pad modes, one_hot, meshgrid

Tensor Tensor::pad(const std::vector<std::pair<int64_t, int64_t>>& p, const std::string& mode, double value) const {
  if (int64_t(p.size()) != ndim())
    fail("pad", std::to_string(p.size()) + " pairs for shape " + shape_str(shape()) + " (one per dim)");
  if (mode == "constant") return pad(p, value);
  if (mode != "reflect" && mode != "replicate" && mode != "circular")
    fail("pad", "mode '" + mode + "' is not one of 'constant', 'reflect', 'replicate', 'circular'");
  Tensor x = *this;
  if (mode == "circular") {
    // shrink for negative pads first, then wrap the rest around once
    std::vector<std::pair<int64_t, int64_t>> sh, pp;
    for (size_t d = 0; d < p.size(); d++) {
      int64_t n = shape()[d];
      sh.push_back({std::max<int64_t>(0, -p[d].first), n - std::max<int64_t>(0, -p[d].second)});
      pp.push_back({std::max<int64_t>(0, p[d].first), std::max<int64_t>(0, p[d].second)});
    }
    x = x.shrink(sh);
    for (size_t d = 0; d < p.size(); d++) {
      int64_t n = x.shape()[d];
      if (pp[d].first > n || pp[d].second > n)
        fail("pad", "circular padding " + std::to_string(pp[d].first) + ", " + std::to_string(pp[d].second) +
                        " wraps more than once around dim " + std::to_string(d) + " of size " + std::to_string(n));
      if (pp[d].first == 0 && pp[d].second == 0) continue;
      std::vector<Tensor> parts;
      if (pp[d].first) parts.push_back(shrink_dim(x, int64_t(d), n - pp[d].first, n));
      parts.push_back(x);
      if (pp[d].second) parts.push_back(shrink_dim(x, int64_t(d), 0, pp[d].second));
      x = cat(parts, int64_t(d));
    }
    return x;
  }
  for (size_t d = 0; d < p.size(); d++) {
    int64_t b = std::max<int64_t>(0, p[d].first), a = std::max<int64_t>(0, p[d].second), n = x.shape()[d];
    if (b == 0 && a == 0) continue;
    std::vector<Tensor> parts;
    if (mode == "reflect") {
      if (b >= n || a >= n)
        fail("pad", "reflect padding " + std::to_string(b) + ", " + std::to_string(a) + " must be less than dim " +
                        std::to_string(d) + " of size " + std::to_string(n));
      if (b) parts.push_back(shrink_dim(x, int64_t(d), 1, b + 1).flip({int64_t(d)}));
      parts.push_back(x);
      if (a) parts.push_back(shrink_dim(x, int64_t(d), n - 1 - a, n - 1).flip({int64_t(d)}));
    } else {
      if (n == 0) fail("pad", "replicate padding of an empty dim " + std::to_string(d));
      Shape eb = x.shape(), ea = x.shape();
      eb[d] = b;
      ea[d] = a;
      if (b) parts.push_back(shrink_dim(x, int64_t(d), 0, 1).expand(eb));
      parts.push_back(x);
      if (a) parts.push_back(shrink_dim(x, int64_t(d), n - 1, n).expand(ea));
    }
    x = cat(parts, int64_t(d));
  }
  std::vector<std::pair<int64_t, int64_t>> sh;  // negative pads shrink after reflecting / replicating
  for (size_t d = 0; d < p.size(); d++)
    sh.push_back({std::max<int64_t>(0, -p[d].first), x.shape()[d] - std::max<int64_t>(0, -p[d].second)});
  return x.shrink(sh);
}

Tensor Tensor::one_hot(int64_t num_classes, CallLoc loc) const {
  CallSite site(loc);
  if (!dtypes::is_int(dtype())) fail("one_hot", "needs an integer tensor, got " + dtype().name());
  if (num_classes < 0) fail("one_hot", "num_classes must be given and non-negative, got " + std::to_string(num_classes));
  return one_hot_mask(*this, num_classes).cast(dtypes::int64);
}

std::vector<Tensor> meshgrid(const std::vector<Tensor>& ts, const std::string& indexing) {
  if (indexing != "ij" && indexing != "xy") fail("meshgrid", "indexing must be 'ij' or 'xy', got '" + indexing + "'");
  for (auto& t : ts)
    if (t.ndim() > 1) fail("meshgrid", "needs 0-d or 1-d tensors, got shape " + shape_str(t.shape()));
  size_t n = ts.size();
  Shape out;
  for (auto& t : ts) out.push_back(t.numel());
  if (indexing == "xy" && n >= 2) std::swap(out[0], out[1]);
  std::vector<Tensor> r;
  for (size_t i = 0; i < n; i++) {
    size_t pos = (indexing == "xy" && n >= 2 && i < 2) ? 1 - i : i;
    Shape s(n, 1);
    s[pos] = ts[i].numel();
    r.push_back(ts[i].reshape(s).expand(out));
  }
  return r;
}

// ---------------------------------------------------------------- the rest of tinygrad's movement API

Tensor Tensor::view(Shape s) const { return reshape(std::move(s)); }

Tensor Tensor::pad_to(const Shape& s, double value) const {
  if (s.size() != size_t(ndim())) fail("pad_to", "shape " + ints_str(s) + " has " + std::to_string(s.size()) + " dims, the tensor " + shape_str(shape()));
  std::vector<std::pair<int64_t, int64_t>> p;
  for (size_t i = 0; i < s.size(); i++) {
    int64_t have = shape()[i], want = s[i] == -1 ? have : s[i];
    if (want < have) fail("pad_to", "cannot pad " + shape_str(shape()) + " down to " + ints_str(s) + " (use shrink_to)");
    p.push_back({0, want - have});
  }
  return pad(p, value);
}

Tensor Tensor::shrink_to(const Shape& s) const {
  if (s.size() != size_t(ndim())) fail("shrink_to", "shape " + ints_str(s) + " has " + std::to_string(s.size()) + " dims, the tensor " + shape_str(shape()));
  std::vector<std::pair<int64_t, int64_t>> r;
  for (size_t i = 0; i < s.size(); i++) {
    int64_t have = shape()[i], want = s[i] == -1 ? have : s[i];
    if (want < 0 || want > have) fail("shrink_to", "cannot shrink " + shape_str(shape()) + " to " + ints_str(s));
    r.push_back({0, want});
  }
  return shrink(r);
}

Tensor Tensor::diag() const {
  if (ndim() == 2) return diagonal(0, 0, 1);
  if (ndim() != 1) fail("diag", "needs a 1-D or 2-D tensor, got shape " + shape_str(shape()));
  // v on the diagonal: each element followed by n zeros, cut to n*n and folded into rows (tinygrad's)
  int64_t n = shape()[0];
  return unsqueeze(-1).pad_to({-1, n + 1}).flatten().shrink_to({n * n}).reshape({n, n});
}

Tensor Tensor::unfold(int64_t dim, int64_t size, int64_t step) const {
  int64_t nd = std::max<int64_t>(ndim(), 1);
  dim = norm_dim(dim, nd, "unfold");
  Tensor x = ndim() == 0 ? reshape({1}) : *this;
  int64_t n = x.shape()[size_t(dim)];
  if (size < 0 || step <= 0 || size > n)
    fail("unfold", "size " + std::to_string(size) + " must be in [0, " + std::to_string(n) + "] (dim " + std::to_string(dim) +
                       " of " + shape_str(shape()) + ") and step " + std::to_string(step) + " positive");
  int64_t wins = (n - size) / step + 1;
  std::vector<int64_t> to_last;
  for (int64_t i = 0; i < nd; i++)
    if (i != dim) to_last.push_back(i);
  to_last.push_back(dim);
  Tensor w;
  if (size == 0) {  // empty windows: (..., wins, 0)
    Shape s = x.permute(to_last).shape();
    s.back() = wins;
    s.push_back(0);
    w = Tensor::zeros(s, dtype(), device());
  } else {
    w = pool_windows(x.permute(to_last), {size}, {step}, {1}, "unfold");  // (..., wins, size)
  }
  std::vector<int64_t> back;  // the window count back at dim, the window itself last
  for (int64_t j = 0; j < nd; j++) back.push_back(j < dim ? j : j == dim ? nd - 1 : j - 1);
  back.push_back(nd);
  Tensor r = w.permute(back);
  return ndim() == 0 ? r.reshape({size}) : r;
}

namespace {
// One side of a rearrange formula: axis names, and the (begin, end) name positions of each parenthesised group
// ("1" is an empty group: a dim of size 1).
struct Side {
  std::vector<std::string> names;
  std::vector<std::pair<int64_t, int64_t>> groups;
};
Side parse_side(const std::string& text, const std::string& formula) {
  Side s;
  std::string t;
  for (char c : text) {
    if (c == '(' || c == ')') t += std::string(" ") + c + " ";
    else t += c;
  }
  std::istringstream in(t);
  std::string tok;
  int64_t open = -1;
  while (in >> tok) {
    if (tok == "(") {
      if (open >= 0) fail("rearrange", "nested brackets in \"" + formula + "\"");
      open = int64_t(s.names.size());
    } else if (tok == ")") {
      if (open < 0) fail("rearrange", "bracket mismatch in \"" + formula + "\"");
      s.groups.push_back({open, int64_t(s.names.size())});
      open = -1;
    } else if (tok == "1") {
      s.groups.push_back({int64_t(s.names.size()), int64_t(s.names.size())});
    } else {
      bool ok = tok == "..." || (!tok.empty() && (std::isalpha(uint8_t(tok[0])) || tok[0] == '_'));
      for (char c : tok) ok &= tok == "..." || std::isalnum(uint8_t(c)) || c == '_';
      if (!ok) fail("rearrange", "invalid axis name \"" + tok + "\" in \"" + formula + "\"");
      s.names.push_back(tok);
    }
  }
  if (open >= 0) fail("rearrange", "bracket mismatch in \"" + formula + "\"");
  return s;
}
// Replace "..." with n names, shifting the groups after it.
void expand_ellipsis(Side& s, int64_t n) {
  auto it = std::find(s.names.begin(), s.names.end(), "...");
  if (it == s.names.end()) return;
  int64_t at = int64_t(it - s.names.begin());
  s.names.erase(it);
  for (int64_t j = 0; j < n; j++) s.names.insert(s.names.begin() + at + j, "..." + std::to_string(j));
  for (auto& [b, e] : s.groups) {
    if (b > at) b += n - 1;
    if (e > at) e += n - 1;
  }
}
}  // namespace

Tensor Tensor::rearrange(const std::string& formula, const std::vector<std::pair<std::string, int64_t>>& sizes) const {
  size_t arrow = formula.find("->");
  if (arrow == std::string::npos || formula.find("->", arrow + 2) != std::string::npos)
    fail("rearrange", "needs exactly one \"->\" in \"" + formula + "\"");
  Side lhs = parse_side(formula.substr(0, arrow), formula), rhs = parse_side(formula.substr(arrow + 2), formula);
  auto sorted = [](std::vector<std::string> v) { std::sort(v.begin(), v.end()); return v; };
  std::vector<std::string> ls = sorted(lhs.names);
  if (ls != sorted(rhs.names) || std::adjacent_find(ls.begin(), ls.end()) != ls.end())
    fail("rearrange", "the two sides of \"" + formula + "\" must name the same axes, each once");
  for (auto& [name, v] : sizes)
    if (std::find(lhs.names.begin(), lhs.names.end(), name) == lhs.names.end())
      fail("rearrange", "axis " + name + " is not used in \"" + formula + "\"");
  for (auto& [b, e] : lhs.groups)
    for (int64_t i = b; i < e; i++)
      if (lhs.names[size_t(i)] == "...") fail("rearrange", "\"...\" inside brackets on the left of \"" + formula + "\"");
  int64_t in_dims = int64_t(lhs.names.size());
  for (auto& [b, e] : lhs.groups) in_dims -= e - b - 1;
  bool ell = std::find(lhs.names.begin(), lhs.names.end(), "...") != lhs.names.end();
  int64_t ell_len = ell ? ndim() - in_dims + 1 : 0;
  if (ell ? ell_len < 0 : in_dims != ndim())
    fail("rearrange", "\"" + formula + "\" does not fit a tensor of shape " + shape_str(shape()));
  expand_ellipsis(lhs, ell_len);
  expand_ellipsis(rhs, ell_len);
  auto size_of = [&](const std::string& n) -> int64_t {
    for (auto& [name, v] : sizes)
      if (name == n) return v;
    return -1;
  };
  Tensor t = *this;
  for (auto& [b, e] : lhs.groups) {  // unflatten: a group's dim becomes one dim per name
    std::vector<int64_t> sz;
    for (int64_t i = b; i < e; i++) sz.push_back(size_of(lhs.names[size_t(i)]));
    if (sz.empty()) {
      if (t.shape()[size_t(b)] != 1) fail("rearrange", "\"1\" in \"" + formula + "\" names dim " + std::to_string(b) + " of size " + std::to_string(t.shape()[size_t(b)]));
      t = t.squeeze(b);
    } else {
      t = t.unflatten(b, sz);
    }
  }
  for (size_t i = 0; i < lhs.names.size(); i++) {
    int64_t want = size_of(lhs.names[i]);
    if (want != -1 && want != t.shape()[i])
      fail("rearrange", "size " + std::to_string(want) + " given for axis " + lhs.names[i] + " is not its size " + std::to_string(t.shape()[i]));
  }
  std::vector<int64_t> order;
  for (const auto& n : rhs.names) order.push_back(int64_t(std::find(lhs.names.begin(), lhs.names.end(), n) - lhs.names.begin()));
  t = t.permute(order);
  for (auto it = rhs.groups.rbegin(); it != rhs.groups.rend(); ++it)  // flatten each group (from the right)
    t = it->first < it->second ? t.flatten(it->first, it->second - 1) : t.unsqueeze(it->first);
  return t;
}

Tensor Tensor::nonzero(std::optional<int64_t> size, int64_t fill_value) const {
  if (size && *size < 0) fail("nonzero", "size must be non-negative, got " + std::to_string(*size));
  int64_t total = numel(), nd = ndim();
  auto i64 = [&](double v) { return Tensor::full({}, v, dtypes::int64, device()); };
  if (total == 0) return Tensor::full({size.value_or(0), nd}, double(fill_value), dtypes::int64, device());
  Tensor cs = flatten().cast(dtypes::bool_).cast(dtypes::int32).cumsum(0);
  Tensor count = cs.index({-1}).cast(dtypes::int64);
  int64_t n = size ? *size : count.item<int64_t>();  // the data-dependent row count: one sync
  // row k is the first flat position whose running count exceeds k: the number of positions with count <= k
  Tensor k = Tensor::arange(0, double(n), 1, dtypes::int32, device()).reshape({n, 1});
  Tensor flat = (cs.reshape({1, -1}) <= k).cast(dtypes::int64).sum(1);
  std::vector<Tensor> cols;
  int64_t stride = total;
  for (int64_t d : shape()) {
    stride /= d;
    cols.push_back(flat.idiv(i64(double(stride))).mod(i64(double(d))));
  }
  Tensor r = nd == 0 ? Tensor::zeros({n, 0}, dtypes::int64, device()) : stack(cols, 1);
  if (!size) return r;
  return (k.cast(dtypes::int64) < count).where(r, i64(double(fill_value)));
}

Tensor Tensor::scatter(int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce) const {
  if (reduce == "add") return scatter_reduce(dim, index, src, "sum", true);
  if (reduce == "multiply") return scatter_reduce(dim, index, src, "prod", true);
  fail("scatter", "reduce must be \"add\" or \"multiply\", got \"" + reduce + "\"");
}

Tensor Tensor::sequential(const std::vector<std::function<Tensor(const Tensor&)>>& fs) const {
  Tensor x = *this;
  for (const auto& f : fs) x = f(x);
  return x;
}

}  // namespace tg
