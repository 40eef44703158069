// The Tensor API beyond the torch comparisons: every op's error path (tg::Error naming the op and the shapes),
// graph identity of operator expressions, and behaviours torch cannot check (random init, dropout statistics,
// running statistics, laziness).
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "../src/tensor/conv.hpp"
#include "tg/device.hpp"
#include "tg/schedule.hpp"
#include "tg/tensor.hpp"

#include "scoped_env.hpp"
#include "test_util.hpp"

using namespace tg;

namespace {
std::vector<float> iota_f(size_t n, float start = 0) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}
Tensor T(const Shape& s, float start = 0) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return Tensor::from_vector(iota_f(size_t(n), start), {n}).reshape(s);
}
Tensor ints(std::vector<int64_t> v, Shape s = {}) {
  if (s.empty()) s = {int64_t(v.size())};
  return Tensor::from_vector(v, {int64_t(v.size())}).reshape(s);
}
using test::error_of;
}  // namespace

TEST_CASE("a 20-op operator expression builds the same UOp graph as the ops applied one by one") {
  Tensor a = T({3, 4}, 1), b = T({4}, 2);
  Tensor e = ((((a + b) * 2.0 - a / (b + 1.0)) * a - b * b + 3.0) / (a * a + 1.0) - -a) * (b - 0.5) + a * 4.0 - b / 2.0;
  Tensor s = a + b;
  s = s * 2.0;
  Tensor t = b + 1.0;
  t = a / t;
  s = s - t;
  s = s * a;
  Tensor bb = b * b;
  s = s - bb;
  s = s + 3.0;
  Tensor aa = a * a;
  aa = aa + 1.0;
  s = s / aa;
  Tensor na = -a;
  s = s - na;
  Tensor bh = b - 0.5;
  s = s * bh;
  Tensor a4 = a * 4.0;
  s = s + a4;
  Tensor b2 = b / 2.0;
  s = s - b2;
  CHECK(e.uop().get() == s.uop().get());
  // comparisons and where too
  Tensor w = Tensor(a > b).where(a * 2.0, b - 1.0), w2;
  Tensor c = a > b, x2 = a * 2.0, y1 = b - 1.0;
  w2 = c.where(x2, y1);
  CHECK(w.uop().get() == w2.uop().get());
}

TEST_CASE("expressions forward the common Tensor methods") {
  Tensor a = T({2, 3}), b = T({3}, 1);
  CHECK((a * b).relu().uop().get() == Tensor(a * b).relu().uop().get());
  CHECK((a - b).softmax(-1).uop().get() == Tensor(a - b).softmax(-1).uop().get());
  CHECK((a + 1.0).matmul(T({3, 2})).shape() == Shape{2, 2});
  CHECK((a * 2.0).argmax(1).to_vector<int64_t>() == std::vector<int64_t>{2, 2});
}

TEST_CASE("ops are lazy: building a graph runs no kernel") {
  Tensor x = T({2, 3, 8, 8}), w = T({4, 3, 3, 3});
  size_t before = kernels_run();
  Tensor y = x.conv2d(w, std::nullopt, 1, 1).relu().max_pool2d(2).flatten(1).log_softmax(-1);
  Tensor s = y.sort(-1).first.cumsum(-1);
  CHECK(kernels_run() == before);
  CHECK(s.shape() == Shape{2, 64});
}

TEST_CASE("WINO=1 computes a 5x5 stride-1 conv2d by Winograd, to the direct conv's values, and keeps its errors") {
  Tensor x = Tensor::rand({2, 8, 11, 9}).realize(), w = Tensor::rand({4, 8, 5, 5}).realize();
  std::vector<float> direct, wino;
  size_t k0 = kernels_run();
  {
    ScopedEnv e("WINO", "0");
    direct = x.conv2d(w, std::nullopt, 1, 2).to_vector<float>();
  }
  size_t k1 = kernels_run();
  {
    ScopedEnv e("WINO", "1");
    wino = x.conv2d(w, std::nullopt, 1, 2).to_vector<float>();
    // the transforms and the batched matmul are kernels of their own: more than the direct conv's
    CHECK(kernels_run() - k1 > k1 - k0 + 3);
    CHECK(error_of([&] { x.conv2d(T({4, 3, 5, 5})); }) ==
          "[conv2d] weight (4, 3, 5, 5) needs 3 input channels, input (2, 8, 11, 9) has 8");
    CHECK_THROWS_AS(x.conv2d(T({4, 8, 13, 13})), Error);  // kernel larger than input
  }
  REQUIRE(direct.size() == wino.size());
  float scale = 0;
  for (float v : direct) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < direct.size(); i++) CHECK(std::fabs(direct[i] - wino[i]) <= 1e-5f * scale);
}

