// nn layers and optimisers against libtorch: ConvTranspose1d/2d/3d layers (forward, gradients, initialisation),
// SGD / Adam / AdamW (unfused and fused) against torch.optim over several steps from the same weights, and the
// main job's model (examples/beautiful_mnist_model.hpp): its gradients against libtorch in float64.
// (torch's headers bring glog's CHECK macro: the doctest macros are spelled DOCTEST_CHECK here.)
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <random>
#include <string>

#include "../../examples/beautiful_mnist_model.hpp"
#include "../scoped_env.hpp"
#include "tg/nn/nn.hpp"
#include "tg/nn/optim.hpp"

namespace {

torch::Tensor to_torch(const tg::Tensor& x) {
  std::vector<float> v = x.cast(tg::dtypes::float32).to_vector<float>();
  std::vector<int64_t> s(x.shape().begin(), x.shape().end());
  return torch::from_blob(v.data(), s, torch::kFloat).clone();
}
tg::Tensor to_tg(const torch::Tensor& x) {
  torch::Tensor c = x.detach().contiguous().to(torch::kFloat);
  return tg::Tensor::from_blob(c.data_ptr(), tg::Shape(c.sizes().begin(), c.sizes().end()), tg::dtypes::float32);
}
// max |a - b| / (atol + rtol*|b|) over the elements: <= 1 passes
double err_ratio(const tg::Tensor& a, const torch::Tensor& b, double rtol, double atol) {
  torch::Tensor ta = to_torch(a), tb = b.detach().to(torch::kFloat).contiguous();
  DOCTEST_REQUIRE(ta.sizes() == tb.sizes());
  return ((ta - tb).abs() / (atol + rtol * tb.abs())).max().item<double>();
}

struct ConvTCase {
  int dims;
  int64_t in, out;
  std::vector<int64_t> k, stride, pad, outpad, dil;
  int64_t groups;
  bool bias;
  std::vector<int64_t> xshape;
};

}  // namespace

TEST_CASE("ConvTranspose1d/2d/3d layers match torch's conv_transpose forward and gradients") {
  std::vector<ConvTCase> cases{
      {1, 4, 6, {3}, {2}, {1}, {1}, {1}, 2, true, {2, 4, 7}},
      {1, 3, 2, {4}, {1}, {0}, {0}, {2}, 1, false, {3, 3, 5}},
      {2, 3, 4, {3, 2}, {2, 1}, {1, 0}, {1, 0}, {1, 2}, 1, true, {2, 3, 5, 6}},
      {2, 4, 6, {3, 3}, {3, 3}, {0, 1}, {2, 0}, {1, 1}, 2, true, {1, 4, 4, 3}},
      {3, 2, 3, {2, 3, 2}, {2, 1, 2}, {0, 1, 1}, {1, 0, 0}, {1, 1, 1}, 1, true, {1, 2, 3, 4, 3}},
  };
  tg::Tensor::manual_seed(11);
  torch::manual_seed(11);
  for (auto& c : cases) {
    CAPTURE(c.dims);
    CAPTURE(c.in);
    std::shared_ptr<tg::nn::ConvTransposeNd> layer;
    if (c.dims == 1)
      layer = std::make_shared<tg::nn::ConvTranspose1d>(c.in, c.out, c.k[0], c.stride, c.pad, c.outpad, c.groups, c.bias, c.dil);
    else if (c.dims == 2)
      layer = std::make_shared<tg::nn::ConvTranspose2d>(c.in, c.out, c.k, c.stride, c.pad, c.outpad, c.groups, c.bias, c.dil);
    else
      layer = std::make_shared<tg::nn::ConvTranspose3d>(c.in, c.out, c.k, c.stride, c.pad, c.outpad, c.groups, c.bias, c.dil);
    tg::Shape ws{c.in, c.out / c.groups};
    ws.insert(ws.end(), c.k.begin(), c.k.end());
    DOCTEST_CHECK(layer->weight.shape() == ws);
    DOCTEST_CHECK((layer->bias != nullptr) == c.bias);

    torch::Tensor hx = torch::randn(c.xshape).requires_grad_();
    torch::Tensor hw = to_torch(layer->weight).requires_grad_();
    torch::Tensor hb = c.bias ? to_torch(*layer->bias).requires_grad_() : torch::Tensor();
    torch::Tensor hy = c.dims == 1   ? torch::conv_transpose1d(hx, hw, hb, c.stride, c.pad, c.outpad, c.groups, c.dil)
                       : c.dims == 2 ? torch::conv_transpose2d(hx, hw, hb, c.stride, c.pad, c.outpad, c.groups, c.dil)
                                     : torch::conv_transpose3d(hx, hw, hb, c.stride, c.pad, c.outpad, c.groups, c.dil);
    torch::Tensor seed = torch::randn(hy.sizes());
    std::vector<torch::Tensor> hin{hx, hw};
    if (c.bias) hin.push_back(hb);
    auto hg = torch::autograd::grad({hy}, hin, {seed});

    tg::Tensor tx = to_tg(hx).requires_grad_(), tseed = to_tg(seed);
    tg::Tensor ty = (*layer)(tx);
    std::vector<tg::Tensor> tin{tx, layer->weight};
    if (c.bias) tin.push_back(*layer->bias);
    auto tgr = ty.gradient(tin, &tseed);
    DOCTEST_CHECK(err_ratio(ty, hy, 1e-5, 1e-5) <= 1);
    for (size_t i = 0; i < tin.size(); i++) {
      CAPTURE(i);
      DOCTEST_CHECK(err_ratio(tgr[i], hg[i], 1e-5, 1e-5) <= 1);
    }
  }
}

