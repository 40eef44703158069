// Every elementwise primitive on every dtype it supports, against plain C++ loops on the same values.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tg/tensor.hpp"

using namespace tg;

namespace {

template <class T>
std::vector<T> sample(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; i++) {
    if constexpr (std::is_same_v<T, bool>) v[i] = g() & 1;
    else if constexpr (std::is_floating_point_v<T>) v[i] = T(std::uniform_real_distribution<double>(-100, 100)(g));
    else if constexpr (std::is_signed_v<T>) v[i] = T(int64_t(g()) - int64_t(1u << 31));
    else v[i] = T(uint64_t(g()) * 2654435761u);
  }
  // a few edge values
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    v[0] = std::numeric_limits<T>::min();
    v[1] = std::numeric_limits<T>::max();
    v[2] = 0;
  }
  return v;
}

// Wrapping integer arithmetic like C on unsigned types, then back to T.
template <class T, class F>
T wrap(F f) {
  using U = std::make_unsigned_t<T>;
  return T(U(f()));
}

template <class T>
void check_int_binops() {
  using U = std::make_unsigned_t<T>;
  size_t n = 64;
  auto av = sample<T>(n, 1), bv = sample<T>(n, 2);
  for (size_t i = 0; i < n; i++)
    if (bv[i] == 0) bv[i] = 3;
  Tensor a = Tensor::from_vector(av), b = Tensor::from_vector(bv);
  auto add = Tensor(a + b).to_vector<T>(), mul = Tensor(a * b).to_vector<T>(), sub = Tensor(a - b).to_vector<T>();
  auto band = Tensor(a & b).to_vector<T>(), bor = Tensor(a | b).to_vector<T>(), bxor = Tensor(a ^ b).to_vector<T>();
  auto mx = a.maximum(b).to_vector<T>();
  auto lt = Tensor(a < b).to_vector<bool>(), ne = Tensor(a != b).to_vector<bool>(), eq = Tensor(a == b).to_vector<bool>();
  for (size_t i = 0; i < n; i++) {
    T x = av[i], y = bv[i];
    CHECK(add[i] == T(U(U(x) + U(y))));
    CHECK(mul[i] == T(U(uint64_t(U(x)) * uint64_t(U(y)))));
    CHECK(sub[i] == T(U(U(x) - U(y))));
    CHECK(band[i] == T(x & y));
    CHECK(bor[i] == T(x | y));
    CHECK(bxor[i] == T(x ^ y));
    CHECK(mx[i] == std::max(x, y));
    CHECK(lt[i] == (x < y));
    CHECK(ne[i] == (x != y));
    CHECK(eq[i] == (x == y));
  }
  // C division and remainder (the primitive IDIV/MOD) through idiv/mod's building blocks
  auto q = a.alu(Ops::IDIV, b).to_vector<T>(), r = a.alu(Ops::MOD, b).to_vector<T>();
  for (size_t i = 0; i < n; i++) {
    T x = av[i], y = bv[i];
    if (std::is_signed_v<T> && x == std::numeric_limits<T>::min() && y == T(-1)) continue;  // overflow: C leaves it open
    CHECK(q[i] == T(x / y));
    CHECK(r[i] == T(x % y));
  }
  // shifts by in-range amounts
  Tensor s = Tensor::from_vector(std::vector<T>{T(1), T(3), T(5), T(7)});
  auto sv = s.to_vector<T>();
  auto shl = Tensor(s << 2).to_vector<T>(), shr = Tensor(s >> 1).to_vector<T>();
  for (size_t i = 0; i < 4; i++) {
    CHECK(shl[i] == T(U(sv[i]) << 2));
    CHECK(shr[i] == T(sv[i] >> 1));
  }
}

