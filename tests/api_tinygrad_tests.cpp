// The rest of tinygrad's Tensor API (tinygrad a9069c177a) in tg: exact values from definitions and published test
// vectors (SHA-3, threefry's Random123 answers), properties the torch table cannot check (random permutations and
// samples, decompositions reassembled, a bitonic sort against std::stable_sort), and each new error path. The
// numeric comparisons with libtorch are in tests/torch/torch_ops_d.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "tg/tensor.hpp"

#include "test_util.hpp"

using namespace tg;
using tg::test::error_of;

namespace {
std::string hex(const std::vector<uint8_t>& b) {
  std::string s;
  char buf[3];
  for (uint8_t v : b) std::snprintf(buf, sizeof buf, "%02x", v), s += buf;
  return s;
}
Tensor bytes_of(const std::string& s) {
  std::vector<uint8_t> v(s.begin(), s.end());
  return Tensor::from_vector(v, {int64_t(v.size())});
}
}  // namespace

TEST_CASE("sort is a bitonic network: equal to std::stable_sort for every length, with ties, NaN and infinities") {
  std::mt19937 rng(7);
  for (int64_t n : {2, 3, 5, 8, 13, 31, 64, 100}) {
    for (bool desc : {false, true}) {
      std::vector<float> v(size_t(3 * n));
      for (auto& x : v) x = float(int(rng() % 7)) - 3.f;  // many ties
      v[1] = NAN, v[size_t(n)] = INFINITY, v[size_t(2 * n - 1)] = -INFINITY;
      auto [sv, si] = Tensor::from_vector(v, {3, n}).sort(-1, desc);
      std::vector<float> got = sv.to_vector<float>();
      std::vector<int64_t> gi = si.to_vector<int64_t>();
      for (int64_t r = 0; r < 3; r++) {
        std::vector<int64_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        auto key = [&](int64_t i) { return v[size_t(r * n + i)]; };
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          float x = key(a), y = key(b);
          if (std::isnan(x) || std::isnan(y)) return desc ? std::isnan(x) && !std::isnan(y) : std::isnan(y) && !std::isnan(x);
          return desc ? x > y : x < y;
        });
        for (int64_t j = 0; j < n; j++) {
          CAPTURE(n);
          CAPTURE(desc);
          CAPTURE(r);
          CAPTURE(j);
          CHECK(gi[size_t(r * n + j)] == order[size_t(j)]);
          float want = key(order[size_t(j)]), have = got[size_t(r * n + j)];
          CHECK((std::isnan(want) ? std::isnan(have) : have == want));
        }
      }
    }
  }
}

TEST_CASE("sort of 4096 int32 values along dim 0 and bool values keeps every value, stable") {
  std::mt19937 rng(3);
  std::vector<int32_t> v(4096);
  for (auto& x : v) x = int32_t(rng() % 1000) - 500;
  auto [sv, si] = Tensor::from_vector(v, {4096, 1}).sort(0);
  std::vector<int32_t> want = v;
  std::stable_sort(want.begin(), want.end());
  CHECK(sv.to_vector<int32_t>() == want);
  std::vector<int64_t> idx = si.to_vector<int64_t>();
  for (size_t j = 1; j < idx.size(); j++)
    if (v[size_t(idx[j])] == v[size_t(idx[j - 1])]) CHECK(idx[j] > idx[j - 1]);
  auto [bv, bi] = Tensor::from_vector(std::vector<bool>{true, false, true, false}).sort(0, true);
  CHECK(bv.to_vector<bool>() == std::vector<bool>{true, true, false, false});
  CHECK(bi.to_vector<int64_t>() == std::vector<int64_t>{0, 2, 1, 3});
}