TEST_CASE("ConvTranspose layers are initialised with torch's bounds (fan_in = out/groups * prod(kernel))") {
  tg::Tensor::manual_seed(5);
  torch::manual_seed(5);
  for (int64_t groups : {1, 2}) {
    tg::nn::ConvTranspose2d t(16, 256, {3, 2}, 1, 0, 0, groups);
    torch::nn::ConvTranspose2d h(torch::nn::ConvTranspose2dOptions(16, 256, {3, 2}).groups(groups));
    double bound = 1.0 / std::sqrt(double(256 / groups * 3 * 2));  // torch: kaiming_uniform(a=sqrt(5)) = 1/sqrt(fan_in)
    for (auto [tw, hw] : {std::pair{t.weight, h->weight}, std::pair{*t.bias, h->bias}}) {
      double tmax = to_torch(tw).abs().max().item<double>(), hmax = hw.abs().max().item<double>();
      CAPTURE(groups);
      CAPTURE(tw.numel());
      CAPTURE(bound);
      CAPTURE(tmax);
      CAPTURE(hmax);
      DOCTEST_CHECK(tmax <= bound);
      DOCTEST_CHECK(hmax <= bound);
      // both fill [-bound, bound]: the largest of >= 256 uniform draws is above 0.95 * bound (p > 1 - 2e-6)
      DOCTEST_CHECK(tmax > 0.95 * bound);
      DOCTEST_CHECK(hmax > 0.95 * bound);
      DOCTEST_CHECK(std::abs(to_torch(tw).mean().item<double>()) < 0.1 * bound);
    }
  }
}

