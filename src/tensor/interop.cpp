// The rest of tinygrad's Tensor names: host views of the values (tolist, numpy), parameter placeholders and calls
// of a function body (is_param_, as_param, call), and the IMAGE-path formulations of dot and conv2d.
#include <algorithm>
#include <cstring>
#include <functional>

#include "ops_util.hpp"
#include "tg/tensor.hpp"

namespace tg {

// ---------------------------------------------------------------- host views

NestedList Tensor::tolist(CallLoc loc) const {
  CallSite site(loc);
  // half-width floats read as float32 (tinygrad casts them too); the leaf kind follows the dtype
  // (a weak Python-like scalar reads as its strong dtype)
  DType sd = dtypes::strong(dtype());
  Tensor t = dtypes::is_float(sd) && sd.itemsize() < 4 ? cast(dtypes::float32) : sd != dtype() ? cast(sd) : *this;
  std::vector<uint8_t> b = t.data();
  DType d = dtypes::strong(t.dtype());
  size_t isz = size_t(d.itemsize());
  auto leaf = [&](size_t i) {
    NestedList l;
    const uint8_t* p = b.data() + i * isz;
    auto rd = [&](auto v) {
      std::memcpy(&v, p, sizeof v);
      return v;
    };
    if (d == dtypes::bool_) l.value = p[0] != 0;
    else if (d == dtypes::float32) l.value = double(rd(float{}));
    else if (d == dtypes::float64) l.value = rd(double{});
    else if (d == dtypes::int8) l.value = int64_t(rd(int8_t{}));
    else if (d == dtypes::uint8) l.value = int64_t(rd(uint8_t{}));
    else if (d == dtypes::int16) l.value = int64_t(rd(int16_t{}));
    else if (d == dtypes::uint16) l.value = int64_t(rd(uint16_t{}));
    else if (d == dtypes::int32) l.value = int64_t(rd(int32_t{}));
    else if (d == dtypes::uint32) l.value = int64_t(rd(uint32_t{}));
    else if (d == dtypes::int64) l.value = rd(int64_t{});
    else if (d == dtypes::uint64) l.value = rd(uint64_t{});
    else throw Error("[tolist] dtype " + d.name() + " has no host value type");
    return l;
  };
  // one list level per dim (the recursion is as deep as the tensor has dims); a dim of size 0 gives empty lists
  const Shape s = t.shape();
  size_t pos = 0;
  std::function<NestedList(size_t)> build = [&](size_t di) {
    if (di == s.size()) return leaf(pos++);
    NestedList l;
    l.is_list = true;
    for (int64_t j = 0; j < s[di]; j++) l.items.push_back(build(di + 1));
    return l;
  };
  return build(0);
}

HostArray Tensor::numpy(CallLoc loc) const {
  CallSite site(loc);
  HostArray a;
  a.dtype = dtypes::strong(dtype());
  Tensor t = a.dtype != dtype() ? cast(a.dtype) : *this;  // a weak scalar reads as its strong dtype
  a.shape = shape();
  a.strides.assign(a.shape.size(), 0);
  int64_t st = a.dtype.itemsize();
  for (size_t i = a.shape.size(); i-- > 0;) {
    a.strides[i] = st;
    st *= a.shape[i];
  }
  a.bytes = t.data();
  return a;
}

// ---------------------------------------------------------------- parameters and calls

Tensor& Tensor::is_param_(bool v) {
  im().is_param = v;
  return *this;
}
bool Tensor::is_param() const { return im().is_param; }

Tensor Tensor::as_param(int64_t slot) const {
  if (slot < 0) throw Error("[as_param] slot " + std::to_string(slot) + " is negative");
  // PARAM(slot) viewed at this shape: the same form as a buffer's view, which call() replaces whole
  detail::params_made++;
  UOpRef p = UOp::make(Ops::PARAM, dtypes::strong(dtype()), {}, slot);
  return Tensor(UOp::make(Ops::RESHAPE, p->dtype, {p}, std::vector<int64_t>(max_shape())), max_shape(), device());
}

Tensor Tensor::call(const std::vector<Tensor>& args, const Tensor& fxn) const {
  std::vector<const Tensor*> all = {this};
  for (const Tensor& a : args) all.push_back(&a);
  UOpRef body = substitute(fxn.uop(), [&](const UOp* u) -> UOpRef {
    if (u->op != Ops::RESHAPE || u->src(0)->op != Ops::PARAM) return {};
    int64_t slot = std::get<int64_t>(u->src(0)->arg);
    const auto& shape = std::get<std::vector<int64_t>>(u->arg);
    if (slot >= int64_t(all.size()))
      throw Error("[call] the body uses parameter " + std::to_string(slot) + ", " + std::to_string(all.size()) + " tensors were given");
    const Tensor& a = *all[size_t(slot)];
    if (dtypes::strong(a.dtype()) != u->dtype || a.max_shape() != Shape(shape))
      throw Error("[call] parameter " + std::to_string(slot) + " is " + u->dtype.name() + " " + shape_str(Shape(shape)) + ", the argument is " +
                  a.dtype().name() + " " + shape_str(a.shape()));
    return a.uop();
  });
  return Tensor(body, fxn.max_shape(), fxn.device());
}

// ---------------------------------------------------------------- IMAGE formulations

Tensor Tensor::image_conv2d(const Tensor& weight, const std::optional<Tensor>& bias, int64_t groups, IntArg stride, IntArg dilation,
                            ConvPadding padding, std::optional<DType> dtype) const {
  if (ndim() != 4 || weight.ndim() != 4 || groups < 1 || weight.shape()[0] % groups != 0 || shape()[1] != weight.shape()[1] * groups)
    throw Error("[image_conv2d] input (N, C, H, W) and weight (out, C / groups, kh, kw) with groups dividing out expected, got " +
                shape_str(shape()) + " and " + shape_str(weight.shape()) + " with groups " + std::to_string(groups));
  int64_t bs = shape()[0], iy = shape()[2], ix = shape()[3];
  int64_t cout = weight.shape()[0], cin = weight.shape()[1], H = weight.shape()[2], W = weight.shape()[3], rcout = cout / groups;
  Tensor x = *this, w = weight.reshape({groups, rcout, cin, H, W});
  // channels in groups of 4 (an image pixel holds 4): pad cin and each group's output channels with zeros
  if (cin % 4 != 0 && !(cin == 1 && groups % 4 == 0)) {
    int64_t c4 = (cin + 3) / 4 * 4;
    w = w.pad({{0, 0}, {0, 0}, {0, c4 - cin}, {0, 0}, {0, 0}});
    x = x.reshape({bs, groups, cin, iy, ix}).pad({{0, 0}, {0, 0}, {0, c4 - cin}, {0, 0}, {0, 0}}).reshape({bs, groups * c4, iy, ix});
    cin = c4;
  }
  int64_t r4 = rcout;
  if (rcout % 4 != 0 && !(rcout == 1 && groups % 4 == 0)) {
    r4 = (rcout + 3) / 4 * 4;
    w = w.pad({{0, 0}, {0, r4 - rcout}, {0, 0}, {0, 0}, {0, 0}});
  }
  Tensor y = x.conv2d(w.reshape({groups * r4, cin, H, W}), std::nullopt, stride, padding, dilation, groups);
  Shape ys = y.shape();
  y = y.reshape({bs, groups, r4, ys[2], ys[3]}).shrink({{0, bs}, {0, groups}, {0, rcout}, {0, ys[2]}, {0, ys[3]}}).reshape({bs, cout, ys[2], ys[3]});
  if (bias) y = y + bias->reshape({1, cout, 1, 1});
  return dtype ? y.cast(*dtype) : y;
}

Tensor Tensor::image_dot(const Tensor& w, std::optional<DType> dtype) const {
  if (ndim() < 1 || w.ndim() < 2 || shape().back() != w.shape()[size_t(w.ndim() - 2)])
    throw Error("[image_dot] cannot multiply " + shape_str(shape()) + " by " + shape_str(w.shape()) + " (the weight needs 2+ dims, (..., k, n))");
  if (ndim() == 1) return unsqueeze(0).image_dot(w, dtype).squeeze(-2);
  Shape xs = shape(), ws = w.shape();
  int64_t bs = 1, groups = 1, m = xs[xs.size() - 2], cin = ws[ws.size() - 2], cout = ws.back();
  for (size_t i = 0; i + 2 < xs.size(); i++) bs *= xs[i];
  for (size_t i = 0; i + 2 < ws.size(); i++) groups *= ws[i];
  if (groups != 1 && !std::equal(xs.begin(), xs.end() - 2, ws.begin(), ws.end() - 2))
    throw Error("[image_dot] batched weights " + shape_str(ws) + " need the input's batch dims, got " + shape_str(xs));
  // mxk @ kxn as a 1x1 conv: (bs/groups, groups*k, m, 1) conv (groups*n, k, 1, 1)
  Tensor cx = transpose(-1, -2).reshape({bs / groups, groups * cin, m, 1});
  Tensor cw = w.transpose(-1, -2).reshape({groups * cout, cin, 1, 1});
  Shape out(xs.begin(), xs.end() - 2);
  out.push_back(cout);
  out.push_back(m);
  return cx.image_conv2d(cw, std::nullopt, groups, 1, 1, 0, dtype).reshape(out).transpose(-1, -2);
}

}  // namespace tg