TEST_CASE("Winograd's cost model: the convolutions it was measured faster on, by the FMA lanes a cycle issues") {
  // winograd_pays against what conv2d forward+backward measured on Zen 5 (direct against Winograd, alternated, one
  // process): 32 -> 32 5x5 (mnist's second conv) 1.04x / 1.53x (AVX-512, two 512-bit FMAs a cycle / TG_CPU=haswell,
  // two 256-bit), 64 -> 64 3x3 at 8x8 outputs 1.06x / 1.52x, 32 -> 64 3x3 at 10x10 0.65x / 0.90x, 1 -> 32 5x5
  // 0.38x / 0.31x. The machine: its vector bits, LLVM's FMA issue rate and the host's measured one (0: not measured).
  struct Cpu {
    int bits;
    double llvm, measured;
  };
  const Cpu zen5{512, 1, 2}, zen5_haswell{256, 2, 2}, zen4{512, 1, 1}, unmeasured{512, 2, 0};
  auto pays = [](int64_t batch, int64_t cin, int64_t cout, int64_t groups, int64_t r, int64_t o, Cpu cpu,
                 bool backward = true) {
    MachineModel mm;
    mm.vector_bits = cpu.bits, mm.cores = 2, mm.fma_per_cycle = cpu.llvm, mm.fma_measured_per_cycle = cpu.measured;
    const int64_t out[2] = {o, o};
    return detail::winograd_pays(batch, cin, cout, groups, r, out, backward, mm);
  };
  for (Cpu cpu : {zen5, zen5_haswell, zen4, unmeasured}) {
    CAPTURE(cpu.bits);
    CAPTURE(cpu.llvm);
    CAPTURE(cpu.measured);
    CHECK(pays(512, 32, 32, 1, 5, 20, cpu));
    CHECK(pays(512, 64, 64, 1, 3, 8, cpu));
    CHECK_FALSE(pays(512, 32, 64, 1, 3, 10, cpu));
    CHECK_FALSE(pays(512, 1, 32, 1, 5, 24, cpu));
    CHECK_FALSE(pays(1, 64, 64, 1, 3, 8, cpu));         // one image: the 16 more kernels cost more than it saves
    CHECK_FALSE(pays(512, 32, 32, 32, 3, 56, cpu));     // depthwise: no sum over channels to save products in
    CHECK_FALSE(pays(512, 32, 32, 1, 7, 20, cpu));      // no Winograd tile for 7x7
    CHECK(pays(128, 32, 32, 1, 5, 24, cpu));
  }
  // fewer FMA lanes a cycle make the products dearer against the passes: 32 -> 64 3x3 at 12x12 outputs (9 tiles of
  // 4, none cut) pays at 16 lanes (Zen 5 under haswell, Zen 4 natively) and not at 32; so does the forward alone of
  // torch_compare conv's 128 images (24x24 outputs): 0.90x on Zen 5 natively, 1.15x under haswell, 1.51x on Zen 4
  for (const std::pair<Cpu, bool>& c : {std::pair{zen5, false}, std::pair{unmeasured, false},
                                        std::pair{zen5_haswell, true}, std::pair{zen4, true}}) {
    const Cpu cpu = c.first;
    const bool sixteen_lanes = c.second;
    CAPTURE(cpu.bits);
    CAPTURE(cpu.llvm);
    CAPTURE(cpu.measured);
    CHECK(pays(512, 32, 64, 1, 3, 12, cpu) == sixteen_lanes);
    CHECK(pays(128, 32, 32, 1, 5, 24, cpu, false) == sixteen_lanes);
  }
}

TEST_CASE("conv2d takes Winograd by default where the cost model expects it faster, with the direct conv's values") {
  // 32 -> 32 channels, 5x5, 24x24 inputs, 64 images, the weight requiring its gradient: by Winograd on a CPU of
  // either vector width (the cost model above); one input channel: direct. Unset WINO gives WINO=1's kernels for the first and
  // WINO=0's for the second.
  auto run = [](const Tensor& x, const Tensor& w, const char* wino) {
    ScopedEnv e("WINO", wino);
    size_t k0 = kernels_run();
    std::vector<float> y = x.conv2d(w).to_vector<float>();
    return std::pair{kernels_run() - k0, y};
  };
  for (int64_t cin : {int64_t(32), int64_t(1)}) {
    CAPTURE(cin);
    Tensor x = Tensor::rand({64, cin, 24, 24}).realize(), w = (Tensor::rand({32, cin, 5, 5}) - 0.5f).realize();
    w.requires_grad_();
    auto [k_default, y_default] = run(x, w, nullptr);
    auto [k_direct, y_direct] = run(x, w, "0");
    auto [k_wino, y_wino] = run(x, w, "1");
    CHECK(k_wino > k_direct);
    const bool cpu = get_device(default_device()).renderer().grid_limits().threads == 0;  // a GPU: direct unless WINO=1
    CHECK(k_default == (cin == 32 && cpu ? k_wino : k_direct));
    float scale = 0;
    for (float v : y_direct) scale = std::max(scale, std::fabs(v));
    REQUIRE(y_default.size() == y_direct.size());
    for (size_t i = 0; i < y_direct.size(); i++) REQUIRE(std::fabs(y_default[i] - y_direct[i]) <= 1e-5f * scale);
  }
}

