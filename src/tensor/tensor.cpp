// Tensor: creation, elementwise ops with broadcasting and promotion, movement, reductions, realize.
#include "tg/tensor.hpp"
#include "tg/multi.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <atomic>
#include <mutex>
#include <numeric>
#include <unordered_set>

#include "tg/device.hpp"
#include "tg/jit.hpp"
#include "tg/pattern.hpp"
#include "tg/schedule.hpp"
#include "ops_util.hpp"

namespace tg {

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

static int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n)) throw Error("[shape] " + shape_str(s) + " has more than 2^63 elements");
  return n;
}

Shape infer_shape(Ops op, const std::vector<const Shape*>& in, const Arg& arg, DType) {
  auto vec = [&]() -> const std::vector<int64_t>& { return std::get<std::vector<int64_t>>(arg); };
  switch (op) {
    case Ops::RESHAPE: case Ops::EXPAND: return vec();
    case Ops::PERMUTE: {
      Shape s;
      for (int64_t a : vec()) s.push_back((*in[0])[size_t(a)]);
      return s;
    }
    case Ops::PAD: {
      Shape s = *in[0];
      for (size_t i = 0; i < s.size(); i++) s[i] += vec()[2 * i] + vec()[2 * i + 1];
      return s;
    }
    case Ops::SHRINK: {
      Shape s = *in[0];
      for (size_t i = 0; i < s.size(); i++) s[i] = vec()[2 * i + 1] - vec()[2 * i];
      return s;
    }
    case Ops::REDUCE_AXIS: {
      Shape s = *in[0];
      for (int64_t a : std::get<ReduceArg>(arg).axes) s[size_t(a)] = 1;
      return s;
    }
    case Ops::BUFFER: return {std::get<std::vector<int64_t>>(arg)[1]};
    case Ops::CONST: case Ops::DEFINE_VAR: case Ops::DEVICE: return {};
    case Ops::RANGE: return {vec().at(2)};  // a tensor-graph RANGE (arange): its length is the argument's third entry
    case Ops::MULTI: case Ops::MSELECT: return multi_shape(op, in, arg);  // src/tensor/multi.cpp
    default: return in.empty() ? Shape{} : *in[0];
  }
}

// ---------------------------------------------------------------- live tensors

namespace {
std::mutex g_live_mu;
std::vector<std::weak_ptr<TensorImpl>> g_live;

std::shared_ptr<TensorImpl> make_impl(UOpRef u, Shape s, std::string dev, bool weak = false) {
  auto p = std::make_shared<TensorImpl>(TensorImpl{std::move(u), std::move(s), std::move(dev), weak});
  std::lock_guard lk(g_live_mu);
  if (g_live.size() > 64 && (g_live.size() & (g_live.size() - 1)) == 0)
    std::erase_if(g_live, [](auto& w) { return w.expired(); });
  g_live.push_back(p);
  return p;
}

std::string dev_or_default(const std::string& d) { return d.empty() ? default_device() : d; }

UOpRef const_uop(DType d, double v) { return UOp::cnst(d, v); }

}  // namespace

namespace {
std::atomic<size_t> g_becomes_visits{0};
}
size_t becomes_visits() { return g_becomes_visits.load(); }

/** Substitute realised nodes in every live tensor's graph. Only nodes created after the oldest realised one can
 *  contain it (UOp::seq), so older graphs -- the rest of the pending graph around a host read -- are not walked;
 *  one memo is shared by all tensors, so a node under many live tensors is visited once. */
void replace_realized(const std::vector<std::pair<const UOp*, UOpRef>>& becomes) {
  if (becomes.empty()) return;
  std::unordered_map<const UOp*, UOpRef> map(becomes.begin(), becomes.end());
  uint64_t oldest = UINT64_MAX;
  for (auto& [from, to] : becomes) oldest = std::min(oldest, from->seq());
  std::vector<std::shared_ptr<TensorImpl>> live;
  {
    std::lock_guard lk(g_live_mu);
    for (auto& w : g_live)
      if (auto p = w.lock()) live.push_back(std::move(p));
  }
  // memo: node -> its substituted form (null: unchanged); iterative post-order walk over the young nodes only
  std::unordered_map<const UOp*, UOpRef> memo;
  size_t visits = 0;
  auto substitute = [&](const UOp* root) -> UOpRef {
    std::vector<std::pair<const UOp*, bool>> st{{root, false}};
    while (!st.empty()) {
      auto [u, ready] = st.back();
      st.pop_back();
      if (u->seq() < oldest || (!ready && memo.count(u))) continue;
      if (auto it = map.find(u); it != map.end()) {
        memo[u] = it->second;
        continue;
      }
      if (!ready) {
        visits++;
        st.push_back({u, true});
        for (auto& c : u->src())
          if (c->seq() >= oldest && !memo.count(c.get())) st.push_back({c.get(), false});
        continue;
      }
      std::vector<UOpRef> src;
      bool changed = false;
      for (auto& c : u->src()) {
        auto it = memo.find(c.get());
        bool sub = it != memo.end() && it->second;
        changed |= sub;
        src.push_back(sub ? it->second : c);
      }
      memo[u] = changed ? u->replace_src(src) : UOpRef{};
    }
    auto it = memo.find(root);
    return it == memo.end() || !it->second ? UOpRef(root) : it->second;
  };
  for (auto& p : live) {
    if (!p->uop || p->uop->seq() < oldest || contiguous_buffer(p->uop.get()) || p->uop->op == Ops::CONST) continue;
    UOpRef n = substitute(p->uop.get());
    if (n.get() != p->uop.get()) p->uop = std::move(n);  // a tensor whose graph is unchanged is not written
  }
  g_becomes_visits.fetch_add(visits);
}

namespace {
// Movement ops (and DETACH) down to a buffer: a view that aliases the buffer's storage, as a torch view does.
bool is_buffer_view(const UOp* u) {
  while (is_movement(u->op) || u->op == Ops::DETACH) u = u->src(0);
  return u->op == Ops::BUFFER;
}

/** The live lazy tensors (not pure views of a buffer, not in `skip`) whose graph reaches a BUFFER node for which
 *  `hit` is true, walking no node in `stop` and none older than `oldest` (a node cannot read a younger buffer). */
template <class Hit>
std::vector<UOpRef> live_readers(Hit&& hit, const std::unordered_set<const UOp*>& stop, uint64_t oldest,
                                 const std::unordered_set<const UOp*>& skip) {
  std::vector<std::shared_ptr<TensorImpl>> live;
  {
    std::lock_guard lk(g_live_mu);
    for (auto& w : g_live)
      if (auto p = w.lock()) live.push_back(std::move(p));
  }
  std::unordered_map<const UOp*, bool> reads;  // node -> reaches a hit buffer
  auto reaches = [&](const UOp* root) {
    std::vector<std::pair<const UOp*, bool>> ws{{root, false}};
    while (!ws.empty()) {
      auto [u, ready] = ws.back();
      ws.pop_back();
      if (reads.count(u)) continue;
      if (u->seq() < oldest || stop.count(u) || u->op == Ops::BUFFER) {
        reads[u] = u->op == Ops::BUFFER && hit(u);
        continue;
      }
      if (!ready) {
        ws.push_back({u, true});
        for (auto& c : u->src())
          if (!reads.count(c.get())) ws.push_back({c.get(), false});
        continue;
      }
      bool r = false;
      for (auto& c : u->src()) r = r || reads.at(c.get());
      reads[u] = r;
    }
    return reads.at(root);
  };
  std::vector<UOpRef> out;
  std::unordered_set<const UOp*> taken;
  for (auto& p : live) {
    const UOp* u = p->uop.get();
    if (!u || u->op == Ops::CONST || u->seq() < oldest || skip.count(u) || taken.count(u) || is_buffer_view(u)) continue;
    if (reaches(u)) {
      out.push_back(p->uop);
      taken.insert(u);
    }
  }
  return out;
}

/** A tensor keeps the value it had when it was defined: the live lazy tensors that read the old contents of a
 *  buffer an ASSIGN under roots overwrites are added to roots, and the schedule runs every read of the old
 *  contents before the write (WAR). Reading through a scheduled ASSIGN is reading the new value; a pure view of
 *  the buffer is an alias and sees the write. Costs one walk of the roots, and of the live graphs only when an
 *  ASSIGN is among the roots. */
std::vector<const UOp*> add_old_readers(std::vector<UOpRef>& roots) {
  std::unordered_set<const UOp*> seen, assigns, targets;
  std::vector<const UOp*> st;
  for (auto& r : roots) st.push_back(r.get());
  while (!st.empty()) {
    const UOp* u = st.back();
    st.pop_back();
    if (!seen.insert(u).second || u->op == Ops::BUFFER) continue;
    if (u->op == Ops::ASSIGN) {
      assigns.insert(u);
      if (const UOp* b = assign_buffer(u->src(0))) targets.insert(b);
    }
    for (auto& c : u->src()) st.push_back(c.get());
  }
  if (targets.empty()) return {};
  uint64_t oldest = UINT64_MAX;  // a node older than every target cannot read one
  for (const UOp* b : targets) oldest = std::min(oldest, b->seq());
  std::unordered_set<const UOp*> in_roots;
  for (auto& r : roots) in_roots.insert(r.get());
  for (UOpRef& r : live_readers([&](const UOp* b) { return targets.count(b) > 0; }, assigns, oldest, in_roots))
    roots.push_back(std::move(r));
  return {assigns.begin(), assigns.end()};
}
}  // namespace

// ---------------------------------------------------------------- construction

TensorImpl& Tensor::im() const {
  if (!impl_)
    throw Error("[tensor] this tensor is undefined (a default-constructed Tensor holds no value): assign a tensor to it "
                "before using it; defined() tells");
  return *impl_;
}
Tensor::Tensor(UOpRef uop, Shape shape, std::string device)
    : impl_(make_impl(NoGrad::active() && uop->op != Ops::DETACH && !contiguous_buffer(uop.get()) && uop->op != Ops::CONST
                          ? UOp::make(Ops::DETACH, uop->dtype, {uop})
                          : std::move(uop),
                      std::move(shape), std::move(device))) {}
Tensor::Tensor(double v) : impl_(make_impl(UOp::cnst(dtypes::weakfloat, v), {}, "", true)) {}
Tensor::Tensor(int v) : impl_(make_impl(UOp::cnst_int(dtypes::weakint, v), {}, "", true)) {}
Tensor::Tensor(bool v) : impl_(make_impl(UOp::cnst_int(dtypes::bool_, v), {}, "", true)) {}

