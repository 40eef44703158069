// tinygrad's examples/beautiful_mnist.py in tg: a 4-conv + batchnorm + linear net, Adam, a jitted train step.
// Environment: BS (batch, default 512), STEPS (default 70), TG_MNIST_DIR (default data/mnist), SEED.
// Prints a progress line per step and the final test accuracy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "tg/env.hpp"
#include "tg/jit.hpp"
#include "tg/nn/datasets.hpp"
#include "tg/nn/nn.hpp"
#include "tg/nn/optim.hpp"

using namespace tg;
using clk = std::chrono::steady_clock;

namespace {

std::shared_ptr<nn::Sequential> make_model() {
  auto relu = std::make_shared<nn::Lambda>([](const Tensor& x) { return x.relu(); });
  auto pool = std::make_shared<nn::Lambda>([](const Tensor& x) { return x.max_pool2d(2); });
  auto flat = std::make_shared<nn::Lambda>([](const Tensor& x) { return x.flatten(1); });
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Conv2d>(1, 32, 5)).add(relu);
  m->add(std::make_shared<nn::Conv2d>(32, 32, 5)).add(std::make_shared<nn::BatchNorm>(32)).add(relu).add(pool);
  m->add(std::make_shared<nn::Conv2d>(32, 64, 3)).add(relu);
  m->add(std::make_shared<nn::Conv2d>(64, 64, 3)).add(std::make_shared<nn::BatchNorm>(64)).add(relu).add(pool);
  m->add(flat).add(std::make_shared<nn::Linear>(576, 10));
  return m;
}

// The rows `idx` of a (N, ...) uint8 host array, as a float tensor (the batch is gathered on the host).
Tensor gather_rows(const std::vector<uint8_t>& data, const Shape& shape, const std::vector<int64_t>& idx, bool as_float) {
  int64_t row = 1;
  for (size_t i = 1; i < shape.size(); i++) row *= shape[i];
  Shape s = shape;
  s[0] = int64_t(idx.size());
  if (as_float) {
    std::vector<float> out(idx.size() * size_t(row));
    for (size_t i = 0; i < idx.size(); i++)
      for (int64_t j = 0; j < row; j++) out[i * size_t(row) + size_t(j)] = float(data[size_t(idx[i] * row + j)]);
    return Tensor::from_vector(out, s);
  }
  std::vector<int32_t> out(idx.size() * size_t(row));
  for (size_t i = 0; i < idx.size(); i++)
    for (int64_t j = 0; j < row; j++) out[i * size_t(row) + size_t(j)] = int32_t(data[size_t(idx[i] * row + j)]);
  return Tensor::from_vector(out, s);
}

}  // namespace

int main() {
  try {
    int64_t bs = getenv_int("BS", 512), steps = getenv_int("STEPS", 70);
    if (bs <= 0 || steps <= 0) throw Error("[beautiful_mnist] BS and STEPS must be positive");
    nn::Dataset ds = nn::mnist();
    auto xtr = ds.X_train.to_vector<uint8_t>(), ytr = ds.Y_train.to_vector<uint8_t>();
    int64_t n_train = ds.X_train.shape()[0];
    std::printf("MNIST: %lld train / %lld test images, batch %lld, %lld steps\n", (long long)n_train,
                (long long)ds.X_test.shape()[0], (long long)bs, (long long)steps);
    Tensor::manual_seed(uint64_t(getenv_int("SEED", 1337)));
    auto model = make_model();
    auto opt = nn::optim::Adam(model->parameters());

    TinyJit train_step([&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      model->train(true);
      opt->zero_grad();
      Tensor loss = (*model)(in[0]).sparse_categorical_crossentropy(in[1]);
      loss.backward();
      std::vector<Tensor> out = opt->schedule_step();
      for (Tensor& b : model->buffers()) out.push_back(b);  // BatchNorm's running statistics, with this batch
      out.push_back(loss);
      return out;
    });

    std::mt19937_64 rng(uint64_t(getenv_int("SEED", 1337)));
    std::uniform_int_distribution<int64_t> pick(0, n_train - 1);
    auto t_start = clk::now();
    double last_ms = 0;
    for (int64_t i = 0; i < steps; i++) {
      std::vector<int64_t> idx(static_cast<size_t>(bs));
      for (auto& v : idx) v = pick(rng);
      Tensor xb = gather_rows(xtr, ds.X_train.shape(), idx, true);
      Tensor yb = gather_rows(ytr, ds.Y_train.shape(), idx, false);
      auto t0 = clk::now();
      auto out = train_step({xb, yb});
      float loss = out.back().item<float>();
      last_ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
      int bar = int(30 * (i + 1) / steps);
      std::printf("\r%3lld/%lld [%-30s] loss %7.4f  %8.1f ms/step", (long long)(i + 1), (long long)steps,
                  std::string(size_t(bar), '#').c_str(), double(loss), last_ms);
      std::fflush(stdout);
    }
    double total_s = std::chrono::duration<double>(clk::now() - t_start).count();
    // Test accuracy in eval mode (running statistics), in chunks to bound memory.
    model->train(false);
    int64_t n_test = ds.X_test.shape()[0], correct = 0, chunk = 500;
    auto xte = ds.X_test.to_vector<uint8_t>(), yte = ds.Y_test.to_vector<uint8_t>();
    for (int64_t s = 0; s < n_test; s += chunk) {
      std::vector<int64_t> idx;
      for (int64_t k = s; k < std::min(n_test, s + chunk); k++) idx.push_back(k);
      Tensor xb = gather_rows(xte, ds.X_test.shape(), idx, true);
      auto pred = (*model)(xb).argmax(1).to_vector<int64_t>();
      for (size_t k = 0; k < idx.size(); k++) correct += pred[k] == int64_t(yte[size_t(idx[k])]);
    }
    double acc = 100.0 * double(correct) / double(n_test);
    std::printf("\ntrained %lld steps in %.1f s (last step %.1f ms); test accuracy %.2f%% (%lld/%lld)\n", (long long)steps,
                total_s, last_ms, acc, (long long)correct, (long long)n_test);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "\nbeautiful_mnist: %s\n", e.what());
    return 1;
  }
}
