// Multi-device tensors: logical CPU devices, shard / shard_ / shard_like, every op family on sharded and
// replicated tensors against the same ops on one device (forward and backward), ALLREDUCE (ring and naive;
// sum, max, mean), direct copies between host-memory devices, and bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "scoped_env.hpp"
#include "test_util.hpp"
#include "tg/device.hpp"
#include "tg/dist.hpp"
#include "tg/multi.hpp"
#include "tg/tg.hpp"
#include "../examples/beautiful_mnist_model.hpp"

using namespace tg;
using tg::test::error_of;

namespace {

const std::vector<std::string> D2{"CPU:0", "CPU:1"};
const std::vector<std::string> D4{"CPU:0", "CPU:1", "CPU:2", "CPU:3"};

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Small integers as floats: every sum, product and max below is exact in float32, whatever the order.
Tensor ints(const Shape& s, int seed) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[size_t(i)] = float(((i * 7 + seed * 13) % 11) - 5);
  return Tensor::from_vector(v, s);
}

// A leaf of its own: a new buffer with x's values (two realised clones of one tensor share their node, and so
// their gradients).
Tensor fresh(const Tensor& x) { return Tensor::from_vector(x.to_vector<float>(), x.shape()); }

// Element by element: exact (tol 0) or within tol relative to 1 + |want|.
void close_to(const std::vector<float>& g, const std::vector<float>& w, double tol) {
  REQUIRE(g.size() == w.size());
  if (tol == 0) {
    CHECK(g == w);
    return;
  }
  for (size_t i = 0; i < g.size(); i++) CHECK(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])));
}

// f on x sharded (or replicated: axis absent) over devs gives what it gives on one device, forward and backward:
// the value, and the gradient of sum(f(x) * c) with respect to x for fixed weights c (small integers, so the sums
// stay exact). f's second argument lays out any other operand the same way (sharded on `ax`, or replicated) or
// leaves it on one device. `grad = false` for an f that is not differentiable (an integer cast).
using Lay = std::function<Tensor(const Tensor&, std::optional<int>)>;
void same(const std::function<Tensor(const Tensor&, const Lay&)>& f, const Tensor& x, const std::vector<std::string>& devs,
          std::optional<int> axis, double tol = 0, bool grad = true) {
  CAPTURE(axis.value_or(-1));
  Lay one = [](const Tensor& t, std::optional<int>) { return t; };
  Lay many = [&](const Tensor& t, std::optional<int> a) { return t.shard(devs, a); };
  Tensor x1 = fresh(x), x2 = fresh(x);
  x2.shard_(devs, axis);
  if (grad) x1.requires_grad_(), x2.requires_grad_();
  Tensor want = f(x1, one), got = f(x2, many);
  CHECK(got.is_multi());
  CHECK(got.shape() == want.shape());
  close_to(got.to_vector<float>(), want.to_vector<float>(), tol);
  if (!grad) return;
  Tensor c = ints(want.shape(), 17) * 0.5;
  (want * c).sum().backward();
  (got * c.shard(devs)).sum().backward();
  CHECK(x2.grad().is_multi());
  CHECK(x2.grad().shape() == x.shape());
  close_to(x2.grad().to_vector<float>(), x1.grad().to_vector<float>(), tol);
}
void same(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const std::vector<std::string>& devs,
          std::optional<int> axis, double tol = 0, bool grad = true) {
  same([&](const Tensor& t, const Lay&) { return f(t); }, x, devs, axis, tol, grad);
}

}  // namespace

TEST_CASE("logical CPU devices: own allocators, DEVICE=CPU:1, copies between them without a host bounce") {
  CHECK(get_device("CPU:1").name() == "CPU:1");
  CHECK(&get_device("CPU:1").allocator() != &get_device("CPU").allocator());
  CHECK(get_device("CPU:0").name() == "CPU");
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4});
  size_t staged = copies_staged();
  Tensor b = (a * 2).to("CPU:1");
  Tensor c = (b + 1).to("CPU:2");
  CHECK(c.device() == "CPU:2");
  CHECK(c.to_vector<float>() == std::vector<float>{3, 5, 7, 9});
  CHECK(copies_staged() == staged);  // memcpy between the two host-memory allocators
  {
    ScopedEnv e("DEVICE", "CPU:1");
    CHECK(default_device() == "CPU:1");
  }
}

