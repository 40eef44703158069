// Renderers and the CPU compilers: hand-built linear programs, rendered as LLVM IR and as C, compiled with the
// ORC JIT and with clang, run, and compared with values computed here (exec_alu is the reference semantics).
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "../backends/cpu/cpu.hpp"
#include "tg/render.hpp"
#include "tg/uop.hpp"

using namespace tg;
using cpu::CompilerKind;

namespace {

// A linear program built in execution order; every node built is appended once (nodes are interned).
struct Prog {
  std::vector<UOpRef> keep;
  std::vector<const UOp*> ops;
  std::unordered_set<const UOp*> seen;
  UOpRef add(UOpRef u) {
    if (seen.insert(u.get()).second) {
      ops.push_back(u.get());
      keep.push_back(u);
    }
    return u;
  }
  UOpRef param(int i, DType d) { return add(UOp::make(Ops::PARAM, d.ptr_to(), {}, int64_t(i))); }
  UOpRef var(const char* n, int64_t lo, int64_t hi, DType d = dtypes::int32) { return add(UOp::variable(n, lo, hi, d)); }
  UOpRef c(DType d, double v) { return add(UOp::cnst(d, v)); }
  UOpRef ci(DType d, int64_t v) { return add(UOp::cnst_int(d, v)); }
  UOpRef range(const UOpRef& end, int id) { return add(UOp::range(end, id)); }
  // END(effects..., RANGE): the RANGE is the last source.
  UOpRef end(const UOpRef& r, std::vector<UOpRef> effects = {}) {
    effects.push_back(r);
    return add(UOp::make(Ops::END, dtypes::void_, std::span<const UOpRef>(effects)));
  }
  UOpRef after(const UOpRef& ptr, std::vector<UOpRef> deps) {
    deps.insert(deps.begin(), ptr);
    return add(UOp::make(Ops::AFTER, ptr->dtype, std::span<const UOpRef>(deps)));
  }
  UOpRef reg(DType d, int n) { return add(UOp::make(Ops::DEFINE_REG, d.ptr_to(n, AddrSpace::Reg), {}, int64_t(0))); }
  UOpRef index(const UOpRef& p, const UOpRef& i) { return add(UOp::make(Ops::INDEX, p->dtype, {p, i})); }
  UOpRef load(const UOpRef& idx) { return add(UOp::make(Ops::LOAD, idx->dtype.base(), {idx})); }
  UOpRef load(const UOpRef& idx, const UOpRef& alt, const UOpRef& gate) {
    return add(UOp::make(Ops::LOAD, idx->dtype.base(), {idx, alt, gate}));
  }
  UOpRef store(const UOpRef& idx, const UOpRef& v) { return add(UOp::make(Ops::STORE, dtypes::void_, {idx, v})); }
  UOpRef alu(Ops op, const UOpRef& a) { return add(a->alu(op)); }
  UOpRef alu(Ops op, const UOpRef& a, const UOpRef& b) { return add(a->alu(op, b)); }
  UOpRef alu(Ops op, const UOpRef& a, const UOpRef& b, const UOpRef& c) { return add(a->alu(op, b, c)); }
  UOpRef cast(const UOpRef& a, DType d) { return add(UOp::make(Ops::CAST, d, {a})); }
  UOpRef bitcast(const UOpRef& a, DType d) { return add(UOp::make(Ops::BITCAST, d, {a})); }
  UOpRef if_(const UOpRef& c) { return add(UOp::make(Ops::IF, dtypes::void_, {c})); }
  UOpRef endif(const UOpRef& i) { return add(UOp::make(Ops::ENDIF, dtypes::void_, {i})); }
  void sink() { add(UOp::make(Ops::SINK, dtypes::void_, {})); }
};

const char* kind_name(CompilerKind k) { return k == CompilerKind::LLVM ? "llvm" : "clang"; }
constexpr CompilerKind kKinds[] = {CompilerKind::LLVM, CompilerKind::Clang};

Device& dev(CompilerKind k) {
  static auto llvm = cpu::make_device("CPU", CompilerKind::LLVM);
  static auto clang = cpu::make_device("CPU", CompilerKind::Clang);
  return k == CompilerKind::LLVM ? *llvm : *clang;
}

// Render, compile (no caches) and run once.
void run(CompilerKind k, const Prog& p, std::vector<void*> bufs, std::vector<int64_t> vars = {}) {
  Device& d = dev(k);
  std::string src = d.renderer().render("k", p.ops);
  std::unique_ptr<Program> prog = d.load(d.compiler().compile(src, "k"), "k");
  prog->run(bufs.data(), vars.data(), LaunchDims{});
}

// Host bytes of values of any dtype, exec_alu's representation (Value) on the C++ side.
struct Data {
  DType dt;
  std::vector<uint8_t> bytes;
  Data(DType d, size_t n) : dt(d), bytes(n * size_t(d.itemsize())) {}
  size_t n() const { return bytes.size() / size_t(dt.itemsize()); }
  void* ptr() { return bytes.data(); }
  void set(size_t i, Value v) {
    uint8_t* p = bytes.data() + i * size_t(dt.itemsize());
    uint64_t bits;
    switch (dt.scalar) {
      case Scalar::Float16: bits = float_to_half_bits(float(v.f)); break;
      case Scalar::BFloat16: bits = float_to_bf16_bits(float(v.f)); break;
      case Scalar::Float32: { float f = float(v.f); std::memcpy(&bits, &f, 4); break; }
      case Scalar::Float64: std::memcpy(&bits, &v.f, 8); break;
      default: bits = uint64_t(v.i);
    }
    std::memcpy(p, &bits, size_t(dt.itemsize()));  // little-endian: the low bytes
  }
  Value get(size_t i) const {
    const uint8_t* p = bytes.data() + i * size_t(dt.itemsize());
    uint64_t bits = 0;
    std::memcpy(&bits, p, size_t(dt.itemsize()));
    Value v;
    switch (dt.scalar) {
      case Scalar::Float16: v.f = half_bits_to_float(uint16_t(bits)); break;
      case Scalar::BFloat16: v.f = bf16_bits_to_float(uint16_t(bits)); break;
      case Scalar::Float32: { float f; std::memcpy(&f, &bits, 4); v.f = f; break; }
      case Scalar::Float64: std::memcpy(&v.f, &bits, 8); break;
      default: v.i = wrap_int(int64_t(bits), dt);
    }
    return v;
  }
  // Same bits as `v` would have when stored (NaNs compare as NaN, whatever their payload).
  bool same(size_t i, Value v) const {
    Value g = get(i);
    if (dtypes::is_float(dt)) {
      Data tmp(dt, 1);
      tmp.set(0, v);
      if (std::isnan(g.f) && std::isnan(tmp.get(0).f)) return true;
      return std::memcmp(tmp.bytes.data(), bytes.data() + i * size_t(dt.itemsize()), size_t(dt.itemsize())) == 0;
    }
    return g.i == wrap_int(v.i, dt);
  }
  std::string str(size_t i) const {
    Value g = get(i);
    return dtypes::is_float(dt) ? std::to_string(g.f) : std::to_string(g.i);
  }
};

Value val(DType d, double x) {
  Value v;
  if (dtypes::is_float(d)) v.f = truncate_float(x, d);
  else v.i = dtypes::is_bool(d) ? x != 0 : wrap_int(int64_t(x), d);
  return v;
}

const DType kAll[] = {dtypes::bool_, dtypes::int8, dtypes::uint8, dtypes::int16, dtypes::uint16, dtypes::int32,
                      dtypes::uint32, dtypes::int64, dtypes::uint64, dtypes::float16, dtypes::bfloat16,
                      dtypes::float32, dtypes::float64};

// Within `ulps` units in the last place of `d` (transcendentals: libm and exec_alu's double math may differ).
bool close(double got, double want, DType d, int ulps) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
  if (std::isinf(got) || std::isinf(want)) return got == want;
  int mant = d.scalar == Scalar::Float16 ? 10 : d.scalar == Scalar::BFloat16 ? 7 : d.scalar == Scalar::Float32 ? 23 : 52;
  double ulp = std::ldexp(std::max(std::fabs(want), 1e-30), -mant);
  return std::fabs(got - want) <= ulps * ulp;
}

}  // namespace