TEST_CASE("conv and pool errors name the op and the shapes") {
  Tensor x = T({1, 4, 5, 5}), w = T({8, 3, 3, 3});
  std::string m = error_of([&] { x.conv2d(w); });
  CHECK(m == "[conv2d] weight (8, 3, 3, 3) needs 3 input channels, input (1, 4, 5, 5) has 4");
  CHECK(error_of([&] { x.conv2d(T({6, 3, 3, 3}), std::nullopt, 1, 0, 1, 2); }) ==
        "[conv2d] weight (6, 3, 3, 3) needs 6 input channels (3 x 2 groups), input (1, 4, 5, 5) has 4");
  CHECK_THROWS_AS(x.conv2d(T({6, 2, 3, 3}), std::nullopt, 1, 0, 1, 4), Error);   // 4 groups: 2*4 = 8 != 4 channels
  CHECK_THROWS_AS(x.conv2d(T({6, 1, 3, 3}), std::nullopt, 1, 0, 1, 4), Error);   // 6 outputs not divisible by 4
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3})), Error);                                 // conv2d needs a 4-d weight
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3, 3}), T({7})), Error);                      // bias size
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3, 3}), std::nullopt, 2, "same"), Error);     // same needs stride 1
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3, 3}), std::nullopt, 1, "full"), Error);     // unknown padding string
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3, 3}), std::nullopt, 1, {1, 2, 3}), Error);  // 3 pads for 2 dims
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3, 3}), std::nullopt, 1, -1, 1, 1, "reflect"), Error);  // crops with zeros mode only
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3, 3}), std::nullopt, 1, 1, 1, 1, "mirror"), Error);
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 7, 7})), Error);                              // kernel larger than input
  CHECK_THROWS_AS(x.conv2d(T({8, 4, 3, 3}), std::nullopt, 0), Error);             // stride 0
  CHECK_THROWS_AS(T({4, 5}).conv2d(T({8, 4, 3, 3})), Error);                      // input rank
  CHECK_THROWS_AS(x.conv_transpose2d(T({3, 2, 3, 3})), Error);                    // 3 in-channels vs 4
  CHECK_THROWS_AS(x.conv_transpose2d(T({4, 2, 3, 3}), std::nullopt, 2, 0, 2), Error);  // output_padding >= stride
  CHECK_THROWS_AS(x.conv_transpose2d(T({4, 2, 3, 3}), T({3})), Error);           // bias
  CHECK(error_of([&] { x.max_pool2d(3, 1, 2); }).rfind("[max_pool2d] padding (2, 2)", 0) == 0);
  CHECK_THROWS_AS(x.max_pool2d(7), Error);
  CHECK_THROWS_AS(T({5}).max_pool2d(2), Error);
  CHECK_THROWS_AS(x.max_pool2d({2, 2, 2}), Error);
  CHECK_THROWS_AS(x.avg_pool2d(0), Error);
  CHECK_THROWS_AS(x.avg_pool2d(2, 0), Error);
  CHECK_THROWS_AS(x.adaptive_avg_pool2d({0, 2}), Error);
  CHECK_THROWS_AS(T({5}).adaptive_max_pool2d(2), Error);
}

