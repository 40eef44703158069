#pragma once
// The model of tinygrad's examples/beautiful_mnist.py, in tinygrad's layer order: used by examples/beautiful_mnist
// and by bench/mnist_step (which runs the same model beside libtorch).
#include <memory>

#include "tg/nn/nn.hpp"

namespace tg::examples {

inline std::shared_ptr<nn::Sequential> beautiful_mnist_model() {
  auto relu = std::make_shared<nn::Lambda>([](const Tensor& x) { return x.relu(); });
  auto pool = std::make_shared<nn::Lambda>([](const Tensor& x) { return x.max_pool2d(2); });
  auto flat = std::make_shared<nn::Lambda>([](const Tensor& x) { return x.flatten(1); });
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Conv2d>(1, 32, 5)).add(relu);
  m->add(std::make_shared<nn::Conv2d>(32, 32, 5)).add(relu);
  m->add(std::make_shared<nn::BatchNorm>(32)).add(pool);
  m->add(std::make_shared<nn::Conv2d>(32, 64, 3)).add(relu);
  m->add(std::make_shared<nn::Conv2d>(64, 64, 3)).add(relu);
  m->add(std::make_shared<nn::BatchNorm>(64)).add(pool);
  m->add(flat).add(std::make_shared<nn::Linear>(576, 10));
  return m;
}

}  // namespace tg::examples