TEST_CASE("elementwise add over a RANGE with a runtime bound") {
  Prog p;
  auto a = p.param(0, dtypes::float32), b = p.param(1, dtypes::float32), c = p.param(2, dtypes::float32);
  auto n = p.var("n", 0, 1 << 20);
  auto i = p.range(n, 0);
  auto s = p.alu(Ops::ADD, p.load(p.index(a, i)), p.load(p.index(b, i)));
  p.store(p.index(c, i), s);
  p.end(i);
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<float> x(1000), y(1000), z(1001, -1.0f);
    for (int j = 0; j < 1000; j++) x[size_t(j)] = float(j) * 0.5f, y[size_t(j)] = 1.0f / float(j + 1);
    run(k, p, {x.data(), y.data(), z.data()}, {1000});
    for (size_t j = 0; j < 1000; j++) CHECK(z[j] == x[j] + y[j]);
    CHECK(z[1000] == -1.0f);
    std::fill(z.begin(), z.end(), -1.0f);
    run(k, p, {x.data(), y.data(), z.data()}, {0});  // zero trips: nothing is written
    CHECK(z[0] == -1.0f);
  }
}

TEST_CASE("reduction into a DEFINE_REG accumulator") {
  constexpr int R = 7, N = 33;
  Prog p;
  auto a = p.param(0, dtypes::float32), out = p.param(1, dtypes::int64);
  auto i = p.range(p.ci(dtypes::int64, R), 0);
  // As codegen lowers a REDUCE: AFTER orders the accesses of the register (it renders as the register itself).
  auto acc = p.reg(dtypes::float32, 1);
  auto zero = p.ci(dtypes::int32, 0);
  auto init = p.store(p.index(acc, zero), p.c(dtypes::float32, 0));
  auto j = p.range(p.ci(dtypes::int64, N), 1);
  auto slot = p.index(p.after(acc, {init, j}), zero);
  auto idx = p.alu(Ops::ADD, p.alu(Ops::MUL, i, p.ci(dtypes::int64, N)), j);
  auto upd = p.store(slot, p.alu(Ops::ADD, p.load(slot), p.load(p.index(a, idx))));
  auto ej = p.end(j, {upd});
  auto res = p.load(p.index(p.after(acc, {ej}), zero));
  auto st = p.store(p.index(out, i), p.cast(res, dtypes::int64));
  p.end(i, {st});
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<float> x(R * N);
    for (size_t q = 0; q < x.size(); q++) x[q] = float(int(q % 11) - 5);
    std::vector<int64_t> o(R, 99);
    run(k, p, {x.data(), o.data()});
    for (int r = 0; r < R; r++) {
      int64_t want = 0;
      for (int q = 0; q < N; q++) want += int64_t(x[size_t(r * N + q)]);
      CHECK(o[size_t(r)] == want);
    }
  }
}