const Shape& Tensor::shape() const {
  if (is_symbolic())
    throw Error("[shape] the tensor has the symbolic shape " + shape_str(sym_shape()) +
                ": read sym_shape() (its dims as sints) or max_shape() (their largest values)");
  return im().shape;
}
const Shape& Tensor::max_shape() const { return im().shape; }
SymShape Tensor::sym_shape() const {
  SymShape r;
  if (const auto* sym = uop()->sym()) {
    for (auto& e : *sym) r.emplace_back(e);
  } else {
    for (int64_t d : im().shape) r.emplace_back(d);
  }
  return r;
}
size_t Tensor::read_count() const {
  if (!is_symbolic()) return size_t(numel());
  size_t n = 1;
  for (const sint& d : sym_shape()) n *= size_t(d.value());
  return n;
}
DType Tensor::dtype() const { return im().uop->dtype; }
const std::string& Tensor::device() const {
  if (im().device.empty()) im().device = default_device();
  return im().device;
}
int64_t Tensor::numel() const { return numel_of(shape()); }
const UOpRef& Tensor::uop() const { return im().uop; }
int64_t Tensor::size(int dim) const {
  if (ndim() == 0) throw Error("[size] dim " + std::to_string(dim) + " of a 0-d tensor: it has no dims (use numel())");
  return shape()[size_t(norm_axis(dim, "size"))];
}

Tensor Tensor::check_numel(size_t n, const char* op) const {
  if (size_t(numel()) != n)
    throw Error(std::string("[") + op + "] " + std::to_string(n) + " values do not fill shape " + shape_str(shape()));
  return *this;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const std::string& device) {
  for (int64_t d : shape)
    if (d < 0) throw Error("[empty] negative dimension in shape " + shape_str(shape));
  std::string dev = dev_or_default(device);
  if (is_multi_device(dev)) {  // a buffer on each device (include/tg/multi.hpp)
    std::vector<UOpRef> parts;
    for (const std::string& d : split_devices(dev)) parts.push_back(empty(shape, dtype, d).uop());
    parts.push_back(UOp::make(Ops::DEVICE, dtypes::void_, {}, dev));
    return Tensor(UOp::make(Ops::MULTI, parts[0]->dtype, parts, int64_t(-1)), shape, dev);
  }
  checked_nbytes("empty", shape, dtypes::strong(dtype), dev);
  auto buf = new_buffer_uop(dev, dtypes::strong(dtype), size_t(numel_of(shape)));
  return Tensor(UOp::make(Ops::RESHAPE, buf->dtype, {buf}, std::vector<int64_t>(shape)), shape, dev);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, const std::string& device) {
  for (int64_t d : shape)
    if (d < 0) throw Error("[full] negative dimension in shape " + shape_str(shape));
  Tensor c(const_uop(dtypes::strong(dtype), value), {}, dev_or_default(device));
  return c.reshape(Shape(shape.size(), 1)).expand(shape);
}
Tensor Tensor::zeros(const Shape& s, DType d, const std::string& dev) { return full(s, 0, d, dev); }
Tensor Tensor::ones(const Shape& s, DType d, const std::string& dev) { return full(s, 1, d, dev); }

Tensor Tensor::from_blob(const void* data, const Shape& shape, DType dtype, const std::string& device) {
  if (is_multi_device(device)) return from_blob(data, shape, dtype, split_devices(device)[0]).to(device);  // replicated
  Tensor t = empty(shape, dtype, device);
  auto buf = buffer_of(contiguous_buffer(t.uop().get()));
  if (buf->nbytes() > 0) buf->copyin(data, buf->nbytes());  // an empty tensor has nothing to copy (data may be null)
  return t;
}

namespace {
// 0, 1, ..., n - 1 as the index itself (a RANGE in the tensor graph, n > 0), computed by the kernel that uses it
Tensor index_range(int64_t n, DType d, const std::string& dev) {
  return Tensor(UOp::make(Ops::RANGE, d, {UOp::cnst_int(dtypes::index, n)}, std::vector<int64_t>{-1, int64_t(AxisType::Loop), n}),
                {n}, dev);
}
}  // namespace

Tensor Tensor::arange(double start, double stop, double step, DType dtype, const std::string& device) {
  if (step == 0) throw Error("[arange] step must not be 0");
  if (dtype == dtypes::void_)  // unset: float32 when an argument is not a whole number (tinygrad, torch), else int32
    dtype = start == std::trunc(start) && stop == std::trunc(stop) && step == std::trunc(step) ? dtypes::int32 : dtypes::float32;
  double count = std::ceil((stop - start) / step);
  if (!std::isfinite(count) || count >= 0x1p63)
    throw Error("[arange] (" + std::to_string(start) + ", " + std::to_string(stop) + ", " + std::to_string(step) +
                ") does not give a finite count below 2^63");
  int64_t n = count > 0 ? int64_t(count) : 0;  // a huge negative count: empty (no out-of-range conversion)
  DType d = dtypes::strong(dtype);
  if (d.ptr || d.count != 1 || d.itemsize() > 8) throw Error("[arange] unsupported dtype " + d.name());
  std::string dev = dev_or_default(device);
  checked_nbytes("arange", {n}, d, dev);  // before any host memory
  // (on the default device only: a RANGE names no device, and its kernel runs where the graph's buffers are)
  bool as_range = dtypes::is_int(d) && !dtypes::is_bool(d) && start == std::trunc(start) && step == std::trunc(step) && n > 0 &&
                  std::fabs(start) < 0x1p53 && std::fabs(start + double(n - 1) * step) < 0x1p53 &&
                  std::min(start, start + double(n - 1) * step) >= double(dtypes::min_int(d)) &&
                  std::max(start, start + double(n - 1) * step) <= double(dtypes::max_int(d));
  if (is_multi_device(dev) && !as_range) return arange(start, stop, step, dtype, split_devices(dev)[0]).to(dev);
  if (as_range && (dev == default_device() || is_multi_device(dev))) {  // several devices: each computes it
    // Integers: the index itself (a RANGE in the tensor graph), computed where it is used. A kernel that compares
    // it with an index and sums (a gather written as a one-hot reduce) becomes an indexed load (see the scheduler).
    Tensor t = index_range(n, d, dev);
    if (step != 1) t = t * Tensor(UOp::cnst_int(d, int64_t(step)), {}, dev);
    if (start != 0) t = t + Tensor(UOp::cnst_int(d, int64_t(start)), {}, dev);
    return t;
  }
  Tensor t = empty({n}, d, dev);
  auto buf = buffer_of(contiguous_buffer(t.uop().get()));
  // Filled on the host in the target dtype (no kernel): each value converted with the C semantics of a CAST;
  // staged in chunks, so the host holds at most 1 MiB beside the buffer.
  size_t isz = size_t(d.itemsize()), chunk = (size_t(1) << 20) / isz;
  std::vector<uint8_t> bytes(std::min(size_t(n), chunk) * isz);
  for (int64_t i0 = 0; i0 < n; i0 += int64_t(chunk)) {
    int64_t i1 = std::min(n, i0 + int64_t(chunk));
    for (int64_t i = i0; i < i1; i++) {
      const double x = start + double(i) * step;
      uint64_t bits;
      // float32 and float64 directly, as the CAST converts (the interpreter per element took 14 ns: 54 ms for an
      // arange of 4M floats); the other dtypes through it
      if (d.scalar == Scalar::Float32) {
        bits = std::bit_cast<uint32_t>(std::fabs(x) <= double(std::numeric_limits<float>::max()) ? float(x) : float(truncate_float(x, d)));
      } else if (d.scalar == Scalar::Float64) {
        bits = std::bit_cast<uint64_t>(x);
      } else {
        Value v{0, x};
        Value r = exec_alu(Ops::CAST, d, std::span<const Value>(&v, 1), dtypes::float64);
        switch (d.scalar) {
          case Scalar::Float16: bits = float_to_half_bits(float(r.f)); break;
          case Scalar::BFloat16: bits = float_to_bf16_bits(float(r.f)); break;
          case Scalar::Fp8E4M3: case Scalar::Fp8E5M2: bits = double_to_fp8_bits(r.f, d.scalar); break;
          default: bits = uint64_t(r.i);
        }
      }
      std::memcpy(&bytes[size_t(i - i0) * isz], &bits, isz);  // little endian
    }
    buf->copyin_at(size_t(i0) * isz, bytes.data(), size_t(i1 - i0) * isz);
  }
  return t;
}

Tensor Tensor::eye(int64_t n, int64_t m, DType dtype, const std::string& device) {
  if (m < 0) m = n;
  Tensor a = arange(0, double(n), 1, dtypes::int32, device).reshape({n, 1});
  Tensor b = arange(0, double(m), 1, dtypes::int32, device).reshape({1, m});
  return (a == b).cast(dtype);
}

// ---------------------------------------------------------------- random (threefry2x32, counter based)

namespace {
// The generator's state, per device: a realised uint32 buffer [key, counter] (tinygrad's _device_seeds and
// _device_rng_counters in one). A draw adds 1 to the counter in place, on the device, and keys threefry with
// (key, counter before the draw): a jitted step that draws numbers advances the state on every replay.
std::mutex g_rng_mu;
uint64_t g_seed = 0;
uint32_t seed_key() { return uint32_t(g_seed ^ (g_seed >> 32)); }
std::map<std::string, Tensor>& rng_states() {
  static auto* states = new std::map<std::string, Tensor>;  // never destroyed: buffers outlive no device
  return *states;
}
Tensor rng_state_init(const std::string& device) {
  return Tensor::from_vector(std::vector<uint32_t>{seed_key(), 0}, {2}, device);
}

// This draw's (key, counter) as a fresh 2-element buffer; the device's counter is advanced. The snapshot is a
// buffer of its own, so the draw's lazy values never read a counter that a later draw has advanced.
Tensor rng_draw_key(const std::string& device) {
  std::lock_guard lk(g_rng_mu);
  auto& states = rng_states();
  auto it = states.find(device);
  if (it == states.end()) it = states.emplace(device, rng_state_init(device)).first;
  Tensor& state = it->second;
  Tensor step = Tensor::arange(0, 2, 1, dtypes::uint32, device);  // [0, 1]
  state.assign(state + step);
  Tensor key = (state - step).contiguous();
  Tensor::realize_all({&state, &key});
  return key;
}
}  // namespace

