// UOp interning (weak, lock-sharded), hashing, bounds, constants.
#include "tg/uop.hpp"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include <range/v3/range/conversion.hpp>
#include <range/v3/view/chunk.hpp>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/transform.hpp>
#include <range/v3/view/zip.hpp>

#include "tg/error.hpp"
#include "spec_pause.hpp"
#include "tg/symbolic.hpp"

namespace tg {

const char* op_name(Ops op) {
  static constexpr const char* names[] = {
#define TG_X(name) #name,
      TG_OPS(TG_X)
#undef TG_X
  };
  return names[int(op)];
}

// ---------------------------------------------------------------- args

bool arg_equal(const Arg& a, const Arg& b) {
  if (a.index() != b.index()) return false;
  if (auto* da = std::get_if<double>(&a)) return std::bit_cast<uint64_t>(*da) == std::bit_cast<uint64_t>(std::get<double>(b));
  return a == b;
}

namespace {

// Stable byte encoding of an argument, fed to the hashes.
struct ArgHasher {
  XXH3_state_t* st;
  void bytes(const void* p, size_t n) { XXH3_64bits_update(st, p, n); }
  void i64(int64_t v) { bytes(&v, sizeof v); }
  void operator()(std::monostate) {}
  void operator()(int64_t v) { i64(v); }
  void operator()(double v) { i64(std::bit_cast<int64_t>(v)); }
  void operator()(const std::string& s) { i64(int64_t(s.size())); bytes(s.data(), s.size()); }
  void operator()(const std::vector<int64_t>& v) { i64(int64_t(v.size())); bytes(v.data(), v.size() * 8); }
  void operator()(const ReduceArg& r) { i64(int64_t(r.op)); (*this)(r.axes); }
  void operator()(const VarArg& v) { (*this)(v.name); i64(v.min); i64(v.max); }
};

uint64_t dtype_word(DType d) {
  return uint64_t(d.scalar) | uint64_t(d.count) << 8 | uint64_t(d.ptr) << 24 | uint64_t(d.addr) << 32;
}

uint64_t arg_hash(const Arg& a) {
  if (std::holds_alternative<std::monostate>(a)) return 0;
  if (auto* v = std::get_if<int64_t>(&a)) return uint64_t(*v) * 0x9E3779B97F4A7C15ull + 1;
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  ArgHasher h{&st};
  h.i64(int64_t(a.index()));
  std::visit(h, a);
  return XXH3_64bits_digest(&st);
}

uint64_t node_hash(Ops op, DType dtype, const Arg& arg, std::span<const UOpRef> src) {
  uint64_t buf[8];
  size_t n = 0;
  buf[n++] = uint64_t(op) | dtype_word(dtype) << 8;
  buf[n++] = uint64_t(dtype.size);
  buf[n++] = arg_hash(arg);
  XXH3_state_t st;
  bool streaming = src.size() > 5;
  if (!streaming) {
    for (auto& s : src) buf[n++] = s->hash;
    return XXH3_64bits(buf, n * 8);
  }
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, buf, n * 8);
  for (auto& s : src) XXH3_64bits_update(&st, &s->hash, 8);
  return XXH3_64bits_digest(&st);
}

// ---------------------------------------------------------------- bounds

using i128 = __int128;

Bounds full_range(DType d) {
  if (d.ptr || d.count != 1) return {0, 0, false};
  if (d.scalar == Scalar::Bool) return {0, 1, true};
  if (!dtypes::is_int(d) || d.scalar == Scalar::UInt64) return {0, 0, false};
  return {dtypes::min_int(d), dtypes::max_int(d), true};
}

Bounds clamp_to(DType d, i128 lo, i128 hi) {
  Bounds f = full_range(d);
  if (!f.known) return f;
  if (lo < f.min || hi > f.max) return f;  // may wrap: anything is possible
  return {int64_t(lo), int64_t(hi), true};
}

Bounds compute_bounds(Ops op, DType dtype, std::span<const UOpRef> src, const Arg& arg) {
  Bounds full = full_range(dtype);
  if (!full.known) return full;
  auto b = [&](size_t i) -> const Bounds& { return src[i]->bounds(); };
  auto all_known = [&]() {
    for (auto& s : src) if (!s->bounds().known) return false;
    return true;
  };
  switch (op) {
    case Ops::CONST: {
      int64_t v = std::get<int64_t>(arg);
      return {v, v, true};
    }
    case Ops::DEFINE_VAR: {
      auto& v = std::get<VarArg>(arg);
      return {v.min, v.max, true};
    }
    case Ops::BIND: return src.empty() ? full : b(0);
    case Ops::RANGE: case Ops::SPECIAL:
      if (src.size() >= 1 && b(0).known) return {0, std::max<int64_t>(0, b(0).max - 1), true};
      return full;
    default: break;
  }
  if (!is_alu(op) && op != Ops::CAST) return full;
  if (!all_known()) return full;
  switch (op) {
    case Ops::ADD: return clamp_to(dtype, i128(b(0).min) + b(1).min, i128(b(0).max) + b(1).max);
    case Ops::SUB: return clamp_to(dtype, i128(b(0).min) - b(1).max, i128(b(0).max) - b(1).min);
    case Ops::NEG: return clamp_to(dtype, -i128(b(0).max), -i128(b(0).min));
    case Ops::MUL: {
      i128 c[4] = {i128(b(0).min) * b(1).min, i128(b(0).min) * b(1).max, i128(b(0).max) * b(1).min,
                   i128(b(0).max) * b(1).max};
      return clamp_to(dtype, *std::min_element(c, c + 4), *std::max_element(c, c + 4));
    }
    case Ops::IDIV: {
      if (b(1).min > 0 || b(1).max < 0) {
        i128 c[4] = {i128(b(0).min) / b(1).min, i128(b(0).min) / b(1).max, i128(b(0).max) / b(1).min,
                     i128(b(0).max) / b(1).max};
        return clamp_to(dtype, *std::min_element(c, c + 4), *std::max_element(c, c + 4));
      }
      return full;
    }
    case Ops::MOD: {
      if (b(1).min > 0) {
        i128 m = i128(b(1).max) - 1;
        if (b(0).min >= 0) return clamp_to(dtype, 0, std::min<i128>(m, b(0).max));
        if (b(0).max <= 0) return clamp_to(dtype, std::max<i128>(-m, b(0).min), 0);
        return clamp_to(dtype, -m, m);
      }
      return full;
    }
    case Ops::MAX: return {std::max(b(0).min, b(1).min), std::max(b(0).max, b(1).max), true};
    case Ops::CMPLT:
      if (b(0).max < b(1).min) return {1, 1, true};
      if (b(0).min >= b(1).max) return {0, 0, true};
      return {0, 1, true};
    case Ops::CMPNE: case Ops::CMPEQ: {
      bool never_eq = b(0).max < b(1).min || b(0).min > b(1).max;
      bool always_eq = b(0).min == b(0).max && b(1).min == b(1).max && b(0).min == b(1).min;
      int64_t ne_lo = never_eq ? 1 : 0, ne_hi = always_eq ? 0 : 1;
      return op == Ops::CMPNE ? Bounds{ne_lo, ne_hi, true} : Bounds{1 - ne_hi, 1 - ne_lo, true};
    }
    case Ops::WHERE:
      if (b(0).min == 1) return b(1);
      if (b(0).max == 0) return b(2);
      return {std::min(b(1).min, b(2).min), std::max(b(1).max, b(2).max), true};
    case Ops::AND:
      if (b(0).min >= 0 && b(1).min >= 0) return {0, std::min(b(0).max, b(1).max), true};
      if (b(1).min >= 0) return {0, b(1).max, true};  // x & m, m >= 0: the sign bit clear, at most m (any x)
      if (b(0).min >= 0) return {0, b(0).max, true};
      return full;
    case Ops::OR: case Ops::XOR:
      if (b(0).min >= 0 && b(1).min >= 0) {
        uint64_t m = uint64_t(std::max(b(0).max, b(1).max));
        uint64_t hi = m == 0 ? 0 : (std::bit_ceil(m + 1) - 1);
        return clamp_to(dtype, op == Ops::OR ? std::max(b(0).min, b(1).min) : 0, i128(hi));
      }
      return full;
    case Ops::SHL:
      if (b(1).min == b(1).max && b(1).min >= 0 && b(1).min < 63)
        return clamp_to(dtype, i128(b(0).min) << b(1).min, i128(b(0).max) << b(1).min);
      return full;
    case Ops::SHR:
      if (b(0).min >= 0 && b(1).min >= 0 && b(1).max < 64) return {b(0).min >> b(1).max, b(0).max >> b(1).min, true};
      // signed (arithmetic, monotone in the value): x >> 24 of any int32 is a signed byte
      if (!dtypes::is_unsigned(dtype) && b(0).known && b(1).known && b(1).min >= 0 && b(1).max < int64_t(dtype.bitsize()))
        return {std::min(b(0).min >> b(1).min, b(0).min >> b(1).max), std::max(b(0).max >> b(1).min, b(0).max >> b(1).max), true};
      return full;
    case Ops::MULACC: {
      i128 c[4] = {i128(b(0).min) * b(1).min, i128(b(0).min) * b(1).max, i128(b(0).max) * b(1).min,
                   i128(b(0).max) * b(1).max};
      return clamp_to(dtype, *std::min_element(c, c + 4) + b(2).min, *std::max_element(c, c + 4) + b(2).max);
    }
    case Ops::CAST: return clamp_to(dtype, b(0).min, b(0).max);
    default: return full;
  }
}

// ---------------------------------------------------------------- interning

struct Shard {
  std::mutex mu;
  std::vector<const UOp*> buckets = std::vector<const UOp*>(64, nullptr);
  size_t count = 0;
};
constexpr int kShardBits = 6;
std::atomic<size_t> g_live{0};
std::atomic<uint64_t> g_seq{0};

bool try_acquire(const std::atomic<uint32_t>& rc_const) {
  auto& rc = const_cast<std::atomic<uint32_t>&>(rc_const);
  uint32_t c = rc.load(std::memory_order_relaxed);
  while (c != 0)
    if (rc.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) return true;
  return false;
}

}  // namespace

