// Symbolic autograd: exact gradients of small programs, accumulation, second order, no-grad, detach.
#include <doctest/doctest.h>

#include <cmath>

#include "tg/gradient.hpp"
#include "tg/schedule.hpp"
#include "scoped_env.hpp"

using namespace tg;

TEST_CASE("gradient of a product and a sum") {
  auto x = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad_();
  auto y = Tensor::from_vector(std::vector<float>{4, 5, 6}).requires_grad_();
  Tensor loss = Tensor(x * y + x).sum();
  loss.backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{5, 6, 7});
  CHECK(y.grad().to_vector<float>() == std::vector<float>{1, 2, 3});
}

TEST_CASE("gradients accumulate across backward calls and zero_grad clears them") {
  auto x = Tensor::from_vector(std::vector<float>{1, 2}).requires_grad_();
  Tensor(x * x).sum().backward();
  Tensor(x * 3).sum().backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{5, 7});
  x.zero_grad();
  CHECK_FALSE(x.has_grad());
  CHECK_THROWS_AS(x.grad(), Error);
}

TEST_CASE("gradients through movement ops, reductions and broadcasting") {
  auto x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  auto b = Tensor::from_vector(std::vector<float>{10, 20, 30}).requires_grad_();
  Tensor y = Tensor(x.T().pad({{1, 0}, {0, 0}}).shrink({{1, 4}, {0, 2}}).T() * b).flip({1});
  Tensor loss = Tensor(y * y).sum();
  loss.backward();
  // loss = sum_ij (x_ij b_j)^2: d/dx_ij = 2 x_ij b_j^2, d/db_j = 2 b_j sum_i x_ij^2
  auto gx = x.grad().to_vector<float>();
  std::vector<float> xv{1, 2, 3, 4, 5, 6}, bv{10, 20, 30};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) CHECK(gx[size_t(i * 3 + j)] == doctest::Approx(2 * xv[size_t(i * 3 + j)] * bv[size_t(j)] * bv[size_t(j)]));
  auto gb = b.grad().to_vector<float>();
  for (int j = 0; j < 3; j++)
    CHECK(gb[size_t(j)] == doctest::Approx(2 * bv[size_t(j)] * (xv[size_t(j)] * xv[size_t(j)] + xv[size_t(3 + j)] * xv[size_t(3 + j)])));
}

TEST_CASE("max reduce shares the gradient among ties; maximum splits ties") {
  auto x = Tensor::from_vector(std::vector<float>{1, 3, 3, 2}).requires_grad_();
  x.max().backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 0.5, 0.5, 0});
  auto a = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad_();
  auto b = Tensor::from_vector(std::vector<float>{3, 2, 1}).requires_grad_();
  a.maximum(b).sum().backward();
  CHECK(a.grad().to_vector<float>() == std::vector<float>{0, 0.5, 1});
  CHECK(b.grad().to_vector<float>() == std::vector<float>{1, 0.5, 0});
}

TEST_CASE("unary gradients: exp, log, sqrt, sin, reciprocal, sigmoid") {
  std::vector<float> v{0.5f, 1.0f, 2.0f};
  auto x = Tensor::from_vector(v).requires_grad_();
  Tensor loss = Tensor(x.exp() + x.log() + x.sqrt() + x.sin() + x.reciprocal() + x.sigmoid()).sum();
  loss.backward();
  auto g = x.grad().to_vector<float>();
  for (size_t i = 0; i < 3; i++) {
    double t = v[i], s = 1 / (1 + std::exp(-t));
    double want = std::exp(t) + 1 / t + 0.5 / std::sqrt(t) + std::cos(t) - 1 / (t * t) + s * (1 - s);
    CHECK(g[i] == doctest::Approx(want).epsilon(1e-5));
  }
}

TEST_CASE("gradient of a gradient (second order)") {
  auto x = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad_();
  Tensor y = Tensor(x * x * x).sum();  // dy/dx = 3x^2, d2y/dx2 = 6x
  Tensor dx = y.gradient({x})[0];
  Tensor d2 = dx.sum().gradient({x})[0];
  CHECK(dx.to_vector<float>() == std::vector<float>{3, 12, 27});
  CHECK(d2.to_vector<float>() == std::vector<float>{6, 12, 18});
}