void Tensor::manual_seed(uint64_t seed) {
  std::lock_guard lk(g_rng_mu);
  g_seed = seed;
  // Reset in place: jitted functions that captured a device's state buffer see the new seed too.
  for (auto& [dev, state] : rng_states()) {
    state.assign(rng_state_init(dev));
    state.realize();
  }
}

namespace {
Tensor u32(const Tensor& t, uint32_t v) { return Tensor(const_uop(dtypes::uint32, v), {}, t.device()); }
Tensor rotl(const Tensor& x, int r) { return (x << u32(x, uint32_t(r))) | (x >> u32(x, uint32_t(32 - r))); }
// threefry2x32-20 on (x0, x1) with key (k0, k1), all uint32 (the keys are 0-d tensors, read from a buffer):
// both output words.
std::pair<Tensor, Tensor> threefry2(Tensor x0, Tensor x1, const Tensor& k0, const Tensor& k1) {
  static const int rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  Tensor ks[3] = {k0, k1, (k0 ^ k1) ^ u32(k0, 0x1BD11BDAu)};
  x0 = x0 + ks[0];
  x1 = x1 + ks[1];
  for (int i = 0; i < 5; i++) {
    for (int r : rot[i % 2]) {
      x0 = x0 + x1;
      x1 = rotl(x1, r);
      x1 = x1 ^ x0;
    }
    x0 = x0 + ks[(i + 1) % 3];
    x1 = x1 + (ks[(i + 2) % 3] + u32(x1, uint32_t(i) + 1u));
  }
  return {x0, x1};
}
}  // namespace

Tensor Tensor::random_bits(int64_t n, const std::string& device) {
  if (n < 0) throw Error("[random_bits] n must be non-negative, got " + std::to_string(n));
  if (n > (int64_t(1) << 32))  // the counter is 32 bits: more values would repeat
    throw Error("[random_bits] " + std::to_string(n) + " values is more than 2^32, the most one call draws");
  std::string dev = dev_or_default(device);
  Tensor key = rng_draw_key(dev);
  Tensor k0 = key.shrink({{0, 1}}).reshape({}), k1 = key.shrink({{1, 2}}).reshape({});
  // The counter as the index itself on any one device, not only the default one where arange makes it a RANGE: the
  // kernel reads the key from dev, so it runs there (elsewhere arange fills a buffer on the host, 14 ns an element:
  // a CPU rand of 1M numbers under DEVICE=CL took 16 ms, and its lanes read the counter from memory, no vectors).
  Tensor ctr = n > 0 && !is_multi_device(dev) ? index_range(n, dtypes::uint32, dev) : arange(0, double(n), 1, dtypes::uint32, dev);
  return threefry2(ctr, Tensor::zeros({n}, dtypes::uint32, dev), k0, k1).first;
}

Tensor Tensor::threefry(const Tensor& key) const {
  if (!(dtype() == dtypes::uint64) || !(key.dtype() == dtypes::uint64))
    throw Error("[threefry] needs uint64 counters and key, got " + dtype().name() + " and " + key.dtype().name());
  Tensor lo32 = Tensor(const_uop(dtypes::uint64, 32), {}, device());
  Tensor x0 = cast(dtypes::uint32), x1 = (*this >> lo32).cast(dtypes::uint32);
  Tensor k0 = key.cast(dtypes::uint32), k1 = (key >> lo32).cast(dtypes::uint32);
  auto [r0, r1] = threefry2(x0, x1, k0, k1);
  return (r1.cast(dtypes::uint64) << lo32) | r0.cast(dtypes::uint64);
}

Tensor Tensor::rand(const Shape& shape, DType dtype, const std::string& device) {
  if (!dtypes::is_float(dtype)) throw Error("[rand] needs a float dtype, got " + dtype.name());
  int64_t n = numel_of(shape);
  if (n > (int64_t(1) << 32))  // the counter is 32 bits: more values would repeat
    throw Error("[rand] shape " + shape_str(shape) + " has more than 2^32 elements, the most one call draws");
  Tensor bits = random_bits(n, device);
  // 23 random mantissa bits under exponent 0 give a float in [1, 2); minus 1 gives [0, 1).
  Tensor f = ((bits >> u32(bits, 9)) | u32(bits, 0x3f800000u)).bitcast(dtypes::float32) - 1.0;
  return f.cast(dtype).reshape(shape);
}

Tensor Tensor::randn(const Shape& shape, DType dtype, const std::string& device) {
  // Box-Muller: sqrt(-2 ln(1-u1)) * cos(2 pi u2).
  int64_t n = numel_of(shape);
  if (n > (int64_t(1) << 31))  // two uniform values per element, at most 2^32 per rand call
    throw Error("[randn] shape " + shape_str(shape) + " has more than 2^31 elements, the most one call draws");
  Tensor u = rand({2, n}, dtypes::float32, device);
  Tensor u1 = u.shrink({{0, 1}, {0, n}}), u2 = u.shrink({{1, 2}, {0, n}});
  Tensor r = ((1.0 - u1).log() * -2.0).sqrt() * (u2 * (2 * M_PI)).cos();
  return r.cast(dtype).reshape(shape);
}

Tensor Tensor::randint(int64_t low, int64_t high, const Shape& shape, DType dtype, const std::string& device) {
  if (high <= low) throw Error("[randint] needs low < high, got " + std::to_string(low) + ", " + std::to_string(high));
  if (!dtypes::is_int(dtype)) throw Error("[randint] needs an int dtype, got " + dtype.name());
  Tensor u = rand(shape, dtypes::float32, device);
  return (u * double(high - low)).cast(dtypes::int64).alu(Ops::ADD, int(low)).cast(dtype);
}

// ---------------------------------------------------------------- elementwise