TEST_CASE("shard: parts on each device, shape and device names, shard_ and shard_like") {
  Tensor x = ints({4, 6}, 1);
  Tensor s = x.shard(D2, 0);
  CHECK(s.is_multi());
  CHECK(s.device() == "CPU,CPU:1");
  CHECK(s.devices() == std::vector<std::string>{"CPU", "CPU:1"});
  CHECK(s.shape() == Shape{4, 6});
  CHECK(s.shard_axis() == 0);
  CHECK(s.to_vector<float>() == x.to_vector<float>());
  CHECK(s.to("CPU:1").device() == "CPU:1");
  CHECK(s.to("CPU:1").to_vector<float>() == x.to_vector<float>());
  Tensor r = x.shard(D2);
  CHECK(!r.shard_axis());
  CHECK(r.to_vector<float>() == x.to_vector<float>());
  Tensor e = Tensor::empty({2, 3}, dtypes::float32, "CPU,CPU:1");  // a buffer on each device
  CHECK(e.is_multi());
  CHECK(Tensor::from_vector(std::vector<float>{1, 2}, {2}, "CPU:0,CPU:2").to("CPU:2").to_vector<float>() == std::vector<float>{1, 2});
  CHECK(Tensor::full({2}, 3.0, dtypes::float32, "CPU,CPU:1").contiguous().to("CPU:1").to_vector<float>() == std::vector<float>{3, 3});
  Tensor y = ints({4, 6}, 2);
  Tensor yl = y.shard_like(s);
  CHECK(yl.shard_axis() == 0);
  CHECK(yl.device() == s.device());
  CHECK((s * 2).permute({1, 0}).shard_axis() == 1);  // a computed value: its layout once lowered
  CHECK(!s.sum(0).shard_axis());                      // summed across the split axis: replicated
  Tensor z = ints({4, 6}, 1);
  z.shard_(D2, -1);
  CHECK(z.shard_axis() == 1);
  CHECK(z.is_multi());  // every copy of the handle sees it
  CHECK(z.to_vector<float>() == ints({4, 6}, 1).to_vector<float>());
}

TEST_CASE("elementwise ops on sharded and replicated tensors, mixed with constants and each other") {
  Tensor x = ints({4, 8}, 3), y = ints({4, 8}, 4);
  for (std::optional<int> ax : {std::optional<int>(), std::optional<int>(0), std::optional<int>(1)}) {
    same([](const Tensor& t) { return (t * 2 + 1).relu() - t.exp2().log2(); }, x, D2, ax);
    same([&](const Tensor& t, const Lay& l) { return t.maximum(l(y, ax)) * l(y, ax); }, x, D2, ax);
    same([&](const Tensor& t, const Lay& l) { return (t < 0).where(t, l(y, std::nullopt)); }, x, D2, ax);  // replicated
    same([&](const Tensor& t, const Lay& l) { return t + l(y, 1); }, x, D2, ax);  // another axis: resharded
    same([](const Tensor& t) { return t.cast(dtypes::int32).cast(dtypes::float32) / 2; }, x, D2, ax, 0, false);
  }
}

TEST_CASE("reductions along and across the sharded axis (sum, max, mean, min)") {
  Tensor x = ints({4, 6, 2}, 5);
  for (int ax : {0, 1}) {
    same([](const Tensor& t) { return t.sum(); }, x, D2, ax);
    same([](const Tensor& t) { return t.sum(0); }, x, D2, ax);
    same([](const Tensor& t) { return t.sum(1, true); }, x, D2, ax);
    same([](const Tensor& t) { return t.max(0); }, x, D2, ax);
    same([](const Tensor& t) { return t.min(1); }, x, D2, ax);
    same([](const Tensor& t) { return t.mean({0, 2}); }, x, D2, ax);
    same([](const Tensor& t) { return t.softmax(0); }, x * 0.25, D2, ax, 1e-6);
  }
  same([](const Tensor& t) { return t.sum(1); }, x, D4, 0);
}

TEST_CASE("movement ops on a sharded tensor: reshape, permute, expand, pad, shrink, flip") {
  Tensor x = ints({4, 6}, 6);
  for (int ax : {0, 1}) {
    same([](const Tensor& t) { return t.reshape({2, 2, 6}); }, x, D2, ax);
    same([](const Tensor& t) { return t.reshape({24}); }, x, D2, ax);
    same([](const Tensor& t) { return t.reshape({6, 4}); }, x, D2, ax);  // moves data across shards
    same([](const Tensor& t) { return t.permute({1, 0}); }, x, D2, ax);
    same([](const Tensor& t) { return t.reshape({4, 1, 6}).expand({4, 3, 6}); }, x, D2, ax);
    same([](const Tensor& t) { return t.pad({{1, 2}, {0, 1}}); }, x, D2, ax);
    same([](const Tensor& t) { return t.shrink({{1, 3}, {0, 6}}); }, x, D2, ax);
    same([](const Tensor& t) { return t.shrink({{0, 4}, {2, 5}}); }, x, D2, ax);
    same([](const Tensor& t) { return t.flip(std::vector<int64_t>{0}); }, x, D2, ax);
    same([](const Tensor& t) { return t.flip(std::vector<int64_t>{1}); }, x, D2, ax);
  }
}

