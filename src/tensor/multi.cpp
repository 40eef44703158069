// Multi-device tensors in the front end: shard, shard_, shard_like, to() between layouts, and the hooks realize,
// assign and host reads call (include/tg/multi.hpp says how the graph holds them; src/schedule/multi.cpp lowers it).
#include "tg/multi.hpp"

#include <algorithm>

#include "tg/device.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

namespace tg::sched {
std::optional<int> multi_axis(const UOpRef& u);  // src/schedule/multi.cpp
}

namespace tg {

std::vector<std::string> split_devices(const std::string& device) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t c = device.find(',', start);
    out.push_back(device.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}

std::string join_devices(const std::vector<std::string>& devices) {
  std::string s;
  for (auto& d : devices) s += (s.empty() ? "" : ",") + d;
  return s;
}

Shape multi_shape(Ops op, const std::vector<const Shape*>& in, const Arg& arg) {
  Shape s = *in[0];
  if (op == Ops::MULTI) {
    int64_t axis = std::get<int64_t>(arg);
    if (axis >= 0) s[size_t(axis)] *= int64_t(in.size() - 1);  // the last source is the DEVICE
    return s;
  }
  const auto& a = std::get<std::vector<int64_t>>(arg);  // MSELECT {i, axis, n}
  if (a[1] >= 0) s[size_t(a[1])] /= a[2];
  return s;
}

namespace detail {

// A tensor realised on a multi-device name whose graph holds no MULTI (a constant made there, zeros(..., "CPU,CPU:1")
// or one computed from such): the same value on every device.
UOpRef multi_realize_root(const Tensor& t) {
  const UOp* u = t.uop().get();
  if (!is_multi_device(t.device()) || u->op == Ops::MULTI) return t.uop();
  for (const UOp* n : toposort(u))
    if (n->op == Ops::MULTI) return t.uop();
  std::vector<std::string> devs = split_devices(t.device());
  std::vector<UOpRef> parts(devs.size(), t.uop());
  parts.push_back(UOp::make(Ops::DEVICE, dtypes::void_, {}, t.device()));
  return UOp::make(Ops::MULTI, u->dtype, parts, int64_t(-1));
}

// Whether a multi-device tensor's parts are all buffers (nothing to compute).
bool multi_realized(const UOp* u) {
  if (u->op != Ops::MULTI) return false;
  for (size_t i = 0; i + 1 < u->nsrc(); i++)
    if (!contiguous_buffer(u->src(i))) return false;
  return true;
}

// t.assign(x) for a multi-device target: the ASSIGN over the MULTI of the target's buffers.
UOpRef multi_assign_uop(Tensor& t, const Tensor& x) {
  if (!t.is_multi()) throw Error("[assign] a tensor on " + x.device() + " cannot be written into one on " + t.device());
  if (x.is_multi() && x.devices() != t.devices())
    throw Error("[assign] a tensor on " + x.device() + " cannot be written into one on " + t.device());
  if (!multi_realized(t.uop().get())) t.realize();
  return UOp::make(Ops::ASSIGN, t.dtype(), {t.uop(), x.cast(t.dtype()).uop()});
}

// to() where either side is on several devices.
Tensor multi_to(const Tensor& t, const std::string& dev) {
  if (is_multi_device(dev)) {
    std::vector<std::string> devs = split_devices(dev);
    if (t.is_multi()) {
      std::vector<std::string> canon;
      for (auto& d : devs) canon.push_back(get_device(d).name());
      if (canon == t.devices()) return t;
    }
    return t.shard(devs);
  }
  std::string d = get_device(dev).name();
  if (t.uop()->op != Ops::MULTI && !multi_realized(t.uop().get())) {  // a constant: the same graph on `d`
    bool has_multi = false;
    for (const UOp* n : toposort(t.uop().get())) has_multi |= n->op == Ops::MULTI;
    if (!has_multi) return Tensor(t.uop(), t.shape(), d);
  }
  UOpRef devu = UOp::make(Ops::DEVICE, dtypes::void_, {}, d);
  return Tensor(UOp::make(Ops::COPY, t.dtype(), {t.uop(), devu}), t.shape(), d);
}

}  // namespace detail

bool Tensor::is_multi() const { return is_multi_device(device()); }

std::vector<std::string> Tensor::devices() const { return split_devices(device()); }

std::optional<int> Tensor::shard_axis() const {
  if (!is_multi()) return std::nullopt;
  const UOp* u = uop().get();
  while (u->op == Ops::ASSIGN) u = u->src(0);
  if (u->op == Ops::MULTI) {
    int64_t a = std::get<int64_t>(u->arg);
    return a >= 0 ? std::optional<int>(int(a)) : std::nullopt;
  }
  return sched::multi_axis(UOpRef(u));  // a computed value: its layout once lowered (src/schedule/multi.cpp)
}

Tensor Tensor::shard(const std::vector<std::string>& devices, std::optional<int> axis, CallLoc loc) const {
  CallSite site(loc);
  if (devices.empty()) throw Error("[shard] needs at least one device, got none");
  std::vector<std::string> devs;
  for (auto& d : devices) {
    if (is_multi_device(d)) throw Error("[shard] device '" + d + "': expected one device per entry");
    Device& dv = get_device(d);  // unknown names throw
    if (!dv.runs_kernels()) throw Error("[shard] cannot shard onto " + dv.name() + ": its tensors are read-only views of a mapped file");
    if (std::find(devs.begin(), devs.end(), dv.name()) != devs.end())
      throw Error("[shard] device " + dv.name() + " is listed twice in " + join_devices(devices));
    devs.push_back(dv.name());
  }
  if (is_symbolic()) throw Error("[shard] a tensor with a symbolic shape " + shape_str(shape()) + " cannot be sharded");
  const int64_t n = int64_t(devs.size());
  int64_t ax = -1;
  if (axis) {
    if (*axis < -ndim() || *axis >= ndim())
      throw Error("[shard] axis " + std::to_string(*axis) + " is out of range for shape " + shape_str(shape()) +
                  " (expected -" + std::to_string(ndim()) + ".." + std::to_string(ndim() - 1) + ")");
    ax = *axis < 0 ? *axis + ndim() : *axis;
    if (shape()[size_t(ax)] % n)
      throw Error("[shard] axis " + std::to_string(ax) + " of shape " + shape_str(shape()) + " (size " +
                  std::to_string(shape()[size_t(ax)]) + ") does not split evenly over " + std::to_string(n) + " devices");
  }
  if (n == 1) return to(devs[0]);
  Tensor src = is_multi() ? to(devs[0]) : *this;  // re-sharding: gathered on the first device
  std::vector<UOpRef> parts;
  for (int64_t i = 0; i < n; i++) {
    Tensor p = src;
    if (ax >= 0) {
      std::vector<std::pair<int64_t, int64_t>> s;
      for (int64_t k = 0; k < ndim(); k++) s.push_back(k == ax ? std::pair{i * shape()[size_t(k)] / n, (i + 1) * shape()[size_t(k)] / n}
                                                                : std::pair{int64_t(0), shape()[size_t(k)]});
      p = p.shrink(s);
    }
    parts.push_back(p.to(devs[size_t(i)]).uop());
  }
  std::string name = join_devices(devs);
  parts.push_back(UOp::make(Ops::DEVICE, dtypes::void_, {}, name));
  return Tensor(UOp::make(Ops::MULTI, dtype(), parts, ax), shape(), name);
}

Tensor& Tensor::shard_(const std::vector<std::string>& devices, std::optional<int> axis, CallLoc loc) {
  Tensor s = shard(devices, axis, loc);
  im().uop = s.uop();
  im().device = s.device();
  return *this;
}

Tensor Tensor::shard_like(const Tensor& other, CallLoc loc) const {
  if (!other.is_multi()) return to(other.device(), loc);
  return shard(other.devices(), other.shard_axis(), loc);
}

}  // namespace tg