TEST_CASE("a gated LOAD never touches memory when its gate is false") {
  // The 3 valid elements end exactly at a PROT_NONE page: an ungated access past them faults.
  long page = sysconf(_SC_PAGESIZE);
  auto* mem = static_cast<uint8_t*>(mmap(nullptr, size_t(2 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(mem != MAP_FAILED);
  REQUIRE(mprotect(mem + page, size_t(page), PROT_NONE) == 0);
  auto* a = reinterpret_cast<int32_t*>(mem + page) - 3;
  a[0] = 10, a[1] = 20, a[2] = 30;
  Prog p;
  auto pa = p.param(0, dtypes::int32), po = p.param(1, dtypes::int32);
  auto i = p.range(p.ci(dtypes::int32, 64), 0);
  auto gate = p.alu(Ops::CMPLT, i, p.ci(dtypes::int32, 3));
  auto v = p.load(p.index(pa, i), p.ci(dtypes::int32, -1), gate);
  p.store(p.index(po, i), v);
  p.end(i);
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<int32_t> o(64, 0);
    run(k, p, {a, o.data()});
    CHECK(o[0] == 10);
    CHECK(o[2] == 30);
    for (size_t q = 3; q < 64; q++) CHECK(o[q] == -1);
  }
  munmap(mem, size_t(2 * page));
}

TEST_CASE("IF/ENDIF runs its body only when the condition holds") {
  Prog p;
  auto po = p.param(0, dtypes::int32);
  auto i = p.range(p.ci(dtypes::int32, 10), 0);
  auto even = p.alu(Ops::CMPEQ, p.alu(Ops::MOD, i, p.ci(dtypes::int32, 2)), p.ci(dtypes::int32, 0));
  auto f = p.if_(even);
  p.store(p.index(po, i), p.alu(Ops::MUL, i, i));
  p.endif(f);
  p.end(i);
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<int32_t> o(10, -7);
    run(k, p, {o.data()});
    for (int q = 0; q < 10; q++) CHECK(o[size_t(q)] == (q % 2 == 0 ? q * q : -7));
  }
}

TEST_CASE("CAST between every pair of dtypes agrees with exec_alu") {
  const std::vector<double> fvals = {0, 1, -1, 2.5, -2.5, 3.75, -7.5, 100.25, 127, 200.7, -130.3, 1000.5, 65504, 100000.5,
                                     3e9, -3e9, 0.1, 1e-3, 70000, 1e12, -0.0, 255.5, 1e-8, 3.4e38};
  const std::vector<double> ivals = {0, 1, -1, 127, -128, 255, 300, -300, 65535, 70000, -70000, 2147483647, -2147483648.0,
                                     1099511627779.0, -1099511627776.0, 4294967295.0, 9007199254740992.0, 2049, 16777217};
  for (DType from : kAll) {
    CAPTURE(from.name());
    const std::vector<double>& vals = dtypes::is_float(from) ? fvals : ivals;
    Data in(from, vals.size());
    for (size_t q = 0; q < vals.size(); q++) {
      double x = vals[q];
      // float -> int is defined for values that fit in int64; keep the float sources there for narrow floats too
      if (from.scalar == Scalar::Float16 && std::fabs(x) > 65504) x = 60000;
      in.set(q, val(from, x));
    }
    Prog p;
    auto pin = p.param(0, from);
    std::vector<UOpRef> outs;
    for (size_t t = 0; t < std::size(kAll); t++) outs.push_back(p.param(int(t) + 1, kAll[t]));
    auto i = p.range(p.ci(dtypes::int32, int64_t(vals.size())), 0);
    auto x = p.load(p.index(pin, i));
    for (size_t t = 0; t < std::size(kAll); t++) p.store(p.index(outs[t], i), p.cast(x, kAll[t]));
    p.end(i);
    p.sink();
    for (CompilerKind k : kKinds) {
      CAPTURE(kind_name(k));
      std::vector<Data> out;
      std::vector<void*> bufs{in.ptr()};
      for (DType to : kAll) out.emplace_back(to, vals.size());
      for (Data& d : out) bufs.push_back(d.ptr());
      run(k, p, bufs);
      for (size_t t = 0; t < std::size(kAll); t++)
        for (size_t q = 0; q < vals.size(); q++) {
          DType to = kAll[t];
          Value x0 = in.get(q);
          if (dtypes::is_float(from) && !dtypes::is_float(to) && !dtypes::is_bool(to) &&
              (std::isinf(x0.f) || std::fabs(x0.f) >= 9.2e18))
            continue;  // float -> int outside int64: undefined on purpose
          Value want = exec_alu(Ops::CAST, to, std::span<const Value>(&x0, 1), from);
          INFO(from.name() << " " << in.str(q) << " -> " << to.name() << ": got " << out[t].str(q));
          CHECK(out[t].same(q, want));
        }
    }
  }
}

TEST_CASE("float to uint64 covers [2^63, 2^64) and negative values wrap") {
  Prog p;
  auto pin = p.param(0, dtypes::float64), po = p.param(1, dtypes::uint64);
  auto i = p.range(p.ci(dtypes::int32, 4), 0);
  p.store(p.index(po, i), p.cast(p.load(p.index(pin, i)), dtypes::uint64));
  p.end(i);
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<double> x = {9223372036854775808.0, 1.8e19, -5.0, 123.9};
    std::vector<uint64_t> o(4);
    run(k, p, {x.data(), o.data()});
    CHECK(o[0] == 9223372036854775808ull);
    CHECK(o[1] == 18000000000000000000ull);
    CHECK(o[2] == uint64_t(-5));
    CHECK(o[3] == 123);
  }
}