TEST_CASE("matmul with either operand sharded, forward and backward") {
  Tensor a = ints({4, 6}, 7), b = ints({6, 8}, 8), c = ints({4, 8}, 18);
  Tensor a1 = fresh(a).requires_grad_(), b1 = fresh(b).requires_grad_();
  Tensor want = a1.matmul(b1);
  (want * c).sum().backward();
  std::vector<std::pair<std::optional<int>, std::optional<int>>> cases = {
      {0, std::nullopt}, {1, std::nullopt}, {std::nullopt, 0}, {std::nullopt, 1}, {0, 1}, {1, 0}, {0, 0}};
  for (const auto& layout : cases) {
    const std::optional<int> ia = layout.first, ib = layout.second;
    CAPTURE(ia.value_or(-1));
    CAPTURE(ib.value_or(-1));
    Tensor a2 = fresh(a), b2 = fresh(b);
    a2.shard_(D2, ia).requires_grad_(), b2.shard_(D2, ib).requires_grad_();
    Tensor got = a2.matmul(b2);
    CHECK(got.to_vector<float>() == want.to_vector<float>());
    (got * c.shard(D2)).sum().backward();
    CHECK(a2.grad().to_vector<float>() == a1.grad().to_vector<float>());
    CHECK(b2.grad().to_vector<float>() == b1.grad().to_vector<float>());
  }
}

TEST_CASE("to() between layouts: sharded, replicated, another axis, one device") {
  Tensor x = ints({4, 8}, 9);
  Tensor s0 = x.shard(D2, 0);
  CHECK(s0.shard(D2, 1).to_vector<float>() == x.to_vector<float>());
  CHECK(s0.shard(D2, 1).shard_axis() == 1);
  CHECK(s0.to("CPU,CPU:1").shard_axis() == 0);  // same devices: unchanged
  Tensor rep = x.to("CPU:0,CPU:1");
  CHECK(rep.is_multi());
  CHECK(!rep.shard_axis());
  CHECK((rep + s0).to("CPU:3").to_vector<float>() == (x * 2).to_vector<float>());
  CHECK(s0.shard(D4, 1).to_vector<float>() == x.to_vector<float>());
  // backward: the gradient goes back through each change of layout to the leaf's own layout
  for (std::optional<int> ax : {std::optional<int>(0), std::optional<int>(1), std::optional<int>()}) {
    same([](const Tensor& t, const Lay& l) { return l(t, 1) * 3; }, x, D2, ax);             // to axis 1
    same([](const Tensor& t, const Lay& l) { return l(t, std::nullopt) - 1; }, x, D2, ax);  // replicated
    same([](const Tensor& t, const Lay& l) { return l(t, 0).exp2(); }, x * 0.125, D2, ax, 1e-6);  // to axis 0
  }
  Tensor c = ints({4, 8}, 19);
  Tensor x1 = fresh(x).requires_grad_();
  (x1.to("CPU:3") * c.to("CPU:3")).sum().backward();
  for (std::optional<int> ax : {std::optional<int>(0), std::optional<int>(1), std::optional<int>()}) {
    CAPTURE(ax.value_or(-1));
    Tensor x2 = fresh(x);
    x2.shard_(D2, ax).requires_grad_();
    Tensor one = x2.to("CPU:3");  // gathered onto one device
    CHECK(!one.is_multi());
    (one * c.to("CPU:3")).sum().backward();
    CHECK(x2.grad().is_multi());
    CHECK(x2.grad().to_vector<float>() == x1.grad().to_vector<float>());
  }
}

