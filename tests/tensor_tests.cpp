// Tensor primitives against plain C++ reference loops, and kernel counts of known programs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "scoped_env.hpp"
#include "test_util.hpp"
#include "tg/codegen.hpp"
#include "tg/device.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {
std::vector<float> iota_f(size_t n, float start = 0, float step = 1) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = start + float(i) * step;
  return v;
}
// Whether the default device runs kernels' loops in order (the CPU), where the scheduler fuses rows.
bool serial_default_device() { return get_device(default_device()).renderer().grid_limits().threads == 0; }
// Number of kernels one realize of t launches.
size_t count_kernels(Tensor t) {
  size_t before = kernels_run();
  t.realize();
  return kernels_run() - before;
}
}  // namespace

TEST_CASE("elementwise add of two tensors") {
  auto a = Tensor::from_vector(iota_f(6), {2, 3});
  auto b = Tensor::from_vector(iota_f(6, 10), {2, 3});
  Tensor c = a + b;
  auto v = c.to_vector<float>();
  REQUIRE(v.size() == 6);
  for (size_t i = 0; i < 6; i++) CHECK(v[i] == float(i) + float(i) + 10);
}

TEST_CASE("broadcasting with scalars and size-1 dims") {
  auto a = Tensor::from_vector(iota_f(3), {3, 1});
  auto b = Tensor::from_vector(iota_f(4), {1, 4});
  Tensor c = a * b + 1;
  CHECK(c.shape() == Shape{3, 4});
  auto v = c.to_vector<float>();
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) CHECK(v[size_t(i * 4 + j)] == float(i * j + 1));
  CHECK_THROWS_AS((void)Tensor(Tensor::from_vector(iota_f(3)) + Tensor::from_vector(iota_f(4))), Error);
}

TEST_CASE("dtype promotion follows torch") {
  auto i8 = Tensor::from_vector(std::vector<int8_t>{1, 2});
  auto u8 = Tensor::from_vector(std::vector<uint8_t>{1, 2});
  auto f16 = Tensor::ones({2}, dtypes::float16);
  CHECK(Tensor(i8 + u8).dtype() == dtypes::int16);
  CHECK(Tensor(i8 + 1).dtype() == dtypes::int8);
  CHECK(Tensor(i8 + 1.5).dtype() == dtypes::float32);
  CHECK(Tensor(f16 + 1.5).dtype() == dtypes::float16);
  CHECK(Tensor(f16 + i8).dtype() == dtypes::float16);
  CHECK(Tensor(i8 < 1).dtype() == dtypes::bool_);
  CHECK(Tensor(i8 / 2).dtype() == dtypes::float32);
}

TEST_CASE("int ops have C and torch semantics") {
  auto a = Tensor::from_vector(std::vector<int32_t>{-7, 7, -7, 7, 0});
  auto b = Tensor::from_vector(std::vector<int32_t>{2, 2, -2, -2, 3});
  CHECK(Tensor(a % b).to_vector<int32_t>() == std::vector<int32_t>{1, 1, -1, -1, 0});  // floor remainder
  CHECK(a.idiv(b).to_vector<int32_t>() == std::vector<int32_t>{-4, 3, 3, -4, 0});      // floor division
  CHECK(Tensor(a & 3).to_vector<int32_t>() == std::vector<int32_t>{-7 & 3, 7 & 3, -7 & 3, 7 & 3, 0});
  CHECK(Tensor(a << 2).to_vector<int32_t>() == std::vector<int32_t>{-28, 28, -28, 28, 0});
  CHECK(Tensor(~a).to_vector<int32_t>() == std::vector<int32_t>{6, -8, 6, -8, -1});
  auto u = Tensor::from_vector(std::vector<uint8_t>{250, 3});
  CHECK(Tensor(u + 10).to_vector<uint8_t>() == std::vector<uint8_t>{4, 13});  // wraps
}