TEST_CASE("detach and no-grad stop gradients") {
  auto x = Tensor::from_vector(std::vector<float>{1, 2}).requires_grad_();
  Tensor y = Tensor(x * x.detach()).sum();
  y.backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{1, 2});
  x.zero_grad();
  Tensor z;
  {
    NoGrad ng;
    z = x * 2;
  }
  CHECK_FALSE(z.requires_grad());
  CHECK(Tensor(x * 2).requires_grad());
  CHECK_THROWS_AS(Tensor(z.sum()).backward(), Error);
}

TEST_CASE("backward of a non-scalar needs a seed") {
  auto x = Tensor::from_vector(std::vector<float>{1, 2}).requires_grad_();
  Tensor y = x * 3;
  CHECK_THROWS_AS(y.backward(), Error);
  y.backward(Tensor::from_vector(std::vector<float>{1, 10}));
  CHECK(x.grad().to_vector<float>() == std::vector<float>{3, 30});
}

TEST_CASE("the backward pass fuses: a gradient of an elementwise chain is one kernel") {
  auto x = Tensor::from_vector(std::vector<float>(64, 1.5f)).requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 10; i++) y = y * 1.1 + 0.1;
  Tensor(y * y).sum().backward();
  Tensor g = x.grad();
  size_t before = kernels_run();
  g.realize();
  CHECK(kernels_run() - before <= 2);
}

TEST_CASE("gradients of non-differentiable results and of int tensors are errors naming the dtype and shape") {
  auto x = Tensor::from_vector(std::vector<float>{1, 3, 2}).requires_grad_();
  auto msg = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(msg([&] { x.argmax().gradient({x}); }) ==
        "[gradient] result " + x.argmax().dtype().name() + " () is not differentiable (comparisons, argmax/argmin, sort "
        "indices, int and bool ops); differentiate a float result");
  CHECK(msg([&] { Tensor(x > 1.5).gradient({x}); }).rfind("[gradient] result bool (3,) is not differentiable", 0) == 0);
  CHECK_THROWS_AS(x.sort().second.sum().backward(), Error);  // sum of int64 indices
  auto i = Tensor::from_vector(std::vector<int32_t>{1, 2});
  CHECK(msg([&] { Tensor(x.sum()).gradient({x, i}); }) == "[gradient] target 1 is int32 (2,): only float tensors have gradients");
  CHECK(msg([&] { i.requires_grad_(); }) == "[requires_grad_] only float tensors can require gradients, got int32 (2,)");
  CHECK(msg([&] { Tensor(x * 2).backward(); }) == "[backward] needs a scalar, got shape (3,); pass a seed gradient");
  CHECK(msg([&] { Tensor(x * 2).gradient({x}); }) == "[gradient] of a non-scalar (3,) needs a seed gradient of that shape");
  Tensor bad_seed = Tensor::ones({2});
  CHECK(msg([&] { Tensor(x * 2).gradient({x}, &bad_seed); }) == "[gradient] seed shape (2,) does not match (3,)");
  // a float result through a piecewise-constant op is differentiable, with a zero gradient (as in torch)
  CHECK(Tensor(x.round().sum()).gradient({x})[0].to_vector<float>() == std::vector<float>{0, 0, 0});
}

TEST_CASE("custom_gradient replaces the differentiated graph; the forward value is unchanged") {
  auto x = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad_();
  auto w = Tensor::from_vector(std::vector<float>{4, 5, 6}).requires_grad_();
  // value x*w; gradient for x: 10*grad (not w*grad), none for w
  Tensor y = Tensor(x * w).custom_gradient({x, w}, "test: 10x for x, none for w",
                                           [](const Tensor& g, const Tensor&, const std::vector<Tensor>&) {
                                             return std::vector<std::optional<Tensor>>{Tensor(g * 10), std::nullopt};
                                           });
  CHECK(y.to_vector<float>() == std::vector<float>{4, 10, 18});
  Tensor(y * y).sum().backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{80, 200, 360});  // 10 * 2y
  if (w.has_grad()) CHECK(w.grad().to_vector<float>() == std::vector<float>{0, 0, 0});  // the rule gives w none
  // the same key reuses the first rule; a gradient of the wrong shape is an error naming both shapes
  Tensor bad = x.custom_gradient({x}, "test: wrong shape", [](const Tensor&, const Tensor&, const std::vector<Tensor>&) {
    return std::vector<std::optional<Tensor>>{Tensor::ones({2})};
  });
  CHECK_THROWS_WITH_AS(bad.sum().backward(), doctest::Contains("has shape (2,), input is (3,)"), Error);
}