struct Interner {
  Shard shards[1 << kShardBits];
  static Interner& get() {
    static Interner* in = new Interner();  // never destroyed: nodes may outlive static destructors
    return *in;
  }
  Shard& shard(uint64_t h) { return shards[h >> (64 - kShardBits)]; }

  static bool same(const UOp* u, Ops op, DType dtype, std::span<const UOpRef> src, const Arg& arg) {
    if (u->op != op || !(u->dtype == dtype) || u->nsrc() != src.size()) return false;
    for (size_t i = 0; i < src.size(); i++)
      if (u->src()[i].get() != src[i].get()) return false;
    return arg_equal(u->arg, arg);
  }

  static void grow(Shard& s) {
    std::vector<const UOp*> nb(s.buckets.size() * 2, nullptr);
    size_t mask = nb.size() - 1;
    for (const UOp* head : s.buckets) {
      while (head) {
        const UOp* nx = head->next_;
        size_t i = head->hash & mask;
        head->next_ = nb[i];
        nb[i] = head;
        head = nx;
      }
    }
    s.buckets.swap(nb);
  }

  UOpRef intern(Ops op, DType dtype, std::span<const UOpRef> src, Arg&& arg,
               std::unique_ptr<const std::vector<UOpRef>>&& sym) {
    uint64_t h = node_hash(op, dtype, arg, src);
    Shard& s = shard(h);
    std::lock_guard lk(s.mu);
    size_t mask = s.buckets.size() - 1;
    for (const UOp* u = s.buckets[h & mask]; u; u = u->next_)
      if (u->hash == h && same(u, op, dtype, src, arg) && try_acquire(u->rc_)) return UOpRef::adopt(u);
    void* mem = ::operator new(sizeof(UOp) + src.size() * sizeof(UOpRef));
    UOp* u = new (mem) UOp(op, dtype, std::move(arg), h, uint32_t(src.size()));
    for (size_t i = 0; i < src.size(); i++) new (&u->srcs_[i]) UOpRef(src[i]);
    u->bounds_ = compute_bounds(op, dtype, src, u->arg);
    u->sym_ = std::move(sym);
    u->seq_ = g_seq.fetch_add(1, std::memory_order_relaxed) + 1;  // sources finished before: their seq is smaller
    size_t bi = h & mask;
    u->next_ = s.buckets[bi];
    s.buckets[bi] = u;
    if (++s.count > s.buckets.size()) grow(s);
    g_live.fetch_add(1, std::memory_order_relaxed);
    return UOpRef::adopt(u);
  }