Shape Tensor::broadcast_shape(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; i++) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw Error(std::string("[") + op + "] shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

static Shape max_of(const SymShape& s) {
  Shape r;
  for (const sint& d : s) r.push_back(d.max());
  return r;
}

static SymShape broadcast_sym(const SymShape& a, const SymShape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  SymShape out(n);
  for (size_t i = 0; i < n; i++) {
    sint da = i < n - a.size() ? sint(1) : a[i - (n - a.size())];
    sint db = i < n - b.size() ? sint(1) : b[i - (n - b.size())];
    bool a1 = da.is_int() && da.value() == 1, b1 = db.is_int() && db.value() == 1;
    if (!(da == db) && !a1 && !b1)
      throw Error(std::string("[") + op + "] shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = a1 ? db : da;
  }
  return out;
}

static Tensor broadcast_to_sym(const Tensor& t, const SymShape& s) {
  SymShape ts = t.sym_shape();
  if (ts == s) return t;
  SymShape padded(s.size() - ts.size(), sint(1));
  padded.insert(padded.end(), ts.begin(), ts.end());
  return t.reshape(padded).expand(s);
}

static Tensor broadcast_to(const Tensor& t, const Shape& s) {
  if (t.shape() == s) return t;
  Shape padded(s.size() - t.shape().size(), 1);
  padded.insert(padded.end(), t.shape().begin(), t.shape().end());
  return t.reshape(padded).expand(s);
}

namespace {
// A divisor the kernel may divide by as it is: a constant other than 0 (and -1 for signed ints).
bool safe_divisor(const Tensor& b) {
  const UOp* u = b.uop().get();
  while (is_movement(u->op)) u = u->src(0);
  if (u->op != Ops::CONST) return false;
  int64_t v = u->const_int();
  return v != 0 && (v != -1 || dtypes::is_unsigned(b.dtype()));
}

Tensor safe_divmod(Ops op, const Tensor& a, const Tensor& b, const std::string& dev) {
  // Truncating IDIV/MOD with every divisor defined (tg's semantics, see the header): a / 0 = 0 and a % 0 = 0 (as
  // numpy; torch raises on the CPU), INT_MIN / -1 wraps to INT_MIN (as torch). The kernel divides by 1 where the
  // divisor is 0 or -1, so no kernel divides by zero (undefined in C and LLVM; x86 traps) or overflows.
  bool sgn = !dtypes::is_unsigned(a.dtype());
  Tensor zero = b == 0, bad = sgn ? (zero | (b == -1)) : zero;
  Tensor d = bad.where(1, b);
  Tensor q(UOp::make(op, a.dtype(), {a.uop(), d.uop()}), a.max_shape(), dev);  // a / 1 = a, a % 1 = 0
  if (op == Ops::MOD) return q;
  if (sgn) q = (b == -1).where(-a, q);
  return zero.where(0, q);
}
}  // namespace

Tensor Tensor::alu(Ops op, const Tensor& b, CallLoc loc) const {
  CallSite site(loc);
  const Tensor& a = *this;
  bool weak = a.im().weak && b.im().weak;
  DType out = least_upper_dtype({a.dtype(), b.dtype()});
  if (!weak) out = dtypes::strong(out);
  if (op == Ops::AND || op == Ops::OR || op == Ops::XOR || op == Ops::SHL || op == Ops::SHR) {
    if (dtypes::is_float(out))
      throw Error(std::string("[") + op_name(op) + "] bitwise ops need int or bool tensors, got " + a.dtype().name() +
                  " and " + b.dtype().name());
  }
  if ((op == Ops::IDIV || op == Ops::MOD) && !dtypes::is_int(out))
    throw Error(std::string("[") + op_name(op) + "] needs int tensors, got " + out.name());
  std::string dev = a.im().weak ? b.device() : a.device();
  Shape s;
  Tensor ca, cb;
  if (a.is_symbolic() || b.is_symbolic()) {
    SymShape ss = broadcast_sym(a.sym_shape(), b.sym_shape(), op_name(op));
    s = max_of(ss);
    ca = broadcast_to_sym(a.cast(out), ss), cb = broadcast_to_sym(b.cast(out), ss);
  } else {
    s = broadcast_shape(a.shape(), b.shape(), op_name(op));
    ca = broadcast_to(a.cast(out), s), cb = broadcast_to(b.cast(out), s);
  }
  DType rd = is_comparison(op) ? dtypes::bool_ : out;
  Tensor r = (op == Ops::IDIV || op == Ops::MOD) && !safe_divisor(cb)
                 ? safe_divmod(op, ca, cb, dev)
                 : Tensor(UOp::make(op, rd, {ca.uop(), cb.uop()}), s, dev);
  r.im().weak = weak;
  return r;
}

Tensor Tensor::cast(DType d, CallLoc loc) const {
  CallSite site(loc);
  if (dtype() == d) return *this;
  if (im().uop->op == Ops::CONST) {  // fold: a constant of the new dtype
    const UOp* c = im().uop.get();
    double v = dtypes::is_float(c->dtype) ? c->const_float() : double(c->const_int());
    UOpRef u = dtypes::is_float(d) || dtypes::is_bool(d) ? UOp::cnst(d, v) : UOp::cnst_int(d, c->const_int());
    Tensor out(u, max_shape(), im().device);
    out.im().weak = im().weak && dtypes::is_weak(d);
    return out;
  }
  return Tensor(UOp::make(Ops::CAST, d, {uop()}), max_shape(), im().device);
}

Tensor Tensor::bitcast(DType d) const {
  if (d.itemsize() != dtype().itemsize())
    throw Error("[bitcast] " + dtype().name() + " and " + d.name() + " have different sizes");
  return Tensor(UOp::make(Ops::BITCAST, d, {uop()}), max_shape(), im().device);
}

namespace {
Tensor unary(const Tensor& t, Ops op, bool needs_float = true) {
  Tensor x = t;
  if (needs_float && !dtypes::is_float(t.dtype()))
    x = t.cast(t.impl()->weak ? dtypes::weakfloat : least_upper_float(dtypes::strong(t.dtype())));
  const UOp* u = x.uop().get();
  if (u->op == Ops::CONST) {  // fold now: constants stay constants (and weak ones stay weak)
    Value v;
    if (dtypes::is_float(u->dtype)) v.f = u->const_float();
    else v.i = u->const_int();
    Value r = exec_alu(op, u->dtype, std::span<const Value>(&v, 1), u->dtype);
    UOpRef c = dtypes::is_float(u->dtype) ? UOp::cnst(u->dtype, r.f) : UOp::cnst_int(u->dtype, r.i);
    Tensor out(c, x.max_shape(), x.impl()->device);
    out.impl()->weak = x.impl()->weak;
    return out;
  }
  return Tensor(UOp::make(op, x.dtype(), {x.uop()}), x.max_shape(), x.device());
}
}  // namespace

Tensor Tensor::neg() const {
  if (dtypes::is_bool(dtype())) return logical_not();
  return unary(*this, Ops::NEG, false);
}
Tensor Tensor::exp2() const { return unary(*this, Ops::EXP2); }
Tensor Tensor::log2() const { return unary(*this, Ops::LOG2); }
Tensor Tensor::exp() const { return (*this * (1.0 / M_LN2)).exp2(); }
Tensor Tensor::log() const { return log2() * M_LN2; }
Tensor Tensor::sin() const { return unary(*this, Ops::SIN); }
namespace {
// Floats narrower than float32 compute a composite op in float32 and round once, as torch does ("opmath"): in
// float16, x + pi/2 loses the low bits of x (cos), and the sigmoid gradient's (1 + e^-x)^2 overflows for x < -5.5.
bool narrow_float(DType d) { return dtypes::is_float(d) && d.itemsize() < 4; }
}  // namespace
// cos x = 1 - 2 sin^2(x/2): x/2 is exact, so the error is sin's, about 1e-7 whatever |x| (sin(x + pi/2), the form
// before, rounds x + pi/2 first, as tinygrad's sin(pi/2 - x) rounds pi/2 - x: 4.8e-4 off at |x| near 1e5).
Tensor Tensor::cos() const {
  if (narrow_float(dtype())) return cast(dtypes::float32).cos().cast(dtype());
  Tensor h = (*this * 0.5).sin();
  return 1.0 - h * h * 2.0;
}
Tensor Tensor::sqrt() const { return unary(*this, Ops::SQRT); }
Tensor Tensor::reciprocal() const { return unary(*this, Ops::RECIPROCAL); }
Tensor Tensor::trunc() const { return dtypes::is_float(dtype()) ? unary(*this, Ops::TRUNC) : *this; }
Tensor Tensor::maximum(const Tensor& b, CallLoc loc) const {
  CallSite site(loc); return alu(Ops::MAX, b); }
Tensor Tensor::minimum(const Tensor& b, CallLoc loc) const {
  CallSite site(loc);
  if (dtypes::is_bool(dtype()) && dtypes::is_bool(b.dtype())) return alu(Ops::AND, b);
  return -(-*this).maximum(-b);
}
Tensor Tensor::relu() const {
  // max(x, 0), torch's forward: MAX propagates NaN (relu(NaN) = NaN). MAX's gradient rule gives the tie to a constant
  // operand, so the gradient is torch's relu's [x > 0] (0 at x == 0), with no extra op in the forward kernel.
  return maximum(0);
}
Tensor Tensor::sigmoid() const {
  if (narrow_float(dtype())) return cast(dtypes::float32).sigmoid().cast(dtype());
  // torch's forward; pm_gradient's sigmoid rule matches this graph and gives x the gradient s (1 - s)
  return 1.0 / (1.0 + (-*this).exp());
}
Tensor Tensor::abs() const { return dtypes::is_unsigned(dtype()) || dtypes::is_bool(dtype()) ? *this : maximum(-*this); }
Tensor Tensor::logical_not() const {
  Tensor b = cast(dtypes::bool_);
  return b.alu(Ops::CMPNE, true);
}

Tensor Tensor::where(const Tensor& a, const Tensor& b, CallLoc loc) const {
  CallSite site(loc);
  bool weak = a.im().weak && b.im().weak;
  DType out = least_upper_dtype({a.dtype(), b.dtype()});
  if (!weak) out = dtypes::strong(out);
  if (weak) out = dtypes::strong(out);
  Shape s;
  Tensor c, ca, cb;
  if (is_symbolic() || a.is_symbolic() || b.is_symbolic()) {
    SymShape ss = broadcast_sym(broadcast_sym(sym_shape(), a.sym_shape(), "where"), b.sym_shape(), "where");
    s = max_of(ss);
    c = broadcast_to_sym(cast(dtypes::bool_), ss), ca = broadcast_to_sym(a.cast(out), ss), cb = broadcast_to_sym(b.cast(out), ss);
  } else {
    s = broadcast_shape(broadcast_shape(shape(), a.shape(), "where"), b.shape(), "where");
    c = broadcast_to(cast(dtypes::bool_), s), ca = broadcast_to(a.cast(out), s), cb = broadcast_to(b.cast(out), s);
  }
  return Tensor(UOp::make(Ops::WHERE, out, {c.uop(), ca.uop(), cb.uop()}), s, im().weak ? a.device() : device());
}

Tensor Tensor::div(const Tensor& b) const {
  DType out = least_upper_float(dtypes::strong(least_upper_dtype({dtype(), b.dtype()})));
  Tensor x = cast(out), y = b.cast(out);
  return x.alu(Ops::FDIV, y);
}

Tensor Tensor::div(const Tensor& b, const std::string& rounding_mode) const {
  if (rounding_mode != "trunc" && rounding_mode != "floor")
    throw Error("[div] rounding_mode must be \"trunc\" or \"floor\", got \"" + rounding_mode + "\"");
  if (!dtypes::is_float(least_upper_dtype({dtype(), b.dtype()})))
    return rounding_mode == "trunc" ? alu(Ops::IDIV, b) : idiv(b);
  Tensor q = div(b);
  return rounding_mode == "trunc" ? q.trunc() : q.floor();
}

Tensor Tensor::idiv(const Tensor& b) const {
  // floor division from C's truncating IDIV: q - ((a % b != 0) & ((a < 0) != (b < 0)))
  Tensor q = alu(Ops::IDIV, b), r = alu(Ops::MOD, b);
  Tensor fix = (r != 0) & ((*this < 0) != (b < 0));
  return q - fix.cast(q.dtype());
}

Tensor Tensor::mod(const Tensor& b) const {
  if (dtypes::is_float(least_upper_dtype({dtype(), b.dtype()}))) {
    Tensor q = div(b);
    Tensor fl = q.trunc() - ((q < q.trunc()).cast(q.dtype()));
    return *this - fl * b;
  }
  // floor remainder: r + b where r != 0 and signs of r and b differ
  Tensor r = alu(Ops::MOD, b);
  Tensor fix = (r != 0) & ((r < 0) != (b < 0));
  return fix.where(r + b, r);
}

Tensor Tensor::pow(const Tensor& b) const {
  // One POW node: its gradient rule (src/tensor/gradient.cpp) gives torch's values at the edges, and the lowering
  // writes it as exp2(y * log2|x|) with the sign, NaN and x^0 cases (src/codegen/transcendental.cpp).
  DType out = least_upper_float(dtypes::strong(least_upper_dtype({dtype(), b.dtype()})));
  Shape s = broadcast_shape(shape(), b.shape(), "pow");
  Tensor x = broadcast_to(cast(out), s), y = broadcast_to(b.cast(out), s);
  return Tensor(UOp::make(Ops::POW, out, {x.uop(), y.uop()}), s, im().weak ? b.device() : device());
}

namespace {
// Each contiguous() is its own tensor: the unique arg keeps two equal graphs from sharing one buffer (which
// an assign into one of them would otherwise change for both). The scheduler renumbers it away.
std::atomic<int64_t> g_next_contiguous{1};
}  // namespace

std::atomic<int64_t> detail::params_made{0};

Tensor Tensor::contiguous() const {
  if (im().uop->op == Ops::CONTIGUOUS || contiguous_buffer(im().uop.get())) return *this;
  return Tensor(UOp::make(Ops::CONTIGUOUS, dtype(), {uop()}, g_next_contiguous++), max_shape(), device());
}
Tensor Tensor::clone() const {
  return Tensor(UOp::make(Ops::CONTIGUOUS, dtype(), {uop()}, g_next_contiguous++), max_shape(), device());
}
Tensor Tensor::clone(const std::string& dev) const {
  Tensor t = to(dev);  // another device: a copy already
  return t.uop() == uop() ? clone() : t;
}
Tensor Tensor::detach() const { return Tensor(UOp::make(Ops::DETACH, dtype(), {uop()}), max_shape(), device()); }

// ---------------------------------------------------------------- movement

int64_t Tensor::norm_axis(int64_t a, const char* op) const {
  int64_t n = ndim();
  if (a < -std::max<int64_t>(n, 1) || a >= std::max<int64_t>(n, 1))
    throw Error(std::string("[") + op + "] axis " + std::to_string(a) + " is out of range for shape " + shape_str(shape()));
  return a < 0 ? a + n : a;
}

Tensor Tensor::mov(Ops op, Arg arg, Shape out) const {
  (void)numel_of(out);  // refuses shapes whose size overflows
  return Tensor(UOp::make(op, dtype(), {uop()}, std::move(arg)), std::move(out), im().device);
}

Tensor Tensor::reshape(Shape s, CallLoc loc) const {
  CallSite site(loc);
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == -1) {
      if (infer >= 0) throw Error("[reshape] only one -1 allowed in " + shape_str(s));
      infer = int64_t(i);
    } else if (s[i] < 0) {
      throw Error("[reshape] negative dimension in " + shape_str(s));
    } else if (__builtin_mul_overflow(known, s[i], &known)) {
      throw Error("[reshape] " + shape_str(s) + " has more than 2^63 elements");
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0)
      throw Error("[reshape] cannot reshape " + shape_str(shape()) + " into " + shape_str(s));
    s[size_t(infer)] = numel() / known;
  }
  if (numel_of(s) != numel())
    throw Error("[reshape] cannot reshape " + shape_str(shape()) + " into " + shape_str(s) + ": " +
                std::to_string(numel()) + " elements vs " + std::to_string(numel_of(s)));
  if (s == shape()) return *this;
  return mov(Ops::RESHAPE, std::vector<int64_t>(s), s);
}