TEST_CASE("gradients through sharded ops match one device's") {
  Tensor xv = ints({4, 6}, 10) * 0.5, wv = ints({6, 3}, 11) * 0.25;
  auto loss = [](const Tensor& x, const Tensor& w) {
    return ((x.matmul(w).relu() * 2).sum(1) + x.pad({{0, 0}, {1, 1}}).max(1)).mean();
  };
  Tensor x1 = Tensor(xv).contiguous().realize().requires_grad_(), w1 = Tensor(wv).contiguous().realize().requires_grad_();
  loss(x1, w1).backward();
  for (std::optional<int> ax : {std::optional<int>(0), std::optional<int>(1), std::optional<int>()}) {
    CAPTURE(ax.value_or(-1));
    Tensor x2 = Tensor(xv).contiguous().realize(), w2 = Tensor(wv).contiguous().realize();
    x2.shard_(D2, ax).requires_grad_();
    w2.shard_(D2).requires_grad_();
    Tensor l = loss(x2, w2);
    CHECK(l.is_multi());
    l.backward();
    CHECK(x2.grad().shape() == x1.grad().shape());
    CHECK(x2.grad().to_vector<float>() == x1.grad().to_vector<float>());
    CHECK(w2.grad().to_vector<float>() == w1.grad().to_vector<float>());
  }
  // through shard itself: the gradient of one-device tensors used sharded and replicated (the replicas' gradient
  // counted once, not once per device)
  Tensor x3 = Tensor(xv).contiguous().realize().requires_grad_(), w3 = Tensor(wv).contiguous().realize().requires_grad_();
  loss(x3.shard(D2, 0), w3.shard(D2)).backward();
  CHECK(x3.grad().device() == "CPU");
  CHECK(x3.grad().to_vector<float>() == x1.grad().to_vector<float>());
  CHECK(w3.grad().device() == "CPU");
  CHECK(w3.grad().to_vector<float>() == w1.grad().to_vector<float>());
}

TEST_CASE("ALLREDUCE: ring and naive give every device the same values (sum, max, mean)") {
  Tensor x = ints({8, 5, 3}, 12);
  for (const char* algo : {"ring", "naive"}) {
    ScopedEnv e("ALLREDUCE", algo);
    CAPTURE(algo);
    for (auto& devs : {D2, std::vector<std::string>{"CPU:0", "CPU:1", "CPU:2"}, D4}) {
      if (8 % devs.size()) continue;
      size_t before = allreduces_lowered();
      Tensor s = x.shard(devs, 0);
      Tensor sum = s.sum(0), mx = s.max(0), mean = s.mean(0);
      CHECK(sum.to_vector<float>() == x.sum(0).to_vector<float>());
      CHECK(mx.to_vector<float>() == x.max(0).to_vector<float>());
      CHECK(mean.to_vector<float>() == x.mean(0).to_vector<float>());
      CHECK(allreduces_lowered() - before == 3);
      for (auto& d : devs) CHECK(sum.to(d).to_vector<float>() == x.sum(0).to_vector<float>());  // every device's copy
    }
  }
}

TEST_CASE("ALLREDUCE's copies: ring passes 1/n chunks device to device, naive copies every part to every device") {
  const int64_t n = 4, len = 1024;
  Tensor x = ints({n * 2, len}, 16).shard(D4, 0).realize();
  auto copies = [&](const char* algo) {
    ScopedEnv e("ALLREDUCE", algo);
    Schedule s = create_schedule(std::vector<UOpRef>{x.sum(0).uop()});
    std::vector<size_t> bytes;
    for (auto& it : s.items)
      if (it.kind == ScheduleItem::Kind::Copy) {
        CHECK(it.bufs[0]->device() != it.bufs[1]->device());
        bytes.push_back(it.bufs[0]->nbytes());
      }
    return bytes;
  };
  std::vector<size_t> ring = copies("ring"), naive = copies("naive");
  CHECK(ring.size() == size_t(2 * n * (n - 1)));  // reduce-scatter and all-gather: n - 1 hops of each of n chunks
  for (size_t b : ring) CHECK(b == size_t(len / n) * sizeof(float));
  CHECK(naive.size() == size_t(n * (n - 1)));
  for (size_t b : naive) CHECK(b == size_t(len) * sizeof(float));
}

TEST_CASE("an optimizer step on replicated weights with a sharded batch keeps the devices' copies equal") {
  Tensor w = ints({6, 4}, 13) * 0.1;
  w = w.contiguous().realize();
  w.shard_(D2).requires_grad_();
  nn::optim::SGD opt({w}, 0.5);
  Tensor x = (ints({8, 6}, 14) * 0.1).shard(D2, 0);
  for (int step = 0; step < 2; step++) {
    opt.zero_grad();
    x.matmul(w).square().mean().backward();
    opt.step();
  }
  std::vector<float> a = w.to("CPU").to_vector<float>(), b = w.to("CPU:1").to_vector<float>();
  CHECK(a == b);
}