TEST_CASE("keccak gives the SHA-3 and SHAKE128 digests (one and several blocks, batched rows)") {
  CHECK(hex(bytes_of("abc").keccak().data()) == "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532");
  CHECK(hex(bytes_of("").keccak().data()) == "a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a");
  CHECK(hex(bytes_of("abc").keccak("sha3_224").data()) == "e642824c3f8cf24ad09234ee7d3c766fc9a3a5168d0c94ad73b46fdf");
  // hashlib.shake_128(bytes(range(200))).digest(16), and sha3_256 of i % 251 for i < 300 (three blocks of 136)
  std::vector<uint8_t> m(200), m2(300);
  std::iota(m.begin(), m.end(), uint8_t(0));
  for (size_t i = 0; i < m2.size(); i++) m2[i] = uint8_t(i % 251);
  CHECK(hex(Tensor::from_vector(m).keccak("shake_128").data()) == "0c4234ca1e31801ae606f8b8d8e0665c");
  Tensor two = cat({Tensor::from_vector(m2).unsqueeze(0), bytes_of(std::string(300, 'a')).unsqueeze(0)});
  std::vector<uint8_t> d = two.keccak().data();
  CHECK(two.keccak().shape() == Shape{2, 32});
  CHECK(hex(std::vector<uint8_t>(d.begin(), d.begin() + 32)) == "4be64d77dff18f218eeb40368f86ed78e6d4f2381c71675ab5ada46aa4fee621");
  CHECK(error_of([] { (void)bytes_of("abc").keccak("md5"); }).find("[keccak] cfg must be") == 0);
}

TEST_CASE("hash is tinygrad's shake_128 tree over 1 MiB blocks") {
  // Python: shake_128 of each 4096-byte piece of the zero-padded MiB (16 bytes each), then shake_128 of those
  CHECK(hex(bytes_of("Hello World!").hash().data()) == "e02b050b7b6e9bb60f9c033633502ee3");
}

TEST_CASE("threefry matches Random123's known answers, and random_bits draws fresh uint32 bits") {
  // threefry2x32_20 (counter x0 x1, key k0 k1) -> (y0, y1): the uint64 holds x1:x0, key k1:k0, result y1:y0
  auto tf = [](uint64_t x, uint64_t k) {
    return Tensor::from_vector(std::vector<uint64_t>{x}).threefry(Tensor::from_vector(std::vector<uint64_t>{k})).to_vector<uint64_t>()[0];
  };
  CHECK(tf(0, 0) == 0x99ba4efe6b200159ull);
  CHECK(tf(~0ull, ~0ull) == 0xbb002be71cb996fcull);
  CHECK(tf(0x85a308d3243f6a88ull, 0x0370734413198a2eull) == 0x483df7a0c4923a9cull);
  CHECK(error_of([] { (void)Tensor::ones({2}).threefry(Tensor::ones({2})); }).find("[threefry] needs uint64") == 0);
  Tensor::manual_seed(5);
  std::vector<uint32_t> a = Tensor::random_bits(64).to_vector<uint32_t>(), b = Tensor::random_bits(64).to_vector<uint32_t>();
  CHECK(a != b);
  CHECK(std::set<uint32_t>(a.begin(), a.end()).size() == 64);
  Tensor::manual_seed(5);
  CHECK(Tensor::random_bits(64).to_vector<uint32_t>() == a);
}

TEST_CASE("randperm is a permutation; multinomial draws by weight, never a zero weight, distinct without replacement") {
  Tensor::manual_seed(1);
  std::vector<int64_t> p = Tensor::randperm(50).to_vector<int64_t>();
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> want(50);
  std::iota(want.begin(), want.end(), 0);
  CHECK(sorted == want);
  CHECK(p != want);
  Tensor w = Tensor::from_vector(std::vector<float>{1, 0, 3, 0, 4, 2}, {2, 3});
  std::vector<int64_t> s = w.multinomial(4000, true).to_vector<int64_t>();
  int c0 = 0, c4 = 0;
  for (size_t i = 0; i < 4000; i++) {
    CHECK(s[i] != 1);  // weight 0
    c0 += s[i] == 0;
    c4 += s[4000 + i] == 1;
  }
  CHECK(std::abs(c0 - 1000) < 120);  // 1/4 of 4000, within ~4.4 sigma
  CHECK(std::abs(c4 - 2667) < 130);  // 4/6 of 4000
  std::vector<int64_t> nr = Tensor::from_vector(std::vector<float>{1, 1, 1, 1, 1}).multinomial(5, false).to_vector<int64_t>();
  CHECK(std::set<int64_t>(nr.begin(), nr.end()).size() == 5);
  CHECK(error_of([&] { (void)w.multinomial(4, false); }).find("[multinomial] cannot draw 4 samples") == 0);
}