TEST_CASE("norm, dropout, attention, embedding and interpolate errors") {
  Tensor x = T({2, 3, 4});
  CHECK(error_of([&] { x.batch_norm(std::nullopt, std::nullopt); }).rfind("[batch_norm] evaluation", 0) == 0);
  CHECK_THROWS_AS(x.batch_norm(T({4}), T({3})), Error);
  CHECK_THROWS_AS(x.batch_norm(T({3}), T({3}), T({2})), Error);
  CHECK_THROWS_AS(T({1, 3}).batch_norm(std::nullopt, std::nullopt, std::nullopt, std::nullopt, true), Error);
  CHECK_THROWS_AS(T({3}).batch_norm(T({3}), T({3})), Error);
  CHECK(error_of([&] { x.layer_norm({3}); }) == "[layer_norm] normalized_shape (3,) must be the trailing dims of input (2, 3, 4)");
  CHECK_THROWS_AS(x.layer_norm({4}, T({3})), Error);
  CHECK_THROWS_AS(x.group_norm(2), Error);
  CHECK_THROWS_AS(x.group_norm(0), Error);
  CHECK_THROWS_AS(x.group_norm(3, T({4})), Error);
  CHECK_THROWS_AS(x.rms_norm({2, 4}), Error);
  CHECK_THROWS_AS(x.dropout(1.5), Error);
  CHECK_THROWS_AS(x.dropout(-0.1), Error);
  CHECK_THROWS_AS(x.scaled_dot_product_attention(T({2, 5, 3}), T({2, 5, 4})), Error);
  CHECK_THROWS_AS(x.scaled_dot_product_attention(T({2, 5, 4}), T({2, 6, 4})), Error);
  CHECK_THROWS_AS(x.scaled_dot_product_attention(T({2, 5, 4}), T({2, 5, 4}), Tensor::ones({3, 5}, dtypes::bool_), 0.0, true), Error);
  CHECK_THROWS_AS(x.scaled_dot_product_attention(T({2, 5, 4}), T({2, 5, 4}), Tensor::ones({4, 5}, dtypes::bool_)), Error);
  CHECK_THROWS_AS(embedding(ints({1, 2}), T({5})), Error);
  CHECK_THROWS_AS(embedding(T({2}), T({5, 3})), Error);
  CHECK_THROWS_AS(x.interpolate({5}, "cubic"), Error);
  CHECK_THROWS_AS(x.interpolate({5}, "nearest", true), Error);
  CHECK_THROWS_AS(x.interpolate({1, 2, 3, 4}), Error);
  CHECK_THROWS_AS(x.interpolate({0}), Error);
}

TEST_CASE("loss errors") {
  Tensor logits = T({4, 3}), y = ints({0, 1, 2, 1});
  CHECK(error_of([&] { logits.cross_entropy(y, "avg"); }) == "[cross_entropy] reduction 'avg' is not one of 'mean', 'sum', 'none'");
  CHECK(error_of([&] { logits.cross_entropy(ints({0, 1, 2})); }) ==
        "[cross_entropy] class-index target (3,) must be (4,) for input (4, 3)");
  CHECK_THROWS_AS(logits.cross_entropy(T({4, 2})), Error);                 // probabilities of the wrong shape
  CHECK_THROWS_AS(logits.cross_entropy(y, "mean", 1.5), Error);            // label_smoothing
  CHECK_THROWS_AS(logits.cross_entropy(y, "mean", 0, -100, T({4})), Error);  // weight per class
  CHECK_THROWS_AS(logits.cross_entropy(Tensor::ones({4}, dtypes::bool_)), Error);
  CHECK_THROWS_AS(T({}).cross_entropy(y), Error);
  CHECK_THROWS_AS(logits.nll_loss(T({4})), Error);
  CHECK_THROWS_AS(logits.nll_loss(y, std::nullopt, -100, "max"), Error);
  CHECK_THROWS_AS(logits.sparse_categorical_crossentropy(ints({0, 1})), Error);
  CHECK_THROWS_AS(logits.sparse_categorical_crossentropy(T({4})), Error);
  CHECK_THROWS_AS(logits.binary_crossentropy(T({4, 2})), Error);
  CHECK_THROWS_AS(logits.binary_crossentropy_with_logits(T({3, 3})), Error);
  CHECK_THROWS_AS(logits.mse_loss(T({5})), Error);
  CHECK_THROWS_AS(logits.l1_loss(T({4, 3}), "all"), Error);
  CHECK_THROWS_AS(logits.smooth_l1_loss(T({4, 3}), "mean", -1), Error);
}

