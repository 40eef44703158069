// What a user embedding tg reaches for first (issue 23): the umbrella header, printing, compound assignment,
// operator[], from_vector with a braced list, max/min with indices, activation modules, optimiser classes.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "tg/tg.hpp"

using namespace tg;

namespace {
Tensor iota(const Shape& s, DType dt = dtypes::float32) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return Tensor::arange(0, double(n), 1, dt).reshape(s);
}
// The suffix to_string ends with: shape, dtype and the device the suite runs on (CPU, CL, ...).
std::string tail(const Tensor& t, const std::string& shape, const std::string& dtype) {
  return ", shape=" + shape + ", dtype=" + dtype + ", device=" + t.device() + ")";
}
}  // namespace

TEST_CASE("to_string prints values torch-like, with shape, dtype and device") {
  Tensor f = Tensor::from_vector({1.f, 2.f, 3.f, 4.f}, {2, 2});
  CHECK(to_string(f) == "tensor([[1., 2.],\n        [3., 4.]]" + tail(f, "(2, 2)", "float32"));
  Tensor g = Tensor::from_vector({0.5f, -1.25f, 3.f});
  CHECK(to_string(g) == "tensor([ 0.5000, -1.2500,  3.0000]" + tail(g, "(3,)", "float32"));
  Tensor sci = Tensor::from_vector({1e-5, 1.0});
  CHECK(to_string(sci) == "tensor([1.0000e-05, 1.0000e+00]" + tail(sci, "(2,)", "float64"));
  const float inf = std::numeric_limits<float>::infinity();
  Tensor special = Tensor::from_vector({std::nanf(""), inf, -inf, 1.f});
  CHECK(to_string(special) == "tensor([ nan,  inf, -inf,   1.]" + tail(special, "(4,)", "float32"));
  Tensor i = Tensor::from_vector<int32_t>({1, -20, 300});
  CHECK(to_string(i) == "tensor([  1, -20, 300]" + tail(i, "(3,)", "int32"));
  Tensor b = Tensor::from_vector({true, false});
  CHECK(to_string(b) == "tensor([ True, False]" + tail(b, "(2,)", "bool"));
  Tensor s = Tensor::full({}, 2.5);
  CHECK(to_string(s) == "tensor(2.5000" + tail(s, "()", "float32"));
  Tensor e = Tensor::zeros({0, 3});
  CHECK(to_string(e) == "tensor([]" + tail(e, "(0, 3)", "float32"));
  Tensor c = iota({2, 2, 2}, dtypes::int32);
  CHECK(to_string(c) == "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]]" +
                            tail(c, "(2, 2, 2)", "int32"));
  std::ostringstream os;
  os << f << (f + 1);  // an expression prints as its tensor
  CHECK(os.str() == to_string(f) + to_string(Tensor(f + 1)));
}

TEST_CASE("to_string summarises more than 1000 elements with the first and last 3 of each dim") {
  Tensor v = Tensor::arange(1001);
  CHECK(to_string(v) == "tensor([   0,    1,    2, ...,  998,  999, 1000]" + tail(v, "(1001,)", "int32"));
  Tensor m = iota({40, 30}, dtypes::int32);
  CHECK(to_string(m) ==
        "tensor([[   0,    1,    2, ...,   27,   28,   29],\n"
        "        [  30,   31,   32, ...,   57,   58,   59],\n"
        "        [  60,   61,   62, ...,   87,   88,   89],\n"
        "        ...,\n"
        "        [1110, 1111, 1112, ..., 1137, 1138, 1139],\n"
        "        [1140, 1141, 1142, ..., 1167, 1168, 1169],\n"
        "        [1170, 1171, 1172, ..., 1197, 1198, 1199]]" +
            tail(m, "(40, 30)", "int32"));
  Tensor small = iota({10, 100});  // exactly 1000 elements: printed in full
  CHECK(to_string(small).find("...") == std::string::npos);
}

