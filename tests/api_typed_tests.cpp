// The Tensor API on operator results (every method callable, static dtype kinds in the types), the undefined
// tensor state, layers and optimisers built from option structs, and the user's call site in error messages.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "tg/nn/nn.hpp"
#include "tg/nn/optim.hpp"
#include "tg/tensor.hpp"

using namespace tg;

namespace {
Tensor fvec(std::vector<float> v, Shape s) { return Tensor::from_vector(v).reshape(std::move(s)); }
// The message of the tg::Error f throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
std::string at(int line) { return std::string(" (at ") + __FILE__ + ":" + std::to_string(line) + ")"; }
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

// ---------------------------------------------------------------- static kinds of operator results

static_assert(std::is_same_v<decltype(std::declval<Tensor>() * std::declval<Tensor>()), Tensor>);
static_assert(std::is_same_v<decltype(std::declval<Tensor>() / std::declval<Tensor>()), TensorOf<float>>);
static_assert(std::is_same_v<decltype(std::declval<Tensor>() < 1), TensorOf<bool>>);
static_assert(std::is_same_v<decltype(std::declval<Tensor>() >= std::declval<Tensor>()), TensorOf<bool>>);
static_assert(std::is_same_v<decltype(std::declval<Tensor>() + 1.5), TensorOf<float>>);
static_assert(std::is_same_v<decltype(std::declval<TensorOf<int>>() + 1), TensorOf<int>>);
static_assert(std::is_same_v<decltype(std::declval<TensorOf<int>>() * 0.5), TensorOf<float>>);
static_assert(std::is_same_v<decltype(std::declval<TensorOf<bool>>() & std::declval<TensorOf<bool>>()), TensorOf<bool>>);
static_assert(std::is_same_v<decltype(-std::declval<TensorOf<float>>()), TensorOf<float>>);
static_assert(std::is_same_v<decltype(~std::declval<TensorOf<int>>()), TensorOf<int>>);
static_assert(std::is_convertible_v<TensorOf<float>, Tensor> && !std::is_convertible_v<Tensor, TensorOf<float>>);

// ---------------------------------------------------------------- static kinds of method results
using F = TensorOf<float>;
using I = TensorOf<int>;
using B = TensorOf<bool>;
static_assert(std::is_same_v<decltype(std::declval<F>().reshape({2, 3})), F>);
static_assert(std::is_same_v<decltype(std::declval<I>().reshape(Shape{6}).permute({0}).flip({0}).T()), I>);
static_assert(std::is_same_v<decltype(std::declval<B>().expand({2, 3}).pad({{1, 1}}).shrink({{0, 1}})), B>);
static_assert(std::is_same_v<decltype(std::declval<I>().exp()), F> && std::is_same_v<decltype(std::declval<B>().sqrt()), F>);
static_assert(std::is_same_v<decltype(std::declval<I>().mean(0)), F> && std::is_same_v<decltype(std::declval<I>().sum()), I>);
static_assert(std::is_same_v<decltype(std::declval<B>().sum(0)), I> && std::is_same_v<decltype(std::declval<B>().max()), B>);
static_assert(std::is_same_v<decltype(std::declval<F>().lt(std::declval<Tensor>())), B>);
static_assert(std::is_same_v<decltype(std::declval<F>().isnan()), B> && std::is_same_v<decltype(std::declval<I>().abs()), I>);
// a method outside the lists keeps Tensor's result (its kind depends on arguments or is not decided statically)
static_assert(std::is_same_v<decltype(std::declval<F>().sum(std::vector<int64_t>{0}, false, dtypes::int32)), Tensor>);
static_assert(std::is_same_v<decltype(std::declval<F>().matmul(std::declval<Tensor>())), Tensor>);

TEST_CASE("an operator result takes every Tensor method, with the values of the same op on a Tensor") {
  Tensor a = fvec({1, -2, 3, -4, 5, -6}, {2, 3}), b = fvec({2, 2, 2, 3, 3, 3}, {2, 3});
  auto y = a * b;  // Tensor
  auto q = a / b;  // TensorOf<float>
  const Tensor yt = a.alu(Ops::MUL, b), qt = a.div(b);
  auto same = [](const Tensor& x, const Tensor& z) { return x.to_vector<float>() == z.to_vector<float>(); };
  CHECK(same(q.sum(1), qt.sum(1)));
  CHECK(same(q.relu(), qt.relu()));
  CHECK(same(q.reshape({3, 2}).permute({1, 0}), qt.reshape({3, 2}).permute({1, 0})));
  CHECK(same(q.cumsum(1), qt.cumsum(1)));
  CHECK(same(q.softmax(-1), qt.softmax(-1)));
  CHECK(same(q.log_softmax(0), qt.log_softmax(0)));
  CHECK(same(q.matmul(b.T()), qt.matmul(b.T())));
  CHECK(same(q.pad({{1, 0}, {0, 2}}), qt.pad({{1, 0}, {0, 2}})));
  CHECK(same(q.flip({1}).flatten(), qt.flip({1}).flatten()));
  CHECK(same(q.clamp(-1.0, 1.0), qt.clamp(-1.0, 1.0)));
  CHECK(same(q.abs().sqrt().exp().log(), qt.abs().sqrt().exp().log()));
  CHECK(same(q.layer_norm({3}), qt.layer_norm({3})));
  CHECK(same(q.gather(1, Tensor::from_vector<int64_t>({2, 0, 1, 1}, {2, 2})),
             qt.gather(1, Tensor::from_vector<int64_t>({2, 0, 1, 1}, {2, 2}))));
  CHECK(same(q.max_with_indices(1).values, qt.max(1)));
  CHECK(q.argmax(1).to_vector<int64_t>() == qt.argmax(1).to_vector<int64_t>());
  CHECK(same(q.sort(1).first, qt.sort(1).first));
  CHECK(same(q.topk(2, 1).first, qt.topk(2, 1).first));
  CHECK(same(q.split(1, 0)[1], qt.split(1, 0)[1]));
  CHECK(same(q[1], qt[1]));
  CHECK(same(q.std({1}), qt.std({1})));
  CHECK(same(q.unsqueeze(0).squeeze(0), qt));
  CHECK(same(q.reshape({1, 1, 2, 3}).conv2d(Tensor::ones({1, 1, 1, 2})), qt.reshape({1, 1, 2, 3}).conv2d(Tensor::ones({1, 1, 1, 2}))));
  CHECK(same(y.mean(0), yt.mean(0)));
  CHECK(same(y.tanh().gelu().silu(), yt.tanh().gelu().silu()));
  CHECK(same(y.where(a, b), yt.where(a, b)));
  CHECK(same(y.cross_entropy(Tensor::from_vector<int64_t>({0, 2})), yt.cross_entropy(Tensor::from_vector<int64_t>({0, 2}))));
  CHECK((a < b).any().item<bool>());
  CHECK((a < b).sum().item<int64_t>() == 4);  // bool sums count, as torch
  CHECK(y.numel() == 6);
  CHECK(y.ndim() == 2);
  CHECK(q.dtype() == dtypes::float32);
  CHECK((a + b).shape() == Shape{2, 3});
  CHECK(((a + b) * 2).to_vector<float>() == std::vector<float>{6, 0, 10, -2, 16, -6});
}

TEST_CASE("an operator result converts wherever a Tensor is expected") {
  Tensor a = fvec({1, 2}, {2});
  std::vector<Tensor> v{a / 2, a * 3, a > 1};
  CHECK(v[0].to_vector<float>() == std::vector<float>{0.5, 1});
  CHECK(v[2].to_vector<bool>() == std::vector<bool>{false, true});
  Tensor c = true ? a / 2 : a;  // TensorOf<float> and Tensor in one conditional
  CHECK(c.to_vector<float>() == std::vector<float>{0.5, 1});
  CHECK(cat({a / 2, a}).numel() == 4);
  auto q = a / 4;
  q = q.relu() * 2;  // a Tensor assigned to a TensorOf<float>: checked, accepted
  CHECK(q.to_vector<float>() == std::vector<float>{0.5, 1});
}

TEST_CASE("a typed tensor's methods give the values of the same methods on a Tensor, and the dtype their type says") {
  Tensor ti = Tensor::from_vector(std::vector<int32_t>{3, -1, 4, -1, 5, -9}, {2, 3});
  I i(ti);
  B b(ti > 0);
  auto ints = [](const Tensor& x) { return x.cast(dtypes::int64).to_vector<int64_t>(); };
  auto floats = [](const Tensor& x) { return x.to_vector<float>(); };
  CHECK(ints(i.reshape({3, 2}).T().flip({0})) == ints(ti.reshape({3, 2}).T().flip({0})));
  CHECK(ints(i.sum(1)) == ints(ti.sum(1)));
  CHECK(ints(b.sum(1)) == std::vector<int64_t>{2, 1});  // counted as int
  CHECK(dtypes::is_int(b.sum(1).dtype()));
  CHECK(floats(i.mean(0)) == floats(ti.mean(0)));
  CHECK(dtypes::is_float(i.exp().dtype()));
  CHECK(floats(i.exp()) == floats(ti.exp()));
  CHECK(ints(i.max(0)) == std::vector<int64_t>{3, 5, 4});
  CHECK(ints(i.abs().pad({{0, 0}, {1, 0}})) == std::vector<int64_t>{0, 3, 1, 4, 0, 1, 5, 9});
  CHECK(b.logical_not().dtype() == dtypes::bool_);
  CHECK(ints(i.relu().cumsum(1)) == ints(ti.relu().cumsum(1)));
}

TEST_CASE("a TensorOf checks the dtype kind it is made from") {
  Tensor i = Tensor::from_vector<int64_t>({1, 2});
  CHECK_NOTHROW(TensorOf<int>{i});
  CHECK(error_of([&] { TensorOf<float> f(i); }) == "[TensorOf] a float tensor was expected, got int64");
  TensorOf<bool> m(i > 1);
  CHECK(error_of([&] { m = i; }) == "[TensorOf] a bool tensor was expected, got int64");
  CHECK(m.to_vector<bool>() == std::vector<bool>{false, true});  // unchanged by the refused assignment
  TensorOf<int> k(i);
  CHECK((k & 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK((k << 2).to_vector<int64_t>() == std::vector<int64_t>{4, 8});
  CHECK(k.bitwise_xor(Tensor(3)).to_vector<int64_t>() == std::vector<int64_t>{2, 1});
}

// ---------------------------------------------------------------- the undefined tensor

TEST_CASE("a default-constructed tensor is undefined: any use throws, printing says so, assigning defines it") {
  Tensor t;
  CHECK_FALSE(t.defined());
  const std::string undefined = "[tensor] this tensor is undefined";
  CHECK(error_of([&] { (void)t.shape(); }).rfind(undefined, 0) == 0);
  CHECK(error_of([&] { (void)t.dtype(); }).rfind(undefined, 0) == 0);
  CHECK(error_of([&] { (void)(t + 1); }).rfind(undefined, 0) == 0);
  CHECK(error_of([&] { t.realize(); }).rfind(undefined, 0) == 0);
  CHECK(error_of([&] { (void)t.to_vector<float>(); }).rfind(undefined, 0) == 0);
  CHECK(error_of([&] { t.backward(); }).rfind(undefined, 0) == 0);
  CHECK(to_string(t) == "tensor(undefined)");
  std::ostringstream os;
  os << t;
  CHECK(os.str() == "tensor(undefined)");
  Tensor copy = t;
  CHECK_FALSE(copy.defined());
  t = Tensor::from_vector({1.f, 2.f});
  CHECK(t.defined());
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2});
  CHECK_FALSE(copy.defined());
  TensorOf<float> f;
  CHECK_FALSE(f.defined());
  f = t * 2;
  CHECK(f.to_vector<float>() == std::vector<float>{2, 4});
}

// ---------------------------------------------------------------- option structs

TEST_CASE("layers built from option structs equal the positional constructors") {
  {
    nn::Linear l({.in_features = 3, .out_features = 4, .bias = false});
    CHECK(l.weight.shape() == Shape{4, 3});
    CHECK(l.bias == nullptr);
    nn::Linear d({.in_features = 3, .out_features = 2});
    CHECK(d.bias != nullptr);
    CHECK(d.bias->shape() == Shape{2});
  }
  {
    Tensor::manual_seed(7);
    nn::Conv2d named({.in_channels = 2, .out_channels = 3, .kernel_size = {3, 1}, .stride = {2, 1}, .padding = 1,
                      .groups = 1, .bias = false});
    Tensor::manual_seed(7);
    nn::Conv2d positional(2, 3, {3, 1}, {2, 1}, 1, 1, 1, false);
    CHECK(named.weight.shape() == Shape{3, 2, 3, 1});
    CHECK(named.bias == nullptr);
    Tensor x = Tensor::arange(0, 2 * 5 * 4).cast(dtypes::float32).reshape({1, 2, 5, 4});
    Tensor yn = named(x), yp = positional(x);
    CHECK(yn.shape() == Shape{1, 3, 3, 6});
    CHECK(yn.to_vector<float>() == yp.to_vector<float>());
    nn::Conv2d same({.in_channels = 2, .out_channels = 2, .kernel_size = 3, .padding = "same", .padding_mode = "reflect"});
    CHECK(same(x).shape() == Shape{1, 2, 5, 4});
    nn::Conv1d c1({.in_channels = 2, .out_channels = 1, .kernel_size = 2, .dilation = 2});
    CHECK(c1.weight.shape() == Shape{1, 2, 2});
  }
  {
    nn::BatchNorm bn({.num_features = 2, .momentum = 0.5, .affine = false});
    CHECK(bn.weight == nullptr);
    Tensor x = fvec({0, 10, 2, 20}, {2, 2});
    (void)bn(x).realize();
    bn.running_mean->realize();
    CHECK(bn.running_mean->to_vector<float>() == std::vector<float>{0.5, 7.5});  // 0.5 * 0 + 0.5 * (1, 15)
    nn::LayerNorm ln({.normalized_shape = {2}, .eps = 0, .elementwise_affine = false});
    CHECK(ln.weight == nullptr);
    CHECK(ln(fvec({1, 3}, {1, 2})).to_vector<float>() == std::vector<float>{-1, 1});
    nn::GroupNorm gn({.num_groups = 1, .num_channels = 2});
    CHECK(gn.weight->shape() == Shape{2});
    nn::Embedding e({.num_embeddings = 5, .embedding_dim = 3});
    CHECK(e.weight.shape() == Shape{5, 3});
  }
}

TEST_CASE("optimisers built from option structs") {
  Tensor w = fvec({1, 2}, {2}).requires_grad_();
  nn::optim::SGD sgd({w}, {.lr = 0.5, .momentum = 0.9, .nesterov = true});
  CHECK(sgd.lr_value() == 0.5);
  nn::optim::Adam adam({w}, {.lr = 0.25, .b2 = 0.99});
  CHECK(adam.lr_value() == 0.25);
  nn::optim::AdamW adamw({w}, {.weight_decay = 0.1});
  CHECK(adamw.lr_value() == 0.001);
  nn::optim::LAMB lamb({w}, {.lr = 0.125, .adam = true, .fused = true});
  CHECK(lamb.fused());
  nn::optim::LARS lars({w}, {.lr = 2});
  CHECK(lars.lr_value() == 2);
  // one SGD step with the named options: w - lr * grad (grad of sum(w * w) is 2 w); momentum starts from 0
  Tensor v = fvec({1, 2}, {2}).requires_grad_();
  nn::optim::SGD step({v}, {.lr = 0.25});
  (v * v).sum().backward();
  step.step();
  CHECK(v.to_vector<float>() == std::vector<float>{0.5, 1});
}

// ---------------------------------------------------------------- call sites in errors

TEST_CASE("an error names the user's call site: file and line of the call") {
  Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({4, 5});
  int line = 0;
  std::string msg = error_of([&] { line = __LINE__; (void)a.matmul(b); });
  CHECK(msg.rfind("[matmul]", 0) == 0);
  CHECK(ends_with(msg, at(line)));
  // an op calling other ops (linear -> matmul) keeps the user's line
  msg = error_of([&] { line = __LINE__; (void)a.linear(b); });
  CHECK(ends_with(msg, at(line)));
  // the header's int overload of sum forwards the user's position
  msg = error_of([&] { line = __LINE__; (void)a.sum(5); });
  CHECK(msg.rfind("[sum]", 0) == 0);
  CHECK(ends_with(msg, at(line)));
  msg = error_of([&] { line = __LINE__; (void)cat({a, b}, 0); });
  CHECK(ends_with(msg, at(line)));
  msg = error_of([&] { line = __LINE__; (void)a.reshape(Shape{7}); });
  CHECK(ends_with(msg, at(line)));
  msg = error_of([&] { line = __LINE__; (void)a.item<float>(); });
  CHECK(msg.rfind("[item]", 0) == 0);
  CHECK(ends_with(msg, at(line)));
  // a layer: the position of the call of the module, not tg's own source
  nn::Linear fc(4, 2);
  msg = error_of([&] { line = __LINE__; (void)fc(a); });
  CHECK(ends_with(msg, at(line)));
  // an undefined tensor in a located call
  Tensor u;
  msg = error_of([&] { line = __LINE__; (void)u.sum(0); });
  CHECK(msg.rfind("[tensor] this tensor is undefined", 0) == 0);
  CHECK(ends_with(msg, at(line)));
  // outside any call there is no position, and the position does not leak into a later error
  CHECK(std::string(Error("[x] y").what()) == "[x] y");
}