TEST_CASE("linear algebra errors") {
  CHECK(error_of([] { T({2, 3}).matmul(T({4, 5})); }) ==
        "[matmul] cannot multiply (2, 3) and (4, 5): inner dims 3 and 4 differ");
  CHECK_THROWS_AS(T({}).matmul(T({3})), Error);
  CHECK_THROWS_AS(T({2, 2, 3}).matmul(T({3, 3, 4})), Error);  // batch dims 2 and 3
  CHECK_THROWS_AS(T({2, 3}).linear(T({4, 2})), Error);
  CHECK_THROWS_AS(T({2, 3}).linear(T({4, 3}), T({3})), Error);
  CHECK_THROWS_AS(T({2, 3}).linear(T({2, 4, 3})), Error);
  CHECK(error_of([] { einsum("ij,jk->ik", {T({2, 3})}); }) == "[einsum] \"ij,jk->ik\" names 2 operands, got 1");
  CHECK_THROWS_AS(einsum("ij,jk->ik", {T({2, 3}), T({4, 5})}), Error);   // j is 3 and 4
  CHECK_THROWS_AS(einsum("ij->k", {T({2, 3})}), Error);                  // k not in the inputs
  CHECK_THROWS_AS(einsum("ij->ii", {T({2, 3})}), Error);                 // output repeats i
  CHECK_THROWS_AS(einsum("ijk->", {T({2, 3})}), Error);                  // 3 subscripts for 2 dims
  CHECK_THROWS_AS(einsum("i1->i", {T({2, 3})}), Error);                  // bad character
  CHECK_THROWS_AS(einsum("ii->i", {T({2, 3})}), Error);                  // diagonal of unequal dims
  CHECK_THROWS_AS(einsum("...i...->i", {T({2, 3})}), Error);
}

TEST_CASE("movement and indexing errors") {
  Tensor x = T({2, 3});
  CHECK(error_of([&] { cat({x, T({2, 4})}, 0); }) == "[cat] tensor 1 has shape (2, 4), expected (2, 3) except in dim 0");
  CHECK_THROWS_AS(cat({}, 0), Error);
  CHECK_THROWS_AS(cat({T({}), T({})}, 0), Error);
  CHECK_THROWS_AS(cat({x, x}, 2), Error);
  CHECK_THROWS_AS(stack({x, T({3, 2})}), Error);
  CHECK_THROWS_AS(x.repeat({2}), Error);
  CHECK_THROWS_AS(x.repeat({2, -1}), Error);
  CHECK_THROWS_AS(x.repeat_interleave(-1), Error);
  CHECK_THROWS_AS(x.split(std::vector<int64_t>{1, 1}, 1), Error);
  CHECK_THROWS_AS(x.split(0, 1), Error);
  CHECK_THROWS_AS(x.chunk(0), Error);
  CHECK_THROWS_AS(x.roll({1, 2}, {0}), Error);
  CHECK_THROWS_AS(x.roll(std::vector<int64_t>{1, 2}), Error);
  CHECK_THROWS_AS(x.unflatten(1, {2, 2}), Error);
  CHECK_THROWS_AS(x.unflatten(1, {-1, -1}), Error);
  CHECK_THROWS_AS(x.diagonal(0, 1, 1), Error);
  CHECK_THROWS_AS(T({3}).diagonal(), Error);
  CHECK_THROWS_AS(T({3}).tril(), Error);
  CHECK(error_of([&] { x.gather(1, T({2, 3})); }) == "[gather] index must be an integer tensor, got float32");
  CHECK_THROWS_AS(x.gather(1, ints({0, 1})), Error);
  CHECK_THROWS_AS(x.gather(1, ints({0, 1, 0, 1, 0, 1, 0, 1}, {4, 2})), Error);
  CHECK_THROWS_AS(x.gather(2, ints({0, 1}, {1, 2})), Error);
  CHECK_THROWS_AS(x.index_select(0, ints({0, 1}, {1, 2})), Error);
  CHECK_THROWS_AS(x.scatter(1, ints({0}), T({1})), Error);
  CHECK_THROWS_AS(x.scatter(1, ints({0, 1, 2}, {3, 1}), T({3, 1})), Error);  // index larger than self outside dim
  CHECK_THROWS_AS(x.scatter_reduce(1, ints({0}, {1, 1}), T({1, 1}), "max"), Error);
  CHECK_THROWS_AS(x.masked_fill(T({3}), Tensor(1.0)), Error);
  CHECK_THROWS_AS(x.masked_fill(Tensor::ones({3}, dtypes::bool_), T({3})), Error);
  CHECK_THROWS_AS(x.masked_fill(Tensor::ones({4}, dtypes::bool_), Tensor(1.0)), Error);
  CHECK(error_of([&] { x.index({0, 3}); }) == "[index] index 3 is out of range for dim 1 of size 3");
  CHECK_THROWS_AS(x.index({0, 0, 0}), Error);
  CHECK_THROWS_AS(x.index({Ellipsis, 0, Ellipsis}), Error);
  CHECK_THROWS_AS(x.index({Tensor::ones({2}, dtypes::bool_)}), Error);
  CHECK_THROWS_AS(x.index({T({2})}), Error);
  CHECK_THROWS_AS(x.index({Slice{0, 2, 0}}), Error);
  CHECK_THROWS_AS(x.index({ints({0, 1}), ints({0, 1, 2})}), Error);  // index tensors do not broadcast
  CHECK_THROWS_AS(x.set_slice({Slice{0, 1, 1}}, T({2})), Error);
  CHECK_THROWS_AS(x.set_slice({Slice{0, 1, 1}, Slice{}, Slice{}}, T({3})), Error);
  CHECK_THROWS_AS(x.index_put({0}, T({4})), Error);
  CHECK_THROWS_AS(x.pad({{1, 1}, {1, 1}}, "mirror"), Error);
  CHECK_THROWS_AS(x.pad({{1, 1}}, "reflect"), Error);
  CHECK(error_of([&] { x.pad({{0, 0}, {3, 0}}, "reflect"); }) == "[pad] reflect padding 3, 0 must be less than dim 1 of size 3");
  CHECK_THROWS_AS(x.pad({{0, 0}, {4, 0}}, "circular"), Error);
  CHECK_THROWS_AS(x.one_hot(3), Error);
  CHECK_THROWS_AS(ints({0, 1}).one_hot(-1), Error);
  CHECK_THROWS_AS(meshgrid({x}), Error);
  CHECK_THROWS_AS(meshgrid({T({2})}, "yx"), Error);
}