// One kernel per dtype: every ALU op on pairs of values, checked against exec_alu.
TEST_CASE("ALU ops on every dtype agree with exec_alu") {
  const std::vector<double> A = {0, 1, -1, 7, -7, 100, -100, 127, 3, 77777, -5, 2, 2.5, -3.75, 1e-3, 30000, -0.5,
                                 INFINITY, NAN, 1e300};
  const std::vector<double> B = {1, 3, -2, 2, 5, -3, 7, 9, 1, 13, -5, 100, 0.5, -0.25, 1e-2, 0, 2, -INFINITY, 3, 3};
  for (DType d : kAll) {
    CAPTURE(d.name());
    bool fl = dtypes::is_float(d), bl = dtypes::is_bool(d);
    int bits = bl ? 1 : d.bitsize();
    size_t n = A.size();
    Data a(d, n), b(d, n), sh(d, n);
    for (size_t q = 0; q < n; q++) {
      double x = A[q], y = B[q];
      if (!fl && !(std::fabs(x) < 1e18)) x = 11;  // ints: no NaN, inf or values beyond int64
      if (!fl && !(std::fabs(y) < 1e18)) y = 17;
      a.set(q, val(d, x));
      Value vb = val(d, y);
      if (!fl && !bl && vb.i == 0) vb.i = 1;  // no division by zero
      if (!fl && !bl && vb.i == -1) vb.i = 6;  // no INT_MIN / -1 trap
      b.set(q, vb);
      sh.set(q, val(d, std::isfinite(y) && std::fabs(y) < 1e18 ? double(int64_t(std::fabs(y)) % bits) : 1.0));
    }
    std::vector<Ops> bin = {Ops::ADD, Ops::SUB, Ops::MUL, Ops::MAX, Ops::CMPLT, Ops::CMPNE, Ops::CMPEQ};
    std::vector<Ops> un = {Ops::NEG};
    if (fl) {
      bin.insert(bin.end(), {Ops::FDIV, Ops::POW});
      un.insert(un.end(), {Ops::TRUNC, Ops::RECIPROCAL, Ops::SQRT, Ops::EXP2, Ops::LOG2, Ops::SIN});
    } else {
      bin.insert(bin.end(), {Ops::XOR, Ops::OR, Ops::AND});
      if (!bl) bin.insert(bin.end(), {Ops::IDIV, Ops::MOD, Ops::SHL, Ops::SHR});
    }
    Prog p;
    auto pa = p.param(0, d), pb = p.param(1, d), ps = p.param(2, d);
    struct Out { Ops op; DType dt; UOpRef param; };
    std::vector<Out> outs;
    int np = 3;
    for (Ops o : bin) outs.push_back({o, is_comparison(o) ? dtypes::bool_ : d, p.param(np++, is_comparison(o) ? dtypes::bool_ : d)});
    for (Ops o : un) outs.push_back({o, d, p.param(np++, d)});
    outs.push_back({Ops::WHERE, d, p.param(np++, d)});
    outs.push_back({Ops::MULACC, d, p.param(np++, d)});
    auto i = p.range(p.ci(dtypes::int32, int64_t(n)), 0);
    auto x = p.load(p.index(pa, i)), y = p.load(p.index(pb, i)), s = p.load(p.index(ps, i));
    for (Out& o : outs) {
      UOpRef r;
      if (o.op == Ops::WHERE) r = p.alu(Ops::WHERE, p.alu(Ops::CMPLT, x, y), x, y);
      else if (o.op == Ops::MULACC) r = p.alu(Ops::MULACC, x, y, x);
      else if (o.op == Ops::SHL || o.op == Ops::SHR) r = p.alu(o.op, x, s);
      else if (is_unary(o.op)) r = p.alu(o.op, x);
      else r = p.alu(o.op, x, y);
      p.store(p.index(o.param, i), r);
    }
    p.end(i);
    p.sink();
    for (CompilerKind k : kKinds) {
      CAPTURE(kind_name(k));
      std::vector<Data> res;
      std::vector<void*> bufs{a.ptr(), b.ptr(), sh.ptr()};
      for (Out& o : outs) res.emplace_back(o.dt, n);
      for (Data& r : res) bufs.push_back(r.ptr());
      run(k, p, bufs);
      for (size_t t = 0; t < outs.size(); t++)
        for (size_t q = 0; q < n; q++) {
          Ops op = outs[t].op;
          Value va = a.get(q), vb = b.get(q), vs = sh.get(q);
          Value want;
          if (op == Ops::WHERE) {
            Value lt = exec_alu(Ops::CMPLT, dtypes::bool_, std::vector<Value>{va, vb}, d);
            want = exec_alu(Ops::WHERE, d, std::vector<Value>{lt, va, vb}, dtypes::bool_);
          } else if (op == Ops::MULACC) {
            want = exec_alu(op, d, std::vector<Value>{va, vb, va}, d);
          } else if (is_unary(op)) {
            want = exec_alu(op, d, std::vector<Value>{va}, d);
          } else {
            want = exec_alu(op, outs[t].dt, std::vector<Value>{va, op == Ops::SHL || op == Ops::SHR ? vs : vb}, d);
          }
          INFO(op_name(op) << "(" << a.str(q) << ", " << b.str(q) << ") = " << res[t].str(q));
          // libm vs exec_alu's double math; MULACC is one fma here, a double multiply-add in exec_alu
          bool approx = op == Ops::EXP2 || op == Ops::LOG2 || op == Ops::SIN || op == Ops::POW || (op == Ops::MULACC && fl);
          if (approx) CHECK(close(res[t].get(q).f, want.f, d, 2));
          else CHECK(res[t].same(q, want));
        }
    }
  }
}

