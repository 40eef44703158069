// A program outside tg, built against an installed prefix by scripts/consumer_check (CMake, Meson and plain
// pkg-config builds of this same file): a few tensors, a small computation, the values checked.
#include <tg/tg.hpp>

#include <iostream>

int main() {
  tg::Tensor a = tg::Tensor::from_vector({1.f, 2.f, 3.f, 4.f}, {2, 2});
  tg::Tensor b = tg::Tensor::ones({2, 2});
  tg::Tensor c = a.matmul(b) + 1;  // [[4, 4], [8, 8]]
  c += 1;
  float sum = c.sum().item<float>();
  std::cout << c << "\n";
  if (sum != 28.f) {
    std::cerr << "expected a sum of 28, got " << sum << "\n";
    return 1;
  }
  std::cout << "sum " << sum << "\n";
  return 0;
}