TEST_CASE("nonzero, diag, unfold, pad_to, shrink_to and view give exact values") {
  Tensor x = Tensor::from_vector(std::vector<int32_t>{0, 3, 0, 0, 5, 6}, {2, 3});
  CHECK(x.nonzero().to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1, 1, 1, 2});
  CHECK(x.nonzero(4, -1).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1, 1, 1, 2, -1, -1});
  CHECK(x.nonzero(2).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1, 1});
  CHECK(Tensor::zeros({3}).nonzero().shape() == Shape{0, 1});
  Tensor v = Tensor::from_vector(std::vector<float>{1, 2, 3});
  CHECK(v.diag().to_vector<float>() == std::vector<float>{1, 0, 0, 0, 2, 0, 0, 0, 3});
  CHECK(v.diag().diag().to_vector<float>() == std::vector<float>{1, 2, 3});
  Tensor a = Tensor::arange(8);
  CHECK(a.unfold(0, 3, 2).shape() == Shape{3, 3});
  CHECK(a.unfold(0, 3, 2).to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2, 2, 3, 4, 4, 5, 6});
  Tensor b = Tensor::arange(24).reshape({2, 3, 4});
  CHECK(b.unfold(1, 2, 1).shape() == Shape{2, 2, 4, 2});
  CHECK(b.unfold(1, 2, 1).to_vector<int32_t>()[0] == 0);
  CHECK(b.unfold(1, 2, 1).to_vector<int32_t>()[1] == 4);  // [0][0][0][1] = b[0][1][0]
  CHECK(error_of([&] { (void)a.unfold(0, 9, 1); }).find("[unfold] size 9 must be in [0, 8]") == 0);
  CHECK(v.pad_to({5}, 7).to_vector<float>() == std::vector<float>{1, 2, 3, 7, 7});
  CHECK(b.shrink_to({-1, 1, 2}).to_vector<int32_t>() == std::vector<int32_t>{0, 1, 12, 13});
  CHECK(error_of([&] { (void)v.pad_to({2}); }) == "[pad_to] cannot pad " + shape_str(Shape{3}) + " down to " + shape_str(Shape{2}) + " (use shrink_to)");
  CHECK(b.view({4, 6}).shape() == Shape{4, 6});
}

TEST_CASE("const_, ufix, usum and uprod: weak constants and folded sums and products as tinygrad's") {
  Tensor h = Tensor::from_vector(std::vector<float>{1, 2, 3}).cast(dtypes::float16);
  // a weak constant takes the other operand's dtype; a typed one promotes
  CHECK(Tensor::const_(2).dtype() == dtypes::weakint);
  CHECK(Tensor::const_(2.5).dtype() == dtypes::weakfloat);
  CHECK((h * Tensor::const_(2)).dtype() == dtypes::float16);
  CHECK((h * Tensor::const_(2, dtypes::float32)).dtype() == dtypes::float32);
  CHECK((h * Tensor::const_(2.5)).cast(dtypes::float32).to_vector<float>() == std::vector<float>{2.5f, 5, 7.5f});
  CHECK(Tensor::const_(3e9).dtype() == dtypes::weakfloat);  // a whole number beyond int32 stays exact as a float
  Tensor u = h.ufix(4);
  CHECK(u.dtype() == dtypes::float16);
  CHECK(u.ndim() == 0);
  CHECK(u.cast(dtypes::float32).item<float>() == 4);
  CHECK(h.ufix(h).uop().get() == h.uop().get());
  Tensor a = Tensor::from_vector(std::vector<int32_t>{1, 2, 3}), b = Tensor::from_vector(std::vector<int32_t>{4, 5, 6});
  CHECK(a.usum({b, Tensor::from_vector(std::vector<int32_t>{10})}).to_vector<int32_t>() == std::vector<int32_t>{15, 17, 19});
  CHECK(a.uprod({b, b}).to_vector<int32_t>() == std::vector<int32_t>{16, 50, 108});
  CHECK(a.usum({}).to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3});
  Tensor p = Tensor::from_vector(std::vector<bool>{true, false, false}), q = Tensor::from_vector(std::vector<bool>{true, true, false});
  CHECK(p.usum({q}).to_vector<bool>() == std::vector<bool>{true, true, false});   // OR
  CHECK(p.uprod({q}).to_vector<bool>() == std::vector<bool>{true, false, false});  // AND
}