TEST_CASE("integer division and modulo truncate toward zero") {
  Prog p;
  auto pa = p.param(0, dtypes::int32), pb = p.param(1, dtypes::int32), pq = p.param(2, dtypes::int32),
       pr = p.param(3, dtypes::int32), pu = p.param(4, dtypes::uint32);
  auto i = p.range(p.ci(dtypes::int32, 4), 0);
  auto x = p.load(p.index(pa, i)), y = p.load(p.index(pb, i));
  p.store(p.index(pq, i), p.alu(Ops::IDIV, x, y));
  p.store(p.index(pr, i), p.alu(Ops::MOD, x, y));
  p.store(p.index(pu, i), p.alu(Ops::IDIV, p.cast(x, dtypes::uint32), p.cast(y, dtypes::uint32)));
  p.end(i);
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<int32_t> a = {-7, 7, -7, 7}, b = {2, -2, -2, 2}, q(4), r(4);
    std::vector<uint32_t> u(4);
    run(k, p, {a.data(), b.data(), q.data(), r.data(), u.data()});
    CHECK(q == std::vector<int32_t>{-3, -3, 3, 3});
    CHECK(r == std::vector<int32_t>{-1, 1, -1, 1});
    CHECK(u[0] == uint32_t(-7) / 2u);
    CHECK(u[1] == 7u / uint32_t(-2));
  }
}