  void erase(const UOp* u) {
    Shard& s = shard(u->hash);
    std::lock_guard lk(s.mu);
    const UOp** pp = &s.buckets[u->hash & (s.buckets.size() - 1)];
    while (*pp && *pp != u) pp = &(*pp)->next_;
    if (*pp) {
      *pp = u->next_;
      s.count--;
    }
  }
};

UOp::UOp(Ops op_, DType dtype_, Arg arg_, uint64_t hash_, uint32_t nsrc)
    : op(op_), dtype(dtype_), arg(std::move(arg_)), hash(hash_), nsrc_(nsrc),
      srcs_(reinterpret_cast<UOpRef*>(reinterpret_cast<char*>(this) + sizeof(UOp))) {}

static_assert(sizeof(UOp) % alignof(UOpRef) == 0);

namespace {
std::atomic<void (*)(const UOp*)> g_buffer_hook{nullptr};
}
void set_buffer_free_hook(void (*hook)(const UOp*)) { g_buffer_hook.store(hook); }

void UOp::release(const UOp* first) {
  // Iterative: freeing a long chain must not recurse once per node.
  thread_local std::vector<const UOp*> pending;
  thread_local bool active = false;
  pending.push_back(first);
  if (active) return;
  active = true;
  Interner& in = Interner::get();
  while (!pending.empty()) {
    const UOp* u = pending.back();
    pending.pop_back();
    in.erase(u);
    UOp* m = const_cast<UOp*>(u);
    if (m->op == Ops::BUFFER)
      if (auto h = g_buffer_hook.load(std::memory_order_relaxed)) h(m);
    for (uint32_t i = 0; i < m->nsrc_; i++) {
      const UOp* c = m->srcs_[i].take();
      if (c->rc_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending.push_back(c);
    }
    m->~UOp();
    ::operator delete(m);
    g_live.fetch_sub(1, std::memory_order_relaxed);
  }
  active = false;
}

size_t UOp::live_count() { return g_live.load(std::memory_order_relaxed); }

namespace {
// The symbolic extents of a tensor-graph node (see UOp::sym): movement ops with index sources carry them (RESHAPE and
// EXPAND: the extents; SHRINK: the bounds), every other node derives them from its sources. Computed before the node
// is interned (simplifying builds nodes), so a node is complete when another thread finds it.
std::unique_ptr<const std::vector<UOpRef>> derive_sym(Ops op, std::span<const UOpRef> src, const Arg& arg) {
  using Sym = std::vector<UOpRef>;
  namespace rv = ranges::views;
  auto ci = [](int64_t v) { return UOp::cnst_int(dtypes::index, v); };
  auto vec = [&]() -> const std::vector<int64_t>& { return std::get<std::vector<int64_t>>(arg); };
  auto symbolic = [](const Sym& s) {
    for (auto& e : s)
      if (!e->is_const()) return true;
    return false;
  };
  auto done = [&](Sym s) -> std::unique_ptr<const Sym> {
    return symbolic(s) ? std::make_unique<const Sym>(std::move(s)) : nullptr;
  };
  const bool carried = (op == Ops::RESHAPE || op == Ops::EXPAND || op == Ops::SHRINK || op == Ops::PAD) && src.size() > 1;
  if (carried && op == Ops::PAD) {  // (begin, end) per dim; the argument ends with the input's largest dims
    size_t n = (src.size() - 1) / 2;
    Sym s;
    for (size_t i = 0; i < n; i++) {
      UOpRef in = src[0]->sym() ? (*src[0]->sym())[i] : ci(vec()[2 * n + i]);
      s.push_back(simplify(in->alu(Ops::ADD, src[1 + 2 * i])->alu(Ops::ADD, src[2 + 2 * i])));
    }
    return done(std::move(s));
  }
  if (carried) {
    if (op != Ops::SHRINK) return done(Sym(src.begin() + 1, src.end()));
    // (begin, end) pairs after the input: each dim's size is end - begin
    return done(src | rv::drop(1) | rv::chunk(2) |
                rv::transform([&](auto be) { return simplify(be[1]->alu(Ops::SUB, be[0])); }) | ranges::to<Sym>());
  }
  const UOp* from = nullptr;
  for (auto& x : src)
    if (x->sym()) {
      from = x.get();
      break;
    }
  if (!from || op == Ops::SINK || op == Ops::BIND || op == Ops::RESHAPE || op == Ops::EXPAND) return nullptr;
  const Sym& in = *from->sym();
  switch (op) {
    case Ops::PERMUTE:
      return done(vec() | rv::transform([&](int64_t a) { return in[size_t(a)]; }) | ranges::to<Sym>());
    case Ops::PAD:  // vec(): (before, after) per dim
      return done(rv::zip(in, vec() | rv::chunk(2)) | rv::transform([&](auto d) {
                    auto [n, p] = d;
                    return simplify(n->alu(Ops::ADD, ci(p[0] + p[1])));
                  }) |
                  ranges::to<Sym>());
    case Ops::SHRINK:  // vec(): (begin, end) per dim
      return done(vec() | rv::chunk(2) | rv::transform([&](auto be) { return ci(be[1] - be[0]); }) | ranges::to<Sym>());
    case Ops::REDUCE_AXIS: {
      Sym s = in;
      for (int64_t a : std::get<ReduceArg>(arg).axes) s[size_t(a)] = ci(1);
      return done(std::move(s));
    }
    default: return std::make_unique<const Sym>(in);  // elementwise, casts, copies, CONTIGUOUS, ASSIGN, FLIP
  }
}
}  // namespace

UOpRef substitute(const UOpRef& root, const std::function<UOpRef(const UOp*)>& leaf,
                  const std::function<UOpRef(const UOp*, std::span<const UOpRef>)>& rebuild) {
  std::unordered_map<const UOp*, UOpRef> memo;
  for (const UOp* u : toposort(root.get())) {
    if (UOpRef r = leaf(u)) {
      memo[u] = std::move(r);
      continue;
    }
    bool changed = false;
    std::vector<UOpRef> src;
    for (auto& s : u->src()) {
      src.push_back(memo.at(s.get()));
      changed |= src.back().get() != s.get();
    }
    memo[u] = !changed ? UOpRef(u) : rebuild ? rebuild(u, src) : u->replace_src(src);
  }
  return memo.at(root.get());
}

UOpRef UOp::make(Ops op, DType dtype, std::span<const UOpRef> src, Arg arg) {
  for (auto& s : src)
    if (!s) throw Error(std::string("[UOp::make] ") + op_name(op) + ": a source is null");
  std::unique_ptr<const std::vector<UOpRef>> sym;
  if (is_movement(op) ? src.size() > 1 || (!src.empty() && src[0]->sym()) : !src.empty()) {
    bool any = src.size() > 1 && is_movement(op);
    for (auto& s : src) any |= s->sym() != nullptr;
    if (any) sym = derive_sym(op, src, arg);
  }
  UOpRef r = Interner::get().intern(op, dtype, src, std::move(arg), std::move(sym));
  if (spec_enabled() && !SpecPause::active()) spec_check_node(r.get());
  return r;
}

// ---------------------------------------------------------------- helpers

UOpRef UOp::cnst(DType dtype, double v) {
  DType s = dtype.scalar_type();
  if (dtypes::is_float(s)) return make(Ops::CONST, dtype, {}, truncate_float(v, s));
  if (std::isnan(v)) throw Error("[UOp::cnst] NaN is not a value of " + dtype.name());
  if (dtypes::is_bool(s)) return make(Ops::CONST, dtype, {}, int64_t(v != 0));
  if (s.scalar == Scalar::UInt64 && v >= 9223372036854775808.0)
    return make(Ops::CONST, dtype, {}, int64_t(uint64_t(v)));
  return make(Ops::CONST, dtype, {}, wrap_int(int64_t(v), s));
}

UOpRef UOp::cnst_int(DType dtype, int64_t v) {
  DType s = dtype.scalar_type();
  if (dtypes::is_float(s)) return make(Ops::CONST, dtype, {}, truncate_float(double(v), s));
  return make(Ops::CONST, dtype, {}, wrap_int(v, s));
}

UOpRef UOp::variable(std::string name, int64_t min, int64_t max, DType dtype) {
  if (min > max) throw Error("[Variable] " + name + ": min " + std::to_string(min) + " > max " + std::to_string(max));
  if (!dtypes::is_int(dtype)) throw Error("[Variable] " + name + ": dtype must be an int, got " + dtype.name());
  return make(Ops::DEFINE_VAR, dtype, {}, VarArg{std::move(name), min, max});
}

UOpRef UOp::range(const UOpRef& end, int64_t id, AxisType type) {
  return make(Ops::RANGE, end->dtype, {end}, std::vector<int64_t>{id, int64_t(type)});
}

UOpRef UOp::replace_src(std::span<const UOpRef> s) const { return make(op, dtype, s, arg); }
UOpRef UOp::with_dtype(DType d) const { return make(op, d, src(), arg); }

UOpRef UOp::alu(Ops o) const { return make(o, dtype, {ref()}); }
UOpRef UOp::alu(Ops o, const UOpRef& b) const {
  DType d = is_comparison(o) ? dtypes::bool_.vec(dtype.count) : dtype;
  return make(o, d, {ref(), b});
}
UOpRef UOp::alu(Ops o, const UOpRef& b, const UOpRef& c) const {
  return make(o, o == Ops::WHERE ? b->dtype : dtype, {ref(), b, c});
}
UOpRef UOp::cast(DType d) const { return d == dtype ? ref() : make(Ops::CAST, d, {ref()}); }
UOpRef UOp::const_like(double v) const { return cnst(dtype, v); }
UOpRef UOp::const_like_int(int64_t v) const { return cnst_int(dtype, v); }

int64_t UOp::const_int() const {
  if (auto* i = std::get_if<int64_t>(&arg)) return *i;
  if (auto* f = std::get_if<double>(&arg)) return int64_t(*f);
  throw Error(std::string("[const_int] not a constant: ") + op_name(op));
}
double UOp::const_float() const {
  if (auto* f = std::get_if<double>(&arg)) return *f;
  if (auto* i = std::get_if<int64_t>(&arg)) return dtype.scalar == Scalar::UInt64 ? double(uint64_t(*i)) : double(*i);
  throw Error(std::string("[const_float] not a constant: ") + op_name(op));
}

std::string UOp::key() const {
  std::vector<const UOp*> order = toposort(this);
  std::unordered_map<const UOp*, XXH128_hash_t> keys;
  keys.reserve(order.size());
  for (const UOp* u : order) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint64_t head[2] = {uint64_t(u->op) | dtype_word(u->dtype) << 8, uint64_t(u->dtype.size)};
    XXH3_128bits_update(&st, head, sizeof head);
    XXH3_state_t ast;
    XXH3_64bits_reset(&ast);
    ArgHasher ah{&ast};
    ah.i64(int64_t(u->arg.index()));
    std::visit(ah, u->arg);
    uint64_t a = XXH3_64bits_digest(&ast);
    XXH3_128bits_update(&st, &a, 8);
    for (auto& s : u->src()) XXH3_128bits_update(&st, &keys.at(s.get()), sizeof(XXH128_hash_t));
    keys[u] = XXH3_128bits_digest(&st);
  }
  XXH128_hash_t k = keys.at(this);
  char buf[33];
  snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)k.high64, (unsigned long long)k.low64);
  return buf;
}