TEST_CASE("rearrange splits, permutes and merges axes like einops") {
  Tensor x = Tensor::arange(24).reshape({2, 3, 4});
  CHECK(x.rearrange("b c d -> d b c").to_vector<int32_t>() == x.permute({2, 0, 1}).contiguous().to_vector<int32_t>());
  CHECK(x.rearrange("b c d -> b (c d)").shape() == Shape{2, 12});
  CHECK(x.rearrange("b c (h w) -> b h c w", {{"h", 2}}).to_vector<int32_t>() ==
        x.reshape({2, 3, 2, 2}).permute({0, 2, 1, 3}).contiguous().to_vector<int32_t>());
  CHECK(x.rearrange("... d -> d ...").shape() == Shape{4, 2, 3});
  CHECK(x.rearrange("b c d -> b 1 c d").shape() == Shape{2, 1, 3, 4});
  CHECK(x.unsqueeze(1).rearrange("b 1 c d -> (b c) d").shape() == Shape{6, 4});
  CHECK(error_of([&] { (void)x.rearrange("b c d -> b c"); }).find("[rearrange] the two sides") == 0);
  CHECK(error_of([&] { (void)x.rearrange("b c -> c b"); }).find("[rearrange] \"b c -> c b\" does not fit") == 0);
  CHECK(error_of([&] { (void)x.rearrange("b c d e"); }).find("[rearrange] needs exactly one") == 0);
}

TEST_CASE("qr and svd reassemble the matrix; Q and U, V are orthogonal; R is upper triangular") {
  Tensor::manual_seed(11);
  for (Shape s : {Shape{4, 3}, Shape{3, 4}, Shape{2, 3, 3}}) {
    CAPTURE(shape_str(s));
    Tensor a = Tensor::randn(s, dtypes::float64);
    auto [q, r] = a.qr();
    int64_t m = s[s.size() - 2], n = s.back();
    CHECK(q.matmul(r).allclose(a, 1e-9, 1e-9).item<bool>());
    CHECK(q.matmul(q.transpose(-2, -1)).allclose(Tensor::eye(m, -1, dtypes::float64), 1e-9, 1e-9).item<bool>());
    CHECK(r.tril(-1).abs().max().item<double>() < 1e-12);
    auto [u, sv, vt] = a.svd(false);
    Tensor us = u * sv.unsqueeze(-2);
    CHECK(us.matmul(vt).allclose(a, 1e-6, 1e-6).item<bool>());
    std::vector<double> svals = sv.to_vector<double>();
    int64_t k = std::min(m, n);
    for (size_t i = 0; i + 1 < svals.size(); i++)
      if ((int64_t(i) + 1) % k != 0) CHECK(svals[i] >= svals[i + 1]);
    auto [uf, sf, vtf] = a.svd(true);
    CHECK(uf.shape()[uf.ndim() - 1] == m);
    CHECK(uf.matmul(uf.transpose(-2, -1)).allclose(Tensor::eye(m, -1, dtypes::float64), 1e-6, 1e-6).item<bool>());
    CHECK(vtf.matmul(vtf.transpose(-2, -1)).allclose(Tensor::eye(n, -1, dtypes::float64), 1e-6, 1e-6).item<bool>());
  }
  CHECK(error_of([] { (void)Tensor::ones({3}).qr(); }).find("[qr] needs at least 2 dims") == 0);
}