TEST_CASE("MAX propagates NaN like torch.maximum") {
  for (DType d : {dtypes::float16, dtypes::bfloat16, dtypes::float32, dtypes::float64}) {
    CAPTURE(d.name());
    Prog p;
    auto pa = p.param(0, d), pb = p.param(1, d), po = p.param(2, d);
    auto i = p.range(p.ci(dtypes::int32, 5), 0);
    p.store(p.index(po, i), p.alu(Ops::MAX, p.load(p.index(pa, i)), p.load(p.index(pb, i))));
    p.end(i);
    p.sink();
    std::vector<double> x = {1, NAN, NAN, -INFINITY, 2}, y = {NAN, 1, NAN, 1, 3};
    for (CompilerKind k : kKinds) {
      CAPTURE(kind_name(k));
      Data a(d, 5), b(d, 5), o(d, 5);
      for (size_t q = 0; q < 5; q++) a.set(q, val(d, x[q])), b.set(q, val(d, y[q]));
      run(k, p, {a.ptr(), b.ptr(), o.ptr()});
      CHECK(std::isnan(o.get(0).f));
      CHECK(std::isnan(o.get(1).f));
      CHECK(std::isnan(o.get(2).f));
      CHECK(o.get(3).f == 1);
      CHECK(o.get(4).f == 3);
    }
  }
}