namespace {

// A 2-layer MLP (5 -> 4 -> 3, relu) in both libraries from the same weights, trained for `steps` steps on one
// batch; returns the largest error ratio of tg's parameters against torch's after each step.
template <class MakeTg, class MakeTorch>
double train_both(MakeTg make_tg, MakeTorch make_torch, int steps = 5) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> hp{torch::randn({4, 5}) * 0.5, torch::randn({4}) * 0.1, torch::randn({3, 4}) * 0.5,
                                torch::randn({3}) * 0.1};
  for (auto& p : hp) p.requires_grad_();
  std::vector<tg::Tensor> tp;
  for (auto& p : hp) tp.push_back(to_tg(p).requires_grad_());
  torch::Tensor hx = torch::randn({8, 5}), hy = torch::tensor({0, 1, 2, 0, 1, 2, 2, 1}, torch::kLong);
  tg::Tensor tx = to_tg(hx), ty = tg::Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 0, 1, 2, 2, 1});
  auto topt = make_tg(tp);
  auto hopt = make_torch(hp);
  double worst = 0;
  for (int s = 0; s < steps; s++) {
    topt->zero_grad();
    tg::Tensor tl = tx.linear(tp[0], tp[1]).relu().linear(tp[2], tp[3]).sparse_categorical_crossentropy(ty);
    tl.backward();
    auto upd = topt->schedule_step();  // the loss realises with the update (after it, it would read the new weights)
    upd.push_back(tl);
    std::vector<tg::Tensor*> ptrs;
    for (auto& t : upd) ptrs.push_back(&t);
    tg::Tensor::realize_all(ptrs);
    hopt->zero_grad();
    torch::Tensor hl = torch::cross_entropy_loss(torch::linear(torch::relu(torch::linear(hx, hp[0], hp[1])), hp[2], hp[3]), hy);
    hl.backward();
    hopt->step();
    DOCTEST_CHECK(tl.item<float>() == doctest::Approx(hl.item<float>()).epsilon(1e-5));
    for (size_t i = 0; i < tp.size(); i++) worst = std::max(worst, err_ratio(tp[i], hp[i], 1e-5, 1e-6));
  }
  return worst;
}

}  // namespace

TEST_CASE("SGD (momentum, nesterov, weight decay) matches torch.optim.SGD over 5 steps, unfused and fused") {
  namespace to = torch::optim;
  for (bool fused : {false, true})
    for (bool nesterov : {false, true}) {
      CAPTURE(fused);
      CAPTURE(nesterov);
      double e = train_both(
          [&](std::vector<tg::Tensor> p) { return std::make_unique<tg::nn::optim::SGD>(p, 0.1, 0.9, 0.01, nesterov, false, fused); },
          [&](std::vector<torch::Tensor> p) {
            return std::make_unique<to::SGD>(p, to::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(nesterov));
          });
      DOCTEST_CHECK(e <= 1);
    }
  double plain = train_both([](std::vector<tg::Tensor> p) { return std::make_unique<tg::nn::optim::SGD>(p, 0.2); },
                            [](std::vector<torch::Tensor> p) { return std::make_unique<to::SGD>(p, to::SGDOptions(0.2)); });
  DOCTEST_CHECK(plain <= 1);
}

TEST_CASE("Adam and AdamW match torch.optim.Adam / AdamW over 5 steps, unfused and fused") {
  namespace to = torch::optim;
  for (bool fused : {false, true}) {
    CAPTURE(fused);
    double a = train_both([&](std::vector<tg::Tensor> p) { return tg::nn::optim::Adam(p, 0.01, 0.9, 0.999, 1e-8, fused); },
                          [](std::vector<torch::Tensor> p) { return std::make_unique<to::Adam>(p, to::AdamOptions(0.01)); });
    DOCTEST_CHECK(a <= 1);
    double w = train_both(
        [&](std::vector<tg::Tensor> p) { return tg::nn::optim::AdamW(p, 0.01, 0.8, 0.99, 1e-6, 0.1, fused); },
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<to::AdamW>(p, to::AdamWOptions(0.01).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.1));
        });
    DOCTEST_CHECK(w <= 1);
  }
}