TEST_CASE("optimizer steps on sharded weights realise their updates: no 'schedule_step() called again' warning") {
  // The updates of a step on replicated weights are MULTI nodes of buffers once realised; the optimizer took them
  // for unrealised (it looked for one buffer) and warned on every later step (DEVICES=CPU:0,CPU:1 beautiful_mnist)
  Tensor w = (ints({6, 4}, 13) * 0.1).contiguous().realize();
  w.shard_(D2).requires_grad_();
  nn::optim::Adam opt({w}, 0.01);
  Tensor x = (ints({8, 6}, 14) * 0.1).shard(D2, 0);
  std::string err = test::stderr_of([&] {
    for (int step = 0; step < 3; step++) {
      opt.zero_grad();
      x.matmul(w).square().mean().backward();
      opt.step();
    }
  });
  CHECK(err.find("schedule_step") == std::string::npos);
  CHECK(w.to("CPU").to_vector<float>() == w.to("CPU:1").to_vector<float>());
}

TEST_CASE("bad input: axis out of range, size that does not split, unknown or repeated device, mixed devices") {
  Tensor x = ints({4, 6}, 15);
  CHECK(contains(error_of([&] { x.shard(D2, 2); }), "[shard] axis 2 is out of range for shape (4, 6)"));
  CHECK(contains(error_of([&] { x.shard(D2, -3); }), "out of range"));
  CHECK(contains(error_of([&] { x.shard(D4, 1); }), "(size 6) does not split evenly over 4 devices"));
  CHECK(contains(error_of([&] { x.shard({"CPU:0", "NOPE:1"}, 0); }), "unknown device 'NOPE:1'"));
  CHECK(contains(error_of([&] { x.shard({"CPU:1", "CPU:1"}, 0); }), "listed twice"));
  CHECK(contains(error_of([&] { x.shard({}, 0); }), "at least one device"));
  CHECK(contains(error_of([&] { (x.shard(D2, 0) + x.to("CPU:3")).realize(); }), "[multi] an operand on CPU:3"));
  CHECK(contains(error_of([&] { (x.shard(D2, 0) + x.shard({"CPU:2", "CPU:3"}, 0)).realize(); }), "different devices"));
}

namespace {
struct TrainRun {
  std::vector<float> losses, w;
  size_t step_allreduces = 0;
};
// A two-layer MLP trained by fused Adam on a fixed batch: on one device, or data parallel (batch sharded on axis 0,
// weights replicated) over devs.
TrainRun train_mlp(const std::vector<std::string>& devs, int steps) {
  Tensor w1 = (ints({12, 16}, 20) * 0.05).contiguous().realize(), b1 = (ints({16}, 21) * 0.01).contiguous().realize();
  Tensor w2 = (ints({16, 5}, 22) * 0.05).contiguous().realize();
  Tensor x = ints({16, 12}, 23) * 0.1, y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0});
  if (!devs.empty()) {
    for (Tensor* p : {&w1, &b1, &w2}) p->shard_(devs);
    x = x.shard(devs, 0), y = y.shard(devs, 0);
  }
  nn::optim::Adam opt({w1, b1, w2}, nn::optim::AdamOptions{.lr = 0.01, .fused = true});
  TrainRun r;
  for (int s = 0; s < steps; s++) {
    opt.zero_grad();
    // cross entropy (sparse_categorical_crossentropy would also allreduce its count of labels not ignored)
    Tensor loss = -((x.matmul(w1) + b1).relu().matmul(w2).log_softmax(1) * y.one_hot(5)).sum(1).mean();
    loss.backward();
    r.losses.push_back(loss.item<float>());
    size_t before = allreduces_lowered();
    opt.step();
    r.step_allreduces = allreduces_lowered() - before;
  }
  if (!devs.empty())
    for (auto& d : devs) CHECK(w1.to(d).to_vector<float>() == w1.to(devs[0]).to_vector<float>());  // bit-identical copies
  r.w = w1.to_vector<float>();
  return r;
}
}  // namespace

TEST_CASE("data parallel training: the losses of one device, one allreduce per optimizer step, equal weights") {
  TrainRun one = train_mlp({}, 4), two = train_mlp(D2, 4);
  REQUIRE(two.losses.size() == one.losses.size());
  for (size_t i = 0; i < one.losses.size(); i++) CHECK(two.losses[i] == doctest::Approx(one.losses[i]).epsilon(1e-5));
  for (size_t i = 0; i < one.w.size(); i++) CHECK(two.w[i] == doctest::Approx(one.w[i]).epsilon(1e-4));
  CHECK(two.step_allreduces == 1);  // the fused flat gradient, allreduced once
  CHECK(one.step_allreduces == 0);
}