// ---------------------------------------------------------------- toposort

std::vector<const UOp*> toposort(std::span<const UOpRef> roots) {
  std::vector<const UOp*> out;
  std::unordered_map<const UOp*, bool> seen;  // false: on stack, true: emitted
  std::vector<std::pair<const UOp*, uint32_t>> stack;
  for (auto& r : roots) {
    if (!r || seen.count(r.get())) continue;
    stack.emplace_back(r.get(), 0);
    seen[r.get()] = false;
    while (!stack.empty()) {
      auto& [u, i] = stack.back();
      if (i < u->nsrc()) {
        const UOp* c = u->src(i++);
        if (seen.emplace(c, false).second) stack.emplace_back(c, 0);
        continue;
      }
      seen[u] = true;
      out.push_back(u);
      stack.pop_back();
    }
  }
  return out;
}

std::vector<const UOp*> toposort(const UOp* root) {
  UOpRef r(root);
  return toposort(std::span<const UOpRef>(&r, 1));
}

// ---------------------------------------------------------------- constant evaluation

int64_t wrap_int(int64_t v, DType d) {
  switch (d.scalar) {
    case Scalar::Bool: return v != 0;
    case Scalar::Int8: return int8_t(v);
    case Scalar::UInt8: return uint8_t(v);
    case Scalar::Int16: return int16_t(v);
    case Scalar::UInt16: return uint16_t(v);
    case Scalar::Int32: return int32_t(v);
    case Scalar::UInt32: return uint32_t(v);
    default: return v;
  }
}