TEST_CASE("half and bfloat16 load, convert, compute in float and round back") {
  for (DType d : {dtypes::float16, dtypes::bfloat16}) {
    CAPTURE(d.name());
    Prog p;
    auto pa = p.param(0, d), po = p.param(1, d), pf = p.param(2, dtypes::float32);
    auto i = p.range(p.ci(dtypes::int32, 6), 0);
    auto x = p.load(p.index(pa, i));
    auto y = p.alu(Ops::ADD, p.alu(Ops::MUL, x, p.c(d, 1.5)), p.c(d, 0.1));
    p.store(p.index(po, i), y);
    p.store(p.index(pf, i), p.cast(y, dtypes::float32));
    p.end(i);
    p.sink();
    std::vector<double> xs = {1, 0.333, -2.75, 1000, 60000, 1e-5};
    for (CompilerKind k : kKinds) {
      CAPTURE(kind_name(k));
      Data a(d, 6), o(d, 6);
      std::vector<float> f(6);
      for (size_t q = 0; q < 6; q++) a.set(q, val(d, xs[q]));
      run(k, p, {a.ptr(), o.ptr(), f.data()});
      for (size_t q = 0; q < 6; q++) {
        double m = truncate_float(a.get(q).f * truncate_float(1.5, d), d);
        double want = truncate_float(m + truncate_float(0.1, d), d);
        CHECK(o.same(q, Value{0, want}));
        CHECK(double(f[q]) == want);
      }
    }
  }
}

TEST_CASE("BITCAST reinterprets the bits") {
  Prog p;
  auto pf = p.param(0, dtypes::float32), pd = p.param(1, dtypes::float64), ph = p.param(2, dtypes::float16);
  auto oi = p.param(3, dtypes::int32), ou = p.param(4, dtypes::uint64), os = p.param(5, dtypes::int16),
       ob = p.param(6, dtypes::bfloat16), o8 = p.param(7, dtypes::uint8), of = p.param(8, dtypes::float32);
  auto z = p.ci(dtypes::int32, 0);
  auto f = p.load(p.index(pf, z));
  p.store(p.index(oi, z), p.bitcast(f, dtypes::int32));
  p.store(p.index(ou, z), p.bitcast(p.load(p.index(pd, z)), dtypes::uint64));
  auto h = p.load(p.index(ph, z));
  p.store(p.index(os, z), p.bitcast(h, dtypes::int16));
  p.store(p.index(ob, z), p.bitcast(h, dtypes::bfloat16));
  p.store(p.index(o8, z), p.bitcast(p.ci(dtypes::int8, -2), dtypes::uint8));
  p.store(p.index(of, z), p.bitcast(p.ci(dtypes::int32, 0x3FC00000), dtypes::float32));
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    float fv = -1.5f;
    double dv = 2.0;
    uint16_t hv = float_to_half_bits(-2.0f);
    int32_t i32 = 0;
    uint64_t u64 = 0;
    int16_t i16 = 0;
    uint16_t bf = 0;
    uint8_t u8 = 0;
    float fo = 0;
    run(k, p, {&fv, &dv, &hv, &i32, &u64, &i16, &bf, &u8, &fo});
    CHECK(uint32_t(i32) == 0xBFC00000u);
    CHECK(u64 == 0x4000000000000000ull);
    CHECK(uint16_t(i16) == 0xC000);
    CHECK(bf == 0xC000);
    CHECK(u8 == 254);
    CHECK(fo == 1.5f);
  }
}

TEST_CASE("integer POW and bool logic") {
  Prog p;
  auto pa = p.param(0, dtypes::int32), pb = p.param(1, dtypes::int32), po = p.param(2, dtypes::int32),
       pl = p.param(3, dtypes::bool_);
  auto i = p.range(p.ci(dtypes::int32, 4), 0);
  auto x = p.load(p.index(pa, i)), y = p.load(p.index(pb, i));
  p.store(p.index(po, i), p.alu(Ops::POW, x, y));
  auto bx = p.cast(x, dtypes::bool_), by = p.cast(y, dtypes::bool_);
  p.store(p.index(pl, i), p.alu(Ops::XOR, p.alu(Ops::ADD, bx, by), p.alu(Ops::MUL, bx, by)));  // (x|y) ^ (x&y)
  p.end(i);
  p.sink();
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<int32_t> a = {2, 3, -2, 5}, b = {10, 4, 3, 0}, o(4);
    bool l[4];
    run(k, p, {a.data(), b.data(), o.data(), l});
    CHECK(o == std::vector<int32_t>{1024, 81, -8, 1});
    CHECK(l[0] == false);
    CHECK(l[3] == true);
  }
}