TEST_CASE("a convolution over a sharded batch keeps the scheduler's layout rules on every device") {
  // The multi stage gives each device its rows of the weight's broadcast as SHRINK(EXPAND(w)); the layouts stage sees
  // the broadcast (pm_layout's shrink-of-expand rule) and computes each device's part channels-last, as one device
  // does: the same kernels per device as one device on its half of the batch (with 2x the kernels, NCHW was 3x
  // slower in beautiful_mnist's data-parallel step)
  Tensor x = Tensor::randn({4, 16, 9, 9}), w = Tensor::randn({8, 16, 3, 3});
  x.realize(), w.realize();
  auto count = [&](const Tensor& xi, const Tensor& wi) {
    Tensor y = xi.conv2d(wi, std::nullopt, 1, 1);
    size_t k0 = kernels_run();
    y.realize();
    return std::pair{kernels_run() - k0, y.to(default_device()).to_vector<float>()};
  };
  Tensor xs = x.shard(D2, 0), ws = w.shard(D2);
  xs.realize(), ws.realize();
  auto [k2, y2] = count(xs, ws);
  auto [k1, y1] = count(x.shrink({{0, 2}, {0, 16}, {0, 9}, {0, 9}}).contiguous().realize(), w);
  auto [kf, yf] = count(x, w);
  CHECK(k2 == 2 * k1);
  REQUIRE(y2.size() == yf.size());
  for (size_t i = 0; i < yf.size(); i++) CHECK(y2[i] == doctest::Approx(yf[i]).epsilon(1e-5));
  (void)y1;
}

TEST_CASE("beautiful_mnist's model (convolutions, batchnorm, pooling): data-parallel gradients match one device's") {
  auto grads = [](const std::vector<std::string>& devs) {
    Tensor::manual_seed(7);
    auto model = tg::examples::beautiful_mnist_model();
    Tensor x = Tensor::randn({8, 1, 28, 28}), y = Tensor::randint(0, 10, {8});
    if (!devs.empty()) {
      for (Tensor& p : model->parameters()) p.shard_(devs);
      for (Tensor& b : model->buffers()) b.shard_(devs);
      x = x.shard(devs, 0), y = y.shard(devs, 0);
    }
    for (Tensor& p : model->parameters()) p.requires_grad_();
    model->train(true);
    Tensor loss = (*model)(x).sparse_categorical_crossentropy(y);
    loss.backward();
    std::vector<std::vector<float>> out{{loss.item<float>()}};
    for (Tensor& p : model->parameters()) out.push_back(p.grad().to_vector<float>());
    for (Tensor& b : model->buffers()) out.push_back(b.to_vector<float>());  // running statistics after the step
    return out;
  };
  auto one = grads({}), two = grads(D2);
  REQUIRE(one.size() == two.size());
  for (size_t k = 0; k < one.size(); k++) {
    CAPTURE(k);
    REQUIRE(one[k].size() == two[k].size());
    double scale = 0;
    for (float v : one[k]) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < one[k].size(); i++) CHECK(std::abs(one[k][i] - two[k][i]) <= 3e-5 * scale + 1e-7);  // float sums in another order
  }
}