namespace {

uint64_t float_bits(double v, DType d) {
  switch (d.scalar) {
    case Scalar::Float16: return float_to_half_bits(float(v));
    case Scalar::BFloat16: return float_to_bf16_bits(float(v));
    case Scalar::Float32: return std::bit_cast<uint32_t>(float(v));
    case Scalar::Fp8E4M3: case Scalar::Fp8E5M2: return double_to_fp8_bits(v, d.scalar);
    default: return std::bit_cast<uint64_t>(v);
  }
}
double bits_float(uint64_t b, DType d) {
  switch (d.scalar) {
    case Scalar::Float16: return half_bits_to_float(uint16_t(b));
    case Scalar::BFloat16: return bf16_bits_to_float(uint16_t(b));
    case Scalar::Float32: return std::bit_cast<float>(uint32_t(b));
    case Scalar::Fp8E4M3: case Scalar::Fp8E5M2: return fp8_bits_to_double(uint8_t(b), d.scalar);
    default: return std::bit_cast<double>(b);
  }
}

Value cast_value(Value v, DType from, DType to) {
  Value r;
  bool ff = dtypes::is_float(from), tf = dtypes::is_float(to);
  if (tf) {
    double x = ff ? v.f : dtypes::is_unsigned(from) && from.scalar == Scalar::UInt64 ? double(uint64_t(v.i)) : double(v.i);
    r.f = truncate_float(x, to);
    return r;
  }
  if (dtypes::is_bool(to)) {
    r.i = ff ? (v.f != 0) : (v.i != 0);
    return r;
  }
  if (ff) {
    double t = std::trunc(v.f);
    // C leaves out-of-range conversions undefined; tg wraps the integer part modulo 2^64 (NaN gives 0).
    if (std::isnan(t)) r.i = 0;
    else if (t >= -9223372036854775808.0 && t < 9223372036854775808.0) r.i = int64_t(t);
    else if (t >= 0 && t < 18446744073709551616.0) r.i = int64_t(uint64_t(t));
    else r.i = 0;
    r.i = wrap_int(r.i, to);
    return r;
  }
  r.i = wrap_int(v.i, to);
  return r;
}

}  // namespace