namespace {
bool has_op(const Tensor& t, Ops op) {
  for (const UOp* u : toposort(t.uop().get()))
    if (u->op == op) return true;
  return false;
}
}  // namespace

TEST_CASE("relu, sigmoid, pow, sort and contiguous_backward differentiate by rules, not custom-gradient closures") {
  auto x = Tensor::from_vector(std::vector<float>{-1, 0, 0.5f, 2}).requires_grad_();
  auto y = Tensor::from_vector(std::vector<float>{2, 0, -1, 0.5f}).requires_grad_();
  for (const Tensor& t : {x.relu(), x.sigmoid(), x.pow(y), x.sort().first, x.contiguous_backward()})
    CHECK_FALSE(has_op(t, Ops::FUNCTION));
  // pow is one POW node (its rule has torch's edges); contiguous_backward an identity whose rule makes the gradient
  // contiguous, and the forward value passes through it
  CHECK(x.pow(y).uop()->op == Ops::POW);
  Tensor cb = Tensor(x * 2).contiguous_backward();
  CHECK(cb.to_vector<float>() == std::vector<float>{-2, 0, 1, 4});
  CHECK(has_op(Tensor(cb * 3).sum().gradient({x})[0], Ops::CONTIGUOUS));
  CHECK_FALSE(has_op(Tensor(Tensor(x * 2) * 3).sum().gradient({x})[0], Ops::CONTIGUOUS));
  Tensor(Tensor(cb * 3).sum()).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{6, 6, 6, 6});
  // sort's gradient goes back by the indices (ties: the stable order's), each value's to where it came from
  auto s = Tensor::from_vector(std::vector<float>{3, 1, 3, 2}).requires_grad_();
  Tensor(s.sort().first * Tensor::from_vector(std::vector<float>{1, 2, 3, 4})).sum().backward();
  CHECK(s.grad().to_vector<float>() == std::vector<float>{3, 1, 4, 2});
}

TEST_CASE("a convolution's input gradient is a transposed convolution: one kernel without bounds tests") {
  Tensor x = Tensor::rand({2, 3, 9, 9}).requires_grad_(), w = Tensor::rand({4, 3, 3, 3}).requires_grad_();
  x.realize(), w.realize();
  Tensor y = x.conv2d(w, std::nullopt, 1, 1);
  Tensor g = Tensor::rand(y.shape());
  g.realize();
  Tensor gx = Tensor(y * g).sum().gradient({x})[0];
  // reference: gx[n,c,i,j] = sum_{o,a,b} g[n,o,i-a+1,j-b+1] w[o,c,a,b]
  auto xv = gx.to_vector<float>(), gv = g.to_vector<float>(), wv = w.to_vector<float>();
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int i = 0; i < 9; i++)
        for (int j = 0; j < 9; j++) {
          double s = 0;
          for (int o = 0; o < 4; o++)
            for (int a = 0; a < 3; a++)
              for (int b = 0; b < 3; b++) {
                int oi = i - a + 1, oj = j - b + 1;
                if (oi >= 0 && oi < 9 && oj >= 0 && oj < 9)
                  s += double(gv[size_t(((n * 4 + o) * 9 + oi) * 9 + oj)]) * double(wv[size_t(((o * 3 + c) * 3 + a) * 3 + b)]);
              }
          REQUIRE(std::abs(s - xv[size_t(((n * 3 + c) * 9 + i) * 9 + j)]) <= 1e-5 * (1 + std::abs(s)));
        }
}