Tensor Tensor::permute(std::vector<int64_t> order, CallLoc loc) const {
  CallSite site(loc);
  if (int64_t(order.size()) != ndim())
    throw Error("[permute] order has " + std::to_string(order.size()) + " axes, tensor has shape " + shape_str(shape()));
  std::vector<bool> seen(order.size());
  for (auto& a : order) {
    a = norm_axis(a, "permute");
    if (seen[size_t(a)]) throw Error("[permute] axis " + std::to_string(a) + " repeated");
    seen[size_t(a)] = true;
  }
  bool ident = true;
  for (size_t i = 0; i < order.size(); i++) ident &= order[i] == int64_t(i);
  if (ident) return *this;
  Shape s;
  for (int64_t a : order) s.push_back(max_shape()[size_t(a)]);
  return mov(Ops::PERMUTE, std::move(order), s);
}

Tensor Tensor::expand(Shape s, CallLoc loc) const {
  CallSite site(loc);
  if (s.size() < shape().size())
    throw Error("[expand] cannot expand " + shape_str(shape()) + " to fewer dims " + shape_str(s));
  Tensor t = *this;
  if (s.size() > shape().size()) {
    Shape p(s.size() - shape().size(), 1);
    p.insert(p.end(), shape().begin(), shape().end());
    t = reshape(p);
  }
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == -1) s[i] = t.shape()[i];
    if (t.shape()[i] != s[i] && t.shape()[i] != 1)
      throw Error("[expand] cannot expand " + shape_str(shape()) + " to " + shape_str(s));
  }
  if (s == t.shape()) return t;
  return t.mov(Ops::EXPAND, std::vector<int64_t>(s), s);
}

Tensor Tensor::pad(const std::vector<std::pair<int64_t, int64_t>>& p, double value, CallLoc loc) const {
  CallSite site(loc);
  if (int64_t(p.size()) != ndim())
    throw Error("[pad] " + std::to_string(p.size()) + " pairs for shape " + shape_str(sym_shape()));
  std::vector<int64_t> arg;
  Shape out = max_shape();  // a symbolic dim pads past its value (its extent grows by the same amounts)
  bool any = false, neg = false;
  for (size_t i = 0; i < p.size(); i++) {
    arg.push_back(p[i].first);
    arg.push_back(p[i].second);
    any |= p[i].first != 0 || p[i].second != 0;
    neg |= p[i].first < 0 || p[i].second < 0;
    if (__builtin_add_overflow(out[i], p[i].first, &out[i]) || __builtin_add_overflow(out[i], p[i].second, &out[i]))
      throw Error("[pad] padding dim " + std::to_string(i) + " of shape " + shape_str(shape()) + " by (" +
                  std::to_string(p[i].first) + ", " + std::to_string(p[i].second) + ") overflows 64 bits");
  }
  if (neg) {  // negative padding shrinks
    std::vector<std::pair<int64_t, int64_t>> sh, pp;
    for (size_t i = 0; i < p.size(); i++) {
      sh.push_back({std::max<int64_t>(0, -p[i].first), shape()[i] - std::max<int64_t>(0, -p[i].second)});
      pp.push_back({std::max<int64_t>(0, p[i].first), std::max<int64_t>(0, p[i].second)});
    }
    return shrink(sh).pad(pp, value);
  }
  if (!any) return *this;
  Tensor t = mov(Ops::PAD, std::move(arg), out);
  if (value == 0) return t;
  // padded area = value: where(mask, x, value) with the mask made by padding ones.
  Tensor mask(UOp::make(Ops::PAD, dtypes::bool_, {Tensor::full(sym_shape(), 1, dtypes::bool_, device()).uop()}, t.uop()->arg),
                out, device());
  return mask.where(t, Tensor(value).cast(dtype()));
}

Tensor Tensor::shrink(const std::vector<std::pair<int64_t, int64_t>>& s, CallLoc loc) const {
  CallSite site(loc);
  if (int64_t(s.size()) != ndim())
    throw Error("[shrink] " + std::to_string(s.size()) + " ranges for shape " + shape_str(shape()));
  std::vector<int64_t> arg;
  Shape out;
  bool ident = true;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i].first < 0 || s[i].second > shape()[i] || s[i].first > s[i].second)
      throw Error("[shrink] range [" + std::to_string(s[i].first) + ", " + std::to_string(s[i].second) +
                  ") is out of bounds for dim " + std::to_string(i) + " of shape " + shape_str(shape()));
    arg.push_back(s[i].first);
    arg.push_back(s[i].second);
    out.push_back(s[i].second - s[i].first);
    ident &= s[i].first == 0 && s[i].second == shape()[i];
  }
  if (ident) return *this;
  return mov(Ops::SHRINK, std::move(arg), out);
}

// ---------------------------------------------------------------- symbolic shapes

namespace {
bool all_int(const SymShape& s) {
  for (const sint& d : s)
    if (!d.is_int()) return false;
  return true;
}
// Where each symbolic dim sits in the layout at the largest dims: (elements before it, its expression).
std::vector<std::pair<int64_t, const UOp*>> sym_places(const SymShape& s) {
  std::vector<std::pair<int64_t, const UOp*>> r;
  int64_t before = 1;
  for (const sint& d : s) {
    if (!d.is_int()) r.emplace_back(before, d.uop().get());
    before *= d.max();
  }
  return r;
}
UOpRef sym_node(Ops op, const Tensor& x, const std::vector<sint>& entries, std::vector<int64_t> arg) {
  std::vector<UOpRef> src{x.uop()};
  for (const sint& e : entries) src.push_back(e.uop());
  return UOp::make(op, x.dtype(), src, std::move(arg));
}
}  // namespace

Tensor Tensor::reshape(const SymShape& s) const {
  if (all_int(s) && !is_symbolic()) {
    Shape c;
    for (const sint& d : s) c.push_back(d.value());
    return reshape(c);
  }
  SymShape in = sym_shape();
  Shape mx;
  for (const sint& d : s) {
    if (d.min() < 0)
      throw Error("[reshape] negative dimension in " + shape_str(s) + (d.is_int() && d.value() == -1 ? " (no -1 with symbolic dims)" : ""));
    mx.push_back(d.max());
  }
  if (numel_of(mx) != numel_of(max_shape()) || sym_places(in) != sym_places(s))
    throw Error("[reshape] cannot reshape " + shape_str(in) + " into " + shape_str(s) +
                ": a symbolic dim stays a dim of its own, with the same number of elements before it");
  if (s == in) return *this;
  return Tensor(sym_node(Ops::RESHAPE, *this, s, std::vector<int64_t>(mx)), mx, im().device);
}

Tensor Tensor::expand(const SymShape& s_in) const {
  SymShape s = s_in;
  if (all_int(s) && !is_symbolic()) {
    Shape c;
    for (const sint& d : s) c.push_back(d.value());
    return expand(c);
  }
  SymShape in = sym_shape();
  if (s.size() < in.size()) throw Error("[expand] cannot expand " + shape_str(in) + " to fewer dims " + shape_str(s));
  Tensor t = *this;
  if (s.size() > in.size()) {
    SymShape p(s.size() - in.size(), sint(1));
    p.insert(p.end(), in.begin(), in.end());
    t = reshape(p);
  }
  SymShape tin = t.sym_shape();
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i].is_int() && s[i].value() == -1) s[i] = tin[i];
    if (!(tin[i] == s[i]) && !(tin[i].is_int() && tin[i].value() == 1))
      throw Error("[expand] cannot expand " + shape_str(in) + " to " + shape_str(s));
  }
  if (s == tin) return t;
  Shape mx;
  for (const sint& d : s) mx.push_back(d.max());
  (void)numel_of(mx);
  return Tensor(sym_node(Ops::EXPAND, t, s, std::vector<int64_t>(mx)), mx, im().device);
}

Tensor Tensor::shrink(const std::vector<std::pair<sint, sint>>& s) const {
  bool ints = !is_symbolic();
  for (auto& [b, e] : s) ints &= b.is_int() && e.is_int();
  if (ints) {
    std::vector<std::pair<int64_t, int64_t>> c;
    for (auto& [b, e] : s) c.emplace_back(b.value(), e.value());
    return shrink(c);
  }
  SymShape in = sym_shape();
  if (s.size() != in.size()) throw Error("[shrink] " + std::to_string(s.size()) + " ranges for shape " + shape_str(in));
  std::vector<sint> entries;
  std::vector<int64_t> arg;
  Shape mx;
  bool ident = true;
  for (size_t i = 0; i < s.size(); i++) {
    const auto& [b, e] = s[i];
    sint len = e - b, rest = in[i] - e;
    if (b.min() < 0 || len.min() < 0 || rest.min() < 0)
      throw Error("[shrink] range [" + b.str() + ", " + e.str() + ") is out of bounds for dim " + std::to_string(i) +
                  " of shape " + shape_str(in) + " for some values of its variables");
    entries.push_back(b);
    entries.push_back(e);
    arg.push_back(0);
    arg.push_back(len.max());
    mx.push_back(len.max());
    ident &= b.is_int() && b.value() == 0 && e == in[i];
  }
  if (ident) return *this;
  return Tensor(sym_node(Ops::SHRINK, *this, entries, std::move(arg)), mx, im().device);
}