TEST_CASE("renderers refuse malformed programs with tg::Error") {
  auto check_both = [](const Prog& p, const char* what) {
    CAPTURE(what);
    LLVMRenderer l;
    CRenderer c;
    CHECK_THROWS_AS(l.render("k", p.ops), Error);
    CHECK_THROWS_AS(c.render("k", p.ops), Error);
  };
  {
    Prog p;  // a value from inside a loop used after its END
    auto po = p.param(0, dtypes::int32);
    auto i = p.range(p.ci(dtypes::int32, 4), 0);
    auto sq = p.alu(Ops::MUL, i, i);
    p.end(i);
    p.store(p.index(po, p.ci(dtypes::int32, 0)), sq);
    p.sink();
    check_both(p, "use after END");
  }
  {
    Prog p;  // a loop that is never closed
    auto po = p.param(0, dtypes::int32);
    auto i = p.range(p.ci(dtypes::int32, 4), 0);
    p.store(p.index(po, i), i);
    p.sink();
    check_both(p, "unclosed RANGE");
  }
  {
    Prog p;  // PARAM 0 missing
    auto po = p.param(1, dtypes::int32);
    p.store(p.index(po, p.ci(dtypes::int32, 0)), p.ci(dtypes::int32, 1));
    p.sink();
    check_both(p, "missing PARAM");
  }
  {
    Prog p;  // vectors must be devectorised first
    auto po = p.param(0, dtypes::float32.vec(4));
    p.store(p.index(po, p.ci(dtypes::int32, 0)), p.add(UOp::cnst(dtypes::float32.vec(4), 1.0)));
    p.sink();
    check_both(p, "vector dtype");
  }
  {
    Prog p;  // fp8 is not a CPU dtype
    auto po = p.param(0, dtypes::fp8e4m3);
    p.store(p.index(po, p.ci(dtypes::int32, 0)), p.c(dtypes::fp8e4m3, 1.0));
    p.sink();
    check_both(p, "fp8");
  }
  {
    Prog p;  // THREEFRY must be decomposed before rendering
    auto po = p.param(0, dtypes::uint64);
    auto z = p.ci(dtypes::int32, 0);
    p.store(p.index(po, z), p.alu(Ops::THREEFRY, p.ci(dtypes::uint64, 1), p.ci(dtypes::uint64, 2)));
    p.sink();
    check_both(p, "THREEFRY");
  }
  Prog ok;
  auto po = ok.param(0, dtypes::int32);
  ok.store(ok.index(po, ok.ci(dtypes::int32, 0)), ok.ci(dtypes::int32, 1));
  ok.sink();
  CHECK_THROWS_AS(LLVMRenderer().render("bad name", ok.ops), Error);
  CHECK_THROWS_AS(CRenderer().render("1k", ok.ops), Error);
}

TEST_CASE("rendered source shows the kernel ABI; variable names cannot break it") {
  Prog p;
  auto po = p.param(0, dtypes::float32);
  auto n = p.var("n */ oops\n; x", 1, 100);
  auto i = p.range(n, 0);
  p.store(p.index(po, i), p.cast(i, dtypes::float32));
  p.end(i);
  p.sink();
  std::string c = CRenderer().render("E_n", p.ops), ir = LLVMRenderer().render("E_n", p.ops);
  CHECK(c.find("void E_n(void* const* bufs, const int64_t* vars)") != std::string::npos);
  CHECK(c.find("(float*)bufs[0]") != std::string::npos);
  CHECK(c.find("vars[0]") != std::string::npos);
  CHECK(ir.find("define void @E_n(ptr") != std::string::npos);
  CHECK(ir.find("phi i32") != std::string::npos);
  for (CompilerKind k : kKinds) {
    CAPTURE(kind_name(k));
    std::vector<float> o(5, -1);
    run(k, p, {o.data()}, {4});
    CHECK(o == std::vector<float>{0, 1, 2, 3, -1});
  }
}