TEST_CASE("newton_schulz with Muon's coefficients pushes the singular values toward 1") {
  Tensor::manual_seed(2);
  Tensor g = Tensor::randn({4, 6}, dtypes::float64);
  Tensor o = g.newton_schulz(10, {3.4445, -4.7750, 2.0315});
  auto [u, s, vt] = o.svd(false);
  for (double v : s.to_vector<double>()) CHECK(std::abs(v - 1.0) < 0.35);
  CHECK(g.transpose(0, 1).newton_schulz(10, {3.4445, -4.7750, 2.0315}).allclose(o.transpose(0, 1), 1e-9, 1e-9).item<bool>());
}

TEST_CASE("max_pool2d_with_indices gives torch's flat indices and max_unpool2d writes values back at them") {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 5, 2, 0, 3, 4, 9, 1, 7, 7, 0, 2, 1, 8, 3, 6}, {1, 1, 4, 4});
  ValuesIndices vi = x.max_pool2d_with_indices(2);
  const Tensor &v = vi.values, &i = vi.indices;
  CHECK(v.to_vector<float>() == std::vector<float>{5, 9, 8, 6});
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 6, 13, 15});
  CHECK(v.max_unpool2d(i, 2).to_vector<float>() ==
        std::vector<float>{0, 5, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 8, 0, 6});
  auto [v2, i2] = x.max_pool2d_with_indices(2, 1, {1, 0, 1, 0});  // asymmetric: one row above, one column left
  CHECK(v2.shape() == Shape{1, 1, 4, 4});
  CHECK(i2.to_vector<int64_t>()[0] == 0);
  CHECK(x.max_pool2d(2, 2, {0, 1, 0, 1}).shape() == Shape{1, 1, 2, 2});
  CHECK(error_of([&] { (void)x.max_pool2d(2, 2, {0, 2, 0, 0}); }).find("[max_pool2d] padding (0, 2, 0, 0) must be") == 0);
  CHECK(error_of([&] { (void)v.max_unpool2d(i.cast(dtypes::float32), 2); }).find("[max_unpool2d] indices") == 0);
}

TEST_CASE("div rounding modes, fmod, copysign, logaddexp, isclose: exact values at the edges") {
  Tensor a = Tensor::from_vector(std::vector<int32_t>{7, -7, 7, -7, 5}), b = Tensor::from_vector(std::vector<int32_t>{2, 2, -2, -2, 0});
  CHECK(a.div(b, "trunc").to_vector<int32_t>() == std::vector<int32_t>{3, -3, -3, 3, 0});
  CHECK(a.div(b, "floor").to_vector<int32_t>() == std::vector<int32_t>{3, -4, -4, 3, 0});
  CHECK(a.fmod(b).to_vector<int32_t>() == std::vector<int32_t>{1, -1, 1, -1, 0});
  Tensor f = Tensor::from_vector(std::vector<float>{7.5f, -7.5f}), g = Tensor::from_vector(std::vector<float>{2, 2});
  CHECK(f.div(g, "trunc").to_vector<float>() == std::vector<float>{3, -3});
  CHECK(f.div(g, "floor").to_vector<float>() == std::vector<float>{3, -4});
  CHECK(f.fmod(g).to_vector<float>() == std::vector<float>{1.5f, -1.5f});
  CHECK(error_of([&] { (void)f.div(g, "round"); }).find("[div] rounding_mode must be") == 0);
  Tensor s = Tensor::from_vector(std::vector<float>{1, 0.f, -0.f, -2});
  CHECK(Tensor::from_vector(std::vector<float>{3, 3, 3, 3}).copysign(s).to_vector<float>() == std::vector<float>{3, 3, -3, -3});
  Tensor inf = Tensor::from_vector(std::vector<float>{-INFINITY, INFINITY, 1000});
  std::vector<float> la = inf.logaddexp(inf).to_vector<float>();
  CHECK(la[0] == -INFINITY);
  CHECK(la[1] == INFINITY);
  CHECK(la[2] == doctest::Approx(1000 + std::log(2.0)));
  Tensor p = Tensor::from_vector(std::vector<float>{1e-7f, 1e-8f, NAN, INFINITY, 1.f});
  Tensor q = Tensor::from_vector(std::vector<float>{0, 0, NAN, INFINITY, 1.000005f});
  CHECK(p.isclose(q).to_vector<bool>() == std::vector<bool>{false, true, false, true, true});
  CHECK(p.isclose(q, 1e-5, 1e-8, true).to_vector<bool>() == std::vector<bool>{false, true, true, true, true});
  CHECK_FALSE(p.allclose(q).item<bool>());
  CHECK(p.allclose(p, 1e-5, 1e-8, true).item<bool>());
}