TEST_CASE("a convolution's input gradient from autograd stores no window gradient") {
  // Autograd's d/dx sums the window gradient (N, C, *o, *k) over the window view's repeats; the layout stage rewrites
  // that sum into a transposed convolution (conv_input_grad), so no buffer of the window gradient's size is written.
  struct Case {
    int64_t stride, dilation, groups;
  };
  for (Case k : {Case{1, 1, 1}, Case{2, 1, 1}, Case{1, 2, 2}}) {
    CAPTURE(k.stride);
    CAPTURE(k.dilation);
    CAPTURE(k.groups);
    Tensor x = Tensor::rand({2, 4, 9, 9}).realize().requires_grad_(), w = Tensor::rand({2, 4 / k.groups, 3, 3}).realize();
    Tensor y = x.conv2d(w, std::nullopt, k.stride, 1, k.dilation, k.groups);
    Tensor g = Tensor::rand(y.shape()).realize();
    Tensor gx = Tensor(y * g).sum().gradient({x})[0];
    size_t window = size_t(2 * 4 * y.shape()[2] * y.shape()[3] * 9);
    auto largest = [&] {
      size_t n = 0;
      for (auto& it : create_schedule(std::vector<UOpRef>{gx.uop()}).items)
        for (auto& b : it.bufs) n = std::max(n, b->size());
      return n;
    };
    CHECK(largest() < window);
    if (k.groups > 1) continue;
    ScopedEnv off("CONV_INPUT_GRAD", "0");  // autograd's graph as written: the window gradient is a buffer
    CHECK(largest() == window);
  }
  // float16: the sums run in float32 between casts; the same rule, the same values as autograd's graph as written
  Tensor x = Tensor::rand({2, 4, 9, 9}).cast(dtypes::float16).realize().requires_grad_();
  Tensor w = Tensor::rand({2, 4, 3, 3}).cast(dtypes::float16).realize();
  Tensor g = Tensor::rand({2, 2, 9, 9}).cast(dtypes::float16).realize();
  auto grad_x = [&] { return Tensor(x.conv2d(w, std::nullopt, 1, 1) * g).sum().gradient({x})[0]; };
  Tensor gx = grad_x();
  size_t largest = 0;
  for (auto& it : create_schedule(std::vector<UOpRef>{gx.uop()}).items)
    for (auto& b : it.bufs) largest = std::max(largest, b->size());
  CHECK(largest < size_t(2 * 4 * 81 * 9));
  auto with_rule = gx.cast(dtypes::float32).to_vector<float>();
  ScopedEnv off("CONV_INPUT_GRAD", "0");
  auto as_written = grad_x().cast(dtypes::float32).to_vector<float>();
  REQUIRE(with_rule.size() == as_written.size());
  for (size_t i = 0; i < with_rule.size(); i++) CHECK(with_rule[i] == doctest::Approx(as_written[i]).epsilon(2e-3));
}

// ---------------------------------------------------------------- edges, as torch (issue 24)

namespace {
// d(sum f(x))/dx at the points `xs`.
template <class F>
std::vector<float> grad_at(const std::vector<float>& xs, F&& f) {
  auto x = Tensor::from_vector(xs).requires_grad_();
  Tensor(f(x)).sum().backward();
  return x.grad().to_vector<float>();
}
}  // namespace

TEST_CASE("relu's gradient at exactly 0 is 0, as torch") {
  CHECK(grad_at({-1, 0, 2}, [](const Tensor& x) { return x.relu(); }) == std::vector<float>{0, 0, 1});
  CHECK(grad_at({0, 7}, [](const Tensor& x) { return x.relu6(); }) == std::vector<float>{0, 0});
}

TEST_CASE("relu is max(x, 0): NaN stays NaN (torch); the constant takes the tie, two tensors split it") {
  const float inf = INFINITY, nan = NAN;
  auto x = Tensor::from_vector(std::vector<float>{nan, -1, -0.0f, 0, 2, inf, -inf}).requires_grad_();
  Tensor r = x.relu();
  CHECK(r.uop()->op == Ops::MAX);  // one op in the forward kernel, as before issue 16
  auto v = r.to_vector<float>();
  CHECK(std::isnan(v[0]));
  CHECK(std::vector<float>(v.begin() + 1, v.end()) == std::vector<float>{0, 0, 0, 2, inf, 0});
  r.sum().backward();
  auto g = x.grad().to_vector<float>();  // [x > 0]: 0 at +-0 (torch's relu); at NaN 0 (torch: 1)
  CHECK(g == std::vector<float>{0, 0, 0, 0, 1, 1, 0});
  // a threshold on either side; clamp_min keeps torch's clamp gradient (1 at the bound)
  CHECK(grad_at({0.5f, 1, 2}, [](const Tensor& t) { return Tensor(1.0).maximum(t); }) == std::vector<float>{0, 0, 1});
  CHECK(grad_at({0.5f, 1, 2}, [](const Tensor& t) { return t.clamp_min(1); }) == std::vector<float>{0, 1, 1});
  auto a = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad_();
  Tensor(a.maximum(Tensor::from_vector(std::vector<float>{2, 2, 2}))).sum().backward();
  CHECK(a.grad().to_vector<float>() == std::vector<float>{0, 0.5f, 1});
}