TEST_CASE("movement ops: reshape, permute, expand, pad, shrink, flip") {
  auto a = Tensor::from_vector(iota_f(6), {2, 3});
  CHECK(a.T().contiguous().to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(a.reshape({3, 2}).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(a.flip({1}).to_vector<float>() == std::vector<float>{2, 1, 0, 5, 4, 3});
  CHECK(a.shrink({{1, 2}, {0, 2}}).to_vector<float>() == std::vector<float>{3, 4});
  CHECK(a.pad({{0, 1}, {1, 0}}).to_vector<float>() == std::vector<float>{0, 0, 1, 2, 0, 3, 4, 5, 0, 0, 0, 0});
  CHECK(a.pad({{0, 0}, {1, 1}}, -1).to_vector<float>() == std::vector<float>{-1, 0, 1, 2, -1, -1, 3, 4, 5, -1});
  CHECK(a.reshape({2, 1, 3}).expand({2, 2, 3}).to_vector<float>() ==
        std::vector<float>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
  CHECK(Tensor(a.pad({{1, 1}, {1, 1}}) + 1).sum().item<float>() == 15 + 20);
  CHECK_THROWS_AS(a.reshape({4, 2}), Error);
  CHECK_THROWS_AS(a.permute({0, 0}), Error);
  CHECK_THROWS_AS(a.shrink({{0, 3}, {0, 1}}), Error);
  CHECK_THROWS_AS(a.sum(2), Error);
}

TEST_CASE("slicing with steps and negative indices") {
  auto a = Tensor::from_vector(iota_f(10));
  CHECK(a.slice({Slice{2, 8, 3}}).to_vector<float>() == std::vector<float>{2, 5});
  CHECK(a.slice({Slice{std::nullopt, std::nullopt, -1}}).to_vector<float>() ==
        std::vector<float>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  CHECK(a.slice({Slice{-3, std::nullopt, 1}}).to_vector<float>() == std::vector<float>{7, 8, 9});
  CHECK(a.slice({Slice{8, 1, -3}}).to_vector<float>() == std::vector<float>{8, 5, 2});
  CHECK(a.slice({Slice{5, 2, 1}}).numel() == 0);
}

TEST_CASE("reductions over any axes with keepdim") {
  auto a = Tensor::from_vector(iota_f(24), {2, 3, 4});
  CHECK(a.sum().item<float>() == 276);
  auto s1 = a.sum(1);
  CHECK(s1.shape() == Shape{2, 4});
  CHECK(s1.to_vector<float>() == std::vector<float>{12, 15, 18, 21, 48, 51, 54, 57});
  auto s02 = a.sum({0, 2}, true);
  CHECK(s02.shape() == Shape{1, 3, 1});
  CHECK(s02.to_vector<float>() == std::vector<float>{60, 92, 124});
  CHECK(a.max(2).to_vector<float>() == std::vector<float>{3, 7, 11, 15, 19, 23});
  CHECK(a.min(0).to_vector<float>() == iota_f(12));
  CHECK(a.mean().item<float>() == doctest::Approx(11.5));
  auto p = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4});
  CHECK(p.prod().item<int64_t>() == 24);
  CHECK(p.sum().dtype() == dtypes::int64);
}

TEST_CASE("creation: full, arange, eye, rand") {
  CHECK(Tensor::full({2, 2}, 3.5).to_vector<float>() == std::vector<float>{3.5, 3.5, 3.5, 3.5});
  CHECK(Tensor::arange(5).to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2, 3, 4});
  {  // a float arange is start + i * step in double, rounded once to the dtype (past float32's range: +-inf)
    std::vector<float> f = Tensor::arange(0.5, 1200.1, 0.3, dtypes::float32).to_vector<float>();
    REQUIRE(f.size() == 3999);
    bool exact = true;
    for (size_t i = 0; i < f.size(); i++) exact &= f[i] == float(0.5 + double(i) * 0.3);
    CHECK(exact);
    std::vector<double> d = Tensor::arange(-3.0, 7.7, 0.1, dtypes::float64).to_vector<double>();
    REQUIRE(d.size() == 107);
    bool close = true;  // (a build that fuses the multiply-add rounds once less: within an ulp)
    for (size_t i = 0; i < d.size(); i++) close &= std::fabs(d[i] - (-3.0 + double(i) * 0.1)) <= 1e-15;
    CHECK(close);
    std::vector<float> big = Tensor::arange(3e38, 4e38, 0.5e38, dtypes::float32).to_vector<float>();
    CHECK(big == std::vector<float>{3e38f, std::numeric_limits<float>::infinity()});
    std::vector<uint16_t> h = Tensor::arange(0.0, 1.0, 0.25, dtypes::float16).bitcast(dtypes::uint16).to_vector<uint16_t>();
    CHECK(h == std::vector<uint16_t>{0x0000, 0x3400, 0x3800, 0x3A00});
  }
  CHECK(Tensor::eye(3).to_vector<float>() == std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  Tensor::manual_seed(42);
  auto r1 = Tensor::rand({1000}).to_vector<float>();
  Tensor::manual_seed(42);
  auto r2 = Tensor::rand({1000}).to_vector<float>();
  CHECK(r1 == r2);
  double mean = std::accumulate(r1.begin(), r1.end(), 0.0) / 1000;
  CHECK(mean == doctest::Approx(0.5).epsilon(0.1));
  for (float v : r1) CHECK((v >= 0 && v < 1));
  auto n = Tensor::randn({4000}).to_vector<float>();
  double m = 0, var = 0;
  for (float v : n) m += v;
  m /= 4000;
  for (float v : n) var += (v - m) * (v - m);
  var /= 4000;
  CHECK(std::abs(m) < 0.1);
  CHECK(var == doctest::Approx(1.0).epsilon(0.1));
}

namespace {
// threefry2x32-20 on the host, tg's key schedule: the reference for Tensor::rand's bits.
uint32_t threefry_ref(uint32_t x0, uint32_t x1, uint32_t k0, uint32_t k1) {
  static const int rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  x0 += ks[0];
  x1 += ks[1];
  for (int i = 0; i < 5; i++) {
    for (int r : rot[i % 2]) {
      x0 += x1;
      x1 = (x1 << r) | (x1 >> (32 - r));
      x1 ^= x0;
    }
    x0 += ks[(i + 1) % 3];
    x1 += ks[(i + 2) % 3] + uint32_t(i) + 1u;
  }
  return x0;
}
float rand_ref(uint64_t seed, uint32_t draw, uint32_t i) {
  uint32_t bits = threefry_ref(i, 0, uint32_t(seed ^ (seed >> 32)), draw);
  uint32_t f = (bits >> 9) | 0x3f800000u;
  float v;
  std::memcpy(&v, &f, 4);
  return v - 1.0f;
}
}  // namespace

TEST_CASE("rand: draw k after manual_seed(s) is threefry keyed by (s, k), bit for bit") {
  for (uint64_t seed : {uint64_t(0), uint64_t(42), uint64_t(0x123456789abcdefull)}) {
    Tensor::manual_seed(seed);
    for (uint32_t draw = 0; draw < 3; draw++) {
      auto got = Tensor::rand({37}).to_vector<float>();
      for (uint32_t i = 0; i < 37; i++) CHECK(got[i] == rand_ref(seed, draw, i));
    }
  }
}

TEST_CASE("rand: a lazy draw keeps its numbers when a later draw is realised first") {
  Tensor::manual_seed(8);
  Tensor a = Tensor::rand({16}), b = Tensor::rand({16});
  auto vb = b.to_vector<float>(), va = a.to_vector<float>();  // b realised before a
  Tensor::manual_seed(8);
  auto wa = Tensor::rand({16}).to_vector<float>(), wb = Tensor::rand({16}).to_vector<float>();
  CHECK(va == wa);
  CHECK(vb == wb);
  CHECK(va != vb);
  for (uint32_t i = 0; i < 16; i++) CHECK(va[i] == rand_ref(8, 0, i));
}

TEST_CASE("kernel counts of known programs") {
  auto a = Tensor::from_vector(iota_f(64), {8, 8});
  auto b = Tensor::from_vector(iota_f(64, 1), {8, 8});
  CHECK(count_kernels(Tensor(a + b).sum()) == 1);
  CHECK(count_kernels((a.reshape({8, 1, 8}) * b.T().reshape({1, 8, 8})).sum(2)) == 1);
  // Row fusion (the CPU; a GPU-style device keeps each reduce in a kernel of its own): the full sum runs once,
  // before the row loop
  const bool rows = serial_default_device();
  CHECK(count_kernels(Tensor(a.sum() + a.sum(1))) == (rows ? 1u : 2u));
  Tensor x = a;
  for (int i = 0; i < 50; i++) x = x * 1.01 + 0.5;
  CHECK(count_kernels(x) == 1);
  Tensor e = Tensor(a - a.max(1, true)).exp();
  CHECK(count_kernels(Tensor(e / e.sum(1, true))) == (rows ? 1u : 3u));  // softmax: one row kernel (below)
  // Fusion cost: relu(a + b) broadcast 8 times into a matmul-shaped reduce is computed once (its own kernel);
  // a plain buffer broadcast the same way is not.
  Tensor h = Tensor(a + b).relu();
  CHECK(count_kernels((h.reshape({8, 1, 8}) * b.T().reshape({1, 8, 8})).sum(2)) == 2);
  CHECK(count_kernels((a.reshape({8, 1, 8}) * b.T().reshape({1, 8, 8})).sum(2)) == 1);
  // A reduce result used twice is computed once.
  Tensor s = a.sum(1, true) + 1;
  CHECK(count_kernels(Tensor(s * a + s.exp())) == 2);
}

TEST_CASE("a slice inside one input of a cat: the other input's buffer is unread but stays a kernel parameter") {
  // (the gated load of `a` folds away; the kernel once failed to render with "PARAM 2 is missing")
  Tensor buf = Tensor::from_vector(iota_f(8), {8});
  Tensor a = Tensor::full({4}, 1.0), b = Tensor::full({4}, 2.0);
  a.realize(), b.realize();
  CHECK(Tensor(buf + cat({a, b}, 0)).shrink({{4, 8}}).to_vector<float>() == std::vector<float>{6, 7, 8, 9});
  CHECK(Tensor(buf + cat({a, b}, 0)).shrink({{0, 4}}).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("row fusion: a reduce broadcast back over its innermost axes stays in its consumer's kernel") {
  std::vector<float> v(6 * 40);
  for (size_t i = 0; i < v.size(); i++) v[i] = float((i * 37) % 23) * 0.25f - 2.0f;
  auto a = Tensor::from_vector(v, {6, 40});
  // The reference: each row by hand, in double.
  std::vector<double> sm(v.size()), ln(v.size());
  for (size_t r = 0; r < 6; r++) {
    double mx = -1e30, s = 0, mean = 0, var = 0;
    for (size_t c = 0; c < 40; c++) mx = std::max(mx, double(v[r * 40 + c])), mean += v[r * 40 + c] / 40.0;
    for (size_t c = 0; c < 40; c++) s += std::exp(double(v[r * 40 + c]) - mx), var += std::pow(v[r * 40 + c] - mean, 2) / 40;
    for (size_t c = 0; c < 40; c++)
      sm[r * 40 + c] = std::exp(double(v[r * 40 + c]) - mx) / s, ln[r * 40 + c] = (v[r * 40 + c] - mean) / std::sqrt(var + 1e-5);
  }
  const bool rows = serial_default_device();  // on a GPU-style device each reduce keeps its own kernel
  auto check = [&](Tensor t, const std::vector<double>& want, size_t kernels) {
    size_t n = count_kernels(t);
    if (rows) CHECK(n == kernels);
    std::vector<float> got = t.to_vector<float>();
    for (size_t i = 0; i < want.size(); i++) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(1));
  };
  check(a.softmax(1), sm, 1);                    // max, sum and the output loop: one pass each over a row
  check(a.layer_norm({40}), ln, 1);              // mean, variance, output
  check(a.T().softmax(0).T().contiguous(), sm, 1);  // the same rows reached through a transpose
  // The reduced axis is not the inner one of the output (a transposed result, a batch statistic): the reduce
  // would run again for every output element, so it is computed into a buffer first.
  Tensor t = a.softmax(1).T().contiguous();
  CHECK(count_kernels(t) > 1);
  std::vector<float> tv = t.to_vector<float>();
  for (size_t r = 0; r < 6; r++)
    for (size_t c = 0; c < 40; c++) CHECK(tv[c * 6 + r] == doctest::Approx(sm[r * 40 + c]).epsilon(1e-5));
  if (!rows) return;
  CHECK(count_kernels(Tensor(a - a.mean(0, true))) == 2);
  {
    ScopedEnv off("FUSE_REDUCE_ROWS", "0");
    Tensor b = Tensor::from_vector(v, {40, 6});
    CHECK(count_kernels(b.softmax(1)) == 3);  // max, sum, output
  }
}

TEST_CASE("a reduce many times larger than its output splits into partial sums and a sum of them") {
  // a batch statistic: (512, 8, 10, 10) summed to (8,)
  std::vector<float> v(512 * 8 * 100);
  for (size_t i = 0; i < v.size(); i++) v[i] = float((i * 7919) % 1000) / 250.0f - 2.0f;
  Tensor x = Tensor::from_vector(v, {512, 8, 10, 10});
  CHECK(count_kernels(x.sum({0, 2, 3})) == 2);  // 51200 times its output (the threshold is 16384): split
  CHECK(count_kernels(x.shrink({{0, 16}, {0, 8}, {0, 10}, {0, 10}}).sum({0, 2, 3})) == 1);  // 1600 times: one kernel
  Tensor big = Tensor::from_vector(std::vector<float>(v.begin(), v.end()), {512, 8, 10, 10}).reshape({512 * 8 * 100});
  CHECK(count_kernels(big.sum()) == 2);  // a full sum of 409600: partial sums over chunks, then their sum
  double ref = 0;
  for (float f : v) ref += double(f);
  CHECK(std::abs(double(big.sum().item<float>()) - ref) < 0.05);  // n * eps * max|v|: float32 rounding of 409600 terms
  Tensor m = Tensor::from_vector(v, {512, 8, 100}).permute({1, 0, 2}).reshape({8, 51200});
  auto rows = m.max(1).to_vector<float>();  // a max over a non-contiguous row splits too
  for (size_t c = 0; c < 8; c++) {
    float mx = -1e30f;
    for (size_t n = 0; n < 512; n++)
      for (size_t k = 0; k < 100; k++) mx = std::max(mx, v[(n * 8 + c) * 100 + k]);
    CHECK(rows[c] == mx);
  }
  CHECK(count_kernels(m.max(1)) == 2);
}

TEST_CASE("a reduce over the batch and more splits from a quarter of the threshold; one over a row does not") {
  // A weight gradient or a batch statistic over (batch, H, W): 6400 per output, under the threshold (16384) but
  // over its quarter (a data-parallel device's half batch of beautiful_mnist's 3x3 weight gradients: 4608, 8192)
  std::vector<float> v(64 * 8 * 100);
  for (size_t i = 0; i < v.size(); i++) v[i] = float(int((i * 31) % 7) - 3);
  Tensor x = Tensor::from_vector(v, {64, 8, 10, 10});
  CHECK(count_kernels(x.sum({0, 2, 3})) == 2);
  std::vector<float> want(8, 0.f);
  for (size_t i = 0; i < v.size(); i++) want[(i / 100) % 8] += v[i];
  CHECK(x.sum({0, 2, 3}).to_vector<float>() == want);  // small integers: exact
  CHECK(count_kernels(x.reshape({8, 6400}).sum(1)) == 1);           // one axis (a row, a matmul's K): unsplit
  CHECK(count_kernels(x.permute({1, 0, 2, 3}).sum({1, 2, 3})) == 1);  // the batch kept: unsplit
}

TEST_CASE("a split reduce with a large output stores the sum of its chunks in their order: a permuted use reads it after") {
  // A convolution's weight gradient: the chunks' partial sums are (chunks, H, W, C) and the weight is OIHW. Fused
  // with the permute, the sum over the chunks loaded each output's partials as gathers (0.5 GB/s: 14-17 ms of
  // beautiful_mnist's step on 2-core Zen 5, 0.5-0.7 ms as a kernel of its own)
  ScopedEnv th("REDUCEOP_SPLIT_THRESHOLD", "512");
  std::vector<float> v(1024 * 4 * 4 * 64);
  for (size_t i = 0; i < v.size(); i++) v[i] = float(int((i * 7919) % 9) - 4);  // small integers: exact sums
  Tensor x = Tensor::from_vector(v, {1024, 4, 4, 64});
  std::vector<float> want(4 * 4 * 64, 0.f);  // x.sum(0) as (64, 4, 4)
  for (size_t n = 0; n < 1024; n++)
    for (size_t k = 0; k < 4 * 4 * 64; k++) want[(k % 64) * 16 + k / 64] += v[n * 1024 + k];
  Tensor g = x.sum(0).permute({2, 0, 1});
  CHECK(count_kernels(g) == 3);  // the partial sums, their sum (1024 outputs), the permuted copy
  CHECK(g.to_vector<float>() == want);
  Tensor small = x.shrink({{0, 1024}, {0, 4}, {0, 4}, {0, 32}}).sum(0).permute({2, 0, 1});  // 512 outputs: fused
  CHECK(count_kernels(small) == 2);
}

TEST_CASE("the matmul of the README is right") {
  int N = 16;
  auto a = Tensor::rand({N, N}), b = Tensor::rand({N, N});
  Tensor c = (a.reshape({N, 1, N}) * b.T().reshape({1, N, N})).sum(2);
  auto av = a.to_vector<float>(), bv = b.to_vector<float>(), cv = c.to_vector<float>();
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      float s = 0;
      for (int k = 0; k < N; k++) s += av[size_t(i * N + k)] * bv[size_t(k * N + j)];
      CHECK(cv[size_t(i * N + j)] == doctest::Approx(s).epsilon(1e-5));
    }
}

TEST_CASE("assign writes in place and reads see the old value first") {
  auto a = Tensor::from_vector(iota_f(4));
  Tensor old = Tensor(a * 1).contiguous();
  a.assign(Tensor(a + 10));
  realize(old, a);  // one schedule: the copy must read a's buffer before the in-place write (WAR order)
  CHECK(a.to_vector<float>() == std::vector<float>{10, 11, 12, 13});
  CHECK(old.to_vector<float>() == std::vector<float>{0, 1, 2, 3});
  CHECK_THROWS_AS(a.assign(Tensor::zeros({3})), Error);
}

TEST_CASE("a lazy tensor keeps the value it had when defined after an assign overwrites what it reads") {
  auto w = Tensor::from_vector(std::vector<float>{1, 2, 3});
  Tensor sq = Tensor(w * w).sum();                  // lazy: reads w's buffer
  Tensor c = Tensor::zeros({3}).contiguous();
  c.realize();
  c.assign(Tensor(w * 2));                          // a pending assign elsewhere that reads w
  Tensor view = w.reshape({3, 1});                  // a view of w's buffer is an alias, as a torch view
  w.assign(Tensor(w - 1));
  w.realize();
  CHECK(w.to_vector<float>() == std::vector<float>{0, 1, 2});
  CHECK(sq.item<float>() == 14.f);                  // 1 + 4 + 9, not 0 + 1 + 4
  CHECK(c.to_vector<float>() == std::vector<float>{2, 4, 6});
  CHECK(view.to_vector<float>() == std::vector<float>{0, 1, 2});
  Tensor after = Tensor(w * w).sum();               // defined after the write: reads the new values
  CHECK(after.item<float>() == 5.f);
  w += 1;                                           // a compound assignment realised by a host read
  CHECK(w.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(after.item<float>() == 5.f);
  // one schedule with a reader of the old contents and a kernel reading the written ones (x + 1 on the assign)
  auto x = Tensor::from_vector(std::vector<float>{1, 2});
  Tensor y = x * 3;
  x += 1;
  x += 1;                                           // builds on the pending assign: a lazy graph over it
  CHECK(x.to_vector<float>() == std::vector<float>{3, 4});
  CHECK(y.to_vector<float>() == std::vector<float>{3, 6});
  // one kernel reading the old values (a reader no longer held) and the assigned ones: the old from a copy
  // torch: x = torch.tensor([1., 2.]); old = x * 1; x += 1; z = old + x -> [3., 5.]
  auto v = Tensor::from_vector(std::vector<float>{1, 2});
  Tensor z;
  {
    Tensor old = v * 1;
    v += 1;
    z = old + v;
  }
  CHECK(z.to_vector<float>() == std::vector<float>{3, 5});
  CHECK(v.to_vector<float>() == std::vector<float>{2, 3});
}

TEST_CASE("reading back with the wrong type or an unknown device is an error") {
  auto a = Tensor::from_vector(iota_f(4));
  CHECK_THROWS_AS(a.to_vector<int32_t>(), Error);
  CHECK_THROWS_AS(a.to("NOPE"), Error);
  CHECK_THROWS_AS(a.item<float>(), Error);
}

TEST_CASE("casts and bitcasts") {
  auto a = Tensor::from_vector(std::vector<float>{-1.5f, 2.7f, 300.f});
  CHECK(a.cast(dtypes::int32).to_vector<int32_t>() == std::vector<int32_t>{-1, 2, 300});
  CHECK(a.cast(dtypes::uint8).to_vector<uint8_t>()[1] == 2);
  CHECK(a.bitcast(dtypes::uint32).to_vector<uint32_t>()[0] == 0xbfc00000u);
  CHECK(a.cast(dtypes::bool_).to_vector<bool>() == std::vector<bool>{true, true, true});
  auto h = a.cast(dtypes::float16).cast(dtypes::float32).to_vector<float>();
  CHECK(h[0] == -1.5f);
  CHECK(h[1] == 2.69921875f);
}

TEST_CASE("zero-size dims") {
  auto z = Tensor::zeros({0, 3});
  CHECK(z.sum(0).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(Tensor(z + 1).numel() == 0);
}

TEST_CASE("a repeated realize of the same shape of graph skips scheduling") {
  auto a = Tensor::rand({32}), b = Tensor::rand({32});
  realize(a, b);
  Tensor(a * b + 7.5).realize();
  size_t built = schedules_built();
  auto c = Tensor::rand({32}), d = Tensor::rand({32});
  realize(c, d);
  built = schedules_built();
  Tensor e = c * d + 7.5;  // same structure, other buffers
  e.realize();
  CHECK(schedules_built() == built);
  auto cv = c.to_vector<float>(), dv = d.to_vector<float>(), ev = e.to_vector<float>();
  for (size_t i = 0; i < 32; i++) CHECK(ev[i] == cv[i] * dv[i] + 7.5f);
}

TEST_CASE("the memory planner gives a kernel's output the smallest dead buffer that holds it, again and again") {
  ScopedEnv one("MULTI_OUTPUT", "0");  // one kernel per materialised node
  auto x = Tensor::rand({1024});
  x.realize();
  Tensor t1 = Tensor(x + 1).contiguous();                               // 1024: A
  Tensor t2 = Tensor(t1 * 2).contiguous();                              // 1024: B (t1 dead after this)
  Tensor t3 = Tensor(t2.shrink({{0, 512}}) * 3).contiguous();           // 512: in A, the smallest dead one
  Tensor t4 = Tensor(t3 * 5).contiguous();                              // 512: in B (t2 dead after t3)
  Tensor t5 = Tensor(t4 * 7).contiguous();                              // 512: in A again (t3, in A, dead after t4)
  Tensor out = t5 + 1;
  UOpRef root = out.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(s.items.size() == 6);
  std::vector<const Buffer*> outs;
  for (auto& it : s.items) outs.push_back(it.bufs[0].get());
  CHECK(outs[2] == outs[0]);
  CHECK(outs[3] == outs[1]);
  CHECK(outs[4] == outs[0]);
  CHECK(outs[1] != outs[0]);
  CHECK(outs[5] != outs[0]);  // the result: a buffer of its own
  CHECK(outs[5] != outs[1]);
  run_schedule(s);
  auto xv = x.to_vector<float>();
  Tensor res(s.becomes[0].second, {512}, "CPU");
  auto rv = res.to_vector<float>();
  for (size_t i = 0; i < 512; i++) CHECK(rv[i] == doctest::Approx((((xv[i] + 1) * 2) * 3 * 5) * 7 + 1));
}

TEST_CASE("plan_reuse: storage is free after its buffer's last step, for the same device and dtype, exact for a copy") {
  // 0: an input; 1..3 intermediates of 64 floats, 4 of 32; 5 of 64 on another device; 6 of 16 int32; 7 a copy's
  // 32-float buffer
  auto f32 = [](int64_t size, const char* dev = "CPU") { return ReuseBuffer{dev, dtypes::float32, size, false, true, true}; };
  std::vector<ReuseBuffer> bufs{{"CPU", dtypes::float32, 64}, f32(64), f32(64), f32(64), f32(32), f32(64, "CPU:1"),
                                {"CPU", dtypes::int32, 16, false, true, true}, {"CPU", dtypes::float32, 32, true, true, true}};
  std::vector<std::vector<int>> steps{{1, 0}, {2, 1}, {3, 2}, {4, 3}, {5, 4}, {6, 4}, {7, 6}};
  std::vector<size_t> n_out(steps.size(), 1);
  std::vector<int> got = plan_reuse(bufs, steps, n_out);
  // 2 cannot take 1's storage in the step that reads 1 last; 3 takes it; 4 (32) takes 2's (64, dead after step 2);
  // 5 is on another device, 6 another dtype; 7 (a copy's) only storage of exactly its size: 1's holds 64
  CHECK(got == std::vector<int>{0, 1, 2, 1, 2, 5, 6, 7});
  bufs[3].release = false;  // 3 keeps its storage (a checked kernel's input): 1's stays taken
  bufs[4].take = false;     // 4 takes none: its own 32 floats, free after step 5, are exactly the size 7 needs
  got = plan_reuse(bufs, steps, n_out);
  CHECK(got == std::vector<int>{0, 1, 2, 1, 4, 5, 6, 4});
  // 8, read by step 0 before step 1 writes it, holds a value from before the steps (a replay's state from the one
  // before): its storage is not given to 9 after its last step
  bufs.push_back(f32(64));
  bufs.push_back(f32(64));
  steps = {{1, 8}, {8, 1}, {9, 0}};
  n_out = {1, 1, 1};
  CHECK(plan_reuse(bufs, steps, n_out) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 1});
}

TEST_CASE("the memory planner reuses a dead intermediate buffer") {
  ScopedEnv one("MULTI_OUTPUT", "0");  // one kernel per materialised node (else the chain is one kernel, below)
  auto x = Tensor::rand({256});
  x.realize();
  Tensor t1 = Tensor(x + 1).contiguous();
  Tensor t2 = Tensor(t1 * 2).contiguous();
  Tensor t3 = Tensor(t2 * 3).contiguous();
  Tensor out = t3 + 1;
  UOpRef root = out.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(s.items.size() == 4);
  std::vector<const Buffer*> outs;
  for (auto& it : s.items) outs.push_back(it.bufs[0].get());
  CHECK(outs[0] == outs[2]);  // t3 is written where t1 was: t1 is dead after t2's kernel
  CHECK(outs[1] != outs[0]);
  run_schedule(s);
  Tensor ref = x;
  auto xv = x.to_vector<float>();
  auto buf = s.becomes[0].second;
  Tensor res(buf, {256}, "CPU");
  auto rv = res.to_vector<float>();
  for (size_t i = 0; i < 256; i++) CHECK(rv[i] == doctest::Approx(((xv[i] + 1) * 2) * 3 + 1));
}

TEST_CASE("a per-channel reduce read through a padded channels-last copy is computed once, not per element") {
  // A squeeze-excite scale (a 6-term sum per channel) times a feature map, padded and copied channels-last: the copy's
  // loops are (h, w, c) with c innermost and the pad's valid mask uses h and w, so a fused scale would run its sum
  // for every element (PaddleOCR det's r_162_162_96). It is computed into a buffer first; the copy has no reduce.
  Tensor x = Tensor::rand({1, 24, 8, 8}), a = Tensor::rand({24, 6}), b = Tensor::rand({24, 6});
  x.realize(), a.realize(), b.realize();
  Tensor scale = (a * b).sum(1).reshape({1, 24, 1, 1});
  Tensor y = (x * scale).pad({{0, 0}, {0, 0}, {1, 1}, {1, 1}}).permute({0, 2, 3, 1}).contiguous();
  UOpRef root = y.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(s.items.size() == 2);
  int reduces = 0;
  for (const UOp* u : toposort(s.items.back().ast.get())) reduces += u->op == Ops::REDUCE;
  CHECK(reduces == 0);
  auto xv = x.to_vector<float>(), av = a.to_vector<float>(), bv = b.to_vector<float>(), yv = y.to_vector<float>();
  REQUIRE(yv.size() == size_t(10 * 10 * 24));
  for (int h = 0; h < 10; h++)
    for (int w = 0; w < 10; w++)
      for (int c = 0; c < 24; c++) {
        float sc = 0, want = 0;
        for (int k = 0; k < 6; k++) sc += av[size_t(c * 6 + k)] * bv[size_t(c * 6 + k)];
        if (h >= 1 && h <= 8 && w >= 1 && w <= 8) want = xv[size_t((c * 8 + h - 1) * 8 + w - 1)] * sc;
        CHECK(yv[size_t((h * 10 + w) * 24 + c)] == doctest::Approx(want).epsilon(1e-6));
      }
}

TEST_CASE("a reduce over a reduce's results (a max pool over a convolution) is two kernels, and a 2x2 pool a view") {
  Tensor x = Tensor::rand({2, 3, 8, 8}), w = Tensor::rand({4, 3, 3, 3});
  x.realize(), w.realize();
  Tensor y = x.conv2d(w).max_pool2d(2);
  UOpRef root = y.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  REQUIRE(s.items.size() == 2);  // the convolution into a buffer, then the pool
  int reduces = 0;
  for (const UOp* u : toposort(s.items[1].ast.get())) reduces += u->op == Ops::REDUCE;
  CHECK(reduces == 1);
  // the values: the max of each 2x2 window of the convolution
  std::vector<float> c = x.conv2d(w).to_vector<float>(), p = y.to_vector<float>();
  REQUIRE(p.size() == size_t(2 * 4 * 3 * 3));
  for (int n = 0; n < 2; n++)
    for (int k = 0; k < 4; k++)
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
          auto at = [&](int a, int b) { return c[size_t(((n * 4 + k) * 6 + a) * 6 + b)]; };
          float m = std::max(std::max(at(2 * i, 2 * j), at(2 * i, 2 * j + 1)), std::max(at(2 * i + 1, 2 * j), at(2 * i + 1, 2 * j + 1)));
          CHECK(p[size_t(((n * 4 + k) * 3 + i) * 3 + j)] == m);
        }
}

TEST_CASE("a reduce read through a view with several users (RoPE's pairs of a projection) runs once, in its own kernel") {
  // k = x W^T viewed as (pairs, 2); the rotated pair (k0 c - k1 s, k0 s + k1 c) reads both halves in both outputs.
  // Fused, each output element ran the projection's reduce once per half it read (4 reduces in one kernel).
  Tensor x = Tensor::rand({1, 64}), w = Tensor::rand({32, 64}), cs = Tensor::rand({16}), sn = Tensor::rand({16});
  Tensor::realize_all({&x, &w, &cs, &sn});
  Tensor k = x.matmul(w.T()).reshape({16, 2});
  Tensor k0 = k.shrink({{0, 16}, {0, 1}}).reshape({16}), k1 = k.shrink({{0, 16}, {1, 2}}).reshape({16});
  Tensor y = stack({Tensor(k0 * cs - k1 * sn), Tensor(k0 * sn + k1 * cs)}, -1);
  UOpRef root = y.uop();
  Schedule s = create_schedule(std::span<const UOpRef>(&root, 1));
  int reduces = 0;
  for (const ScheduleItem& it : s.items)
    for (const UOp* u : toposort(it.ast.get())) reduces += u->op == Ops::REDUCE;
  CHECK(reduces == 1);
  CHECK(s.items.size() == 2);  // the projection, then the rotation
  std::vector<float> kv = x.matmul(w.T()).to_vector<float>(), c = cs.to_vector<float>(), n = sn.to_vector<float>(), got = y.to_vector<float>();
  for (size_t i = 0; i < 16; i++) {
    CHECK(got[2 * i] == doctest::Approx(kv[2 * i] * c[i] - kv[2 * i + 1] * n[i]).epsilon(1e-5));
    CHECK(got[2 * i + 1] == doctest::Approx(kv[2 * i] * n[i] + kv[2 * i + 1] * c[i]).epsilon(1e-5));
  }
}

TEST_CASE("to(device) copies between devices") {
  auto a = Tensor::from_vector(iota_f(5));
  Tensor b = Tensor(a * 2).to("CPU:1");
  CHECK(b.device() == "CPU:1");
  Tensor c = b + 1;
  CHECK(c.to_vector<float>() == std::vector<float>{1, 3, 5, 7, 9});
  CHECK(a.to(a.device()).uop() == a.uop());  // the same device: no copy
}

TEST_CASE("shapes whose size overflows are refused") {
  int64_t big = int64_t(1) << 40;
  CHECK_THROWS_AS(Tensor::zeros({big, big}), Error);
  CHECK_THROWS_AS(Tensor::empty({-1, 2}), Error);
  CHECK_THROWS_AS(Tensor::ones({2}).reshape({big, big}), Error);
}

TEST_CASE("two tensors with equal graphs stay distinct under assign") {
  Tensor a = Tensor::zeros({4}).contiguous(), b = Tensor::zeros({4}).contiguous();
  realize(a, b);
  a.assign(Tensor::ones({4}));
  a.realize();
  CHECK(a.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  CHECK(b.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  auto x = Tensor::from_vector(iota_f(4));
  Tensor c = x + 1, d = x + 1;  // the same graph: realised to one buffer, copied on the first write
  realize(c, d);
  c.assign(Tensor::zeros({4}));
  c.realize();
  CHECK(d.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(c.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
}

// torch computes the statistics of 16-bit floats in float32 ("opmath") and rounds the result once: a float16 sum
// or square overflows at 65504 (squares of values above 256), and bfloat16 keeps 8 bits.
TEST_CASE("float16 and bfloat16 statistics are computed in float32 and rounded once") {
  // 70000 ones: their float16 sum is inf, their mean 1; a softmax over 70000 equal values is 1/70000 each
  CHECK(Tensor::ones({70000}).cast(dtypes::float16).mean().cast(dtypes::float32).item<float>() == 1.0f);
  Tensor sm = Tensor::zeros({70000}).cast(dtypes::float16).softmax(-1);
  CHECK(sm.dtype() == dtypes::float16);
  CHECK(sm.cast(dtypes::float32).max().item<float>() == float(truncate_float(1.0 / 70000, dtypes::float16)));
  std::mt19937 g(11);
  std::normal_distribution<float> nd(300.0f, 20.0f);
  std::vector<float> v(8 * 512);
  for (float& x : v) x = nd(g);
  for (DType d : {dtypes::float16, dtypes::bfloat16}) {
    CAPTURE(d.name());
    Tensor x = Tensor::from_vector(v, {8, 512}).cast(d), xf = x.cast(dtypes::float32);
    auto same = [&](const Tensor& low, const Tensor& f32, const std::string& what) {
      CAPTURE(what);
      CHECK(low.dtype() == d);
      std::vector<float> a = low.cast(dtypes::float32).to_vector<float>(), b = f32.cast(d).cast(dtypes::float32).to_vector<float>();
      CHECK(std::all_of(a.begin(), a.end(), [](float e) { return std::isfinite(e); }));
      CHECK(a == b);
    };
    same(x.mean(std::vector<int64_t>{1}), xf.mean(std::vector<int64_t>{1}), "mean");
    same(x.var(std::vector<int64_t>{1}), xf.var(std::vector<int64_t>{1}), "var");
    same(x.std(std::vector<int64_t>{1}), xf.std(std::vector<int64_t>{1}), "std");
    same(x.layer_norm({512}), xf.layer_norm({512}), "layer_norm");
    same(x.reshape({8, 4, 128}).group_norm(2), xf.reshape({8, 4, 128}).group_norm(2), "group_norm");
    same(x.rms_norm({512}, std::nullopt, 1e-6), xf.rms_norm({512}, std::nullopt, 1e-6), "rms_norm");
    same(x.reshape({8, 512, 1}).batch_norm({}, {}, {}, {}, true), xf.reshape({8, 512, 1}).batch_norm({}, {}, {}, {}, true),
         "batch_norm");
    same(x.softmax(1), xf.softmax(1), "softmax");
    same(x.log_softmax(1), xf.log_softmax(1), "log_softmax");
    same(x.logsumexp(std::vector<int64_t>{1}), xf.logsumexp(std::vector<int64_t>{1}), "logsumexp");
  }
}

TEST_CASE("a host read in the middle of a pending graph walks only what was built after the nodes it realises") {
  std::vector<float> xs = iota_f(8, 1);
  Tensor x = Tensor::from_vector(xs, {8});
  // A long pending chain, every step held by a live tensor (as the ONNX runner holds every intermediate value).
  std::vector<Tensor> chain{x};
  for (int i = 0; i < 200; i++) chain.push_back(Tensor(chain.back() * 1.0f + float(i % 3)));
  size_t pending = toposort(chain.back().uop().get()).size();
  REQUIRE(pending > 400);
  // A read of a small graph built afterwards (a Reshape reading its shape input): nothing older is walked.
  size_t v0 = becomes_visits();
  Tensor small = Tensor(x + 1.0f).sum();
  CHECK(small.item<float>() == doctest::Approx(44));
  CHECK(becomes_visits() - v0 == 0);
  // Realising a node that newer pending graphs use: only those newer graphs are walked, and they now read its buffer.
  std::vector<Tensor> users;
  for (int i = 0; i < 3; i++) users.push_back(Tensor(chain[100] + float(i)));
  // Each node built after chain[100] at most once (the chain's later half, its users, `small`): before, each of the
  // 200 live tensors' graphs was rewritten in full (about 200 * 200 nodes).
  std::vector<UOpRef> held;
  for (auto& t : chain) held.push_back(t.uop());
  for (auto& t : users) held.push_back(t.uop());
  held.push_back(small.uop());
  size_t newer = 0;
  for (const UOp* u : toposort(held)) newer += u->seq() > chain[100].uop()->seq() ? 1 : 0;
  held.clear();
  size_t v1 = becomes_visits();
  chain[100].realize();
  size_t walked = becomes_visits() - v1;
  CHECK(walked > 0);
  CHECK(walked <= newer);
  const UOp* buf = contiguous_buffer(chain[100].uop().get());
  REQUIRE(buf != nullptr);
  for (auto& u : users) {
    auto nodes = toposort(u.uop().get());
    CHECK(std::find(nodes.begin(), nodes.end(), buf) != nodes.end());
  }
  // Values: chain[k] = x + sum_{i<k} (i % 3).
  auto expect = [&](int k, float extra) {
    std::vector<float> e(xs);
    float add = 0;
    for (int i = 0; i < k; i++) add += float(i % 3);
    for (auto& v : e) v += add + extra;
    return e;
  };
  CHECK(users[2].to_vector<float>() == expect(100, 2));
  CHECK(chain[200].to_vector<float>() == expect(200, 0));
}

namespace {
// IDIV and MOD ops in the lowered programs (CPU renderer) of the kernels that realise t, and the kernel count.
std::pair<int, size_t> divmods_of(const Tensor& t) {
  Schedule s = create_schedule(std::vector<UOpRef>{t.uop()});
  int n = 0;
  size_t kernels = 0;
  for (auto& it : s.items) {
    if (it.kind != ScheduleItem::Kind::Kernel) continue;
    kernels++;
    for (const UOp* u : lower_kernel(it.ast, "k", get_device("CPU").renderer()).program)
      n += u->op == Ops::IDIV || u->op == Ops::MOD;
  }
  return {n, kernels};
}
}  // namespace

TEST_CASE("a padded tensor read through a reshape indexes without divisions: its valid bounds the index") {
  // (y-1)*64 + (x-1) decoded by // and % through the reshape: under the pad's valid, y-1 and x-1 lie in [0, 64), so
  // the decode folds away (5 IDIV/MOD before).
  std::vector<float> xs = iota_f(3 * 64 * 64);
  Tensor x = Tensor::from_vector(xs, {1, 3 * 64 * 64}, "CPU");
  Tensor z = Tensor(x * 2.0f).reshape({1, 3, 64, 64}).pad({{0, 0}, {0, 0}, {1, 1}, {1, 1}}).contiguous();
  auto [divmods, kernels] = divmods_of(z);
  CHECK(kernels == 1);
  CHECK(divmods == 0);
  std::vector<float> got = z.to_vector<float>();
  REQUIRE(got.size() == size_t(3 * 66 * 66));
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < 66; y++)
      for (int w = 0; w < 66; w++) {
        bool in = y >= 1 && y <= 64 && w >= 1 && w <= 64;
        float want = in ? 2.0f * xs[size_t(c * 4096 + (y - 1) * 64 + (w - 1))] : 0.0f;
        if (got[size_t((c * 66 + y) * 66 + w)] != want) FAIL("c=" << c << " y=" << y << " x=" << w);
      }
  // A detection stem: 3x3 stride-2 conv with bias, an affine, hardswish, and the next conv's padding.
  Tensor img = Tensor::rand({1, 3, 64, 64}, dtypes::float32, "CPU"), wt = Tensor::rand({16, 3, 3, 3}, dtypes::float32, "CPU");
  Tensor bias = Tensor::rand({16}, dtypes::float32, "CPU"), scale = Tensor::rand({1, 16, 1, 1}, dtypes::float32, "CPU");
  Tensor::realize_all({&img, &wt, &bias, &scale});
  Tensor stem = Tensor(img.conv2d(wt, bias, 2, 1) * scale).hardswish().pad({{0, 0}, {0, 0}, {1, 1}, {1, 1}}).contiguous();
  auto [stem_divmods, stem_kernels] = divmods_of(stem);
  // channels-last on the CPU (16 output channels: pm_layout): the input and weight copies, the convolution, and the
  // epilogue with the padding reading its result back in NCHW
  CHECK(stem_kernels == 4);
  CHECK(stem_divmods == 0);
}

TEST_CASE("a multi-output kernel stores every materialised node of an elementwise chain, each read in registers") {
  auto x = Tensor::rand({256});
  x.realize();
  Tensor t1 = Tensor(x + 1).contiguous();
  Tensor t2 = Tensor(t1 * 2).contiguous();
  Tensor t3 = Tensor(t2.sqrt() * t1).contiguous();
  Tensor out = t3 + 1;
  std::vector<UOpRef> roots{t1.uop(), t2.uop(), out.uop()};
  Schedule s = create_schedule(roots);
  REQUIRE(s.items.size() == 1);
  CHECK(s.items[0].ast->nsrc() == 4);  // t1, t2, t3 and out stored by one kernel
  size_t loads = 0;
  for (const UOp* u : toposort(s.items[0].ast.get())) loads += u->op == Ops::LOAD;
  CHECK(loads == 1);  // x, once
  size_t k0 = kernels_run();
  Tensor::realize_all({&t1, &t2, &out});
  CHECK(kernels_run() - k0 == 1);
  auto xv = x.to_vector<float>(), v1 = t1.to_vector<float>(), v2 = t2.to_vector<float>(), vo = out.to_vector<float>();
  for (size_t i = 0; i < 256; i++) {
    float a = xv[i] + 1, b = a * 2;
    CHECK(v1[i] == a);
    CHECK(v2[i] == b);
    CHECK(vo[i] == std::sqrt(b) * a + 1);
  }
  // a node read at another element (through a movement op) is not computed in its reader's kernel
  Tensor f = Tensor(x * 3).contiguous();
  Tensor g = f.flip(std::vector<int64_t>{0}) + f;
  k0 = kernels_run();
  Tensor::realize_all({&f, &g});
  CHECK(kernels_run() - k0 == 2);
  auto fv = f.to_vector<float>(), gv = g.to_vector<float>();
  for (size_t i = 0; i < 256; i++) CHECK(gv[i] == fv[255 - i] + fv[i]);
}

namespace {
// The realize map's graphs as DEBUG=5 prints them, one per pass: one "BUFFERIZE i: ..." line per materialised node,
// one "row BUFFERIZE i: ..." line per row-fused reduce, then the counts.
std::vector<std::vector<std::string>> realize_map_passes(const Tensor& t) {
  UOpRef root = t.uop();
  std::string err = test::stderr_of([&] {
    ScopedEnv dbg("DEBUG", "5");
    create_schedule(std::span<const UOpRef>(&root, 1));
  });
  std::vector<std::vector<std::string>> passes;
  for (size_t at = err.find("--- schedule: realize map"); at != std::string::npos;
       at = err.find("--- schedule: realize map", at + 1)) {
    std::string part = err.substr(at, err.find("--- schedule: group outputs", at) - at);
    std::vector<std::string> lines;
    for (size_t p = 0, q; p < part.size(); p = q + 1) {
      q = std::min(part.find('\n', p), part.size());
      std::string line = part.substr(p, q - p);
      if (line.rfind("  BUFFERIZE ", 0) == 0 || line.rfind("  row BUFFERIZE ", 0) == 0 ||
          line.find(" BUFFERIZE, ") != std::string::npos)
        lines.push_back(line);
    }
    passes.push_back(std::move(lines));
  }
  return passes;
}
std::vector<std::string> bufferize_lines(const Tensor& t) {
  auto passes = realize_map_passes(t);
  REQUIRE(!passes.empty());
  return passes[0];
}
}  // namespace

namespace {
// The kernel graph as DEBUG=5 prints it after "bufferize to store": one node per line, "i OP dtype [sources] arg".
struct GraphLine {
  std::string op;
  std::vector<size_t> src;
};
std::vector<GraphLine> kernel_graph_of(std::vector<UOpRef> roots, const char* stage = "bufferize to store",
                                       const char* next = "linearize") {
  std::string err = test::stderr_of([&] {
    ScopedEnv dbg("DEBUG", "5");
    create_schedule(roots);
  });
  size_t at = err.find(std::string("--- schedule: ") + stage);
  REQUIRE(at != std::string::npos);
  err = err.substr(at, err.find(std::string("--- schedule: ") + next) - at);
  std::vector<GraphLine> g;
  std::istringstream in(err);
  std::string line;
  std::getline(in, line);  // the stage's title
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    size_t i = 0;
    GraphLine l;
    std::string dtype;
    REQUIRE((ls >> i >> l.op >> dtype));
    REQUIRE(i == g.size());
    std::string srcs = line.substr(line.find('[') + 1, line.find(']') - line.find('[') - 1);
    std::istringstream ss(srcs);
    for (std::string tok; std::getline(ss, tok, ',');) l.src.push_back(std::stoul(tok));
    g.push_back(std::move(l));
  }
  return g;
}
size_t count_op(const std::vector<GraphLine>& g, const std::string& op) {
  return size_t(std::count_if(g.begin(), g.end(), [&](const GraphLine& l) { return l.op == op; }));
}
}  // namespace

TEST_CASE("bufferize to store leaves the kernel graph: each BUFFERIZE an AFTER(BUFFER, CALL) its readers read") {
  // (a + 1).contiguous() read by a reduce: SINK(AFTER(r, CALL(AST, r, AFTER(t, CALL(AST, t, a))))), each CALL holding
  // its program (no index into a list beside the graph) (shapes no other test schedules: a template built before
  // prints nothing)
  Tensor a = Tensor::empty({22, 30}, dtypes::float32, "CPU");
  Tensor t = Tensor(a + 1).contiguous();
  std::vector<GraphLine> g = kernel_graph_of({Tensor(t * 2).sum(1).uop()});
  REQUIRE(g.size() >= 2);
  CHECK(count_op(g, "BUFFERIZE") == 0);
  CHECK(count_op(g, "CALL") == 2);
  CHECK(count_op(g, "AFTER") == 2);
  const GraphLine& sink = g.back();
  CHECK(sink.op == "SINK");
  REQUIRE(sink.src.size() == 1);
  const GraphLine& root = g[sink.src[0]];  // the result's buffer after the reduce's kernel
  REQUIRE(root.op == "AFTER");
  REQUIRE(root.src.size() == 2);
  CHECK(g[root.src[0]].op == "BUFFER");
  const GraphLine& reduce = g[root.src[1]];
  REQUIRE(reduce.op == "CALL");
  REQUIRE(reduce.src.size() == 3);
  CHECK(g[reduce.src[0]].op == "SINK");  // its program: the kernel's AST
  CHECK(reduce.src[1] == root.src[0]);   // then its buffers, its output first
  const GraphLine& tread = g[reduce.src[2]];  // t's buffer, after t's kernel
  REQUIRE(tread.op == "AFTER");
  const GraphLine& tcall = g[tread.src[1]];
  REQUIRE(tcall.op == "CALL");
  REQUIRE(tcall.src.size() == 3);
  CHECK(g[tcall.src[0]].op == "SINK");
  CHECK(tcall.src[0] != reduce.src[0]);
  CHECK(tcall.src[1] == tread.src[0]);
  CHECK(g[tcall.src[2]].op == "BUFFER");  // a: an input, read as it is
  // a copy's CALL holds its COPY
  Tensor b = Tensor::empty({23, 29}, dtypes::float32, "CPU");
  g = kernel_graph_of({Tensor(Tensor(b * 2).contiguous()).to("CPU:1").uop()});
  REQUIRE(count_op(g, "CALL") == 2);
  size_t copies = 0;
  for (const GraphLine& l : g)
    if (l.op == "CALL") {
      REQUIRE(l.src.size() == 3);
      copies += g[l.src[0]].op == "COPY";
      CHECK(g[l.src[1]].op == "BUFFER");  // its output
    }
  CHECK(copies == 1);
  // a multi-output kernel is one CALL under the AFTERs of each of its outputs' buffers
  Tensor x = Tensor::empty({250}, dtypes::float32, "CPU");
  Tensor t1 = Tensor(x + 1).contiguous();
  Tensor t2 = Tensor(t1 * 2).contiguous();
  g = kernel_graph_of({t1.uop(), t2.uop(), Tensor(t2 + t1).uop()});
  REQUIRE(count_op(g, "CALL") == 1);
  CHECK(count_op(g, "AFTER") == 3);
  for (const GraphLine& l : g)
    if (l.op == "AFTER") CHECK(g[l.src.at(1)].op == "CALL");
}

TEST_CASE("group outputs puts a multi-output kernel in the graph: its leader BUFFERIZE has the members as sources") {
  Tensor x = Tensor::empty({190}, dtypes::float32, "CPU");  // a shape no other test schedules
  Tensor t1 = Tensor(x + 1).contiguous();
  Tensor t2 = Tensor(t1 * 2).contiguous();
  std::vector<UOpRef> roots{t1.uop(), t2.uop(), Tensor(t2 + t1).uop()};
  std::vector<GraphLine> g = kernel_graph_of(roots, "group outputs", "bufferize to store");
  std::vector<const GraphLine*> leaders;
  for (const GraphLine& l : g)
    if (l.op == "BUFFERIZE" && l.src.size() > 2) leaders.push_back(&l);
  REQUIRE(leaders.size() == 1);
  REQUIRE(leaders[0]->src.size() == 4);  // value, DEVICE, t1's and t2's BUFFERIZE (sources first)
  CHECK(g[leaders[0]->src[2]].op == "BUFFERIZE");
  CHECK(g[leaders[0]->src[3]].op == "BUFFERIZE");
  CHECK(leaders[0]->src[2] < leaders[0]->src[3]);
  CHECK(count_op(g, "BUFFERIZE") == 3);
  // MULTI_OUTPUT=0: no leader, three kernels
  ScopedEnv off("MULTI_OUTPUT", "0");
  g = kernel_graph_of(roots, "group outputs", "bufferize to store");
  for (const GraphLine& l : g) CHECK(!(l.op == "BUFFERIZE" && l.src.size() > 2));
}

TEST_CASE("the kernel graph orders an in-place write after the readers of the old contents (AFTER of its output)") {
  auto a = Tensor::from_vector(iota_f(5));  // a graph of its own (a template scheduled before prints nothing)
  Tensor old = Tensor(a * 3).contiguous();
  a.assign(Tensor(a + 17));
  std::vector<GraphLine> g = kernel_graph_of({old.uop(), a.uop()});
  CHECK(count_op(g, "CALL") == 2);
  // the assign's CALL writes a's BUFFER after the CALL that reads a's old contents from that same BUFFER
  bool war = false;
  for (const GraphLine& l : g) {
    if (l.op != "CALL" || g[l.src[1]].op != "AFTER") continue;  // CALL(program, output, ...)
    const GraphLine& out = g[l.src[1]];
    REQUIRE(out.src.size() == 2);
    const GraphLine& reader = g[out.src[1]];
    REQUIRE(reader.op == "CALL");
    war = std::find(reader.src.begin() + 1, reader.src.end(), out.src[0]) != reader.src.end();
  }
  CHECK(war);
  realize(old, a);
  CHECK(a.to_vector<float>() == std::vector<float>{17, 18, 19, 20, 21});
  CHECK(old.to_vector<float>() == std::vector<float>{0, 3, 6, 9, 12});
}

TEST_CASE("the realize map marks what materialises with BUFFERIZE nodes whose arg carries the layout (DEBUG=5)") {
  // (a + 1).contiguous() read by a reduce: two buffers, the CONTIGUOUS and the result (the reduce itself fuses)
  Tensor a = Tensor::empty({24, 40}, dtypes::float32, "CPU");
  Tensor t = Tensor(a + 1).contiguous();
  std::vector<std::string> l = bufferize_lines(Tensor(t * 2).sum(1));
  REQUIRE(l.size() == 3);
  CHECK(l[0] == "  BUFFERIZE 0: CONTIGUOUS (24, 40) on CPU, intermediate, as computed");
  CHECK(l[1] == "  BUFFERIZE 1: RESHAPE (24,) on CPU, output, as computed");
  CHECK(l[2] == "  2 BUFFERIZE, 0 row-fused");
  // a large matmul on the CPU (pm_layout): B copied into panels of 32 columns, (n/32, k, 32), the product computed
  // panel by panel and permuted back
  Tensor x = Tensor::empty({64, 512}, dtypes::float32, "CPU"), w = Tensor::empty({512, 2048}, dtypes::float32, "CPU");
  l = bufferize_lines(x.matmul(w));
  REQUIRE(l.size() == 4);
  CHECK(l[0] == "  BUFFERIZE 0: CONTIGUOUS (64, 512, 32) on CPU, intermediate, layout (0, 2, 1)");
  CHECK(l[1] == "  BUFFERIZE 1: CONTIGUOUS (1, 64, 64, 32) on CPU, intermediate, as computed");
  CHECK(l[2].rfind("  BUFFERIZE 2: ", 0) == 0);
  CHECK(l[2].find("(64, 2048) on CPU, output") != std::string::npos);
  CHECK(l[3] == "  3 BUFFERIZE, 0 row-fused");
  // a convolution with many channels on the CPU: its input stored channels-last, (N, H, W, C), padded along W only
  // (the rows' padding stays a bounds test the tap loop is narrowed by)
  Tensor img = Tensor::empty({1, 16, 20, 20}, dtypes::float32, "CPU");
  Tensor k = Tensor::empty({16, 16, 3, 3}, dtypes::float32, "CPU");
  l = bufferize_lines(img.conv2d(k, std::nullopt, 1, 1));
  bool input_cl = false;
  for (auto& s : l) input_cl |= s.find("(1, 20, 22, 16) on CPU, intermediate, layout (0, 2, 3, 1)") != s.npos;
  CHECK(input_cl);
}

TEST_CASE("the LINEAR's CALLs hold what they run: the schedule's items are read off it (DEBUG=5)") {
  // two kernels, a copy to another device, and a gather whose kernel checks its indices (shapes no other test
  // schedules: a template built before prints nothing)
  Tensor a = Tensor::empty({26, 18}, dtypes::float32, "CPU");
  Tensor t = Tensor(a + 1).contiguous();
  Tensor c = Tensor(Tensor(t * 2).sum(1)).to("CPU:1");
  Tensor x = Tensor::empty({50, 6}, dtypes::float32, "CPU");
  Tensor idx = Tensor::empty({9}, dtypes::int32, "CPU");
  std::vector<UOpRef> roots{c.uop(), x.index({idx}).uop()};
  Schedule sched;
  std::string err = test::stderr_of([&] {
    ScopedEnv dbg("DEBUG", "5");
    sched = create_schedule(roots);
  });
  size_t at = err.find("--- schedule: plan memory");
  REQUIRE(at != std::string::npos);
  std::istringstream in(err.substr(at, err.find("--- schedule: items") - at));
  std::vector<std::string> calls;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("    CALL ", 0) == 0) calls.push_back(line);
  REQUIRE(calls.size() == sched.items.size());
  REQUIRE(calls.size() == 5);
  size_t copies = 0, checked = 0;
  for (size_t i = 0; i < calls.size(); i++) {  // each CALL: its kind, device and program, as the item runs them
    const ScheduleItem& it = sched.items[i];
    bool copy = it.kind == ScheduleItem::Kind::Copy;
    std::string head = std::string("    CALL ") + (copy ? "copy" : "kernel") + " on " + it.device + ", buffers ";
    CHECK(calls[i].rfind(head, 0) == 0);
    std::string program = std::string(", program ") + (copy ? "COPY " : "SINK ") + it.ast->key();
    CHECK(calls[i].find(program) != std::string::npos);
    copies += copy;
    if (it.index_check) {  // the diagnostic kernels travel in the CALL too
      checked++;
      CHECK(it.index_diags.size() == 1);
      CHECK(calls[i].find(", index check (1 diagnostic kernels)") != std::string::npos);
    }
  }
  CHECK(copies == 1);
  if (serial_default_device()) CHECK(checked == 1);  // (DEVICE=CL: the gather is checked otherwise)
  CHECK(sched.items[2].device == "CPU:1");  // the copy runs on its destination
}

TEST_CASE("row fusion is graph structure: a row BUFFERIZE in the realize map, refused as BUFFERIZEd reduces (DEBUG=5)") {
  // softmax over rows on the CPU: max and sum stay in the output's kernel, each the source of its EXPAND in a row
  // BUFFERIZE (no kernel of its own); one pass of the realize map
  Tensor a = Tensor::empty({7, 44}, dtypes::float32, "CPU");  // a shape no other test schedules (cached)
  auto passes = realize_map_passes(a.softmax(1));
  REQUIRE(passes.size() == 1);
  std::vector<std::string> want{
      "  row BUFFERIZE 0: NEG (7, 1) on CPU, row: once per row, in its reader's kernel",         // -max
      "  row BUFFERIZE 1: RECIPROCAL (7, 1) on CPU, row: once per row, in its reader's kernel",  // 1 / sum
      "  BUFFERIZE 0: MUL (7, 44) on CPU, output, as computed", "  1 BUFFERIZE, 2 row-fused"};
  CHECK(passes[0] == want);
  // stored transposed, the rows are not the output's inner loops: the kernel would run max and sum again for every
  // element, refuses both, and the second pass finds them in BUFFERIZE nodes of the graph: three kernels
  passes = realize_map_passes(a.softmax(1).T().contiguous());
  REQUIRE(passes.size() == 2);
  CHECK(passes[0].back() == "  1 BUFFERIZE, 2 row-fused");
  want = {"  BUFFERIZE 0: REDUCE_AXIS (7, 1) on CPU, intermediate, as computed",  // max
          "  BUFFERIZE 1: REDUCE_AXIS (7, 1) on CPU, intermediate, as computed",  // sum
          "  BUFFERIZE 2: CONTIGUOUS (44, 7) on CPU, output, layout (1, 0)", "  3 BUFFERIZE, 0 row-fused"};
  CHECK(passes[1] == want);
}