// Under `mpirun -np 2` (test multi_mpi): each rank holds its share of a batch and a BatchNorm synchronised over the
// ranks (tg::dist::sync_batchnorm); compared with one BatchNorm on the whole batch, computed on every rank. With one
// rank (suite multi) the synchronised path runs with a hook that is the identity over one replica.
TEST_CASE("synchronised batchnorm over MPI ranks: the whole batch's statistics, gradients and running statistics") {
  const int world = dist::world_size(), rank = dist::rank();
  CAPTURE(rank);
  Tensor::manual_seed(11);  // the same values on every rank
  Tensor x = (Tensor::randn({6 * world, 3, 4, 5}) * 2 + 1).realize(), gy = Tensor::randn({6 * world, 3, 4, 5}).realize();
  struct Out {
    std::vector<float> y, gx, gw, gb, rm, rv;
  };
  auto run = [&](bool synced) {
    nn::BatchNorm bn(3);
    bn.weight->assign(Tensor::from_vector(std::vector<float>{0.5f, 1.5f, -1.f}, {3})).realize();
    bn.bias->assign(Tensor::from_vector(std::vector<float>{0.1f, 0.2f, -0.3f}, {3})).realize();
    if (synced && world > 1) dist::sync_batchnorm(bn);
    if (synced && world == 1) bn.sync_statistics([](const Tensor& s) { return s; }, 1);
    Tensor xi = (synced ? dist::rank_share(x) : x).clone().realize().requires_grad_();  // a leaf of its own
    Tensor y = bn(xi);
    (y * (synced ? dist::rank_share(gy) : gy)).sum().backward();
    std::vector<Tensor*> all{&y, bn.running_mean, bn.running_var};
    Tensor gx = xi.grad(), gw = bn.weight->grad(), gb = bn.bias->grad();
    all.insert(all.end(), {&gx, &gw, &gb});
    Tensor::realize_all(all);
    if (synced) {  // the ranks' parameter gradients summed (what allreduce_grads averages)
      dist::allreduce_(gw), dist::allreduce_(gb);
      CHECK(dist::replicas_equal({*bn.running_mean, *bn.running_var}));
    } else {  // this rank's rows of the whole batch's results
      y = dist::rank_share(y), gx = dist::rank_share(gx);
    }
    return Out{y.to_vector<float>(), gx.to_vector<float>(), gw.to_vector<float>(), gb.to_vector<float>(),
               bn.running_mean->to_vector<float>(), bn.running_var->to_vector<float>()};
  };
  Out one = run(false), ranks = run(true);
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
    CAPTURE(what);
    REQUIRE(a.size() == b.size());
    double scale = 0;
    for (float v : a) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < a.size(); i++) CHECK(std::abs(a[i] - b[i]) <= 2e-6 * scale);  // float sums in another order
  };
  close(one.y, ranks.y, "output");
  close(one.gx, ranks.gx, "input gradient");
  close(one.gw, ranks.gw, "weight gradient");
  close(one.gb, ranks.gb, "bias gradient");
  close(one.rm, ranks.rm, "running mean");
  close(one.rv, ranks.rv, "running variance");
}

TEST_CASE("bad input: BatchNorm::sync_statistics with no replicas; no kernel runs on DIST") {
  nn::BatchNorm bn(2);
  CHECK(contains(error_of([&] { bn.sync_statistics([](const Tensor& s) { return s; }, 0); }), "replicas >= 1, got 0"));
  CHECK(contains(error_of([&] { (Tensor::ones({4}).to("DIST") + 1).realize(); }), "[DIST]"));
}

TEST_CASE("CPU_DEVICE_THREADS: each logical CPU device launches on its own thread with its share of the cores") {
  const std::vector<std::string> devs{"CPU:6", "CPU:7"};  // opened here first: the variable is read when a device opens
  {
    ScopedEnv e("CPU_DEVICE_THREADS", "1");
    for (auto& d : devs) CHECK(get_device(d).threads() == 1);
  }
  CHECK(get_device("CPU:5").threads() == get_device("CPU").threads());  // opened without it: every thread
  // the devices' kernels run asynchronously; copies between them and host reads wait for them
  TrainRun one = train_mlp({}, 3), two = train_mlp(devs, 3);
  for (size_t i = 0; i < one.losses.size(); i++) CHECK(two.losses[i] == doctest::Approx(one.losses[i]).epsilon(1e-5));
  Tensor x = ints({64, 48}, 30), w = ints({48, 32}, 31);
  std::vector<float> want = x.matmul(w).relu().sum(0).to_vector<float>();
  CHECK(x.shard(devs, 0).matmul(w.shard(devs)).relu().sum(0).to("CPU").to_vector<float>() == want);  // small ints: exact
  CHECK(contains(error_of([&] {
                   ScopedEnv e("CPU_DEVICE_THREADS", "-1");
                   get_device("CPU:8");
                 }),
                 "CPU_DEVICE_THREADS"));
}