TEST_CASE("compound assignment updates the tensor, and every handle on it sees the new value") {
  Tensor x = Tensor::from_vector({1.f, 2.f}) * 2;  // lazy
  Tensor alias = x;
  x += Tensor::from_vector({10.f, 20.f});
  x -= 1;
  x *= 2;
  x /= 4;
  CHECK(x.to_vector<float>() == std::vector<float>{5.5f, 11.5f});
  CHECK(alias.to_vector<float>() == std::vector<float>{5.5f, 11.5f});

  Tensor buf = Tensor::from_vector({1.f, 2.f, 3.f}).realize();  // a realised buffer: written with assign
  Tensor other = buf;
  buf += 1.5;
  CHECK(buf.to_vector<float>() == std::vector<float>{2.5f, 3.5f, 4.5f});
  CHECK(other.to_vector<float>() == std::vector<float>{2.5f, 3.5f, 4.5f});

  Tensor m = Tensor::zeros({2, 3});
  m += Tensor::from_vector({1.f, 2.f, 3.f});  // the operand broadcasts to the target
  CHECK(m.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  Tensor n = Tensor::from_vector<int32_t>({1, 2});
  n *= 3;
  CHECK(n.dtype() == dtypes::int32);
  CHECK(n.to_vector<int32_t>() == std::vector<int32_t>{3, 6});
}

TEST_CASE("compound assignment refuses a broadcast target, a float result in an int tensor, a grad leaf") {
  Tensor v = Tensor::zeros({3});
  CHECK_THROWS_AS(v += Tensor::zeros({2, 3}), Error);
  Tensor n = Tensor::from_vector<int32_t>({1, 2});
  CHECK_THROWS_AS(n /= 2, Error);
  CHECK_THROWS_AS(n += 0.5, Error);
  Tensor w = Tensor::ones({2}).requires_grad_();
  CHECK_THROWS_AS(w -= 1, Error);
  {
    NoGrad ng;
    w -= 1;
  }
  CHECK(w.to_vector<float>() == std::vector<float>{0, 0});
}

TEST_CASE("operator[] selects (dropping the dim), slices and indexes several dims") {
  Tensor t = iota({2, 3});
  CHECK(t[1].shape() == Shape{3});
  CHECK(t[1].to_vector<float>() == std::vector<float>{3, 4, 5});
  CHECK(t[-2].to_vector<float>() == std::vector<float>{0, 1, 2});
  CHECK(t[Slice{0, 1}].shape() == Shape{1, 3});
  CHECK(t[{1, 2}].shape() == Shape{});
  CHECK(t[{1, 2}].item<float>() == 5);
  CHECK(t[{Slice::all(), 1}].to_vector<float>() == std::vector<float>{1, 4});
  CHECK(t[{Ellipsis, NewAxis}].shape() == Shape{2, 3, 1});
  CHECK(t[1][2].item<float>() == 5);
  CHECK_THROWS_AS(t[2], Error);
}

TEST_CASE("from_vector deduces the dtype from a braced list") {
  CHECK(Tensor::from_vector({1.f, 2.f}).dtype() == dtypes::float32);
  CHECK(Tensor::from_vector({1.0, 2.0}).dtype() == dtypes::float64);
  CHECK(Tensor::from_vector({1, 2, 3}).dtype() == dtypes::int32);
  CHECK(Tensor::from_vector({true, false}).dtype() == dtypes::bool_);
  Tensor m = Tensor::from_vector({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  CHECK(m.shape() == Shape{2, 3});
  CHECK(m.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("max_with_indices / min_with_indices give values and first indices; max(dim) still gives values") {
  Tensor t = Tensor::from_vector({1.f, 5.f, 5.f, 7.f, 0.f, 7.f}, {2, 3});
  auto [v, i] = t.max_with_indices(1);
  CHECK(v.to_vector<float>() == std::vector<float>{5, 7});
  CHECK(i.dtype() == dtypes::int64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  auto mn = t.min_with_indices(0, true);
  CHECK(mn.values.shape() == Shape{1, 3});
  CHECK(mn.values.to_vector<float>() == std::vector<float>{1, 0, 5});
  CHECK(mn.indices.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0});
  CHECK(t.max(1).to_vector<float>() == std::vector<float>{5, 7});
  CHECK_THROWS_AS(t.max_with_indices(2), Error);
}

TEST_CASE("activation and Flatten modules compose in Sequential") {
  nn::Sequential seq({std::make_shared<nn::Flatten>(), std::make_shared<nn::ReLU>()});
  Tensor x = Tensor::from_vector({-1.f, 2.f, 3.f, -4.f}, {2, 1, 2});
  Tensor y = seq(x);
  CHECK(y.shape() == Shape{2, 2});
  CHECK(y.to_vector<float>() == std::vector<float>{0, 2, 3, 0});
  CHECK(seq.parameters().empty());

  Tensor a = Tensor::from_vector({-1.f, 0.f, 2.f});
  auto near = [](const Tensor& t, std::vector<double> want) {
    auto got = t.to_vector<float>();
    REQUIRE(got.size() == want.size());
    for (size_t k = 0; k < got.size(); k++) CHECK(got[k] == doctest::Approx(want[k]).epsilon(1e-6));
  };
  near(nn::Sigmoid()(a), {1 / (1 + std::exp(1.0)), 0.5, 1 / (1 + std::exp(-2.0))});
  near(nn::Tanh()(a), {std::tanh(-1.0), 0, std::tanh(2.0)});
  near(nn::SiLU()(a), {-1 / (1 + std::exp(1.0)), 0, 2 / (1 + std::exp(-2.0))});
  near(nn::GELU()(a), {-0.5 * (1 + std::erf(-1 / std::sqrt(2.0))), 0, 2 * 0.5 * (1 + std::erf(2 / std::sqrt(2.0)))});
  near(nn::LeakyReLU(0.1)(a), {-0.1, 0, 2});
  near(nn::Identity()(a), {-1, 0, 2});
  near(nn::Softmax()(a).sum(), {1});

  nn::Sequential mlp({std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::GELU>("tanh"), std::make_shared<nn::Linear>(3, 2)});
  CHECK(mlp.parameters().size() == 4);
  CHECK(mlp(Tensor::rand({5, 4})).shape() == Shape{5, 2});
}

TEST_CASE("Adam and AdamW are classes like SGD; the former factory spelling still works") {
  // Adam's first step moves each parameter by lr against the gradient's sign (m_hat / sqrt(v_hat) = g / |g|).
  Tensor w = Tensor::from_vector({1.f, -2.f}).requires_grad_();
  nn::optim::Adam opt({w}, 0.1);
  opt.zero_grad();
  (w * w).sum().backward();
  opt.step();
  auto got = w.to_vector<float>();
  CHECK(got[0] == doctest::Approx(0.9).epsilon(1e-6));
  CHECK(got[1] == doctest::Approx(-1.9).epsilon(1e-6));

  // AdamW: p -= lr * (g / |g| + weight_decay * p)
  Tensor u = Tensor::from_vector({1.f, -2.f}).requires_grad_();
  std::unique_ptr<nn::optim::Optimizer> adamw = std::make_unique<nn::optim::AdamW>(std::vector<Tensor>{u}, 0.1, 0.9, 0.999, 1e-8, 0.5);
  adamw->zero_grad();
  (u * u).sum().backward();
  adamw->step();
  got = u.to_vector<float>();
  CHECK(got[0] == doctest::Approx(0.85).epsilon(1e-6));
  CHECK(got[1] == doctest::Approx(-1.8).epsilon(1e-6));

  Tensor z = Tensor::from_vector({3.f}).requires_grad_();
  auto old_style = nn::optim::Adam({z}, 0.5);  // `auto opt = Adam(...); opt->step()`, as with the factory
  old_style->zero_grad();
  (z * z).sum().backward();
  old_style->step();
  CHECK(z.item<float>() == doctest::Approx(2.5).epsilon(1e-6));
}

TEST_CASE("reading a pending assign twice writes it once") {
  Tensor buf = Tensor::from_vector({1.f, 2.f}).realize();
  buf.assign(buf + 1);
  CHECK(buf.to_vector<float>() == std::vector<float>{2, 3});
  CHECK(buf.to_vector<float>() == std::vector<float>{2, 3});
  Tensor acc = Tensor::zeros({2}).contiguous().realize();
  for (int i = 0; i < 3; i++) {
    acc += 1;
    CHECK(acc.to_vector<float>() == std::vector<float>{float(i + 1), float(i + 1)});
  }
}