TEST_CASE("relu and sigmoid MLPs launch as many kernels as before issue 16 (forward; forward and backward)") {
  auto count = [](std::vector<Tensor*> ts) {
    size_t b = kernels_run();
    Tensor::realize_all(ts);
    return kernels_run() - b;
  };
  // main before issue 16 (0ab4f7d): relu {3, 7, 2, 1}, sigmoid {3, 8, 3, 1}
  for (bool sig : {false, true}) {
    CAPTURE(sig);
    Tensor x = Tensor::rand({64, 96}), w1 = Tensor::rand({96, 48}) - 0.5, b1 = Tensor::rand({48}),
           w2 = Tensor::rand({48, 10}) - 0.5;
    realize(x, w1, b1, w2);
    w1.requires_grad_(), b1.requires_grad_(), w2.requires_grad_();
    auto act = [sig](const Tensor& t) { return sig ? t.sigmoid() : t.relu(); };
    auto mlp = [&] { return act(Tensor(act(Tensor(x.matmul(w1) + b1)).matmul(w2))); };
    Tensor y = mlp();
    CHECK(count({&y}) == 3);
    Tensor loss = mlp().sum();
    loss.backward();
    Tensor g1 = w1.grad(), gb = b1.grad(), g2 = w2.grad();
    CHECK(count({&loss, &g1, &gb, &g2}) == (sig ? 8u : 7u));
    Tensor nb = act(x.matmul(w1)).matmul(w2);  // the activation of a product broadcast into the next product
    CHECK(count({&nb}) == (sig ? 3u : 2u));
    Tensor alone = act(x);
    CHECK(count({&alone}) == 1);
  }
}

TEST_CASE("sigmoid's rule gives x s (1 - s); a node inside a hand-written sigmoid asked for keeps its own gradient") {
  auto x = Tensor::from_vector(std::vector<float>{0, 1}).requires_grad_();
  Tensor t = (-x).exp(), s = 1.0 / (1.0 + t);
  auto g = s.sum().gradient({t, x});
  auto gt = g[0].to_vector<float>(), gx = g[1].to_vector<float>();
  CHECK(gt[0] == doctest::Approx(-0.25).epsilon(1e-6));  // d/dt 1 / (1 + t) = -1 / (1 + t)^2
  CHECK(gt[1] == doctest::Approx(-1 / std::pow(1 + std::exp(-1.0), 2)).epsilon(1e-6));
  CHECK(gx[0] == doctest::Approx(0.25).epsilon(1e-6));
  CHECK(gx[1] == doctest::Approx(std::exp(-1.0) / std::pow(1 + std::exp(-1.0), 2)).epsilon(1e-6));
  auto e = grad_at({-100, -60, 60}, [](const Tensor& v) { return v.sigmoid(); });  // s (1 - s): 0 where s or 1 - s is
  CHECK(e[0] == 0);
  CHECK(e[1] == doctest::Approx(std::exp(-60.0)).epsilon(1e-6));  // where 1 - s rounds to 1: s, not an underflow
  CHECK(e[2] == 0);
}

TEST_CASE("tanh and sigmoid gradients stay finite at large |x|") {
  auto t = grad_at({-100, -20, 0, 20, 100}, [](const Tensor& x) { return x.tanh(); });
  std::vector<float> want{0, 0, 1, 0, 0};
  for (size_t i = 0; i < 5; i++) CHECK(t[i] == doctest::Approx(want[i]).epsilon(1e-6));  // was NaN at -100
  auto s = grad_at({-1000, 0, 1000}, [](const Tensor& x) { return x.sigmoid(); });
  CHECK(s == std::vector<float>{0, 0.25f, 0});
  auto m = grad_at({-200, 200}, [](const Tensor& x) { return x.silu(); });
  CHECK(m[0] == doctest::Approx(0.0));
  CHECK(m[1] == doctest::Approx(1.0));
}