Tensor Tensor::pad(const std::vector<std::pair<sint, sint>>& p, double value) const {
  bool ints = true;
  for (auto& [b, e] : p) ints &= b.is_int() && e.is_int();
  if (ints) {
    std::vector<std::pair<int64_t, int64_t>> c;
    for (auto& [b, e] : p) c.emplace_back(b.value(), e.value());
    return pad(c, value);
  }
  SymShape in = sym_shape();
  if (p.size() != in.size()) throw Error("[pad] " + std::to_string(p.size()) + " pairs for shape " + shape_str(in));
  std::vector<sint> entries;
  std::vector<int64_t> arg, tail;
  Shape mx;
  for (size_t i = 0; i < p.size(); i++) {
    const auto& [b, e] = p[i];
    if (b.min() < 0 || e.min() < 0)
      throw Error("[pad] symbolic amounts must not be negative: (" + b.str() + ", " + e.str() + ") for dim " + std::to_string(i));
    entries.push_back(b);
    entries.push_back(e);
    arg.push_back(b.max());
    arg.push_back(e.max());
    tail.push_back(max_shape()[i]);
    mx.push_back(max_shape()[i] + b.max() + e.max());
  }
  arg.insert(arg.end(), tail.begin(), tail.end());
  Tensor t(sym_node(Ops::PAD, *this, entries, arg), mx, im().device);
  if (value == 0) return t;
  Tensor ones = Tensor::full(in, 1, dtypes::bool_, device());
  Tensor mask(sym_node(Ops::PAD, ones, entries, arg), mx, im().device);
  return mask.where(t, Tensor(value).cast(dtype()));
}

Tensor Tensor::full(const SymShape& shape, double value, DType dtype, const std::string& device) {
  if (all_int(shape)) {
    Shape c;
    for (const sint& d : shape) c.push_back(d.value());
    return full(c, value, dtype, device);
  }
  for (const sint& d : shape)
    if (d.min() < 0) throw Error("[full] negative dimension in shape " + shape_str(shape));
  Tensor c(const_uop(dtypes::strong(dtype), value), {}, dev_or_default(device));
  return c.reshape(Shape(shape.size(), 1)).expand(shape);
}

Tensor Tensor::from_sint(const sint& v, DType dtype, const std::string& device) {
  if (!dtypes::is_int(dtype) && !dtypes::is_float(dtype)) throw Error("[from_sint] needs an int or float dtype, got " + dtype.name());
  if (v.is_int()) return full(Shape{}, double(v.value()), dtype, device);
  return Tensor(v.uop()->cast(dtypes::strong(dtype)), {}, dev_or_default(device));
}

Tensor Tensor::flip(std::vector<int64_t> axes, CallLoc loc) const {
  CallSite site(loc);
  std::vector<int64_t> flags(static_cast<size_t>(ndim()), 0);
  for (int64_t a : axes) {
    int64_t k = norm_axis(a, "flip");
    if (ndim() == 0) continue;  // a 0-d tensor flips along its one axis (0 or -1) to itself
    if (flags[size_t(k)])
      throw Error("[flip] axis " + std::to_string(a) + " is repeated in the axes for shape " + shape_str(sym_shape()) +
                  " (each axis at most once, as torch)");
    flags[size_t(k)] = 1;
  }
  if (std::all_of(flags.begin(), flags.end(), [](int64_t f) { return f == 0; })) return *this;
  return mov(Ops::FLIP, std::move(flags), shape());
}

Tensor Tensor::transpose(int64_t a, int64_t b, CallLoc loc) const {
  CallSite site(loc);
  if (ndim() < 2 && a == 1 && b == 0) return *this;
  a = norm_axis(a, "transpose");
  b = norm_axis(b, "transpose");
  if (ndim() == 0) return *this;  // a 0-d tensor's one axis swapped with itself
  std::vector<int64_t> order(static_cast<size_t>(ndim()));
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[size_t(a)], order[size_t(b)]);
  return permute(order);
}

Tensor Tensor::flatten(int64_t start, int64_t end, CallLoc loc) const {
  CallSite site(loc);
  if (ndim() == 0) return reshape({1});
  start = norm_axis(start, "flatten");
  end = norm_axis(end, "flatten");
  Shape s(shape().begin(), shape().begin() + start);
  int64_t m = 1;
  for (int64_t i = start; i <= end; i++) m *= shape()[size_t(i)];
  s.push_back(m);
  s.insert(s.end(), shape().begin() + end + 1, shape().end());
  return reshape(s);
}

Tensor Tensor::squeeze(std::optional<int64_t> dim, CallLoc loc) const {
  CallSite site(loc);
  Shape s;
  if (!dim) {
    for (int64_t d : shape())
      if (d != 1) s.push_back(d);
    return reshape(s);
  }
  int64_t a = norm_axis(*dim, "squeeze");  // on a 0-d tensor, 0 or -1 (as torch)
  if (ndim() == 0) return *this;
  if (shape()[size_t(a)] != 1) return *this;
  s = shape();
  s.erase(s.begin() + a);
  return reshape(s);
}

Tensor Tensor::unsqueeze(int64_t dim, CallLoc loc) const {
  CallSite site(loc);
  int64_t n = ndim() + 1;
  if (dim < -n || dim >= n) throw Error("[unsqueeze] dim " + std::to_string(dim) + " out of range for " + shape_str(shape()));
  if (dim < 0) dim += n;
  Shape s = shape();
  s.insert(s.begin() + dim, 1);
  return reshape(s);
}

Tensor Tensor::slice(const std::vector<Slice>& sl, CallLoc loc) const {
  CallSite site(loc);
  if (int64_t(sl.size()) > ndim())
    throw Error("[slice] " + std::to_string(sl.size()) + " slices for shape " + shape_str(shape()));
  Tensor t = *this;
  for (size_t i = 0; i < sl.size(); i++) {
    const Slice& s = sl[i];
    if (s.step == 0) throw Error("[slice] step must not be 0");
    auto [lo, hi, step, len] = detail::slice_bounds(s, shape()[i]);
    std::vector<std::pair<int64_t, int64_t>> r;
    for (int64_t d = 0; d < t.ndim(); d++) r.push_back({0, t.shape()[size_t(d)]});
    r[i] = {lo, hi};
    t = t.shrink(r);
    if (s.step < 0) t = t.flip({int64_t(i)});
    if (step > 1 && len > 0) {
      // take every step-th element: pad to len*step, reshape (len, step), keep column 0
      int64_t cur = t.shape()[i];
      std::vector<std::pair<int64_t, int64_t>> p(size_t(t.ndim()), {0, 0});
      p[i] = {0, len * step - cur};
      t = t.pad(p);
      Shape s2 = t.shape();
      s2[i] = len;
      s2.insert(s2.begin() + int64_t(i) + 1, step);
      t = t.reshape(s2);
      std::vector<std::pair<int64_t, int64_t>> r2;
      for (int64_t d = 0; d < t.ndim(); d++) r2.push_back({0, t.shape()[size_t(d)]});
      r2[i + 1] = {0, 1};
      t = t.shrink(r2);
      Shape s3 = t.shape();
      s3.erase(s3.begin() + int64_t(i) + 1);
      t = t.reshape(s3);
    }
  }
  return t;
}

// ---------------------------------------------------------------- reductions

Tensor Tensor::reduce(Ops op, std::vector<int64_t> axes, bool keepdim, const char* name) const {
  if (ndim() == 0) {  // a 0-d tensor's one axis (0 or -1, as torch) reduces a single element: the tensor itself
    for (int64_t a : axes) (void)norm_axis(a, name);
    return *this;
  }
  if (axes.empty())
    for (int64_t i = 0; i < ndim(); i++) axes.push_back(i);
  std::vector<bool> red(size_t(ndim()), false);
  for (auto& a : axes) red[size_t(a = norm_axis(a, name))] = true;
  axes.clear();
  for (int64_t i = 0; i < ndim(); i++)
    if (red[size_t(i)]) axes.push_back(i);
  Shape kept = max_shape();
  SymShape squeezed, in = sym_shape();
  for (int64_t i = 0; i < ndim(); i++) {
    if (red[size_t(i)]) kept[size_t(i)] = 1;
    else squeezed.push_back(in[size_t(i)]);
  }
  for (int64_t a : axes)
    if (in[size_t(a)].max() == 0 && (op == Ops::MAX))
      throw Error(std::string("[") + name + "] cannot reduce an empty axis of shape " + shape_str(in));
  Tensor r = axes.empty() ? *this
                          : Tensor(UOp::make(Ops::REDUCE_AXIS, dtype(), {uop()}, ReduceArg{op, axes}), kept, device());
  return keepdim ? r : r.reshape(squeezed);
}

namespace {
DType acc_dtype(DType d) {
  if (dtypes::is_bool(d) || dtypes::is_int(d)) return dtypes::is_unsigned(d) && d.scalar == Scalar::UInt64 ? d : dtypes::int64;
  if (d == dtypes::float16 || d == dtypes::bfloat16 || d.scalar == Scalar::Fp8E4M3 || d.scalar == Scalar::Fp8E5M2)
    return dtypes::float32;
  return dtypes::strong(d);
}
}  // namespace

Tensor Tensor::sum(std::vector<int64_t> axes, bool keepdim, CallLoc loc) const {
  CallSite site(loc);
  DType acc = acc_dtype(dtype());
  Tensor r = cast(acc).reduce(Ops::ADD, std::move(axes), keepdim, "sum");
  return dtypes::is_float(dtype()) ? r.cast(dtypes::strong(dtype())) : r;
}
Tensor Tensor::sum(std::vector<int64_t> axes, bool keepdim, DType dtype, CallLoc loc) const {
  CallSite site(loc);
  return cast(dtype).sum(std::move(axes), keepdim).cast(dtype);
}
Tensor Tensor::prod(std::vector<int64_t> axes, bool keepdim, CallLoc loc) const {
  CallSite site(loc);
  DType acc = acc_dtype(dtype());
  Tensor r = cast(acc).reduce(Ops::MUL, std::move(axes), keepdim, "prod");
  return dtypes::is_float(dtype()) ? r.cast(dtypes::strong(dtype())) : r;
}
Tensor Tensor::prod(std::vector<int64_t> axes, bool keepdim, DType dtype, CallLoc loc) const {
  CallSite site(loc);
  return cast(dtype).prod(std::move(axes), keepdim).cast(dtype);
}
Tensor Tensor::max(std::vector<int64_t> axes, bool keepdim, CallLoc loc) const {
  CallSite site(loc); return reduce(Ops::MAX, std::move(axes), keepdim, "max"); }