TEST_CASE("reduction, math and creation errors") {
  Tensor x = T({2, 3});
  CHECK_THROWS_AS(x.var({2}), Error);
  CHECK_THROWS_AS(x.logsumexp({-3}), Error);
  CHECK_THROWS_AS(x.cumsum(2), Error);
  CHECK(error_of([&] { x.topk(4, 1); }) == "[topk] k 4 is out of range for dim 1 of (2, 3)");
  CHECK_THROWS_AS(x.sort(5), Error);
  CHECK_THROWS_AS(Tensor::zeros({2, 0}).argmax(1), Error);
  CHECK_THROWS_AS(x.argmax(3), Error);
  CHECK_THROWS_AS(x.lerp(ints({1, 2, 3}), Tensor(0.5)), Error);
  CHECK_THROWS_AS(x.bitwise_not(), Error);
  CHECK_THROWS_AS(x.bitwise_and(x), Error);
  CHECK_THROWS_AS(ints({1}).bitwise_and(Tensor(1.5)), Error);
  CHECK_THROWS_AS(x.lshift(Tensor(1)), Error);
  CHECK(error_of([&] { x.eq(T({2})); }) == "[eq] shapes (2, 3) and (2,) do not broadcast");
  CHECK(error_of([&] { x.gt(T({4})); }) == "[gt] shapes (4,) and (2, 3) do not broadcast");
  CHECK(error_of([&] { x.bitwise_or(ints({1, 2})); }) == "[bitwise_or] needs int or bool tensors, got float32 and int64");
  CHECK_THROWS_AS(ints({1, 2}).logical_and(ints({1, 2, 3})), Error);
  CHECK_THROWS_AS(x.lerp(T({2, 3}), T({4})), Error);
  CHECK_THROWS_AS(x.clamp(T({5}), T({3})), Error);
  CHECK_THROWS_AS(x.gelu("erf"), Error);
  CHECK_THROWS_AS(x.clamp(NAN, 1), Error);
  CHECK_THROWS_AS(x.hardtanh(1, -1), Error);
  CHECK_THROWS_AS(x.celu(0), Error);
  CHECK_THROWS_AS(x.softplus(0), Error);
  CHECK_THROWS_AS(ints({2}).pow(-1), Error);
  CHECK_THROWS_AS(Tensor::linspace(0, 1, -1), Error);
  CHECK_THROWS_AS(Tensor::linspace(0, 1, 3, dtypes::bool_), Error);
  CHECK_THROWS_AS(Tensor::uniform({2}, 1, 1), Error);
  CHECK_THROWS_AS(Tensor::normal({2}, 0, -1), Error);
  CHECK(error_of([] { Tensor::kaiming_uniform({4}); }) == "[kaiming_uniform] needs a shape with at least 2 dims, got (4,)");
  CHECK_THROWS_AS(Tensor::glorot_uniform({}), Error);
  CHECK_THROWS_AS(ints({1}).rand_like(), Error);
}