TEST_CASE("sum(dtype), scatter(reduce), normalize and the casts") {
  Tensor i8 = Tensor::full({300}, 100, dtypes::int8);
  CHECK(i8.sum({}, false, dtypes::int32).dtype() == dtypes::int32);
  CHECK(i8.sum({}, false, dtypes::int32).item<int32_t>() == 30000);
  CHECK(Tensor::ones({4}).sum({}, false, dtypes::float64).dtype() == dtypes::float64);
  Tensor base = Tensor::ones({5});
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 0, 3});
  Tensor src = Tensor::from_vector(std::vector<float>{2, 3, 4});
  CHECK(base.scatter(0, idx, src, "add").to_vector<float>() == std::vector<float>{6, 1, 1, 5, 1});
  CHECK(base.scatter(0, idx, src, "multiply").to_vector<float>() == std::vector<float>{6, 1, 1, 4, 1});
  CHECK(error_of([&] { (void)base.scatter(0, idx, src, "max"); }).find("[scatter] reduce must be") == 0);
  Tensor n = Tensor::from_vector(std::vector<float>{3, 4, 0, 0}, {2, 2}).normalize(2, 1);
  CHECK(n.to_vector<float>() == std::vector<float>{0.6f, 0.8f, 0, 0});
  Tensor t = Tensor::from_vector(std::vector<float>{1.5f, -2.5f});
  CHECK(t.half().dtype() == dtypes::float16);
  CHECK(t.bfloat16().dtype() == dtypes::bfloat16);
  CHECK(t.double_().dtype() == dtypes::float64);
  CHECK(t.int_().to_vector<int32_t>() == std::vector<int32_t>{1, -2});
  CHECK(t.long_().dtype() == dtypes::int64);
  CHECK(t.short_().dtype() == dtypes::int16);
  CHECK(t.bool_().to_vector<bool>() == std::vector<bool>{true, true});
  CHECK(t.int_().float_().dtype() == dtypes::float32);
  CHECK(t.add(t).sub(t).mul(t).to_vector<float>() == std::vector<float>{2.25f, 6.25f});
}

TEST_CASE("clone keeps its value after the original is assigned; replace, to_, data and the size properties") {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}).realize();
  Tensor c = x.clone();
  x.assign(Tensor::from_vector(std::vector<float>{7, 8, 9}));
  CHECK(c.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(x.to_vector<float>() == std::vector<float>{7, 8, 9});
  Tensor c2 = x.clone().realize();
  x.assign(Tensor::zeros({3}));
  CHECK(c2.to_vector<float>() == std::vector<float>{7, 8, 9});
  Tensor h = x;  // a copy of the handle sees the replacement
  x.replace(Tensor::arange(3));
  CHECK(h.to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2});
  CHECK(error_of([&] { x.replace(Tensor::ones({4})); }).find("[replace] shapes differ") == 0);
  h.to_("CPU");
  CHECK(h.device() == "CPU");
  Tensor d = Tensor::from_vector(std::vector<uint16_t>{0x0102, 0x0304});
  CHECK(d.data() == std::vector<uint8_t>{2, 1, 4, 3});
  CHECK(d.element_size() == 2);
  CHECK(d.nbytes() == 4);
  CHECK(d.max_numel() == 2);
  CHECK_FALSE(d.is_floating_point());
  CHECK(d.cast(dtypes::float16).is_floating_point());
  CHECK(d.empty_like().shape() == Shape{2});
  CHECK(d.empty_like(dtypes::float32).dtype() == dtypes::float32);
  CHECK(Tensor::invalids({2, 3}).shape() == Shape{2, 3});
  CHECK(d.const_like(5).to_vector<uint16_t>() == std::vector<uint16_t>{5, 5});
}