Tensor Tensor::min(std::vector<int64_t> axes, bool keepdim, CallLoc loc) const {
  CallSite site(loc);
  if (dtypes::is_bool(dtype())) return logical_not().max(std::move(axes), keepdim).logical_not();
  if (dtypes::is_unsigned(dtype())) {  // ~x reverses the order of unsigned values
    return ~(~*this).max(std::move(axes), keepdim);
  }
  return -(-*this).max(std::move(axes), keepdim);
}
Tensor Tensor::mean(std::vector<int64_t> axes, bool keepdim, CallLoc loc) const {
  CallSite site(loc);
  // The sum stays in float32 for 16-bit floats until divided (70000 float16 ones: 1, not inf / 70000).
  DType out = least_upper_float(dtypes::strong(dtype()));
  Tensor s = detail::to_opmath(*this).sum(axes, keepdim);
  if (is_symbolic() || s.is_symbolic()) {  // the count depends on the variables: a kernel parameter
    if (axes.empty())
      for (int64_t i = 0; i < ndim(); i++) axes.push_back(i);
    sint n = 1;
    for (int64_t a : axes) n = n * sym_shape()[size_t(norm_axis(a, "mean"))];
    return (s / from_sint(n, dtypes::int32, device()).cast(s.dtype())).cast(out);
  }
  int64_t n = numel() == 0 ? 0 : numel() / std::max<int64_t>(1, s.numel());
  return (s / double(n)).cast(out);
}
Tensor Tensor::softmax(int64_t axis, CallLoc loc) const {
  CallSite site(loc);
  // times the sum's reciprocal (one division per row, as torch's CPU kernel), not a division per element; 16-bit
  // floats in float32 (a float16 row of more than 65504 elements would sum to inf)
  DType out = least_upper_float(dtypes::strong(dtype()));
  Tensor x = detail::to_opmath(*this);
  int64_t a = norm_axis(axis, "softmax");
  if (ndim() > 0 && max_shape()[size_t(a)] == 0) return x.cast(out);  // an empty axis: an empty result (torch)
  // x - max is <= 0 (or NaN): the scheduler's bounds stage (src/schedule/bounds.cpp) tells the exp2 decomposition
  Tensor m = (x - x.max(axis, true)).exp();
  return (m * m.sum(axis, true).reciprocal()).cast(out);
}

Tensor Tensor::softmax(int64_t axis, DType dtype, CallLoc loc) const {
  CallSite site(loc);
  return cast(dtype).softmax(axis).cast(dtype);
}

// ---------------------------------------------------------------- realize, read back, devices

Tensor& Tensor::realize(CallLoc loc) {
  CallSite site(loc);
  realize_all({this});
  return *this;
}

namespace {
// One realise at a time in the process: scheduling, running and substituting the results into live tensors (the
// kernels themselves use every core). Recursive: an assign or a host read realises inside it.
std::recursive_mutex g_realize_mu;
}  // namespace

namespace {
// The schedule for the tensors `ts` (those already realised left out), and the map of what each realised node
// becomes; false when there is nothing to do. Under g_realize_mu.
bool schedule_for(const std::vector<Tensor*>& ts, Schedule& s, std::vector<std::pair<const UOp*, UOpRef>>& becomes) {
  std::vector<UOpRef> roots;
  for (Tensor* t : ts) {
    if (t->is_multi()) t->impl()->uop = detail::multi_realize_root(*t);  // a constant there: on every device
    const UOp* u = t->uop().get();
    if (contiguous_buffer(u) || detail::multi_realized(u) || (u->op == Ops::CONST && t->impl()->weak)) continue;
    roots.push_back(t->uop());
  }
  if (roots.empty()) return false;
  if (detail::params_made.load(std::memory_order_relaxed) > 0)  // as_param placeholders exist: none may reach a kernel
    for (const UOp* u : toposort(roots))
      if (u->op == Ops::PARAM)
        throw Error("[realize] the graph holds the function parameter " + std::to_string(std::get<int64_t>(u->arg)) +
                    " (as_param), which has no value: apply the body with call()");
  std::vector<const UOp*> assigns = add_old_readers(roots);
  s = create_schedule(roots);
  std::unordered_set<const UOp*> done;
  for (auto& [a, b] : s.becomes) becomes.emplace_back(a.get(), b), done.insert(a.get());
  // An assign done inside another tensor's graph is done: a handle still holding it reads the written buffer
  // (read again as an ASSIGN, it would write a second time).
  for (const UOp* a : assigns)
    if (!done.count(a)) becomes.emplace_back(a, a->src(0));
  return true;
}
}  // namespace

void Tensor::realize_all(std::vector<Tensor*> ts) {
  std::lock_guard lk(g_realize_mu);
  Schedule s;
  std::vector<std::pair<const UOp*, UOpRef>> becomes;
  if (!schedule_for(ts, s, becomes)) return;
  run_schedule(s);
  replace_realized(becomes);
}

std::pair<Schedule, std::vector<std::pair<std::string, int64_t>>> Tensor::linear_with_vars(const std::vector<Tensor>& others) const {
  std::lock_guard lk(g_realize_mu);
  std::vector<Tensor> hold = {*this};
  hold.insert(hold.end(), others.begin(), others.end());
  std::vector<Tensor*> ts;
  for (Tensor& t : hold) ts.push_back(&t);
  Schedule s;
  std::vector<std::pair<const UOp*, UOpRef>> becomes;
  if (schedule_for(ts, s, becomes)) replace_realized(becomes);  // the tensors now view the schedule's outputs
  auto vars = s.var_vals;
  return {std::move(s), std::move(vars)};
}

Schedule Tensor::schedule_linear(const std::vector<Tensor>& others) const {
  auto [s, vars] = linear_with_vars(others);
  if (!vars.empty())
    throw Error("[schedule_linear] the schedule has bound variables (" + vars[0].first + " = " + std::to_string(vars[0].second) +
                ", ...): use linear_with_vars");
  return std::move(s);
}

void realize_readers_of(const std::vector<const Buffer*>& written) {
  if (written.empty()) return;
  std::lock_guard lk(g_realize_mu);
  std::unordered_set<const Buffer*> w(written.begin(), written.end());
  auto hit = [&](const UOp* b) {
    auto buf = buffer_of(b);
    return buf && w.count(buf.get()) > 0;
  };
  std::vector<UOpRef> roots = live_readers(hit, {}, 0, {});
  if (roots.empty()) return;
  Schedule s = create_schedule(roots);
  run_schedule(s);
  std::vector<std::pair<const UOp*, UOpRef>> becomes;
  for (auto& [a, b] : s.becomes) becomes.emplace_back(a.get(), b);
  replace_realized(becomes);
}

void Tensor::copy_to_host(void* dst, size_t bytes) const {
  std::lock_guard lk(g_realize_mu);
  if (is_multi()) return to(devices()[0]).copy_to_host(dst, bytes);
  Tensor t = *this;
  // A pending assign (t.assign(x), t += x) is realised on the handle itself, which every copy shares: realised
  // only inside the CONTIGUOUS copy below, the handle would keep the ASSIGN and a second read would write again.
  if (t.uop()->op == Ops::ASSIGN) t.realize();
  if (!contiguous_buffer(t.uop().get()) && !get_device(device()).runs_kernels()) t = t.to(default_device());  // DISK views
  if (!contiguous_buffer(t.uop().get())) {
    t = Tensor(UOp::make(Ops::CONTIGUOUS, t.dtype(), {t.uop()}), t.max_shape(), t.device());
    t.realize();
  }
  auto buf = buffer_of(contiguous_buffer(t.uop().get()));
  if (!buf) throw Error("[to_vector] internal: no buffer after realize");
  jit_note_host_read(buf.get());
  if (t.is_symbolic()) {  // the buffer is laid out at the largest dims: gather the valid prefix of each
    const Shape& mx = t.max_shape();
    Shape now;
    for (const sint& d : t.sym_shape()) now.push_back(d.value());
    size_t isz = size_t(t.dtype().itemsize()), n = read_count();
    if (bytes != n * isz)
      throw Error("[to_vector] " + std::to_string(bytes) + " bytes asked, the tensor has " + std::to_string(n * isz));
    std::vector<uint8_t> all(buf->nbytes());
    if (!all.empty()) buf->copyout(all.data(), all.size());
    auto* out = static_cast<uint8_t*>(dst);
    std::vector<int64_t> idx(now.size(), 0);
    for (size_t k = 0; k < n; k++) {
      size_t off = 0;
      for (size_t i = 0; i < mx.size(); i++) off = off * size_t(mx[i]) + size_t(idx[i]);
      std::memcpy(out + k * isz, all.data() + off * isz, isz);
      for (size_t i = now.size(); i-- > 0;) {
        if (++idx[i] < now[i]) break;
        idx[i] = 0;
      }
    }
    return;
  }
  if (bytes != buf->nbytes())
    throw Error("[to_vector] " + std::to_string(bytes) + " bytes asked, buffer has " + std::to_string(buf->nbytes()));
  if (bytes > 0) buf->copyout(dst, bytes);  // an empty tensor has nothing to copy (dst may be null)
}

std::vector<double> Tensor::to_doubles() const {
  DType d = dtype();
  std::vector<double> out;
  auto conv = [&](auto tag) {
    using T = decltype(tag);
    for (auto v : to_vector<T>()) out.push_back(double(v));
  };
  switch (dtypes::strong(d).scalar) {
    case Scalar::Bool: conv(bool{}); break;
    case Scalar::Int8: conv(int8_t{}); break;
    case Scalar::UInt8: conv(uint8_t{}); break;
    case Scalar::Int16: conv(int16_t{}); break;
    case Scalar::UInt16: conv(uint16_t{}); break;
    case Scalar::Int32: conv(int32_t{}); break;
    case Scalar::UInt32: conv(uint32_t{}); break;
    case Scalar::Int64: conv(int64_t{}); break;
    case Scalar::UInt64: conv(uint64_t{}); break;
    case Scalar::Float32: conv(float{}); break;
    case Scalar::Float64: conv(double{}); break;
    default: return cast(dtypes::float64).to_doubles();
  }
  return out;
}

Tensor& Tensor::replace(const Tensor& x) {
  if (x.max_shape() != max_shape())
    throw Error("[replace] shapes differ: this is " + shape_str(max_shape()) + ", the replacement " + shape_str(x.max_shape()));
  std::lock_guard lk(g_realize_mu);
  TensorImpl& me = im();
  me.uop = x.uop();
  me.device = x.device();
  me.weak = x.impl()->weak;
  return *this;
}
Tensor& Tensor::to_(const std::string& device) { return replace(to(device)); }