TEST_CASE("creation helpers: linspace, *_like, tril/triu, random inits") {
  CHECK(Tensor::linspace(0, 1, 5).to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1});
  CHECK(Tensor::linspace(2, 2, 1).to_vector<float>() == std::vector<float>{2});
  CHECK(Tensor::linspace(0, 10, 3, dtypes::int32).to_vector<int32_t>() == std::vector<int32_t>{0, 5, 10});
  CHECK(Tensor::linspace(0, 1, 0).numel() == 0);
  Tensor x = T({2, 3});
  CHECK(x.zeros_like().to_vector<float>() == std::vector<float>(6, 0));
  CHECK(x.ones_like(dtypes::int32).to_vector<int32_t>() == std::vector<int32_t>(6, 1));
  CHECK(x.full_like(2.5).to_vector<float>() == std::vector<float>(6, 2.5f));
  CHECK(T({3, 3}, 1).tril().to_vector<float>() == std::vector<float>{1, 0, 0, 4, 5, 0, 7, 8, 9});
  CHECK(T({3, 3}, 1).triu(1).to_vector<float>() == std::vector<float>{0, 2, 3, 0, 0, 6, 0, 0, 0});
  Tensor::manual_seed(7);
  auto u = Tensor::uniform({20000}, -3, 5).to_vector<float>();
  double mean = 0, lo = 1e9, hi = -1e9;
  for (float v : u) {
    mean += v;
    lo = std::min(lo, double(v));
    hi = std::max(hi, double(v));
  }
  mean /= double(u.size());
  CHECK(lo >= -3);
  CHECK(hi < 5);
  CHECK(mean == doctest::Approx(1.0).epsilon(0.05));
  auto n = Tensor::normal({20000}, 2, 0.5).to_vector<float>();
  double m = 0, v2 = 0;
  for (float v : n) m += v;
  m /= double(n.size());
  for (float v : n) v2 += (v - m) * (v - m);
  CHECK(m == doctest::Approx(2.0).epsilon(0.01));
  CHECK(std::sqrt(v2 / double(n.size())) == doctest::Approx(0.5).epsilon(0.03));
  double bound = std::sqrt(6.0 / (1 + 0.01 * 0.01) / 75.0);
  for (float v : Tensor::kaiming_uniform({8, 3, 5, 5}).to_vector<float>()) CHECK_UNARY(std::fabs(v) <= bound);
  double gb = std::sqrt(6.0 / (8 + 75.0));
  for (float v : Tensor::glorot_uniform({8, 3, 5, 5}).to_vector<float>()) CHECK_UNARY(std::fabs(v) <= gb);
  for (float v : Tensor::scaled_uniform({4, 25}).to_vector<float>()) CHECK_UNARY(std::fabs(v) <= 0.1f);
  auto kn = Tensor::kaiming_normal({64, 100}).to_vector<float>();
  double s2 = 0;
  for (float v : kn) s2 += double(v) * v;
  CHECK(std::sqrt(s2 / double(kn.size())) == doctest::Approx(std::sqrt(2.0 / (1 + 1e-4) / 100)).epsilon(0.05));
  Tensor::manual_seed(3);
  auto r1 = x.rand_like().to_vector<float>();
  Tensor::manual_seed(3);
  CHECK(x.rand_like().to_vector<float>() == r1);
  CHECK(x.randn_like().shape() == x.shape());
}

TEST_CASE("dropout zeroes about p of the elements and scales the rest by 1/(1-p)") {
  Tensor::manual_seed(11);
  Tensor x = Tensor::ones({100, 100});
  auto v = x.dropout(0.25).to_vector<float>();
  size_t zeros = 0;
  for (float e : v) {
    if (e == 0) zeros++;
    else CHECK(e == doctest::Approx(1 / 0.75));
  }
  CHECK(double(zeros) / double(v.size()) == doctest::Approx(0.25).epsilon(0.08));
  CHECK(x.dropout(0.25, false).uop().get() == x.uop().get());
  CHECK(x.dropout(1.0).to_vector<float>() == std::vector<float>(10000, 0));
  // the gradient flows only through the kept elements, scaled the same way
  Tensor w = Tensor::ones({1000}).requires_grad_();
  Tensor d = w.dropout(0.5);
  Tensor g = d.sum().gradient({w})[0];
  realize(d, g);
  auto dv = d.to_vector<float>(), gv = g.to_vector<float>();
  for (size_t i = 0; i < dv.size(); i++) CHECK(gv[i] == dv[i]);
}

TEST_CASE("batch_norm in training updates the running statistics in place") {
  // channel c holds values {c, c+2, c+4, c+6} over (N=2, L=2): mean c+3, biased var 5, unbiased 20/3
  std::vector<float> v;
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 2; c++)
      for (int l = 0; l < 2; l++) v.push_back(float(c + 2 * (2 * n + l)));
  Tensor x = Tensor::from_vector(v, {2, 2, 2});
  Tensor rm = Tensor::zeros({2}), rv = Tensor::ones({2});
  rm.realize();
  rv.realize();
  Tensor y = x.batch_norm(rm, rv, std::nullopt, std::nullopt, true, 0.1);
  realize(y, rm, rv);
  auto m = rm.to_vector<float>(), var = rv.to_vector<float>();
  CHECK(m[0] == doctest::Approx(0.3));
  CHECK(m[1] == doctest::Approx(0.4));
  CHECK(var[0] == doctest::Approx(0.9 + 0.1 * 20.0 / 3));
  CHECK(var[1] == doctest::Approx(0.9 + 0.1 * 20.0 / 3));
  auto yv = y.to_vector<float>();
  CHECK(yv[0] == doctest::Approx(-3 / std::sqrt(5 + 1e-5)));
  // evaluation uses the running stats
  Tensor e = x.batch_norm(rm, rv);
  CHECK(e.to_vector<float>()[0] == doctest::Approx((0 - 0.3) / std::sqrt(0.9 + 0.1 * 20.0 / 3 + 1e-5)));
}