TEST_CASE("pow at its edges: torch's values and gradients") {
  const float inf = INFINITY;
  // (-inf) ** 0.3 = inf, (-inf) ** -0.3 = 0 (C's pow), (-8) ** (1/3) = NaN
  auto v = Tensor::from_vector(std::vector<float>{-inf, -inf, -8}).pow(Tensor::from_vector(std::vector<float>{0.3f, -0.3f, 1.0f / 3}));
  auto vv = v.to_vector<float>();
  CHECK(vv[0] == inf);
  CHECK(vv[1] == 0);
  CHECK(std::isnan(vv[2]));
  // base gradient y x^(y-1): zero exponent 0, zero base with y = 2 is 0, with y = 0.5 inf, negative base
  auto x = Tensor::from_vector(std::vector<float>{0, 0, 0, -2, 3}).requires_grad_();
  auto y = Tensor::from_vector(std::vector<float>{0, 2, 0.5f, 3, 0}).requires_grad_();
  Tensor(x.pow(y)).sum().backward();
  auto gx = x.grad().to_vector<float>(), gy = y.grad().to_vector<float>();
  CHECK(gx[0] == 0);
  CHECK(gx[1] == 0);
  CHECK(gx[2] == inf);
  CHECK(gx[3] == doctest::Approx(12));
  CHECK(gx[4] == 0);
  // exponent gradient x^y ln x: 0 where x == 0 and y >= 0, NaN for a negative base (torch), ln 3 at 3^0
  CHECK(gy[0] == 0);
  CHECK(gy[1] == 0);
  CHECK(gy[2] == 0);
  CHECK(std::isnan(gy[3]));
  CHECK(gy[4] == doctest::Approx(std::log(3.0)));
}

TEST_CASE("prod's gradient is the product of the others, exact at zeros (torch's values)") {
  auto grad_of = [](std::vector<float> v) {
    auto x = Tensor::from_vector(v).requires_grad_();
    x.prod().backward();
    return x.grad().to_vector<float>();
  };
  CHECK(grad_of({2, 3, 4}) == std::vector<float>{12, 8, 6});
  CHECK(grad_of({2, 0, 3}) == std::vector<float>{0, 6, 0});  // torch.prod backward: the zero gets 2*3
  CHECK(grad_of({0, 0, 3}) == std::vector<float>{0, 0, 0});
  // along an axis, keepdim, rows with and without zeros
  auto x = Tensor::from_vector(std::vector<float>{1, 0, 5, 2, 3, 4}, {2, 3}).requires_grad_();
  Tensor(x.prod(std::vector<int64_t>{1}, true) * Tensor::from_vector(std::vector<float>{1, 10}, {2, 1})).sum().backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 5, 0, 120, 80, 60});
}

TEST_CASE("a copy to another device passes the gradient back to the source's device") {
  std::string here = default_device(), there = here == "CPU" ? "CL" : "CPU";
  auto x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, here).requires_grad_();
  Tensor y = x.to(there);
  Tensor(y * y * 3.0f).sum().backward();
  CHECK(get_device(x.grad().device()).name() == get_device(x.device()).name());
  CHECK(x.grad().to_vector<float>() == std::vector<float>{6, 12, 18});
}

TEST_CASE("one weight in two stacked convolutions gets the sum of both uses' gradients") {
  // conv(relu(conv(x, w)), w) against the same network with two copies of w: d/dw = d/dw1 + d/dw2
  for (int64_t c : {3, 16}) {  // few input channels (gradient of the forward graph) and many (channels-last)
    CAPTURE(c);
    Tensor x = Tensor::rand({2, c, 6, 6}).realize();
    Tensor w0 = Tensor(Tensor::rand({c, c, 3, 3}) - 0.5f).realize();
    auto w = Tensor(w0 * 1.0f).contiguous().realize().requires_grad_();
    x.conv2d(w, std::nullopt, 1, 1).relu().conv2d(w, std::nullopt, 1, 1).sum().backward();
    auto w1 = Tensor(w0 * 1.0f).contiguous().realize().requires_grad_(), w2 = Tensor(w0 * 1.0f).contiguous().realize().requires_grad_();
    x.conv2d(w1, std::nullopt, 1, 1).relu().conv2d(w2, std::nullopt, 1, 1).sum().backward();
    auto g = w.grad().to_vector<float>(), g1 = w1.grad().to_vector<float>(), g2 = w2.grad().to_vector<float>();
    // float32 sums in another order: the tolerance is relative to the gradient's scale (single values cancel)
    float scale = 0;
    for (float v : g) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < g.size(); i++) CHECK(g[i] == doctest::Approx(g1[i] + g2[i]).epsilon(1e-5).scale(scale));
  }
}