template <class T>
void check_float_ops() {
  size_t n = 64;
  auto av = sample<T>(n, 3), bv = sample<T>(n, 4);
  Tensor a = Tensor::from_vector(av), b = Tensor::from_vector(bv);
  auto add = Tensor(a + b).to_vector<T>(), mul = Tensor(a * b).to_vector<T>(), sub = Tensor(a - b).to_vector<T>();
  auto dv = Tensor(a / b).to_vector<T>(), mx = a.maximum(b).to_vector<T>();
  auto lt = Tensor(a < b).to_vector<bool>(), ne = Tensor(a != b).to_vector<bool>();
  auto neg = Tensor(-a).to_vector<T>(), sq = a.abs().sqrt().to_vector<T>(), rc = a.reciprocal().to_vector<T>();
  auto tr = a.trunc().to_vector<T>(), e2 = Tensor(a / 20).exp2().to_vector<T>(), l2 = a.abs().log2().to_vector<T>();
  auto sn = a.sin().to_vector<T>();
  for (size_t i = 0; i < n; i++) {
    T x = av[i], y = bv[i];
    CHECK(add[i] == T(x + y));
    CHECK(mul[i] == T(x * y));
    CHECK(sub[i] == T(x - y));
    CHECK(dv[i] == T(x / y));
    CHECK(mx[i] == std::max(x, y));
    CHECK(lt[i] == (x < y));
    CHECK(ne[i] == (x != y));
    CHECK(neg[i] == -x);
    CHECK(sq[i] == std::sqrt(std::abs(x)));
    CHECK(rc[i] == T(1) / x);
    CHECK(tr[i] == std::trunc(x));
    CHECK(e2[i] == doctest::Approx(std::exp2(x / 20)).epsilon(1e-6));
    CHECK(l2[i] == doctest::Approx(std::log2(std::abs(x))).epsilon(1e-6));
    CHECK(sn[i] == doctest::Approx(std::sin(x)).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("int binary ops match C on int8") { check_int_binops<int8_t>(); }
TEST_CASE("int binary ops match C on uint8") { check_int_binops<uint8_t>(); }
TEST_CASE("int binary ops match C on int16") { check_int_binops<int16_t>(); }
TEST_CASE("int binary ops match C on uint16") { check_int_binops<uint16_t>(); }
TEST_CASE("int binary ops match C on int32") { check_int_binops<int32_t>(); }
TEST_CASE("int binary ops match C on uint32") { check_int_binops<uint32_t>(); }
TEST_CASE("int binary ops match C on int64") { check_int_binops<int64_t>(); }
TEST_CASE("int binary ops match C on uint64") { check_int_binops<uint64_t>(); }
TEST_CASE("float ops match C on float32") { check_float_ops<float>(); }
TEST_CASE("float ops match C on float64") { check_float_ops<double>(); }

TEST_CASE("bool ops") {
  auto a = Tensor::from_vector(std::vector<bool>{false, false, true, true});
  auto b = Tensor::from_vector(std::vector<bool>{false, true, false, true});
  CHECK(Tensor(a & b).to_vector<bool>() == std::vector<bool>{false, false, false, true});
  CHECK(Tensor(a | b).to_vector<bool>() == std::vector<bool>{false, true, true, true});
  CHECK(Tensor(a ^ b).to_vector<bool>() == std::vector<bool>{false, true, true, false});
  CHECK(Tensor(~a).to_vector<bool>() == std::vector<bool>{true, true, false, false});
  CHECK(Tensor(a != b).to_vector<bool>() == std::vector<bool>{false, true, true, false});
  CHECK(a.where(Tensor(1), Tensor(2)).to_vector<int32_t>() == std::vector<int32_t>{2, 2, 1, 1});
}

TEST_CASE("half and bfloat16 arithmetic rounds to the dtype") {
  for (DType d : {dtypes::float16, dtypes::bfloat16}) {
    auto av = sample<float>(32, 5), bv = sample<float>(32, 6);
    auto a = Tensor::from_vector(av).cast(d), b = Tensor::from_vector(bv).cast(d);
    auto ar = a.cast(dtypes::float32).to_vector<float>(), br = b.cast(dtypes::float32).to_vector<float>();
    auto s = Tensor(a + b).cast(dtypes::float32).to_vector<float>();
    auto m = Tensor(a * b).cast(dtypes::float32).to_vector<float>();
    for (size_t i = 0; i < 32; i++) {
      CHECK(s[i] == float(truncate_float(double(ar[i]) + double(br[i]), d)));
      CHECK(m[i] == float(truncate_float(double(ar[i]) * double(br[i]), d)));
    }
  }
}

// Row reductions over a realised 16-bit float buffer (and a float32 row whose result is cast to one, fused into the
// same kernel) against float64 loops on the same values. The ops compute in float32 and round once to the dtype:
// within half an ulp of the dtype plus float32's error (2^-20 of the row's scale). The row kernel of softmax once
// stored its float32 exp into the float16 output (reuse_row_values in src/codegen/lower.cpp) and failed to render.
TEST_CASE("softmax, log_softmax, layernorm and reductions of float16 and bfloat16 rows") {
  const int64_t R = 32, N = 4 * 8 * R;
  std::mt19937 g(17);
  std::vector<float> xv(size_t(N), 0.f);
  for (float& v : xv) v = float(std::normal_distribution<double>(0, 2)(g));
  for (DType d : {dtypes::float16, dtypes::bfloat16}) {
    const double eps = d == dtypes::float16 ? 0x1p-10 : 0x1p-7;  // the dtype's ulp at 1
    Tensor x = Tensor::from_vector(xv, {4, 8, R}).cast(d).realize();
    std::vector<double> xs = x.to_doubles();  // the values the kernels read, exactly
    Tensor x32 = Tensor::from_vector(std::vector<float>(xs.begin(), xs.end()), {4, 8, R}).realize();
    // per row: max, sum, mean, biased variance, sum of exps (all float64)
    std::vector<double> mx(N / R), sm(N / R), mean(N / R), var(N / R), se(N / R), sa(N / R);
    for (int64_t r = 0; r < N / R; r++) {
      const double* row = xs.data() + r * R;
      mx[r] = *std::max_element(row, row + R);
      for (int64_t i = 0; i < R; i++) sm[r] += row[i], sa[r] += std::fabs(row[i]), se[r] += std::exp(row[i] - mx[r]);
      mean[r] = sm[r] / double(R);
      for (int64_t i = 0; i < R; i++) var[r] += (row[i] - mean[r]) * (row[i] - mean[r]);
      var[r] /= double(R);
    }
    auto check = [&](const char* what, const Tensor& t, int64_t per, auto ref, auto scale) {
      INFO(what << " in " << d.name());
      REQUIRE(t.dtype() == d);
      std::vector<double> got = t.to_doubles();
      REQUIRE(int64_t(got.size()) == N / per);
      int bad = 0;
      for (int64_t i = 0; i < int64_t(got.size()); i++) {
        double want = ref(i), tol = 0.5 * eps * std::fabs(want) + 0x1p-20 * scale(i) + 1e-7;
        if (!(std::fabs(got[size_t(i)] - want) <= tol) && bad++ < 3) CHECK(got[size_t(i)] == doctest::Approx(want));
      }
      CHECK(bad == 0);
    };
    auto one = [](int64_t) { return 1.0; };
    auto sm_ref = [&](int64_t i) { return std::exp(xs[size_t(i)] - mx[i / R]) / se[i / R]; };
    auto lsm_ref = [&](int64_t i) { return xs[size_t(i)] - mx[i / R] - std::log(se[i / R]); };
    auto ln_ref = [&](int64_t i) { return (xs[size_t(i)] - mean[i / R]) / std::sqrt(var[i / R] + 1e-5); };
    auto row_scale = [&](int64_t i) { return 16 * (1 + std::fabs(mx[i / R])); };
    check("softmax", x.softmax(-1), 1, sm_ref, one);
    check("log_softmax", x.log_softmax(-1), 1, lsm_ref, row_scale);
    check("layernorm", x.layernorm({-1}), 1, ln_ref, [&](int64_t i) { return 16 * std::fabs(ln_ref(i)) + 1; });
    check("float32 softmax cast", x32.softmax(-1).cast(d), 1, sm_ref, one);
    check("float32 log_softmax cast", x32.log_softmax(-1).cast(d), 1, lsm_ref, row_scale);
    check("sum", x.sum(-1), R, [&](int64_t r) { return sm[r]; }, [&](int64_t r) { return 16 * sa[r]; });
    check("max", x.max(-1), R, [&](int64_t r) { return mx[r]; }, [](int64_t) { return 0.0; });
    check("mean", x.mean(-1), R, [&](int64_t r) { return mean[r]; }, [&](int64_t r) { return sa[r]; });
    check("var", x.var({-1}, false, 0), R, [&](int64_t r) { return var[r]; }, [&](int64_t r) { return 64 * var[r]; });
  }
}

// Exact values of a tensor: int64 bit patterns for ints and bool, doubles for floats.
static std::vector<Value> exact(const Tensor& t) {
  std::vector<Value> out;
  auto ints = [&](auto tag) {
    using T = decltype(tag);
    for (auto v : t.to_vector<T>()) out.push_back(Value{int64_t(v), 0});
  };
  switch (t.dtype().scalar) {
    case Scalar::Bool: for (bool v : t.to_vector<bool>()) out.push_back(Value{v, 0}); break;
    case Scalar::Int8: ints(int8_t{}); break;
    case Scalar::UInt8: ints(uint8_t{}); break;
    case Scalar::Int16: ints(int16_t{}); break;
    case Scalar::UInt16: ints(uint16_t{}); break;
    case Scalar::Int32: ints(int32_t{}); break;
    case Scalar::UInt32: ints(uint32_t{}); break;
    case Scalar::Int64: ints(int64_t{}); break;
    case Scalar::UInt64: ints(uint64_t{}); break;
    default: for (double v : t.to_doubles()) out.push_back(Value{0, v});
  }
  return out;
}

TEST_CASE("casts between all dtypes agree with exec_alu") {
  std::vector<DType> all = {dtypes::bool_,  dtypes::int8,   dtypes::uint8,   dtypes::int16,   dtypes::uint16,
                            dtypes::int32,  dtypes::uint32, dtypes::int64,   dtypes::uint64,  dtypes::float16,
                            dtypes::bfloat16, dtypes::float32, dtypes::float64};
  std::vector<double> vals = {0, 1, -1, 2.5, -3.75, 100, 200, -129, 65504, 1e6};
  auto src = Tensor::from_vector(vals);
  for (DType from : all) {
    Tensor s = src.cast(from);
    s.realize();
    auto sv = exact(s);
    for (DType to : all) {
      auto got = exact(s.cast(to));
      for (size_t i = 0; i < vals.size(); i++) {
        // float -> int of inf, NaN or values beyond int64 is undefined in C (and in PyTorch): not compared
        if (dtypes::is_float(from) && !dtypes::is_float(to) && !dtypes::is_bool(to) &&
            !(std::isfinite(sv[i].f) && std::abs(sv[i].f) < 9.2e18))
          continue;
        Value r = exec_alu(Ops::CAST, to, std::span<const Value>(&sv[i], 1), from);
        INFO("cast " << from.name() << " -> " << to.name() << " of value #" << i);
        if (dtypes::is_float(to)) CHECK(got[i].f == r.f);
        else CHECK(got[i].i == r.i);
      }
    }
  }
}