Value exec_alu(Ops op, DType dtype, std::span<const Value> s, DType sd) {
  DType d = dtype.scalar_type();
  sd = sd.scalar_type();
  if (op == Ops::CAST) return cast_value(s[0], sd, d);
  if (op == Ops::BITCAST) {
    if (sd.itemsize() != d.itemsize())
      throw Error("[exec_alu] BITCAST " + sd.name() + " -> " + d.name() + ": sizes differ");
    uint64_t bits = dtypes::is_float(sd) ? float_bits(s[0].f, sd) : uint64_t(s[0].i);
    Value r;
    if (dtypes::is_float(d)) r.f = bits_float(bits, d);
    else r.i = wrap_int(int64_t(bits), d);
    return r;
  }
  Value r;
  if (op == Ops::WHERE) return (dtypes::is_float(sd) ? s[0].f != 0 : s[0].i != 0) ? s[1] : s[2];
  bool fl = dtypes::is_float(is_comparison(op) ? sd : d);
  if (fl) {
    double a = s[0].f, b = s.size() > 1 ? s[1].f : 0;
    double x;
    switch (op) {
      case Ops::NEG: x = -a; break;
      case Ops::EXP2: x = std::exp2(a); break;
      case Ops::LOG2: x = std::log2(a); break;
      case Ops::SIN: x = std::sin(a); break;
      case Ops::SQRT: x = std::sqrt(a); break;
      case Ops::RECIPROCAL: x = 1.0 / a; break;
      case Ops::TRUNC: x = std::trunc(a); break;
      case Ops::ADD: x = a + b; break;
      case Ops::SUB: x = a - b; break;
      case Ops::MUL: x = a * b; break;
      case Ops::FDIV: x = a / b; break;
      case Ops::MAX: x = (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b); break;
      case Ops::POW: x = std::pow(a, b); break;
      case Ops::MULACC: x = a * b + s[2].f; break;
      case Ops::CMPLT: r.i = a < b; return r;
      case Ops::CMPNE: r.i = a != b; return r;
      case Ops::CMPEQ: r.i = a == b; return r;
      default: throw Error(std::string("[exec_alu] ") + op_name(op) + " is not defined on " + d.name());
    }
    r.f = truncate_float(x, d);
    return r;
  }
  DType cd = is_comparison(op) ? sd : d;
  bool uns = dtypes::is_unsigned(cd) || dtypes::is_bool(cd);
  int64_t a = s[0].i, b = s.size() > 1 ? s[1].i : 0;
  uint64_t ua = uint64_t(a), ub = uint64_t(b);
  int bits = cd.scalar == Scalar::Bool ? 1 : cd.bitsize();
  int64_t x;
  switch (op) {
    case Ops::NEG: x = int64_t(0 - ua); break;
    case Ops::ADD: x = int64_t(ua + ub); break;
    case Ops::SUB: x = int64_t(ua - ub); break;
    case Ops::MUL: x = int64_t(ua * ub); break;
    case Ops::MULACC: x = int64_t(ua * ub + uint64_t(s[2].i)); break;
    case Ops::IDIV: case Ops::MOD:
      if (b == 0) throw Error(std::string("[exec_alu] integer ") + op_name(op) + " by zero");
      if (uns) x = int64_t(op == Ops::IDIV ? ua / ub : ua % ub);
      else if (a == std::numeric_limits<int64_t>::min() && b == -1) x = op == Ops::IDIV ? a : 0;
      else x = op == Ops::IDIV ? a / b : a % b;
      break;
    case Ops::MAX: x = uns ? int64_t(std::max(ua, ub)) : std::max(a, b); break;
    case Ops::CMPLT: r.i = uns ? ua < ub : a < b; return r;
    case Ops::CMPNE: r.i = a != b; return r;
    case Ops::CMPEQ: r.i = a == b; return r;
    case Ops::XOR: x = a ^ b; break;
    case Ops::OR: x = a | b; break;
    case Ops::AND: x = a & b; break;
    case Ops::SHL: x = (ub >= uint64_t(bits)) ? 0 : int64_t(ua << ub); break;
    case Ops::SHR:
      if (ub >= uint64_t(bits)) x = (!uns && a < 0) ? -1 : 0;
      else x = uns ? int64_t(ua >> ub) : (a >> b);
      break;
    case Ops::POW: x = int64_t(std::pow(double(a), double(b))); break;
    default: throw Error(std::string("[exec_alu] ") + op_name(op) + " is not defined on " + d.name());
  }
  r.i = wrap_int(x, d);
  return r;
}

}  // namespace tg