TEST_CASE("indexing: ints, slices, NewAxis, Ellipsis and set_slice on a 3-d tensor") {
  Tensor x = T({2, 3, 4});
  CHECK(x.index({1, Slice{1, 3, 1}, -1}).to_vector<float>() == std::vector<float>{19, 23});
  CHECK(x.index({Ellipsis, NewAxis, 0}).shape() == Shape{2, 3, 1});
  CHECK(x.index({ints({1, 0}), 2, ints({3, 0})}).to_vector<float>() == std::vector<float>{23, 8});
  Tensor y = x.set_slice({Slice{}, Slice{0, 3, 2}, Slice{3, std::nullopt, -3}}, Tensor(-1.0));
  auto yv = y.to_vector<float>();
  for (int64_t i = 0; i < 24; i++) {
    int64_t r = (i / 4) % 3, c = i % 4;
    bool hit = (r == 0 || r == 2) && (c == 3 || c == 0);
    CHECK(yv[size_t(i)] == (hit ? -1.0f : float(i)));
  }
  Tensor z = x.index_put({ints({1, 0}), Slice{}, 0}, Tensor(100.0));
  auto zv = z.to_vector<float>();
  CHECK(zv[0] == 100);
  CHECK(zv[12] == 100);
  CHECK(zv[1] == 1);
}

TEST_CASE("attention, masked_select and indexing errors name the op, the shapes and what was expected") {
  Tensor q = T({2, 3, 4});
  CHECK(error_of([&] { q.scaled_dot_product_attention(T({2, 5, 3}), T({2, 5, 4})); }) ==
        "[scaled_dot_product_attention] query (2, 3, 4) and key (2, 5, 3) differ in the embedding dim");
  CHECK(error_of([&] { q.scaled_dot_product_attention(T({2, 5, 4}), T({2, 6, 4})); }) ==
        "[scaled_dot_product_attention] key (2, 5, 4) and value (2, 6, 4) differ in sequence length");
  CHECK(error_of([&] { q.masked_select(T({3, 4})); }) == "[masked_select] mask must be bool, got float32");
  CHECK(error_of([&] { q.masked_select(Tensor::ones({5}, dtypes::bool_)); }) == "[masked_select] shapes (2, 3, 4) and (5,) do not broadcast");
  CHECK(error_of([&] { q.index({-3}); }) == "[index] index -3 is out of range for dim 0 of size 2");
  CHECK(error_of([&] { q.index_select(1, T({2})); }).rfind("[index_select] ", 0) == 0);
  CHECK(error_of([&] { T({2, 3}).matmul(Tensor::ones({3, 2}, dtypes::bool_).cast(dtypes::int32).T().T().reshape({2, 3})); })
            .rfind("[matmul] cannot multiply (2, 3) and (2, 3)", 0) == 0);
}

TEST_CASE("masked_select keeps the selected elements in order; any/all/cat handle empty tensors") {
  Tensor x = T({2, 3}, 1);
  x.requires_grad_();
  Tensor m = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  Tensor s = x.masked_select(m);
  CHECK(s.to_vector<float>() == std::vector<float>{1, 3, 4, 6});
  CHECK(Tensor(s.sum()).gradient({x})[0].to_vector<float>() == std::vector<float>{1, 0, 1, 1, 0, 1});
  CHECK(x.masked_select(Tensor::zeros({2, 3}, dtypes::bool_)).shape() == Shape{0});
  Tensor e = Tensor::zeros({0, 3}, dtypes::bool_);
  CHECK(e.any({0}).to_vector<bool>() == std::vector<bool>{false, false, false});
  CHECK(e.all({0}).to_vector<bool>() == std::vector<bool>{true, true, true});
  CHECK(cat({T({0, 3}), T({2, 3}), T({0, 3})}, 0).to_vector<float>() == iota_f(6));
  CHECK(cat({T({0, 3}), T({0, 3})}, 0).shape() == Shape{0, 3});
}