std::vector<uint8_t> Tensor::data(CallLoc loc) const {
  CallSite site(loc);
  std::vector<uint8_t> out(read_count() * size_t(dtype().itemsize()));
  copy_to_host(out.data(), out.size());
  return out;
}

Tensor Tensor::to(const std::string& dev, CallLoc loc) const {
  CallSite site(loc);
  if (is_multi_device(dev) || is_multi()) return detail::multi_to(*this, dev);  // src/tensor/multi.cpp
  Device& d = get_device(dev);  // throws for unknown names
  Device& from = get_device(device());
  if (d.name() == from.name()) return *this;
  if (!d.runs_kernels()) throw Error("[to] cannot copy into " + d.name() + ": its tensors are read-only views of a mapped file");
  UOpRef devu = UOp::make(Ops::DEVICE, dtypes::void_, {}, d.name());
  if (from.runs_kernels() || contiguous_buffer(uop().get()))
    return Tensor(UOp::make(Ops::COPY, dtype(), {contiguous().uop(), devu}), shape(), d.name());
  // A view of a storage-only buffer (DISK): copy the whole buffer, then apply the same movement ops on `d`.
  std::vector<const UOp*> chain;
  const UOp* u = uop().get();
  while (is_movement(u->op) || u->op == Ops::DETACH) chain.push_back(u), u = u->src(0);
  if (u->op != Ops::BUFFER)
    throw Error("[to] this tensor on " + from.name() + " is computed (" + op_name(u->op) + "), and kernels cannot run on " +
                from.name() + ": move the loaded tensor with .to(\"" + d.name() + "\") before computing with it");
  UOpRef r = UOp::make(Ops::COPY, u->dtype, {UOpRef(u), devu});
  for (size_t i = chain.size(); i-- > 0;) {
    std::vector<UOpRef> src(chain[i]->src().begin(), chain[i]->src().end());
    src[0] = r;
    r = chain[i]->replace_src(src);
  }
  return Tensor(r, shape(), d.name());
}

Tensor& Tensor::assign(const Tensor& x, CallLoc loc) {
  CallSite site(loc);
  std::lock_guard lk(g_realize_mu);
  if (x.shape() != shape())
    throw Error("[assign] shape " + shape_str(x.shape()) + " does not match target shape " + shape_str(shape()));
  if (is_multi() || x.is_multi()) {  // src/tensor/multi.cpp
    UOpRef a = detail::multi_assign_uop(*this, x);
    im().uop = a;
    return *this;
  }
  // A view of a buffer that addresses each element once (a shrink, reshape, permute or flip of it, as a KV cache's
  // rows `cache.shrink(rows)`) is written in place: the buffer's other elements keep their values, and every tensor
  // on the buffer reads the write once this assign is realised.
  if (!contiguous_buffer(uop().get()) && assign_buffer(uop().get())) {
    Tensor v = x.cast(dtype());
    impl_->uop = UOp::make(Ops::ASSIGN, dtype(), {uop(), v.uop()});
    return *this;
  }
  if (!contiguous_buffer(uop().get())) realize();
  if (!contiguous_buffer(uop().get())) {  // another view: materialise first
    Tensor c = contiguous();
    c.realize();
    im().uop = c.uop();
  }
  // Copy on write: another tensor holding the same buffer (two equal graphs realised to one buffer) keeps its values.
  const UOp* buf = contiguous_buffer(uop().get());
  bool shared = false;
  {
    std::lock_guard lk(g_live_mu);
    for (auto& w : g_live)
      if (auto p = w.lock())
        if (p != impl_ && p->uop && contiguous_buffer(p->uop.get()) == buf) shared = true;
  }
  if (shared) {
    Tensor c(UOp::make(Ops::CONTIGUOUS, dtype(), {UOp::make(Ops::DETACH, dtype(), {uop()})}, g_next_contiguous++), shape(),
             device());
    c.realize();
    im().uop = c.uop();
  }
  Tensor v = x.cast(dtype());
  im().uop = UOp::make(Ops::ASSIGN, dtype(), {uop(), v.uop()});
  return *this;
}

}  // namespace tg

namespace tg {

// ---------------------------------------------------------------- autograd entry points

namespace {
// Live leaves that require gradients and appear in the graph under root.
std::vector<std::shared_ptr<TensorImpl>> grad_leaves(const UOp* root) {
  std::unordered_set<const UOp*> in_graph;  // every node gradients can reach (DETACH stops them)
  std::vector<const UOp*> st{root};
  while (!st.empty()) {
    const UOp* u = st.back();
    st.pop_back();
    if (!in_graph.insert(u).second || u->op == Ops::DETACH) continue;
    for (auto& c : u->src()) st.push_back(c.get());
  }
  std::vector<std::shared_ptr<TensorImpl>> out;
  std::lock_guard lk(g_live_mu);
  for (auto& w : g_live)
    if (auto p = w.lock())
      if (p->requires_grad && in_graph.count(p->uop.get())) out.push_back(std::move(p));
  return out;
}
}  // namespace

bool Tensor::requires_grad() const {
  if (im().requires_grad) return true;
  if (contiguous_buffer(uop().get())) return false;
  return !grad_leaves(uop().get()).empty();
}

void Tensor::backward(BackwardOptions opts) {
  if (numel() != 1) throw Error("[backward] needs a scalar, got shape " + shape_str(shape()) + "; pass a seed gradient");
  backward(Tensor::ones(shape(), dtype(), device()), opts);
}

void Tensor::backward(const Tensor& seed, BackwardOptions opts) {
  TensorImpl& me = im();
  if (!me.retain_graph)
    throw Error("[backward] this tensor's gradients were already added to its leaves by an earlier backward(); a second "
                "one would add them again (torch raises here too). Pass {.retain_graph = true} to the first call to "
                "accumulate twice, or compute the tensor again");
  me.retain_graph = opts.retain_graph;
  auto leaves = grad_leaves(uop().get());
  if (leaves.empty()) throw Error("[backward] no tensor in this graph requires a gradient");
  std::vector<Tensor> wrt;
  for (auto& l : leaves) {
    Tensor t;
    t.impl_ = l;
    wrt.push_back(t);
  }
  auto g = gradient(wrt, &seed);
  for (size_t i = 0; i < leaves.size(); i++) {
    Tensor gi = g[i].cast(wrt[i].dtype());
    if (leaves[i]->grad) {  // accumulate across calls
      Tensor old;
      old.impl_ = leaves[i]->grad;
      gi = old + gi;
    }
    leaves[i]->grad = gi.impl_;
  }
}

}  // namespace tg

namespace tg {

// ---------------------------------------------------------------- compound assignment

namespace {
// t op= x: the result keeps t's shape and dtype; a realised buffer is written with assign (every handle on the
// buffer sees it), a lazy tensor's shared impl takes the new graph (every copy of the handle sees it).
Tensor& in_place(Tensor& t, const Tensor& r, const char* op) {
  const std::string name = std::string("[") + op + "] ";
  if (t.impl()->requires_grad && !NoGrad::active())
    throw Error(name + "a tensor that requires grad cannot be updated in place; use `t = t " + std::string(op, 1) +
                " x`, or wrap the update in tg::NoGrad");
  if (r.shape() != t.shape())
    throw Error(name + "the operand broadcasts the target " + shape_str(t.shape()) + " to " + shape_str(r.shape()) +
                ": an in-place op keeps the target's shape");
  DType own = dtypes::strong(t.dtype()), got = dtypes::strong(r.dtype());
  if ((dtypes::is_float(got) && !dtypes::is_float(own)) || (dtypes::is_int(got) && dtypes::is_bool(own)))
    throw Error(name + "the result is " + got.name() + " and cannot be stored in this " + own.name() +
                " tensor; cast the target first");
  if (contiguous_buffer(t.uop().get())) return t.assign(r);
  t.impl()->uop = r.cast(t.dtype()).uop();
  return t;
}
}  // namespace

Tensor& Tensor::operator+=(const Tensor& x) { return in_place(*this, *this + x, "+="); }
Tensor& Tensor::operator-=(const Tensor& x) { return in_place(*this, *this - x, "-="); }
Tensor& Tensor::operator*=(const Tensor& x) { return in_place(*this, *this * x, "*="); }
Tensor& Tensor::operator/=(const Tensor& x) { return in_place(*this, *this / x, "/="); }

}  // namespace tg

namespace tg::et {

Tensor binary(Op o, const Tensor& a, const Tensor& b) {
  switch (o) {
    case Op::Add: return a.alu(Ops::ADD, b);
    case Op::Sub: return a.alu(Ops::ADD, b.neg());
    case Op::Mul: return a.alu(Ops::MUL, b);
    case Op::Div: return a.div(b);
    case Op::Mod: return a.mod(b);
    case Op::And: return a.alu(Ops::AND, b);
    case Op::Or: return a.alu(Ops::OR, b);
    case Op::Xor: return a.alu(Ops::XOR, b);
    case Op::Shl: return a.alu(Ops::SHL, b);
    case Op::Shr: return a.alu(Ops::SHR, b);
    case Op::Lt: return a.alu(Ops::CMPLT, b);
    case Op::Gt: return b.alu(Ops::CMPLT, a);             // a > b is b < a
    case Op::Le: return b.alu(Ops::CMPLT, a).logical_not();  // a <= b is !(b < a)
    case Op::Ge: return a.alu(Ops::CMPLT, b).logical_not();  // a >= b is !(a < b)
    case Op::Eq: return a.alu(Ops::CMPEQ, b);
    case Op::Ne: return a.alu(Ops::CMPNE, b);
    default: break;
  }
  throw Error("[tensor] not a binary operator");
}

Tensor unary(Op o, const Tensor& a) {
  if (o == Op::Neg) return a.neg();
  if (o == Op::Invert) return a.dtype() == dtypes::bool_ ? a.logical_not() : a.alu(Ops::XOR, -1);
  throw Error("[tensor] not a unary operator");
}

void check_kind(const Tensor& t, Kind k) {
  if (!t.defined()) return;
  DType d = t.dtype();
  bool ok = k == Kind::Float ? dtypes::is_float(d) : k == Kind::Int ? dtypes::is_int(d) : dtypes::is_bool(d);
  if (!ok)
    throw Error(std::string("[TensorOf] a ") + (k == Kind::Float ? "float" : k == Kind::Int ? "int" : "bool") +
                " tensor was expected, got " + d.name());
}

}  // namespace tg::et