// The main job's model: 4 convolutions (two of them channels-last on the CPU), 2 batch norms in training mode, max
// pools and a linear layer, with the cross-entropy loss. Its gradients are ill-conditioned where a relu or a pool
// decides near a tie, so libtorch's own float32 gradients are not an exact reference (they differ from float64 by
// up to 4e-4 in norm for the first layers); tg's direct convolutions (WINO=0) must be at least as close to float64
// as libtorch's float32 are (within twice their distance, or 2e-6 of the norm). With WINO=1 (all four by Winograd)
// the transforms' rounding (F(4x4, 5x5) from the points 0, +-1, +-2, +-1/2, F(4x4, 3x3) from 0, +-1, +-2) adds up
// to 8.9e-6 of the norm on the well-conditioned last layers (the second batch norm and the linear layer: 5.8-9.1x
// libtorch float32's distance there): twice that, 1.6e-5, is their floor.
TEST_CASE("beautiful_mnist's gradients are within twice libtorch float32's distance of libtorch's float64 ones (or Winograd's rounding)") {
  const int64_t batch = 64;
  std::mt19937 g(7);
  std::vector<float> xv(static_cast<size_t>(batch * 28 * 28));
  std::vector<int32_t> yv(static_cast<size_t>(batch));
  for (auto& v : xv) v = float(g() % 256);  // pixel values as the example feeds them
  for (auto& v : yv) v = int32_t(g() % 10);
  auto tg_grads = [&](const char* wino) {
    ScopedEnv e("WINO", wino);
    tg::Tensor::manual_seed(1337);
    auto model = tg::examples::beautiful_mnist_model();
    model->train(true);
    tg::Tensor loss = (*model)(tg::Tensor::from_vector(xv, {batch, 1, 28, 28}))
                          .sparse_categorical_crossentropy(tg::Tensor::from_vector(yv));
    loss.backward();
    return std::pair{loss.item<float>(), model->state_dict()};
  };
  auto [loss, state] = tg_grads("0");
  auto [loss_wino, state_wino] = tg_grads("1");

  torch::Tensor hx = torch::from_blob(xv.data(), {batch, 1, 28, 28}, torch::kFloat).clone();
  torch::Tensor hy = torch::from_blob(yv.data(), {batch}, torch::kInt).to(torch::kLong);
  auto torch_grads = [&](torch::ScalarType dt) {
    std::map<std::string, torch::Tensor> t;
    for (auto& [name, v] : state)
      t[name] = to_torch(v).to(dt).requires_grad_(name.find("running") == std::string::npos);
    auto bn = [&](const torch::Tensor& h, const std::string& n) {
      return torch::batch_norm(h, t[n + ".weight"], t[n + ".bias"], t[n + ".running_mean"], t[n + ".running_var"], true,
                               0.1, 1e-5, false);
    };
    torch::Tensor h = torch::relu(torch::conv2d(hx.to(dt), t["0.weight"], t["0.bias"]));
    h = torch::max_pool2d(bn(torch::relu(torch::conv2d(h, t["2.weight"], t["2.bias"])), "4"), 2);
    h = torch::relu(torch::conv2d(h, t["6.weight"], t["6.bias"]));
    h = torch::max_pool2d(bn(torch::relu(torch::conv2d(h, t["8.weight"], t["8.bias"])), "10"), 2);
    torch::Tensor l = torch::cross_entropy_loss(torch::linear(h.flatten(1), t["13.weight"], t["13.bias"]), hy);
    l.backward();
    std::map<std::string, torch::Tensor> grads{{"loss", l.detach().to(torch::kDouble)}};
    for (auto& [name, v] : t)
      if (v.requires_grad()) grads[name] = v.grad().to(torch::kDouble);
    return grads;
  };
  auto g32 = torch_grads(torch::kFloat), g64 = torch_grads(torch::kDouble);
  for (float l : {loss, loss_wino}) DOCTEST_CHECK(std::abs(l - g64["loss"].item<double>()) <= 2e-6 * g64["loss"].item<double>());
  for (auto* st : {&state, &state_wino}) {
    const double floor = st == &state ? 2e-6 : 1.6e-5;
    int checked = 0;
    for (auto& [name, v] : *st) {
      if (name.find("running") != std::string::npos || name.find("num_batches") != std::string::npos) continue;
      CAPTURE(name);
      CAPTURE(floor);
      DOCTEST_REQUIRE(v.has_grad());
      torch::Tensor ref = g64[name];
      double norm = ref.norm().item<double>();
      double err_tg = (to_torch(v.grad()).to(torch::kDouble) - ref).norm().item<double>() / norm;
      double err_torch = (g32[name] - ref).norm().item<double>() / norm;
      CAPTURE(err_tg);
      CAPTURE(err_torch);
      DOCTEST_CHECK(err_tg <= std::max(2 * err_torch, floor));
      checked++;
    }
    DOCTEST_CHECK(checked == 14);  // 4 convolutions, 2 batch norms and the linear layer, weight and bias each
  }
}