TEST_CASE("clone(device) copies onto that device, clone(own device) is a clone; isinf(detect_*) on ints; topk(sorted)") {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}).realize();
  Tensor other = x.clone("CPU:1");
  CHECK(other.device() == "CPU:1");
  Tensor same = x.clone(x.device());
  x.assign(Tensor::zeros({3}));
  CHECK(other.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(same.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(same.device() == x.device());
  CHECK(Tensor::from_vector(std::vector<int32_t>{1, 2}).isinf(true, true).to_vector<bool>() == std::vector<bool>{false, false});
  TensorOf<float> f(Tensor::from_vector(std::vector<float>{-INFINITY, 1}));  // the typed handle keeps the overloads
  CHECK(f.isinf(false, true).to_vector<bool>() == std::vector<bool>{true, false});
  CHECK(f.softmax(0, dtypes::float64).dtype() == dtypes::float64);
  // topk(sorted=false) may return any order (torch); tg's is sorted either way
  Tensor v = Tensor::from_vector(std::vector<float>{3, 1, 4, 1, 5});
  CHECK(v.topk(2, 0, true, false).first.to_vector<float>() == std::vector<float>{5, 4});
}

TEST_CASE("contiguous_backward, sequential, layernorm, batchnorm and enable_gqa") {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor y = x.contiguous_backward().sequential({[](const Tensor& t) { return t * 2.0; }, [](const Tensor& t) { return t + 1.0; }});
  CHECK(y.to_vector<float>() == std::vector<float>{3, 5, 7, 9});
  y.sum().backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2, 2, 2, 2});
  Tensor l = Tensor::from_vector(std::vector<float>{1, 3, 2, 2}, {2, 2}).layernorm();
  std::vector<float> lv = l.to_vector<float>();
  CHECK(lv[0] == doctest::Approx(-1.0).epsilon(1e-5));
  CHECK(lv[2] == 0.f);
  Tensor bn = Tensor::ones({1, 2, 1}).batchnorm(Tensor::from_vector(std::vector<float>{2, 3}), Tensor::from_vector(std::vector<float>{1, 1}),
                                               Tensor::from_vector(std::vector<float>{0, 1}), Tensor::from_vector(std::vector<float>{4, 4}));
  CHECK(bn.to_vector<float>() == std::vector<float>{9, 1});
  Tensor::manual_seed(4);
  Tensor q = Tensor::randn({1, 4, 3, 8}), k = Tensor::randn({1, 2, 5, 8}), v = Tensor::randn({1, 2, 5, 8});
  Tensor a = q.scaled_dot_product_attention(k, v, std::nullopt, 0.0, false, std::nullopt, true);
  Tensor b = q.scaled_dot_product_attention(k.repeat_interleave(2, 1), v.repeat_interleave(2, 1));
  CHECK(a.allclose(b, 0, 0).item<bool>());
  CHECK(error_of([&] { (void)q.scaled_dot_product_attention(Tensor::randn({1, 3, 5, 8}), Tensor::randn({1, 3, 5, 8}), std::nullopt, 0.0, false,
                                                            std::nullopt, true); })
            .find("[scaled_dot_product_attention] enable_gqa: the query's 4 heads") == 0);
}