TEST_CASE("CPU_DEVICE_THREADS: copies between two queued devices are ordered with both devices' kernels") {
  // A copy is queued (CpuDevice::enqueue_copy): it must see the source's kernels before it, and the destination's
  // kernels before it must have read the old contents (the allocator reuses freed buffers in every round)
  const std::vector<std::string> devs{"CPU:9", "CPU:10"};
  ScopedEnv e("CPU_DEVICE_THREADS", "1");
  for (auto& d : devs) REQUIRE(get_device(d).threads() == 1);
  std::vector<float> a0(4096), b0(4096);
  for (size_t i = 0; i < a0.size(); i++) a0[i] = float(i % 7), b0[i] = float(i % 5);
  Tensor a = Tensor::from_vector(a0, {4096}, devs[0]), b = Tensor::from_vector(b0, {4096}, devs[1]);
  for (int it = 0; it < 12; it++) {
    Tensor na = (a + b.to(devs[0])).contiguous() * 0.5;  // small values halved: exact
    Tensor nb = (b - a.to(devs[1]) * 0.25).contiguous();
    Tensor::realize_all({&na, &nb});
    for (size_t i = 0; i < a0.size(); i++) {
      float x = (a0[i] + b0[i]) * 0.5f, y = b0[i] - a0[i] * 0.25f;
      a0[i] = x, b0[i] = y;
    }
    a = na, b = nb;
  }
  CHECK(a.to_vector<float>() == a0);
  CHECK(b.to_vector<float>() == b0);
}

TEST_CASE("dist::allreduce over MPI ranks: a lazy sum of every rank's values, its gradient, and TinyJit replays") {
  const int world = dist::world_size(), rank = dist::rank();
  CAPTURE(rank);
  // rank r holds (r + 1) * v: the sum over the ranks is v * world * (world + 1) / 2
  const float k = float(world * (world + 1) / 2);
  Tensor v = Tensor::from_vector(std::vector<float>{1, -2, 3, 0.5f}, {2, 2});
  Tensor x = (v * double(rank + 1)).contiguous().realize().requires_grad_();
  Tensor s = dist::allreduce(x * 3);
  (s * v).sum().backward();  // every rank's loss depends on every rank's x: d/dx = 3 * (sum over ranks of v)
  std::vector<float> sv = s.to_vector<float>(), gv = x.grad().to_vector<float>(), want = v.to_vector<float>();
  for (size_t i = 0; i < want.size(); i++) {
    CHECK(sv[i] == 3 * k * want[i]);  // small values: exact
    CHECK(gv[i] == 3 * float(world) * want[i]);
  }
  TinyJit f([](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {dist::allreduce(in[0] + 1).contiguous()}; });
  for (int call = 0; call < 4; call++) {  // captured on the 2nd call, replayed after: the collective runs each time
    Tensor in = Tensor::full({3}, double(call * 10 + rank)).contiguous().realize();
    float got = f({in})[0].to_vector<float>()[0];
    CHECK(got == float(world * (call * 10 + 1) + world * (world - 1) / 2));
  }
}

// Two OpenCL devices: PoCL exposes the CPU as several (POCL_DEVICES="pthread pthread"; test multi_cl sets it and
// runs this case with --no-skip). Each CL:N has its own context, so a copy between them goes through the host.
TEST_CASE("OpenCL devices CL:0 and CL:1: sharded ops, an allreduce across them and gradients match the CPU's" * doctest::skip()) {
  const std::vector<std::string> cl{"CL:0", "CL:1"};
  for (auto& d : cl) REQUIRE_MESSAGE(error_of([&] { get_device(d); }) == "", "needs two OpenCL devices: POCL_DEVICES=\"pthread pthread\"");
  Tensor x = ints({8, 12}, 40) * 0.5, w = ints({12, 6}, 41) * 0.25, c = ints({8, 6}, 42);
  auto f = [](const Tensor& xi, const Tensor& wi) { return xi.matmul(wi).relu() * 2 - xi.sum(1, true); };
  Tensor x1 = fresh(x).requires_grad_(), w1 = fresh(w).requires_grad_();
  Tensor y1 = f(x1, w1);
  (y1 * c).sum().backward();
  Tensor x2 = fresh(x), w2 = fresh(w);
  x2.shard_(cl, 0).requires_grad_(), w2.shard_(cl).requires_grad_();
  CHECK(x2.device() == "CL,CL:1");
  Tensor y2 = f(x2, w2);
  (y2 * c.shard(cl)).sum().backward();  // w's gradient: a sum across the sharded rows, allreduced over CL:0, CL:1
  CHECK(y2.to("CPU").to_vector<float>() == y1.to_vector<float>());  // small multiples of 1/8: exact
  CHECK(x2.grad().to("CPU").to_vector<float>() == x1.grad().to_vector<float>());
  CHECK(w2.grad().to("CPU").to_vector<float>() == w1.grad().to_vector<float>());
  CHECK(w2.grad().to("CL:1").to("CPU").to_vector<float>() == w2.grad().to("CL:0").to("CPU").to_vector<float>());
  Tensor s = x.shard(cl, 1).max(1);  // a max across the split axis
  CHECK(s.to("CPU").to_vector<float>() == x.max(1).to_vector<float>());
}
